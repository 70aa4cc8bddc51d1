"""sbx.files against a real daemon: read/write in each format, list, stat, remove, rename, mkdir, accounts, errors."""
import io

import pytest

from tupper import (
    EntryInfo,
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
    NotFoundException,
    PermissionDeniedException,
    SandboxException,
    WriteEntry,
    WriteInfo,
)


def test_write_and_read_text_bytes_stream(sbx):
    info = sbx.files.write("notes/hello.txt", "héllo\n")
    assert info == WriteInfo(name="hello.txt", type=FileType.FILE, path="notes/hello.txt")
    assert sbx.files.read("notes/hello.txt") == "héllo\n"
    assert sbx.files.read("/home/user/notes/hello.txt", format="text") == "héllo\n", "relative paths start at the home"
    b = sbx.files.read("notes/hello.txt", format="bytes")
    assert isinstance(b, bytearray) and bytes(b) == "héllo\n".encode()
    assert b"".join(sbx.files.read("notes/hello.txt", format="stream")) == "héllo\n".encode()
    with pytest.raises(InvalidArgumentException):
        sbx.files.read("notes/hello.txt", format="blob")


def test_binary_and_large_files_in_pieces(sbx):
    data = bytes(range(256)) * (9 << 10)  # 2.25 MiB: three pieces of at most 1 MiB
    sbx.files.write("big.bin", data)
    assert bytes(sbx.files.read("big.bin", format="bytes")) == data
    pieces = list(sbx.files.read("big.bin", format="stream"))
    assert len(pieces) == 3 and b"".join(pieces) == data
    assert sbx.files.get_info("big.bin").size == len(data)
    sbx.files.write("empty", b"")
    assert sbx.files.read("empty") == "" and list(sbx.files.read("empty", format="stream")) == []


def test_write_from_file_objects_and_write_files(sbx):
    sbx.files.write("from-bytesio", io.BytesIO(b"\x00\x01binary"))
    assert bytes(sbx.files.read("from-bytesio", format="bytes")) == b"\x00\x01binary"
    sbx.files.write("from-stringio", io.StringIO("text ✓"))
    assert sbx.files.read("from-stringio") == "text ✓"
    out = sbx.files.write_files([WriteEntry(path="m/a.txt", data="A"), {"path": "/tmp/b.txt", "data": b"B"}])
    assert [w.path for w in out] == ["m/a.txt", "/tmp/b.txt"]
    assert sbx.files.read("m/a.txt") == "A" and sbx.files.read("/tmp/b.txt") == "B"
    assert sbx.files.write_files([]) == []
    with pytest.raises(InvalidArgumentException):
        sbx.files.write("x", 12345)
    with pytest.raises(InvalidArgumentException):
        sbx.files.write("", "x")
    with pytest.raises(InvalidArgumentException):
        sbx.files.write_files("nope")


def test_overwrite_replaces(sbx):
    sbx.files.write("f", "a long first version")
    sbx.files.write("f", "short")
    assert sbx.files.read("f") == "short"


def test_list_exists_get_info(sbx):
    sbx.files.write("d/one.txt", "1")
    sbx.files.write("d/sub/two.txt", "22")
    sbx.commands.run("ln -s one.txt d/link")
    entries = sbx.files.list("d")
    assert [e.name for e in entries] == ["link", "one.txt", "sub"]
    by = {e.name: e for e in entries}
    assert by["one.txt"].type == FileType.FILE and by["one.txt"].size == 1 and by["one.txt"].path == "/home/user/d/one.txt"
    assert by["sub"].type == FileType.DIR and by["sub"].permissions.startswith("d")
    assert by["link"].type == FileType.SYMLINK
    deep = sbx.files.list("d", depth=2)
    assert "/home/user/d/sub/two.txt" in [e.path for e in deep]
    with pytest.raises(InvalidArgumentException):
        sbx.files.list("d", depth=0)
    info = sbx.files.get_info("d/one.txt")
    assert isinstance(info, EntryInfo)
    assert info.mode == 0o644 and info.permissions == "-rw-r--r--" and info.owner == "1000" and info.modified_time
    assert sbx.files.get_info("d/link").symlink_target == "one.txt"
    assert sbx.files.exists("d/one.txt") and sbx.files.exists("d") and not sbx.files.exists("d/nope")


def test_names_that_are_not_utf8(sbx):
    sbx.commands.run("mkdir -p raw && printf x > \"raw/a$(printf '\\377')\" && ln -s \"t$(printf '\\376')\" raw/link")
    by = {e.name: e for e in sbx.files.list("raw")}
    f = by["a\ufffd"]
    assert f.name_raw == b"a\xff" and f.path_raw == b"/home/user/raw/a\xff"
    link = sbx.files.get_info("raw/link")
    assert link.symlink_target == "t\ufffd" and link.symlink_target_raw == b"t\xfe"
    assert link.name_raw is None, "a UTF-8 name has no raw form"


def test_make_dir_remove_rename(sbx):
    assert sbx.files.make_dir("a/b/c") is True
    assert sbx.files.make_dir("a/b/c") is False, "already there"
    sbx.files.write("a/b/c/f.txt", "x")
    moved = sbx.files.rename("a/b/c/f.txt", "a/g.txt")
    assert moved.name == "g.txt" and moved.path == "/home/user/a/g.txt"
    assert not sbx.files.exists("a/b/c/f.txt")
    sbx.files.remove("a")  # a directory with everything in it
    assert not sbx.files.exists("a")


def test_missing_files(sbx):
    with pytest.raises(FileNotFoundException) as e:
        sbx.files.read("/no/such/file")
    assert isinstance(e.value, NotFoundException) and e.value.errno_code == "ENOENT"
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/no/such/file", format="stream")
    with pytest.raises(FileNotFoundException):
        sbx.files.get_info("/nope")
    with pytest.raises(FileNotFoundException):
        sbx.files.list("/nope")
    with pytest.raises(FileNotFoundException):
        sbx.files.remove("/nope")
    with pytest.raises(FileNotFoundException):
        sbx.files.rename("/nope", "/nope2")


def test_permissions_follow_the_account(sbx):
    with pytest.raises(PermissionDeniedException) as e:
        sbx.files.write("/etc/evil", "x")
    assert e.value.errno_code == "EACCES" and isinstance(e.value, SandboxException)
    assert not sbx.files.exists("/etc/evil", user="root")
    with pytest.raises(PermissionDeniedException):
        sbx.files.make_dir("/opt/x")
    sbx.files.write("/etc/ok", "root may", user="root")
    assert sbx.files.read("/etc/ok") == "root may"
    assert sbx.files.get_info("/etc/ok").owner == "0"
    sbx.files.write("mine.txt", "m")
    assert sbx.files.get_info("/home/user/mine.txt").owner == "1000", "what the account writes is its own"
    sbx.files.write("rootfile", "r", user="root")
    assert sbx.files.read("/root/rootfile", user="root") == "r", "an explicit account's relative paths start at its home"
    with pytest.raises(PermissionDeniedException):
        sbx.files.read("/root/rootfile")


def test_disk_limit_is_not_enough_space(opts):
    from tupper import NotEnoughSpaceException, Sandbox

    try:
        sbx = Sandbox.create(limits={"disk": "1M"}, **opts)
    except SandboxException as e:
        pytest.skip(f"this host cannot enforce a disk limit: {e}")
    try:
        with pytest.raises(NotEnoughSpaceException):
            sbx.files.write("fill.bin", b"\0" * (4 << 20))
    finally:
        sbx.kill()

"""
files.read / files.write on the data connection (binary stream frames with
credit, docs/protocol.md "Stream frames") against a real daemon, both
forms: byte-exact large and binary files (checked inside the box too),
errors, the data connection's end, concurrent reads, the JSON fallback; and
the frame checks against hostile bytes, without a daemon.
"""
import asyncio
import hashlib
import os
import struct
import threading

import pytest

from tupper import AsyncSandbox, FileNotFoundException, Sandbox, SandboxException
from tupper._stream import CREDIT, DATA, END, ERROR, OPEN, DataConn, _Streams

MIB = 1 << 20


def _sha_in_box(sbx, path):
    return sbx.commands.run(f"sha256sum {path}").stdout.split()[0]


def _fds():
    return sorted(os.listdir("/proc/self/fd"))


def test_large_random_file_both_ways(sbx):
    data = os.urandom(20 * MIB)
    sbx.files.write("big.bin", data)
    assert isinstance(sbx._conn._dc, DataConn), "the bytes went on the data connection"
    assert _sha_in_box(sbx, "big.bin") == hashlib.sha256(data).hexdigest(), "the box holds exactly those bytes"
    got = sbx.files.read("big.bin", format="bytes")
    assert len(got) == len(data) and got == data
    h = hashlib.sha256()
    n = 0
    for piece in sbx.files.read("big.bin", format="stream"):
        assert 0 < len(piece) <= MIB
        h.update(piece)
        n += len(piece)
    assert n == len(data) and h.hexdigest() == hashlib.sha256(data).hexdigest()


def test_every_byte_value(sbx):
    data = bytes(range(256)) * 4097 + b"\x00\r\n\xff"  # not a multiple of any piece size
    sbx.files.write("/tmp/all.bin", data)
    assert _sha_in_box(sbx, "/tmp/all.bin") == hashlib.sha256(data).hexdigest()
    assert bytes(sbx.files.read("/tmp/all.bin", format="bytes")) == data
    sbx.commands.run("head -c 300000 /dev/urandom > /tmp/box.bin")  # written by the box, read by us
    assert hashlib.sha256(sbx.files.read("/tmp/box.bin", format="bytes")).hexdigest() == _sha_in_box(sbx, "/tmp/box.bin")


def test_errors_and_the_connection_goes_on(sbx):
    with pytest.raises(FileNotFoundException) as e:
        sbx.files.read("/no/such/file", format="bytes")
    assert e.value.errno_code == "ENOENT"
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/no/such/file", format="stream")
    sbx.files.write("plain", "x")
    with pytest.raises(SandboxException) as e:
        sbx.files.write("plain/under-a-file", b"y" * (3 * MIB))
    assert e.value.errno_code in ("ENOTDIR", "ENOENT", "EEXIST")
    with pytest.raises(SandboxException):
        sbx.files.read("/home", format="bytes")  # a directory
    sbx.files.write("after", b"still works")
    assert bytes(sbx.files.read("after", format="bytes")) == b"still works"


def test_a_stream_left_early_ends_at_the_daemon(sbx):
    data = os.urandom(12 * MIB)  # more than the 4 MiB window
    sbx.files.write("f.bin", data)
    it = sbx.files.read("f.bin", format="stream")
    first = next(it)
    it.close()  # the daemon had at most a window in flight; it is told to stop
    assert data.startswith(first)
    assert not sbx._conn._dc._streams, "no stream is left open on the data connection"
    unread = sbx.files.read("f.bin", format="stream")
    del unread  # never iterated: dropped, it ends too
    assert not sbx._conn._dc._streams
    assert bytes(sbx.files.read("f.bin", format="bytes")) == data


def test_data_connection_closed_after_use(opts):
    before = _fds()
    threads = threading.active_count()
    sbx = Sandbox.create(**opts)
    try:
        sbx.files.write("x", b"\x01" * MIB)
        assert bytes(sbx.files.read("x", format="bytes")) == b"\x01" * MIB
        dc = sbx._conn._dc
        assert isinstance(dc, DataConn) and not dc.closed
        assert len(_fds()) == len(before) + 2, "one control and one data connection"
    finally:
        sbx.kill()
    assert dc.closed and sbx._conn._dc is None
    assert _fds() == before, "no socket is left open"
    dc._reader.join(5)
    assert threading.active_count() <= threads, "no reading thread is left"


def test_concurrent_reads_on_one_sandbox(sbx):
    files = {f"c{i}.bin": os.urandom(3 * MIB + i) for i in range(4)}
    for name, data in files.items():
        sbx.files.write(name, data)
    got = {}
    errors = []

    def read(name):
        try:
            got[name] = bytes(sbx.files.read(name, format="bytes"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=read, args=(n,)) for n in files for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors and got == files
    assert not sbx._conn._dc._streams


def test_json_fallback_for_a_daemon_without_streams(sbx):
    sbx._conn.streams = None  # what a hello without `streams` leaves
    data = bytes(range(256)) * 9000
    sbx.files.write("old.bin", data)
    assert bytes(sbx.files.read("old.bin", format="bytes")) == data
    assert b"".join(sbx.files.read("old.bin", format="stream")) == data
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/nope")
    assert sbx._conn._dc is None, "no data connection was opened"


def test_async_form(opts):
    async def go():
        before = _fds()
        sbx = await AsyncSandbox.create(**opts)
        try:
            data = os.urandom(20 * MIB)
            await sbx.files.write("big.bin", data)
            assert (await sbx.commands.run("sha256sum big.bin")).stdout.split()[0] == hashlib.sha256(data).hexdigest()
            assert await sbx.files.read("big.bin", format="bytes") == data
            every = bytes(range(256)) * 1000
            await sbx.files.write("all.bin", every)
            reads = await asyncio.gather(*(sbx.files.read(n, format="bytes") for n in ("big.bin", "all.bin", "big.bin")))
            assert [bytes(r) for r in reads] == [data, every, data], "concurrent reads on one connection"
            chunks = [c async for c in await sbx.files.read("all.bin", format="stream")]
            assert b"".join(chunks) == every
            with pytest.raises(FileNotFoundException):
                await sbx.files.read("/no/such", format="bytes")
            assert not sbx._conn._dc._streams
        finally:
            await sbx.kill()
        assert _fds() == before, "no socket is left open"

    asyncio.run(asyncio.wait_for(go(), 120))


def _hdr(length, type_, sid, version=1, flags=0):
    return struct.pack("<IBBHI", length, version, type_, flags, sid)


def test_hostile_frames_are_refused():
    s = _Streams()
    for bad in (_hdr(0, DATA, 1, version=2), _hdr(0, DATA, 1, flags=1), _hdr(MIB + 1, DATA, 1),
                _hdr(0, 0, 1), _hdr(0, 6, 1)):
        with pytest.raises(ValueError):
            s.parse_header(bad)
    for type_, payload in ((OPEN, b"\0" * 7), (CREDIT, struct.pack("<I", 0)), (CREDIT, b"\1"),
                           (END, b"\0" * 3), (ERROR, b"\1\0"), (DATA, b"")):
        with pytest.raises(ValueError):
            s.deliver(type_, 1, payload)
    with pytest.raises(ConnectionError):
        s.deliver(ERROR, 0, struct.pack("<I", 71) + b"bad")
    s.deliver(OPEN, 3, struct.pack("<II", 2, 5))
    assert s.take_credit(3, 100, "fs.write_stream") == 5 and s.take_credit(3, 1, "fs.write_stream") == 0
    s.deliver(ERROR, 3, struct.pack("<I", 28) + b"no space")
    with pytest.raises(SandboxException) as e:
        s.take_credit(3, 1, "fs.write_stream")
    assert e.value.errno_code == "ENOSPC"
    s.forget(3)
    assert s.deliver(DATA, 3, b"late") is None and 3 not in s._streams, "a late frame of an ended stream is dropped"
    with pytest.raises(ValueError):
        s.deliver(DATA, 0, b"x")  # stream 0 is the connection
    small = _Streams(window=64 << 10)
    small.deliver(DATA, 5, b"a" * (64 << 10))
    with pytest.raises(ValueError):
        small.deliver(DATA, 5, b"b")  # beyond the window it was given
    assert small.pop(5, "fs.read_stream")[0] == DATA
    small.deliver(DATA, 5, b"c")  # taken: room again

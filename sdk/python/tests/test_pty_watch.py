"""sbx.pty and files.watch_dir (blocking form) against a real daemon."""
import time

import pytest

from tupper import FilesystemEventType, FileNotFoundException, InvalidArgumentException, PtySize, SandboxException


def _until(pred, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_pty_create_input_resize_kill(sbx):
    term = sbx.pty.create(PtySize(rows=24, cols=80))
    assert term.pid > 0
    assert [p.pty for p in sbx.commands.list() if p.pid == term.pid] == [True]
    sbx.pty.send_stdin(term.pid, b"stty size; echo mark-$((6*7))\r")
    out = bytearray()
    for _stdout, _stderr, pty in term:  # iterating a handle yields what the terminal shows
        out.extend(pty)
        if b"mark-42" in out:
            break
    assert b"24 80" in out
    sbx.pty.resize(term.pid, PtySize(rows=40, cols=100))
    sbx.pty.send_stdin(term.pid, b"stty size; exit\r")
    rest = bytearray()
    r = term.wait(on_pty=rest.extend)
    assert b"40 100" in rest
    assert r.exit_code == 0 and r.stdout == "", "a terminal's bytes go to on_pty, not stdout"

    other = sbx.pty.create(PtySize(rows=10, cols=10), cmd=["/bin/sh"], user="root", cwd="/tmp")
    assert sbx.pty.kill(other.pid) is True
    with pytest.raises(SandboxException):
        other.wait()
    assert sbx.pty.kill(other.pid) is False


def test_pty_bad_sizes(sbx):
    with pytest.raises(InvalidArgumentException):
        sbx.pty.create(PtySize(rows=0, cols=80))
    with pytest.raises(InvalidArgumentException):
        sbx.pty.create(PtySize(rows=24, cols=5000))
    h = sbx.commands.run("sleep 30", background=True)
    with pytest.raises(SandboxException) as e:
        sbx.pty.resize(h.pid, PtySize(rows=10, cols=10))
    assert e.value.errno_code == "ENOTTY"
    h.kill()


def test_watch_dir_events_and_stop(sbx):
    sbx.files.make_dir("watched")
    w = sbx.files.watch_dir("watched")
    sbx.files.write("watched/a.txt", "1")
    sbx.files.rename("watched/a.txt", "watched/b.txt")
    sbx.files.remove("watched/b.txt")
    events = []
    assert _until(lambda: events.extend(w.get_new_events()) or any(e.type == FilesystemEventType.REMOVE for e in events))
    kinds = {(e.name, e.type) for e in events}
    assert ("a.txt", FilesystemEventType.CREATE) in kinds
    assert ("b.txt", FilesystemEventType.REMOVE) in kinds
    assert ("a.txt", FilesystemEventType.RENAME) in kinds
    w.stop()
    sbx.files.write("watched/late.txt", "x")
    with pytest.raises(SandboxException):
        w.get_new_events()


def test_watch_dir_recursive_and_end(sbx):
    sbx.files.make_dir("tree/sub")
    w = sbx.files.watch_dir("tree", recursive=True)
    sbx.files.write("tree/sub/deep.txt", "x")
    events = []
    assert _until(lambda: events.extend(w.get_new_events()) or any(e.name == "sub/deep.txt" for e in events))
    sbx.files.remove("tree")  # the watched directory goes: the watch ends
    assert _until(lambda: _ended(w, events))
    with pytest.raises(FileNotFoundException):
        sbx.files.watch_dir("no-such-dir")


def _ended(w, events):
    try:
        events.extend(w.get_new_events())
        return False
    except SandboxException:
        return True

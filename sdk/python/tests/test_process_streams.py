"""
Commands and terminals on process streams (docs/protocol.md, "Process
streams"): a process's stdout, stderr, stdin and terminal as binary frames
of the data connection with credit, both forms, against a real daemon.
Output counted byte for byte; a slow callback holds the box's writer back
(its progress is read inside the box meanwhile) and loses nothing, with
nothing piling up in this process or in the daemon; stdin within its
credit; disconnect and connect on streams; the JSON path for a daemon
without them; and the routing of frames to a handle without a daemon.
"""
import asyncio
import os
import struct
import time

import pytest

from tupper import AsyncSandbox, CommandExitException, PtySize, SandboxException
from tupper._stream import CREDIT, DATA, END, ERROR, OPEN, WINDOW, DataConn, _Streams

MIB = 1 << 20

# 64 pieces of 1 MiB, the count of those written so far in /tmp/progress (busybox sh)
WRITER = ("i=0; while [ $i -lt {n} ]; do head -c 1048576 /dev/zero; i=$((i+1)); echo $i > /tmp/progress; done; "
          "echo tail >&2")


def _rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def test_64_mib_counted_exactly_and_a_slow_callback_holds_the_writer(sbx, daemon):
    assert sbx._conn.process_streams == 1, "the daemon announces process streams"
    n = 64
    got = [0]
    calls = [0]
    held = []
    rss = []
    base = _rss(daemon.proc.pid)

    def on_stdout(s):
        calls[0] += 1
        got[0] += len(s)
        if calls[0] == 1:
            # the first chunk's callback is slow: the box runs on only as far as the windows let it
            time.sleep(0.8)
            held.append(int(bytes(sbx.files.read("/tmp/progress", format="bytes")).strip() or 0))
            h = next(iter(sbx.commands._live))
            held.append(sum(ev[1][3] for ev in list(h._q.queue) if ev[0] == "data"))
        if calls[0] % 8 == 0:
            rss.append(_rss(daemon.proc.pid))

    r = sbx.commands.run(WRITER.format(n=n), on_stdout=on_stdout, timeout=60)
    assert got[0] == n * MIB and len(r.stdout) == n * MIB, "every byte, once"
    assert r.stderr == "tail\n" and r.exit_code == 0
    assert isinstance(sbx._conn._dc, DataConn)
    progress, queued = held
    # our window (4 MiB) + the agent's (2 MiB) + a pipe's 64 KiB, with slack: nowhere near 64
    assert progress <= 12, f"the box wrote {progress} MiB while nobody took its output"
    assert queued <= WINDOW, f"{queued} bytes wait here: at most the window"
    assert max(rss) - base < 48 * MIB, "the daemon holds a window, not the output"


def test_stdin_and_exit_code_on_streams(sbx):
    h = sbx.commands.run("cat; echo err >&2; exit 3", background=True, stdin=True)
    assert h._input is not None and h._outs, "its stdin and output are streams"
    data = bytes(range(256)) * (8 * 1024)  # 2 MiB of every byte value: over the 1 MiB stdin window
    h.send_stdin(data.decode("latin-1"))
    h.close_stdin()
    with pytest.raises(CommandExitException) as e:
        h.wait()
    assert e.value.exit_code == 3 and e.value.stderr == "err\n"
    assert e.value.stdout == data.decode("latin-1"), "every byte, in order"
    assert not sbx._conn._dc._streams, "nothing is left of its streams"


def test_disconnect_and_connect_rebind_the_streams(sbx):
    h = sbx.commands.run("echo early; sleep 0.6; echo late", background=True)
    assert h._outs
    time.sleep(0.2)
    h.disconnect()
    again = sbx.commands.connect(h.pid)
    assert again._outs, "the streams came to the new handle"
    assert again.wait().stdout == "early\nlate\n"
    with pytest.raises(SandboxException):
        h.wait()


def test_pty_on_its_stream(sbx):
    term = sbx.pty.create(PtySize(rows=24, cols=80), cmd=["/bin/sh"])
    assert term._input is not None and term._input[1] in term._outs, "one stream both ways"
    sbx.pty.send_stdin(term.pid, b"stty size; exit\r")
    out = bytearray()
    r = term.wait(on_pty=out.extend)
    assert b"24 80" in out and r.stdout == ""


def test_json_path_for_a_daemon_without_process_streams(sbx):
    sbx._conn.process_streams = None  # what a hello without `process_streams` leaves
    h = sbx.commands.run("cat; echo e >&2", background=True, stdin=True)
    assert h._input is None and not h._outs
    h.send_stdin("json\n")
    h.close_stdin()
    r = h.wait()
    assert r.stdout == "json\n" and r.stderr == "e\n"
    term = sbx.pty.create(PtySize(rows=10, cols=40), cmd=["/bin/sh"])
    assert not term._outs
    sbx.pty.send_stdin(term.pid, b"stty size; exit\r")
    out = bytearray()
    term.wait(on_pty=out.extend)
    assert b"10 40" in out


def test_async_slow_coroutine_callback_loses_nothing(opts):
    async def go():
        async with await AsyncSandbox.create(**opts) as sbx:
            got = [0]
            progress = []

            async def on_stdout(s):
                if got[0] == 0:
                    await asyncio.sleep(0.5)
                    progress.append(int((await sbx.files.read("/tmp/progress", format="bytes")).strip() or 0))
                got[0] += len(s)

            r = await sbx.commands.run(WRITER.format(n=24), on_stdout=on_stdout)
            assert got[0] == 24 * MIB and len(r.stdout) == 24 * MIB and r.stderr == "tail\n"
            assert progress[0] <= 12, "the box waited for the slow callback"
            h = await sbx.commands.run("cat", background=True, stdin=True)
            assert h._input is not None
            await h.send_stdin(os.urandom(16).hex())
            await h.close_stdin()
            assert len((await h.wait()).stdout) == 32
            assert not sbx._conn._dc._streams

    asyncio.run(asyncio.wait_for(go(), 60))


def _u32(n):
    return struct.pack("<I", n)


def test_routed_streams_without_a_daemon():
    s = _Streams(window=64 << 10)
    s.deliver(OPEN, 7, struct.pack("<II", 3, 0))
    s.deliver(DATA, 7, b"before")  # came before the reply named the stream
    got = []
    s.route(7, got.append)
    s.deliver(DATA, 7, b"x" * ((64 << 10) - 6))
    assert [e[0] for e in got] == [DATA, DATA] and got[0][1] == b"before", "in order, the early frame first"
    with pytest.raises(ValueError):
        s.deliver(DATA, 7, b"y")  # nothing taken yet: beyond the window
    s2 = _Streams(window=64 << 10)
    s2.route(9, got.append)
    s2.deliver(DATA, 9, b"a" * (64 << 10))
    assert s2._credit_due(9, 64 << 10), "the consumer took it: credit is due"
    s2.deliver(DATA, 9, b"b")  # room again
    s2.deliver(END, 9, struct.pack("<Q", (64 << 10) + 1))
    assert got[-1] == (END, (64 << 10) + 1) and not s2.live(9), "its END is its last frame: forgotten"
    assert s2.deliver(DATA, 9, b"late") is None and not s2._credit_due(9, 1)
    # a stdin stream: credit from OPEN and CREDIT, over at END or ERROR
    s2.deliver(OPEN, 11, struct.pack("<II", 5, 10))
    assert s2.input_open(11) and s2.take_credit(11, 100, "send_stdin") == 10
    s2.deliver(CREDIT, 11, _u32(4))
    assert s2.take_credit(11, 100, "send_stdin") == 4
    s2.deliver(ERROR, 11, _u32(32) + b"broken pipe")
    assert not s2.input_open(11)
    with pytest.raises(SandboxException) as e:
        s2.take_credit(11, 1, "send_stdin")
    assert e.value.errno_code == "EPIPE"
    s2.deliver(OPEN, 13, struct.pack("<II", 5, 10))
    s2.deliver(END, 13, b"")
    with pytest.raises(SandboxException):
        s2.take_credit(13, 1, "send_stdin")  # the process ended: no more input
    # the connection's end reaches every routed stream's handle
    ends = []
    s2.route(15, ends.append)
    s2.down("gone")
    assert ends and ends[0][0] == ERROR and not s2.live(15)
    late = []
    s2.route(17, late.append)  # routed after the end: told at once
    assert late and late[0][0] == ERROR
    with pytest.raises(SandboxException):
        s2.route(0, late.append)  # stream 0 is the connection

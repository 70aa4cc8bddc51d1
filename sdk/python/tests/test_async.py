"""The asyncio form against a real daemon: AsyncSandbox, its commands, files, pty and watch, and their errors."""
import asyncio

import pytest

from tupper import (
    AsyncCommandHandle,
    AsyncSandbox,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    InvalidArgumentException,
    NotFoundException,
    PermissionDeniedException,
    PtySize,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    TimeoutException,
    WriteEntry,
)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_lifecycle(opts):
    async def go():
        sbx = await AsyncSandbox.create(metadata={"form": "async"}, timeout=100, **opts)
        try:
            info = await sbx.get_info()
            assert info.metadata == {"form": "async"} and info.timeout == 100
            await sbx.set_timeout(50)
            assert (await AsyncSandbox.get_info(sbx.sandbox_id, **opts)).timeout == 50
            await AsyncSandbox.set_timeout(sbx.sandbox_id, 70, **opts)
            assert (await sbx.get_info()).timeout == 70
            page = await AsyncSandbox.list(query=SandboxQuery(metadata={"form": "async"}), **opts).next_items()
            assert [s.sandbox_id for s in page] == [sbx.sandbox_id]
            other = await AsyncSandbox.connect(sbx.sandbox_id, **opts)
            assert await other.connect() is other
            assert (await other.commands.run("echo via-other")).stdout == "via-other\n"
            await other.close()
            assert await sbx.is_running()
            h = await sbx.get_host(8000)
            assert h.startswith("127.0.0.1:")
            try:
                m = await sbx.get_metrics()
            except SandboxException:
                m = None  # no cgroups here
            if m is not None:
                assert len(m) == 1
                assert await sbx.pause() is True and not await sbx.is_running()
                await sbx.connect()
                assert await sbx.is_running()
        finally:
            assert await sbx.kill() is True
        assert await AsyncSandbox.kill(sbx.sandbox_id, **opts) is False
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.connect(sbx.sandbox_id, **opts)
        async with await AsyncSandbox.create(**opts) as s2:
            sid = s2.sandbox_id
        with pytest.raises(SandboxNotFoundException):
            await AsyncSandbox.get_info(sid, **opts)

    run(go())


def test_commands(opts):
    async def go():
        async with await AsyncSandbox.create(**opts) as sbx:
            r = await sbx.commands.run("echo hi; id -un")
            assert r.stdout == "hi\nuser\n"
            with pytest.raises(CommandExitException) as e:
                await sbx.commands.run("echo bad >&2; exit 4")
            assert e.value.exit_code == 4 and e.value.stderr == "bad\n"

            out = []

            async def on_err(s):
                await asyncio.sleep(0)
                out.append(("err", s))

            await sbx.commands.run("echo a; echo b >&2", on_stdout=lambda s: out.append(("out", s)), on_stderr=on_err)
            assert ("out", "a\n") in out and ("err", "b\n") in out

            h = await sbx.commands.run("cat", background=True, stdin=True)
            assert isinstance(h, AsyncCommandHandle) and h.pid > 0
            await h.send_stdin("piped\n")
            await h.close_stdin()
            assert (await h.wait()).stdout == "piped\n" and h.exit_code == 0

            long = await sbx.commands.run("sleep 30", background=True)
            assert [p.pid for p in await sbx.commands.list() if p.pid == long.pid] == [long.pid]
            assert await long.kill() is True
            with pytest.raises(CommandExitException):
                await long.wait()
            assert await sbx.commands.kill(long.pid) is False

            live = []
            bg = await sbx.commands.run("echo early; sleep 0.4; echo late", background=True, on_stdout=live.append)
            await asyncio.sleep(0.2)
            await bg.disconnect()
            again = await sbx.commands.connect(bg.pid)
            assert (await again.wait()).stdout == "early\nlate\n"
            assert live == ["early\n"]

            with pytest.raises(TimeoutException):
                await sbx.commands.run("sleep 30", timeout=0.3)
            with pytest.raises(InvalidArgumentException):
                await sbx.commands.run("")
            with pytest.raises(NotFoundException):
                await sbx.commands.run("true", user="ghost")
            with pytest.raises(NotFoundException):
                await sbx.commands.connect(99999)

            # several at once on one connection
            rs = await asyncio.gather(*(sbx.commands.run(f"echo {i}") for i in range(8)))
            assert [r.stdout for r in rs] == [f"{i}\n" for i in range(8)]

    run(go())


def test_killed_sandbox_fails_what_waits(opts):
    async def go():
        sbx = await AsyncSandbox.create(**opts)
        h = await sbx.commands.run("sleep 30", background=True)
        waiter = asyncio.ensure_future(h.wait())
        await asyncio.sleep(0.1)
        await sbx.kill()
        with pytest.raises(TimeoutException):
            await waiter
        with pytest.raises(SandboxException):
            await sbx.files.read("/etc/passwd")

    run(go())


def test_files(opts):
    async def go():
        async with await AsyncSandbox.create(**opts) as sbx:
            w = await sbx.files.write("a/b.txt", "héllo")
            assert w.path == "a/b.txt" and w.name == "b.txt"
            assert await sbx.files.read("a/b.txt") == "héllo"
            assert bytes(await sbx.files.read("a/b.txt", format="bytes")) == "héllo".encode()
            big = b"\xff" * ((1 << 20) + 7)
            await sbx.files.write("big", big)
            chunks = [c async for c in await sbx.files.read("big", format="stream")]
            assert len(chunks) == 2 and b"".join(chunks) == big
            await sbx.files.write_files([WriteEntry(path="m/1", data="1"), {"path": "m/2", "data": b"2"}])
            assert [e.name for e in await sbx.files.list("m")] == ["1", "2"]
            assert "/home/user/a/b.txt" in [e.path for e in await sbx.files.list(".", depth=2)]
            assert await sbx.files.exists("a") and not await sbx.files.exists("zz")
            assert (await sbx.files.get_info("a/b.txt")).size == len("héllo".encode())
            assert await sbx.files.make_dir("x/y") is True and await sbx.files.make_dir("x/y") is False
            moved = await sbx.files.rename("a/b.txt", "x/y/c.txt")
            assert moved.path == "/home/user/x/y/c.txt"
            await sbx.files.remove("x")
            assert not await sbx.files.exists("x")
            with pytest.raises(FileNotFoundException):
                await sbx.files.read("/missing")
            with pytest.raises(PermissionDeniedException):
                await sbx.files.write("/etc/nope", "x")
            with pytest.raises(InvalidArgumentException):
                await sbx.files.read("a", format="blob")
            with pytest.raises(InvalidArgumentException):
                await sbx.files.list(".", depth=0)

    run(go())


def test_pty(opts):
    async def go():
        async with await AsyncSandbox.create(**opts) as sbx:
            got = bytearray()
            seen = asyncio.Event()

            async def on_data(b):
                got.extend(b)
                if b"mark-7" in got:
                    seen.set()

            term = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=on_data)
            await sbx.pty.send_stdin(term.pid, b"stty size; echo mark-$((3+4))\r")
            await asyncio.wait_for(seen.wait(), 10)
            assert b"24 80" in got
            await sbx.pty.resize(term.pid, PtySize(rows=30, cols=90))
            await sbx.pty.send_stdin(term.pid, b"stty size; exit\r")
            await term.wait()
            assert b"30 90" in got
            other = await sbx.pty.create(PtySize(rows=5, cols=5), on_data=lambda b: None, cmd=["/bin/sh"])
            assert await sbx.pty.kill(other.pid) is True
            with pytest.raises(InvalidArgumentException):
                await sbx.pty.create(PtySize(rows=0, cols=5), on_data=lambda b: None)
            with pytest.raises(InvalidArgumentException):
                await sbx.pty.create(PtySize(rows=5, cols=5), on_data=None)

    run(go())


def test_watch_dir(opts):
    async def go():
        async with await AsyncSandbox.create(**opts) as sbx:
            await sbx.files.make_dir("w/sub")
            events, exits = [], []
            created = asyncio.Event()

            def on_event(e):
                events.append(e)
                if e.type == FilesystemEventType.CREATE and e.name == "sub/f":
                    created.set()

            h = await sbx.files.watch_dir("w", on_event, on_exit=exits.append, recursive=True)
            await sbx.files.write("w/sub/f", "1")
            await asyncio.wait_for(created.wait(), 10)
            await h.stop()
            assert exits == [None]

            ended = asyncio.Event()
            h2 = await sbx.files.watch_dir("w", lambda e: None, on_exit=lambda err: (exits.append(err), ended.set()))
            await sbx.files.remove("w")
            await asyncio.wait_for(ended.wait(), 10)
            assert isinstance(exits[-1], SandboxException)
            await h2.stop()  # already over: nothing to do

            await sbx.files.make_dir("t")
            timed = asyncio.Event()
            await sbx.files.watch_dir("t", lambda e: None, on_exit=lambda err: (exits.append(err), timed.set()), timeout=0.2)
            await asyncio.wait_for(timed.wait(), 10)
            assert isinstance(exits[-1], TimeoutException)
            with pytest.raises(FileNotFoundException):
                await sbx.files.watch_dir("nope", lambda e: None)

    run(go())


def test_async_bounds_and_missing_daemon(tmp_path, monkeypatch):
    from tupper import _connection

    async def go():
        with pytest.raises(SandboxException) as e:
            await AsyncSandbox.create(socket=str(tmp_path / "none.sock"))
        assert "TUPPER_SOCKET" in str(e.value)

        monkeypatch.setattr(_connection, "MAX_LINE", 1024)
        path = str(tmp_path / "loud.sock")

        async def loud(reader, writer):
            await reader.readline()
            writer.write(b"x" * 4096)
            await writer.drain()
            await reader.read()
            writer.close()

        mute_path = str(tmp_path / "mute.sock")

        async def mute(reader, writer):
            await reader.read()
            writer.close()

        srv = await asyncio.start_unix_server(loud, path)
        srv2 = await asyncio.start_unix_server(mute, mute_path)
        try:
            with pytest.raises(SandboxException) as e:
                await AsyncSandbox.create(socket=path, request_timeout=5)
            assert "over 1024 bytes" in str(e.value)
            with pytest.raises(TimeoutException) as e:
                await AsyncSandbox.create(socket=mute_path, request_timeout=0.3)
            assert "request_timeout" in str(e.value)
        finally:
            srv.close()
            srv2.close()

    run(go())

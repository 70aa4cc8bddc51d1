"""sbx.commands against a real daemon: run, callbacks, background handles, stdin, list, kill, connect, errors."""
import threading
import time

import pytest

from tupper import (
    CommandExitException,
    CommandHandle,
    CommandResult,
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
    TimeoutException,
)


def test_run_returns_a_result_as_the_default_account(sbx):
    r = sbx.commands.run("echo out; echo err >&2; id -un; pwd")
    assert isinstance(r, CommandResult)
    assert r.stdout == "out\nuser\n/home/user\n"
    assert r.stderr == "err\n"
    assert r.exit_code == 0 and r.error is None


def test_nonzero_exit_raises_command_exit_exception(sbx):
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("echo partial; echo oops >&2; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stdout == "partial\n" and e.value.stderr == "oops\n"
    assert e.value.error == "exit status 3"
    assert isinstance(e.value, SandboxException) and isinstance(e.value, CommandResult)
    assert "exited with code 3" in str(e.value)


def test_a_command_its_memory_limit_kills_says_so(opts):
    from tupper import Sandbox

    small = Sandbox.create(limits={"memory": "64M"}, **opts)
    try:
        with pytest.raises(CommandExitException) as e:
            small.commands.run("dd if=/dev/zero of=/dev/null bs=256M count=1")
        assert e.value.error == "out of memory: killed by the sandbox's memory limit"
        with pytest.raises(CommandExitException) as e:
            small.commands.run("kill -9 $$")
        assert e.value.error == "signal: killed"
    finally:
        small.kill()


def test_callbacks_get_output_as_it_comes(sbx):
    out, err = [], []
    r = sbx.commands.run("echo a; sleep 0.1; echo b >&2; echo c", on_stdout=out.append, on_stderr=err.append)
    assert "".join(out) == "a\nc\n" and "".join(err) == "b\n"
    assert r.stdout == "a\nc\n"


def test_utf8_split_across_chunks_is_joined(sbx):
    r = sbx.commands.run("printf '\\303'; sleep 0.1; printf '\\251\\n'")
    assert r.stdout == "\u00e9\n"


def test_cwd_envs_user(sbx):
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    sbx.files.make_dir("work")
    assert sbx.commands.run("pwd", cwd="work").stdout == "/home/user/work\n", "relative to the account's home"
    assert sbx.commands.run("echo $A-$B", envs={"A": "1", "B": "2"}).stdout == "1-2\n"
    assert sbx.commands.run("id -u; echo $HOME; pwd", user="root").stdout == "0\n/root\n/root\n"


def test_background_handle_wait_kill(sbx):
    h = sbx.commands.run("echo started; sleep 0.2; echo done", background=True)
    assert isinstance(h, CommandHandle) and h.pid > 0
    r = h.wait()
    assert r.stdout == "started\ndone\n" and h.exit_code == 0 and h.stdout == r.stdout
    assert h.wait().stdout == r.stdout, "waiting again gives the same result"

    long = sbx.commands.run("sleep 30", background=True)
    assert long.kill() is True
    with pytest.raises(CommandExitException) as e:
        long.wait()
    assert e.value.error == "signal: killed" and e.value.exit_code == -1
    assert long.kill() is False, "no longer running"


def test_background_iteration_and_wait_callbacks(sbx):
    h = sbx.commands.run("echo one; echo two >&2", background=True)
    seen = list(h)
    assert ("one\n", None, None) in seen and (None, "two\n", None) in seen
    assert h.wait().stdout == "one\n"
    h2 = sbx.commands.run("echo x", background=True)
    got = []
    h2.wait(on_stdout=got.append)
    assert got == ["x\n"]


def test_stdin(sbx):
    h = sbx.commands.run("cat", background=True, stdin=True)
    h.send_stdin("hello ")
    sbx.commands.send_stdin(h.pid, b"world\n")
    h.close_stdin()
    assert h.wait().stdout == "hello world\n"
    big = "x" * (3 << 20)  # over one 1 MiB piece
    h = sbx.commands.run("wc -c", background=True, stdin=True)
    h.send_stdin(big)
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout.strip() == str(3 << 20)


def test_list_and_kill_by_pid(sbx):
    h = sbx.commands.run("sleep 30", background=True)
    procs = sbx.commands.list()
    mine = [p for p in procs if p.pid == h.pid]
    assert len(mine) == 1
    assert mine[0].cmd == "/bin/sh" and mine[0].args == ["-c", "sleep 30"]
    assert mine[0].user == "user" and mine[0].pty is False and mine[0].envs == {}
    assert sbx.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        h.wait()
    assert sbx.commands.kill(h.pid) is False
    assert all(p.pid != h.pid for p in sbx.commands.list())


def test_connect_replays_and_follows(sbx):
    h = sbx.commands.run("echo early; sleep 0.5; echo late", background=True)
    time.sleep(0.2)
    h.disconnect()
    again = sbx.commands.connect(h.pid)
    r = again.wait()
    assert r.stdout == "early\nlate\n"
    with pytest.raises(SandboxException):
        h.wait()  # the disconnected handle no longer follows it
    with pytest.raises(NotFoundException):
        sbx.commands.connect(h.pid)


def test_timeout_kills_the_command(sbx):
    t = time.monotonic()
    with pytest.raises(TimeoutException) as e:
        sbx.commands.run("sleep 30", timeout=0.5)
    assert time.monotonic() - t < 10
    assert "timeout" in str(e.value)


def test_start_errors(sbx):
    with pytest.raises(InvalidArgumentException):
        sbx.commands.run("")
    with pytest.raises(InvalidArgumentException):
        sbx.commands.run("true", timeout=-1)
    with pytest.raises(InvalidArgumentException):
        sbx.commands.run("true", envs={"A": 1})
    with pytest.raises(NotFoundException) as e:
        sbx.commands.run("true", user="nobody-here")
    assert "nobody-here" in str(e.value)
    with pytest.raises(NotFoundException):
        sbx.commands.send_stdin(99999, "x")
    with pytest.raises(CommandExitException) as ce:
        sbx.commands.run("touch /etc/nope")
    assert "Permission denied" in ce.value.stderr


def test_sandbox_killed_under_a_waiting_command(opts):
    from tupper import Sandbox

    sbx = Sandbox.create(**opts)
    h = sbx.commands.run("sleep 30", background=True)
    errs = []

    def waiter():
        try:
            h.wait()
        except BaseException as e:  # noqa: BLE001
            errs.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.1)
    sbx.kill()
    t.join(10)
    assert not t.is_alive()
    assert len(errs) == 1 and isinstance(errs[0], TimeoutException)
    with pytest.raises(SandboxException):
        sbx.commands.run("true")  # a dead sandbox: a clear error, not a hang


def test_concurrent_commands_on_one_sandbox(sbx):
    results = {}

    def run(i):
        results[i] = sbx.commands.run(f"echo {i}").stdout

    ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert results == {i: f"{i}\n" for i in range(8)}

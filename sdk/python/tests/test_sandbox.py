"""Sandbox lifecycle against a real daemon: create, info, list, connect, timeouts, kill."""
import datetime
import os
import socket as _socket
import threading

import pytest

import tupper
from tupper import (
    InvalidArgumentException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    NotFoundException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)


def test_create_with_envs_metadata_limits_then_info_and_kill(opts):
    sbx = Sandbox.create(envs={"GREETING": "hi"}, metadata={"owner": "py-test"}, limits={"pids": 64}, **opts)
    try:
        assert sbx.sandbox_id
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.template_id == "default"
        assert info.state == SandboxState.RUNNING
        assert info.metadata == {"owner": "py-test"}
        assert info.limits["pids"] == 64
        assert info.timeout == 300, "default lifetime: 300 s, as E2B"
        assert info.end_at - info.started_at >= datetime.timedelta(seconds=299)
        assert info.default_user == "user" and info.home == "/home/user"
        assert sbx.commands.run("echo $GREETING").stdout == "hi\n"
        assert sbx.is_running() is True
    finally:
        assert sbx.kill() is True
    assert Sandbox.kill(sbx.sandbox_id, **opts) is False, "already gone"
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **opts)


def test_template_and_timeout_map_to_image_and_lifetime(opts):
    sbx = Sandbox.create("default", timeout=120, **opts)
    try:
        assert sbx.get_info().timeout == 120
        sbx.set_timeout(60)
        assert sbx.get_info().timeout == 60
        Sandbox.set_timeout(sbx.sandbox_id, 0, **opts)
        info = Sandbox.get_info(sbx.sandbox_id, **opts)
        assert info.timeout == 0 and info.end_at is None
    finally:
        sbx.kill()


def test_context_manager_kills_even_on_error(opts):
    with pytest.raises(RuntimeError):
        with Sandbox.create(**opts) as sbx:
            sid = sbx.sandbox_id
            raise RuntimeError("boom")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sid, **opts)


def test_connect_by_id_and_instance_connect(opts, sbx):
    other = Sandbox.connect(sbx.sandbox_id, timeout=90, **opts)
    try:
        assert other.sandbox_id == sbx.sandbox_id
        assert other.get_info().timeout == 90
        other.files.write("shared.txt", "from other")
        assert sbx.files.read("shared.txt") == "from other"
        assert other.connect() is other
    finally:
        other.close()  # lets go of the connection; the sandbox lives on
    assert sbx.is_running()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("no-such-sandbox", **opts)


def test_list_paginates_and_filters(opts):
    a = Sandbox.create(metadata={"suite": "list", "n": "1"}, **opts)
    b = Sandbox.create(metadata={"suite": "list", "n": "2"}, **opts)
    try:
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": "list"}), limit=1, **opts)
        assert p.has_next
        first = p.next_items()
        assert len(first) == 1
        assert p.next_token == "1"
        second = p.next_items()
        assert len(second) == 1
        assert {first[0].sandbox_id, second[0].sandbox_id} == {a.sandbox_id, b.sandbox_id}
        assert not p.has_next and p.next_token is None
        with pytest.raises(InvalidArgumentException):
            p.next_items()
        only = Sandbox.list(query=SandboxQuery(metadata={"n": "2"}, state=[SandboxState.RUNNING]), **opts).next_items()
        assert [s.sandbox_id for s in only] == [b.sandbox_id]
        assert Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED], metadata={"suite": "list"}), **opts).next_items() == []
        with pytest.raises(InvalidArgumentException):
            Sandbox.list(limit=0, **opts)
    finally:
        a.kill()
        b.kill()


def test_lifetime_runs_out(opts):
    sbx = Sandbox.create(timeout=1, **opts)
    try:
        h = sbx.commands.run("sleep 30", background=True, timeout=0)
        with pytest.raises(TimeoutException) as e:
            h.wait()
        assert "timeout" in str(e.value)
        assert sbx.is_running() is False
    finally:
        assert sbx.kill() is False


def test_get_host_forwards_a_port(sbx):
    sbx.commands.run("echo -e 'HTTP/1.0 200 OK\\r\\n\\r\\nhello' > /tmp/r; nc -l -p 8080 < /tmp/r", background=True, user="root")
    host = sbx.get_host(8080)
    h, port = host.split(":")
    assert h == "127.0.0.1"
    data = b""
    for _ in range(100):
        try:
            s = _socket.create_connection((h, int(port)))
            s.sendall(b"GET / HTTP/1.0\r\n\r\n")
            while True:
                c = s.recv(4096)
                if not c:
                    break
                data += c
            s.close()
        except OSError:
            pass
        if b"hello" in data:
            break
        threading.Event().wait(0.05)
    assert b"hello" in data
    with pytest.raises(InvalidArgumentException):
        sbx.get_host(0)


def test_pause_resume_metrics(opts, sbx):
    try:
        metrics = sbx.get_metrics()
    except SandboxException as e:
        pytest.skip(f"no cgroups here: {e}")
    assert len(metrics) == 1 and metrics[0].mem_used >= 0
    assert sbx.pause() is True
    assert sbx.is_running() is False
    assert sbx.get_info().state == SandboxState.PAUSED
    again = Sandbox.connect(sbx.sandbox_id, **opts)  # resumes, as E2B
    try:
        assert sbx.is_running() is True
        assert again.commands.run("echo back").stdout == "back\n"
    finally:
        again.close()
    assert len(Sandbox.get_metrics(sbx.sandbox_id, **opts)) == 1
    assert Sandbox.pause(sbx.sandbox_id, **opts) is True
    assert sbx.is_running() is False
    sbx.connect()  # the instance form resumes too
    assert sbx.is_running() is True


def test_bad_arguments_are_clear(opts):
    with pytest.raises(InvalidArgumentException):
        Sandbox.create(timeout=-1, **opts)
    with pytest.raises(InvalidArgumentException):
        Sandbox.create(envs={"A": 1}, **opts)
    with pytest.raises(InvalidArgumentException):
        Sandbox.create(mcp={"x": {}}, **opts)
    with pytest.raises(InvalidArgumentException):
        Sandbox.create(no_such_option=1, **opts)
    with pytest.raises(InvalidArgumentException) as e:
        Sandbox.create(limits={"pids": "lots"}, **opts)
    assert "pids" in str(e.value)
    with pytest.raises(InvalidArgumentException):
        Sandbox.create(accel="fast", **opts)
    with pytest.raises(SandboxException) as e:
        Sandbox.create(accel="tcg", **opts)  # sent: the daemon's linux backend has none
    assert "'accel' is for microVMs" in str(e.value)
    with pytest.raises(SandboxException) as e:
        Sandbox.create("Not A Valid Image Name", **opts)
    assert "Not A Valid Image Name" in str(e.value)
    # E2B's connection options are accepted and ignored
    sbx = Sandbox.create(api_key="e2b_ignored", domain="example.invalid", debug=False, **opts)
    sbx.kill()


def test_a_daemon_that_is_not_there(tmp_path, monkeypatch):
    path = str(tmp_path / "none.sock")
    with pytest.raises(SandboxException) as e:
        Sandbox.create(socket=path)
    assert path in str(e.value) and "TUPPER_SOCKET" in str(e.value)
    monkeypatch.setenv("TUPPER_SOCKET", path)
    assert tupper.default_socket() == path
    with pytest.raises(SandboxException):
        Sandbox.list().next_items()


def test_default_socket_rules(monkeypatch):
    monkeypatch.delenv("TUPPER_SOCKET", raising=False)
    if os.getuid() == 0:
        assert tupper.default_socket() == "/run/tupper/tupper.sock"
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1")
        assert tupper.default_socket() == "/run/user/1/tupper.sock"
        monkeypatch.delenv("XDG_RUNTIME_DIR")
        assert tupper.default_socket() == f"/tmp/tupper-{os.getuid()}/tupper.sock"


def test_default_sockets_fall_back_to_the_system_socket():
    """A user that is not root tries its own socket, then the system's (docs/install.md)."""
    env = {"XDG_RUNTIME_DIR": "/run/user/1000"}
    assert tupper.default_sockets(1000, env) == ["/run/user/1000/tupper.sock", "/run/tupper/tupper.sock"]
    assert tupper.default_sockets(1000, {}) == ["/tmp/tupper-1000/tupper.sock", "/run/tupper/tupper.sock"]
    assert tupper.default_sockets(0, env) == ["/run/tupper/tupper.sock"]
    named = {"TUPPER_SOCKET": "/a/b.sock", "XDG_RUNTIME_DIR": "/r"}
    assert tupper.default_sockets(1000, named) == ["/a/b.sock"]
    assert tupper.default_sockets(0, named) == ["/a/b.sock"]
    moved = {"TUPPER_SYSTEM_SOCKET": "/s/sys.sock", "XDG_RUNTIME_DIR": "/r"}
    assert tupper.default_sockets(1000, moved) == ["/r/tupper.sock", "/s/sys.sock"]
    assert tupper.default_socket(0, moved) == "/s/sys.sock"


@pytest.mark.skipif(os.getuid() != 0, reason="runs a client as another user")
def test_a_user_reaches_the_system_daemon_through_the_fallback(daemon):
    """A real client as uid 65534: its own socket is not there, the (stand-in) system one answers;
    with neither, the error names both."""
    import subprocess
    import sys

    import shutil
    import tempfile

    # a dir the other user can pass through, with the package and a name of
    # the daemon's socket in it: the checkout and the test's TMPDIR may sit
    # where it cannot (a fresh machine clones into /root; TMPDIR is 0700)
    here = tempfile.mkdtemp(prefix="tupper-py-sys-", dir="/tmp")
    os.chmod(here, 0o711)
    pkg = os.path.join(here, "py")
    shutil.copytree(os.path.dirname(os.path.abspath(tupper.__file__)), os.path.join(pkg, "tupper"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    for top, dirs, files in os.walk(pkg):
        os.chmod(top, 0o755)
        for f in files:
            os.chmod(os.path.join(top, f), 0o644)
    # a second name of the socket's inode: connect() needs search permission
    # on every directory of the path it is given, not of the one it was bound at
    sock = os.path.join(here, "tupper.sock")
    os.link(daemon.socket, sock)
    script = ("import tupper._connection as c\n"
              "conn = c.Connection.open()\n"
              "print(conn.socket_path)\n"
              "conn.close()\n")
    run_dir = "/nonexistent/run"  # absent, and every user can tell

    def as_nobody(system):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": pkg, "HOME": "/nonexistent",
               "XDG_RUNTIME_DIR": run_dir, "TUPPER_SYSTEM_SOCKET": system}
        return subprocess.run([sys.executable, "-c", script], env=env, user=65534, group=65534, extra_groups=[],
                              capture_output=True, text=True, timeout=60)

    sock_mode = os.stat(daemon.socket).st_mode & 0o7777
    os.chmod(sock, 0o666)  # as tupper.socket's 0660 root:tupper is to a member of the group
    try:
        r = as_nobody(sock)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == sock
        gone = "/nonexistent/gone.sock"
        r = as_nobody(gone)
        assert r.returncode != 0
        assert f"{run_dir}/tupper.sock (" in r.stderr and f"nor at {gone} (" in r.stderr, r.stderr
        os.chmod(sock, 0o600)
        r = as_nobody(sock)
        assert r.returncode != 0
        assert f"{run_dir}/tupper.sock (" in r.stderr and f"nor at {sock} (" in r.stderr, r.stderr
        assert "Permission denied" in r.stderr, r.stderr
    finally:
        os.chmod(daemon.socket, sock_mode)
        shutil.rmtree(here)


def test_request_timeout_raises_timeout(tmp_path):
    """A daemon that never answers: the request gives up after request_timeout."""
    path = str(tmp_path / "mute.sock")
    srv = _socket.socket(_socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)
    accepted = []
    t = threading.Thread(target=lambda: accepted.append(srv.accept()[0]), daemon=True)
    t.start()
    try:
        with pytest.raises(TimeoutException) as e:
            Sandbox.create(socket=path, request_timeout=0.3)
        assert "request_timeout" in str(e.value)
    finally:
        t.join(2)
        for c in accepted:
            c.close()
        srv.close()


def test_overlong_line_closes_the_connection(tmp_path, monkeypatch):
    """A line over the bound is refused, not buffered without end."""
    from tupper import _connection

    monkeypatch.setattr(_connection, "MAX_LINE", 1024)
    path = str(tmp_path / "loud.sock")
    srv = _socket.socket(_socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        c.recv(4096)
        try:
            c.sendall(b"x" * 4096)
            c.recv(1)
        except OSError:
            pass
        c.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(SandboxException) as e:
            Sandbox.create(socket=path, request_timeout=5)
        assert "over 1024 bytes" in str(e.value)
    finally:
        t.join(2)
        srv.close()

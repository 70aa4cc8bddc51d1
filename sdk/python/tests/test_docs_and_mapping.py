"""
What docs/python.md and the README claim: their Python examples run against
the private daemon and print what their comments say; the error table holds;
the package installs with pip.
"""
import ast
import os
import re
import shutil
import subprocess
import sys

import pytest

import tupper
from tupper import Sandbox, exceptions as ex

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _blocks(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    return [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "from tupper import" in b]


def _expected(block):
    """The literal after `print(...)  # ` on each line that has one."""
    out = []
    for line in block.splitlines():
        m = re.match(r"\s*print\(.*\)  # (.+)$", line)
        if m:
            out.append(ast.literal_eval(m.group(1)))
    return out


@pytest.mark.parametrize("path", ["docs/python.md", "README.md"])
def test_examples_run_and_print_what_they_say(path, daemon, monkeypatch):
    monkeypatch.setenv("TUPPER_SOCKET", daemon.socket)
    blocks = _blocks(path)
    assert blocks
    for block in blocks:
        printed = []
        env = {"__name__": "__doc_example__", "print": lambda *a, **k: printed.append(a[0] if len(a) == 1 else a)}
        exec(compile(block, path, "exec"), env)
        assert printed == _expected(block), block
    assert Sandbox.list().next_items() == [], "the examples leave no sandbox"


@pytest.mark.parametrize("code,data,method,cls", [
    (-32000, None, "sandbox.get", ex.SandboxNotFoundException),
    (-32000, None, "process.signal", ex.NotFoundException),
    (-32602, None, "fs.read", ex.InvalidArgumentException),
    (-32002, {"code": "ENOENT"}, "fs.read", ex.FileNotFoundException),
    (-32003, {"code": "ENOENT"}, "process.start", ex.NotFoundException),
    (-32002, {"code": "ENOSPC"}, "fs.write", ex.NotEnoughSpaceException),
    (-32002, {"code": "EDQUOT"}, "fs.write", ex.NotEnoughSpaceException),
    (-32002, {"code": "EACCES"}, "fs.write", ex.PermissionDeniedException),
    (-32003, {"code": "EPERM"}, "process.start", ex.PermissionDeniedException),
    (-32005, None, "fs.write", ex.PolicyException),
    (-32004, None, "fs.stat", ex.RateLimitException),
    (-32001, None, "sandbox.create", ex.SandboxException),
])
def test_error_table(code, data, method, cls):
    e = ex.from_rpc_error({"code": code, "message": "m", "data": data}, method)
    assert type(e) is cls and isinstance(e, ex.SandboxException)
    assert e.code == code and str(e) == f"{method}: m"
    if data:
        assert e.errno_code == data["code"]


def test_e2b_names_and_hierarchy():
    for name in ("SandboxException", "TimeoutException", "NotFoundException", "InvalidArgumentException",
                 "NotEnoughSpaceException", "AuthenticationException", "CommandExitException", "FileNotFoundException",
                 "SandboxNotFoundException", "TemplateException", "RateLimitException", "CommandResult", "CommandHandle",
                 "AsyncCommandHandle", "WatchHandle", "AsyncWatchHandle", "EntryInfo", "FileType", "FilesystemEvent",
                 "FilesystemEventType", "ProcessInfo", "PtySize", "SandboxInfo", "SandboxQuery", "SandboxState"):
        assert hasattr(tupper, name), name
    assert issubclass(ex.FileNotFoundException, ex.NotFoundException)
    assert issubclass(ex.SandboxNotFoundException, ex.NotFoundException)
    assert not issubclass(ex.AuthenticationException, ex.SandboxException)
    e = ex.CommandExitException(stderr="e", stdout="o", exit_code=2, error="exit status 2")
    assert (e.stdout, e.stderr, e.exit_code, e.error) == ("o", "e", 2, "exit status 2")


def test_options_not_accepted(opts, sbx):
    for bad in ({"lifecycle": {}}, {"volume_mounts": {}}, {"iam": {}}):
        with pytest.raises(ex.InvalidArgumentException):
            Sandbox.create(**bad, **opts)
    with pytest.raises(TypeError):
        sbx.files.write("x", "y", gzip=True)
    with pytest.raises(TypeError):
        sbx.files.read("x", gzip=True)


def test_network_none_unless_asked(opts):
    with Sandbox.create(allow_internet_access=False, **opts) as a:
        assert a.commands.run("echo ok").stdout == "ok\n"
    with Sandbox.create(network={"allow": ["example.org"]}, **opts) as b:
        assert b.commands.run("echo ok").stdout == "ok\n"
    with pytest.raises(ex.InvalidArgumentException):
        Sandbox.create(network="everything", **opts)


def test_pip_installs_the_package(tmp_path):
    """pip builds and installs it with setuptools (a copy: the build writes beside the sources)."""
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("no pip for this python")
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "sdk", "python"), src, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                        "--no-index", "--target", str(target), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", "import tupper, sys; print(tupper.__file__)"],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)}, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.startswith(str(target)), r.stderr

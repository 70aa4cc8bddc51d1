"""
A private tupper daemon for the test session, as sdk/js/test/daemon.mjs
starts one: a temp dir holding its socket, state dir and log; stopped with
SIGTERM (then SIGKILL) in teardown, even when tests fail, and its temp dir
removed.  TUPPER_BIN names the binary (tests/run.sh exports it).
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the package by path: PYTHONPATH=sdk/python

BIN = os.environ.get("TUPPER_BIN") or os.path.join(HERE, "..", "..", "..", "build", "tupper")


def _answers(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="tupper-py-")
        self.socket = os.path.join(self.dir, "tupper.sock")
        self.log = os.path.join(self.dir, "daemon.log")
        self.proc = subprocess.Popen(
            [BIN, "daemon", "--socket", self.socket, "--state-dir", os.path.join(self.dir, "state"), "--log", self.log],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )
        # as tests/spec/helper.lua's START_MS: a loaded 2-core machine may
        # take far longer than an idle one (returns as soon as it answers)
        deadline = time.monotonic() + 90
        while not _answers(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                text = ""
                if os.path.exists(self.log):
                    with open(self.log) as f:
                        text = f.read()
                self.stop()
                raise RuntimeError(f"the daemon did not start: {text}")
            time.sleep(0.01)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)  # it destroys its boxes first; a loaded machine is slow
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    try:
        yield d
    finally:
        code = d.stop()
    assert code == 0, "the daemon exits cleanly on SIGTERM"


@pytest.fixture
def opts(daemon):
    """The connection options of the private daemon."""
    return {"socket": daemon.socket}


@pytest.fixture
def sbx(opts):
    """A fresh sandbox, killed after the test."""
    from tupper import Sandbox

    s = Sandbox.create(**opts)
    try:
        yield s
    finally:
        s.kill()

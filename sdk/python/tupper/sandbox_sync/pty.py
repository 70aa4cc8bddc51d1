"""sbx.pty: programs on a terminal of the box, as E2B's Pty module."""
from typing import Dict, List, Optional

from .._drive import run
from .._link import Link
from ..models import PtySize, Username
from .command_handle import CommandHandle
from .commands import Commands


class Pty:
    """
    Starts programs (a login shell by default) on a new pseudo-terminal;
    what the terminal shows comes as raw bytes: ``handle.wait(on_pty=...)``
    or iterating the handle.
    """

    def __init__(self, link: Link, commands: Commands) -> None:
        self._link = link
        self._commands = commands

    def create(self, size: PtySize, user: Optional[Username] = None, cwd: Optional[str] = None,
               envs: Optional[Dict[str, str]] = None, timeout: Optional[float] = 60,
               request_timeout: Optional[float] = None, cmd: Optional[List[str]] = None) -> CommandHandle:
        """
        Starts a terminal of ``size`` (cols, rows: 1..4096) running ``cmd``
        (tupper's; default ``/bin/sh -i -l``) as ``user``; killed after
        ``timeout`` seconds (0: never).
        """
        params = self._commands._ops.pty_params(size, cmd)
        return self._commands._start("pty.create", params, cwd, envs, user, timeout, request_timeout, pty=True)

    def send_stdin(self, pid: int, data: bytes, request_timeout: Optional[float] = None) -> None:
        """Types into the terminal (``b"\\x03"`` is Ctrl-C, ``b"\\r"`` Enter)."""
        self._commands.send_stdin(pid, data, request_timeout=request_timeout)

    def resize(self, pid: int, size: PtySize, request_timeout: Optional[float] = None) -> None:
        """Resizes the terminal; its programs get SIGWINCH."""
        run(self._commands._ops.resize(pid, size, request_timeout))

    def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        """Kills the terminal's program and its whole tree; False when it no longer ran."""
        return self._commands.kill(pid, request_timeout=request_timeout)

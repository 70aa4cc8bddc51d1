"""sbx.pty of an AsyncSandbox: programs on a terminal, as E2B's async Pty."""
from typing import Dict, List, Optional

from .._drive import arun
from .._link import Link
from ..exceptions import InvalidArgumentException
from ..models import PtyOutput, PtySize, Username
from .command_handle import AsyncCommandHandle, OutputHandler
from .commands import Commands


class Pty:
    """Starts programs on a new pseudo-terminal; what it shows goes to ``on_data`` as raw bytes."""

    def __init__(self, link: Link, commands: Commands) -> None:
        self._link = link
        self._commands = commands

    async def create(self, size: PtySize, on_data: OutputHandler[PtyOutput], user: Optional[Username] = None,
                     cwd: Optional[str] = None, envs: Optional[Dict[str, str]] = None, timeout: Optional[float] = 60,
                     request_timeout: Optional[float] = None, cmd: Optional[List[str]] = None) -> AsyncCommandHandle:
        """Starts a terminal of ``size`` running ``cmd`` (tupper's; default ``/bin/sh -i -l``); killed after ``timeout`` s (0: never)."""
        params = self._commands._ops.pty_params(size, cmd)
        if not callable(on_data):
            raise InvalidArgumentException("pty.create: on_data must be callable")
        return await self._commands._start("pty.create", params, cwd, envs, user, timeout, request_timeout,
                                           dict(on_pty=on_data), pty=True)

    async def send_stdin(self, pid: int, data: bytes, request_timeout: Optional[float] = None) -> None:
        """Types into the terminal."""
        await self._commands.send_stdin(pid, data, request_timeout=request_timeout)

    async def resize(self, pid: int, size: PtySize, request_timeout: Optional[float] = None) -> None:
        """Resizes the terminal; its programs get SIGWINCH."""
        await arun(self._commands._ops.resize(pid, size, request_timeout))

    async def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        """Kills the terminal's program and its whole tree; False when it no longer ran."""
        return await self._commands.kill(pid, request_timeout=request_timeout)

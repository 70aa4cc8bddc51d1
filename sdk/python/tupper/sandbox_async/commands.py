"""sbx.commands of an AsyncSandbox: processes in a sandbox (``/bin/sh -c cmd``), as E2B's async Commands (the protocol is ``_commands.CommandsOps``)."""
import asyncio
from typing import Any, Dict, List, Optional, Set, Union

from .._commands import CommandsOps
from .._drive import arun
from .._link import Link
from ..models import ProcessInfo, Stderr, Stdout, Username
from .command_handle import AsyncCommandHandle, OutputHandler


class Commands:
    """Runs commands in the sandbox (asyncio)."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._live: Set[AsyncCommandHandle] = set()
        self._ops = CommandsOps(link, asyncio.sleep, self._live)

    async def run(self, cmd: str, background: Optional[bool] = None, envs: Optional[Dict[str, str]] = None,
                  user: Optional[Username] = None, cwd: Optional[str] = None,
                  on_stdout: Optional[OutputHandler[Stdout]] = None, on_stderr: Optional[OutputHandler[Stderr]] = None,
                  stdin: Optional[bool] = None, timeout: Optional[float] = 60,
                  request_timeout: Optional[float] = None) -> Any:
        """
        Runs ``cmd`` with ``/bin/sh -c``; awaits its end and returns a
        CommandResult (CommandExitException on a non-zero exit), or with
        ``background=True`` returns an AsyncCommandHandle at once.  The
        callbacks (functions or coroutine functions) get each chunk of output,
        in the background too.  Options as for ``Sandbox.commands.run``.
        """
        params = self._ops.run_params(cmd, stdin)
        handle = await self._start("process.start", params, cwd, envs, user, timeout, request_timeout,
                                   dict(on_stdout=on_stdout, on_stderr=on_stderr))
        if background:
            return handle
        return await handle.wait()

    def _handle(self, pid: int, handlers: Dict[str, Any], pty: bool = False) -> AsyncCommandHandle:
        h = AsyncCommandHandle(self._link, self, pid, pty=pty, **handlers)
        self._live.add(h)
        return h

    async def _start(self, method: str, params: Dict[str, Any], cwd: Optional[str], envs: Optional[Dict[str, str]],
                     user: Optional[str], timeout: Optional[float], request_timeout: Optional[float],
                     handlers: Dict[str, Any], pty: bool = False) -> AsyncCommandHandle:
        return await arun(self._ops.start(method, params, cwd, envs, user, timeout, request_timeout,
                                          lambda pid: self._handle(pid, handlers, pty)))

    async def connect(self, pid: int, timeout: Optional[float] = 60, request_timeout: Optional[float] = None,
                      on_stdout: Optional[OutputHandler[Stdout]] = None,
                      on_stderr: Optional[OutputHandler[Stderr]] = None) -> AsyncCommandHandle:
        """Follows a running command: the recent output the daemon kept (64 KiB) first, then the rest."""
        handlers = dict(on_stdout=on_stdout, on_stderr=on_stderr)
        return await arun(self._ops.connect(pid, request_timeout, lambda p: self._handle(p, handlers)))

    async def list(self, request_timeout: Optional[float] = None) -> List[ProcessInfo]:
        """The running commands and terminals started through the API."""
        return await arun(self._ops.list(request_timeout))

    async def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        """Kills a command and its whole tree (SIGKILL); False when there is no such process."""
        return await arun(self._ops.kill(pid, request_timeout))

    async def send_stdin(self, pid: int, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
        """Writes to a command's stdin, in 1 MiB pieces; a full stdin queue (EAGAIN) is waited out."""
        await arun(self._ops.send_stdin(pid, data, request_timeout))

    async def close_stdin(self, pid: int, request_timeout: Optional[float] = None) -> None:
        """Closes a command's stdin once what was written is delivered."""
        await arun(self._ops.close_stdin(pid, request_timeout))

    def _forget(self, h: AsyncCommandHandle) -> None:
        self._live.discard(h)

    def _sandbox_gone(self, why: str) -> None:
        for h in list(self._live):
            h._sandbox_gone(why)

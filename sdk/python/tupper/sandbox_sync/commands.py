"""sbx.commands: processes in a sandbox (``/bin/sh -c cmd``), as E2B's Commands module (the protocol is ``_commands.CommandsOps``)."""
import time
from typing import Any, Callable, Dict, List, Literal, Optional, Set, Union, overload

from .._commands import CommandsOps
from .._drive import run
from .._link import Link
from ..exceptions import CommandResult
from ..models import ProcessInfo, Username
from .command_handle import CommandHandle


class Commands:
    """Runs commands in the sandbox; a command's output comes to the connection that started it."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._live: Set[CommandHandle] = set()
        self._ops = CommandsOps(link, time.sleep, self._live)

    @overload
    def run(self, cmd: str, background: Union[Literal[False], None] = None, envs: Optional[Dict[str, str]] = None,
            user: Optional[Username] = None, cwd: Optional[str] = None, on_stdout: Optional[Callable[[str], None]] = None,
            on_stderr: Optional[Callable[[str], None]] = None, stdin: Optional[bool] = None,
            timeout: Optional[float] = 60, request_timeout: Optional[float] = None) -> CommandResult: ...

    @overload
    def run(self, cmd: str, background: Literal[True], envs: Optional[Dict[str, str]] = None,
            user: Optional[Username] = None, cwd: Optional[str] = None, on_stdout: None = None,
            on_stderr: None = None, stdin: Optional[bool] = None,
            timeout: Optional[float] = 60, request_timeout: Optional[float] = None) -> CommandHandle: ...

    def run(self, cmd: str, background: Optional[bool] = None, envs: Optional[Dict[str, str]] = None,
            user: Optional[Username] = None, cwd: Optional[str] = None, on_stdout: Optional[Callable[[str], None]] = None,
            on_stderr: Optional[Callable[[str], None]] = None, stdin: Optional[bool] = None,
            timeout: Optional[float] = 60, request_timeout: Optional[float] = None) -> Any:
        """
        Runs ``cmd`` with ``/bin/sh -c`` and waits for its end: returns a
        CommandResult on exit code 0, raises CommandExitException otherwise.
        With ``background=True`` returns a CommandHandle at once.

        :param envs: environment added to the sandbox's
        :param user: the account it runs as (default: the sandbox's default account, ``user`` where the image has it)
        :param cwd: working directory (default: that account's home, or the sandbox's workdir); relative to the home
        :param on_stdout: called with each chunk of stdout (while waiting)
        :param stdin: keep stdin open for ``send_stdin`` (otherwise it reads /dev/null)
        :param timeout: kill it (its whole tree) after this many seconds; 0 or None: never
        :param request_timeout: how long the start request may wait for its answer (seconds)
        """
        params = self._ops.run_params(cmd, stdin)
        handle = self._start("process.start", params, cwd, envs, user, timeout, request_timeout)
        if background:
            return handle
        return handle.wait(on_stdout=on_stdout, on_stderr=on_stderr)

    def _handle(self, pid: int, pty: bool = False) -> CommandHandle:
        h = CommandHandle(self._link, self, pid, pty=pty)
        self._live.add(h)
        return h

    def _start(self, method: str, params: Dict[str, Any], cwd: Optional[str], envs: Optional[Dict[str, str]],
               user: Optional[str], timeout: Optional[float], request_timeout: Optional[float], pty: bool = False) -> CommandHandle:
        return run(self._ops.start(method, params, cwd, envs, user, timeout, request_timeout,
                                   lambda pid: self._handle(pid, pty)))

    def connect(self, pid: int, timeout: Optional[float] = 60, request_timeout: Optional[float] = None) -> CommandHandle:
        """
        Follows a running command (started by this client or another): the
        handle first gets the recent output the daemon kept (its last 64 KiB),
        then the rest as it comes.  NotFoundException when no such command runs.
        ``timeout`` is accepted for E2B compatibility (the command's own
        timeout, set at its start, still applies).
        """
        return run(self._ops.connect(pid, request_timeout, self._handle))

    def list(self, request_timeout: Optional[float] = None) -> List[ProcessInfo]:
        """The running commands and terminals started through the API."""
        return run(self._ops.list(request_timeout))

    def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        """Kills a command and its whole tree (SIGKILL); False when there is no such process."""
        return run(self._ops.kill(pid, request_timeout))

    def send_stdin(self, pid: int, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
        """Writes to a command's stdin, in 1 MiB pieces; a full stdin queue (EAGAIN) is waited out."""
        run(self._ops.send_stdin(pid, data, request_timeout))

    def close_stdin(self, pid: int, request_timeout: Optional[float] = None) -> None:
        """Closes a command's stdin once what was written is delivered."""
        run(self._ops.close_stdin(pid, request_timeout))

    def _forget(self, h: CommandHandle) -> None:
        self._live.discard(h)

    def _sandbox_gone(self, why: str) -> None:
        for h in list(self._live):
            h._sandbox_gone(why)

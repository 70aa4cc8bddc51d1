"""sbx.commands: processes in a sandbox (``/bin/sh -c cmd``), as E2B's Commands module."""
import time
from typing import Any, Callable, Dict, List, Literal, Optional, Set, Union, overload

from .._link import Link, rt
from .._wire import CHUNK, b64, seconds, start_params, to_process
from ..exceptions import CommandResult, InvalidArgumentException, NotFoundException, SandboxException
from ..models import ProcessInfo, Username
from .command_handle import CommandHandle, sandbox_gone


class Commands:
    """Runs commands in the sandbox; a command's output comes to the connection that started it."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._live: Set[CommandHandle] = set()

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
        if not isinstance(cmd, str) or cmd == "":
            raise InvalidArgumentException("commands.run: cmd must be a non-empty string")
        params = self._link.params(cmd=cmd, encoding="utf8")
        if stdin:
            params["stdin"] = True
        handle = self._start("process.start", params, cwd, envs, user, timeout, request_timeout)
        if background:
            return handle
        return handle.wait(on_stdout=on_stdout, on_stderr=on_stderr)

    def _start(self, method: str, params: Dict[str, Any], cwd: Optional[str], envs: Optional[Dict[str, str]],
               user: Optional[str], timeout: Optional[float], request_timeout: Optional[float], pty: bool = False) -> CommandHandle:
        t = seconds(timeout, method)
        params.update(start_params(self._link.acct, cwd, envs, user, t))
        box: List[CommandHandle] = []

        def subscribe(r: Any) -> None:
            # before the next line is read: output may follow the reply at once
            h = CommandHandle(self._link, self, int(r["pid"]), pty=pty)
            self._live.add(h)
            box.append(h)

        try:
            self._link.conn.call(method, params, on_result=subscribe, timeout=rt(request_timeout))
        except SandboxException as e:
            # a start cut short because the sandbox was killed meanwhile is the sandbox going away
            if not isinstance(e, (NotFoundException, InvalidArgumentException)):
                g = sandbox_gone(self._link)
                if g is not None:
                    raise g from e
            raise
        return box[0]

    def connect(self, pid: int, timeout: Optional[float] = 60, request_timeout: Optional[float] = None) -> CommandHandle:
        """
        Follows a running command (started by this client or another): the
        handle first gets the recent output the daemon kept (its last 64 KiB),
        then the rest as it comes.  NotFoundException when no such command runs.
        ``timeout`` is accepted for E2B compatibility (the command's own
        timeout, set at its start, still applies).
        """
        box: List[CommandHandle] = []

        def subscribe(r: Any) -> None:
            h = CommandHandle(self._link, self, int(r["pid"]))
            self._live.add(h)
            h._replay(r.get("output"))
            box.append(h)

        self._link.conn.call("process.connect", self._link.params(pid=pid, encoding="utf8"),
                             on_result=subscribe, timeout=rt(request_timeout))
        return box[0]

    def list(self, request_timeout: Optional[float] = None) -> List[ProcessInfo]:
        """The running commands and terminals started through the API."""
        r = self._link.conn.call("process.list", self._link.params(), timeout=rt(request_timeout))
        return [to_process(p) for p in r.get("processes") or []]

    def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        """Kills a command and its whole tree (SIGKILL); False when there is no such process."""
        try:
            self._link.conn.call("process.signal", self._link.params(pid=pid, signal="KILL"), timeout=rt(request_timeout))
            return True
        except NotFoundException:
            return False

    def send_stdin(self, pid: int, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
        """Writes to a command's stdin, in 1 MiB pieces; a full stdin queue (EAGAIN) is waited out."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidArgumentException("send_stdin: data must be str or bytes")
        off = 0
        while True:
            piece = bytes(data[off:off + CHUNK])
            delay = 0.005
            while True:
                try:
                    self._link.conn.call("process.stdin", self._link.params(pid=pid, data=b64(piece), encoding="base64"),
                                         timeout=rt(request_timeout))
                    break
                except SandboxException as e:
                    if e.errno_code != "EAGAIN":
                        raise
                    time.sleep(delay)
                    delay = min(delay * 2, 0.2)
            off += len(piece)
            if off >= len(data):
                break

    def close_stdin(self, pid: int, request_timeout: Optional[float] = None) -> None:
        """Closes a command's stdin once what was written is delivered."""
        self._link.conn.call("process.close_stdin", self._link.params(pid=pid), timeout=rt(request_timeout))

    def _forget(self, h: CommandHandle) -> None:
        self._live.discard(h)

    def _sandbox_gone(self, why: str) -> None:
        for h in list(self._live):
            h._sandbox_gone(why)

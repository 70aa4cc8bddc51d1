"""sbx.commands of an AsyncSandbox: processes in a sandbox (``/bin/sh -c cmd``), as E2B's async Commands."""
import asyncio
from typing import Any, Dict, List, Optional, Set, Union

from .._link import Link, rt
from .._wire import CHUNK, b64, seconds, start_params, to_process
from ..exceptions import InvalidArgumentException, NotFoundException, SandboxException
from ..models import ProcessInfo, Stderr, Stdout, Username
from .command_handle import AsyncCommandHandle, OutputHandler, sandbox_gone


class Commands:
    """Runs commands in the sandbox (asyncio)."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._live: Set[AsyncCommandHandle] = set()

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
        if not isinstance(cmd, str) or cmd == "":
            raise InvalidArgumentException("commands.run: cmd must be a non-empty string")
        params = self._link.params(cmd=cmd, encoding="utf8")
        if stdin:
            params["stdin"] = True
        handle = await self._start("process.start", params, cwd, envs, user, timeout, request_timeout,
                                   dict(on_stdout=on_stdout, on_stderr=on_stderr))
        if background:
            return handle
        return await handle.wait()

    async def _start(self, method: str, params: Dict[str, Any], cwd: Optional[str], envs: Optional[Dict[str, str]],
                     user: Optional[str], timeout: Optional[float], request_timeout: Optional[float],
                     handlers: Dict[str, Any], pty: bool = False) -> AsyncCommandHandle:
        t = seconds(timeout, method)
        params.update(start_params(self._link.acct, cwd, envs, user, t))
        box: List[AsyncCommandHandle] = []

        def subscribe(r: Any) -> None:
            # before the next line is read: output may follow the reply at once
            h = AsyncCommandHandle(self._link, self, int(r["pid"]), pty=pty, **handlers)
            self._live.add(h)
            box.append(h)

        try:
            await self._link.conn.call(method, params, on_result=subscribe, timeout=rt(request_timeout))
        except SandboxException as e:
            if not isinstance(e, (NotFoundException, InvalidArgumentException)):
                g = await sandbox_gone(self._link)
                if g is not None:
                    raise g from e
            raise
        return box[0]

    async def connect(self, pid: int, timeout: Optional[float] = 60, request_timeout: Optional[float] = None,
                      on_stdout: Optional[OutputHandler[Stdout]] = None,
                      on_stderr: Optional[OutputHandler[Stderr]] = None) -> AsyncCommandHandle:
        """Follows a running command: the recent output the daemon kept (64 KiB) first, then the rest."""
        box: List[AsyncCommandHandle] = []

        def subscribe(r: Any) -> None:
            h = AsyncCommandHandle(self._link, self, int(r["pid"]), on_stdout=on_stdout, on_stderr=on_stderr)
            self._live.add(h)
            h._replay(r.get("output"))
            box.append(h)

        await self._link.conn.call("process.connect", self._link.params(pid=pid, encoding="utf8"),
                                   on_result=subscribe, timeout=rt(request_timeout))
        return box[0]

    async def list(self, request_timeout: Optional[float] = None) -> List[ProcessInfo]:
        """The running commands and terminals started through the API."""
        r = await self._link.conn.call("process.list", self._link.params(), timeout=rt(request_timeout))
        return [to_process(p) for p in r.get("processes") or []]

    async def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        """Kills a command and its whole tree (SIGKILL); False when there is no such process."""
        try:
            await self._link.conn.call("process.signal", self._link.params(pid=pid, signal="KILL"), timeout=rt(request_timeout))
            return True
        except NotFoundException:
            return False

    async def send_stdin(self, pid: int, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
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
                    await self._link.conn.call("process.stdin", self._link.params(pid=pid, data=b64(piece), encoding="base64"),
                                               timeout=rt(request_timeout))
                    break
                except SandboxException as e:
                    if e.errno_code != "EAGAIN":
                        raise
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.2)
            off += len(piece)
            if off >= len(data):
                break

    async def close_stdin(self, pid: int, request_timeout: Optional[float] = None) -> None:
        """Closes a command's stdin once what was written is delivered."""
        await self._link.conn.call("process.close_stdin", self._link.params(pid=pid), timeout=rt(request_timeout))

    def _forget(self, h: AsyncCommandHandle) -> None:
        self._live.discard(h)

    def _sandbox_gone(self, why: str) -> None:
        for h in list(self._live):
            h._sandbox_gone(why)

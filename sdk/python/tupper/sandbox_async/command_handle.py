"""AsyncCommandHandle: one process of a sandbox as an asyncio client follows it."""
import asyncio
import inspect
from typing import Any, Awaitable, Callable, Dict, Optional, TypeVar, Union

from .._link import Link, gone
from .._wire import OutputDecoder, decode_data, exit_status, output_stream, result_of
from ..exceptions import CommandExitException, CommandResult, NotFoundException, SandboxException, TimeoutException
from ..models import PtyOutput, Stderr, Stdout

T = TypeVar("T")
#: A callback: a plain function or a coroutine function.
OutputHandler = Callable[[T], Union[None, Awaitable[None]]]


async def call_handler(fn: Optional[Callable[[Any], Any]], value: Any) -> None:
    """Calls fn with value, awaiting it when it returns an awaitable."""
    if fn is None:
        return
    r = fn(value)
    if inspect.isawaitable(r):
        await r


async def sandbox_gone(link: Link) -> Optional[TimeoutException]:
    """A TimeoutException when the sandbox is gone, else None (it still runs)."""
    if link.killed:
        return gone(link.sandbox_id, "killed")
    try:
        r = await link.conn.call("sandbox.get", {"id": link.sandbox_id})
        if r.get("state") in ("running", "paused"):
            return None
        return gone(link.sandbox_id, f"state {r.get('state')}")
    except NotFoundException:
        return gone(link.sandbox_id, "not found")
    except SandboxException as e:
        return gone(link.sandbox_id, str(e))


class AsyncCommandHandle:
    """
    A command started with ``background=True`` (and behind every run), or a
    terminal: its pid, its output so far, and the means to wait for it, feed
    it and kill it.  Its callbacks run on one task of its own, in order.
    """

    def __init__(self, link: Link, commands: Any, pid: int, on_stdout: Optional[OutputHandler[Stdout]] = None,
                 on_stderr: Optional[OutputHandler[Stderr]] = None, on_pty: Optional[OutputHandler[PtyOutput]] = None,
                 pty: bool = False) -> None:
        self._link = link
        self._commands = commands
        self._pid = pid
        self._pty = pty
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._on_pty = on_pty
        self._q: "asyncio.Queue[Any]" = asyncio.Queue()
        self._dec = OutputDecoder()
        self._stdout = ""
        self._stderr = ""
        self._result: Optional[CommandResult] = None
        self._failure: Optional[BaseException] = None
        self._ended = False
        self._killed_by_us = False
        self._key = ("p", link.sandbox_id, pid)
        link.conn.subscribe(self._key, self._on_notification)
        self._cancel_close = link.conn.on_close(lambda e: self._q.put_nowait(("closed", e)))
        self._task = asyncio.get_running_loop().create_task(self._pump())

    @property
    def pid(self) -> int:
        """The command's process id inside the sandbox."""
        return self._pid

    @property
    def stdout(self) -> str:
        """Everything it wrote to stdout so far."""
        return self._stdout

    @property
    def stderr(self) -> str:
        """Everything it wrote to stderr so far."""
        return self._stderr

    @property
    def exit_code(self) -> Optional[int]:
        """Its exit code once it ended; None while it runs."""
        return self._result.exit_code if self._result else None

    @property
    def error(self) -> Optional[str]:
        """Why it failed, once it ended and if it did."""
        return self._result.error if self._result else None

    # -- the reader task's side
    def _on_notification(self, method: str, p: Dict[str, Any]) -> None:
        if method == "process.output":
            data = decode_data(p.get("data"), p.get("encoding"))
            if self._pty:
                self._q.put_nowait(("pty", data))
                return
            stream = output_stream(p)
            self._push(stream, self._dec.feed(stream, data))
        elif method == "process.exit":
            self._push("stdout", self._dec.flush("stdout"))
            self._push("stderr", self._dec.flush("stderr"))
            self._ended = True
            self._link.conn.unsubscribe(self._key)
            self._q.put_nowait(("exit", p))

    def _push(self, stream: str, text: str) -> None:
        if not text:
            return
        if stream == "stdout":
            self._stdout += text
        else:
            self._stderr += text
        self._q.put_nowait((stream, text))

    def _replay(self, chunks: Any) -> None:
        for c in chunks if isinstance(chunks, list) else []:
            if isinstance(c, dict):
                self._on_notification("process.output", c)

    def _sandbox_gone(self, why: str) -> None:
        self._q.put_nowait(("gone", why))

    # -- its own task
    async def _pump(self) -> None:
        try:
            while True:
                kind, value = await self._q.get()
                if kind == "stdout":
                    await call_handler(self._on_stdout, value)
                elif kind == "stderr":
                    await call_handler(self._on_stderr, value)
                elif kind == "pty":
                    await call_handler(self._on_pty, value)
                elif kind == "exit":
                    await self._judge_exit(value)
                    return
                elif kind == "gone":
                    self._failure = gone(self._link.sandbox_id, value)
                    return
                elif kind == "closed":
                    if self._ended:
                        continue
                    self._failure = gone(self._link.sandbox_id, "killed") if self._link.killed else SandboxException(f"command {self._pid}: {value}")
                    return
                elif kind == "disconnected":
                    self._failure = SandboxException(f"command {self._pid}: disconnected; it keeps running in the sandbox")
                    return
        except Exception as e:  # noqa: BLE001 - a callback's failure is the wait's
            self._failure = e
        finally:
            self._link.conn.unsubscribe(self._key)
            self._cancel_close()
            self._commands._forget(self)

    async def _judge_exit(self, p: Dict[str, Any]) -> None:
        result = result_of(self._stdout, self._stderr, p)
        _code, sig, _err = exit_status(p)
        self._result = result
        exc = CommandExitException(stderr=result.stderr, stdout=result.stdout, exit_code=result.exit_code, error=result.error)
        if p.get("timed_out") is True:
            self._failure = TimeoutException(
                f"command {self._pid} was killed: it ran past its timeout. "
                "The 'timeout' option can be used to increase this timeout (0: none)"
            )
        elif sig == 9 and not self._killed_by_us:
            self._failure = await sandbox_gone(self._link) or exc
        elif result.exit_code != 0 or sig:
            self._failure = exc

    async def wait(self) -> CommandResult:
        """
        Waits for the end: the result on exit code 0; CommandExitException on
        another code or a signal; TimeoutException when its ``timeout`` killed
        it or its sandbox went away.
        """
        await asyncio.shield(self._task)
        if self._failure is not None:
            raise self._failure
        assert self._result is not None
        return self._result

    async def kill(self) -> bool:
        """Kills the command and its whole tree (SIGKILL); False when it no longer ran."""
        if self._ended or self._task.done():
            return False
        self._killed_by_us = True
        return await self._commands.kill(self._pid)

    async def send_stdin(self, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
        """Writes to its stdin (started with ``stdin=True``)."""
        await self._commands.send_stdin(self._pid, data, request_timeout=request_timeout)

    async def close_stdin(self, request_timeout: Optional[float] = None) -> None:
        """Closes its stdin once what was written is delivered."""
        await self._commands.close_stdin(self._pid, request_timeout=request_timeout)

    async def disconnect(self) -> None:
        """Stops following it; it keeps running (``commands.connect(pid)`` follows it again)."""
        self._link.conn.unsubscribe(self._key)
        self._q.put_nowait(("disconnected", None))
        await asyncio.wait([self._task])

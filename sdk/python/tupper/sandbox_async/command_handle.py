"""AsyncCommandHandle: one process of a sandbox as an asyncio client follows it (the protocol is ``_commands.HandleCore``)."""
import asyncio
import inspect
from typing import Any, Awaitable, Callable, Optional, TypeVar, Union

from .._commands import HandleCore
from .._commands import sandbox_gone as _sandbox_gone_op
from .._drive import arun, arun_iter
from .._link import Link
from ..exceptions import CommandResult, SandboxException, TimeoutException
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
    return await arun(_sandbox_gone_op(link))


class AsyncCommandHandle(HandleCore):
    """
    A command started with ``background=True`` (and behind every run), or a
    terminal: its pid, its output so far, and the means to wait for it, feed
    it and kill it.  Its callbacks run on one task of its own, in order.
    """

    def __init__(self, link: Link, commands: Any, pid: int, on_stdout: Optional[OutputHandler[Stdout]] = None,
                 on_stderr: Optional[OutputHandler[Stderr]] = None, on_pty: Optional[OutputHandler[PtyOutput]] = None,
                 pty: bool = False) -> None:
        super().__init__(link, commands, pid, pty)
        self._on_stdout = on_stdout
        self._on_stderr = on_stderr
        self._on_pty = on_pty
        self._q: "asyncio.Queue[Any]" = asyncio.Queue()
        self._follow()
        self._task = asyncio.get_running_loop().create_task(self._pump())

    # -- its own task
    async def _pump(self) -> None:
        handlers = {"stdout": self._on_stdout, "stderr": self._on_stderr, "pty": self._on_pty}
        try:
            # a chunk of a stream gets its credit once its callback returned (or its coroutine ended)
            async for kind, value in arun_iter(self._events()):
                await call_handler(handlers[kind], value)
        except Exception as e:  # noqa: BLE001 - a callback's failure is the wait's
            self._finish(e)
        finally:
            if not self._done:  # cancelled: its loop is going away
                self._finish(SandboxException(f"command {self._pid}: no longer followed"))

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
        if self._ended or self._done:
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
        self._let_go()
        self._q.put_nowait(("disconnected", None))
        await asyncio.wait([self._task])

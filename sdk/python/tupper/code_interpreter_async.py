"""AsyncSandbox of tupper.code_interpreter: the same code interpreter with asyncio (E2B's AsyncSandbox)."""
import asyncio
import inspect
from typing import Any, Callable, Dict, List, Optional

from ._code_interpreter import DriverCore, InterpreterOps, create_args
from ._connection import AsyncConnection
from ._drive import arun
from ._opts import connection_opts
from .code_interpreter_models import (
    DEFAULT_RUN_CODE_TIMEOUT,
    READY_TIMEOUT,
    Context,
    Execution,
    ExecutionError,
    LineSplitter,
    OutputMessage,
    Result,
    is_terminal,
)
from .exceptions import SandboxException, TimeoutException
from .sandbox_async.command_handle import sandbox_gone
from .sandbox_async.main import AsyncSandbox as BaseAsyncSandbox


class _AsyncDriver(DriverCore):
    """The SDK's side of the driver, for an AsyncSandbox: events arrive on the connection's reading task."""

    def __init__(self, sbx: BaseAsyncSandbox) -> None:
        super().__init__(sbx)
        self._ready: Optional["asyncio.Future[None]"] = None
        self._write_lock: Optional[asyncio.Lock] = None

    async def request(self, op: str, params: Dict[str, Any], on_event: Callable[[Dict[str, Any]], Any],
                      bound: Optional[float]) -> Dict[str, Any]:
        await self._start()
        rid = self._next
        self._next += 1
        q: "asyncio.Queue[Dict[str, Any]]" = asyncio.Queue()
        self._queues[rid] = q
        line = self._line(rid, op, params)
        if self._write_lock is None:
            self._write_lock = asyncio.Lock()
        try:
            async with self._write_lock:  # one line at a time
                await self._commands.send_stdin(self._pid, line)

            async def events() -> Dict[str, Any]:
                while True:
                    e = await q.get()
                    if e.get("type") == "_gone":
                        raise e["error"]
                    if is_terminal(e):
                        return e
                    r = on_event(e)
                    if inspect.isawaitable(r):
                        await r

            try:
                return await asyncio.wait_for(events(), bound)
            except asyncio.TimeoutError:
                await self.stop()
                raise TimeoutException(f"{op}: no answer {bound} s after the start; the interpreter was stopped") from None
        finally:
            self._queues.pop(rid, None)

    async def stop(self) -> None:
        pid = self._pid
        if pid is None:
            return
        self._gone(SandboxException("the code interpreter was stopped"))
        await self._commands.kill(pid)

    async def _start(self) -> None:
        if self._pid is not None and self._ready is None:
            return
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            ready = self._ready
            try:
                await self._spawn()
            except BaseException as e:
                if not ready.done():
                    ready.set_exception(e)
                self._ready = None
                raise
        ready = self._ready
        if ready is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(ready), READY_TIMEOUT)
        except asyncio.TimeoutError:
            await self.stop()
            raise TimeoutException(f"the code interpreter did not start in {READY_TIMEOUT:.0f} s") from None

    async def _spawn(self) -> None:
        link = self._link

        def subscribe(r: Any) -> None:
            self._pid = int(r["pid"])
            link.conn.subscribe(self._key(), self._on_notification)
            self._cancel_close = link.conn.on_close(lambda e: self._gone(SandboxException(f"code interpreter: {e}")))

        try:
            await link.conn.call("process.start", self._spawn_params(), on_result=subscribe)
        except SandboxException as e:
            g = await sandbox_gone(link)
            if g is not None:
                raise g from e
            raise

    def _gone(self, err: BaseException) -> None:
        if self._pid is not None:
            self._link.conn.unsubscribe(self._key())
        self._pid = None
        self._cancel_close()
        self._cancel_close = lambda: None
        self._lines = LineSplitter()
        ready, self._ready = self._ready, None
        if ready is not None and not ready.done():
            ready.set_exception(err)
            ready.exception()  # retrieved: nobody may be waiting on it
        queues = list(self._queues.values())
        self._queues.clear()
        for q in queues:
            q.put_nowait({"type": "_gone", "error": err})

    def _on_notification(self, method: str, p: Dict[str, Any]) -> None:
        if method == "process.output":
            try:
                events = self._output(p)
            except SandboxException as e:
                pid = self._pid
                self._gone(e)
                if pid is not None:
                    asyncio.ensure_future(self._commands.kill(pid))
                return
            for e in events:
                self._on_event(e)
        elif method == "process.exit":
            was_ready = self._ready is None

            async def judge() -> None:
                self._gone(self._verdict(await sandbox_gone(self._link), p, was_ready))

            asyncio.ensure_future(judge())

    def _on_event(self, e: Dict[str, Any]) -> None:
        if self._is_ready(e):
            ready, self._ready = self._ready, None
            if ready is not None and not ready.done():
                ready.set_result(None)
            return
        q = self._route(e)
        if q is not None:
            q.put_nowait(e)


class AsyncSandbox(BaseAsyncSandbox):
    """E2B's code interpreter AsyncSandbox: ``await AsyncSandbox.create()`` from the ``code-interpreter`` recipe."""

    default_template = "code-interpreter"

    def __init__(self, conn: AsyncConnection, info: Dict[str, Any]) -> None:
        super().__init__(conn, info)
        self._driver = _AsyncDriver(self)
        self._ci = InterpreterOps(self._driver, self._link.acct)

    @classmethod
    async def create(cls, template: Optional[str] = None, timeout: Optional[int] = None,  # type: ignore[override]
                     **kw: Any) -> "AsyncSandbox":
        """Creates a code interpreter sandbox; the arguments are those of ``Sandbox.create``."""
        conn_opts, params, limit = create_args(template, timeout, kw, "AsyncSandbox.create")
        conn = await AsyncConnection.open(**connection_opts(conn_opts, "AsyncSandbox.create"))
        try:
            return cls(conn, await conn.call("sandbox.create", params, timeout=limit))
        except BaseException:
            await conn.close()
            raise

    async def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        context: Optional[Context] = None,
        on_stdout: Optional[Callable[[OutputMessage], Any]] = None,
        on_stderr: Optional[Callable[[OutputMessage], Any]] = None,
        on_result: Optional[Callable[[Result], Any]] = None,
        on_error: Optional[Callable[[ExecutionError], Any]] = None,
        envs: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = DEFAULT_RUN_CODE_TIMEOUT,
        request_timeout: Optional[float] = None,
    ) -> Execution:
        """Runs a cell (see Sandbox.run_code); the callbacks may be coroutine functions."""
        return await arun(self._ci.run_code(code, language, context, on_stdout, on_stderr, on_result, on_error, envs, timeout))

    async def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None,
                                  request_timeout: Optional[float] = None) -> Context:
        return await arun(self._ci.create_code_context(cwd, language))

    async def list_code_contexts(self, request_timeout: Optional[float] = None) -> List[Context]:
        return await arun(self._ci.list_code_contexts())

    async def restart_code_context(self, context: Any, request_timeout: Optional[float] = None) -> None:
        await arun(self._ci.restart_code_context(context))

    async def remove_code_context(self, context: Any, request_timeout: Optional[float] = None) -> None:
        await arun(self._ci.remove_code_context(context))

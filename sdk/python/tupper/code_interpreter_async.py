"""AsyncSandbox of tupper.code_interpreter: the same code interpreter with asyncio (E2B's AsyncSandbox)."""
import asyncio
import inspect
import json
from typing import Any, Callable, Dict, List, Optional

from ._connection import AsyncConnection
from ._opts import connection_opts
from ._wire import decode_data, exit_status, output_stream, start_params
from .code_interpreter import DRIVER_CMD, NO_DRIVER_EXIT, STDERR_KEEP, recipe_create_params
from .code_interpreter_models import (
    DEFAULT_RUN_CODE_TIMEOUT,
    INTERRUPT_SLACK,
    READY_TIMEOUT,
    Collector,
    Context,
    Execution,
    ExecutionError,
    LineSplitter,
    OutputMessage,
    Result,
    context_id,
    execute_params,
    exit_failure,
    failure,
    is_terminal,
    to_context,
)
from .exceptions import SandboxException, TimeoutException
from .sandbox_async.command_handle import sandbox_gone
from .sandbox_async.main import AsyncSandbox as BaseAsyncSandbox


class _AsyncDriver:
    """The SDK's side of the driver, for an AsyncSandbox: events arrive on the connection's reading task."""

    def __init__(self, sbx: BaseAsyncSandbox) -> None:
        self._link = sbx._link
        self._commands = sbx.commands
        self._pid: Optional[int] = None
        self._next = 1
        self._queues: Dict[int, "asyncio.Queue[Dict[str, Any]]"] = {}
        self._lines = LineSplitter()
        self._stderr = ""
        self._ready: Optional["asyncio.Future[None]"] = None
        self._write_lock: Optional[asyncio.Lock] = None
        self._cancel_close: Callable[[], None] = lambda: None

    async def request(self, op: str, params: Dict[str, Any], on_event: Callable[[Dict[str, Any]], Any],
                      bound: Optional[float]) -> Dict[str, Any]:
        await self._start()
        rid = self._next
        self._next += 1
        q: "asyncio.Queue[Dict[str, Any]]" = asyncio.Queue()
        self._queues[rid] = q
        line = (json.dumps({**params, "id": rid, "op": op}, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")
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
        params = link.params(cmd=DRIVER_CMD, encoding="base64", stdin=True)
        params.update(start_params(link.acct, None, None, None, None))

        def subscribe(r: Any) -> None:
            self._pid = int(r["pid"])
            link.conn.subscribe(("p", link.sandbox_id, self._pid), self._on_notification)
            self._cancel_close = link.conn.on_close(lambda e: self._gone(SandboxException(f"code interpreter: {e}")))

        try:
            await link.conn.call("process.start", params, on_result=subscribe)
        except SandboxException as e:
            g = await sandbox_gone(link)
            if g is not None:
                raise g from e
            raise

    def _gone(self, err: BaseException) -> None:
        if self._pid is not None:
            self._link.conn.unsubscribe(("p", self._link.sandbox_id, self._pid))
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
            data = decode_data(p.get("data"), p.get("encoding"))
            if output_stream(p) == "stderr":
                self._stderr = (self._stderr + data.decode("utf-8", "replace"))[-STDERR_KEEP:]
                return
            try:
                events = self._lines.feed(data)
            except SandboxException as e:
                pid = self._pid
                self._gone(e)
                if pid is not None:
                    asyncio.ensure_future(self._commands.kill(pid))
                return
            for e in events:
                self._on_event(e)
        elif method == "process.exit":
            code, _sig, error = exit_status(p)
            was_ready = self._ready is None

            async def judge() -> None:
                g = await sandbox_gone(self._link)
                if g is not None:
                    self._gone(g)
                elif not was_ready and code == NO_DRIVER_EXIT:
                    self._gone(exit_failure("No such file", False, error))
                else:
                    self._gone(exit_failure(self._stderr, was_ready, error))

            asyncio.ensure_future(judge())

    def _on_event(self, e: Dict[str, Any]) -> None:
        if e.get("type") == "ready" and e.get("id") == 0:
            ready, self._ready = self._ready, None
            if ready is not None and not ready.done():
                ready.set_result(None)
            return
        rid = e.get("id")
        q = self._queues.get(rid) if isinstance(rid, int) else None
        if q is not None:
            q.put_nowait(e)


class AsyncSandbox(BaseAsyncSandbox):
    """E2B's code interpreter AsyncSandbox: ``await AsyncSandbox.create()`` from the ``code-interpreter`` recipe."""

    default_template = "code-interpreter"

    def __init__(self, conn: AsyncConnection, info: Dict[str, Any]) -> None:
        super().__init__(conn, info)
        self._driver = _AsyncDriver(self)

    @classmethod
    async def create(cls, template: Optional[str] = None, timeout: Optional[int] = None,  # type: ignore[override]
                     **kw: Any) -> "AsyncSandbox":
        """Creates a code interpreter sandbox; the arguments are those of ``Sandbox.create``."""
        conn_opts = {k: kw.pop(k) for k in list(kw) if k in ("socket", "request_timeout") or k in (
            "api_key", "access_token", "domain", "debug", "headers", "proxy", "logger")}
        params = recipe_create_params(template, timeout, kw)
        if kw:
            raise SandboxException(f"AsyncSandbox.create: unknown option {next(iter(kw))!r}")
        conn = await AsyncConnection.open(**connection_opts(conn_opts, "AsyncSandbox.create"))
        try:
            r = await conn.call("sandbox.create", params, timeout=None if "recipe" in params else "default")
            return cls(conn, r)
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
        params = execute_params(code, language, context, envs, timeout)
        c = Collector(on_stdout, on_stderr, on_result, on_error)
        bound = timeout + INTERRUPT_SLACK if timeout else None
        end = await self._driver.request("execute", params, c.event, bound)
        return c.finish(end, timeout)

    async def _context_op(self, op: str, params: Dict[str, Any], what: str) -> Any:
        end = await self._driver.request(op, params, lambda e: None, None)
        if end.get("type") == "fail":
            raise failure(end, what)
        return end.get("value")

    async def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None,
                                  request_timeout: Optional[float] = None) -> Context:
        params: Dict[str, Any] = {"cwd": cwd if cwd is not None else (self._link.acct.workdir or self._link.acct.home)}
        if language is not None:
            params["language"] = language
        return to_context(await self._context_op("create_context", params, "create_code_context"))

    async def list_code_contexts(self, request_timeout: Optional[float] = None) -> List[Context]:
        v = await self._context_op("list_contexts", {}, "list_code_contexts")
        return [to_context(x) for x in v] if isinstance(v, list) else []

    async def restart_code_context(self, context: Any, request_timeout: Optional[float] = None) -> None:
        await self._context_op("restart_context", {"context": context_id(context, "restart_code_context")},
                               "restart_code_context")

    async def remove_code_context(self, context: Any, request_timeout: Optional[float] = None) -> None:
        await self._context_op("remove_context", {"context": context_id(context, "remove_code_context")},
                               "remove_code_context")

"""
tupper.code_interpreter: E2B's code interpreter over tupper, so that code
written against ``e2b_code_interpreter`` moves by changing the import::

    from tupper.code_interpreter import Sandbox

    with Sandbox.create() as sbx:
        print(sbx.run_code("x = 6 * 7\\nx").text)   # '42'

Its Sandbox is tupper's Sandbox made from the shipped ``code-interpreter``
recipe (Debian's python3 with Jupyter's ipykernel, numpy, pandas and
matplotlib), with ``run_code`` and code contexts on top.  Each context is a
Jupyter kernel in the sandbox, run by the recipe's driver: one background
process per Sandbox object, started on first use, spoken to in JSON lines
over its stdin and stdout (docs/code-interpreter.md).  ``AsyncSandbox`` is
the asyncio form.
"""
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from ._code_interpreter import DriverCore, InterpreterOps, create_args
from ._connection import Connection
from ._drive import run
from ._opts import connection_opts
from .code_interpreter_models import (
    CODE_INTERPRETER_RECIPE,
    CODE_MAX_BYTES,
    DEFAULT_RUN_CODE_TIMEOUT,
    DRIVER_PATH,
    READY_TIMEOUT,
    Context,
    Execution,
    ExecutionError,
    LineSplitter,
    Logs,
    OutputMessage,
    Result,
    is_terminal,
)
from .exceptions import SandboxException, TimeoutException
from .sandbox_sync.command_handle import sandbox_gone
from .sandbox_sync.main import Sandbox as BaseSandbox

__all__ = [
    "Sandbox", "AsyncSandbox", "Execution", "ExecutionError", "Result", "Logs", "OutputMessage", "Context",
    "CODE_INTERPRETER_RECIPE", "CODE_MAX_BYTES", "DEFAULT_RUN_CODE_TIMEOUT", "DRIVER_PATH",
]


class _Driver(DriverCore):
    """The SDK's side of the driver, for a blocking Sandbox: events arrive on the connection's reading thread."""

    def __init__(self, sbx: BaseSandbox) -> None:
        super().__init__(sbx)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._ready: Optional[threading.Event] = None
        self._failure: Optional[BaseException] = None

    def request(self, op: str, params: Dict[str, Any], on_event: Callable[[Dict[str, Any]], None],
                bound: Optional[float]) -> Dict[str, Any]:
        """Sends one request and waits for its terminal event, calling on_event for each one before it."""
        self._start()
        with self._lock:
            rid = self._next
            self._next += 1
            q: "queue.Queue[Dict[str, Any]]" = queue.Queue()
            self._queues[rid] = q
            pid = self._pid
        line = self._line(rid, op, params)
        try:
            with self._write_lock:  # one line at a time: pieces of two lines must not interleave
                self._commands.send_stdin(pid, line)
            deadline = None if bound is None else time.monotonic() + bound
            while True:
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    self.stop()
                    raise TimeoutException(f"{op}: no answer {bound} s after the start; the interpreter was stopped")
                try:
                    e = q.get(timeout=wait)
                except queue.Empty:
                    continue
                if e.get("type") == "_gone":
                    raise e["error"]
                if is_terminal(e):
                    return e
                on_event(e)
        finally:
            with self._lock:
                self._queues.pop(rid, None)

    def stop(self) -> None:
        """Stops the driver (its kernels with it); the next request starts a new one."""
        pid = self._pid
        if pid is None:
            return
        self._gone(SandboxException("the code interpreter was stopped"))
        self._commands.kill(pid)

    def _start(self) -> None:
        with self._lock:
            if self._pid is not None and self._ready is None:
                return
            if self._ready is not None:
                ready = self._ready
                starter = False
            else:
                ready = self._ready = threading.Event()
                self._failure = None
                starter = True
        if starter:
            try:
                self._spawn()
            except BaseException as e:
                self._failure = e
                ready.set()
                raise
        if not ready.wait(READY_TIMEOUT):
            self.stop()
            raise TimeoutException(f"the code interpreter did not start in {READY_TIMEOUT:.0f} s")
        if self._failure is not None:
            raise self._failure

    def _spawn(self) -> None:
        link = self._link

        def subscribe(r: Any) -> None:
            # before the next line is read: output may follow the reply at once
            with self._lock:
                self._pid = int(r["pid"])
            link.conn.subscribe(self._key(), self._on_notification)
            self._cancel_close = link.conn.on_close(lambda e: self._gone(SandboxException(f"code interpreter: {e}")))

        try:
            link.conn.call("process.start", self._spawn_params(), on_result=subscribe)
        except SandboxException as e:
            g = sandbox_gone(link)
            if g is not None:
                raise g from e
            raise

    def _gone(self, err: BaseException) -> None:
        with self._lock:
            if self._pid is not None:
                self._link.conn.unsubscribe(self._key())
            self._pid = None
            self._cancel_close()
            self._cancel_close = lambda: None
            self._lines = LineSplitter()
            ready, self._ready = self._ready, None
            queues = list(self._queues.values())
            self._queues.clear()
        if ready is not None:
            self._failure = err
            ready.set()
        for q in queues:
            q.put({"type": "_gone", "error": err})

    def _on_notification(self, method: str, p: Dict[str, Any]) -> None:
        if method == "process.output":
            try:
                events = self._output(p)
            except SandboxException as e:
                pid = self._pid
                self._gone(e)
                if pid is not None:
                    threading.Thread(target=lambda: self._commands.kill(pid), daemon=True).start()
                return
            for e in events:
                self._on_event(e)
        elif method == "process.exit":
            was_ready = self._ready is None
            # the sandbox's state is asked on another thread: this one reads the connection
            threading.Thread(target=lambda: self._gone(self._verdict(sandbox_gone(self._link), p, was_ready)),
                             daemon=True).start()

    def _on_event(self, e: Dict[str, Any]) -> None:
        if self._is_ready(e):
            with self._lock:
                ready, self._ready = self._ready, None
            if ready is not None:
                ready.set()
            return
        with self._lock:
            q = self._route(e)
        if q is not None:
            q.put(e)


class Sandbox(BaseSandbox):
    """
    E2B's code interpreter Sandbox: ``Sandbox.create()`` makes a sandbox from
    the shipped ``code-interpreter`` recipe (``template`` names an image
    instead); everything of tupper's Sandbox is there too.
    """

    default_template = CODE_INTERPRETER_RECIPE

    def __init__(self, conn: Connection, info: Dict[str, Any]) -> None:
        super().__init__(conn, info)
        self._driver = _Driver(self)
        self._ci = InterpreterOps(self._driver, self._link.acct)

    @classmethod
    def create(cls, template: Optional[str] = None, timeout: Optional[int] = None, **kw: Any) -> "Sandbox":  # type: ignore[override]
        """
        Creates a code interpreter sandbox from the ``code-interpreter``
        recipe (its first use builds the image: minutes, then cached).  The
        other arguments are tupper's Sandbox.create's.
        """
        conn_opts, params, limit = create_args(template, timeout, kw, "Sandbox.create")
        conn = Connection.open(**connection_opts(conn_opts, "Sandbox.create"))
        try:
            return cls(conn, conn.call("sandbox.create", params, timeout=limit))
        except BaseException:
            conn.close()
            raise

    def run_code(
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
        """
        Runs a cell and returns its Execution: results, logs and error.  A
        cell that raised returns with ``error`` set; one that runs past
        ``timeout`` seconds is interrupted and raises TimeoutException, its
        context keeping its variables.  The callbacks run on this thread as
        the output comes.

        :param language: only ``"python"`` for now; not together with ``context``
        :param context: the context (kernel) to run in; default: the default python context
        :param envs: environment variables the cell sees (set for it, then put back)
        :param timeout: seconds (default 60; 0 or None: no bound)
        :param request_timeout: accepted for E2B compatibility
        """
        return run(self._ci.run_code(code, language, context, on_stdout, on_stderr, on_result, on_error, envs, timeout))

    def create_code_context(self, cwd: Optional[str] = None, language: Optional[str] = None,
                            request_timeout: Optional[float] = None) -> Context:
        """A new context: its own kernel, its own variables (cwd default: the sandbox's working directory)."""
        return run(self._ci.create_code_context(cwd, language))

    def list_code_contexts(self, request_timeout: Optional[float] = None) -> List[Context]:
        """The contexts there are (the default python context once a cell ran in it)."""
        return run(self._ci.list_code_contexts())

    def restart_code_context(self, context: Any, request_timeout: Optional[float] = None) -> None:
        """Restarts a context's kernel: its variables are gone, the context stays."""
        run(self._ci.restart_code_context(context))

    def remove_code_context(self, context: Any, request_timeout: Optional[float] = None) -> None:
        """Removes a context and stops its kernel; later cells in it raise NotFoundException."""
        run(self._ci.remove_code_context(context))

    def __enter__(self) -> "Sandbox":
        return self


from .code_interpreter_async import AsyncSandbox  # noqa: E402  (it builds on the names above)

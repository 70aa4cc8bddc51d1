"""
The code interpreter's protocol, once for both forms (see ``_drive.py``):
what ``run_code`` and the context calls send to the recipe's driver and how
its answers become E2B's objects (:class:`InterpreterOps`), and the driver's
side that does no waiting (:class:`DriverCore`): the request line, the
start command, the output split into events, the verdict on its exit.
``code_interpreter.py`` waits with threads, ``code_interpreter_async.py``
with asyncio.
"""
import json
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._drive import Proto
from ._opts import IGNORED, create_params
from ._wire import decode_data, exit_status, output_stream, start_params
from .code_interpreter_models import (
    CODE_INTERPRETER_RECIPE,
    DRIVER_PATH,
    INTERRUPT_SLACK,
    Collector,
    Context,
    LineSplitter,
    context_id,
    execute_params,
    exit_failure,
    failure,
    to_context,
)
from .exceptions import SandboxException

#: The exit code of the start command when the sandbox has no driver (or no python3).
NO_DRIVER_EXIT = 78
#: How the driver is started (the TypeScript SDK's DRIVER_CMD).
DRIVER_CMD = (f"[ -f {DRIVER_PATH} ] && command -v python3 >/dev/null 2>&1 || exit {NO_DRIVER_EXIT}; "
              f"exec python3 {DRIVER_PATH}")
#: The driver's stderr kept for an error message.
STDERR_KEEP = 4096


def recipe_create_params(template: Optional[str], timeout: Optional[float], kw: Dict[str, Any]) -> Dict[str, Any]:
    """sandbox.create's params for the code interpreter: the shipped recipe unless a template names an image."""
    params = create_params(template, timeout, kw.pop("metadata", None), kw.pop("envs", None),
                           kw.pop("allow_internet_access", True), kw.pop("network", None), kw.pop("mcp", None),
                           kw.pop("backend", None), kw.pop("cwd", None), kw.pop("limits", None))
    kw.pop("secure", None)
    if template is None:
        params["recipe"] = {"name": CODE_INTERPRETER_RECIPE}
        if timeout is None:
            # the recipe's own lifetime, unless one is given (as the TypeScript SDK)
            params["limits"].pop("timeout", None)
            if not params["limits"]:
                params.pop("limits")
    return params


def create_args(template: Optional[str], timeout: Optional[float], kw: Dict[str, Any],
                what: str) -> Tuple[Dict[str, Any], Dict[str, Any], Any]:
    """(connection options, sandbox.create params, its request timeout) of a code interpreter's create."""
    conn_opts = {k: kw.pop(k) for k in list(kw) if k in ("socket", "request_timeout") or k in IGNORED}
    params = recipe_create_params(template, timeout, kw)
    if kw:
        raise SandboxException(f"{what}: unknown option {next(iter(kw))!r}")
    # a recipe's first create builds its image: minutes, not the usual request bound
    return conn_opts, params, None if "recipe" in params else "default"


def _no_event(_e: Dict[str, Any]) -> None:
    return None


class InterpreterOps:
    """run_code and the context calls, as generators over a driver's ``request``."""

    def __init__(self, driver: Any, acct: Any) -> None:
        self._driver = driver
        self._acct = acct

    def run_code(self, code: str, language: Optional[str], context: Optional[Context], on_stdout: Any, on_stderr: Any,
                 on_result: Any, on_error: Any, envs: Optional[Dict[str, str]], timeout: Optional[float]) -> Proto:
        params = execute_params(code, language, context, envs, timeout)
        c = Collector(on_stdout, on_stderr, on_result, on_error)
        bound = timeout + INTERRUPT_SLACK if timeout else None
        end = yield (self._driver.request, "execute", params, c.event, bound)
        return c.finish(end, timeout)

    def _op(self, op: str, params: Dict[str, Any], what: str) -> Proto:
        end = yield (self._driver.request, op, params, _no_event, None)
        if end.get("type") == "fail":
            raise failure(end, what)
        return end.get("value")

    def create_code_context(self, cwd: Optional[str], language: Optional[str]) -> Proto:
        params: Dict[str, Any] = {"cwd": cwd if cwd is not None else (self._acct.workdir or self._acct.home)}
        if language is not None:
            params["language"] = language
        return to_context((yield from self._op("create_context", params, "create_code_context")))

    def list_code_contexts(self) -> Proto:
        v = yield from self._op("list_contexts", {}, "list_code_contexts")
        return [to_context(x) for x in v] if isinstance(v, list) else []

    def restart_code_context(self, context: Any) -> Proto:
        yield from self._op("restart_context", {"context": context_id(context, "restart_code_context")},
                            "restart_code_context")

    def remove_code_context(self, context: Any) -> Proto:
        yield from self._op("remove_context", {"context": context_id(context, "remove_code_context")},
                            "remove_code_context")


class DriverCore:
    """The state of the SDK's side of the driver that both forms share, and what it decides without waiting."""

    def __init__(self, sbx: Any) -> None:
        self._link = sbx._link
        self._commands = sbx.commands
        self._pid: Optional[int] = None
        self._next = 1
        self._queues: Dict[int, Any] = {}
        self._lines = LineSplitter()
        self._stderr = ""
        self._cancel_close: Callable[[], None] = lambda: None

    @staticmethod
    def _line(rid: int, op: str, params: Dict[str, Any]) -> bytes:
        """One request to the driver as the line its stdin takes."""
        return (json.dumps({**params, "id": rid, "op": op}, ensure_ascii=False) + "\n").encode("utf-8", "surrogatepass")

    def _spawn_params(self) -> Dict[str, Any]:
        link = self._link
        params = link.params(cmd=DRIVER_CMD, encoding="base64", stdin=True)
        params.update(start_params(link.acct, None, None, None, None))
        return params

    def _key(self) -> Tuple[Any, ...]:
        return ("p", self._link.sandbox_id, self._pid)

    def _output(self, p: Dict[str, Any]) -> List[Dict[str, Any]]:
        """The driver's events in a process.output (stderr is kept for an error message); SandboxException for a bad line."""
        data = decode_data(p.get("data"), p.get("encoding"))
        if output_stream(p) == "stderr":
            self._stderr = (self._stderr + data.decode("utf-8", "replace"))[-STDERR_KEEP:]
            return []
        return self._lines.feed(data)

    def _verdict(self, gone: Optional[BaseException], p: Dict[str, Any], was_ready: bool) -> BaseException:
        """Why the driver exited (process.exit p): its sandbox gone, no driver in the image, or its own failure."""
        if gone is not None:
            return gone
        code, _sig, error = exit_status(p)
        if not was_ready and code == NO_DRIVER_EXIT:
            return exit_failure("No such file", False, error)
        return exit_failure(self._stderr, was_ready, error)

    def _route(self, e: Dict[str, Any]) -> Any:
        """The queue of the request an event answers (None for the ready event or an unknown id)."""
        rid = e.get("id")
        return self._queues.get(rid) if isinstance(rid, int) else None

    @staticmethod
    def _is_ready(e: Dict[str, Any]) -> bool:
        return e.get("type") == "ready" and e.get("id") == 0

"""
What a cell gives back, in E2B's code interpreter shapes (``e2b_code_interpreter.models``):
an :class:`Execution` with its results (one per execute_result or
display_data, each with the formats the kernel gave), its logs and its error.
"""
import json as _json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .exceptions import InvalidArgumentException, NotFoundException, SandboxException

#: Where the code-interpreter recipe puts the driver.
DRIVER_PATH = "/usr/local/lib/tupper/interp.py"
#: The shipped recipe a code interpreter sandbox is made from, unless told otherwise.
CODE_INTERPRETER_RECIPE = "code-interpreter"
#: Default bound of one cell in seconds, as the TypeScript SDK's 60 s (0 or None: none).
DEFAULT_RUN_CODE_TIMEOUT = 60.0
#: Most bytes of UTF-8 in one cell (the driver's own bound).
CODE_MAX_BYTES = 1 << 20
#: Most bytes of one line from the driver: its results cap (16 MiB) and JSON quoting.
EVENT_LINE_MAX = 40 << 20
#: How long the driver has to say it is ready (seconds).
READY_TIMEOUT = 60.0
#: How long past its timeout a cell may take to be interrupted (or its kernel restarted) and report.
INTERRUPT_SLACK = 150.0

_FORMATS = (
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
)
_TERMINAL = ("end", "timeout", "reply", "fail")


def _text(v: Any) -> str:
    if isinstance(v, list):  # Jupyter may split a text format into lines
        return "".join(str(x) for x in v)
    return v if isinstance(v, str) else _json.dumps(v)


class Result:
    """
    One result of a cell, as E2B's Result: ``text``, ``html``, ``markdown``,
    ``svg``, ``png`` and ``jpeg`` (base64), ``pdf`` (base64), ``latex``,
    ``json``, ``javascript`` as the kernel gave them, other MIME types in
    ``extra``.  ``is_main_result`` is True for the cell's value, False for
    what it displayed.  ``data`` and ``chart`` (E2B's extractions) stay None.
    """

    def __init__(self, raw: Dict[str, Any], is_main_result: bool) -> None:
        self.raw = raw
        self.is_main_result = is_main_result
        self.text: Optional[str] = None
        self.html: Optional[str] = None
        self.markdown: Optional[str] = None
        self.svg: Optional[str] = None
        self.png: Optional[str] = None
        self.jpeg: Optional[str] = None
        self.pdf: Optional[str] = None
        self.latex: Optional[str] = None
        self.json: Optional[Dict[str, Any]] = None
        self.javascript: Optional[str] = None
        self.data: Optional[Dict[str, Any]] = None
        self.chart: Optional[Dict[str, Any]] = None
        self.extra: Optional[Dict[str, Any]] = None
        known = set()
        for mime, name in _FORMATS:
            if mime not in raw:
                continue
            known.add(mime)
            v = raw[mime]
            if name == "json":
                self.json = v if isinstance(v, dict) else {"value": v}
            else:
                setattr(self, name, _text(v))
        for mime, v in raw.items():
            if mime not in known:
                self.extra = self.extra or {}
                self.extra[mime] = v

    def formats(self) -> List[str]:
        """The formats this result has, besides ``text``."""
        out = [name for _, name in _FORMATS if name != "text" and getattr(self, name) is not None]
        return out + list(self.extra or {})

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {name: getattr(self, name) for _, name in _FORMATS if getattr(self, name) is not None}
        if self.extra:
            out["extra"] = self.extra
        out["is_main_result"] = self.is_main_result
        return out

    def __repr__(self) -> str:
        return f"Result({self.text!r})" if self.text is not None else f"Result(formats: {self.formats()})"


@dataclass
class ExecutionError:
    """A cell's error: the exception's class name, its message, its traceback."""

    name: str
    value: str
    traceback: str

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "value": self.value, "traceback": self.traceback}


@dataclass
class OutputMessage:
    """A chunk of a cell's output as the callbacks get it."""

    line: str
    #: When it arrived, in nanoseconds since the epoch (as E2B's Python SDK).
    timestamp: int
    #: True for stderr.
    error: bool = False

    def __str__(self) -> str:
        return self.line


@dataclass
class Logs:
    """A cell's streams, chunk by chunk."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class Execution:
    """What one run_code gives back."""

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """The main result's text (the cell's value), if it had one."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    def to_json(self) -> str:
        return _json.dumps({
            "results": [r.to_json() for r in self.results],
            "logs": {"stdout": self.logs.stdout, "stderr": self.logs.stderr},
            "error": self.error.to_json() if self.error else None,
            "execution_count": self.execution_count,
        })


@dataclass
class Context:
    """A code context: its own kernel, so its own variables."""

    id: str
    language: str
    cwd: str


def failure(e: Dict[str, Any], what: str) -> SandboxException:
    """The exception a driver's ``fail`` event stands for."""
    msg = f"{what}: {e.get('message')}"
    if e.get("kind") == "invalid":
        return InvalidArgumentException(msg)
    if e.get("kind") == "not_found":
        return NotFoundException(msg)
    return SandboxException(msg)


def to_context(v: Any) -> Context:
    o = v if isinstance(v, dict) else {}
    return Context(id=str(o.get("id")), language=str(o.get("language")), cwd=str(o.get("cwd") or ""))


def context_id(context: Any, what: str) -> str:
    cid = context.id if isinstance(context, Context) else context
    if not isinstance(cid, str) or cid == "":
        raise InvalidArgumentException(f"{what}: context must be a Context or its id")
    return cid


def execute_params(code: Any, language: Optional[str], context: Any, envs: Optional[Dict[str, str]],
                   timeout: Optional[float]) -> Dict[str, Any]:
    """The execute request's params, checked before anything is sent."""
    if not isinstance(code, str):
        raise InvalidArgumentException("run_code: code must be a string")
    size = len(code.encode("utf-8", "surrogatepass"))
    if size > CODE_MAX_BYTES:
        raise InvalidArgumentException(f"run_code: the cell is {size} bytes; at most {CODE_MAX_BYTES} bytes")
    if context is not None and language is not None:
        raise InvalidArgumentException("run_code: give a context or a language, not both (a context has its language)")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise InvalidArgumentException(f"run_code: bad timeout {timeout!r}")
    params: Dict[str, Any] = {"code": code}
    if context is not None:
        params["context"] = context_id(context, "run_code")
    if language is not None:
        params["language"] = language
    if timeout:
        params["timeout"] = float(timeout)
    if envs is not None:
        params["envs"] = envs
    return params


class Collector:
    """Turns a cell's events into its Execution, calling the callbacks; the same for both forms."""

    def __init__(self, on_stdout: Any, on_stderr: Any, on_result: Any, on_error: Any) -> None:
        self.execution = Execution()
        self.cb = {"stdout": on_stdout, "stderr": on_stderr, "result": on_result, "error": on_error}

    def event(self, e: Dict[str, Any]) -> Any:
        """Records e; returns what its callback returned (a coroutine for async callbacks), or None."""
        t = e.get("type")
        ex = self.execution
        if t in ("stdout", "stderr"):
            text = str(e.get("text") or "")
            getattr(ex.logs, t).append(text)
            arg: Any = OutputMessage(text, time.time_ns(), t == "stderr")
        elif t == "result":
            arg = Result(e.get("data") or {}, e.get("main") is True)
            ex.results.append(arg)
        elif t == "error":
            arg = ExecutionError(str(e.get("name") or ""), str(e.get("value") or ""), str(e.get("traceback") or ""))
            ex.error = arg
        else:
            return None
        fn = self.cb.get(t)
        return fn(arg) if fn is not None else None

    def finish(self, end: Dict[str, Any], timeout: Optional[float]) -> Execution:
        from .exceptions import TimeoutException

        if end.get("type") == "fail":
            raise failure(end, "run_code")
        if end.get("type") == "timeout":
            if end.get("waited"):
                raise TimeoutException(f"run_code: the cell waited past its timeout ({timeout} s) for the context's "
                                       "previous cell to end; it did not run")
            if end.get("restarted"):
                raise TimeoutException(f"run_code: the cell ran past its timeout ({timeout} s) and did not stop when "
                                       "interrupted; its context was restarted, its variables are gone")
            raise TimeoutException(f"run_code: the cell ran past its timeout ({timeout} s) and was interrupted; "
                                   "the context keeps its variables")
        n = end.get("execution_count")
        if isinstance(n, int):
            self.execution.execution_count = n
        return self.execution


class LineSplitter:
    """The driver's stdout as JSON events, line by line, each line bounded."""

    def __init__(self) -> None:
        self.parts: List[bytes] = []
        self.size = 0

    def feed(self, data: bytes) -> List[Dict[str, Any]]:
        """The events completed by data; raises SandboxException on a line over EVENT_LINE_MAX."""
        out = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            self.parts.append(data[start:nl])
            line = b"".join(self.parts)
            self.parts, self.size = [], 0
            start = nl + 1
            try:
                e = _json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue  # not the driver's: it writes nothing else
            if isinstance(e, dict):
                out.append(e)
        if start < len(data):
            self.parts.append(data[start:])
            self.size += len(data) - start
            if self.size > EVENT_LINE_MAX:
                raise SandboxException(f"the code interpreter sent a line of more than {EVENT_LINE_MAX} bytes; it was stopped")
        return out


def exit_failure(stderr: str, was_ready: bool, error: Optional[str]) -> SandboxException:
    """Why the driver ended, from its stderr's tail."""
    tail = stderr.strip()
    if not was_ready and ("can't open file" in tail or "No such file" in tail):
        return SandboxException(
            f"this sandbox has no code interpreter ({DRIVER_PATH}): create it from the code-interpreter recipe "
            "(Sandbox.create() of tupper.code_interpreter does)")
    if not was_ready and "No module named" in tail:
        return SandboxException(f"the code interpreter cannot start: {tail.splitlines()[-1]}")
    return SandboxException(f"the code interpreter stopped ({error or 'exit 0'})" + (f": {tail[-1024:]}" if tail else ""))


def is_terminal(e: Dict[str, Any]) -> bool:
    return e.get("type") in _TERMINAL

"""
Sandbox's and AsyncSandbox's protocol, once for both forms (see
``_drive.py``): each sandbox call as a generator over a connection, and the
part of the classes that does no I/O (:class:`SandboxBase`).
"""
import datetime
from typing import Any, Dict, Generic, Optional, TypeVar

from ._drive import Proto
from ._link import Link
from ._wire import seconds, to_info
from .exceptions import InvalidArgumentException, SandboxNotFoundException
from .models import SandboxInfo, SandboxMetrics

C = TypeVar("C")
F = TypeVar("F")
P = TypeVar("P")


def metrics(m: Dict[str, Any], info: SandboxInfo) -> SandboxMetrics:
    return SandboxMetrics(
        timestamp=datetime.datetime.now(datetime.timezone.utc),
        cpu_count=info.cpu_count,
        cpu_used_pct=None,
        mem_used=int(m.get("memory_bytes") or 0),
        mem_total=info.limits.get("memory"),
        cpu_usage_usec=int(m.get("cpu_usage_usec") or 0),
        pids=int(m.get("pids") or 0),
        oom_kills=m.get("oom_kills"),
    )


def connect(conn: Any, sandbox_id: str, timeout: Optional[float], what: str) -> Proto:
    """sandbox.get (resuming a paused one, setting a new lifetime when given); its reply."""
    r = yield (conn.call, "sandbox.get", {"id": sandbox_id})
    if r.get("state") == "paused":
        yield (conn.call, "sandbox.resume", {"id": sandbox_id})
    if timeout is not None:
        yield (conn.call, "sandbox.set_timeout", {"id": sandbox_id, "timeout": seconds(timeout, what)})
    return r


def create(conn: Any, params: Dict[str, Any], limit: Any = "default") -> Proto:
    return (yield (conn.call, "sandbox.create", params, None, limit))


def kill(conn: Any, sandbox_id: str) -> Proto:
    return (yield (conn.call, "sandbox.kill", {"id": sandbox_id})).get("killed") is True


def set_timeout(conn: Any, sandbox_id: str, timeout: Any) -> Proto:
    t = seconds(timeout, "set_timeout", allow_none=False)
    yield (conn.call, "sandbox.set_timeout", {"id": sandbox_id, "timeout": t})


def get_info(conn: Any, sandbox_id: str) -> Proto:
    return to_info((yield (conn.call, "sandbox.get", {"id": sandbox_id})))


def get_metrics(conn: Any, sandbox_id: str) -> Proto:
    m = yield (conn.call, "sandbox.metrics", {"id": sandbox_id})
    return [metrics(m, (yield from get_info(conn, sandbox_id)))]


def pause(conn: Any, sandbox_id: str) -> Proto:
    return (yield (conn.call, "sandbox.pause", {"id": sandbox_id})).get("state") == "paused"


def is_running(conn: Any, sandbox_id: str) -> Proto:
    try:
        return (yield (conn.call, "sandbox.get", {"id": sandbox_id})).get("state") == "running"
    except SandboxNotFoundException:
        return False


def get_host(conn: Any, sandbox_id: str, port: Any) -> Proto:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgumentException(f"get_host: bad port {port!r}")
    r = yield (conn.call, "sandbox.expose", {"id": sandbox_id, "port": port})
    return f"{r['host']}:{r['port']}"


def list_sandboxes(conn: Any) -> Proto:
    r = yield (conn.call, "sandbox.list", {})
    return r.get("sandboxes") or []


class SandboxBase(Generic[C, F, P]):
    """What Sandbox and AsyncSandbox share: the link, the modules, the account."""

    _Commands: Any
    _Filesystem: Any
    _Pty: Any
    default_template = "default"

    def __init__(self, conn: Any, info: Dict[str, Any]) -> None:
        self._conn = conn
        self._link = Link(str(info["id"]), conn, info)
        self._commands: C = self._Commands(self._link)
        self._files: F = self._Filesystem(self._link)
        self._pty: P = self._Pty(self._link, self._commands)

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id."""
        return self._link.sandbox_id

    @property
    def commands(self) -> C:
        """Commands in the sandbox."""
        return self._commands

    @property
    def files(self) -> F:
        """The sandbox's filesystem."""
        return self._files

    @property
    def pty(self) -> P:
        """Programs on a terminal."""
        return self._pty

    @property
    def default_user(self) -> Optional[str]:
        """The account calls act as unless told (``user`` where the image has it, else its User, else root)."""
        return self._link.acct.default_user

    @property
    def home(self) -> str:
        """The default account's home: relative paths and commands start there."""
        return self._link.acct.home

    def _killed(self) -> None:
        self._link.killed = True
        self._commands._sandbox_gone("killed")  # type: ignore[attr-defined]



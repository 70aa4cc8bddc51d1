"""Sandbox: E2B's Sandbox class over tupper's socket API (blocking form)."""
import datetime
from typing import Any, Callable, Dict, List, Optional, TypeVar

from .._connection import Connection
from .._link import Link
from .._opts import connection_opts, create_params
from .._wire import seconds, to_info
from ..exceptions import InvalidArgumentException, SandboxNotFoundException
from ..models import SandboxInfo, SandboxMetrics, SandboxQuery
from .commands import Commands
from .filesystem import Filesystem
from .pty import Pty

T = TypeVar("T")


class class_method_variant:
    """A method that works on an instance (``sbx.kill()``) and on the class (``Sandbox.kill(sandbox_id)``), as E2B's."""

    def __init__(self, class_name: str) -> None:
        self._class_name = class_name
        self._fn: Any = None

    def __call__(self, fn: Any) -> "class_method_variant":
        self._fn = fn
        self.__doc__ = fn.__doc__
        return self

    def __get__(self, obj: Any, owner: Any) -> Any:
        if obj is None:
            return getattr(owner, self._class_name)
        return self._fn.__get__(obj, owner)


def _with_conn(opts: Dict[str, Any], what: str, fn: Callable[[Connection], T]) -> T:
    conn = Connection.open(**connection_opts(opts, what))
    try:
        return fn(conn)
    finally:
        conn.close()


def _metrics(m: Dict[str, Any], info: SandboxInfo) -> SandboxMetrics:
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


class SandboxPaginator:
    """Pages over ``Sandbox.list()``: ``has_next`` until the last page was returned by ``next_items()``."""

    def __init__(self, query: Optional[SandboxQuery] = None, limit: Optional[int] = None,
                 next_token: Optional[str] = None, **opts: Any) -> None:
        self._opts = connection_opts(opts, "Sandbox.list")
        self._query = query or SandboxQuery()
        self._limit = 100 if limit is None else limit
        if isinstance(self._limit, bool) or not isinstance(self._limit, int) or self._limit < 1:
            raise InvalidArgumentException(f"Sandbox.list: bad limit {limit!r}")
        try:
            self._offset = int(next_token) if next_token else 0
        except ValueError:
            raise InvalidArgumentException(f"Sandbox.list: bad next_token {next_token!r}") from None
        self._more = True

    @property
    def has_next(self) -> bool:
        """True while there may be another page."""
        return self._more

    @property
    def next_token(self) -> Optional[str]:
        """The token of the next page, while there is one."""
        return str(self._offset) if self._more else None

    def _page(self, sandboxes: List[Dict[str, Any]]) -> List[SandboxInfo]:
        q = self._query
        states = [getattr(s, "value", s) for s in q.state] if q.state else None
        items = []
        for info in map(to_info, sandboxes):
            if states is not None and info.state.value not in states:
                continue
            if any(info.metadata.get(k) != v for k, v in (q.metadata or {}).items()):
                continue
            items.append(info)
        page = items[self._offset:self._offset + self._limit]
        self._offset += len(page)
        self._more = self._offset < len(items)
        return page

    def next_items(self) -> List[SandboxInfo]:
        """The next page of sandboxes, oldest first."""
        if not self._more:
            raise InvalidArgumentException("Sandbox.list: no more items to fetch")
        r = _with_conn(self._opts, "Sandbox.list", lambda c: c.call("sandbox.list", {}))
        return self._page(r.get("sandboxes") or [])


class Sandbox:
    """
    A tupper sandbox, as E2B's ``Sandbox``: ``Sandbox.create()``, then
    ``sbx.commands``, ``sbx.files``, ``sbx.pty``; ``sbx.kill()`` at the end
    (or use it as a context manager).  Each Sandbox object holds its own
    connection to the daemon, which sends a process's output to the
    connection that started it.
    """

    default_template = "default"

    def __init__(self, conn: Connection, info: Dict[str, Any]) -> None:
        """Use ``Sandbox.create()`` or ``Sandbox.connect()``."""
        self._conn = conn
        self._link = Link(str(info["id"]), conn, info)
        self._commands = Commands(self._link)
        self._files = Filesystem(self._link)
        self._pty = Pty(self._link, self._commands)

    @property
    def sandbox_id(self) -> str:
        """The sandbox's id."""
        return self._link.sandbox_id

    @property
    def commands(self) -> Commands:
        """Commands in the sandbox."""
        return self._commands

    @property
    def files(self) -> Filesystem:
        """The sandbox's filesystem."""
        return self._files

    @property
    def pty(self) -> Pty:
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

    @classmethod
    def create(
        cls,
        template: Optional[str] = None,
        timeout: Optional[int] = None,
        metadata: Optional[Dict[str, str]] = None,
        envs: Optional[Dict[str, str]] = None,
        secure: bool = True,
        allow_internet_access: bool = True,
        mcp: Any = None,
        network: Any = None,
        backend: Optional[str] = None,
        cwd: Optional[str] = None,
        limits: Optional[Dict[str, Any]] = None,
        accel: Optional[str] = None,
        **opts: Any,
    ) -> "Sandbox":
        """
        Creates a sandbox.

        :param template: the image (E2B's template): ``"default"``, the embedded busybox image, or one of the daemon's store
        :param timeout: lifetime in seconds (default 300; 0: until killed)
        :param metadata: strings returned by ``get_info`` and ``list``
        :param envs: environment of every command
        :param secure: accepted and ignored (E2B's)
        :param allow_internet_access: False makes sure the box reaches nothing (tupper's default anyway)
        :param network: what the box may reach (tupper's): ``"none"`` (default), ``"all"``, or ``{"allow": [...], "deny": [...]}``
        :param backend: ``"linux"`` (default) or ``"microvm"`` (tupper's)
        :param cwd: default working directory of commands (tupper's)
        :param limits: ``memory``, ``cpus``, ``pids``, ``disk`` (tupper's; docs/protocol.md)
        :param accel: a microVM's accelerator, ``"kvm"``, ``"tcg"`` or ``"auto"`` (tupper's; docs/microvm.md)
        :param opts: ``socket`` (default ``$TUPPER_SOCKET``, else the daemon's default), ``request_timeout`` (seconds); E2B's ``api_key``, ``domain``... are ignored
        """
        params = create_params(template, timeout, metadata, envs, allow_internet_access, network, mcp, backend, cwd, limits, accel)
        conn = Connection.open(**connection_opts(opts, "Sandbox.create"))
        try:
            r = conn.call("sandbox.create", params)
            return cls(conn, r)
        except BaseException:
            conn.close()
            raise

    @classmethod
    def _cls_connect(cls, sandbox_id: str, timeout: Optional[int] = None, **opts: Any) -> "Sandbox":
        conn = Connection.open(**connection_opts(opts, "Sandbox.connect"))
        try:
            r = conn.call("sandbox.get", {"id": sandbox_id})
            if r.get("state") == "paused":
                conn.call("sandbox.resume", {"id": sandbox_id})
            if timeout is not None:
                conn.call("sandbox.set_timeout", {"id": sandbox_id, "timeout": seconds(timeout, "Sandbox.connect")})
            return cls(conn, r)
        except BaseException:
            conn.close()
            raise

    @class_method_variant("_cls_connect")
    def connect(self, timeout: Optional[int] = None, **opts: Any) -> "Sandbox":
        """
        Connects to a sandbox (``Sandbox.connect(sandbox_id)``), resuming it
        when paused; ``timeout`` sets a new lifetime in seconds.
        SandboxNotFoundException when there is none.
        """
        if self._conn.call("sandbox.get", {"id": self.sandbox_id}).get("state") == "paused":
            self._conn.call("sandbox.resume", {"id": self.sandbox_id})
        if timeout is not None:
            self.set_timeout(timeout)
        return self

    @staticmethod
    def list(query: Optional[SandboxQuery] = None, limit: Optional[int] = None, next_token: Optional[str] = None,
             **opts: Any) -> SandboxPaginator:
        """The sandboxes, page by page: ``Sandbox.list().next_items()``; ``query`` filters on metadata and state."""
        return SandboxPaginator(query=query, limit=limit, next_token=next_token, **opts)

    @staticmethod
    def _cls_kill(sandbox_id: str, **opts: Any) -> bool:
        r = _with_conn(opts, "Sandbox.kill", lambda c: c.call("sandbox.kill", {"id": sandbox_id}))
        return r.get("killed") is True

    @class_method_variant("_cls_kill")
    def kill(self, **opts: Any) -> bool:
        """Kills the sandbox (``Sandbox.kill(sandbox_id)`` too): True when it was killed, False when it was already gone."""
        try:
            r = self._conn.call("sandbox.kill", {"id": self.sandbox_id})
            return r.get("killed") is True
        finally:
            self._link.killed = True
            self._commands._sandbox_gone("killed")
            self._conn.close()

    @staticmethod
    def _cls_set_timeout(sandbox_id: str, timeout: int, **opts: Any) -> None:
        t = seconds(timeout, "set_timeout", allow_none=False)
        _with_conn(opts, "Sandbox.set_timeout", lambda c: c.call("sandbox.set_timeout", {"id": sandbox_id, "timeout": t}))

    @class_method_variant("_cls_set_timeout")
    def set_timeout(self, timeout: int, **opts: Any) -> None:
        """The sandbox now lives ``timeout`` seconds from now (0: until killed)."""
        t = seconds(timeout, "set_timeout", allow_none=False)
        self._conn.call("sandbox.set_timeout", {"id": self.sandbox_id, "timeout": t})

    @staticmethod
    def _cls_get_info(sandbox_id: str, **opts: Any) -> SandboxInfo:
        return to_info(_with_conn(opts, "Sandbox.get_info", lambda c: c.call("sandbox.get", {"id": sandbox_id})))

    @class_method_variant("_cls_get_info")
    def get_info(self, **opts: Any) -> SandboxInfo:
        """Describes the sandbox: its image, metadata, state, start and end, limits."""
        return to_info(self._conn.call("sandbox.get", {"id": self.sandbox_id}))

    @staticmethod
    def _cls_get_metrics(sandbox_id: str, **opts: Any) -> List[SandboxMetrics]:
        def go(c: Connection) -> List[SandboxMetrics]:
            m = c.call("sandbox.metrics", {"id": sandbox_id})
            return [_metrics(m, to_info(c.call("sandbox.get", {"id": sandbox_id})))]

        return _with_conn(opts, "Sandbox.get_metrics", go)

    @class_method_variant("_cls_get_metrics")
    def get_metrics(self, start: Any = None, end: Any = None, **opts: Any) -> List[SandboxMetrics]:
        """The sandbox's counters now, as a one-sample list (E2B returns samples over time; start and end are ignored)."""
        m = self._conn.call("sandbox.metrics", {"id": self.sandbox_id})
        return [_metrics(m, self.get_info())]

    @staticmethod
    def _cls_pause(sandbox_id: str, **opts: Any) -> bool:
        r = _with_conn(opts, "Sandbox.pause", lambda c: c.call("sandbox.pause", {"id": sandbox_id}))
        return r.get("state") == "paused"

    @class_method_variant("_cls_pause")
    def pause(self, **opts: Any) -> bool:
        """Freezes every process of the sandbox (cgroup freezer); ``connect()`` resumes it."""
        return self._conn.call("sandbox.pause", {"id": self.sandbox_id}).get("state") == "paused"

    beta_pause = pause

    def is_running(self, request_timeout: Optional[float] = None) -> bool:
        """True while the sandbox exists and is not paused."""
        try:
            r = self._conn.call("sandbox.get", {"id": self.sandbox_id})
            return r.get("state") == "running"
        except SandboxNotFoundException:
            return False

    def get_host(self, port: int) -> str:
        """``"127.0.0.1:PORT"``: a port of the host's loopback forwarded to ``port`` inside the sandbox."""
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidArgumentException(f"get_host: bad port {port!r}")
        r = self._conn.call("sandbox.expose", {"id": self.sandbox_id, "port": port})
        return f"{r['host']}:{r['port']}"

    def close(self) -> None:
        """tupper's: lets go of this object's connection; the sandbox lives on (``Sandbox.connect`` reaches it again)."""
        self._conn.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.kill()

"""Sandbox: E2B's Sandbox class over tupper's socket API (blocking form)."""
from typing import Any, Callable, Dict, List, Optional

from .. import _sandbox as ops
from .._connection import Connection
from .._drive import Proto, run
from .._opts import connection_opts, create_params
from .._sandbox import SandboxBase
from .._wire import to_info
from ..exceptions import InvalidArgumentException
from ..models import SandboxInfo, SandboxMetrics, SandboxQuery
from .commands import Commands
from .filesystem import Filesystem
from .pty import Pty


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


def _with_conn(opts: Dict[str, Any], what: str, op: Callable[[Connection], Proto]) -> Any:
    """Runs op on a connection of its own, closed after it."""
    conn = Connection.open(**connection_opts(opts, what))
    try:
        return run(op(conn))
    finally:
        conn.close()


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
        return self._page(_with_conn(self._opts, "Sandbox.list", ops.list_sandboxes))


class Sandbox(SandboxBase[Commands, Filesystem, Pty]):
    """
    A tupper sandbox, as E2B's ``Sandbox``: ``Sandbox.create()``, then
    ``sbx.commands``, ``sbx.files``, ``sbx.pty``; ``sbx.kill()`` at the end
    (or use it as a context manager).  Each Sandbox object holds its own
    connection to the daemon, which sends a process's output to the
    connection that started it.  (The protocol of each call is ``_sandbox``'s.)
    """

    _Commands = Commands
    _Filesystem = Filesystem
    _Pty = Pty

    def __init__(self, conn: Connection, info: Dict[str, Any]) -> None:
        """Use ``Sandbox.create()`` or ``Sandbox.connect()``."""
        super().__init__(conn, info)

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
            return cls(conn, run(ops.create(conn, params)))
        except BaseException:
            conn.close()
            raise

    @classmethod
    def _cls_connect(cls, sandbox_id: str, timeout: Optional[int] = None, **opts: Any) -> "Sandbox":
        conn = Connection.open(**connection_opts(opts, "Sandbox.connect"))
        try:
            return cls(conn, run(ops.connect(conn, sandbox_id, timeout, "Sandbox.connect")))
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
        run(ops.connect(self._conn, self.sandbox_id, timeout, "set_timeout"))
        return self

    @staticmethod
    def list(query: Optional[SandboxQuery] = None, limit: Optional[int] = None, next_token: Optional[str] = None,
             **opts: Any) -> SandboxPaginator:
        """The sandboxes, page by page: ``Sandbox.list().next_items()``; ``query`` filters on metadata and state."""
        return SandboxPaginator(query=query, limit=limit, next_token=next_token, **opts)

    @staticmethod
    def _cls_kill(sandbox_id: str, **opts: Any) -> bool:
        return _with_conn(opts, "Sandbox.kill", lambda c: ops.kill(c, sandbox_id))

    @class_method_variant("_cls_kill")
    def kill(self, **opts: Any) -> bool:
        """Kills the sandbox (``Sandbox.kill(sandbox_id)`` too): True when it was killed, False when it was already gone."""
        try:
            return run(ops.kill(self._conn, self.sandbox_id))
        finally:
            self._killed()
            self._conn.close()

    @staticmethod
    def _cls_set_timeout(sandbox_id: str, timeout: int, **opts: Any) -> None:
        _with_conn(opts, "Sandbox.set_timeout", lambda c: ops.set_timeout(c, sandbox_id, timeout))

    @class_method_variant("_cls_set_timeout")
    def set_timeout(self, timeout: int, **opts: Any) -> None:
        """The sandbox now lives ``timeout`` seconds from now (0: until killed)."""
        run(ops.set_timeout(self._conn, self.sandbox_id, timeout))

    @staticmethod
    def _cls_get_info(sandbox_id: str, **opts: Any) -> SandboxInfo:
        return _with_conn(opts, "Sandbox.get_info", lambda c: ops.get_info(c, sandbox_id))

    @class_method_variant("_cls_get_info")
    def get_info(self, **opts: Any) -> SandboxInfo:
        """Describes the sandbox: its image, metadata, state, start and end, limits."""
        return run(ops.get_info(self._conn, self.sandbox_id))

    @staticmethod
    def _cls_get_metrics(sandbox_id: str, **opts: Any) -> List[SandboxMetrics]:
        return _with_conn(opts, "Sandbox.get_metrics", lambda c: ops.get_metrics(c, sandbox_id))

    @class_method_variant("_cls_get_metrics")
    def get_metrics(self, start: Any = None, end: Any = None, **opts: Any) -> List[SandboxMetrics]:
        """The sandbox's counters now, as a one-sample list (E2B returns samples over time; start and end are ignored)."""
        return run(ops.get_metrics(self._conn, self.sandbox_id))

    @staticmethod
    def _cls_pause(sandbox_id: str, **opts: Any) -> bool:
        return _with_conn(opts, "Sandbox.pause", lambda c: ops.pause(c, sandbox_id))

    @class_method_variant("_cls_pause")
    def pause(self, **opts: Any) -> bool:
        """Freezes every process of the sandbox (cgroup freezer); ``connect()`` resumes it."""
        return run(ops.pause(self._conn, self.sandbox_id))

    beta_pause = pause

    def is_running(self, request_timeout: Optional[float] = None) -> bool:
        """True while the sandbox exists and is not paused."""
        return run(ops.is_running(self._conn, self.sandbox_id))

    def get_host(self, port: int) -> str:
        """``"127.0.0.1:PORT"``: a port of the host's loopback forwarded to ``port`` inside the sandbox."""
        return run(ops.get_host(self._conn, self.sandbox_id, port))

    def close(self) -> None:
        """tupper's: lets go of this object's connection; the sandbox lives on (``Sandbox.connect`` reaches it again)."""
        self._conn.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.kill()

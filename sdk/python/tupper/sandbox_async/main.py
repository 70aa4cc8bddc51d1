"""AsyncSandbox: E2B's AsyncSandbox over tupper's socket API (asyncio form)."""
from typing import Any, Awaitable, Callable, Dict, List, Optional, TypeVar

from .._connection import AsyncConnection
from .._link import Link
from .._opts import connection_opts, create_params
from .._wire import seconds, to_info
from ..exceptions import InvalidArgumentException, SandboxNotFoundException
from ..models import SandboxInfo, SandboxMetrics, SandboxQuery
from ..sandbox_sync.main import SandboxPaginator, _metrics, class_method_variant
from .commands import Commands
from .filesystem import Filesystem
from .pty import Pty

T = TypeVar("T")


async def _with_conn(opts: Dict[str, Any], what: str, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    conn = await AsyncConnection.open(**connection_opts(opts, what))
    try:
        return await fn(conn)
    finally:
        await conn.close()


class AsyncSandboxPaginator(SandboxPaginator):
    """Pages over ``AsyncSandbox.list()``: ``await paginator.next_items()``."""

    async def next_items(self) -> List[SandboxInfo]:  # type: ignore[override]
        """The next page of sandboxes, oldest first."""
        if not self._more:
            raise InvalidArgumentException("Sandbox.list: no more items to fetch")
        r = await _with_conn(self._opts, "AsyncSandbox.list", lambda c: c.call("sandbox.list", {}))
        return self._page(r.get("sandboxes") or [])


class AsyncSandbox:
    """A tupper sandbox, as E2B's ``AsyncSandbox``: ``sbx = await AsyncSandbox.create()``."""

    default_template = "default"

    def __init__(self, conn: AsyncConnection, info: Dict[str, Any]) -> None:
        """Use ``await AsyncSandbox.create()`` or ``await AsyncSandbox.connect()``."""
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
        """The account calls act as unless told."""
        return self._link.acct.default_user

    @property
    def home(self) -> str:
        """The default account's home."""
        return self._link.acct.home

    @classmethod
    async def create(cls, template: Optional[str] = None, timeout: Optional[int] = None,
                     metadata: Optional[Dict[str, str]] = None, envs: Optional[Dict[str, str]] = None,
                     secure: bool = True, allow_internet_access: bool = True, mcp: Any = None, network: Any = None,
                     backend: Optional[str] = None, cwd: Optional[str] = None,
                     limits: Optional[Dict[str, Any]] = None, accel: Optional[str] = None,
                     **opts: Any) -> "AsyncSandbox":
        """Creates a sandbox; the arguments are those of ``Sandbox.create``."""
        params = create_params(template, timeout, metadata, envs, allow_internet_access, network, mcp, backend, cwd, limits, accel)
        conn = await AsyncConnection.open(**connection_opts(opts, "AsyncSandbox.create"))
        try:
            return cls(conn, await conn.call("sandbox.create", params))
        except BaseException:
            await conn.close()
            raise

    @classmethod
    async def _cls_connect(cls, sandbox_id: str, timeout: Optional[int] = None, **opts: Any) -> "AsyncSandbox":
        conn = await AsyncConnection.open(**connection_opts(opts, "AsyncSandbox.connect"))
        try:
            r = await conn.call("sandbox.get", {"id": sandbox_id})
            if r.get("state") == "paused":
                await conn.call("sandbox.resume", {"id": sandbox_id})
            if timeout is not None:
                await conn.call("sandbox.set_timeout", {"id": sandbox_id, "timeout": seconds(timeout, "connect")})
            return cls(conn, r)
        except BaseException:
            await conn.close()
            raise

    @class_method_variant("_cls_connect")
    async def connect(self, timeout: Optional[int] = None, **opts: Any) -> "AsyncSandbox":
        """Connects to a sandbox (``await AsyncSandbox.connect(sandbox_id)``), resuming it when paused."""
        if (await self._conn.call("sandbox.get", {"id": self.sandbox_id})).get("state") == "paused":
            await self._conn.call("sandbox.resume", {"id": self.sandbox_id})
        if timeout is not None:
            await self.set_timeout(timeout)
        return self

    @staticmethod
    def list(query: Optional[SandboxQuery] = None, limit: Optional[int] = None, next_token: Optional[str] = None,
             **opts: Any) -> AsyncSandboxPaginator:
        """The sandboxes, page by page: ``await AsyncSandbox.list().next_items()``."""
        return AsyncSandboxPaginator(query=query, limit=limit, next_token=next_token, **opts)

    @staticmethod
    async def _cls_kill(sandbox_id: str, **opts: Any) -> bool:
        r = await _with_conn(opts, "AsyncSandbox.kill", lambda c: c.call("sandbox.kill", {"id": sandbox_id}))
        return r.get("killed") is True

    @class_method_variant("_cls_kill")
    async def kill(self, **opts: Any) -> bool:
        """Kills the sandbox: True when it was killed, False when it was already gone."""
        try:
            r = await self._conn.call("sandbox.kill", {"id": self.sandbox_id})
            return r.get("killed") is True
        finally:
            self._link.killed = True
            self._commands._sandbox_gone("killed")
            await self._conn.close()

    @staticmethod
    async def _cls_set_timeout(sandbox_id: str, timeout: int, **opts: Any) -> None:
        t = seconds(timeout, "set_timeout", allow_none=False)
        await _with_conn(opts, "AsyncSandbox.set_timeout", lambda c: c.call("sandbox.set_timeout", {"id": sandbox_id, "timeout": t}))

    @class_method_variant("_cls_set_timeout")
    async def set_timeout(self, timeout: int, **opts: Any) -> None:
        """The sandbox now lives ``timeout`` seconds from now (0: until killed)."""
        t = seconds(timeout, "set_timeout", allow_none=False)
        await self._conn.call("sandbox.set_timeout", {"id": self.sandbox_id, "timeout": t})

    @staticmethod
    async def _cls_get_info(sandbox_id: str, **opts: Any) -> SandboxInfo:
        return to_info(await _with_conn(opts, "AsyncSandbox.get_info", lambda c: c.call("sandbox.get", {"id": sandbox_id})))

    @class_method_variant("_cls_get_info")
    async def get_info(self, **opts: Any) -> SandboxInfo:
        """Describes the sandbox."""
        return to_info(await self._conn.call("sandbox.get", {"id": self.sandbox_id}))

    @class_method_variant("_cls_get_metrics")
    async def get_metrics(self, start: Any = None, end: Any = None, **opts: Any) -> List[SandboxMetrics]:
        """The sandbox's counters now, as a one-sample list."""
        m = await self._conn.call("sandbox.metrics", {"id": self.sandbox_id})
        return [_metrics(m, await self.get_info())]

    @staticmethod
    async def _cls_get_metrics(sandbox_id: str, **opts: Any) -> List[SandboxMetrics]:
        async def go(c: AsyncConnection) -> List[SandboxMetrics]:
            m = await c.call("sandbox.metrics", {"id": sandbox_id})
            return [_metrics(m, to_info(await c.call("sandbox.get", {"id": sandbox_id})))]

        return await _with_conn(opts, "AsyncSandbox.get_metrics", go)

    @staticmethod
    async def _cls_pause(sandbox_id: str, **opts: Any) -> bool:
        r = await _with_conn(opts, "AsyncSandbox.pause", lambda c: c.call("sandbox.pause", {"id": sandbox_id}))
        return r.get("state") == "paused"

    @class_method_variant("_cls_pause")
    async def pause(self, **opts: Any) -> bool:
        """Freezes every process of the sandbox; ``connect()`` resumes it."""
        return (await self._conn.call("sandbox.pause", {"id": self.sandbox_id})).get("state") == "paused"

    async def is_running(self, request_timeout: Optional[float] = None) -> bool:
        """True while the sandbox exists and is not paused."""
        try:
            return (await self._conn.call("sandbox.get", {"id": self.sandbox_id})).get("state") == "running"
        except SandboxNotFoundException:
            return False

    async def get_host(self, port: int) -> str:
        """``"127.0.0.1:PORT"``: a port of the host's loopback forwarded to ``port`` inside the sandbox."""
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidArgumentException(f"get_host: bad port {port!r}")
        r = await self._conn.call("sandbox.expose", {"id": self.sandbox_id, "port": port})
        return f"{r['host']}:{r['port']}"

    async def close(self) -> None:
        """tupper's: lets go of this object's connection; the sandbox lives on."""
        await self._conn.close()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.kill()

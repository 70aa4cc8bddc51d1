"""AsyncSandbox: E2B's AsyncSandbox over tupper's socket API (asyncio form; the protocol of each call is ``_sandbox``'s)."""
from typing import Any, Callable, Dict, List, Optional

from .. import _sandbox as ops
from .._connection import AsyncConnection
from .._drive import Proto, arun
from .._opts import connection_opts, create_params
from .._sandbox import SandboxBase
from ..exceptions import InvalidArgumentException
from ..models import SandboxInfo, SandboxMetrics, SandboxQuery
from ..sandbox_sync.main import SandboxPaginator, class_method_variant
from .commands import Commands
from .filesystem import Filesystem
from .pty import Pty


async def _with_conn(opts: Dict[str, Any], what: str, op: Callable[[AsyncConnection], Proto]) -> Any:
    """Runs op on a connection of its own, closed after it."""
    conn = await AsyncConnection.open(**connection_opts(opts, what))
    try:
        return await arun(op(conn))
    finally:
        await conn.close()


class AsyncSandboxPaginator(SandboxPaginator):
    """Pages over ``AsyncSandbox.list()``: ``await paginator.next_items()``."""

    async def next_items(self) -> List[SandboxInfo]:  # type: ignore[override]
        """The next page of sandboxes, oldest first."""
        if not self._more:
            raise InvalidArgumentException("Sandbox.list: no more items to fetch")
        return self._page(await _with_conn(self._opts, "AsyncSandbox.list", ops.list_sandboxes))


class AsyncSandbox(SandboxBase[Commands, Filesystem, Pty]):
    """A tupper sandbox, as E2B's ``AsyncSandbox``: ``sbx = await AsyncSandbox.create()``."""

    _Commands = Commands
    _Filesystem = Filesystem
    _Pty = Pty

    def __init__(self, conn: AsyncConnection, info: Dict[str, Any]) -> None:
        """Use ``await AsyncSandbox.create()`` or ``await AsyncSandbox.connect()``."""
        super().__init__(conn, info)

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
            return cls(conn, await arun(ops.create(conn, params)))
        except BaseException:
            await conn.close()
            raise

    @classmethod
    async def _cls_connect(cls, sandbox_id: str, timeout: Optional[int] = None, **opts: Any) -> "AsyncSandbox":
        conn = await AsyncConnection.open(**connection_opts(opts, "AsyncSandbox.connect"))
        try:
            return cls(conn, await arun(ops.connect(conn, sandbox_id, timeout, "connect")))
        except BaseException:
            await conn.close()
            raise

    @class_method_variant("_cls_connect")
    async def connect(self, timeout: Optional[int] = None, **opts: Any) -> "AsyncSandbox":
        """Connects to a sandbox (``await AsyncSandbox.connect(sandbox_id)``), resuming it when paused."""
        await arun(ops.connect(self._conn, self.sandbox_id, timeout, "set_timeout"))
        return self

    @staticmethod
    def list(query: Optional[SandboxQuery] = None, limit: Optional[int] = None, next_token: Optional[str] = None,
             **opts: Any) -> AsyncSandboxPaginator:
        """The sandboxes, page by page: ``await AsyncSandbox.list().next_items()``."""
        return AsyncSandboxPaginator(query=query, limit=limit, next_token=next_token, **opts)

    @staticmethod
    async def _cls_kill(sandbox_id: str, **opts: Any) -> bool:
        return await _with_conn(opts, "AsyncSandbox.kill", lambda c: ops.kill(c, sandbox_id))

    @class_method_variant("_cls_kill")
    async def kill(self, **opts: Any) -> bool:
        """Kills the sandbox: True when it was killed, False when it was already gone."""
        try:
            return await arun(ops.kill(self._conn, self.sandbox_id))
        finally:
            self._killed()
            await self._conn.close()

    @staticmethod
    async def _cls_set_timeout(sandbox_id: str, timeout: int, **opts: Any) -> None:
        await _with_conn(opts, "AsyncSandbox.set_timeout", lambda c: ops.set_timeout(c, sandbox_id, timeout))

    @class_method_variant("_cls_set_timeout")
    async def set_timeout(self, timeout: int, **opts: Any) -> None:
        """The sandbox now lives ``timeout`` seconds from now (0: until killed)."""
        await arun(ops.set_timeout(self._conn, self.sandbox_id, timeout))

    @staticmethod
    async def _cls_get_info(sandbox_id: str, **opts: Any) -> SandboxInfo:
        return await _with_conn(opts, "AsyncSandbox.get_info", lambda c: ops.get_info(c, sandbox_id))

    @class_method_variant("_cls_get_info")
    async def get_info(self, **opts: Any) -> SandboxInfo:
        """Describes the sandbox."""
        return await arun(ops.get_info(self._conn, self.sandbox_id))

    @staticmethod
    async def _cls_get_metrics(sandbox_id: str, **opts: Any) -> List[SandboxMetrics]:
        return await _with_conn(opts, "AsyncSandbox.get_metrics", lambda c: ops.get_metrics(c, sandbox_id))

    @class_method_variant("_cls_get_metrics")
    async def get_metrics(self, start: Any = None, end: Any = None, **opts: Any) -> List[SandboxMetrics]:
        """The sandbox's counters now, as a one-sample list."""
        return await arun(ops.get_metrics(self._conn, self.sandbox_id))

    @staticmethod
    async def _cls_pause(sandbox_id: str, **opts: Any) -> bool:
        return await _with_conn(opts, "AsyncSandbox.pause", lambda c: ops.pause(c, sandbox_id))

    @class_method_variant("_cls_pause")
    async def pause(self, **opts: Any) -> bool:
        """Freezes every process of the sandbox; ``connect()`` resumes it."""
        return await arun(ops.pause(self._conn, self.sandbox_id))

    async def is_running(self, request_timeout: Optional[float] = None) -> bool:
        """True while the sandbox exists and is not paused."""
        return await arun(ops.is_running(self._conn, self.sandbox_id))

    async def get_host(self, port: int) -> str:
        """``"127.0.0.1:PORT"``: a port of the host's loopback forwarded to ``port`` inside the sandbox."""
        return await arun(ops.get_host(self._conn, self.sandbox_id, port))

    async def close(self) -> None:
        """tupper's: lets go of this object's connection; the sandbox lives on."""
        await self._conn.close()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.kill()

"""
tupper: tupper's sandboxes from Python, shaped like E2B's Python SDK so that
code written against ``e2b`` moves by changing the import::

    from tupper import Sandbox

    with Sandbox.create() as sbx:
        print(sbx.commands.run("echo hello").stdout)

and, with asyncio, ``sbx = await AsyncSandbox.create()``.

It speaks the daemon's socket API directly (docs/protocol.md); the socket is
``$TUPPER_SOCKET``, else the daemon's default.  Standard library only.
"""
from ._connection import default_socket, default_sockets
from .exceptions import (
    AuthenticationException,
    CommandExitException,
    CommandResult,
    FileNotFoundException,
    InvalidArgumentException,
    NotEnoughSpaceException,
    NotFoundException,
    PermissionDeniedException,
    PolicyException,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    TemplateException,
    TimeoutException,
)
from .models import (
    EntryInfo,
    FilesystemEvent,
    FilesystemEventType,
    FileType,
    ProcessInfo,
    PtyOutput,
    PtySize,
    SandboxInfo,
    SandboxMetrics,
    SandboxQuery,
    SandboxState,
    Stderr,
    Stdout,
    WriteEntry,
    WriteInfo,
)
from .sandbox_sync.command_handle import CommandHandle
from .sandbox_sync.filesystem import WatchHandle
from .sandbox_sync.main import Sandbox, SandboxPaginator
from .sandbox_async.command_handle import AsyncCommandHandle, OutputHandler
from .sandbox_async.filesystem import AsyncWatchHandle
from .sandbox_async.main import AsyncSandbox, AsyncSandboxPaginator

__version__ = "0.1.0"

__all__ = [
    "Sandbox", "SandboxPaginator", "CommandHandle", "WatchHandle",
    "AsyncSandbox", "AsyncSandboxPaginator", "AsyncCommandHandle", "AsyncWatchHandle", "OutputHandler",
    "SandboxException", "TimeoutException", "NotFoundException", "FileNotFoundException",
    "SandboxNotFoundException", "InvalidArgumentException", "NotEnoughSpaceException",
    "AuthenticationException", "TemplateException", "RateLimitException",
    "PermissionDeniedException", "PolicyException", "CommandExitException", "CommandResult",
    "EntryInfo", "FileType", "FilesystemEvent", "FilesystemEventType", "ProcessInfo", "PtyOutput",
    "PtySize", "SandboxInfo", "SandboxMetrics", "SandboxQuery", "SandboxState", "Stderr", "Stdout",
    "WriteEntry", "WriteInfo", "default_socket", "default_sockets",
]

"""
Exceptions, named and arranged as in E2B's Python SDK so that
``except NotFoundException:`` moves over unchanged.

Every exception this package raises is a :class:`SandboxException` (except
:class:`AuthenticationException`, which E2B derives from ``Exception`` and
tupper never raises: the daemon's socket is guarded by its file mode).  When
the daemon answered with a JSON-RPC error, ``code`` and ``data`` say what it
said and ``errno_code`` names the errno of a file or process error.
"""
from dataclasses import dataclass
from typing import Any, Dict, Optional

#: The daemon's JSON-RPC error codes (docs/protocol.md).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
NOT_FOUND = -32000
SANDBOX_ERROR = -32001
FILE_ERROR = -32002
PROCESS_ERROR = -32003
BUSY = -32004
POLICY_DENIED = -32005
IMAGE_ERROR = -32006


class SandboxException(Exception):
    """Base class of every sandbox error."""

    def __init__(self, message: str = "", code: Optional[int] = None, data: Any = None) -> None:
        super().__init__(message)
        #: The daemon's JSON-RPC error code, when the daemon said it.
        self.code = code
        #: The daemon's error data (for file and process errors ``{errno, code}``).
        self.data = data

    @property
    def errno_code(self) -> Optional[str]:
        """The errno name (``ENOENT``, ``EACCES``, ...) of a file or process error."""
        if isinstance(self.data, dict) and isinstance(self.data.get("code"), str):
            return self.data["code"]
        return None


class TimeoutException(SandboxException):
    """
    Something took too long: a command ran past its ``timeout``, a request
    got no answer in ``request_timeout``, a watch ran out, or the sandbox is
    gone (killed, or its lifetime ran out) while something waited on it, which
    E2B reports as a timeout too.
    """


class InvalidArgumentException(SandboxException):
    """A bad argument, found by the SDK or by the daemon (-32602)."""


class NotEnoughSpaceException(SandboxException):
    """The sandbox's disk is full or its disk limit reached (ENOSPC, EDQUOT)."""


class NotFoundException(SandboxException):
    """No such sandbox, process, account, program, file or directory."""


class FileNotFoundException(NotFoundException):
    """No such file or directory inside the sandbox (ENOENT of a file call)."""


class SandboxNotFoundException(NotFoundException):
    """No such sandbox: it never existed, was killed, or its lifetime ran out."""


class AuthenticationException(Exception):
    """E2B's; never raised by tupper (the socket's file mode is the guard)."""


class TemplateException(SandboxException):
    """E2B's; the image (template) cannot serve the call."""


class RateLimitException(SandboxException):
    """E2B's; tupper raises it when the daemon is busy (-32004: 256 requests in flight)."""


class PermissionDeniedException(SandboxException):
    """
    tupper's own: the box's permissions refused the account a file operation
    or a command's start (EACCES, EPERM).  E2B reports these as a plain
    SandboxException; this is a subclass of it.
    """


class PolicyException(SandboxException):
    """tupper's own: a policy file refused the operation (-32005); the message names the file and the rule."""


@dataclass
class CommandResult:
    """What a finished command gave."""

    stderr: str
    """Everything it wrote to stderr."""
    stdout: str
    """Everything it wrote to stdout."""
    exit_code: int
    """Its exit code; ``-1`` when a signal killed it."""
    error: Optional[str]
    """Why it failed, when it did: ``"exit status 3"``, ``"signal: killed"``."""


class CommandExitException(SandboxException, CommandResult):
    """A command exited with a non-zero code or was killed by a signal (``commands.run``, ``wait``)."""

    def __init__(self, stderr: str, stdout: str, exit_code: int, error: Optional[str]) -> None:
        CommandResult.__init__(self, stderr=stderr, stdout=stdout, exit_code=exit_code, error=error)
        SandboxException.__init__(self, f"Command exited with code {exit_code} and error:\n{stderr}")

    def __str__(self) -> str:
        return f"Command exited with code {self.exit_code} and error:\n{self.stderr}"

    __repr__ = object.__repr__


def from_rpc_error(err: Dict[str, Any], method: str) -> SandboxException:
    """Turns a JSON-RPC error object of the daemon into the matching exception."""
    code = err.get("code") if isinstance(err.get("code"), int) else None
    text = err.get("message") if isinstance(err.get("message"), str) else "error"
    data = err.get("data")
    msg = f"{method}: {text}"
    errno = data.get("code") if isinstance(data, dict) else None
    if code == NOT_FOUND:
        if method.startswith("sandbox.") or text.startswith("no sandbox"):
            return SandboxNotFoundException(msg, code, data)
        return NotFoundException(msg, code, data)
    if code == IMAGE_ERROR and isinstance(data, dict) and data.get("kind") == "not_found":
        return NotFoundException(msg, code, data)
    if code == INVALID_PARAMS:
        return InvalidArgumentException(msg, code, data)
    if code == POLICY_DENIED:
        return PolicyException(msg, code, data)
    if code == BUSY:
        return RateLimitException(msg, code, data)
    if code in (FILE_ERROR, PROCESS_ERROR):
        if errno == "ENOENT":
            # an unknown account is not a missing file
            is_file = method.startswith("fs.") and not text.startswith("user '")
            cls = FileNotFoundException if is_file else NotFoundException
            return cls(msg, code, data)
        if errno in ("ENOSPC", "EDQUOT"):
            return NotEnoughSpaceException(msg, code, data)
        if errno in ("EACCES", "EPERM"):
            return PermissionDeniedException(msg, code, data)
    return SandboxException(msg, code, data)

"""
The plain data this package hands out, named as in E2B's Python SDK:
sandbox info and queries, processes, filesystem entries and events.
"""
import datetime
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, IO, List, Optional, Union

from .exceptions import CommandExitException, CommandResult  # noqa: F401 - re-exported

Stdout = str
"""A chunk of a command's stdout."""
Stderr = str
"""A chunk of a command's stderr."""
PtyOutput = bytes
"""A chunk of what a terminal shows (raw bytes)."""
Username = str
"""An account of the box's /etc/passwd, e.g. ``"user"`` or ``"root"``."""


class SandboxState(str, enum.Enum):
    """Whether a sandbox runs or is paused."""

    RUNNING = "running"
    PAUSED = "paused"


@dataclass
class SandboxQuery:
    """Filters of ``Sandbox.list``: every metadata pair must match; state among these."""

    metadata: Optional[Dict[str, str]] = None
    state: Optional[List[SandboxState]] = None


@dataclass
class SandboxInfo:
    """What ``get_info`` and ``list`` say about a sandbox (E2B's fields, then tupper's)."""

    sandbox_id: str
    template_id: str
    """The image it was made from (E2B's template)."""
    name: Optional[str]
    metadata: Dict[str, str]
    started_at: datetime.datetime
    end_at: Optional[datetime.datetime]
    """When the daemon will kill it; ``None`` without a lifetime."""
    state: SandboxState
    cpu_count: Optional[float] = None
    """CPU quota in cores, when limited."""
    memory_mb: Optional[float] = None
    """Memory limit in MiB, when limited."""
    timeout: int = 0
    """Its lifetime in seconds (0: none)."""
    limits: Dict[str, Any] = field(default_factory=dict)
    """The limits set (memory and disk in bytes, cpus, pids)."""
    processes: Optional[int] = None
    """Live processes started through the API."""
    default_user: Optional[str] = None
    """The account calls act as unless told (E2B's default): ``user`` where the image has it."""
    home: Optional[str] = None
    """That account's home, where relative paths and commands start."""
    workdir: Optional[str] = None
    """The working directory the sandbox was given, if any."""
    backend: Optional[str] = None
    """``linux`` or ``microvm``."""


@dataclass
class SandboxMetrics:
    """One sample of a sandbox's counters, from its cgroup."""

    timestamp: datetime.datetime
    cpu_count: Optional[float]
    cpu_used_pct: Optional[float]
    mem_used: int
    mem_total: Optional[int]
    cpu_usage_usec: int = 0
    pids: int = 0
    oom_kills: Optional[int] = None


@dataclass
class ProcessInfo:
    """A running command or terminal, as ``commands.list()`` reports it."""

    pid: int
    tag: Optional[str]
    cmd: str
    """The program (argv[0])."""
    args: List[str]
    """Its arguments (argv[1:])."""
    envs: Dict[str, str]
    """E2B's field; the daemon does not report environments (always empty)."""
    cwd: Optional[str]
    user: Optional[str] = None
    """The account it runs as (tupper's)."""
    pty: bool = False
    """True for a terminal's program (tupper's)."""
    started_at: Optional[datetime.datetime] = None


@dataclass
class PtySize:
    """A terminal's size."""

    rows: int
    cols: int


class FileType(str, enum.Enum):
    """Kinds of entries: E2B's FILE and DIR, and what a Linux box also has."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    OTHER = "other"


@dataclass
class WriteInfo:
    """What ``files.write`` returns for each file written."""

    name: str
    type: Optional[FileType]
    path: str


@dataclass
class EntryInfo(WriteInfo):
    """A file or directory, as ``files.list`` and ``files.get_info`` describe it."""

    size: int = 0
    mode: int = 0
    """Permission bits, e.g. ``0o644``."""
    permissions: str = ""
    """``ls -l`` style, e.g. ``-rw-r--r--``."""
    owner: str = ""
    """The owner's uid inside the box, as text (``get_info`` only; E2B gives a name)."""
    group: str = ""
    """The group's gid inside the box, as text (``get_info`` only)."""
    modified_time: Optional[datetime.datetime] = None
    symlink_target: Optional[str] = None
    name_raw: Optional[bytes] = None
    """The exact bytes of a name that is not UTF-8 (``name`` then shows U+FFFD); else None."""
    path_raw: Optional[bytes] = None
    """The same for ``path``."""
    symlink_target_raw: Optional[bytes] = None
    """The same for ``symlink_target``."""


@dataclass
class WriteEntry:
    """One file of ``files.write_files``: a path and its data (a dict with these keys works too)."""

    path: str
    data: Union[str, bytes, bytearray, IO[Any]]


class FilesystemEventType(str, enum.Enum):
    """What ``watch_dir`` reports, as E2B, plus tupper's OVERFLOW."""

    CHMOD = "chmod"
    CREATE = "create"
    REMOVE = "remove"
    RENAME = "rename"
    WRITE = "write"
    OVERFLOW = "overflow"
    """Events were lost, or a new directory could not be watched (tupper's own)."""


@dataclass
class FilesystemEvent:
    """One change in a watched directory; ``name`` is relative to it."""

    name: str
    type: FilesystemEventType
    message: Optional[str] = None
    """Why, for an OVERFLOW."""
    name_raw: Optional[bytes] = None
    """The exact bytes of a name that is not UTF-8 (``name`` then shows U+FFFD); else None."""

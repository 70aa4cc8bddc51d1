"""
How the daemon's replies and notifications carry bytes, a process's end and
a sandbox's description, and which account a call acts as: shared by the sync
and async forms.
"""
import base64
import codecs
import datetime
import posixpath
from typing import Any, Dict, List, Optional, Tuple

from .exceptions import CommandResult, InvalidArgumentException
from .models import EntryInfo, FileType, ProcessInfo, SandboxInfo, SandboxState

#: Most raw bytes in one fs.read, fs.write or process.stdin call.
CHUNK = 1 << 20


def decode_data(data: Any, encoding: Any) -> bytes:
    """The bytes of a ``data`` field: UTF-8 text when ``encoding`` says utf8, else base64."""
    if not isinstance(data, str):
        return b""
    if encoding == "utf8":
        return data.encode("utf-8")
    return base64.b64decode(data)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def parse_time(s: Any) -> Optional[datetime.datetime]:
    """An ISO 8601 UTC time of the daemon as an aware datetime."""
    if not isinstance(s, str):
        return None
    try:
        return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        return None


def seconds(value: Any, what: str, allow_none: bool = True) -> Optional[float]:
    """A timeout in seconds as the caller gave it: None, or a number >= 0."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise InvalidArgumentException(f"{what}: bad timeout {value!r} (seconds, 0 or more)")
    return value


class OutputDecoder:
    """Joins UTF-8 characters split across chunks of one stream."""

    def __init__(self) -> None:
        self._d = {"stdout": codecs.getincrementaldecoder("utf-8")("replace"),
                   "stderr": codecs.getincrementaldecoder("utf-8")("replace")}

    def feed(self, stream: str, data: bytes) -> str:
        return self._d[stream].decode(data)

    def flush(self, stream: str) -> str:
        return self._d[stream].decode(b"", final=True)


def output_stream(p: Dict[str, Any]) -> str:
    return "stderr" if p.get("stream") == "stderr" else "stdout"


def exit_status(p: Dict[str, Any]) -> Tuple[int, int, Optional[str]]:
    """A process.exit notification: exit code, signal, and the error text a result reports."""
    code = p.get("exit_code") if isinstance(p.get("exit_code"), int) else -1
    sig = p.get("signal") if isinstance(p.get("signal"), int) else 0
    if p.get("oom_killed") is True:  # the sandbox's memory limit killed it (docs/limits.md)
        return code, sig, "out of memory: killed by the sandbox's memory limit"
    if sig:
        return code, sig, "signal: killed" if sig == 9 else f"signal: {sig}"
    if code != 0:
        return code, sig, f"exit status {code}"
    return code, sig, None


def result_of(stdout: str, stderr: str, p: Dict[str, Any]) -> CommandResult:
    code, _sig, error = exit_status(p)
    return CommandResult(stderr=stderr, stdout=stdout, exit_code=code, error=error)


class Account:
    """What a sandbox says about its accounts: the default one, its home, the sandbox's workdir."""

    def __init__(self, info: Dict[str, Any]) -> None:
        du = info.get("default_user")
        self.default_user: Optional[str] = du if isinstance(du, str) else None
        home = info.get("home")
        self.home: str = home if isinstance(home, str) else "/"
        wd = info.get("workdir")
        self.workdir: Optional[str] = wd if isinstance(wd, str) else None


def from_home(path: str, base: str) -> str:
    """path, absolute: a relative one is taken from base (an empty one stays empty: the daemon refuses it)."""
    if path == "" or path.startswith("/"):
        return path
    return base.rstrip("/") + "/" + path


def as_account(acct: Account, user: Optional[str], params: Dict[str, Any], paths: Tuple[str, ...] = ("path",)) -> Dict[str, Any]:
    """
    params acting as ``user``: an explicit one goes to the daemon as it is
    (which takes relative paths from that account's home); without one, the
    sandbox's default account, relative paths taken from its home here.
    """
    p = dict(params)
    if user is not None:
        p["user"] = user
        return p
    base = "/"
    if acct.default_user is not None:
        p["user"] = acct.default_user
        base = acct.home
    for k in paths:
        if isinstance(p.get(k), str):
            p[k] = from_home(p[k], base)
    return p


def start_params(acct: Account, cwd: Optional[str], envs: Optional[Dict[str, str]], user: Optional[str], timeout: Optional[float]) -> Dict[str, Any]:
    """
    The params a process start (process.start, pty.create) adds: its account
    and cwd (an explicit user as it is; else the default account, in cwd taken
    from its home, else in the sandbox's workdir, else in its home), env, and
    its timeout in seconds (none for 0 or None).
    """
    p: Dict[str, Any] = {}
    if user is not None:
        p["user"] = user
        if cwd is not None:
            p["cwd"] = cwd
    elif acct.default_user is not None:
        p["user"] = acct.default_user
        p["cwd"] = from_home(cwd, acct.home) if cwd is not None else (acct.workdir or acct.home)
    elif cwd is not None:
        p["cwd"] = from_home(cwd, "/")
    if envs is not None:
        if not isinstance(envs, dict):
            raise InvalidArgumentException("envs must be a dict of strings")
        p["env"] = envs
    if timeout:
        p["timeout"] = timeout
    return p


def to_info(r: Dict[str, Any]) -> SandboxInfo:
    """A sandbox.get or sandbox.list entry as a SandboxInfo."""
    limits = r.get("limits") if isinstance(r.get("limits"), dict) else {}
    image = str(r.get("image") or "default")
    mem = limits.get("memory")
    try:
        state = SandboxState(r.get("state"))
    except ValueError:
        state = SandboxState.RUNNING
    return SandboxInfo(
        sandbox_id=str(r.get("id")),
        template_id=image,
        name=image,
        metadata=dict(r.get("metadata") or {}),
        started_at=parse_time(r.get("created_at")) or datetime.datetime.now(datetime.timezone.utc),
        end_at=parse_time(r.get("expires_at")),
        state=state,
        cpu_count=limits.get("cpus"),
        memory_mb=mem / (1 << 20) if isinstance(mem, (int, float)) else None,
        timeout=int(r.get("timeout") or 0),
        limits=dict(limits),
        processes=r.get("processes") if isinstance(r.get("processes"), int) else None,
        default_user=r.get("default_user"),
        home=r.get("home"),
        workdir=r.get("workdir"),
        backend=r.get("backend"),
    )


def _permissions(kind: str, mode: int) -> str:
    s = {"dir": "d", "symlink": "l", "file": "-"}.get(kind, "?")
    for i in range(8, -1, -1):
        s += "rwx"[(8 - i) % 3] if mode & (1 << i) else "-"
    return s


def basename(path: str) -> str:
    b = posixpath.basename(path.rstrip("/"))
    return b or "/"


def to_entry(r: Dict[str, Any]) -> EntryInfo:
    """An fs.stat reply or fs.list entry as an EntryInfo."""
    kind = r.get("type") if r.get("type") in ("file", "dir", "symlink") else "other"
    mode = r.get("mode", 0) & 0o7777 if isinstance(r.get("mode"), int) else 0
    mtime = r.get("mtime")
    return EntryInfo(
        name=str(r.get("name") or basename(str(r.get("path", "")))),
        type=FileType(kind),
        path=str(r.get("path", "")),
        size=r.get("size", 0) if isinstance(r.get("size"), int) else 0,
        mode=mode,
        permissions=_permissions(kind, mode),
        owner=str(r["uid"]) if isinstance(r.get("uid"), int) else "",
        group=str(r["gid"]) if isinstance(r.get("gid"), int) else "",
        modified_time=datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc) if isinstance(mtime, (int, float)) else None,
        symlink_target=r.get("link") if isinstance(r.get("link"), str) else None,
        name_raw=raw_bytes(r.get("name_raw")),
        path_raw=raw_bytes(r.get("path_raw")),
        symlink_target_raw=raw_bytes(r.get("link_raw")),
    )


def raw_bytes(v: Any) -> Optional[bytes]:
    """A reply's ``<field>_raw`` (base64 of a name that is not UTF-8) as bytes, else None."""
    return base64.b64decode(v) if isinstance(v, str) else None


def to_process(p: Dict[str, Any]) -> ProcessInfo:
    argv: List[str] = [str(a) for a in p.get("argv") or []]
    return ProcessInfo(
        pid=int(p.get("pid", 0)),
        tag=None,
        cmd=argv[0] if argv else "",
        args=argv[1:],
        envs={},
        cwd=p.get("cwd"),
        user=p.get("user"),
        pty=p.get("pty") is True,
        started_at=parse_time(p.get("started_at")),
    )


def check_size(what: str, size: Any) -> None:
    """A terminal size: cols and rows, each an integer in 1..4096."""
    for k in ("cols", "rows"):
        v = getattr(size, k, None)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096:
            raise InvalidArgumentException(f"{what}: {k} must be an integer in 1..4096, not {v!r}")


def write_chunks(data: Any, what: str = "files.write"):
    """The bytes of data (str, bytes, or a file object read 1 MiB at a time) in pieces of at most CHUNK; one empty piece for empty data."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        b = bytes(data)
        if not b:
            yield b""
        for off in range(0, len(b), CHUNK):
            yield b[off:off + CHUNK]
        return
    if hasattr(data, "read"):
        gave = False
        while True:
            piece = data.read(CHUNK)
            if isinstance(piece, str):
                piece = piece.encode("utf-8")
            if not piece:
                break
            gave = True
            piece = bytes(piece)
            for off in range(0, len(piece), CHUNK):  # text encodes to more bytes than characters
                yield piece[off:off + CHUNK]
        if not gave:
            yield b""
        return
    raise InvalidArgumentException(f"{what}: data must be str, bytes or a file object, not {type(data).__name__}")


def entry_fields(f: Any) -> Tuple[str, Any]:
    """(path, data) of a WriteEntry or a dict with those keys."""
    if isinstance(f, dict):
        return f.get("path"), f.get("data")
    return getattr(f, "path", None), getattr(f, "data", None)

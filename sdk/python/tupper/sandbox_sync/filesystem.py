"""
sbx.files: the sandbox's filesystem, as E2B's Filesystem module.  Bytes go on
the data connection as binary frames (fs.read_stream / fs.write_stream; from
a daemon without one, fs.read / fs.write in 1 MiB pieces).  Every call acts as an account
of the box: ``user``, else the sandbox's default account (``user`` where the
image has it); the kernel checks that account's permissions, and relative
paths are taken from its home.
"""
import threading
from typing import IO, Any, Dict, Iterator, List, Literal, Optional, Union, overload

from .._drive import Chunks, run, run_iter
from .._files import FilesOps
from .._link import Link, rt
from .._wire import raw_bytes
from ..exceptions import SandboxException
from ..models import EntryInfo, FilesystemEvent, FilesystemEventType, Username, WriteEntry, WriteInfo

#: Most events a WatchHandle keeps between two get_new_events calls; past it, one OVERFLOW event says so.
MAX_PENDING_EVENTS = 65536


class WatchHandle:
    """
    A directory being watched: ``get_new_events()`` returns what changed
    since the last call; ``stop()`` ends it.
    """

    def __init__(self, link: Link, watch_id: int) -> None:
        self._link = link
        self._watch_id = watch_id
        self._lock = threading.Lock()
        self._events: List[FilesystemEvent] = []
        self._overflowed = False
        self._ended: Optional[str] = None
        self._stopped = False
        self._key = ("w", link.sandbox_id, watch_id)
        link.conn.subscribe(self._key, self._on_event)
        self._cancel_close = link.conn.on_close(lambda e: self._end(str(e)))

    def _on_event(self, _method: str, p: Dict[str, Any]) -> None:
        kind = str(p.get("type"))
        if kind == "end":
            self._end(str(p.get("message") or "ended"))
            return
        try:
            t = FilesystemEventType(kind)
        except ValueError:
            return
        ev = FilesystemEvent(name=str(p.get("name") or ""), type=t,
                             message=p.get("message") if isinstance(p.get("message"), str) else None,
                             name_raw=raw_bytes(p.get("name_raw")))
        with self._lock:
            if len(self._events) < MAX_PENDING_EVENTS:
                self._events.append(ev)
            elif not self._overflowed:
                self._overflowed = True
                self._events.append(FilesystemEvent(name="", type=FilesystemEventType.OVERFLOW,
                                                    message="events were dropped: get_new_events was not called in time"))

    def _end(self, why: str) -> None:
        with self._lock:
            if self._ended is None:
                self._ended = why
        self._link.conn.unsubscribe(self._key)

    def get_new_events(self, request_timeout: Optional[float] = None) -> List[FilesystemEvent]:
        """
        The events since the last call (or the start).  Once the watch ended
        (stop(), its directory or the sandbox gone) and every event was
        returned, raises SandboxException saying why.
        """
        with self._lock:
            events, self._events, self._overflowed = self._events, [], False
            ended = self._ended
        if not events and (self._stopped or ended is not None):
            raise SandboxException(f"the watcher is already stopped ({'stop()' if self._stopped else ended})")
        return events

    def stop(self, request_timeout: Optional[float] = None) -> None:
        """Stops watching; no event comes after it returns."""
        if self._stopped:
            return
        self._stopped = True
        ended = self._ended
        self._end("stopped")
        self._cancel_close()
        if ended is None:
            try:
                self._link.conn.call("fs.unwatch", self._link.params(watch=self._watch_id), timeout=rt(request_timeout))
            except SandboxException:
                pass  # the watch or the sandbox ended meanwhile


class Filesystem:
    """Files and directories of the sandbox (the protocol is ``_files.FilesOps``; this form blocks)."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._ops = FilesOps(link)

    @overload
    def read(self, path: str, format: Literal["text"] = "text", user: Optional[Username] = None,
             request_timeout: Optional[float] = None) -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"], user: Optional[Username] = None,
             request_timeout: Optional[float] = None) -> bytearray: ...

    @overload
    def read(self, path: str, format: Literal["stream"], user: Optional[Username] = None,
             request_timeout: Optional[float] = None) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "text", user: Optional[Username] = None,
             request_timeout: Optional[float] = None) -> Any:
        """
        Reads a file as ``text`` (UTF-8, the default), ``bytes`` (a
        bytearray) or ``stream`` (an iterator of bytes that fetches more as
        it is consumed: the daemon sends at most 4 MiB ahead of it).
        FileNotFoundException when it is missing (for a stream too: before
        it returns).  The bytes come on the data connection, as binary
        frames; from a daemon without one, 1 MiB at a time as base64.
        """
        v = run(self._ops.read(path, format, user, request_timeout))
        return run_iter(v.gen) if isinstance(v, Chunks) else v

    def write(self, path: str, data: Union[str, bytes, IO[Any]], user: Optional[Username] = None,
              request_timeout: Optional[float] = None) -> WriteInfo:
        """
        Writes a file, replacing it (missing parent directories are made).
        ``data`` is str, bytes, or a file object read 1 MiB at a time.
        """
        return run(self._ops.write(path, data, user, request_timeout))

    def write_files(self, files: List[WriteEntry], user: Optional[Username] = None,
                    request_timeout: Optional[float] = None) -> List[WriteInfo]:
        """Writes several files (WriteEntry, or dicts with ``path`` and ``data``), one after the other."""
        return run(self._ops.write_files(files, user, request_timeout))

    def list(self, path: str, depth: Optional[int] = 1, user: Optional[Username] = None,
             request_timeout: Optional[float] = None) -> List[EntryInfo]:
        """
        The entries of a directory, sorted by name; with ``depth`` > 1 also
        those of its subdirectories down to that depth (symlinks are not
        followed).  At most 4000 entries per directory (the daemon's bound).
        """
        return run(self._ops.list(path, depth, user, request_timeout))

    def exists(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> bool:
        """True when something is at path (a dangling symlink counts); False when nothing is."""
        return run(self._ops.exists(path, user, request_timeout))

    def get_info(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> EntryInfo:
        """Describes a file or directory (a final symlink is not followed)."""
        return run(self._ops.get_info(path, user, request_timeout))

    def remove(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> None:
        """Removes a file, or a directory with everything in it."""
        run(self._ops.remove(path, user, request_timeout))

    def rename(self, old_path: str, new_path: str, user: Optional[Username] = None,
               request_timeout: Optional[float] = None) -> EntryInfo:
        """Renames (moves) a file or directory; returns what is now at new_path."""
        return run(self._ops.rename(old_path, new_path, user, request_timeout))

    def make_dir(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> bool:
        """Makes a directory and its parents; False when it already existed."""
        return run(self._ops.make_dir(path, user, request_timeout))

    def watch_dir(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None,
                  recursive: bool = False) -> WatchHandle:
        """
        Watches a directory (its whole tree with ``recursive``, new
        directories included); poll with ``get_new_events()``.
        FileNotFoundException when it does not exist.
        """
        box: List[WatchHandle] = []
        run(self._ops.watch(path, user, request_timeout, recursive, lambda w: box.append(WatchHandle(self._link, w))))
        return box[0]

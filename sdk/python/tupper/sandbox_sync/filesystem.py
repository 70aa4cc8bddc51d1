"""
sbx.files: the sandbox's filesystem, as E2B's Filesystem module.  Bytes go in
1 MiB pieces (fs.read / fs.write with offsets).  Every call acts as an account
of the box: ``user``, else the sandbox's default account (``user`` where the
image has it); the kernel checks that account's permissions, and relative
paths are taken from its home.
"""
import threading
from typing import IO, Any, Dict, Iterator, List, Literal, Optional, Tuple, Union, overload

from .._link import Link, rt
from .._wire import CHUNK, as_account, b64, basename, decode_data, entry_fields, raw_bytes, to_entry, write_chunks
from ..exceptions import FileNotFoundException, InvalidArgumentException, SandboxException
from ..models import EntryInfo, FilesystemEvent, FilesystemEventType, FileType, Username, WriteEntry, WriteInfo

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
    """Files and directories of the sandbox."""

    def __init__(self, link: Link) -> None:
        self._link = link

    def _call(self, method: str, params: Dict[str, Any], user: Optional[str], request_timeout: Optional[float],
              paths: Tuple[str, ...] = ("path",)) -> Any:
        p = as_account(self._link.acct, user, self._link.params(**params), paths)
        return self._link.conn.call(method, p, timeout=rt(request_timeout))

    def _read_chunk(self, path: str, offset: int, user: Optional[str], request_timeout: Optional[float]) -> Tuple[bytes, bool]:
        r = self._call("fs.read", {"path": path, "offset": offset, "length": CHUNK, "encoding": "base64"}, user, request_timeout)
        data = decode_data(r.get("data"), r.get("encoding"))
        return data, bool(r.get("eof")) or not data

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
        bytearray) or ``stream`` (an iterator of bytes that fetches 1 MiB at
        a time as it is consumed).  FileNotFoundException when it is missing
        (for a stream too: the first piece is read before it returns).
        """
        if format not in ("text", "bytes", "stream"):
            raise InvalidArgumentException(f"files.read: format {format!r} is not supported (text, bytes, stream)")
        first, eof = self._read_chunk(path, 0, user, request_timeout)
        if format == "stream":
            return self._stream(path, first, eof, user, request_timeout)
        out = bytearray(first)
        while not eof:
            data, eof = self._read_chunk(path, len(out), user, request_timeout)
            out += data
        if format == "text":
            return out.decode("utf-8", "replace")
        return out

    def _stream(self, path: str, first: bytes, eof: bool, user: Optional[str], request_timeout: Optional[float]) -> Iterator[bytes]:
        offset = len(first)
        if first:
            yield first
        while not eof:
            data, eof = self._read_chunk(path, offset, user, request_timeout)
            offset += len(data)
            if data:
                yield data

    def write(self, path: str, data: Union[str, bytes, IO[Any]], user: Optional[Username] = None,
              request_timeout: Optional[float] = None) -> WriteInfo:
        """
        Writes a file, replacing it (missing parent directories are made).
        ``data`` is str, bytes, or a file object read 1 MiB at a time.
        """
        return self._write_one(path, data, user, request_timeout)

    def write_files(self, files: List[WriteEntry], user: Optional[Username] = None,
                    request_timeout: Optional[float] = None) -> List[WriteInfo]:
        """Writes several files (WriteEntry, or dicts with ``path`` and ``data``), one after the other."""
        if not isinstance(files, list):
            raise InvalidArgumentException("files.write_files: files must be a list of WriteEntry")
        out = []
        for f in files:
            path, data = entry_fields(f)
            out.append(self._write_one(path, data, user, request_timeout))
        return out

    def _write_one(self, path: Any, data: Any, user: Optional[str], request_timeout: Optional[float]) -> WriteInfo:
        if not isinstance(path, str) or path == "":
            raise InvalidArgumentException("files.write: path must be a non-empty string")
        if data is None:
            raise InvalidArgumentException("files.write: no data")
        offset = 0
        for piece in write_chunks(data):
            self._call("fs.write", {"path": path, "offset": offset, "data": b64(piece), "encoding": "base64"}, user, request_timeout)
            offset += len(piece)
        return WriteInfo(name=basename(path), type=FileType.FILE, path=path)

    def list(self, path: str, depth: Optional[int] = 1, user: Optional[Username] = None,
             request_timeout: Optional[float] = None) -> List[EntryInfo]:
        """
        The entries of a directory, sorted by name; with ``depth`` > 1 also
        those of its subdirectories down to that depth (symlinks are not
        followed).  At most 4000 entries per directory (the daemon's bound).
        """
        if depth is None:
            depth = 1
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise InvalidArgumentException("files.list: depth should be at least 1")
        out: List[EntryInfo] = []
        todo = [(path, 1)]
        while todo:
            d, level = todo.pop(0)
            r = self._call("fs.list", {"path": d}, user, request_timeout)
            for e in r.get("entries") or []:
                entry = to_entry(e)
                out.append(entry)
                if entry.type == FileType.DIR and level < depth:
                    todo.append((entry.path, level + 1))
        return out

    def exists(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> bool:
        """True when something is at path (a dangling symlink counts); False when nothing is."""
        try:
            self._call("fs.stat", {"path": path}, user, request_timeout)
            return True
        except FileNotFoundException:
            return False

    def get_info(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> EntryInfo:
        """Describes a file or directory (a final symlink is not followed)."""
        return to_entry(self._call("fs.stat", {"path": path}, user, request_timeout))

    def remove(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> None:
        """Removes a file, or a directory with everything in it."""
        self._call("fs.remove", {"path": path, "recursive": True}, user, request_timeout)

    def rename(self, old_path: str, new_path: str, user: Optional[Username] = None,
               request_timeout: Optional[float] = None) -> EntryInfo:
        """Renames (moves) a file or directory; returns what is now at new_path."""
        self._call("fs.rename", {"from": old_path, "to": new_path}, user, request_timeout, ("from", "to"))
        return self.get_info(new_path, user=user, request_timeout=request_timeout)

    def make_dir(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> bool:
        """Makes a directory and its parents; False when it already existed."""
        r = self._call("fs.mkdir", {"path": path, "parents": True}, user, request_timeout)
        return r.get("created") is True

    def watch_dir(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None,
                  recursive: bool = False) -> WatchHandle:
        """
        Watches a directory (its whole tree with ``recursive``, new
        directories included); poll with ``get_new_events()``.
        FileNotFoundException when it does not exist.
        """
        box: List[WatchHandle] = []

        def subscribe(r: Any) -> None:
            # before the next line is read: events may follow the reply at once
            box.append(WatchHandle(self._link, int(r["watch"])))

        p = as_account(self._link.acct, user, self._link.params(path=path, recursive=bool(recursive)))
        self._link.conn.call("fs.watch", p, on_result=subscribe, timeout=rt(request_timeout))
        return box[0]

"""
sbx.files' protocol, once for both forms (see ``_drive.py``): the params of
each call, the checks of its arguments, and its reply as E2B's objects.

File bytes go on the data connection (``_stream.py``) as binary frames with
credit both ways: ``fs.read_stream`` and ``fs.write_stream``.  A daemon whose
``hello`` has no ``streams`` gets the JSON path instead: ``fs.read`` and
``fs.write`` in 1 MiB pieces of base64 with offsets.
"""
from typing import Any, Dict, List, Optional, Tuple

from ._drive import EMIT, Chunks, Proto, collect
from ._link import Link, rt
from ._stream import CREDIT, DATA, END, U32, stream_id
from ._wire import CHUNK, as_account, b64, basename, decode_data, entry_fields, to_entry, write_chunks
from .exceptions import FileNotFoundException, InvalidArgumentException, SandboxException, TimeoutException
from .models import EntryInfo, FileType, WriteInfo

FORMATS = ("text", "bytes", "stream")


class FilesOps:
    """The operations of one Sandbox's ``files``, as generators for ``run`` / ``arun``."""

    def __init__(self, link: Link) -> None:
        self._link = link

    def params(self, params: Dict[str, Any], user: Optional[str], paths: Tuple[str, ...] = ("path",)) -> Dict[str, Any]:
        return as_account(self._link.acct, user, self._link.params(**params), paths)

    def call(self, method: str, params: Dict[str, Any], user: Optional[str], request_timeout: Optional[float],
             paths: Tuple[str, ...] = ("path",)) -> Proto:
        return (yield (self._link.conn.call, method, self.params(params, user, paths), None, rt(request_timeout)))

    # reading

    def read(self, path: str, format: str, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        """The file as text, a bytearray, or Chunks (format ``stream``); a missing one raises before any byte."""
        if format not in FORMATS:
            raise InvalidArgumentException(f"files.read: format {format!r} is not supported (text, bytes, stream)")
        dc = yield (self._link.conn.data,)
        if dc is not None:
            r = yield (self._link.conn.call, "fs.read_stream", self.params({"path": path}, user), None, rt(request_timeout))
            chunks = self._frames(dc, stream_id(r, "fs.read_stream"))
            next(chunks)  # started: a stream nobody reads ends at the daemon when it is dropped
        else:
            first, eof = yield from self._piece(path, 0, user, request_timeout)
            chunks = self._pieces(path, first, eof, user, request_timeout)
        if format == "stream":
            return Chunks(chunks)
        out = bytearray()
        yield from collect(chunks, out)
        return out.decode("utf-8", "replace") if format == "text" else out

    def _frames(self, dc: Any, sid: int) -> Proto:
        """A read stream's DATA, each given credit back once the consumer took it (primed by one next())."""
        done = False
        try:
            yield (EMIT, None)  # the priming stop, never run
            while True:
                kind, value = yield from _over_on_error((dc.next, sid, "fs.read_stream"))
                if kind == END:
                    done = True
                    return
                if kind == DATA:
                    yield (EMIT, bytes(value))
                    yield (dc.send, CREDIT, sid, U32.pack(len(value)))
        except _StreamOver as e:
            done = True
            raise e.error from None
        finally:
            dc.finish(sid, early=not done)

    def _piece(self, path: str, offset: int, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        r = yield from self.call("fs.read", {"path": path, "offset": offset, "length": CHUNK, "encoding": "base64"},
                                 user, request_timeout)
        data = decode_data(r.get("data"), r.get("encoding"))
        return data, bool(r.get("eof")) or not data

    def _pieces(self, path: str, first: bytes, eof: bool, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        offset = len(first)
        if first:
            yield (EMIT, first)
        while not eof:
            data, eof = yield from self._piece(path, offset, user, request_timeout)
            offset += len(data)
            if data:
                yield (EMIT, data)

    # writing

    def write(self, path: Any, data: Any, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        """Writes a whole file, replacing it."""
        if not isinstance(path, str) or path == "":
            raise InvalidArgumentException("files.write: path must be a non-empty string")
        if data is None:
            raise InvalidArgumentException("files.write: no data")
        dc = yield (self._link.conn.data,)
        if dc is not None:
            yield from self._write_frames(dc, path, data, user, request_timeout)
        else:
            offset = 0
            for piece in write_chunks(data):
                yield from self.call("fs.write", {"path": path, "offset": offset, "data": b64(piece), "encoding": "base64"},
                                     user, request_timeout)
                offset += len(piece)
        return WriteInfo(name=basename(path), type=FileType.FILE, path=path)

    def _write_frames(self, dc: Any, path: str, data: Any, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        pieces = write_chunks(data)  # checks data's type before a stream is made
        first = next(pieces)
        r = yield (self._link.conn.call, "fs.write_stream", self.params({"path": path}, user), None, rt(request_timeout))
        sid = stream_id(r, "fs.write_stream")
        done = False
        sent = 0
        try:
            for piece in _chain(first, pieces):
                view = memoryview(piece)
                while len(view):
                    n = yield from _over_on_error((dc.reserve, sid, len(view), "fs.write_stream"))
                    yield (dc.send, DATA, sid, view[:n])
                    view = view[n:]
                    sent += n
            yield (dc.send, END, sid)
            while True:
                kind, size = yield from _over_on_error((dc.next, sid, "fs.write_stream"))
                if kind == END:
                    done = True
                    if size is not None and size != sent:
                        raise SandboxException(f"files.write: the daemon wrote {size} bytes of {sent}")
                    return
        except _StreamOver as e:
            done = True
            raise e.error from None
        finally:
            dc.finish(sid, early=not done)

    def write_files(self, files: Any, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        if not isinstance(files, list):
            raise InvalidArgumentException("files.write_files: files must be a list of WriteEntry")
        out = []
        for f in files:
            path, data = entry_fields(f)
            out.append((yield from self.write(path, data, user, request_timeout)))
        return out

    # the rest

    def list(self, path: str, depth: Optional[int], user: Optional[str], request_timeout: Optional[float]) -> Proto:
        if depth is None:
            depth = 1
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise InvalidArgumentException("files.list: depth should be at least 1")
        out: List[EntryInfo] = []
        todo = [(path, 1)]
        while todo:
            d, level = todo.pop(0)
            r = yield from self.call("fs.list", {"path": d}, user, request_timeout)
            for e in r.get("entries") or []:
                entry = to_entry(e)
                out.append(entry)
                if entry.type == FileType.DIR and level < depth:
                    todo.append((entry.path, level + 1))
        return out

    def exists(self, path: str, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        try:
            yield from self.call("fs.stat", {"path": path}, user, request_timeout)
            return True
        except FileNotFoundException:
            return False

    def get_info(self, path: str, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        return to_entry((yield from self.call("fs.stat", {"path": path}, user, request_timeout)))

    def remove(self, path: str, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        yield from self.call("fs.remove", {"path": path, "recursive": True}, user, request_timeout)

    def rename(self, old_path: str, new_path: str, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        yield from self.call("fs.rename", {"from": old_path, "to": new_path}, user, request_timeout, ("from", "to"))
        return (yield from self.get_info(new_path, user, request_timeout))

    def make_dir(self, path: str, user: Optional[str], request_timeout: Optional[float]) -> Proto:
        r = yield from self.call("fs.mkdir", {"path": path, "parents": True}, user, request_timeout)
        return r.get("created") is True

    def watch(self, path: str, user: Optional[str], request_timeout: Optional[float], recursive: bool,
              subscribe: Any) -> Proto:
        """fs.watch; subscribe(watch_id) runs before the next line is read (events may follow the reply at once)."""
        p = self.params({"path": path, "recursive": bool(recursive)}, user)
        yield (self._link.conn.call, "fs.watch", p, lambda r: subscribe(int(r["watch"])), rt(request_timeout))


class _StreamOver(Exception):
    """The stream's ERROR (or its connection's end): nothing to end at the daemon."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _over_on_error(op: Any) -> Proto:
    try:
        return (yield op)
    except TimeoutException:
        raise  # the stream is still open at the daemon: finish() ends it
    except SandboxException as e:
        raise _StreamOver(e) from None


def _chain(first: bytes, rest: Any) -> Any:
    if first:
        yield first
    yield from rest

"""sbx.files of an AsyncSandbox, as E2B's async Filesystem (same accounts and paths as the blocking form)."""
import asyncio
from typing import IO, Any, AsyncIterator, Dict, List, Optional, Tuple, Union

from .._link import Link, rt
from .._wire import CHUNK, as_account, b64, basename, decode_data, entry_fields, raw_bytes, seconds, to_entry, write_chunks
from ..exceptions import FileNotFoundException, InvalidArgumentException, SandboxException, TimeoutException
from ..models import EntryInfo, FilesystemEvent, FilesystemEventType, FileType, Username, WriteEntry, WriteInfo
from .command_handle import OutputHandler, call_handler


class AsyncWatchHandle:
    """A directory being watched: ``on_event`` gets each change, ``on_exit`` the end; ``stop()`` ends it."""

    def __init__(self, link: Link, watch_id: int, on_event: OutputHandler[FilesystemEvent],
                 on_exit: Optional[OutputHandler[Optional[Exception]]], timeout: Optional[float]) -> None:
        self._link = link
        self._watch_id = watch_id
        self._on_event = on_event
        self._on_exit = on_exit
        self._timeout = timeout
        self._q: "asyncio.Queue[Any]" = asyncio.Queue()
        self._key = ("w", link.sandbox_id, watch_id)
        self._server_ended = False
        link.conn.subscribe(self._key, lambda _m, p: self._q.put_nowait(("event", p)))
        self._cancel_close = link.conn.on_close(lambda e: self._q.put_nowait(("closed", e)))
        self._task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        error: Optional[Exception] = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout if self._timeout else None
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    kind, value = await asyncio.wait_for(self._q.get(), left)
                except asyncio.TimeoutError:
                    error = TimeoutException(f"watch {self._watch_id} ran for its timeout ({self._timeout} s)")
                    break
                if kind == "stop":
                    break
                if kind == "closed":
                    error = SandboxException(f"watch {self._watch_id}: {value}")
                    break
                t = str(value.get("type"))
                if t == "end":
                    self._server_ended = True
                    error = SandboxException(f"watch {self._watch_id}: {value.get('message') or 'ended'}")
                    break
                try:
                    et = FilesystemEventType(t)
                except ValueError:
                    continue
                msg = value.get("message") if isinstance(value.get("message"), str) else None
                await call_handler(self._on_event, FilesystemEvent(name=str(value.get("name") or ""), type=et, message=msg,
                                                                     name_raw=raw_bytes(value.get("name_raw"))))
        except Exception as e:  # noqa: BLE001 - on_event's failure ends the watch
            error = e
        finally:
            self._link.conn.unsubscribe(self._key)
            self._cancel_close()
        if not self._server_ended and not self._link.conn.closed:
            try:
                await self._link.conn.call("fs.unwatch", self._link.params(watch=self._watch_id))
            except SandboxException:
                pass  # the watch or the sandbox ended meanwhile
        await call_handler(self._on_exit, error)

    async def stop(self) -> None:
        """Stops watching; no event comes after it returns.  ``on_exit`` gets None."""
        self._q.put_nowait(("stop", None))
        await asyncio.shield(self._task)


class Filesystem:
    """Files and directories of the sandbox (asyncio)."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def _call(self, method: str, params: Dict[str, Any], user: Optional[str], request_timeout: Optional[float],
                    paths: Tuple[str, ...] = ("path",)) -> Any:
        p = as_account(self._link.acct, user, self._link.params(**params), paths)
        return await self._link.conn.call(method, p, timeout=rt(request_timeout))

    async def _read_chunk(self, path: str, offset: int, user: Optional[str], request_timeout: Optional[float]) -> Tuple[bytes, bool]:
        r = await self._call("fs.read", {"path": path, "offset": offset, "length": CHUNK, "encoding": "base64"}, user, request_timeout)
        data = decode_data(r.get("data"), r.get("encoding"))
        return data, bool(r.get("eof")) or not data

    async def read(self, path: str, format: str = "text", user: Optional[Username] = None,
                   request_timeout: Optional[float] = None) -> Any:
        """Reads a file as ``text``, ``bytes`` (a bytearray) or ``stream`` (an async iterator of bytes, 1 MiB at a time)."""
        if format not in ("text", "bytes", "stream"):
            raise InvalidArgumentException(f"files.read: format {format!r} is not supported (text, bytes, stream)")
        first, eof = await self._read_chunk(path, 0, user, request_timeout)
        if format == "stream":
            return self._stream(path, first, eof, user, request_timeout)
        out = bytearray(first)
        while not eof:
            data, eof = await self._read_chunk(path, len(out), user, request_timeout)
            out += data
        return out.decode("utf-8", "replace") if format == "text" else out

    async def _stream(self, path: str, first: bytes, eof: bool, user: Optional[str], request_timeout: Optional[float]) -> AsyncIterator[bytes]:
        offset = len(first)
        if first:
            yield first
        while not eof:
            data, eof = await self._read_chunk(path, offset, user, request_timeout)
            offset += len(data)
            if data:
                yield data

    async def write(self, path: str, data: Union[str, bytes, IO[Any]], user: Optional[Username] = None,
                    request_timeout: Optional[float] = None) -> WriteInfo:
        """Writes a file, replacing it (missing parent directories are made)."""
        return await self._write_one(path, data, user, request_timeout)

    async def write_files(self, files: List[WriteEntry], user: Optional[Username] = None,
                          request_timeout: Optional[float] = None) -> List[WriteInfo]:
        """Writes several files, one after the other."""
        if not isinstance(files, list):
            raise InvalidArgumentException("files.write_files: files must be a list of WriteEntry")
        out = []
        for f in files:
            path, data = entry_fields(f)
            out.append(await self._write_one(path, data, user, request_timeout))
        return out

    async def _write_one(self, path: Any, data: Any, user: Optional[str], request_timeout: Optional[float]) -> WriteInfo:
        if not isinstance(path, str) or path == "":
            raise InvalidArgumentException("files.write: path must be a non-empty string")
        if data is None:
            raise InvalidArgumentException("files.write: no data")
        offset = 0
        for piece in write_chunks(data):
            await self._call("fs.write", {"path": path, "offset": offset, "data": b64(piece), "encoding": "base64"}, user, request_timeout)
            offset += len(piece)
        return WriteInfo(name=basename(path), type=FileType.FILE, path=path)

    async def list(self, path: str, depth: Optional[int] = 1, user: Optional[Username] = None,
                   request_timeout: Optional[float] = None) -> List[EntryInfo]:
        """The entries of a directory (and, with ``depth`` > 1, of its subdirectories)."""
        if depth is None:
            depth = 1
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise InvalidArgumentException("files.list: depth should be at least 1")
        out: List[EntryInfo] = []
        todo = [(path, 1)]
        while todo:
            d, level = todo.pop(0)
            r = await self._call("fs.list", {"path": d}, user, request_timeout)
            for e in r.get("entries") or []:
                entry = to_entry(e)
                out.append(entry)
                if entry.type == FileType.DIR and level < depth:
                    todo.append((entry.path, level + 1))
        return out

    async def exists(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> bool:
        """True when something is at path."""
        try:
            await self._call("fs.stat", {"path": path}, user, request_timeout)
            return True
        except FileNotFoundException:
            return False

    async def get_info(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> EntryInfo:
        """Describes a file or directory."""
        return to_entry(await self._call("fs.stat", {"path": path}, user, request_timeout))

    async def remove(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> None:
        """Removes a file, or a directory with everything in it."""
        await self._call("fs.remove", {"path": path, "recursive": True}, user, request_timeout)

    async def rename(self, old_path: str, new_path: str, user: Optional[Username] = None,
                     request_timeout: Optional[float] = None) -> EntryInfo:
        """Renames (moves) a file or directory; returns what is now at new_path."""
        await self._call("fs.rename", {"from": old_path, "to": new_path}, user, request_timeout, ("from", "to"))
        return await self.get_info(new_path, user=user, request_timeout=request_timeout)

    async def make_dir(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> bool:
        """Makes a directory and its parents; False when it already existed."""
        r = await self._call("fs.mkdir", {"path": path, "parents": True}, user, request_timeout)
        return r.get("created") is True

    async def watch_dir(self, path: str, on_event: OutputHandler[FilesystemEvent],
                        on_exit: Optional[OutputHandler[Optional[Exception]]] = None, user: Optional[Username] = None,
                        request_timeout: Optional[float] = None, timeout: Optional[float] = 60,
                        recursive: bool = False) -> AsyncWatchHandle:
        """
        Watches a directory: ``on_event`` gets each change (name relative to
        path).  It ends at ``stop()``, after ``timeout`` seconds (default 60,
        as E2B; 0: never), or when the directory or the sandbox goes;
        ``on_exit`` gets None after stop() and the error otherwise.
        """
        if not callable(on_event):
            raise InvalidArgumentException("files.watch_dir: on_event must be callable")
        t = seconds(timeout, "files.watch_dir")
        box: List[AsyncWatchHandle] = []

        def subscribe(r: Any) -> None:
            box.append(AsyncWatchHandle(self._link, int(r["watch"]), on_event, on_exit, t))

        p = as_account(self._link.acct, user, self._link.params(path=path, recursive=bool(recursive)))
        await self._link.conn.call("fs.watch", p, on_result=subscribe, timeout=rt(request_timeout))
        return box[0]

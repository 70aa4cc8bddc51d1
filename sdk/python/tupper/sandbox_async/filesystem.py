"""sbx.files of an AsyncSandbox, as E2B's async Filesystem (same accounts and paths as the blocking form)."""
import asyncio
from typing import IO, Any, List, Optional, Union

from .._drive import Chunks, arun, arun_iter
from .._files import FilesOps
from .._link import Link
from .._wire import raw_bytes, seconds
from ..exceptions import InvalidArgumentException, SandboxException, TimeoutException
from ..models import EntryInfo, FilesystemEvent, FilesystemEventType, Username, WriteEntry, WriteInfo
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
    """Files and directories of the sandbox (asyncio; the protocol is ``_files.FilesOps``)."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._ops = FilesOps(link)

    async def read(self, path: str, format: str = "text", user: Optional[Username] = None,
                   request_timeout: Optional[float] = None) -> Any:
        """Reads a file as ``text``, ``bytes`` (a bytearray) or ``stream`` (an async iterator of bytes)."""
        v = await arun(self._ops.read(path, format, user, request_timeout))
        return arun_iter(v.gen) if isinstance(v, Chunks) else v

    async def write(self, path: str, data: Union[str, bytes, IO[Any]], user: Optional[Username] = None,
                    request_timeout: Optional[float] = None) -> WriteInfo:
        """Writes a file, replacing it (missing parent directories are made)."""
        return await arun(self._ops.write(path, data, user, request_timeout))

    async def write_files(self, files: List[WriteEntry], user: Optional[Username] = None,
                          request_timeout: Optional[float] = None) -> List[WriteInfo]:
        """Writes several files, one after the other."""
        return await arun(self._ops.write_files(files, user, request_timeout))

    async def list(self, path: str, depth: Optional[int] = 1, user: Optional[Username] = None,
                   request_timeout: Optional[float] = None) -> List[EntryInfo]:
        """The entries of a directory (and, with ``depth`` > 1, of its subdirectories)."""
        return await arun(self._ops.list(path, depth, user, request_timeout))

    async def exists(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> bool:
        """True when something is at path."""
        return await arun(self._ops.exists(path, user, request_timeout))

    async def get_info(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> EntryInfo:
        """Describes a file or directory."""
        return await arun(self._ops.get_info(path, user, request_timeout))

    async def remove(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> None:
        """Removes a file, or a directory with everything in it."""
        await arun(self._ops.remove(path, user, request_timeout))

    async def rename(self, old_path: str, new_path: str, user: Optional[Username] = None,
                     request_timeout: Optional[float] = None) -> EntryInfo:
        """Renames (moves) a file or directory; returns what is now at new_path."""
        return await arun(self._ops.rename(old_path, new_path, user, request_timeout))

    async def make_dir(self, path: str, user: Optional[Username] = None, request_timeout: Optional[float] = None) -> bool:
        """Makes a directory and its parents; False when it already existed."""
        return await arun(self._ops.make_dir(path, user, request_timeout))

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
        await arun(self._ops.watch(path, user, request_timeout, recursive,
                                   lambda w: box.append(AsyncWatchHandle(self._link, w, on_event, on_exit, t))))
        return box[0]

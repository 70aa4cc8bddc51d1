"""
One connection to the daemon: JSON-RPC 2.0, one JSON object per line, over
its unix socket (docs/protocol.md).

Both forms share :class:`_Dispatch`, which matches replies to requests by id
and hands notifications to whoever subscribed to their key: ``("p", sandbox,
pid)`` for a process's output and exit, ``("w", sandbox, watch)`` for a
watch's events.  :class:`Connection` reads on one daemon thread;
:class:`AsyncConnection` on one asyncio task.  Every line read is bounded
(:data:`MAX_LINE`); a longer one closes the connection.
"""
import asyncio
import json
import os
import socket as _socket
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._drive import arun, run
from ._stream import PROCESS_STREAMS, STREAMS_VERSION, AsyncDataConn, DataConn, end_task
from .exceptions import SandboxException, TimeoutException, from_rpc_error

#: The protocol version this package speaks.
PROTOCOL = 1
#: How this client introduces itself in ``hello``.
CLIENT = "tupper-python/0.1.0"
#: How long a request waits for its reply unless told otherwise (seconds), as E2B.
DEFAULT_REQUEST_TIMEOUT = 60.0
#: What this client says in ``hello``.  protocol.md has a client send ``streams: 1`` too, but
#: the daemon's hello refuses that parameter (-32602), so the frames' version is read from
#: the reply only, as the TypeScript SDK does.
HELLO = {"protocol": PROTOCOL, "client": CLIENT}
#: The longest line read from the daemon: its own bound on a line (16 MiB).
MAX_LINE = 16 << 20

Notification = Callable[[str, Dict[str, Any]], None]
Key = Tuple[Any, ...]


#: The system daemon's socket (tupper.socket's); ``$TUPPER_SYSTEM_SOCKET`` moves it, for tests.
SYSTEM_SOCKET = "/run/tupper/tupper.sock"


def _system_socket(environ: Optional[Dict[str, str]] = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("TUPPER_SYSTEM_SOCKET") or SYSTEM_SOCKET


def default_socket(uid: Optional[int] = None, environ: Optional[Dict[str, str]] = None) -> str:
    """
    Where the daemon listens, as the daemon and the TypeScript SDK decide it:
    ``$TUPPER_SOCKET``, else ``/run/tupper/tupper.sock`` for root, else
    ``$XDG_RUNTIME_DIR/tupper.sock``, else ``/tmp/tupper-UID/tupper.sock``.
    ``uid`` and ``environ`` (default: this process's) are for tests.
    """
    env = os.environ if environ is None else environ
    named = env.get("TUPPER_SOCKET")
    if named:
        return named
    uid = os.getuid() if uid is None else uid
    if uid == 0:
        return _system_socket(env)
    run = env.get("XDG_RUNTIME_DIR")
    if run:
        return os.path.join(run, "tupper.sock")
    return f"/tmp/tupper-{uid}/tupper.sock"


def default_sockets(uid: Optional[int] = None, environ: Optional[Dict[str, str]] = None) -> List[str]:
    """
    Where a client given no socket looks, in order (docs/install.md): the
    :func:`default_socket`, then, for a user that is not root and set no
    ``$TUPPER_SOCKET``, the system's ``/run/tupper/tupper.sock`` (tried when
    nothing answers at the first and it exists: a member of the tupper group
    reaches the system daemon as it is).
    """
    env = os.environ if environ is None else environ
    first = default_socket(uid, env)
    system = _system_socket(env)
    if env.get("TUPPER_SOCKET") or first == system:
        return [first]
    return [first, system]


def _places(socket: Optional[str]) -> List[str]:
    """The sockets to try: the one named, else :func:`default_sockets` (a
    system socket that does not exist fails as nobody there, ENOENT)."""
    return [socket] if socket else default_sockets()


def _absent(e: OSError) -> bool:
    return isinstance(e, (FileNotFoundError, ConnectionRefusedError))


def _unreachable(tried: List[Tuple[str, BaseException]]) -> SandboxException:
    where = " nor at ".join(f"{p} ({e})" for p, e in tried)
    return SandboxException(
        f"cannot reach the tupper daemon at {where}: is `tupper daemon` running? "
        "Pass socket=... or set TUPPER_SOCKET to use another one"
    )


def _dial(socket: Optional[str], connect: Callable[[str], Any]) -> Any:
    """
    (path, connection) of the first socket that answers (a generator for
    ``_drive.run`` / ``arun``): one that is not there is passed over, one that
    is there but refuses this user is said at once.
    """
    tried: List[Tuple[str, BaseException]] = []
    for path in _places(socket):
        try:
            return path, (yield (connect, path))
        except OSError as e:
            tried.append((path, e))
            if not _absent(e):
                break  # there, but not this user's to use: say so
    raise _unreachable(tried) from tried[-1][1]


def _connect_unix(path: str) -> _socket.socket:
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.connect(path)
    except BaseException:
        s.close()
        raise
    return s


def _check_timeout(value: Optional[float], what: str) -> Optional[float]:
    """A request timeout: None or 0 for none, else a positive number of seconds."""
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != value:
        from .exceptions import InvalidArgumentException

        raise InvalidArgumentException(f"{what}: bad request_timeout {value!r}")
    return float(value)


def _no_answer(method: str, limit: Optional[float]) -> TimeoutException:
    return TimeoutException(
        f"{method}: no answer from the daemon in {limit} s: "
        "the 'request_timeout' option can be used to increase this timeout"
    )


def subscription_key(method: str, params: Dict[str, Any]) -> Key:
    """The key a notification is delivered by."""
    if method == "fs.event":
        return ("w", params.get("sandbox"), params.get("watch"))
    return ("p", params.get("sandbox"), params.get("pid"))


class _Pending:
    __slots__ = ("method", "on_result", "result", "error", "event", "future")

    def __init__(self, method: str, on_result: Optional[Callable[[Any], None]]) -> None:
        self.method = method
        self.on_result = on_result
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.event: Optional[threading.Event] = None
        self.future: Optional["asyncio.Future[Any]"] = None


class _Dispatch:
    """Request ids, replies and notifications; shared by both connection forms."""

    def __init__(self, socket_path: str, request_timeout: Optional[float]) -> None:
        self.socket_path = socket_path
        self.request_timeout = request_timeout
        self._next_id = 1
        self._pending: Dict[int, _Pending] = {}
        self._subs: Dict[Key, Notification] = {}
        self._close_handlers: List[Callable[[BaseException], None]] = []
        self._lock = threading.Lock()
        self.closed_with: Optional[BaseException] = None
        #: the frames version of the daemon's data plane (hello's ``streams``); None: it has none
        self.streams: Optional[int] = None
        #: hello's ``process_streams``: 1 when process.start, process.connect and pty.create take
        #: ``streams`` (a process's bytes on the data connection); None: process.output only
        self.process_streams: Optional[int] = None
        self._dc: Any = None

    def _took_hello(self, hello: Any) -> None:
        if not isinstance(hello, dict) or hello.get("protocol") != PROTOCOL:
            got = hello.get("protocol") if isinstance(hello, dict) else None
            raise SandboxException(f"the daemon speaks protocol {got}, not {PROTOCOL}")
        self.streams = STREAMS_VERSION if hello.get("streams") == STREAMS_VERSION else None
        ps = hello.get("process_streams")
        self.process_streams = PROCESS_STREAMS if self.streams is not None and ps == PROCESS_STREAMS else None

    def _live_dc(self) -> Any:
        """The data connection when one is open and up; False when the daemon has no data plane."""
        if self.streams is None:
            return False
        if self.closed_with is not None:
            raise self.closed_with
        dc = self._dc
        return dc if dc is not None and not dc.closed else None

    @property
    def closed(self) -> bool:
        """True once the connection is gone."""
        return self.closed_with is not None

    def subscribe(self, key: Key, fn: Notification) -> None:
        """Delivers the notifications of key to fn (on the reading thread or task)."""
        with self._lock:
            self._subs[key] = fn

    def unsubscribe(self, key: Key) -> None:
        with self._lock:
            self._subs.pop(key, None)

    def on_close(self, fn: Callable[[BaseException], None]) -> Callable[[], None]:
        """Calls fn once when the connection goes away; returns a function that cancels it."""
        with self._lock:
            self._close_handlers.append(fn)

        def cancel() -> None:
            with self._lock:
                if fn in self._close_handlers:
                    self._close_handlers.remove(fn)

        return cancel

    def _begin(self, method: str, params: Dict[str, Any], on_result: Optional[Callable[[Any], None]]) -> Tuple[_Pending, int, bytes]:
        """A request's pending entry, id and line; the connection's error when it is gone."""
        if self.closed_with is not None:
            raise self.closed_with
        p = _Pending(method, on_result)
        rid, line = self._encode(method, params, p)
        return p, rid, line

    def _send_failed(self, rid: int, e: OSError) -> BaseException:
        self._forget(rid)
        self._shutdown(SandboxException(f"the connection to the tupper daemon failed: {e}"))
        assert self.closed_with is not None
        return self.closed_with

    def _limit(self, timeout: Any, method: str) -> Optional[float]:
        return self.request_timeout if timeout == "default" else _check_timeout(timeout, method)

    def _encode(self, method: str, params: Dict[str, Any], p: _Pending) -> Tuple[int, bytes]:
        with self._lock:
            rid = self._next_id
            self._next_id += 1
            self._pending[rid] = p
        line = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}, separators=(",", ":"))
        return rid, line.encode("utf-8") + b"\n"

    def _forget(self, rid: int) -> bool:
        with self._lock:
            return self._pending.pop(rid, None) is not None

    def _settle(self, p: _Pending) -> None:
        raise NotImplementedError

    def _on_line(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            self._shutdown(SandboxException("the daemon sent a line that is not JSON"))
            return
        if not isinstance(msg, dict):
            return
        if isinstance(msg.get("method"), str) and "id" not in msg:
            params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
            with self._lock:
                fn = self._subs.get(subscription_key(msg["method"], params))
            if fn is not None:
                fn(msg["method"], params)
            return
        rid = msg.get("id")
        with self._lock:
            p = self._pending.pop(rid, None) if isinstance(rid, int) else None
        if p is None:
            return  # a late reply to a request that timed out
        err = msg.get("error")
        if err is not None:
            p.error = from_rpc_error(err if isinstance(err, dict) else {}, p.method)
        else:
            p.result = msg.get("result")
            if p.on_result is not None:
                try:
                    # runs before the next line is read: a caller that must see
                    # every notification after the reply subscribes here
                    p.on_result(p.result)
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    p.error = e
        self._settle(p)

    def _shutdown(self, err: BaseException) -> None:
        with self._lock:
            if self.closed_with is not None:
                return
            self.closed_with = err
            pending = list(self._pending.values())
            self._pending.clear()
            handlers = list(self._close_handlers)
            self._close_handlers.clear()
            self._subs.clear()
        for p in pending:
            p.error = err
            self._settle(p)
        for h in handlers:
            try:
                h(err)
            except Exception:  # noqa: BLE001 - a handler's failure must not stop the others
                pass


class Connection(_Dispatch):
    """A blocking connection; replies and notifications are read on one daemon thread."""

    def __init__(self, sock: _socket.socket, socket_path: str, request_timeout: Optional[float]) -> None:
        super().__init__(socket_path, request_timeout)
        self._sock = sock
        self._wlock = threading.Lock()
        self._dlock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name="tupper-reader", daemon=True)
        self._reader.start()

    @classmethod
    def open(cls, socket: Optional[str] = None, request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> "Connection":
        """Connects to the daemon and says hello (protocol 1)."""
        timeout = _check_timeout(request_timeout, "connect")
        path, s = run(_dial(socket, _connect_unix))
        conn = cls(s, path, timeout)
        try:
            conn._took_hello(conn.call("hello", HELLO))
        except BaseException:
            conn.close()
            raise
        return conn

    def call(
        self,
        method: str,
        params: Dict[str, Any],
        on_result: Optional[Callable[[Any], None]] = None,
        timeout: Any = "default",
    ) -> Any:
        """Sends a request and returns its result (raising the daemon's error as an exception)."""
        p, rid, line = self._begin(method, params, on_result)
        p.event = threading.Event()
        try:
            with self._wlock:
                self._sock.sendall(line)
        except OSError as e:
            raise self._send_failed(rid, e) from e
        limit = self._limit(timeout, method)
        if not p.event.wait(limit):
            if self._forget(rid):
                raise _no_answer(method, limit)
            p.event.wait()
        if p.error is not None:
            raise p.error
        return p.result

    def _settle(self, p: _Pending) -> None:
        assert p.event is not None
        p.event.set()

    def _read_loop(self) -> None:
        buf = bytearray()
        err: BaseException = SandboxException("the connection to the tupper daemon closed")
        try:
            while True:
                chunk = self._sock.recv(1 << 16)
                if not chunk:
                    break
                start = 0
                while True:
                    nl = chunk.find(b"\n", start)
                    if nl < 0:
                        break
                    buf += chunk[start:nl]
                    start = nl + 1
                    if len(buf) > MAX_LINE:
                        raise SandboxException(f"the daemon sent a line over {MAX_LINE} bytes")
                    if buf:
                        self._on_line(bytes(buf))
                    buf.clear()
                    if self.closed_with is not None:
                        return
                buf += chunk[start:]
                if len(buf) > MAX_LINE:
                    raise SandboxException(f"the daemon sent a line over {MAX_LINE} bytes")
        except SandboxException as e:
            err = e
        except OSError as e:
            if self.closed_with is None:
                err = SandboxException(f"the connection to the tupper daemon failed: {e}")
        finally:
            self._shutdown(err)
            try:
                self._sock.close()
            except OSError:
                pass

    def data(self) -> Optional[DataConn]:
        """
        The data connection (binary stream frames), opened on first use and
        again after it went down; None when the daemon's hello had no
        ``streams`` (the JSON path serves then).
        """
        with self._dlock:
            dc = self._live_dc()
            if dc is False:
                return None
            if dc is None:
                old, self._dc = self._dc, None
                if old is not None:
                    old.close()
                self._dc = DataConn.open(self)
            return self._dc

    def close(self) -> None:
        """Closes the connection (and its data connection); what still waits on it fails."""
        with self._lock:
            self._close_handlers.clear()
        self._shutdown(SandboxException("the connection was closed"))
        try:
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        with self._dlock:
            dc, self._dc = self._dc, None
        if dc is not None:
            dc.close()
        if threading.current_thread() is not self._reader:
            self._reader.join(5)


class AsyncConnection(_Dispatch):
    """An asyncio connection; replies and notifications are read on one task."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, socket_path: str, request_timeout: Optional[float]) -> None:
        super().__init__(socket_path, request_timeout)
        self._r = reader
        self._w = writer
        self._dlock = asyncio.Lock()
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, socket: Optional[str] = None, request_timeout: Optional[float] = DEFAULT_REQUEST_TIMEOUT) -> "AsyncConnection":
        """Connects to the daemon and says hello (protocol 1)."""
        timeout = _check_timeout(request_timeout, "connect")
        path, (reader, writer) = await arun(_dial(socket, lambda p: asyncio.open_unix_connection(p, limit=MAX_LINE + 1)))
        conn = cls(reader, writer, path, timeout)
        try:
            conn._took_hello(await conn.call("hello", HELLO))
        except BaseException:
            await conn.close()
            raise
        return conn

    async def call(
        self,
        method: str,
        params: Dict[str, Any],
        on_result: Optional[Callable[[Any], None]] = None,
        timeout: Any = "default",
    ) -> Any:
        """Sends a request and returns its result (raising the daemon's error as an exception)."""
        p, rid, line = self._begin(method, params, on_result)
        p.future = asyncio.get_running_loop().create_future()
        try:
            self._w.write(line)
            await self._w.drain()
        except OSError as e:
            raise self._send_failed(rid, e) from e
        limit = self._limit(timeout, method)
        try:
            return await asyncio.wait_for(asyncio.shield(p.future), limit)
        except asyncio.TimeoutError:
            if self._forget(rid):
                raise _no_answer(method, limit) from None
            return await p.future

    def _settle(self, p: _Pending) -> None:
        assert p.future is not None
        if p.future.done():
            return
        if p.error is not None:
            p.future.set_exception(p.error)
        else:
            p.future.set_result(p.result)

    async def _read_loop(self) -> None:
        err: BaseException = SandboxException("the connection to the tupper daemon closed")
        try:
            while self.closed_with is None:
                try:
                    line = await self._r.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    break
                except asyncio.LimitOverrunError:
                    err = SandboxException(f"the daemon sent a line over {MAX_LINE} bytes")
                    break
                line = line[:-1]
                if line:
                    self._on_line(line)
        except OSError as e:
            err = SandboxException(f"the connection to the tupper daemon failed: {e}")
        except asyncio.CancelledError:
            err = SandboxException("the connection was closed")
        finally:
            self._shutdown(err)
            self._w.close()

    async def data(self) -> Optional[AsyncDataConn]:
        """The data connection, as :meth:`Connection.data`."""
        async with self._dlock:
            dc = self._live_dc()
            if dc is False:
                return None
            if dc is None:
                old, self._dc = self._dc, None
                if old is not None:
                    await old.close()
                self._dc = await AsyncDataConn.open(self)
            return self._dc

    async def close(self) -> None:
        """Closes the connection (and its data connection); what still waits on it fails."""
        with self._lock:
            self._close_handlers.clear()
        self._shutdown(SandboxException("the connection was closed"))
        self._w.close()
        dc, self._dc = self._dc, None
        if dc is not None:
            await dc.close()
        await end_task(self._task, self._w)

"""
The data plane (docs/protocol.md, "Stream frames"): file bytes as binary
frames on a second connection to the daemon's socket, with credit both ways,
instead of base64 inside JSON.  The data connection is opened with a token
(``stream.channel`` on the control connection, then ``stream.attach`` as the
only JSON line of the new one); after the attach's reply it carries frames::

    u32 len | u8 version (1) | u8 type | u16 flags (0) | u32 sid | payload

:class:`_Streams` holds everything both forms share: the frame checks, the
streams by id and their credit.  :class:`DataConn` reads frames on one
daemon thread, :class:`AsyncDataConn` on one asyncio task; both offer the
same operations (``next``, ``reserve``, ``send``, ``finish``), which the
protocol code in ``_files.py`` drives.  A process's output streams
(docs/protocol.md, "Process streams") are *routed* instead: each of their
frames goes to a sink of the command handle that reads them (``route``), on
the reading thread or task, and the handle gives credit back (``credit``)
once its consumer took the bytes, so that no more than a window per stream
is ever held here.  One data connection per control connection, made on
first use and closed with it.
"""
import asyncio
import collections
import errno as _errno
import json
import socket as _socket
import struct
import threading
from typing import Any, Callable, Deque, Dict, Optional, Tuple

from .exceptions import SandboxException, TimeoutException, from_rpc_error

#: The frame format this package speaks (``streams`` of hello).
STREAMS_VERSION = 1
#: hello's ``process_streams`` this package speaks (process.start, process.connect, pty.create take ``streams``).
PROCESS_STREAMS = 1
#: Most payload bytes of one DATA frame.
DATA_MAX = 1 << 20
#: What the daemon may send ahead on each stream before our CREDIT.
WINDOW = 4 << 20
#: Most bytes one recv of the blocking reader asks for.
RECV = 256 << 10
#: Longest attach reply line read.
ATTACH_LINE_MAX = 4096
#: Streams that ended lately whose late frames are dropped silently (the protocol's 64).
RECENT_MAX = 64
#: Most streams a data connection keeps at once (a daemon naming more is broken).
STREAMS_MAX = 1024

OPEN, DATA, END, ERROR, CREDIT = 1, 2, 3, 4, 5
HDR = struct.Struct("<IBBHI")
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")

Event = Tuple[int, Any]


def frame(type_: int, sid: int, payload: bytes = b"") -> bytes:
    """The header of a frame with that payload, followed by the payload (for small ones)."""
    return HDR.pack(len(payload), STREAMS_VERSION, type_, 0, sid) + bytes(payload)


def header(type_: int, sid: int, length: int) -> bytes:
    return HDR.pack(length, STREAMS_VERSION, type_, 0, sid)


def stream_error(code: int, msg: str, method: str) -> SandboxException:
    """A stream's ERROR as the exception a JSON call failing with that errno raises."""
    name = _errno.errorcode.get(code, f"E{code}")
    return from_rpc_error({"code": -32002, "message": msg or name, "data": {"errno": code, "code": name}}, method)


def stream_id(r: Any, method: str) -> int:
    """The ``stream`` of a reply, checked."""
    sid = r.get("stream") if isinstance(r, dict) else None
    if isinstance(sid, bool) or not isinstance(sid, int) or not 1 <= sid < 1 << 31:
        raise SandboxException(f"{method}: the daemon's reply has no valid stream id")
    return sid


def attach_line(token: Any, window: int) -> bytes:
    if not isinstance(token, str) or not 0 < len(token) <= 256:
        raise SandboxException("stream.channel: the daemon's reply has no token")
    req = {"jsonrpc": "2.0", "id": 1, "method": "stream.attach", "params": {"token": token, "window": window}}
    return json.dumps(req, separators=(",", ":")).encode("ascii") + b"\n"


def attach_reply(line: bytes) -> None:
    """Raises unless line is a successful attach reply."""
    try:
        msg = json.loads(line)
    except ValueError:
        raise SandboxException("stream.attach: the daemon's reply is not JSON") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("result"), dict):
        err = msg.get("error") if isinstance(msg, dict) else None
        if isinstance(err, dict):
            raise from_rpc_error(err, "stream.attach")
        raise SandboxException("stream.attach: no result")
    if msg["result"].get("protocol") != STREAMS_VERSION:
        raise SandboxException(f"stream.attach: the daemon speaks frames version {msg['result'].get('protocol')}")


async def end_task(task: "asyncio.Task[Any]", writer: asyncio.StreamWriter) -> None:
    """Cancels a connection's reading task (unless it is the one calling) and waits for its socket to close."""
    if asyncio.current_task() is task:
        return
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - it was cancelled
        pass
    try:
        await writer.wait_closed()
    except (OSError, asyncio.CancelledError):
        pass


Sink = Callable[[Event], None]


class _State:
    __slots__ = ("events", "credit", "queued", "sink", "ended", "error")

    def __init__(self) -> None:
        self.events: Deque[Event] = collections.deque()
        self.credit = 0  # what we may still send
        self.queued = 0  # DATA bytes received and not yet taken: never over our window
        self.sink: Optional[Sink] = None  # a routed stream's frames go here, not to events
        self.ended = False  # the daemon's END came
        self.error: Optional[Tuple[int, str]] = None  # the daemon's ERROR came (or the connection's end)


class _Streams:
    """Frames in, streams by id, credit: the part of a data connection with no I/O."""

    def __init__(self, window: int = WINDOW) -> None:
        self._window = window
        self._streams: Dict[int, _State] = {}
        self._recent: Deque[int] = collections.deque(maxlen=RECENT_MAX)
        self._abandoned: Deque[int] = collections.deque()  # streams to end at the daemon
        self.closed_with: Optional[str] = None

    @property
    def closed(self) -> bool:
        return self.closed_with is not None

    def _state(self, sid: int) -> Optional[_State]:
        s = self._streams.get(sid)
        if s is None:
            if sid in self._recent:
                return None  # a late frame of a stream we ended: dropped
            if sid == 0 or len(self._streams) >= STREAMS_MAX:
                raise ValueError(f"the daemon sent a frame for stream {sid}, which cannot be")
            s = self._streams[sid] = _State()
        return s

    @staticmethod
    def parse_header(h: bytes) -> Tuple[int, int, int]:
        """(type, sid, len) of a header; ValueError for one that breaks the format."""
        length, version, type_, flags, sid = HDR.unpack(h)
        if version != STREAMS_VERSION or flags != 0 or length > DATA_MAX or not OPEN <= type_ <= CREDIT:
            raise ValueError("the daemon sent a bad frame header")
        return type_, sid, length

    def deliver(self, type_: int, sid: int, p: bytes) -> Optional[_State]:
        """Takes one frame; returns the stream it woke, if any.  ValueError for a malformed one."""
        if type_ == ERROR:
            if len(p) < 4:
                raise ValueError("the daemon sent a short ERROR frame")
            code = U32.unpack_from(p)[0]
            msg = bytes(p[4:4100]).decode("utf-8", "replace")
            if sid == 0:
                raise ConnectionError(msg or "the daemon closed the data connection")
            ev: Event = (ERROR, (code, msg))
        elif type_ == OPEN:
            if len(p) != 8:
                raise ValueError("the daemon sent a bad OPEN frame")
            s = self._state(sid)
            if s is not None:
                s.credit += U32.unpack_from(p, 4)[0]
            ev = (CREDIT, None)
        elif type_ == CREDIT:
            if len(p) != 4 or U32.unpack(p)[0] == 0:
                raise ValueError("the daemon sent a bad CREDIT frame")
            s = self._state(sid)
            if s is not None:
                s.credit += U32.unpack(p)[0]
            ev = (CREDIT, None)
        elif type_ == END:
            if len(p) not in (0, 8):
                raise ValueError("the daemon sent a bad END frame")
            ev = (END, U64.unpack(p)[0] if len(p) == 8 else None)
        else:
            if len(p) == 0:
                raise ValueError("the daemon sent an empty DATA frame")
            ev = (DATA, p)
        s = self._state(sid)
        if s is None:
            return None
        if ev[0] == DATA:
            s.queued += len(p)
            if s.queued > self._window:
                raise ValueError(f"the daemon sent beyond the credit of stream {sid}")
        elif ev[0] == END:
            s.ended = True
        elif ev[0] == ERROR:
            s.error = ev[1]
        if ev[0] == CREDIT:
            return s
        if s.sink is None:
            s.events.append(ev)
        else:
            s.sink(ev)
            if ev[0] != DATA:
                self.forget(sid)  # its last frame: the handle holds what it needs of it
        return s

    def route(self, sid: int, sink: Sink) -> None:
        """Hands sid's frames to sink from now on, those that came before the reply first (in order)."""
        if isinstance(sid, bool) or not isinstance(sid, int) or not 1 <= sid < 1 << 31:
            raise SandboxException(f"the daemon named a bad stream id {sid!r}")
        s = self._streams.get(sid)
        if s is None and sid in self._recent:
            sink((ERROR, (_errno.ECONNRESET, "the stream is over")))
            return
        if s is None:
            s = self._streams[sid] = _State()
        while s.events:
            ev = s.events.popleft()
            sink(ev)
            if ev[0] != DATA:
                self.forget(sid)
                return
        s.sink = sink
        if self.closed_with is not None:
            sink((ERROR, (_errno.ECONNRESET, self.closed_with)))
            self.forget(sid)

    def _credit_due(self, sid: int, n: int) -> bool:
        """A routed stream's consumer took n bytes: True when CREDIT for them is to be sent."""
        s = self._streams.get(sid)
        if s is None or n <= 0 or s.ended or s.error is not None or self.closed_with is not None:
            return False
        s.queued -= n
        return True

    def live(self, sid: int) -> bool:
        """True while sid is a stream of this connection that did not end (a routed one: its END or ERROR not in)."""
        return sid in self._streams

    def input_open(self, sid: int) -> bool:
        """True while sid (a process's stdin or terminal) takes bytes: no END, no ERROR, the connection up."""
        s = self._streams.get(sid)
        return s is not None and not s.ended and s.error is None and self.closed_with is None

    def down(self, why: str) -> None:
        if self.closed_with is None:
            self.closed_with = why
            for sid, s in list(self._streams.items()):
                if s.sink is not None:  # a routed stream: its handle hears of the end
                    s.sink((ERROR, (_errno.ECONNRESET, why)))
                    self.forget(sid)

    def pop(self, sid: int, method: str) -> Optional[Event]:
        """The next event of sid (an ERROR raised as its exception), None when there is none yet."""
        s = self._streams.get(sid)
        if s is not None and s.events:
            ev = s.events.popleft()
            if ev[0] == DATA:
                s.queued -= len(ev[1])
            if ev[0] == ERROR:
                raise stream_error(ev[1][0], ev[1][1], method)
            return ev
        if self.closed_with is not None:
            raise SandboxException(f"{method}: the data connection closed ({self.closed_with})")
        return None

    def take_credit(self, sid: int, want: int, method: str) -> int:
        """Up to want bytes of sid's credit (0: none yet); a stream's ERROR raised."""
        s = self._streams.get(sid)
        if s is not None and s.error is not None:
            raise stream_error(s.error[0], s.error[1], method)
        if self.closed_with is not None:
            raise SandboxException(f"{method}: the data connection closed ({self.closed_with})")
        if (s is not None and s.ended) or (s is None and sid in self._recent):
            raise SandboxException(f"{method}: the stream takes no more bytes (the process ended)")
        if s is None or s.credit == 0:
            return 0
        n = min(want, s.credit, DATA_MAX)
        s.credit -= n
        return n

    def forget(self, sid: int) -> None:
        """Drops sid's state; frames that still come for it are dropped."""
        self._streams.pop(sid, None)
        self._recent.append(sid)


def _timeout(method: str, limit: Optional[float]) -> TimeoutException:
    return TimeoutException(f"{method}: the data connection moved nothing in {limit} s")


def _abandon_frame(sid: int) -> bytes:
    return frame(ERROR, sid, U32.pack(_errno.ECANCELED) + b"the client stopped")


class DataConn(_Streams):
    """A blocking data connection: frames are read on one daemon thread."""

    def __init__(self, sock: _socket.socket, timeout: Optional[float]) -> None:
        super().__init__()
        self._sock = sock
        self._timeout = timeout
        self._cond = threading.Condition()
        self._wlock = threading.Lock()
        self._writer: Optional[int] = None  # the thread inside send()
        self._reader = threading.Thread(target=self._read_loop, name="tupper-data", daemon=True)
        self._reader.start()

    @classmethod
    def open(cls, conn: Any, window: int = WINDOW) -> "DataConn":
        """Opens conn's data connection (conn: a blocking Connection whose hello said streams 1)."""
        token = conn.call("stream.channel", {}).get("token")
        line = attach_line(token, window)
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.settimeout(conn.request_timeout)
            s.connect(conn.socket_path)
            s.sendall(line)
            buf = b""
            while b"\n" not in buf:  # byte by byte: frames may follow the newline at once
                b = s.recv(1)
                if not b:
                    raise SandboxException("stream.attach: the daemon closed the connection")
                buf += b
                if len(buf) > ATTACH_LINE_MAX:
                    raise SandboxException("stream.attach: the reply is too long")
            attach_reply(buf)
            s.settimeout(None)
        except _socket.timeout:
            s.close()
            raise TimeoutException("stream.attach: no answer from the daemon") from None
        except BaseException:
            s.close()
            raise
        return cls(s, conn.request_timeout)

    def _recv_into(self, view: memoryview) -> bool:
        """Fills view; False at the end of the connection."""
        got = 0
        while got < len(view):
            k = self._sock.recv_into(view[got:])
            if k == 0:
                return False
            got += k
        return True

    def _read_loop(self) -> None:
        why = "the daemon closed the data connection"
        # frames are read RECV bytes at a time, many small ones in one call (each call lets go of
        # the GIL and takes it back: one or two per frame starve the reader behind the consumer)
        buf = bytearray()
        off = 0
        try:
            while True:
                while len(buf) - off < HDR.size:
                    if off:
                        del buf[:off]
                        off = 0
                    chunk = self._sock.recv(RECV)
                    if not chunk:
                        return
                    buf += chunk
                type_, sid, length = self.parse_header(bytes(buf[off:off + HDR.size]))
                start, end = off + HDR.size, off + HDR.size + length
                if end <= len(buf):
                    p = buf[start:end]
                    off = end
                else:  # the rest of a large payload: straight into it
                    p = bytearray(length)
                    have = len(buf) - start
                    p[:have] = buf[start:]
                    buf, off = bytearray(), 0
                    if not self._recv_into(memoryview(p)[have:]):
                        return
                with self._cond:
                    if self.deliver(type_, sid, p) is not None:
                        self._cond.notify_all()
        except (ValueError, ConnectionError, OSError) as e:
            why = str(e)
        finally:
            with self._cond:
                self.down(why)
                self._cond.notify_all()
            try:
                self._sock.close()
            except OSError:
                pass

    def _wait(self, ready: Any, method: str) -> Any:
        with self._cond:
            while True:
                v = ready()
                if v:
                    return v
                if not self._cond.wait(self._timeout):
                    raise _timeout(method, self._timeout)

    def next(self, sid: int, method: str) -> Event:
        """The next event of sid: (DATA, bytes) or (END, size); its ERROR raised."""
        return self._wait(lambda: self.pop(sid, method), method)

    def reserve(self, sid: int, want: int, method: str) -> int:
        """Waits for credit on sid and takes up to want bytes of it."""
        return self._wait(lambda: self.take_credit(sid, want, method), method)

    def route(self, sid: int, sink: Sink) -> None:
        with self._cond:
            super().route(sid, sink)

    def input_open(self, sid: int) -> bool:
        with self._cond:
            return super().input_open(sid)

    def credit(self, sid: int, n: int) -> None:
        """The consumer of routed stream sid took n bytes: the daemon may send n more."""
        with self._cond:
            due = self._credit_due(sid, n)
        if due:
            try:
                self.send(CREDIT, sid, U32.pack(n))
            except (SandboxException, OSError):
                pass  # the connection went: the stream's sink hears of it

    def send(self, type_: int, sid: int, payload: Any = b"") -> None:
        if self.closed_with is not None:
            raise SandboxException(f"the data connection closed ({self.closed_with})")
        with self._wlock:
            self._writer = threading.get_ident()
            try:
                self._flush_abandoned()
                self._sock.sendall(header(type_, sid, len(payload)))
                if len(payload):
                    self._sock.sendall(payload)
            finally:
                self._writer = None

    def _flush_abandoned(self) -> None:
        while self._abandoned:
            self._sock.sendall(_abandon_frame(self._abandoned.popleft()))

    def finish(self, sid: int, early: bool) -> None:
        """sid is no longer read or written here; one stopped early is ended at the daemon."""
        with self._cond:
            self.forget(sid)
        if not early or self.closed_with is not None:
            return
        self._abandoned.append(sid)
        if self._writer == threading.get_ident():
            return  # a stream dropped in the middle of our own send: the next send says it
        try:
            with self._wlock:
                self._flush_abandoned()
        except OSError:
            pass

    def close(self) -> None:
        with self._cond:
            self.down("closed")
            self._cond.notify_all()
        try:
            self._sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        if threading.current_thread() is not self._reader:
            self._reader.join(5)


class AsyncDataConn(_Streams):
    """An asyncio data connection: frames are read on one task."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: Optional[float]) -> None:
        super().__init__()
        self._r = reader
        self._w = writer
        self._timeout = timeout
        self._writing = False
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(cls, conn: Any, window: int = WINDOW) -> "AsyncDataConn":
        """Opens conn's data connection (conn: an AsyncConnection whose hello said streams 1)."""
        token = (await conn.call("stream.channel", {})).get("token")
        line = attach_line(token, window)
        # the reader's buffer: a frame and a half, so that reading a DATA frame does not stop and start
        reader, writer = await asyncio.open_unix_connection(conn.socket_path, limit=DATA_MAX + (DATA_MAX >> 1))
        try:
            writer.write(line)
            await writer.drain()
            try:
                reply = await asyncio.wait_for(reader.readuntil(b"\n"), conn.request_timeout)
            except asyncio.TimeoutError:
                raise TimeoutException("stream.attach: no answer from the daemon") from None
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                raise SandboxException("stream.attach: the daemon closed the connection or said too much") from None
            if len(reply) > ATTACH_LINE_MAX:
                raise SandboxException("stream.attach: the reply is too long")
            attach_reply(reply)
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, conn.request_timeout)

    async def _read_loop(self) -> None:
        why = "the daemon closed the data connection"
        try:
            while True:
                h = await self._r.readexactly(HDR.size)
                type_, sid, length = self.parse_header(h)
                p = await self._r.readexactly(length) if length else b""
                if self.deliver(type_, sid, p) is not None:
                    self._wake.set()
        except asyncio.IncompleteReadError:
            pass
        except (ValueError, ConnectionError, OSError) as e:
            why = str(e)
        except asyncio.CancelledError:
            why = "closed"
        finally:
            self.down(why)
            self._wake.set()
            self._w.close()

    async def _wait(self, ready: Any, method: str) -> Any:
        while True:
            v = ready()
            if v:
                return v
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._timeout)
            except asyncio.TimeoutError:
                raise _timeout(method, self._timeout) from None

    async def next(self, sid: int, method: str) -> Event:
        return await self._wait(lambda: self.pop(sid, method), method)

    async def reserve(self, sid: int, want: int, method: str) -> int:
        return await self._wait(lambda: self.take_credit(sid, want, method), method)

    async def credit(self, sid: int, n: int) -> None:
        """The consumer of routed stream sid took n bytes: the daemon may send n more."""
        if self._credit_due(sid, n):
            try:
                await self.send(CREDIT, sid, U32.pack(n))
            except (SandboxException, OSError):
                pass  # the connection went: the stream's sink hears of it

    async def send(self, type_: int, sid: int, payload: Any = b"") -> None:
        if self.closed_with is not None:
            raise SandboxException(f"the data connection closed ({self.closed_with})")
        self._writing = True
        try:
            self._flush_abandoned()
            self._w.write(header(type_, sid, len(payload)))
            if len(payload):
                self._w.write(payload)
        finally:
            self._writing = False
        await self._w.drain()

    def _flush_abandoned(self) -> None:
        while self._abandoned:
            self._w.write(_abandon_frame(self._abandoned.popleft()))

    def finish(self, sid: int, early: bool) -> None:
        """sid is no longer read or written here; one stopped early is ended at the daemon."""
        self.forget(sid)
        if early and self.closed_with is None:
            self._abandoned.append(sid)
            if not self._writing:  # else: dropped in the middle of our own send; the next send says it
                self._flush_abandoned()

    async def close(self) -> None:
        self.down("closed")
        self._wake.set()
        self._w.close()
        await end_task(self._task, self._w)

"""
sbx.commands' and sbx.pty's protocol, once for both forms (see
``_drive.py``): the params of each call, the checks of its arguments, its
reply as E2B's objects, and a handle's output and end (:class:`HandleCore`).
The forms differ only in how they wait: ``sandbox_sync`` with threads and
``queue.Queue``, ``sandbox_async`` with asyncio.

A process's bytes travel as process streams (docs/protocol.md) when the
daemon's ``hello`` says ``process_streams``: its stdout, stderr, stdin or
terminal are streams of the data connection (``_stream.py``), binary frames
with credit; the handle gives credit back for a chunk once its consumer
(``wait``, iterating it, the async form's callbacks) took it, so a slow
callback slows the box's writer and nothing piles up here beyond a window per
stream.  From a daemon without them, output comes as ``process.output``
notifications with base64 or UTF-8 text and stdin goes as ``process.stdin``.
"""
import threading
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ._drive import EMIT, Proto
from ._link import Link, gone, rt
from ._stream import DATA, END, PROCESS_STREAMS
from ._wire import CHUNK, OutputDecoder, b64, check_size, decode_data, exit_status, output_stream, result_of, seconds, start_params, to_process
from .exceptions import CommandExitException, CommandResult, InvalidArgumentException, NotFoundException, SandboxException, TimeoutException


def sandbox_gone(link: Link) -> Proto:
    """A TimeoutException when the sandbox is gone, else None (it still runs)."""
    if link.killed:
        return gone(link.sandbox_id, "killed")
    try:
        r = yield (link.conn.call, "sandbox.get", {"id": link.sandbox_id})
        if r.get("state") in ("running", "paused"):
            return None
        return gone(link.sandbox_id, f"state {r.get('state')}")
    except NotFoundException:
        return gone(link.sandbox_id, "not found")
    except SandboxException as e:
        return gone(link.sandbox_id, str(e))


#: How long process.connect retries a process whose streams another data connection still reads
#: (a handle of ours that disconnected a moment ago: its cancel may not have reached the daemon yet).
BUSY_RETRY = 1.0

#: Credit owed for a stream that is sent at once (else: when the handle's queue is empty).
CREDIT_BATCH = 256 << 10
#: Most bytes of one stream's back-to-back chunks handed to a callback as one.
MERGE_MAX = 1 << 20

StreamIds = Dict[str, int]


def stream_ids(r: Any, keys: Tuple[str, ...]) -> Optional[StreamIds]:
    """The ``streams`` of a start or connect reply, checked: {name: sid} of the names it must have; None without."""
    st = r.get("streams") if isinstance(r, dict) else None
    if st is None:
        return None
    if not isinstance(st, dict):
        raise SandboxException("the daemon's reply has a bad 'streams'")
    ids: StreamIds = {}
    for k in ("stdout", "stderr", "stdin", "pty"):
        v = st.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 1 << 31:
            raise SandboxException(f"the daemon's reply names a bad {k} stream")
        ids[k] = v
    if not any(k in ids for k in keys):
        raise SandboxException("the daemon's reply names no output stream")
    return ids


class CommandsOps:
    """
    The operations of one Sandbox's ``commands`` and ``pty``; ``sleep`` is the
    form's (time.sleep, asyncio.sleep), ``live`` the form's set of handles
    that follow a process (stdin goes on a live handle's stream).
    """

    def __init__(self, link: Link, sleep: Callable[[float], Any], live: Set[Any]) -> None:
        self._link = link
        self._sleep = sleep
        self.live = live

    def _stream_conn(self) -> Proto:
        """The data connection process streams go on, or None (the JSON path), as the TypeScript SDK decides."""
        if self._link.conn.process_streams != PROCESS_STREAMS:
            return None
        try:
            return (yield (self._link.conn.data,))
        except SandboxException:
            return None

    def run_params(self, cmd: Any, stdin: Optional[bool]) -> Dict[str, Any]:
        if not isinstance(cmd, str) or cmd == "":
            raise InvalidArgumentException("commands.run: cmd must be a non-empty string")
        params = self._link.params(cmd=cmd, encoding="utf8")
        if stdin:
            params["stdin"] = True
        return params

    def pty_params(self, size: Any, cmd: Optional[List[str]]) -> Dict[str, Any]:
        check_size("pty.create", size)
        params = self._link.params(cols=size.cols, rows=size.rows)
        if cmd is not None:
            params["argv"] = list(cmd)
        return params

    def start(self, method: str, params: Dict[str, Any], cwd: Optional[str], envs: Optional[Dict[str, str]],
              user: Optional[str], timeout: Optional[float], request_timeout: Optional[float],
              make: Callable[[int], Any]) -> Proto:
        """process.start or pty.create; make(pid) makes the handle before the next line is read (output may follow at once)."""
        t = seconds(timeout, method)
        params.update(start_params(self._link.acct, cwd, envs, user, t))
        dc = yield from self._stream_conn()
        if dc is not None:
            params["streams"] = True
        outs = ("pty",) if method == "pty.create" else ("stdout", "stderr")
        box: List[Any] = []

        def made(r: Any) -> None:
            ids = stream_ids(r, outs) if dc is not None else None
            h = make(int(r["pid"]))
            box.append(h)
            if ids is not None:
                h._attach(dc, ids)

        try:
            yield (self._link.conn.call, method, params, made, rt(request_timeout))
        except SandboxException as e:
            # a start cut short because the sandbox was killed meanwhile is the sandbox going away
            if not isinstance(e, (NotFoundException, InvalidArgumentException)):
                g = yield from sandbox_gone(self._link)
                if g is not None:
                    raise g from e
            raise
        return box[0]

    def connect(self, pid: int, request_timeout: Optional[float], make: Callable[[int], Any]) -> Proto:
        """
        process.connect: with streams when the daemon has them; a process
        started without (EOPNOTSUPP) or whose streams another client reads
        (EBUSY, after BUSY_RETRY) is followed as JSON notifications.
        """
        dc = yield from self._stream_conn()
        box: List[Any] = []

        def subscribe(r: Any) -> None:
            ids = stream_ids(r, ("stdout", "stderr", "pty")) if dc is not None and "streams" in r else None
            h = make(int(r["pid"]))
            box.append(h)
            h._replay(r.get("output"))
            if ids is not None:
                h._attach(dc, ids)

        def attach(streams: bool) -> Proto:
            params = self._link.params(pid=pid, encoding="utf8")
            if streams:
                params["streams"] = True
            yield (self._link.conn.call, "process.connect", params, subscribe, rt(request_timeout))

        if dc is None:
            yield from attach(False)
            return box[0]
        delay, waited = 0.01, 0.0
        while True:
            try:
                yield from attach(True)
                return box[0]
            except SandboxException as e:
                code = e.errno_code
                if code == "EBUSY" and waited < BUSY_RETRY:
                    yield (self._sleep, delay)
                    waited += delay
                    delay = min(delay * 2, 0.2)
                    continue
                if code not in ("EOPNOTSUPP", "EBUSY"):
                    raise
                break
        yield from attach(False)
        return box[0]

    def list(self, request_timeout: Optional[float]) -> Proto:
        r = yield (self._link.conn.call, "process.list", self._link.params(), None, rt(request_timeout))
        return [to_process(p) for p in r.get("processes") or []]

    def kill(self, pid: int, request_timeout: Optional[float]) -> Proto:
        try:
            yield (self._link.conn.call, "process.signal", self._link.params(pid=pid, signal="KILL"), None, rt(request_timeout))
            return True
        except NotFoundException:
            return False

    def _input_of(self, pid: int) -> Optional[Tuple[Any, int, Any]]:
        """(data connection, stream id, handle) of pid's stdin or terminal stream while it takes bytes."""
        for h in list(self.live):
            inp = h._input
            if h.pid == pid and inp is not None and not h._input_closed and inp[0].input_open(inp[1]):
                return inp[0], inp[1], h
        return None

    def send_stdin(self, pid: int, data: Any, request_timeout: Optional[float]) -> Proto:
        """On its stdin stream within its credit; else in 1 MiB pieces of process.stdin, a full stdin queue (EAGAIN) waited out."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidArgumentException("send_stdin: data must be str or bytes")
        inp = self._input_of(pid)
        if inp is not None:
            dc, sid, _h = inp
            view = memoryview(bytes(data))
            while len(view):
                n = yield (dc.reserve, sid, len(view), "send_stdin")
                yield (dc.send, DATA, sid, view[:n])
                view = view[n:]
            return
        off = 0
        while True:
            piece = bytes(data[off:off + CHUNK])
            delay = 0.005
            while True:
                try:
                    yield (self._link.conn.call, "process.stdin", self._link.params(pid=pid, data=b64(piece), encoding="base64"),
                           None, rt(request_timeout))
                    break
                except SandboxException as e:
                    if e.errno_code != "EAGAIN":
                        raise
                    yield (self._sleep, delay)
                    delay = min(delay * 2, 0.2)
            off += len(piece)
            if off >= len(data):
                break

    def close_stdin(self, pid: int, request_timeout: Optional[float]) -> Proto:
        inp = self._input_of(pid)
        if inp is not None:
            dc, sid, h = inp
            h._input_closed = True
            yield (dc.send, END, sid)  # the process's stdin closes once it read what came
            return
        yield (self._link.conn.call, "process.close_stdin", self._link.params(pid=pid), None, rt(request_timeout))

    def resize(self, pid: int, size: Any, request_timeout: Optional[float]) -> Proto:
        check_size("pty.resize", size)
        yield (self._link.conn.call, "pty.resize", self._link.params(pid=pid, cols=size.cols, rows=size.rows), None,
               rt(request_timeout))


class HandleCore:
    """
    What a command handle of either form keeps and decides: its output so far
    (UTF-8 joined across chunks), its result, and the verdict on its end.
    What comes for it is put on ``self._q`` (a queue.Queue or an
    asyncio.Queue: both have put_nowait) as ``(kind, value)``: the JSON
    notifications by the control connection's reader, the frames of its
    streams by the data connection's; :meth:`_events` takes them off, once
    for both forms.
    """

    _q: Any

    def __init__(self, link: Link, commands: Any, pid: int, pty: bool) -> None:
        self._link = link
        self._commands = commands
        self._pid = pid
        self._pty = pty
        self._dec = OutputDecoder()
        self._out: List[str] = []
        self._err: List[str] = []
        self._lock = threading.Lock()
        self._result: Optional[CommandResult] = None
        self._failure: Optional[BaseException] = None
        self._ended = False  # the daemon said it ended
        self._done = False  # its end was taken off the queue and judged
        self._killed_by_us = False
        self._key = ("p", link.sandbox_id, pid)
        # process streams (none: the JSON path)
        self._dc: Any = None
        self._outs: List[int] = []  # its output streams
        self._open: Set[int] = set()  # those whose END has not been taken off the queue
        self._input: Optional[Tuple[Any, int]] = None  # (data connection, sid) of its stdin or terminal
        self._input_closed = False
        self._exit: Optional[Dict[str, Any]] = None  # its process.exit, held until its streams ended
        self._owed: Dict[int, int] = {}  # bytes of each stream the consumer took, credit not yet given
        self._held: Optional[Tuple[str, Any]] = None  # taken off the queue, not yet handled

    def _follow(self) -> None:
        self._link.conn.subscribe(self._key, self._on_notification)
        self._cancel_close = self._link.conn.on_close(lambda e: self._q.put_nowait(("closed", e)))

    def _attach(self, dc: Any, ids: Dict[str, int]) -> None:
        """Its bytes come on these streams of dc (process.start's or process.connect's reply said so)."""
        self._dc = dc
        if "pty" in ids:
            self._input = (dc, ids["pty"])
        elif "stdin" in ids:
            self._input = (dc, ids["stdin"])
        for k in ("pty", "stdout", "stderr"):
            if k in ids:
                self._outs.append(ids[k])
                self._open.add(ids[k])
        for k in ("pty", "stdout", "stderr"):
            if k in ids:
                dc.route(ids[k], self._sink(k, ids[k]))

    def _sink(self, kind: str, sid: int) -> Callable[[Any], None]:
        """What takes the frames of one output stream (on the data connection's reading thread or task)."""
        raw = kind == "pty" and self._pty
        stream = "stderr" if kind == "stderr" else "stdout"

        def sink(ev: Any) -> None:
            t, v = ev
            if t == DATA:
                if raw:
                    self._q.put_nowait(("data", ("pty", bytes(v), sid, len(v))))
                else:
                    self._q.put_nowait(("data", (stream, self._text(stream, self._dec.feed(stream, v)), sid, len(v))))
            elif t == END:
                if not raw:
                    text = self._text(stream, self._dec.flush(stream))
                    if text:
                        self._q.put_nowait(("data", (stream, text, sid, 0)))
                self._q.put_nowait(("end", sid))
            else:
                self._q.put_nowait(("serror", (sid, v)))

        return sink

    @property
    def pid(self) -> int:
        """The command's process id inside the sandbox."""
        return self._pid

    @property
    def stdout(self) -> str:
        """Everything it wrote to stdout so far."""
        return self._joined(self._out)

    @property
    def stderr(self) -> str:
        """Everything it wrote to stderr so far."""
        return self._joined(self._err)

    def _joined(self, parts: List[str]) -> str:
        with self._lock:
            if len(parts) > 1:
                parts[:] = ["".join(parts)]
            return parts[0] if parts else ""

    @property
    def exit_code(self) -> Optional[int]:
        """Its exit code once it ended and was waited for; None before."""
        return self._result.exit_code if self._result else None

    @property
    def error(self) -> Optional[str]:
        """Why it failed, once it ended and if it did."""
        return self._result.error if self._result else None

    # -- the reading threads' or tasks' side
    def _on_notification(self, method: str, p: Dict[str, Any]) -> None:
        if method == "process.output":
            if self._outs:
                return  # its bytes come on its streams
            data = decode_data(p.get("data"), p.get("encoding"))
            if self._pty:
                self._q.put_nowait(("pty", data))
                return
            stream = output_stream(p)
            self._push(stream, self._dec.feed(stream, data))
        elif method == "process.exit":
            if not self._outs:
                self._push("stdout", self._dec.flush("stdout"))
                self._push("stderr", self._dec.flush("stderr"))
            self._ended = True
            self._link.conn.unsubscribe(self._key)
            self._q.put_nowait(("exit", p))

    def _text(self, stream: str, text: str) -> str:
        """Keeps text as the stream's output so far; returns it."""
        if text:
            with self._lock:
                (self._out if stream == "stdout" else self._err).append(text)
        return text

    def _push(self, stream: str, text: str) -> None:
        if text:
            self._q.put_nowait((stream, self._text(stream, text)))

    def _replay(self, chunks: Any) -> None:
        for c in chunks if isinstance(chunks, list) else []:
            if isinstance(c, dict):
                self._on_notification("process.output", c)

    def _sandbox_gone(self, why: str) -> None:
        self._q.put_nowait(("gone", why))

    # -- the consumer's side, once for both forms
    def _events(self) -> Proto:
        """
        Takes what came off the queue until the end: output as ``(EMIT,
        (kind, value))`` (kind ``stdout``, ``stderr`` or ``pty``), the end
        judged.  Chunks of a stream queued back to back go out as one.  A
        chunk's credit is owed once the consumer asks for the next one, and
        paid when CREDIT_BATCH of a stream is owed or nothing is queued
        (before the consumer would wait); what a loop that broke owed is paid
        by the next consumer first.
        """
        while not self._done:
            if self._owed and (self._q.empty() or max(self._owed.values()) >= CREDIT_BATCH):
                for sid, n in list(self._owed.items()):
                    del self._owed[sid]
                    yield (self._dc.credit, sid, n)
            if self._held is not None:
                (kind, value), self._held = self._held, None
            else:
                kind, value = yield (self._q.get,)
            if kind in ("stdout", "stderr", "pty"):
                yield (EMIT, (kind, value))
            elif kind == "data":
                stream, v, sid, n = self._merged(value)
                if n:
                    self._owed[sid] = self._owed.get(sid, 0) + n
                if v:
                    yield (EMIT, (stream, v))
            elif kind == "end":
                self._open.discard(value)
                if not self._open and self._exit is not None:
                    yield from self._judged(self._exit)
            elif kind == "serror":
                sid, (_code, msg) = value
                self._open.discard(sid)
                if self._done:
                    continue
                # the sandbox went away under it (a TimeoutException, as for JSON output), or the
                # data connection did (or the stream failed): the command runs on, unread
                g = yield from sandbox_gone(self._link)
                self._finish(g or SandboxException(
                    f"command {self._pid}: its output stream failed: {msg}; it keeps running in the sandbox"))
            elif kind == "exit":
                if self._open:
                    self._exit = value  # the exit may come before its last bytes: judged once they are in
                else:
                    yield from self._judged(value)
            else:
                ends, failure = self._end_of(kind, value)
                if ends:
                    self._finish(failure)

    def _merged(self, value: Any) -> Any:
        """A stream's chunk joined with the ones of that stream queued right behind it (up to MERGE_MAX bytes)."""
        stream, v, sid, n = value
        parts = [v]
        while n < MERGE_MAX and not self._q.empty():
            nxt = self._q.get_nowait()  # the one consumer: not empty stays so
            if nxt[0] != "data" or nxt[1][2] != sid:
                self._held = nxt
                break
            parts.append(nxt[1][1])
            n += nxt[1][3]
        if len(parts) > 1:
            v = b"".join(parts) if isinstance(v, bytes) else "".join(parts)
        return stream, v, sid, n

    def _judged(self, p: Dict[str, Any]) -> Proto:
        failure, result = yield from self._judge_exit(p)
        self._finish(failure, result)

    def _finish(self, failure: Optional[BaseException], result: Optional[CommandResult] = None) -> None:
        if self._done:
            return
        self._done = True
        self._failure = failure
        self._result = result
        self._link.conn.unsubscribe(self._key)
        self._cancel_close()
        self._let_go()
        self._commands._forget(self)

    def _let_go(self) -> None:
        """Stops reading its streams: one not over is ended at the daemon (the command then runs on, unread)."""
        with self._lock:
            outs, self._outs = self._outs, []
            inp, self._input = self._input, None
        if self._dc is None:
            return
        for sid in outs:
            self._dc.finish(sid, early=self._dc.live(sid))
        if inp is not None and inp[1] not in outs:
            self._dc.finish(inp[1], early=False)

    def _judge_exit(self, p: Dict[str, Any]) -> Proto:
        """(failure or None, result) of a process.exit."""
        result = result_of(self.stdout, self.stderr, p)
        _code, sig, _err = exit_status(p)
        failure: Optional[BaseException] = None
        if p.get("timed_out") is True:
            failure = TimeoutException(
                f"command {self._pid} was killed: it ran past its timeout. "
                "The 'timeout' option can be used to increase this timeout (0: none)"
            )
        elif sig == 9 and not self._killed_by_us:
            # processes of a killed sandbox report signal 9: is the sandbox still there?
            failure = (yield from sandbox_gone(self._link)) or self._exit_exception(result)
        elif result.exit_code != 0 or sig:
            failure = self._exit_exception(result)
        return failure, result

    @staticmethod
    def _exit_exception(r: CommandResult) -> CommandExitException:
        return CommandExitException(stderr=r.stderr, stdout=r.stdout, exit_code=r.exit_code, error=r.error)

    def _end_of(self, kind: str, value: Any) -> Tuple[bool, Optional[BaseException]]:
        """For a kind other than output and exit: (ends the handle, with this failure)."""
        if kind == "gone":
            return True, gone(self._link.sandbox_id, value)
        if kind == "closed":
            if self._ended:
                return False, None  # the exit is queued behind this
            if self._link.killed:
                return True, gone(self._link.sandbox_id, "killed")
            return True, SandboxException(f"command {self._pid}: {value}")
        if kind == "disconnected":
            return True, SandboxException(f"command {self._pid}: disconnected; it keeps running in the sandbox")
        return False, None

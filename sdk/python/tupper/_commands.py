"""
sbx.commands' and sbx.pty's protocol, once for both forms (see
``_drive.py``): the params of each call, the checks of its arguments, its
reply as E2B's objects, and a handle's output and end (:class:`HandleCore`).
The forms differ only in how they wait: ``sandbox_sync`` with threads and
``queue.Queue``, ``sandbox_async`` with asyncio.
"""
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._drive import Proto
from ._link import Link, gone, rt
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


class CommandsOps:
    """The operations of one Sandbox's ``commands`` and ``pty``; ``sleep`` is the form's (time.sleep, asyncio.sleep)."""

    def __init__(self, link: Link, sleep: Callable[[float], Any]) -> None:
        self._link = link
        self._sleep = sleep

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
        box: List[Any] = []
        try:
            yield (self._link.conn.call, method, params, lambda r: box.append(make(int(r["pid"]))), rt(request_timeout))
        except SandboxException as e:
            # a start cut short because the sandbox was killed meanwhile is the sandbox going away
            if not isinstance(e, (NotFoundException, InvalidArgumentException)):
                g = yield from sandbox_gone(self._link)
                if g is not None:
                    raise g from e
            raise
        return box[0]

    def connect(self, pid: int, request_timeout: Optional[float], make: Callable[[int], Any]) -> Proto:
        box: List[Any] = []

        def subscribe(r: Any) -> None:
            h = make(int(r["pid"]))
            h._replay(r.get("output"))
            box.append(h)

        yield (self._link.conn.call, "process.connect", self._link.params(pid=pid, encoding="utf8"), subscribe,
               rt(request_timeout))
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

    def send_stdin(self, pid: int, data: Any, request_timeout: Optional[float]) -> Proto:
        """In 1 MiB pieces; a full stdin queue (EAGAIN) is waited out."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidArgumentException("send_stdin: data must be str or bytes")
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
        yield (self._link.conn.call, "process.close_stdin", self._link.params(pid=pid), None, rt(request_timeout))

    def resize(self, pid: int, size: Any, request_timeout: Optional[float]) -> Proto:
        check_size("pty.resize", size)
        yield (self._link.conn.call, "pty.resize", self._link.params(pid=pid, cols=size.cols, rows=size.rows), None,
               rt(request_timeout))


class HandleCore:
    """
    What a command handle of either form keeps and decides: its output so far
    (UTF-8 joined across chunks), its result, and the verdict on its end.
    The notifications are put on ``self._q`` (a queue.Queue or an
    asyncio.Queue: both have put_nowait) as ``(kind, value)``.
    """

    _q: Any

    def __init__(self, link: Link, commands: Any, pid: int, pty: bool) -> None:
        self._link = link
        self._commands = commands
        self._pid = pid
        self._pty = pty
        self._dec = OutputDecoder()
        self._stdout = ""
        self._stderr = ""
        self._lock = threading.Lock()
        self._result: Optional[CommandResult] = None
        self._failure: Optional[BaseException] = None
        self._ended = False  # the daemon said it ended
        self._killed_by_us = False
        self._key = ("p", link.sandbox_id, pid)

    def _follow(self) -> None:
        self._link.conn.subscribe(self._key, self._on_notification)
        self._cancel_close = self._link.conn.on_close(lambda e: self._q.put_nowait(("closed", e)))

    @property
    def pid(self) -> int:
        """The command's process id inside the sandbox."""
        return self._pid

    @property
    def stdout(self) -> str:
        """Everything it wrote to stdout so far."""
        return self._stdout

    @property
    def stderr(self) -> str:
        """Everything it wrote to stderr so far."""
        return self._stderr

    @property
    def exit_code(self) -> Optional[int]:
        """Its exit code once it ended and was waited for; None before."""
        return self._result.exit_code if self._result else None

    @property
    def error(self) -> Optional[str]:
        """Why it failed, once it ended and if it did."""
        return self._result.error if self._result else None

    # -- the reading thread's or task's side
    def _on_notification(self, method: str, p: Dict[str, Any]) -> None:
        if method == "process.output":
            data = decode_data(p.get("data"), p.get("encoding"))
            if self._pty:
                self._q.put_nowait(("pty", data))
                return
            stream = output_stream(p)
            self._push(stream, self._dec.feed(stream, data))
        elif method == "process.exit":
            self._push("stdout", self._dec.flush("stdout"))
            self._push("stderr", self._dec.flush("stderr"))
            self._ended = True
            self._link.conn.unsubscribe(self._key)
            self._q.put_nowait(("exit", p))

    def _push(self, stream: str, text: str) -> None:
        if not text:
            return
        with self._lock:
            if stream == "stdout":
                self._stdout += text
            else:
                self._stderr += text
        self._q.put_nowait((stream, text))

    def _replay(self, chunks: Any) -> None:
        for c in chunks if isinstance(chunks, list) else []:
            if isinstance(c, dict):
                self._on_notification("process.output", c)

    def _sandbox_gone(self, why: str) -> None:
        self._q.put_nowait(("gone", why))

    # -- the verdicts
    def _judge_exit(self, p: Dict[str, Any]) -> Proto:
        """(failure or None, result) of a process.exit."""
        result = result_of(self._stdout, self._stderr, p)
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

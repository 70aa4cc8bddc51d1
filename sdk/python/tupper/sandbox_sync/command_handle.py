"""CommandHandle: one process of a sandbox as a blocking client follows it."""
import queue
import threading
from typing import Any, Callable, Dict, Generator, Optional, Tuple, Union

from .._link import Link, gone
from .._wire import OutputDecoder, decode_data, exit_status, output_stream, result_of
from ..exceptions import CommandExitException, CommandResult, NotFoundException, SandboxException, TimeoutException
from ..models import PtyOutput, Stderr, Stdout

Event = Union[Tuple[Stdout, None, None], Tuple[None, Stderr, None], Tuple[None, None, PtyOutput]]


def sandbox_gone(link: Link) -> Optional[TimeoutException]:
    """A TimeoutException when the sandbox is gone, else None (it still runs)."""
    if link.killed:
        return gone(link.sandbox_id, "killed")
    try:
        r = link.conn.call("sandbox.get", {"id": link.sandbox_id})
        if r.get("state") in ("running", "paused"):
            return None
        return gone(link.sandbox_id, f"state {r.get('state')}")
    except NotFoundException:
        return gone(link.sandbox_id, "not found")
    except SandboxException as e:
        return gone(link.sandbox_id, str(e))


class CommandHandle:
    """
    A command started with ``background=True`` (and behind every run), or a
    terminal: its pid, its output so far, and the means to wait for it, feed
    it and kill it.  Iterating it yields ``(stdout, stderr, pty)`` tuples with
    one member set, until the command ends.
    """

    def __init__(self, link: Link, commands: Any, pid: int, pty: bool = False) -> None:
        self._link = link
        self._commands = commands
        self._pid = pid
        self._pty = pty
        self._q: "queue.Queue[Tuple[str, Any]]" = queue.Queue()
        self._dec = OutputDecoder()
        self._stdout = ""
        self._stderr = ""
        self._lock = threading.Lock()
        self._result: Optional[CommandResult] = None
        self._failure: Optional[BaseException] = None
        self._done = False  # the end was read from the queue and judged
        self._ended = False  # the daemon said it ended
        self._killed_by_us = False
        self._key = ("p", link.sandbox_id, pid)
        link.conn.subscribe(self._key, self._on_notification)
        self._cancel_close = link.conn.on_close(lambda e: self._q.put(("closed", e)))

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

    # -- the reader thread's side
    def _on_notification(self, method: str, p: Dict[str, Any]) -> None:
        if method == "process.output":
            data = decode_data(p.get("data"), p.get("encoding"))
            if self._pty:
                self._q.put(("pty", data))
                return
            stream = output_stream(p)
            self._push(stream, self._dec.feed(stream, data))
        elif method == "process.exit":
            self._push("stdout", self._dec.flush("stdout"))
            self._push("stderr", self._dec.flush("stderr"))
            self._ended = True
            self._link.conn.unsubscribe(self._key)
            self._q.put(("exit", p))

    def _push(self, stream: str, text: str) -> None:
        if not text:
            return
        with self._lock:
            if stream == "stdout":
                self._stdout += text
            else:
                self._stderr += text
        self._q.put((stream, text))

    def _replay(self, chunks: Any) -> None:
        for c in chunks if isinstance(chunks, list) else []:
            if isinstance(c, dict):
                self._on_notification("process.output", c)

    def _sandbox_gone(self, why: str) -> None:
        self._q.put(("gone", why))

    # -- the caller's side
    def _finish(self, failure: Optional[BaseException], result: Optional[CommandResult] = None) -> None:
        self._done = True
        self._failure = failure
        self._result = result
        self._link.conn.unsubscribe(self._key)
        self._cancel_close()
        self._commands._forget(self)

    def _judge_exit(self, p: Dict[str, Any]) -> None:
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
            failure = sandbox_gone(self._link) or self._exit_exception(result)
        elif result.exit_code != 0 or sig:
            failure = self._exit_exception(result)
        self._finish(failure, result)

    @staticmethod
    def _exit_exception(r: CommandResult) -> CommandExitException:
        return CommandExitException(stderr=r.stderr, stdout=r.stdout, exit_code=r.exit_code, error=r.error)

    def _events(self) -> Generator[Event, None, None]:
        while not self._done:
            kind, value = self._q.get()
            if kind == "stdout":
                yield value, None, None
            elif kind == "stderr":
                yield None, value, None
            elif kind == "pty":
                yield None, None, value
            elif kind == "exit":
                self._judge_exit(value)
            elif kind == "gone":
                self._finish(gone(self._link.sandbox_id, value))
            elif kind == "closed":
                if self._ended:
                    continue  # the exit is queued behind this
                self._finish(sandbox_gone_after_close(self._link, self._pid, value))
            elif kind == "disconnected":
                self._finish(SandboxException(f"command {self._pid}: disconnected; it keeps running in the sandbox"))

    def __iter__(self) -> Generator[Event, None, None]:
        """Yields the output as it comes, until the command ends (a failure to follow it raises)."""
        for ev in self._events():
            yield ev
        if self._failure is not None and not isinstance(self._failure, (CommandExitException, TimeoutException)):
            raise self._failure

    def wait(
        self,
        on_pty: Optional[Callable[[PtyOutput], None]] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> CommandResult:
        """
        Waits for the end, calling the callbacks (in this thread) with the
        output as it comes.  Returns the result on exit code 0; raises
        CommandExitException on another code or a signal, TimeoutException
        when its ``timeout`` killed it or its sandbox went away.
        """
        for out, err, pty in self._events():
            if out is not None and on_stdout:
                on_stdout(out)
            elif err is not None and on_stderr:
                on_stderr(err)
            elif pty is not None and on_pty:
                on_pty(pty)
        if self._failure is not None:
            raise self._failure
        assert self._result is not None
        return self._result

    def kill(self) -> bool:
        """Kills the command and its whole tree (SIGKILL); False when it no longer ran."""
        if self._ended or self._done:
            return False
        self._killed_by_us = True
        return self._commands.kill(self._pid)

    def send_stdin(self, data: Union[str, bytes], request_timeout: Optional[float] = None) -> None:
        """Writes to its stdin (started with ``stdin=True``; a terminal always takes input)."""
        self._commands.send_stdin(self._pid, data, request_timeout=request_timeout)

    def close_stdin(self, request_timeout: Optional[float] = None) -> None:
        """Closes its stdin once what was written is delivered."""
        self._commands.close_stdin(self._pid, request_timeout=request_timeout)

    def disconnect(self) -> None:
        """Stops following it; it keeps running (``commands.connect(pid)`` follows it again)."""
        self._link.conn.unsubscribe(self._key)
        self._q.put(("disconnected", None))


def sandbox_gone_after_close(link: Link, pid: int, err: BaseException) -> BaseException:
    if link.killed:
        return gone(link.sandbox_id, "killed")
    return SandboxException(f"command {pid}: {err}")

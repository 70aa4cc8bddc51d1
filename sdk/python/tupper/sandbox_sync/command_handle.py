"""CommandHandle: one process of a sandbox as a blocking client follows it (the protocol is ``_commands.HandleCore``)."""
import queue
from typing import Any, Callable, Generator, Optional, Tuple, Union

from .._commands import HandleCore
from .._commands import sandbox_gone as _sandbox_gone_op
from .._drive import run, run_iter
from .._link import Link
from ..exceptions import CommandExitException, CommandResult, TimeoutException
from ..models import PtyOutput, Stderr, Stdout

Event = Union[Tuple[Stdout, None, None], Tuple[None, Stderr, None], Tuple[None, None, PtyOutput]]


def sandbox_gone(link: Link) -> Optional[TimeoutException]:
    """A TimeoutException when the sandbox is gone, else None (it still runs)."""
    return run(_sandbox_gone_op(link))


class CommandHandle(HandleCore):
    """
    A command started with ``background=True`` (and behind every run), or a
    terminal: its pid, its output so far, and the means to wait for it, feed
    it and kill it.  Iterating it yields ``(stdout, stderr, pty)`` tuples with
    one member set, until the command ends.

    Its output is read while it is waited for or iterated: from a daemon with
    process streams, a command whose output nobody takes stops in its
    ``write`` once a window (4 MiB per stream) is waiting here, as a process
    writing to a pipe nobody reads does, and goes on when it is read.
    """

    def __init__(self, link: Link, commands: Any, pid: int, pty: bool = False) -> None:
        super().__init__(link, commands, pid, pty)
        self._q: "queue.Queue[Tuple[str, Any]]" = queue.Queue()
        self._follow()

    # -- the caller's side
    def _output(self) -> Generator[Event, None, None]:
        for kind, value in run_iter(self._events()):
            if kind == "stdout":
                yield value, None, None
            elif kind == "stderr":
                yield None, value, None
            else:
                yield None, None, value

    def __iter__(self) -> Generator[Event, None, None]:
        """Yields the output as it comes, until the command ends (a failure to follow it raises)."""
        for ev in self._output():
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
        output as it comes (the next chunk is asked for once a callback
        returned: a slow one slows the command down, nothing is lost).
        Returns the result on exit code 0; raises CommandExitException on
        another code or a signal, TimeoutException when its ``timeout``
        killed it or its sandbox went away.
        """
        for out, err, pty in self._output():
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
        self._let_go()
        self._q.put(("disconnected", None))

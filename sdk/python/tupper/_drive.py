"""
One protocol, two transports.  The SDK's calls are written once, as
generators that yield the operations they need and get their results back
(the "sans-I/O" shape)::

    def exists(self, path):
        try:
            yield (conn.call, "fs.stat", {...})
            return True
        except FileNotFoundException:
            return False

An operation is a tuple ``(fn, *args)``.  :func:`run` calls ``fn(*args)``
and sends its result back (or throws its exception in); :func:`arun` does
the same and awaits the result when it is awaitable, so the one generator
serves the blocking Sandbox (whose connection's ``call`` blocks) and the
AsyncSandbox (whose ``call`` is a coroutine function).  A generator that
produces a stream of values yields ``(EMIT, value)``; :func:`run_iter` and
:func:`arun_iter` turn it into an iterator and an async iterator.
"""
import inspect
from typing import Any, AsyncIterator, Generator, Iterator, Optional, Tuple

Op = Tuple[Any, ...]
Proto = Generator[Op, Any, Any]


class _Emit:
    def __repr__(self) -> str:
        return "EMIT"


#: The first item of an operation that hands a value to the consumer of a stream.
EMIT = _Emit()


class Chunks:
    """What a protocol generator returns when the caller gets a stream: the generator that produces it."""

    __slots__ = ("gen",)

    def __init__(self, gen: Proto) -> None:
        self.gen = gen


def _resume(gen: Proto, send: Any, throw: Optional[BaseException]) -> Tuple[Any, bool]:
    """(the next operation, False), or (what gen returned, True)."""
    try:
        return (gen.throw(throw) if throw is not None else gen.send(send)), False
    except StopIteration as stop:
        return stop.value, True


def _call(op: Op) -> Tuple[Any, Optional[BaseException]]:
    try:
        return op[0](*op[1:]), None
    except BaseException as e:  # noqa: BLE001 - handed to the generator
        return None, e


async def _acall(op: Op) -> Tuple[Any, Optional[BaseException]]:
    try:
        r = op[0](*op[1:])
        return (await r if inspect.isawaitable(r) else r), None
    except BaseException as e:  # noqa: BLE001 - handed to the generator
        return None, e


def run(gen: Proto) -> Any:
    """Runs gen with blocking calls; returns what it returns."""
    send, throw = None, None
    while True:
        op, done = _resume(gen, send, throw)
        if done:
            return op
        send, throw = _call(op)


async def arun(gen: Proto) -> Any:
    """Runs gen, awaiting what its operations return; returns what it returns."""
    send, throw = None, None
    while True:
        op, done = _resume(gen, send, throw)
        if done:
            return op
        send, throw = await _acall(op)


def run_iter(gen: Proto) -> Iterator[Any]:
    """The values gen emits, as an iterator (blocking calls); closing it closes gen."""
    send, throw = None, None
    try:
        while True:
            op, done = _resume(gen, send, throw)
            if done:
                return
            if op[0] is EMIT:
                send, throw = None, None
                yield op[1]
            else:
                send, throw = _call(op)
    finally:
        gen.close()


async def arun_iter(gen: Proto) -> AsyncIterator[Any]:
    """The values gen emits, as an async iterator; closing it closes gen."""
    send, throw = None, None
    try:
        while True:
            op, done = _resume(gen, send, throw)
            if done:
                return
            if op[0] is EMIT:
                send, throw = None, None
                yield op[1]
            else:
                send, throw = await _acall(op)
    finally:
        gen.close()


def collect(gen: Proto, out: bytearray) -> Proto:
    """Forwards gen's operations and appends what it emits to out (a whole read)."""
    send, throw = None, None
    while True:
        op, done = _resume(gen, send, throw)
        if done:
            return op
        send, throw = None, None
        if op[0] is EMIT:
            out += op[1]
            continue
        try:
            send = yield op
        except BaseException as e:  # noqa: BLE001 - handed to the generator
            throw = e

"""Ledger waits that let other tasks run: an actor's request, run cooperatively.

The stores call the ledger synchronously from the event loop. With SQLite that
costs microseconds; with a database server every answer is a round trip, and
while one request's statement waits for it, every other run of the node waits
too (at 20 ms a round trip, 16 runs go no faster than one).

``cooperatively(fn, ...)`` runs the async function ``fn`` in a greenlet of its
own, stepping its coroutine there. When synchronous code under it waits for the
server's socket (``wait_socket``, supervisor/ledger/ledger_pg_wire.py), the
greenlet hands the wait to its trio task, which awaits the socket while the
event loop runs other tasks; the greenlet resumes once the socket is ready. All
of it stays on the event loop's thread: other tasks run only where a request
waits for the server, never in the middle of Python code, and each waiting
transaction holds a connection of its own (supervisor/ledger/ledger_pg_pool.py).

Anywhere else (a task not started through here, a worker thread) a wait blocks
as before. A wait for the server is never cancelled halfway (the connection
would be left out of step): it is shielded, as the blocking wait was.
"""

from __future__ import annotations

import contextvars
import select
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

import greenlet
import trio

T = TypeVar("T")


class _Cooperative(greenlet.greenlet):  # type: ignore[misc]
    """A greenlet stepping one request's coroutine; its parent is the event loop's."""


@types.coroutine
def _yield_to_trio(trap: Any) -> Generator[Any, Any, Any]:
    """Pass what the inner coroutine yielded (a trio trap) to trio, and its answer back."""
    return (yield trap)


def _drive(coro: Any, how: str, value: Any) -> tuple[str, Any]:
    """The greenlet's body: step the coroutine until it ends, handing each yield
    to the parent (the trio task) and taking the parent's answer."""
    while True:
        try:
            yielded = coro.throw(value) if how == "throw" else coro.send(value)
        except StopIteration as stop:
            return ("done", stop.value)
        except BaseException as exc:
            return ("error", exc)
        how, value = _parent_switch(("yield", yielded))


def _parent_switch(message: tuple[str, Any]) -> tuple[str, Any]:
    parent = greenlet.getcurrent().parent
    answer: tuple[str, Any] = parent.switch(message)
    return answer


def cooperating() -> bool:
    """Whether this code runs under ``cooperatively`` (its waits let others run)."""
    return isinstance(greenlet.getcurrent(), _Cooperative)


def wait_socket(fd: int, events: int) -> int:
    """Wait until the socket ``fd`` is ready for ``events`` (``select.POLLIN``,
    ``POLLOUT``); returns the events that are. Under ``cooperatively`` the
    event loop runs other tasks meanwhile; anywhere else it blocks."""
    if not cooperating():
        poller = select.poll()
        poller.register(fd, events)
        return sum(ready for _, ready in poller.poll())
    how, value = _parent_switch(("wait", (fd, events)))
    if how == "throw":
        raise value
    ready: int = value
    return ready


def await_from_sync(fn: Callable[[], Awaitable[T]]) -> T:
    """Await ``fn()`` from synchronous code under ``cooperatively`` (a free
    connection, a turn): the event loop runs other tasks meanwhile."""
    how, value = _parent_switch(("await", fn))
    if how == "throw":
        raise value
    result: T = value
    return result


async def _socket_ready(fd: int, events: int) -> int:
    with trio.CancelScope(shield=True):  # never out of step with the server
        if events == select.POLLIN:
            await trio.lowlevel.wait_readable(fd)
            return select.POLLIN
        if events == select.POLLOUT:
            await trio.lowlevel.wait_writable(fd)
            return select.POLLOUT
        # Either (a long pipeline going out while answers come in): the first.
        ready: list[int] = []
        async with trio.open_nursery() as nursery:

            async def first(wait: Callable[[int], Awaitable[None]], event: int) -> None:
                await wait(fd)
                ready.append(event)
                nursery.cancel_scope.cancel()

            nursery.start_soon(first, trio.lowlevel.wait_readable, select.POLLIN)
            nursery.start_soon(first, trio.lowlevel.wait_writable, select.POLLOUT)
    return sum(set(ready))


async def cooperatively(fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await fn(*args)``, with the ledger's waits under it letting other tasks run."""
    if cooperating():
        return await fn(*args)  # already: one greenlet per request is enough
    coro = fn(*args)
    child = _Cooperative(_drive)
    # The task's context variables (a failpoint's caller, a trace's span), as the
    # coroutine would see them stepped by trio itself.
    child.gr_context = contextvars.copy_context()
    message: tuple[str, Any] = child.switch(coro, "send", None)
    while True:
        kind, payload = message
        if kind == "done":
            result: T = payload
            return result
        if kind == "error":
            raise payload
        try:
            if kind == "yield":
                answer = await _yield_to_trio(payload)
            elif kind == "wait":
                answer = await _socket_ready(*payload)
            else:  # "await"
                with trio.CancelScope(shield=True):
                    answer = await payload()
        except BaseException as exc:
            message = child.switch("throw", exc)
        else:
            message = child.switch("send", answer)

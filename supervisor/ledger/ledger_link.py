"""The link to a PostgreSQL ledger: what a lost connection is, how a supervisor
gets it back, and what waits meanwhile.

A database restart, a terminated backend or refused connections must not kill a
node. The ledger (supervisor/ledger/ledger_pg.py) notices a lost connection, refuses
every transaction at once with ``LedgerUnavailable`` (nothing was committed), and
asks to be reconnected. ``keep_connected`` reconnects it with backoff, in a worker
thread (a connection attempt may block for seconds; the event loop may not): the
fence and the lease are checked again on the new connection, and a commit whose
outcome was unknown is settled, before any transaction runs. An actor's request
that met ``LedgerUnavailable`` is held (``run_held``) and run again once the
ledger is back, so no reply is lost and no outcome becomes unknown.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio

from corral.mailbox.protocol import Code
from corral.supervisor.errors import StorageFull

log = logging.getLogger("corral.ledger")
T = TypeVar("T")

#: SQLSTATE classes and codes that mean the connection, not the statement, failed:
#: connection exceptions, and the server shutting down, crashing or starting.
_LOST_CLASSES = ("08",)
_LOST_CODES = frozenset({"57P01", "57P02", "57P03"})
#: Reconnection backoff: the first attempt at once, then doubling up to the cap.
BACKOFF_FIRST_S = 0.05
BACKOFF_CAP_S = 2.0
#: How long an actor's request is held for the ledger before it gets the error:
#: within the 30 s an actor waits for an answer. The actor then sends it again
#: (actors/runtime.py ``ActorContext.call``), for as long as the ledger is away.
HOLD_S = 25.0
#: How long a control call (a person's, a client's) is held: a restart is back
#: within it, and past it the caller gets a clear error before its own timeout.
CONTROL_HOLD_S = 5.0


class LedgerUnavailable(StorageFull):
    """The PostgreSQL ledger cannot take this transaction now (its connection is
    lost, or this node's lease lapsed and is being renewed): nothing was
    committed. The supervisor stays up and resumes by itself."""

    code = Code.LEDGER_UNAVAILABLE


def connection_lost(exc: BaseException, conn: Any) -> bool:
    """Whether ``exc`` (a psycopg error) means the connection is gone: the
    connection says so, or the server said it is going away."""
    if conn is not None and (getattr(conn, "closed", False) or getattr(conn, "broken", False)):
        return True
    state = str(getattr(exc, "sqlstate", "") or "")
    return state.startswith(_LOST_CLASSES) or state in _LOST_CODES


class Backoff:
    """Exponential backoff with jitter, for retries against a server that is away."""

    def __init__(self, first_s: float = BACKOFF_FIRST_S, cap_s: float = BACKOFF_CAP_S) -> None:
        self.first_s = first_s
        self.cap_s = cap_s
        self._next = 0.0
        self._rng = random.Random()

    def reset(self) -> None:
        self._next = 0.0

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self.cap_s, max(self.first_s, self._next * 2))
        # Jitter: nodes that lost one server together do not all knock at once.
        return delay * (0.5 + self._rng.random() / 2)


class Reconnectable(Protocol):
    @property
    def available(self) -> bool: ...

    def reconnect(self) -> bool: ...


class Wakeup:
    """A trio event any thread may set (through the event loop's token): the
    ledger finds its connection lost on the event loop or in group commit's
    worker thread."""

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._event = trio.Event()

    def set(self) -> None:
        try:
            self._token.run_sync_soon(self._event.set)
        except trio.RunFinishedError:
            pass  # the supervisor is gone: nothing to wake

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


async def keep_connected(ledger: Reconnectable, lost: Wakeup) -> None:
    """Forever: wait until the ledger lost its connection, then reconnect it with
    backoff (each attempt in a worker thread). What waited for it (held requests,
    group commit, the daemon's storage probe) sees ``available`` again."""
    backoff = Backoff()
    while True:
        if ledger.available:
            await lost.wait()
            continue
        await trio.sleep(backoff.next_delay())
        if await trio.to_thread.run_sync(ledger.reconnect):
            backoff.reset()


def ledger_available(ledger: object) -> bool:
    """Whether ``ledger`` takes transactions now: only a PostgreSQL ledger is ever
    unavailable (its connection lost), and it says when it is back."""
    return bool(getattr(ledger, "available", True))


async def wait_available(ledger: object) -> None:
    """Until ``ledger`` is available again (``keep_connected`` reconnects it)."""
    backoff = Backoff(cap_s=0.5)
    while not ledger_available(ledger):
        await trio.sleep(max(backoff.next_delay(), 0.01))


async def run_held(attempt: Callable[[], Awaitable[T]], ledger: object, limit_s: float = HOLD_S) -> T:
    """``attempt()``; while it fails with ``LedgerUnavailable`` (it committed
    nothing), wait until the ledger is available again and attempt it again,
    for at most ``limit_s`` in all. What an actor asked is held, not failed."""
    # Built on the first failure only: this wraps every actor message, and seeding a
    # Backoff's generator from os.urandom cost ~15 µs each (measured, issue 39).
    backoff: Backoff | None = None
    deadline = trio.current_time() + limit_s
    while True:
        try:
            return await attempt()
        except LedgerUnavailable:
            backoff = backoff or Backoff(cap_s=0.5)
            while not ledger_available(ledger):
                if trio.current_time() >= deadline:
                    raise
                await trio.sleep(max(backoff.next_delay(), 0.01))
            if trio.current_time() >= deadline:
                raise
            await trio.sleep(backoff.next_delay())

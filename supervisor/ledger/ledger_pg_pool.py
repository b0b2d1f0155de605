"""The connections of one PostgreSQL writer, and what each request has open on them.

A node's requests run cooperatively (supervisor/ledger/cooperative.py): while one
waits for the server, another runs. Each open transaction, and each read outside
one, therefore holds a connection of its own for as long as it runs (``take``,
``give``): the first is the node's home connection (the one a node had alone
before), the others are opened when more requests wait at once, up to
``POOL_SIZE``; past that a request waits for one to be given back. Code that is
not cooperative (a background loop, a tool) never waits: it takes a free
connection, or opens one more.

What a transaction needs of its own, per request (``TxState``): whether it is in
one, what waits for its commit, its serial number, its connection, and the first
event cursor it took. A request is one greenlet (the event loop itself for code
that is not cooperative), so ``states`` is keyed by it.

Each connection keeps its own commit marker (``corral_meta``'s ``commit_seq`` for
the home connection, ``commit_seq_N`` for the N-th): its transactions run one at
a time, so a lost COMMIT's outcome is still read off its own marker, as with one
connection (supervisor/ledger/ledger_pg.py).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import greenlet
import trio

from corral.supervisor.ledger.cooperative import await_from_sync, cooperating
from corral.supervisor.ledger.ledger_pg_wire import Connection

#: Connections a writer opens for requests waiting at once (its home one included).
POOL_SIZE = 16
MARKER_KEY = "commit_seq"


def marker_key(index: int) -> str:
    return MARKER_KEY if index == 0 else f"{MARKER_KEY}_{index}"


@dataclass(eq=False)
class Slot:
    """One connection of the writer."""

    index: int
    raw: Any
    db: Connection
    generation: int
    busy: bool = False

    @property
    def key(self) -> str:
        return marker_key(self.index)


@dataclass(eq=False)
class TxState:
    """What one request (a greenlet) has open."""

    in_tx: bool = False
    after_commit: list[Callable[[], None]] = field(default_factory=list)
    serial: int = 0
    slot: Slot | None = None
    #: The first event cursor its open transaction took (0: none), until it commits or rolls back.
    low_cursor: int = 0
    #: The run id its open transaction claims cluster-wide (``claim_run_id``).
    claimed: str | None = None

    @property
    def idle(self) -> bool:
        return not self.in_tx and not self.after_commit and self.slot is None


class Pool:
    """The writer's connections. ``opener(index)`` opens the index-th (raw, Connection)."""

    def __init__(self, opener: Callable[[int], tuple[Any, Connection]], size: int = POOL_SIZE) -> None:
        self._opener = opener
        self.size = size
        self.slots: list[Slot] = []
        #: Bumped when the connections are found lost: older ones close when given back.
        self.generation = 0
        self._freed = trio.Event()
        self._waiting = 0
        self._choosing = threading.Lock()
        self._opening = 0
        #: Indexes of connections being opened (not in ``slots`` yet).
        self._claimed: set[int] = set()
        #: Per request (greenlet): what it has open. Weak: a request's greenlet
        #: that ended takes its state along, whatever it left there.
        self.states: weakref.WeakKeyDictionary[Any, TxState] = weakref.WeakKeyDictionary()

    # -- per request ------------------------------------------------------------

    def state(self) -> TxState:
        me = greenlet.getcurrent()
        state = self.states.get(me)
        if state is None:
            state = self.states[me] = TxState()
        return state

    def tidy(self, state: TxState) -> None:
        """Forget a request's state once it holds nothing."""
        if state.idle:
            me = greenlet.getcurrent()
            if self.states.get(me) is state:
                del self.states[me]

    def low_cursor(self) -> int:
        """The lowest event cursor another request's open transaction holds (0: none)."""
        me = greenlet.getcurrent()
        held = [state.low_cursor for owner, state in self.states.items() if owner is not me and state.low_cursor]
        return min(held) if held else 0

    # -- connections ------------------------------------------------------------

    def adopt(self, raw: Any, db: Connection) -> Slot:
        """The home connection (index 0), opened by the ledger itself."""
        slot = Slot(0, raw, db, self.generation)
        self.slots.insert(0, slot)
        return slot

    @property
    def home(self) -> Slot:
        return self.slots[0]

    def take(self) -> Slot:
        """A connection of its own for the caller (the home one when free)."""
        while True:
            with self._choosing:  # a worker thread may read through the ledger too
                for slot in self.slots:
                    if not slot.busy and slot.generation == self.generation:
                        slot.busy = True
                        return slot
                opening = not cooperating() or len(self.slots) + self._opening < self.size
                if opening:
                    self._opening += 1  # counted now: two callers do not both take the last place
            if opening:
                try:
                    return self._open()
                finally:
                    with self._choosing:
                        self._opening -= 1
            self._waiting += 1
            try:
                await_from_sync(self._freed.wait)
            finally:
                self._waiting -= 1

    def _open(self) -> Slot:
        with self._choosing:
            used = {slot.index for slot in self.slots} | self._claimed
            index = next(i for i in range(len(used) + 1) if i not in used)
            self._claimed.add(index)
        try:
            raw, db = self._opener(index)
        finally:
            with self._choosing:
                self._claimed.discard(index)
        slot = Slot(index, raw, db, self.generation, busy=True)
        with self._choosing:
            self.slots = sorted([*self.slots, slot], key=lambda s: s.index)
        return slot

    def give(self, slot: Slot) -> None:
        with self._choosing:
            slot.busy = False
        if slot.generation != self.generation:
            self._retire(slot)
        if self._waiting:
            freed, self._freed = self._freed, trio.Event()
            freed.set()

    def lost(self) -> None:
        """The connections are found lost: the free ones close now, the busy ones
        when given back (their requests see the failure on their own)."""
        self.generation += 1
        for slot in list(self.slots):
            if not slot.busy:
                self._retire(slot)

    def _retire(self, slot: Slot) -> None:
        """Close it; the home connection stays named (closed) until ``replace_home``."""
        if slot.index != 0 and slot in self.slots:
            self.slots.remove(slot)
        self._close(slot)

    def _close(self, slot: Slot) -> None:
        try:
            slot.raw.close()
        except Exception:
            pass

    def replace_home(self, raw: Any, db: Connection) -> Slot:
        """After a reconnection: the new home connection, of the current generation."""
        slot = Slot(0, raw, db, self.generation)
        self.slots = [s for s in self.slots if s.index != 0]
        self.slots.insert(0, slot)
        return slot

    def in_other_transactions(self, db: Connection | None) -> bool:
        """Whether a connection other than ``db`` has a transaction open (its
        writes, not committed yet, are not what ``db`` reads)."""
        return any(slot.db is not db and slot.db.in_transaction for slot in self.slots)

    def round_trips(self) -> int:
        return sum(slot.db.round_trips for slot in self.slots)

    def close(self) -> None:
        for slot in self.slots:
            self._close(slot)

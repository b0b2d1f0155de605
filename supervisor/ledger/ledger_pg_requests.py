"""What each request has open on a PostgreSQL writer's connections.

The part of supervisor/ledger/ledger_pg.py that makes its transactions per request:
a node's requests run cooperatively (supervisor/ledger/cooperative.py), so the port's
"in a transaction", "what waits for its commit" and "the open transaction's
connection" belong to the request (a greenlet) asking, not to the ledger. The
connections themselves are supervisor/ledger/ledger_pg_pool.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import greenlet

from corral.supervisor.ledger.ledger_link import LedgerUnavailable
from corral.supervisor.ledger.ledger_pg_pool import Pool, marker_key
from corral.supervisor.ledger.ledger_pg_sync import markers_of
from corral.supervisor.ledger.ledger_pg_wire import Connection, PostgresUnavailable, connect
from corral.supervisor.ledger.read_cache import ReadCache

#: A connection attempt gives up after this.
CONNECT_TIMEOUT_S = 5


class PerRequest:
    """Mixed into ``PostgresLedger`` ahead of the port: the port's transaction
    state, per request."""

    _pool: Pool
    transactions: int
    cache: ReadCache | None
    url: str
    schema: str
    where: str
    epoch: int | None
    _application: str
    #: The last commit marker this writer set on each connection's key (and was told was committed).
    _told: dict[str, int]

    def _diverged(self, why: str) -> None:
        raise NotImplementedError

    @property
    def raw(self) -> Any:
        """The home connection (psycopg's), for setting up and tools."""
        return self._pool.home.raw

    @property
    def db(self) -> Connection:
        """The open transaction's connection, else the home one."""
        slot = self._pool.state().slot
        return slot.db if slot is not None else self._pool.home.db

    def _connection(self, raw: Any) -> Connection:
        return Connection(raw, self.cache)

    def _open_slot(self, index: int) -> tuple[Any, Connection]:
        """One more connection, with its own commit marker (its key made once)."""
        import psycopg

        key = marker_key(index)
        try:
            raw = connect(self.url, self._application, timeout=CONNECT_TIMEOUT_S)
        except PostgresUnavailable as exc:
            raise LedgerUnavailable(f"{self.where}: cannot open another connection ({exc})") from None
        try:
            raw.execute(f"SET search_path TO {self.schema}, public")
            if self.epoch is not None:
                raw.execute("INSERT INTO corral_meta VALUES (%s, 0) ON CONFLICT DO NOTHING", (key,))
                held = markers_of(raw, self.schema).get(key, 0)
                if held < self._told.get(key, 0):
                    self._diverged(
                        f"it holds commit {held} of {key}, and this writer was told of commit {self._told[key]}"
                    )
                self._told[key] = held
        except psycopg.Error as exc:
            raw.close()
            raise LedgerUnavailable(f"{self.where}: cannot open another connection ({exc})") from None
        except BaseException:
            raw.close()
            raise
        return raw, self._connection(raw)

    @property
    def _in_tx(self) -> bool:
        state = self._pool.states.get(greenlet.getcurrent())
        return state is not None and state.in_tx

    @_in_tx.setter
    def _in_tx(self, value: bool) -> None:
        state = self._pool.state()
        state.in_tx = value
        if value:
            state.serial = self.transactions + 1
        else:
            self._pool.tidy(state)

    @property
    def _after_commit(self) -> list[Callable[[], None]]:
        state = self._pool.states.get(greenlet.getcurrent())
        return state.after_commit if state is not None else []  # outside a transaction: nothing waits

    @_after_commit.setter
    def _after_commit(self, value: list[Callable[[], None]]) -> None:
        state = self._pool.state()
        state.after_commit = value
        self._pool.tidy(state)

    def open_transaction(self) -> int | None:
        state = self._pool.states.get(greenlet.getcurrent())
        return state.serial if state is not None and state.in_tx else None

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        """A connection for a read outside a transaction (the open one's inside it)."""
        state = self._pool.state()
        if state.slot is not None:
            yield state.slot.db
            return
        slot = self._pool.take()
        state.slot = slot
        try:
            yield slot.db
        finally:
            state.slot = None
            self._pool.give(slot)
            self._pool.tidy(state)

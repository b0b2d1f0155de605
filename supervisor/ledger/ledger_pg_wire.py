"""The wire to a PostgreSQL ledger: connecting, rows that behave like sqlite3.Row,
and a connection that speaks SQLite's dialect and defers writes.

supervisor/ledger/ledger_pg.py builds the ledger on it: transactions, the fence, the
commit marker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from corral.core.errors import CorralError
from corral.supervisor.ledger.read_cache import ReadCache
from corral.supervisor.ledger.sql_dialect import to_postgres


class PostgresUnavailable(CorralError, RuntimeError):
    pass


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[1]}"))


# -- rows that behave like sqlite3.Row ------------------------------------------------


class _Row(tuple[Any, ...]):
    """By index, by name and ``keys()``, as sqlite3.Row: the stores use all three."""

    _names: tuple[str, ...] = ()
    _index: ClassVar[dict[str, int]] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self._index[key])
            except KeyError:
                raise IndexError(f"no such column: {key}") from None
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


@lru_cache(maxsize=1024)
def _row_class(names: tuple[str, ...]) -> type[_Row]:
    index: dict[str, int] = {}
    for position, name in enumerate(names):
        index.setdefault(name, position)  # the first of duplicate names, as SQLite
    return type("Row", (_Row,), {"_names": names, "_index": index, "__slots__": ()})


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], _Row]:
    description = cursor.description
    if description is None:
        return lambda values: _Row(values)
    cls = _row_class(tuple(column.name for column in description))
    return lambda values: cls(values)


def connect(url: str, application: str = "corral", timeout: int = 10) -> Any:
    """A connection in autocommit mode; ``application`` names it in
    ``pg_stat_activity`` (which node and what for: an operator can tell them apart)."""
    try:
        import psycopg
        from psycopg.adapt import Dumper, Loader
    except ImportError:
        raise PostgresUnavailable(
            "the PostgreSQL ledger needs psycopg 3: pip install 'corral[postgres]'"
        ) from None

    class BoolAsInteger(Dumper):
        # SQLite stores booleans as 0/1 and the stores compare them so.
        oid = psycopg.adapters.types["int8"].oid

        def dump(self, obj: Any) -> bytes:
            return b"1" if obj else b"0"

    class NumericAsNumber(Loader):
        # SUM/AVG give numeric: SQLite gives int or float, and JSON wants those.
        def load(self, data: Any) -> Any:
            text = bytes(data).decode()
            return int(text) if text.lstrip("-").isdigit() else float(text)

    try:
        # Client-side binding: values travel as literals, so PostgreSQL types them
        # from their context as SQLite does ("? IS NULL", a str compared with a number).
        conn = psycopg.connect(
            url, autocommit=True, row_factory=_row_factory, connect_timeout=timeout,
            cursor_factory=psycopg.ClientCursor, application_name=application[:63],
        )
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"cannot reach the PostgreSQL ledger at {redact_url(url)}: {exc}") from None
    conn.adapters.register_dumper(bool, BoolAsInteger)
    conn.adapters.register_loader("numeric", NumericAsNumber)
    return conn


class _Deferred:
    """A write sent later, with whatever reads or commits next (one round trip)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.rowcount_known: int | None = None

    @property
    def rowcount(self) -> int:
        if self.rowcount_known is None:
            self._connection.flush()
        assert self.rowcount_known is not None
        return self.rowcount_known

    def fetchone(self) -> None:
        return None

    def fetchall(self) -> list[Any]:
        return []


def _settle(cursor: Any, pending: list[tuple[str, _Deferred | None]]) -> None:
    """Give each sent statement its row count; the cursor ends on what follows."""
    for _text, handle in pending:
        if handle is not None:
            handle.rowcount_known = cursor.rowcount
        cursor.nextset()


class Connection:
    """What a store's ``db.execute(sql, params)`` talks to: SQLite's dialect in,
    PostgreSQL out.

    Two things save round trips, which cost nothing with SQLite and most of the
    time with a server. With ``cache`` (the writer's own ledger only), repeated
    single-table reads are answered from supervisor/ledger/read_cache.py. Inside a
    transaction, a write whose result nobody reads yet is *deferred*: it travels
    with the next statement that needs an answer (a read, a ``RETURNING``, the
    ``COMMIT``), in one multi-statement round trip, in order. A deferred write
    that fails makes that round trip fail, and the transaction rolls back as if
    it had failed alone.
    """

    def __init__(self, conn: Any, cache: ReadCache | None = None, *, defer_writes: bool = False) -> None:
        self.conn = conn
        self.in_transaction = False
        self.cache = cache
        self.defer_writes = defer_writes
        #: Statements not sent yet, each with its handle (None: the transaction's opening).
        self.pending: list[tuple[str, _Deferred | None]] = []
        #: Round trips to the server (what the bench divides by actions).
        self.round_trips = 0

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        args = tuple(params)
        cache = self.cache
        if cache is None:
            return self.send(to_postgres(sql), args)
        kind, table, hit = cache.before(sql, args)
        if hit is not None:
            return hit
        statement = to_postgres(sql)
        if self.defer_writes and self.in_transaction and kind == "write" and "RETURNING" not in sql.upper():
            handle = _Deferred(self)
            self.pending.append((self._literal(statement, args), handle))
            return handle
        return cache.after(kind, table, sql, args, self.send(statement, args))

    def _literal(self, statement: str, args: tuple[Any, ...]) -> str:
        text: str = self.conn.cursor().mogrify(statement, args or None)
        return text

    def send(self, statement: str, args: tuple[Any, ...] = ()) -> Any:
        """One round trip: the deferred writes, then this statement; the cursor
        is left on this statement's result."""
        if self.pending:
            return self._send_pending(self._literal(statement, args))
        cursor = self.conn.cursor()
        self.round_trips += 1
        cursor.execute(statement, args or None)
        return cursor

    def flush(self) -> None:
        if self.pending:
            self._send_pending(None)

    def _send_pending(self, last: str | None) -> Any:
        """The deferred statements (and ``last``) in one round trip, in order."""
        pending, self.pending = self.pending, []
        cursor = self.conn.cursor()
        self.round_trips += 1
        cursor.execute("; ".join([*(text for text, _ in pending), *([last] if last else [])]))
        _settle(cursor, pending)
        return cursor

    def discard(self) -> None:
        self.pending = []

"""The PostgreSQL ledger: several supervisors (nodes) share one database.

Each node writes its runs into its own *partition*, a PostgreSQL schema holding
the same tables as an SQLite home, so every store's SQL runs unchanged
(supervisor/sql_dialect.py translates it). A partition is held under a lease
with a fencing token, its epoch, in ``corral_cluster.partitions``. Every write
transaction first locks that row ``FOR SHARE`` and checks the epoch: a node that
another node has fenced (by taking the partition over, which bumps the epoch
``FOR UPDATE``) cannot commit anything more, however late it wakes up. The row
lock orders the two: a write either commits before the takeover, which then
sees it, or finds the new epoch and rolls back.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from corral.core.errors import CorralError
from corral.supervisor.errors import SupervisorError
from corral.supervisor.ledger import Ledger, LedgerError, split_sql
from corral.supervisor.read_cache import ReadCache
from corral.supervisor.schema import MIGRATIONS
from corral.supervisor.sql_dialect import REFUSE_FUNCTION, statement_to_postgres, to_postgres

CLUSTER_SCHEMA = "corral_cluster"
#: What the fence raises when a writer's epoch is stale (a class of our own).
FENCE_SQLSTATE = "CF001"
PARTITION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")

CLUSTER_DDL = [
    f"""
CREATE SCHEMA IF NOT EXISTS {CLUSTER_SCHEMA}
""",
    f"""
CREATE TABLE IF NOT EXISTS {CLUSTER_SCHEMA}.nodes (
    node_id      TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          BIGINT NOT NULL,
    home         TEXT NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL,
    lease_until  TIMESTAMPTZ NOT NULL,
    status       TEXT NOT NULL
)
""",
    f"""
CREATE TABLE IF NOT EXISTS {CLUSTER_SCHEMA}.partitions (
    name         TEXT PRIMARY KEY,
    schema_name  TEXT NOT NULL UNIQUE,
    holder       TEXT NOT NULL,
    epoch        BIGINT NOT NULL,
    lease_until  TIMESTAMPTZ NOT NULL,
    spec_path    TEXT,
    created_at   TIMESTAMPTZ NOT NULL,
    adopted_from TEXT,
    adopted_at   TIMESTAMPTZ
)
""",
    f"""
CREATE OR REPLACE FUNCTION {CLUSTER_SCHEMA}.fence(wanted TEXT, mine BIGINT) RETURNS void AS $fence$
DECLARE
    held BIGINT;
    held_by TEXT;
BEGIN
    SELECT epoch, holder INTO held, held_by FROM {CLUSTER_SCHEMA}.partitions WHERE name = wanted FOR SHARE;
    IF held IS DISTINCT FROM mine THEN
        RAISE EXCEPTION 'corral-fenced: partition % is now held by node % at epoch % (this writer had epoch %)',
            wanted, coalesce(held_by, 'nobody'), held, mine USING ERRCODE = '{FENCE_SQLSTATE}';
    END IF;
END
$fence$ LANGUAGE plpgsql
""",
]


class Fenced(SupervisorError):
    """This supervisor's lease on its partition was taken over: it must stop writing."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "fenced")


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


def is_postgres_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def schema_of(partition: str) -> str:
    if not PARTITION_NAME.match(partition):
        raise LedgerError(
            f"partition/node name {partition!r}: use 1-48 lowercase letters, digits, '-' or '_',"
            " starting with a letter or digit"
        )
    return "corral_p_" + partition.replace("-", "_")


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


def _connect(url: str) -> Any:
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
            url, autocommit=True, row_factory=_row_factory, connect_timeout=10, cursor_factory=psycopg.ClientCursor
        )
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"cannot reach the PostgreSQL ledger at {redact_url(url)}: {exc}") from None
    conn.adapters.register_dumper(bool, BoolAsInteger)
    conn.adapters.register_loader("numeric", NumericAsNumber)
    return conn


class _Deferred:
    """A write sent later, with whatever reads or commits next (one round trip)."""

    def __init__(self, connection: _Connection) -> None:
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


class _Connection:
    """What a store's ``db.execute(sql, params)`` talks to: SQLite's dialect in,
    PostgreSQL out.

    Two things save round trips, which cost nothing with SQLite and most of the
    time with a server. With ``cache`` (the writer's own ledger only), repeated
    single-table reads are answered from supervisor/read_cache.py. Inside a
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


class PostgresLedger(Ledger):
    """One partition of a shared PostgreSQL database.

    ``epoch`` is the fencing token this supervisor holds (None: no writes are
    fenced, for tools that only read or that set a partition up). ``on_fenced``
    is called once, before ``Fenced`` is raised, so the daemon can stop.
    """

    backend = "postgresql"

    def __init__(
        self,
        url: str,
        partition: str,
        *,
        epoch: int | None = None,
        readonly: bool = False,
        on_fenced: Callable[[str], None] | None = None,
        group_commit: bool = False,
    ) -> None:
        super().__init__()
        #: Group commit, as with SQLite: transactions commit without waiting for
        #: the WAL flush, and ``sync`` (before any reply leaves) waits for one
        #: flush that covers all of them.
        self.group_commit = group_commit
        self._sync_conn: Any = None
        self.url = url
        self.partition = partition
        self.schema = schema_of(partition)
        self.where = f"postgresql ledger {redact_url(url)} partition {partition}"
        self.epoch = epoch
        self.on_fenced = on_fenced
        self.fenced = ""
        self._lock = threading.RLock()  # one connection: the trio thread and group commit's
        self.raw = _connect(url)
        #: The fenced writer alone may cache its reads: nobody else writes its partition.
        self.cache = ReadCache() if epoch is not None and not readonly else None
        self.db = _Connection(self.raw, self.cache, defer_writes=self.cache is not None)
        #: Event cursors taken from the sequence in blocks: an event's INSERT then
        #: needs no answer and is deferred like any write. One writer commits in
        #: order, so cursors still grow in commit order.
        self._cursors: list[int] = []
        try:
            if not readonly:
                ensure_cluster(self.raw)
                self._migrate()
            elif not self._schema_exists():
                raise LedgerError(f"{self.where}: no such partition")
            self.raw.execute(f"SET search_path TO {self.schema}, public")
        except LedgerError:
            self.raw.close()
            raise
        except Exception as exc:
            self.raw.close()
            raise LedgerError(f"{self.where} cannot be opened ({exc})") from None

    def _schema_exists(self) -> bool:
        row = self.raw.execute(
            "SELECT 1 FROM information_schema.schemata WHERE schema_name = %s", (self.schema,)
        ).fetchone()
        return row is not None

    # -- schema -----------------------------------------------------------------

    def _migrate(self) -> None:
        """Every migration once per partition, under an advisory lock (two nodes
        may create the cluster at the same moment)."""
        with self.raw.transaction():
            self.raw.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.schema,))
            self.raw.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
            self.raw.execute(f"SET LOCAL search_path TO {self.schema}, public")
            self.raw.execute(REFUSE_FUNCTION)
            self.raw.execute("CREATE TABLE IF NOT EXISTS corral_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)")
            self.raw.execute("INSERT INTO corral_meta VALUES ('schema_version', 0) ON CONFLICT DO NOTHING")
            current = int(self.raw.execute("SELECT value FROM corral_meta WHERE key = 'schema_version'").fetchone()[0])
            if current > len(MIGRATIONS):
                raise LedgerError(f"{self.where} has schema {current}, newer than this corral ({len(MIGRATIONS)})")
            for version in range(current, len(MIGRATIONS)):
                for statement in split_sql(MIGRATIONS[version]):
                    self.raw.execute(statement_to_postgres(statement))
            self.raw.execute("UPDATE corral_meta SET value = %s WHERE key = 'schema_version'", (len(MIGRATIONS),))

    @property
    def schema_version(self) -> int:
        row = self.one("SELECT value FROM corral_meta WHERE key = 'schema_version'")
        return int(row[0]) if row else 0

    # -- transactions -----------------------------------------------------------

    @contextmanager
    def _transaction(self, *, fsync: bool) -> Iterator[_Connection]:
        import psycopg

        if self.fenced:
            raise Fenced(self.fenced)
        with self._lock:
            # Nothing is sent yet: BEGIN, the commit mode and the fence check
            # travel with the transaction's first statement that needs an
            # answer, or with its COMMIT. The fence raises inside the server,
            # so a fenced batch stops before its COMMIT, whatever follows it.
            self.db.in_transaction = True
            self.db.pending = [("BEGIN", None)]
            if not fsync or self.group_commit:
                self.db.pending.append(("SET LOCAL synchronous_commit = off", None))
            if self.epoch is not None:
                self.db.pending.append((self._fence_sql, None))
            try:
                yield self.db
                if self.db.pending[:1] == [("BEGIN", None)] and not any(h for _, h in self.db.pending):
                    self.db.discard()  # nothing was written: no round trip at all
                else:
                    self.db.send("COMMIT")
            except psycopg.Error as exc:
                self._rollback()
                if getattr(exc, "sqlstate", None) == FENCE_SQLSTATE:
                    self.fence(str(exc.diag.message_primary or exc).removeprefix("corral-fenced: "))
                if isinstance(exc, psycopg.errors.DiskFull):
                    self._storage_failed(exc)
                raise
            except BaseException:
                self._rollback()
                raise
            self.db.in_transaction = False

    def _rollback(self) -> None:
        self.db.in_transaction = False
        self.db.discard()
        if self.cache is not None:
            self.cache.clear()  # it may hold rows this transaction wrote
        try:
            self.raw.execute("ROLLBACK")
        except Exception:
            pass

    def sync(self) -> int:
        """Wait until every commit so far is flushed: one synchronously committed
        write on a second connection (the WAL is one sequence, so its flush covers
        every earlier commit). The ledger's own connection stays free meanwhile."""
        covered = self.commits
        if self._sync_conn is None:
            self._sync_conn = _connect(self.url)
            self._sync_conn.execute(f"SET search_path TO {self.schema}, public")
            self._sync_conn.execute("INSERT INTO corral_meta VALUES ('syncs', 0) ON CONFLICT DO NOTHING")
        self._sync_conn.execute("UPDATE corral_meta SET value = value + 1 WHERE key = 'syncs'")
        return covered

    @property
    def _fence_sql(self) -> str:
        """The row lock (FOR SHARE, in the function) holds until this transaction
        ends: a takeover, which updates the row, waits for it, and this one sees no
        takeover. The partition name is checked by schema_of (letters, digits, -
        and _ only)."""
        return f"SELECT {CLUSTER_SCHEMA}.fence('{self.partition}', {int(self.epoch or 0)})"

    def rows_as_text(self) -> str:
        """Every row of the partition, as text: what a scan for secrets reads
        (with SQLite it reads the file)."""
        tables = [row[0] for row in self.all(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")]
        return "\n".join(repr(tuple(row)) for table in tables for row in self.all(f"SELECT * FROM {table}"))

    def counters(self) -> dict[str, int]:
        """Round trips to the server and read-cache hits, for status and the bench."""
        cache = self.cache
        return {"round_trips": self.db.round_trips, "cache_hits": cache.hits if cache else 0,
                "cache_misses": cache.misses if cache else 0}

    def fence(self, why: str) -> None:
        """Refuse every later write, tell the daemon once, raise."""
        first = not self.fenced
        self.fenced = why
        if first and self.on_fenced is not None:
            self.on_fenced(why)
        raise Fenced(f"fenced: {why}; nothing was written")

    def one(self, sql: str, *args: Any) -> Any:
        with self._lock:
            row = self.db.execute(sql, args).fetchone()
        return row

    def all(self, sql: str, *args: Any) -> list[Any]:
        with self._lock:
            return list(self.db.execute(sql, args).fetchall())

    def _append_event(self, db: Any, row: tuple[Any, ...]) -> int:
        if not self.db.defer_writes:
            cursor = db.execute(
                "INSERT INTO events (at, boot_id, kind, subject, data) VALUES (?, ?, ?, ?, ?) RETURNING cursor", row
            )
            return int(cursor.fetchone()[0])
        if not self._cursors:
            self._cursors = [
                int(r[0]) for r in self.db.send(
                    "SELECT nextval(pg_get_serial_sequence('events', 'cursor')) FROM generate_series(1, 64)"
                ).fetchall()
            ]
        cursor_id = self._cursors.pop(0)
        db.execute("INSERT INTO events (cursor, at, boot_id, kind, subject, data) VALUES (?, ?, ?, ?, ?, ?)",
                   (cursor_id, *row))
        return cursor_id

    def close(self) -> None:
        if self._sync_conn is not None:
            self._sync_conn.close()
        self.raw.close()


def ensure_cluster(conn: Any) -> None:
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('corral_cluster'))")
        for statement in CLUSTER_DDL:
            conn.execute(statement)


def connect_cluster(url: str) -> Any:
    """A connection for the cluster tables alone (nodes, partitions)."""
    conn = _connect(url)
    ensure_cluster(conn)
    return conn

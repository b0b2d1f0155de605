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
from corral.supervisor.read_cache import ReadCache, classify
from corral.supervisor.schema import MIGRATIONS
from corral.supervisor.sql_dialect import REFUSE_FUNCTION, statement_to_postgres, to_postgres

CLUSTER_SCHEMA = "corral_cluster"
PARTITION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")

CLUSTER_DDL = f"""
CREATE SCHEMA IF NOT EXISTS {CLUSTER_SCHEMA};
CREATE TABLE IF NOT EXISTS {CLUSTER_SCHEMA}.nodes (
    node_id      TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          BIGINT NOT NULL,
    home         TEXT NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL,
    lease_until  TIMESTAMPTZ NOT NULL,
    status       TEXT NOT NULL
);
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
);
"""


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


class _Fetched:
    """Rows already read (from the read cache), as a cursor offers them."""

    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows
        self._next = 0
        self.rowcount = len(rows)

    def fetchone(self) -> Any:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[Any]:
        rest, self._next = self._rows[self._next :], len(self._rows)
        return rest

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())


class _Connection:
    """What a store's ``db.execute(sql, params)`` talks to: SQLite's dialect in,
    PostgreSQL out, one cursor per statement. With ``cache`` (the writer's own
    ledger only), single-table reads are served from supervisor/read_cache.py."""

    def __init__(self, conn: Any, cache: ReadCache | None = None) -> None:
        self.conn = conn
        self.in_transaction = False
        self.cache = cache
        #: Statements sent to the server (what the bench divides by actions).
        self.round_trips = 0

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        args = tuple(params)
        cache = self.cache
        kind, table = classify(sql) if cache is not None else ("other", "")
        if cache is not None:
            if kind == "read":
                try:
                    rows = cache.get(sql, args)
                except TypeError:  # an unhashable parameter: read it
                    kind = "uncached"
                else:
                    if rows is not None:
                        return _Fetched(rows)
            elif kind == "write":
                cache.wrote(table)
            elif kind == "other":
                cache.clear()
        cursor = self.conn.cursor()
        cursor.execute(to_postgres(sql), args or None)
        self.round_trips += 1
        if cache is not None and kind == "read":
            rows = cursor.fetchall()
            cache.put(table, sql, args, rows)
            return _Fetched(rows)
        return cursor


class PostgresLedger(Ledger):
    backend = "postgresql"

    """One partition of a shared PostgreSQL database.

    ``epoch`` is the fencing token this supervisor holds (None: no writes are
    fenced, for tools that only read or that set a partition up). ``on_fenced``
    is called once, before ``Fenced`` is raised, so the daemon can stop.
    """

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
        self.readonly = readonly
        self._lock = threading.RLock()  # one connection: the trio thread and group commit's
        self.raw = _connect(url)
        #: The fenced writer alone may cache its reads: nobody else writes its partition.
        self.cache = ReadCache() if epoch is not None and not readonly else None
        self.db = _Connection(self.raw, self.cache)
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
            try:
                # One round trip: BEGIN, the commit mode and the fence check.
                opening = ["BEGIN"]
                if not fsync or self.group_commit:
                    opening.append("SET LOCAL synchronous_commit = off")
                if self.epoch is not None:
                    opening.append(self._fence_sql)
                cursor = self.raw.cursor()
                cursor.execute("; ".join(opening))
                self.db.round_trips += 2  # this, and the COMMIT
                self.db.in_transaction = True
                try:
                    if self.epoch is not None:
                        while cursor.nextset():
                            pass  # the fence row is the last result
                        self._check_fence(cursor.fetchone())
                    yield self.db
                except BaseException:
                    self._rollback()
                    raise
                try:
                    self.raw.execute("COMMIT")
                finally:
                    self.db.in_transaction = False
            except psycopg.errors.DiskFull as exc:
                self._rollback()
                self._storage_failed(exc)

    def _rollback(self) -> None:
        self.db.in_transaction = False
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
        # The partition name is checked by schema_of (letters, digits, - and _ only).
        return f"SELECT holder, epoch FROM {CLUSTER_SCHEMA}.partitions WHERE name = '{self.partition}' FOR SHARE"

    def _check_fence(self, row: Any) -> None:
        """The row lock (FOR SHARE) holds until this transaction ends: a takeover,
        which updates the row, waits for it, and this one sees no takeover."""
        if row is None or int(row[1]) != self.epoch:
            holder = f"node {row[0]} at epoch {row[1]}" if row else "nobody"
            self.fence(f"partition {self.partition} is now held by {holder} (this supervisor had epoch {self.epoch})")

    def counters(self) -> dict[str, int]:
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
        cursor = db.execute(
            "INSERT INTO events (at, boot_id, kind, subject, data) VALUES (?, ?, ?, ?, ?) RETURNING cursor", row
        )
        return int(cursor.fetchone()[0])

    def close(self) -> None:
        if self._sync_conn is not None:
            self._sync_conn.close()
        self.raw.close()


def ensure_cluster(conn: Any) -> None:
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('corral_cluster'))")
        for statement in CLUSTER_DDL.split(";"):
            if statement.strip():
                conn.execute(statement)


def connect_cluster(url: str) -> Any:
    """A connection for the cluster tables alone (nodes, partitions)."""
    conn = _connect(url)
    ensure_cluster(conn)
    return conn

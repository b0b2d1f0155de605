"""The PostgreSQL ledger: several supervisors (nodes) share one database.

Each node writes its runs into its own *partition*, a PostgreSQL schema holding
the same tables as an SQLite home, so every store's SQL runs unchanged
(supervisor/ledger/sql_dialect.py translates it). A partition is held under a lease
with a fencing token, its epoch, in ``corral_cluster.partitions``. Every write
transaction first locks that row ``FOR SHARE`` and checks the epoch: a node that
another node has fenced (by taking the partition over, which bumps the epoch
``FOR UPDATE``) cannot commit anything more, however late it wakes up. The row
lock orders the two: a write either commits before the takeover, which then
sees it, or finds the new epoch and rolls back. A node's writes also need its
lease to be live: one that lapsed (its renewals failed) is renewed first, or the
node finds itself fenced.

The database may go away (a restart, a terminated backend, refused connections)
and come back: see supervisor/ledger/ledger_link.py. Every write transaction of a node
also sets a commit marker (``corral_meta.commit_seq``), so that after a lost
connection the ledger can tell whether a COMMIT whose answer never came landed,
and whether commits it was told of were lost.

A node's requests run cooperatively (supervisor/ledger/cooperative.py): each open
transaction holds a connection of its own (supervisor/ledger/ledger_pg_pool.py), so one
waiting on the server does not hold the others. Each connection keeps its own
commit marker.

The wire (connecting, rows, pipelined transactions) is supervisor/ledger/ledger_pg_wire.py; the
cluster tables and the fence functions are supervisor/ledger/ledger_pg_cluster.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from corral.supervisor.errors import SupervisorError
from corral.supervisor.ledger import ledger_pg_queue
from corral.supervisor.ledger.cooperative import cooperating
from corral.supervisor.ledger.ledger_link import Backoff, LedgerUnavailable, connection_lost
from corral.supervisor.ledger.ledger_pg_cluster import (
    CLUSTER_SCHEMA,
    FENCE_SQLSTATE,
    LAPSED_SQLSTATE,
    RENEW_SQL,
    RUN_ID_KEY,
    ensure_cluster,
    schema_of,
)
from corral.supervisor.ledger.ledger_pg_pool import Pool, Slot
from corral.supervisor.ledger.ledger_pg_requests import PerRequest
from corral.supervisor.ledger.ledger_pg_sync import GroupSync, markers_of
from corral.supervisor.ledger.ledger_pg_wire import (
    Connection,
    PostgresUnavailable,
    connect,
    redact_url,
    table_shapes,
)
from corral.supervisor.ledger.port import Ledger, LedgerError, RunIdTaken, split_sql
from corral.supervisor.ledger.read_cache import ReadCache
from corral.supervisor.ledger.schema import MIGRATIONS
from corral.supervisor.ledger.sql_dialect import REFUSE_FUNCTION, statement_to_postgres

log = logging.getLogger("corral.ledger")

#: A COMMIT whose answer was lost: how long the writer tries to learn, there and
#: then, whether it landed (a restart is back within this), before it leaves the
#: question to the reconnection.
IN_DOUBT_WAIT_S = 3.0
#: A reconnection attempt gives up after this (it runs in a worker thread).
RECONNECT_TIMEOUT_S = 5
#: How long a write by code that is not cooperative waits for a row another open
#: transaction holds, before it gives up and is asked again.
BOUNDED_LOCK_WAIT = "2s"


class Fenced(SupervisorError):
    """This supervisor's lease on its partition was taken over: it must stop writing."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="fenced")


class PostgresLedger(PerRequest, Ledger):
    """One partition of a shared PostgreSQL database.

    ``epoch`` is the fencing token this supervisor holds (None: no writes are
    fenced, for tools that only read or that set a partition up). ``on_fenced``
    is called once, before ``Fenced`` is raised, so the daemon can stop.
    ``holder`` and ``lease_s`` (a node's writer): its writes need a live lease,
    which it renews itself when its node's renewals fell behind.
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
        holder: str | None = None,
        lease_s: float | None = None,
        lease_from: float | None = None,
        cooperative: bool = False,
        project: str | None = None,
    ) -> None:
        # Before the port's own state: its transaction flags are per request here.
        self._pool = Pool(self._open_slot)
        super().__init__()
        #: Group commit, as with SQLite: transactions commit without waiting for
        #: the WAL flush, and ``sync`` (before any reply leaves) waits for one
        #: flush that covers all of them.
        self.group_commit = group_commit
        self.url = url
        self.partition = partition
        #: The project root this partition's runs work in (the key of its shared
        #: revision, ``project_head``); None: none (a reader, a spec without files).
        self.project = project
        self.schema = schema_of(partition)
        self.where = f"postgresql ledger {redact_url(url)} partition {partition}"
        self.epoch = epoch
        self.on_fenced = on_fenced
        self.fenced = ""
        self._group_sync = GroupSync(url, partition, self.schema, epoch, where=self.where,
                                     timeout=RECONNECT_TIMEOUT_S, fence=self.fence, diverged=self._diverged)
        self.holder = holder if epoch is not None and lease_s else None
        self.lease_s = lease_s
        #: Until when (this host's monotonic clock) the lease surely holds: the
        #: time a renewal was sent, plus the lease. Conservative: the database
        #: set the lease's end later than that, by its own clock.
        self._lease_valid_until = (lease_from + lease_s) if lease_from is not None and lease_s else 0.0
        #: Since when (wall clock) the connection is lost, and why (None: it is not).
        self.lost_since: float | None = None
        self.lost_why = ""
        #: Called (from any thread) when the connection is found lost: wake the reconnection.
        self.on_lost: Callable[[], None] | None = None
        #: Called when the ledger lacks commits this writer was told of (a server
        #: crash lost them): its memory is ahead of its ledger, it must stop.
        self.on_diverged: Callable[[str], None] | None = None
        #: The commit marker of a COMMIT whose answer was lost, by marker key (one per connection).
        self.in_doubt: dict[str, int] = {}
        #: The last commit marker this writer set on each connection's key (and was told was committed).
        self._told: dict[str, int] = {}
        #: Give the lease up on close (an adoption that retired or handed its partition back).
        self.release_on_close = False
        self._application = f"corral-{'reader' if readonly else 'ledger'}:{partition}"
        self._lock = threading.RLock()  # a worker thread's reconnection against the event loop's reads
        self._reconnecting = threading.Lock()
        raw = connect(url, self._application)
        #: The fenced writer alone may cache its reads: nobody else writes its partition.
        self.cache = ReadCache() if epoch is not None and not readonly else None
        #: A node's writer may run its requests cooperatively, a connection per open
        #: transaction ([ledger] concurrent_requests). Off by default: requests that
        #: interleave at every database wait, and a cache whose patched rows other
        #: requests see before their commit, have not been through the crash soaks.
        self.cooperative = self.cache is not None and cooperative
        self._pool.adopt(raw, self._connection(raw))
        #: Event cursors taken from the sequence in blocks: an event's INSERT then
        #: needs no answer (no RETURNING to wait for) and travels in the pipeline
        #: like any write. One writer commits in order, so cursors still grow in
        #: commit order.
        self._cursors: list[int] = []
        #: The queued run this node is creating now: its claim takes it off the
        #: shared queue in the same transaction (supervisor/cluster/run_queue.py).
        self.from_queue: str | None = None
        try:
            if not readonly:
                ensure_cluster(self.raw)
                self._migrate()
                self._told = markers_of(self.raw, self.schema)
            elif not self._schema_exists():
                raise LedgerError(f"{self.where}: no such partition")
            self.raw.execute(f"SET search_path TO {self.schema}, public")
            if self.cache is not None:
                for table, shape in table_shapes(self.raw, self.schema).items():
                    self.cache.learn(table, shape)
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
            if self.epoch is not None:
                # A writer's migrations are writes too: fenced like the rest.
                self.raw.execute(f"SELECT {CLUSTER_SCHEMA}.fence(%s, %s)", (self.partition, self.epoch))
            self.raw.execute(f"SET LOCAL search_path TO {self.schema}, public")
            self.raw.execute(REFUSE_FUNCTION)
            self.raw.execute("CREATE TABLE IF NOT EXISTS corral_meta (key TEXT PRIMARY KEY, value BIGINT NOT NULL)")
            self.raw.execute("INSERT INTO corral_meta VALUES ('schema_version', 0) ON CONFLICT DO NOTHING")
            self.raw.execute("INSERT INTO corral_meta VALUES ('commit_seq', 0) ON CONFLICT DO NOTHING")
            self.raw.execute("INSERT INTO corral_meta VALUES ('syncs', 0) ON CONFLICT DO NOTHING")
            current = int(self.raw.execute("SELECT value FROM corral_meta WHERE key = 'schema_version'").fetchone()[0])
            if current > len(MIGRATIONS):
                raise LedgerError(f"{self.where} has schema {current}, newer than this corral ({len(MIGRATIONS)})")
            for version in range(current, len(MIGRATIONS)):
                for statement in split_sql(MIGRATIONS[version]):
                    self.raw.execute(statement_to_postgres(statement))
            self.raw.execute("UPDATE corral_meta SET value = %s WHERE key = 'schema_version'", (len(MIGRATIONS),))
            # Runs made before run ids were cluster-wide claim theirs, once.
            if self.raw.execute("INSERT INTO corral_meta VALUES ('run_ids_claimed', 1)"
                                " ON CONFLICT DO NOTHING RETURNING key").fetchone() is not None:
                self.raw.execute(f"INSERT INTO {CLUSTER_SCHEMA}.run_ids (run_id, partition, created_at)"
                                 " SELECT run_id, %s, clock_timestamp() FROM runs ON CONFLICT DO NOTHING",
                                 (self.partition,))

    @property
    def schema_version(self) -> int:
        row = self.one("SELECT value FROM corral_meta WHERE key = 'schema_version'")
        return int(row[0]) if row else 0

    # -- the connection -----------------------------------------------------------

    @property
    def available(self) -> bool:
        """The connection is up (transactions may run)."""
        return self.lost_since is None

    def _unavailable(self) -> LedgerUnavailable:
        since = time.strftime("%H:%M:%S", time.localtime(self.lost_since or time.time()))
        return LedgerUnavailable(
            f"{self.where} is unreachable since {since} ({self.lost_why}); nothing was committed."
            " corral reconnects by itself, and actors' requests wait for it"
        )

    def _lose(self, exc: BaseException) -> None:
        """The connection is gone: refuse every transaction until ``reconnect``."""
        if self.lost_since is not None:
            return
        self.lost_why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        self.lost_since = time.time()
        if self.full_since is None:
            self.full_since = self.lost_since  # status says degraded until a commit lands again
        log.error("%s: connection lost (%s); reconnecting", self.where, self.lost_why)
        self._pool.lost()  # the free connections close now, the busy ones when given back
        if self.on_lost is not None:
            self.on_lost()

    def _failed(self, exc: BaseException, db: Connection) -> None:
        """A statement failed outside the transaction machinery (a read): a lost
        connection becomes ``LedgerUnavailable``; anything else stays as it is."""
        if connection_lost(exc, db.conn):
            self._lose(exc)
            raise self._unavailable() from None

    def reconnect(self) -> bool:
        """A new connection for a ledger that lost its own (from a worker thread, or
        from the writer settling a COMMIT of unknown outcome): the fence checked
        and the lease renewed on it, the unknown commit settled, before any
        transaction runs. False: the server is still away."""
        import psycopg

        with self._reconnecting:
            if self.lost_since is None:
                return True
            try:
                conn = connect(self.url, self._application, timeout=RECONNECT_TIMEOUT_S)
            except PostgresUnavailable as exc:
                self.lost_why = str(exc)[:200]
                return False
            try:
                conn.execute(f"SET search_path TO {self.schema}, public")
                if self.epoch is not None:
                    self._check_fence(conn)
                    self._settle(markers_of(conn, self.schema))
            except psycopg.Error as exc:
                conn.close()
                self.lost_why = (str(exc).strip().splitlines() or ["?"])[0][:200]
                return False
            except BaseException:
                conn.close()
                raise
            self._pool.replace_home(conn, self._connection(conn))
            self.lost_since = None
            self.lost_why = ""
            log.warning("%s: connection restored", self.where)
            return True

    def _check_fence(self, conn: Any) -> None:
        """On a new connection: the partition is still this writer's (else it is
        fenced and stops), and its lease is renewed (it may have lapsed meanwhile)."""
        row = conn.execute(
            f"SELECT epoch, holder FROM {CLUSTER_SCHEMA}.partitions WHERE name = %s", (self.partition,)
        ).fetchone()
        if row is None or int(row[0]) != self.epoch:
            conn.close()
            held, by = (row[0], row[1]) if row else (None, "nobody")
            self.fence(f"partition {self.partition} is now held by node {by} at epoch {held}"
                       f" (this writer had epoch {self.epoch})")
        if self.holder is not None and self.lease_s is not None:
            sent = time.monotonic()
            if conn.execute(RENEW_SQL, (self.lease_s, self.partition, self.epoch, self.holder)).fetchone() is None:
                conn.close()
                self.fence(f"the lease on partition {self.partition} was taken over")
            self.lease_renewed(sent)

    def _settle(self, markers: dict[str, int]) -> None:
        """What the ledger holds against what this writer was told, per connection's
        marker: a COMMIT whose answer was lost landed if its marker reached it; a
        marker behind the last commit this writer was told of means commits were lost."""
        for key, doubt in sorted(self.in_doubt.items()):
            landed = markers.get(key, 0) >= doubt
            log.warning("%s: the commit whose answer was lost %s", self.where,
                        "had landed" if landed else "had not landed: nothing of it was written")
            if landed:
                self._told[key] = doubt
        self.in_doubt = {}
        for key, told in sorted(self._told.items()):
            held = markers.get(key, 0)
            if held < told:
                self._diverged(f"it holds commit {held} of {key}, and this writer was told of commit {told}")
        self._told.update(markers)

    def _diverged(self, why: str) -> None:
        message = f"{self.where} lost commits ({why}); the supervisor must restart from what it holds"
        if self.on_diverged is not None:
            self.on_diverged(message)
        raise LedgerError(message)

    def lease_renewed(self, sent_at: float) -> None:
        """A renewal sent at ``sent_at`` (monotonic) succeeded (any thread)."""
        if self.lease_s is not None:
            self._lease_valid_until = max(self._lease_valid_until, sent_at + self.lease_s)

    def _guard_lease(self, slot: Slot) -> None:
        """Before a write: a lease that may lapse before this write lands (the
        node's renewals fell a whole interval behind, or it lapsed) is renewed
        first; a lease taken over fences this writer."""
        import psycopg

        if self.holder is None or self.lease_s is None:
            return
        if time.monotonic() < self._lease_valid_until - self.lease_s / 3:
            return
        if not cooperating() and self._pool.in_other_transactions(slot.db):
            # The renewal waits for the partition's row, which every open
            # transaction holds (its fence): blocking the event loop for it would
            # hold them forever. The write's own fence checks the lease instead
            # (a lapsed one fails it, and it is asked again).
            return
        sent = time.monotonic()
        try:
            # Through the wire: a request waits for it cooperatively.
            row = slot.db.send(RENEW_SQL, (self.lease_s, self.partition, self.epoch, self.holder)).fetchone()
        except psycopg.Error as exc:
            self._failed(exc, slot.db)
            raise
        if row is None:
            self.fence(f"the lease on partition {self.partition} was taken over")
        self.lease_renewed(sent)

    # -- transactions -----------------------------------------------------------

    @contextmanager
    def _transaction(self, *, fsync: bool) -> Iterator[Connection]:
        if self.fenced:
            raise Fenced(self.fenced)
        if self.lost_since is not None:
            raise self._unavailable()
        state = self._pool.state()
        slot = self._pool.take()  # a request run cooperatively may wait here for one
        state.slot = slot
        try:
            with self._lock:
                yield from self._on(slot, fsync)
        finally:
            state.slot = None
            state.low_cursor = 0  # committed or rolled back: readers may see past it
            state.claimed = None
            self._pool.give(slot)
            self._pool.tidy(state)

    def _on(self, slot: Slot, fsync: bool) -> Iterator[Connection]:
        """The transaction, on ``slot``'s connection: its own commit marker."""
        import psycopg

        db = slot.db
        self._guard_lease(slot)
        # Nothing is sent yet: BEGIN, the commit mode and the fence check
        # open the pipeline with the transaction's first statement. The fence
        # raises inside the server, so a fenced pipeline aborts before its
        # COMMIT, whatever follows it.
        opening = ["BEGIN"]
        if not fsync or self.group_commit:
            opening.append("SET LOCAL synchronous_commit = off")
        if self.epoch is not None:
            opening.append(self._fence_sql)
        # Code that is not cooperative blocks the event loop while it waits: were it
        # to wait for a row a suspended request's transaction holds, that request
        # could never finish. Such a wait gives up instead (nothing is committed,
        # the caller is held and asks again once the loop has run).
        bounded = not cooperating() and self._pool.in_other_transactions(db)
        if bounded:
            opening.append(f"SET LOCAL lock_timeout = '{BOUNDED_LOCK_WAIT}'")
        db.begin(opening)
        marker: int | None = None
        try:
            yield db
            if not db.sent:
                db.abandon()  # it ran no statement: no round trip at all
            else:
                closing: list[tuple[str, tuple[Any, ...]]] = []
                if self.epoch is not None:
                    marker = self._told.get(slot.key, 0) + 1
                    closing.append(("UPDATE corral_meta SET value = %s WHERE key = %s", (marker, slot.key)))
                db.commit(closing)
                if marker is not None:
                    self._told[slot.key] = marker
        except psycopg.Error as exc:
            self._rollback(db)
            sqlstate = getattr(exc, "sqlstate", None)
            if isinstance(exc, psycopg.errors.UniqueViolation) and exc.diag.constraint_name == RUN_ID_KEY:
                raise RunIdTaken(self._pool.state().claimed or "?") from None
            if sqlstate == FENCE_SQLSTATE:
                self.fence(str(exc.diag.message_primary or exc).removeprefix("corral-fenced: "))
            if sqlstate == LAPSED_SQLSTATE:
                self._lease_valid_until = 0.0  # the next write renews it first
                raise LedgerUnavailable(
                    f"{self.where}: this node's lease lapsed; nothing was committed. It is renewed"
                    " before the next write (or the node finds itself fenced and stops)"
                ) from None
            if isinstance(exc, psycopg.errors.DiskFull):
                self._storage_failed(exc)
            if bounded and isinstance(exc, psycopg.errors.LockNotAvailable):
                raise LedgerUnavailable(
                    f"{self.where}: a row this write needs is held by a transaction still running; nothing was"
                    " committed, and the write is asked again"
                ) from None
            if not connection_lost(exc, slot.raw):
                raise
            self._lose(exc)
            if marker is None or not self._landed(slot.key, marker):
                raise self._unavailable() from None
            # It landed: as if the COMMIT's answer had come.
            log.warning("%s: a commit whose answer was lost had landed", self.where)
        except BaseException:
            self._rollback(db)
            raise

    def _landed(self, key: str, marker: int) -> bool:
        """The COMMIT carrying ``marker`` was sent and its answer lost: reconnect
        now (a restart is back within ``IN_DOUBT_WAIT_S``) and read the marker.
        Past that, the question waits for the reconnection, and the transaction
        counts as not committed (its request is held and asked again)."""
        self.in_doubt[key] = marker
        backoff = Backoff()
        deadline = time.monotonic() + IN_DOUBT_WAIT_S
        while time.monotonic() < deadline:
            time.sleep(backoff.next_delay())
            if self.reconnect():
                return self._told.get(key, 0) >= marker
        return False

    def _rollback(self, db: Connection) -> None:
        db.abandon()  # with its ROLLBACK
        if self.cache is not None:
            self.cache.clear()  # it may hold rows this transaction wrote

    def sync(self) -> int:
        """Wait until every commit so far is flushed (supervisor/ledger/ledger_pg_sync.py:
        one fenced, synchronously committed write on a second connection)."""
        if self.fenced:
            raise Fenced(self.fenced)
        covered = self.commits
        self._group_sync.flush(dict(self._told))
        return covered

    @property
    def _fence_sql(self) -> str:
        """The row lock (FOR SHARE, in the function) holds until this transaction
        ends: a takeover, which updates the row, waits for it, and this one sees no
        takeover. The partition name is checked by schema_of (letters, digits, -
        and _ only). A node's writer also needs its lease live (``fence_lease``)."""
        function = "fence_lease" if self.holder is not None else "fence"
        return f"SELECT {CLUSTER_SCHEMA}.{function}('{self.partition}', {int(self.epoch or 0)})"

    def rows_as_text(self) -> str:
        """Every row of the partition, as text: what a scan for secrets reads
        (with SQLite it reads the file)."""
        tables = [row[0] for row in self.all(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")]
        return "\n".join(repr(tuple(row)) for table in tables for row in self.all(f"SELECT * FROM {table}"))

    def counters(self) -> dict[str, int]:
        """Round trips to the server and read-cache hits, for status and the bench."""
        cache = self.cache
        return {"round_trips": self._pool.round_trips(), "cache_hits": cache.hits if cache else 0,
                "cache_misses": cache.misses if cache else 0}

    def fence(self, why: str) -> None:
        """Refuse every later write, tell the daemon once, raise."""
        first = not self.fenced
        self.fenced = why
        if first and self.on_fenced is not None:
            self.on_fenced(why)
        raise Fenced(f"fenced: {why}; nothing was written")

    def one(self, sql: str, *args: Any) -> Any:
        import psycopg

        if self.lost_since is not None:
            raise self._unavailable()
        with self._reading() as db:
            try:
                return db.execute(sql, args).fetchone()
            except psycopg.Error as exc:
                self._failed(exc, db)
                raise

    def all(self, sql: str, *args: Any) -> list[Any]:
        import psycopg

        if self.lost_since is not None:
            raise self._unavailable()
        with self._reading() as db:
            try:
                return list(db.execute(sql, args).fetchall())
            except psycopg.Error as exc:
                self._failed(exc, db)
                raise

    def _append_event(self, db: Any, row: tuple[Any, ...]) -> int:
        if self.cache is None:
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
        state = self._pool.state()
        if not state.low_cursor:
            state.low_cursor = cursor_id  # readers see nothing from here on until this commits
        db.execute("INSERT INTO events (cursor, at, boot_id, kind, subject, data) VALUES (?, ?, ?, ?, ?, ?)",
                   (cursor_id, *row))
        return cursor_id

    def _event_ceiling(self) -> int | None:
        """Readers of the event stream stop below the first cursor an open
        transaction holds: transactions on several connections commit in any
        order, and a reader must not page past an event that commits later."""
        low = self._pool.low_cursor()
        return low if low else None

    def claim_run_id(self, run_id: str) -> None:
        """The run id's row in ``corral_cluster.run_ids``, in the run's creating
        transaction (after its fence check): the two commit or roll back together.
        It travels in the pipeline (no round trip of its own); an id another
        partition holds fails the COMMIT, and the transaction raises
        ``RunIdTaken``. One that another node is creating right now waits for
        that node's transaction, then fails if it committed."""
        self._pool.state().claimed = run_id
        if run_id == self.from_queue:
            ledger_pg_queue.take(self.db, run_id)  # this node takes it off the shared queue, or nothing
        self.db.send(f"INSERT INTO {CLUSTER_SCHEMA}.run_ids (run_id, partition, created_at)"
                     " VALUES (%s, %s, clock_timestamp())", (run_id, self.partition))

    def project_head(self, *, at_least: int | None = None) -> int | None:
        """The project root's one revision, shared by every partition (``corral_cluster.
        project_heads``). Advancing locks its row until this transaction ends, so two
        nodes' writes to one root get two numbers, in the order they commit; a node
        fenced meanwhile rolls its number back with its write. Read past the read
        cache: other partitions write it."""
        import psycopg

        if self.project is None:
            return None
        if at_least is not None:
            row = self.db.send(
                f"INSERT INTO {CLUSTER_SCHEMA}.project_heads AS head (project, revision) VALUES (%s, %s)"
                " ON CONFLICT (project) DO UPDATE SET revision = GREATEST(head.revision + 1, EXCLUDED.revision)"
                " RETURNING revision", (self.project, at_least)).fetchone()
            return int(row[0])
        if self.lost_since is not None:
            raise self._unavailable()
        with self._reading() as db:
            try:
                row = db.send(f"SELECT revision FROM {CLUSTER_SCHEMA}.project_heads WHERE project = %s",
                              (self.project,)).fetchone()
            except psycopg.Error as exc:
                self._failed(exc, db)
                raise
        return int(row[0]) if row is not None else 0

    def run_elsewhere(self, run_id: str) -> dict[str, Any] | None:
        """Read from the partition that holds it (not through the read cache: it
        is another writer's). A read: any node may read any partition."""
        import psycopg

        if self.lost_since is not None:
            raise self._unavailable()
        with self._reading() as db:
            try:
                return ledger_pg_queue.run_elsewhere(db, run_id, self.partition, self.where)
            except psycopg.Error as exc:
                self._failed(exc, db)
                raise

    def release(self) -> None:
        """Give the lease up now: the partition is free at once, not when its lease
        runs out (an adoption that retired, or handed the partition back)."""
        if self.holder is None or self.lost_since is not None or self._pool.in_other_transactions(None):
            return  # it runs out by itself (blocking the loop for the row could hold them forever)
        try:
            with self._reading() as db:
                db.conn.execute(
                    f"UPDATE {CLUSTER_SCHEMA}.partitions SET lease_until = clock_timestamp()"
                    " WHERE name = %s AND epoch = %s AND holder = %s",
                    (self.partition, self.epoch, self.holder),
                )
        except Exception as exc:  # it runs out by itself
            log.warning("%s: could not release the lease (%s)", self.where, exc)

    def close(self) -> None:
        if self.release_on_close:
            self.release()
        self._group_sync.close()
        self._pool.close()

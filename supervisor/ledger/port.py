"""The ledger: the port every store writes through, and its embedded SQLite backend.

Every change that protects a later step is one transaction committed (fsync'd with
``synchronous=FULL``) before that step runs. State changes and the events that
describe them commit together, so the event stream never disagrees with the state.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

from corral.core import failpoints
from corral.core.redact import redact
from corral.supervisor.errors import StorageFull
from corral.supervisor.ledger import high_water
from corral.supervisor.ledger.schema import MIGRATIONS
from corral.supervisor.runs.run_versions import RunVersions


class LedgerError(RuntimeError):
    pass


class RunIdTaken(Exception):
    """Another ledger sharing this one's database committed a run with this id
    first (a cluster: supervisor/ledger/ledger_pg.py); nothing was written."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} was created by another node")
        self.run_id = run_id


#: SQLite result codes that mean the storage, not the statement, failed.
_SQLITE_FULL, _SQLITE_IOERR = 13, 10


def _storage_failure(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (_SQLITE_FULL, _SQLITE_IOERR) or "disk is full" in str(exc)


SQLITE_HEADER = b"SQLite format 3\x00"
#: Committed plans a ledger keeps in memory (the runs being stepped need a few).
PLAN_CACHE_SIZE = 1024
_WHAT_TO_DO = (
    "corral will not replace it (that would lose its history): restore it from a backup,"
    " or move it away to start an empty ledger; `corral doctor` checks a home"
)


def check_ledger_file(path: Path) -> None:
    """Refuse a ledger file that exists but is not a usable SQLite database: empty,
    truncated below its header, or with a foreign header. A missing file is fine
    (a new home)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        raise LedgerError(f"ledger {path} is empty (0 bytes); {_WHAT_TO_DO}")
    with open(path, "rb") as handle:
        header = handle.read(len(SQLITE_HEADER))
    if header != SQLITE_HEADER:
        raise LedgerError(f"ledger {path} is not an SQLite database (damaged header); {_WHAT_TO_DO}")


def _create(path: Path) -> None:
    """A new ledger is built beside its final name and renamed into place once it
    holds its schema: a crash during creation leaves no half-made ``ledger.db``, so
    an empty ``ledger.db`` always means damage (and is refused, never replaced)."""
    staging = path.with_name(path.name + ".new")
    for leftover in (staging, staging.with_name(staging.name + "-wal"), staging.with_name(staging.name + "-shm")):
        leftover.unlink(missing_ok=True)
    db = sqlite3.connect(staging, isolation_level=None)
    try:
        staging.chmod(0o600)
        # The staging file counts only once it is renamed into place, after the
        # fsync below: until then nothing needs to be durable, so the whole schema
        # is one unsynced transaction (one per migration took ~25 syncs per new home).
        db.execute("PRAGMA synchronous = OFF")
        db.execute("BEGIN IMMEDIATE")
        for migration in MIGRATIONS:
            for statement in split_sql(migration):
                db.execute(statement)
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
        db.execute("COMMIT")
    finally:
        db.close()
    failpoints.hit("ledger.after-staging")
    fd = os.open(staging, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(staging, path)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def integrity_problems(db: sqlite3.Connection, limit: int = 5) -> list[str]:
    """``PRAGMA quick_check``: an empty list when the database is sound."""
    rows = [str(row[0]) for row in db.execute(f"PRAGMA quick_check({int(limit)})").fetchall()]
    return [] if rows == ["ok"] else rows


class _Joined:
    """A nested transaction: it joins the open one (its commit or rollback decides)."""

    __slots__ = ("db",)

    def __init__(self, db: Any) -> None:
        self.db = db

    def __enter__(self) -> Any:
        return self.db

    def __exit__(self, *exc: object) -> None:
        return None


class Ledger:
    """The ledger port: what every store and service uses, whatever the backend.

    Transactions (``tx``, nested calls join the outer one), reads (``one``, ``all``),
    the event log and its cursor (``event``, ``events_since``, ``last_cursor``), boots
    (``begin_boot``, ``end_boot``: the restart that recovery scans follow), and the
    durability hooks group commit uses (``unsynced``, ``sync``). Stores speak SQL in
    SQLite's dialect; a backend translates it (supervisor/ledger/sql_dialect.py). Rows
    behave like ``sqlite3.Row``: by index, by name, ``keys()``.

    Backends: ``SqliteLedger`` (the embedded default, one file per home) and
    ``PostgresLedger`` (supervisor/ledger/ledger_pg.py: several supervisors share one
    database, each in its own partition, every write fenced by its lease epoch).
    """

    #: Where this ledger lives, for messages ("ledger /x/ledger.db", "postgresql ...").
    where: str = "ledger"
    backend: str = "sqlite"
    #: Commits that must be durable before a reply leaves, and how many are.
    durable_commits = 0
    synced_commits = 0
    group_commit = False
    #: Whether requests should run cooperatively (supervisor/ledger/cooperative.py):
    #: a ledger whose every answer is a round trip to a server, with a connection
    #: per open transaction. SQLite answers in microseconds: never.
    cooperative = False
    db: Any

    def __init__(self) -> None:
        self.boot_id = ""
        self._in_tx = False
        self._listeners: list[Callable[[], None]] = []
        #: What waits for the open transaction's commit (dropped if it rolls back).
        self._after_commit: list[Callable[[], None]] = []
        #: Committed plans by (run, loop): a plan is written once and never changed,
        #: so a committed one may be kept (see ``committed_plan``).
        self._plans: OrderedDict[tuple[str, int], tuple[str, str | None]] = OrderedDict()
        #: Loops read without a plan, kept only by a backend that sees every plan
        #: written (``_plans_watched``: SQLite's one writer, from a TEMP trigger that
        #: drops the loop at its plan's insert). A step asks for the plan of a loop
        #: that has none yet three or four times before it is committed.
        self._no_plan: set[tuple[str, int]] = set()
        self._plans_watched = False
        self.commits = 0
        #: ``tx`` calls, joined ones too (``changes``).
        self._writes = 0
        #: Outer transactions begun: names the open one (``open_transaction``).
        self.transactions = 0
        #: Since when commits fail for lack of space (None: they do not).
        self.full_since: float | None = None
        #: Per-run versions of what a step boundary reads (supervisor/runs/run_versions.py):
        #: kept only by a backend that sees every write as it happens.
        self.run_versions = RunVersions()

    # -- what a backend provides ------------------------------------------------

    def _transaction(self, *, fsync: bool) -> AbstractContextManager[Any]:
        """BEGIN, yield the connection, COMMIT (ROLLBACK on an error); ``fsync=False``
        may relax durability for that one commit."""
        raise NotImplementedError

    def one(self, sql: str, *args: Any) -> sqlite3.Row | None:
        raise NotImplementedError

    def all(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        raise NotImplementedError

    def _append_event(self, db: Any, row: tuple[Any, ...]) -> int:
        raise NotImplementedError

    @property
    def schema_version(self) -> int:
        raise NotImplementedError

    def sync(self) -> int:
        """Make every commit so far durable; returns the commit count it covers."""
        return self.commits

    def counters(self) -> dict[str, int]:
        """What the backend counts beyond commits (status shows it); none here."""
        return {}

    def close(self) -> None:
        raise NotImplementedError

    def claim_run_id(self, run_id: str) -> None:
        """In the open transaction: the new run ``run_id`` is this ledger's alone
        among every ledger sharing its database (``RunIdTaken`` at commit if
        another has it). One home is one ledger: its runs table's key is enough."""

    def run_elsewhere(self, run_id: str) -> dict[str, Any] | None:
        """The run ``run_id`` another ledger sharing this database holds: its
        ``run_id``, ``agent_id``, ``status``, ``partition`` and its ``final_reply``
        (None: none yet); None: none does."""
        return None

    # -- transactions -----------------------------------------------------------

    def tx(self, *, fsync: bool = True) -> AbstractContextManager[Any]:
        """One write transaction; nested calls join the outer one.

        ``fsync=False`` is for bookkeeping that guards no side effect (actor
        lifecycle rows): such a commit survives any process crash and only a power
        loss could drop it, and the next fsync'd commit (every action step is one)
        makes it durable too. Everything else is durable before the step it
        protects.
        """
        # A joined (nested) transaction is the common case on the hot path: a plain
        # object, not a generator-based context manager per call.
        self._writes += 1
        return _Joined(self.db) if self._in_tx else self._outer_tx(fsync)

    def changes(self) -> int:
        """A count that moves at every write, also inside an open transaction
        (``commits`` moves at an outer commit only): what a step boundary compares
        to learn whether a hook wrote. Here every ``tx`` counts, written or not."""
        return self._writes

    @contextmanager
    def _outer_tx(self, fsync: bool) -> Iterator[Any]:
        try:
            with self._transaction(fsync=fsync) as db:
                self._in_tx = True
                self.transactions += 1
                try:
                    yield db
                finally:
                    self._in_tx = False
        except BaseException:
            # Rolled back: what waited for this commit never happens, and a plan read
            # inside it may be one that was never committed.
            self._after_commit.clear()
            self._plans.clear()
            # A run found quiet inside it may have been quiet only with its writes.
            self.run_versions.forget_quiet()
            raise
        self.commits += 1
        if fsync and self.group_commit:
            self.durable_commits = self.commits
        if self.full_since is not None:
            self.full_since = None
        for listener in self._listeners:
            listener()
        if self._after_commit:
            waiting, self._after_commit = self._after_commit, []
            for then in waiting:
                then()

    def open_transaction(self) -> int | None:
        """The open write transaction's serial number, or None outside one. Code in
        one transaction runs with no await between its statements, so what it
        checked once (a file's stat) holds for the whole of it."""
        return self.transactions if self._in_tx else None

    def after_commit(self, then: Callable[[], None]) -> None:
        """Run ``then`` once what was written so far is committed: at once outside a
        transaction, after the outer commit inside one (never, if it rolls back).
        Failpoints named "after X" and the removal of what X made unnecessary use it,
        so they keep their meaning when X joins a larger transaction."""
        if self._in_tx:
            self._after_commit.append(then)
        else:
            then()

    def failpoint(self, name: str) -> None:
        """The failpoint ``name`` of a step this ledger commits ("after X"): hit once
        X is committed, also when X joined a larger transaction (a read batch, a
        child's finish that delivers its join), so that it kills in the window its
        name says and not before the commit."""
        self.after_commit(partial(failpoints.hit, name))

    def committed_plan(self, run_id: str, loop_index: int) -> tuple[str, str | None] | None:
        """Loop ``loop_index``'s plan (its JSON and its raw copy's digest), or None.
        Every step reads it; it is read from the database once."""
        key = (run_id, loop_index)
        cached = self._plans.get(key)
        if cached is not None:
            return cached
        if key in self._no_plan:
            return None
        row = self.one("SELECT plan, raw_sha256 FROM plans WHERE run_id = ? AND loop_index = ?", run_id, loop_index)
        if row is None:
            if self._plans_watched:
                if len(self._no_plan) >= PLAN_CACHE_SIZE:
                    self._no_plan.clear()
                # No rollback can make it wrong: a rolled-back insert dropped it too.
                self._no_plan.add(key)
            return None
        plan = (str(row["plan"]), row["raw_sha256"])
        self._plans[key] = plan
        if len(self._plans) > PLAN_CACHE_SIZE:
            self._plans.popitem(last=False)
        return plan

    def plan_written(self, run_id: str, loop_index: int, plan: str, raw_sha256: str | None) -> None:
        """The plan just inserted in the open transaction, as ``committed_plan`` would
        read it back: kept at once (a rollback forgets it with every kept plan)."""
        self._no_plan.discard((run_id, loop_index))
        self._plans[(run_id, loop_index)] = (plan, raw_sha256)
        if len(self._plans) > PLAN_CACHE_SIZE:
            self._plans.popitem(last=False)

    def _storage_failed(self, exc: Exception) -> None:
        if self.full_since is None:
            self.full_since = time.time()
        raise StorageFull(
            f"the ledger's disk is full or failing ({exc}); nothing was committed. Free space on"
            f" {self.where} and corral resumes by itself"
        ) from None

    @property
    def unsynced(self) -> bool:
        """Commits that must be durable before a reply leaves are not yet synced."""
        return self.durable_commits > self.synced_commits

    def on_commit(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    # -- events -----------------------------------------------------------------

    def event(self, kind: str, subject: str, /, **data: Any) -> int:
        """Append an event (inside the caller's transaction when there is one)."""
        with self.tx() as db:
            return self._append_event(db, (time.time(), self.boot_id, kind, subject, dumps(redact(data))))

    def emit(self, kind: str, subject: str, /, **data: Any) -> None:
        """Append an event whose cursor its caller does not need (``event`` answers
        it): a backend may keep it until the transaction commits and write all of
        the transaction's events at once (SQLite: one INSERT), in their order and
        with the same cursors. Outside a transaction it is its own, at once."""
        self.event(kind, subject, **data)

    def events_since(self, cursor: int, limit: int = 500, max_bytes: int = 256 * 1024) -> list[dict[str, Any]]:
        """A page of events after ``cursor``: at most ``limit`` of them and about
        ``max_bytes`` of data, so a reply always fits a frame; callers page on."""
        ceiling = self._event_ceiling()
        if ceiling is None:
            rows = self.all(
                "SELECT cursor, at, boot_id, kind, subject, data FROM events WHERE cursor > ? ORDER BY cursor LIMIT ?",
                cursor,
                limit,
            )
        else:
            rows = self.all(
                "SELECT cursor, at, boot_id, kind, subject, data FROM events WHERE cursor > ? AND cursor < ?"
                " ORDER BY cursor LIMIT ?",
                cursor,
                ceiling,
                limit,
            )
        page: list[dict[str, Any]] = []
        size = 0
        for row in rows:
            size += len(row["data"]) + len(row["subject"]) + 64
            if page and size > max_bytes:
                break
            page.append(
                {
                    "cursor": row["cursor"],
                    "at": row["at"],
                    "boot_id": row["boot_id"],
                    "kind": row["kind"],
                    "subject": row["subject"],
                    "data": json.loads(row["data"]),
                }
            )
        return page

    def last_cursor(self) -> int:
        ceiling = self._event_ceiling()
        if ceiling is not None:
            row = self.one("SELECT MAX(cursor) AS c FROM events WHERE cursor < ?", ceiling)
        else:
            row = self.one("SELECT MAX(cursor) AS c FROM events")
        return int(row["c"] or 0) if row else 0

    def _event_ceiling(self) -> int | None:
        """The first event cursor readers may not see yet (None: all committed ones).
        One writer on one connection commits in cursor order: nothing to hide."""
        return None

    # -- boots ------------------------------------------------------------------

    def begin_boot(self, boot_id: str, pid: int, protocol: int) -> int:
        with self.tx() as db:
            for row in db.execute("SELECT boot_id FROM boots WHERE ended_at IS NULL").fetchall():
                db.execute(
                    "UPDATE boots SET ended_at = ?, end_reason = 'crashed' WHERE boot_id = ?",
                    (time.time(), row["boot_id"]),
                )
            seq = int(db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM boots").fetchone()[0])
            db.execute(
                "INSERT INTO boots (boot_id, seq, pid, protocol, started_at) VALUES (?, ?, ?, ?, ?)",
                (boot_id, seq, pid, protocol, time.time()),
            )
            self.boot_id = boot_id
            self.event("boot-started", boot_id, seq=seq, pid=pid)
        return seq

    def end_boot(self, reason: str) -> None:
        with self.tx() as db:
            db.execute(
                "UPDATE boots SET ended_at = ?, end_reason = ? WHERE boot_id = ?",
                (time.time(), reason, self.boot_id),
            )
            self.event("boot-ended", self.boot_id, reason=reason)


class SqliteLedger(Ledger):
    """The embedded default: one SQLite file per home, WAL mode."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "full",
        readonly: bool = False,
        immutable: bool = False,
        check: bool = False,
        group_commit: bool = False,
    ) -> None:
        """``immutable``: read a file nobody writes meanwhile (no ``-wal``/``-shm``
        made, no lock taken); the caller guarantees it (corral/offline_read.py holds
        the home's lock shared, and opens only a ledger whose log is empty).

        ``check``: the open that boots a supervisor. The file, its integrity and its
        high-water mark (supervisor/ledger/high_water.py) are checked before anything
        is written: a ledger that lost durable commits is refused. It then keeps the
        mark as its commits become durable."""
        super().__init__()
        self.path = path
        #: The high-water mark this ledger keeps (a checked, writable open only).
        self._high_water: high_water.HighWater | None = None
        #: Events emitted in the open transaction, not yet written (``emit``).
        self._pending: list[tuple[Any, ...]] = []
        #: The newest event of the open transaction, and of the last commit.
        self._tx_cursor = 0
        self._committed_cursor = 0
        self.where = f"ledger {path}"
        #: With group commit, SQLite appends to the WAL without an fsync per commit
        #: and ``sync()`` (called in batches before any reply leaves: see
        #: supervisor/ledger/group_commit.py) makes every commit so far durable at once.
        self.group_commit = group_commit and synchronous == "full"
        sqlite_sync = "normal" if self.group_commit else synchronous
        if check:
            check_ledger_file(path)
        readonly = readonly or immutable
        if not readonly and not path.exists():
            high_water.forget(path)  # a ledger moved away on purpose: its mark goes too
            _create(path)
        if check and not readonly:
            # Before this process opens it for writing: closing a writable connection
            # checkpoints the log and removes it, and with it the commits past a damage.
            self._committed_cursor = judge_high_water(path)
        uri = f"file:{quote(str(path))}" + ("?immutable=1" if immutable else "?mode=ro" if readonly else "")
        self.db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        try:
            self.db.execute("PRAGMA busy_timeout = 5000")
            self.db.execute("PRAGMA foreign_keys = ON")
            if check:
                problems = integrity_problems(self.db)
                if problems:
                    raise LedgerError(f"ledger {path} is damaged ({'; '.join(problems)[:300]}); {_WHAT_TO_DO}")
            if check and not readonly:
                self._high_water = high_water.HighWater(path)
            if not readonly:
                path.chmod(0o600)
                mode = self.db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode != "wal":
                    raise LedgerError(f"ledger {path}: cannot enable WAL (got {mode})")
                self.db.execute(f"PRAGMA synchronous = {sqlite_sync.upper()}")
                self._migrate()
                self.run_versions.keep(self.db)  # the one writer's connection: it sees every write
                self._watch_plans()
                if self._high_water is not None:
                    self.sync()  # what the last process committed but had not synced yet
                    self._high_water.start(self._committed_cursor)
        except sqlite3.DatabaseError as exc:
            self._close_high_water()
            self.db.close()
            raise LedgerError(f"ledger {path} cannot be opened ({exc}); {_WHAT_TO_DO}") from None
        except LedgerError:
            self._close_high_water()
            self.db.close()
            raise
        except OSError as exc:  # the high-water mark's file
            self._close_high_water()
            self.db.close()
            raise LedgerError(f"ledger {path}: its high-water mark cannot be kept ({exc}); {_WHAT_TO_DO}") from None
        self.synchronous = synchronous
        self.sqlite_sync = sqlite_sync

    # -- schema -----------------------------------------------------------------

    def _migrate(self) -> None:
        current = self.db.execute("PRAGMA user_version").fetchone()[0]
        if current > len(MIGRATIONS):
            raise LedgerError(f"ledger {self.path} has schema {current}, newer than this corral ({len(MIGRATIONS)})")
        for version in range(current, len(MIGRATIONS)):
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for statement in split_sql(MIGRATIONS[version]):
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {version + 1}")
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        return int(self.db.execute("PRAGMA user_version").fetchone()[0])

    def _watch_plans(self) -> None:
        """Drop a loop from ``_no_plan`` when its plan is inserted, whichever store
        writes it (this connection's writes alone: the one writer's)."""
        self.db.create_function("corral_plan_written", 2, lambda run_id, loop: self._no_plan.discard((run_id, loop)))
        self.db.execute(
            "CREATE TEMP TRIGGER IF NOT EXISTS plan_written AFTER INSERT ON main.plans"
            " BEGIN SELECT corral_plan_written(NEW.run_id, NEW.loop_index); END"
        )
        self._plans_watched = True

    # -- the high-water mark ------------------------------------------------------

    def _close_high_water(self) -> None:
        if self._high_water is not None:
            self._high_water.close()
            self._high_water = None

    # -- transactions -----------------------------------------------------------

    @contextmanager
    def _transaction(self, *, fsync: bool) -> Iterator[sqlite3.Connection]:
        relaxed = not fsync and self.sqlite_sync == "full"
        if relaxed:
            self.db.execute("PRAGMA synchronous = NORMAL")
        try:
            try:
                self.db.execute("BEGIN IMMEDIATE")
                self._tx_cursor = 0
                try:
                    yield self.db
                except BaseException:
                    self._rollback()
                    raise
                try:
                    if self._pending:
                        self._write_pending()
                    self.db.execute("COMMIT")
                except BaseException:
                    self._rollback()
                    raise
                if self._tx_cursor:
                    self._committed_cursor = self._tx_cursor
                if self._high_water is not None and fsync and self.sqlite_sync == "full":
                    # synchronous = FULL: this COMMIT returned once the log was fsync'd,
                    # with every commit before it (relaxed ones included).
                    self._high_water.advance(self._committed_cursor)
            except sqlite3.OperationalError as exc:
                if _storage_failure(exc):
                    self._storage_failed(exc)
                raise
        finally:
            if relaxed:
                self.db.execute("PRAGMA synchronous = FULL")

    def _rollback(self) -> None:
        self._pending.clear()
        # After SQLITE_FULL, SQLite may already have rolled the transaction back.
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    def sync(self) -> int:
        """fsync the WAL: every commit so far becomes durable (what ``synchronous =
        FULL`` does at each commit, once for a whole batch). Safe from a worker
        thread: it touches the file, not the connection. Returns the commit count
        it covers."""
        covered = self.commits
        # Read before the fsync: every event up to it is in the log already.
        cursor = self._committed_cursor
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            fd = os.open(wal, os.O_RDONLY)
        except FileNotFoundError:
            fd = -1  # nothing appended since the last checkpoint truncated it
        if fd >= 0:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if self._high_water is not None:
            self._high_water.advance(cursor)
        return covered

    def one(self, sql: str, *args: Any) -> sqlite3.Row | None:
        if self._pending and "events" in sql:
            self._write_pending()  # a read of events in the transaction sees its own
        row: sqlite3.Row | None = self.db.execute(sql, args).fetchone()
        return row

    def all(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        if self._pending and "events" in sql:
            self._write_pending()
        return list(self.db.execute(sql, args).fetchall())

    def emit(self, kind: str, subject: str, /, **data: Any) -> None:
        if not self._in_tx:
            self.event(kind, subject, **data)
            return
        # Written at the commit with the transaction's other events: one statement
        # for all of them (3.3 INSERTs per durable action before, one per commit).
        self._pending.append((time.time(), self.boot_id, kind, subject, dumps(redact(data))))

    def changes(self) -> int:
        # The rows this connection wrote, the open transaction's too: exact.
        return int(self.db.total_changes)

    def _append_event(self, db: Any, row: tuple[Any, ...]) -> int:
        if self._pending:
            self._write_pending()  # emitted before it: written before it
        cursor = db.execute("INSERT INTO events (at, boot_id, kind, subject, data) VALUES (?, ?, ?, ?, ?)", row)
        self._tx_cursor = int(cursor.lastrowid or 0)
        return self._tx_cursor

    def _write_pending(self) -> None:
        """The emitted events, in their order: one INSERT of many rows (an
        AUTOINCREMENT key numbers them as it would one by one)."""
        rows, self._pending = self._pending, []
        for start in range(0, len(rows), EVENTS_PER_INSERT):
            chunk = rows[start : start + EVENTS_PER_INSERT]
            cursor = self.db.execute(_events_insert(len(chunk)), [value for row in chunk for value in row])
            self._tx_cursor = int(cursor.lastrowid or 0)

    def close(self) -> None:
        self._close_high_water()
        self.db.close()


#: Rows per events INSERT: 5 parameters each, well under SQLite's 32,766 per statement.
EVENTS_PER_INSERT = 500


@functools.lru_cache(maxsize=64)
def _events_insert(rows: int) -> str:
    return "INSERT INTO events (at, boot_id, kind, subject, data) VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * rows)


def judge_high_water(path: Path) -> int:
    """Refuse a ledger behind its high-water mark (it lost commits that were made
    durable), read through a read-only connection, which leaves the log as it is;
    else the cursor of its newest event."""
    try:
        db = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            holds = newest_event(db)
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"ledger {path} cannot be opened ({exc}); {_WHAT_TO_DO}") from None
    try:
        mark = high_water.read_mark(path)
    except high_water.MarkDamaged as exc:
        raise LedgerError(
            f"the high-water mark of ledger {path} is damaged ({exc}): whether the ledger lost"
            f" commits cannot be told; {high_water.what_to_do(path)}"
        ) from None
    if high_water.behind(mark, holds):
        assert mark is not None
        raise LedgerError(f"{high_water.lost_commits(path, mark, holds)}. corral will not run on it: "
                          f"{high_water.what_to_do(path)}")
    return holds


def newest_event(db: sqlite3.Connection) -> int:
    """The cursor of a ledger's newest event (0: none yet)."""
    try:
        row = db.execute("SELECT MAX(cursor) FROM events").fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return 0  # a ledger made before any migration ran
        raise
    return int(row[0] or 0)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def split_sql(script: str) -> list[str]:
    """Split a migration into statements, keeping trigger bodies whole."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements

"""The embedded ledger: one SQLite file in the home, WAL, ``synchronous = FULL``, one
writer (the supervisor), behind the port every store writes through
(supervisor/ledger/port.py). Also the checks ``corral doctor`` makes of such a file."""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from corral.core import failpoints
from corral.core.redact import redact
from corral.supervisor.ledger import high_water
from corral.supervisor.ledger.port import Ledger, LedgerError, dumps, split_sql
from corral.supervisor.ledger.schema import MIGRATIONS

#: SQLite result codes that mean the storage, not the statement, failed.
_SQLITE_FULL, _SQLITE_IOERR = 13, 10


def _storage_failure(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (_SQLITE_FULL, _SQLITE_IOERR) or "disk is full" in str(exc)


SQLITE_HEADER = b"SQLite format 3\x00"
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

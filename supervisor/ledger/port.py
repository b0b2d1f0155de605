"""The ledger: the port every store writes through (its embedded SQLite backend is
supervisor/ledger/ledger_sqlite.py, its PostgreSQL one ledger_pg.py).

Every change that protects a later step is one transaction committed (fsync'd with
``synchronous=FULL``) before that step runs. State changes and the events that
describe them commit together, so the event stream never disagrees with the state.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from typing import Any

from corral.core import failpoints
from corral.core.redact import redact
from corral.supervisor.errors import StorageFull
from corral.supervisor.runs.run_versions import RunVersions


class LedgerError(RuntimeError):
    pass


class RunIdTaken(Exception):
    """Another ledger sharing this one's database committed a run with this id
    first (a cluster: supervisor/ledger/ledger_pg.py); nothing was written."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} was created by another node")
        self.run_id = run_id


#: Committed plans a ledger keeps in memory (the runs being stepped need a few).
PLAN_CACHE_SIZE = 1024


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

    def project_head(self, *, at_least: int | None = None) -> int | None:
        """The project revision every ledger sharing this database keeps for this
        ledger's project root; with ``at_least`` (in the open write transaction) the
        next one, made now: one more than the last, and at least ``at_least``. None:
        this ledger is its project's only one (a home: its ``project_revisions`` table
        is the truth, and the project lock keeps other homes off the root)."""
        return None

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

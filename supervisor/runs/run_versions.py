"""Per-run versions of what a step boundary reads, held in memory by the ledger's
one writer, so that an unchanged run's boundary is answered without reading.

A supervisor is the only writer of its SQLite ledger. Every write to a table the
boundary's checks read (a finalization; the features' boundary hooks: steers,
goals, intent updates, an approved action: the features' ``at_boundary``) bumps its run's version, from a TEMP
trigger on the ledger's connection, whichever store wrote it. ``advance``
(next_step.py) marks a run *quiet* at the version its checks found nothing at:
no finalization, no hook wrote anything, and nothing was left waiting (no action
held for a person or executing: a steer waits for those, see
interactive/steer_store.py). While the version stays there, the next boundary
skips the finalization read and the hooks, and the provider guards (a steer or a
goal's pause holding a provider turn) are known to be clear.

Conservative by construction: a bump is never undone (a rolled-back write costs
one read, not a missed change), and a new ledger object (a boot, a recovery)
knows nothing, so its first boundary reads. A ledger that keeps no versions (a
read-only open, or PostgreSQL)
never marks a run quiet and reads every time, as before: a PostgreSQL ledger runs
no Python inside its server, so its writes bump nothing here.

A feature whose ``at_boundary`` or ``provider_guard`` (supervisor/runs/run_feature.py)
reads another table must add it to ``WATCHED``.

The same writer keeps the rows it read of a few tables keyed by run
(``ROW_TABLES``: the run's own row, its collaboration binding), and that it found
none of (``row``, ``keep_row``): a step reads them several times (the owner's
check, the policy, the plan guard), and they change far less often. Any write to
such a row drops it, from a TEMP trigger as above. A row read inside a
transaction may hold that transaction's own writes: it is kept only while no
transaction has rolled back since it was read (a rolled-back one may have
written it).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Protocol

#: The tables the boundary's checks read, with the rows that concern them: a write
#: to any row of these (by ``run_id``) bumps that run's version.
WATCHED = ("finalizations", "steers", "goals", "intent_updates")
#: Actions bump only when they become approved: the repository guard's boundary
#: hook (context/repo_fingerprint_service.py) rechecks approved actions.
_APPROVED = "approved"
_FUNCTION = "corral_run_version_bump"
_DROP_ROW = "corral_run_row_drop"
#: Tables whose row for a run (by ``run_id``, at most one) is kept once read.
ROW_TABLES = ("runs", "collaboration_bindings")
#: Rows kept at most (a supervisor has few live runs; past it, all are dropped).
MAX_ROWS = 1024
#: A row kept as absent: the run has none in that table (yet).
ABSENT: Any = object()


class Transactions(Protocol):
    """What ``row`` needs of the ledger: its transaction and commit counts."""

    transactions: int
    commits: int

    def open_transaction(self) -> int | None: ...


def _rolled_back(ledger: Transactions) -> int:
    """Transactions begun and never committed, so far (the open one aside)."""
    return ledger.transactions - ledger.commits - (ledger.open_transaction() is not None)


class RunVersions:
    def __init__(self) -> None:
        self._versions: dict[str, int] = {}
        self._quiet: dict[str, int] = {}
        #: False: nothing bumps versions here, so no run is ever quiet.
        self.kept = False
        #: Rows read (or ``ABSENT``), by (table, run id), with the rolled-back count
        #: they were read at.
        self._rows: dict[tuple[str, str], tuple[Any, int]] = {}

    def bump(self, run_id: str | None) -> None:
        if run_id is not None:
            self._versions[run_id] = self._versions.get(run_id, 0) + 1

    def version(self, run_id: str) -> int:
        return self._versions.get(run_id, 0)

    def quiet(self, run_id: str) -> bool:
        """The boundary's checks of ``run_id`` found nothing, and nothing they read
        was written since."""
        return self.kept and self._quiet.get(run_id) == self._versions.get(run_id, 0)

    def forget_quiet(self) -> None:
        """A transaction rolled back: what was found quiet inside it is not sure."""
        self._quiet.clear()

    def mark_quiet(self, run_id: str, version: int) -> None:
        """The checks found nothing at ``version`` (if it is still the run's)."""
        if self.kept and self._versions.get(run_id, 0) == version:
            self._quiet[run_id] = version

    def row(self, table: str, run_id: str, ledger: Transactions) -> Any:
        """The run's row of ``table`` as last read (``ABSENT``: it had none), if
        nothing wrote it since; None: read it."""
        kept = self._rows.get((table, run_id))
        if kept is None:
            return None
        if kept[1] != _rolled_back(ledger):
            self._rows.clear()  # a transaction rolled back since: none of them is sure
            return None
        return kept[0]

    def keep_row(self, table: str, run_id: str, row: Any, ledger: Transactions) -> None:
        """``row``: what was read (``ABSENT``: nothing)."""
        if self.kept:
            if len(self._rows) >= MAX_ROWS:
                self._rows.clear()
            self._rows[(table, run_id)] = (row, _rolled_back(ledger))

    def drop_row(self, table: str, run_id: str | None) -> None:
        if run_id is not None:
            self._rows.pop((table, run_id), None)

    def keep(self, db: sqlite3.Connection) -> None:
        """Bump from TEMP triggers on ``db`` (this connection's writes alone: the one
        writer's). Installed once per open connection."""
        db.create_function(_FUNCTION, 1, self.bump)
        for table in WATCHED:
            for event, row in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
                name = f"run_version_{table}_{event.lower()}"
                db.execute(
                    f"CREATE TEMP TRIGGER IF NOT EXISTS {name} AFTER {event} ON main.{table}"
                    f" BEGIN SELECT {_FUNCTION}({row}.run_id); END"
                )
        for event in ("INSERT", "UPDATE"):
            db.execute(
                f"CREATE TEMP TRIGGER IF NOT EXISTS run_version_actions_{event.lower()} AFTER {event} ON main.actions"
                f" WHEN NEW.phase = '{_APPROVED}' BEGIN SELECT {_FUNCTION}(NEW.run_id); END"
            )
        db.create_function(_DROP_ROW, 2, self.drop_row)
        for table in ROW_TABLES:
            for event, row in (("INSERT", "NEW"), ("UPDATE", "OLD"), ("DELETE", "OLD")):
                db.execute(
                    f"CREATE TEMP TRIGGER IF NOT EXISTS run_row_{table}_{event.lower()} AFTER {event} ON main.{table}"
                    f" BEGIN SELECT {_DROP_ROW}('{table}', {row}.run_id); END"
                )
        self.kept = True

"""What a trace is made of, read from the ledger: a root run's tree of runs (its
children and delegates, at any depth), their provider requests, actions, the
action that spawned each child or delegate, and the events that time what the
rows do not (an approval's wait, a repair's category).

Reads only; span_projection.py turns the rows into spans. Events are read from a
window that starts shortly before the root run was created (found by a binary
search over the append-only log's cursor, not a scan of the whole log), and
only the kinds a span needs.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from corral.supervisor.ledger.port import Ledger

#: Events that may have been written this long before the root run's row (clocks of
#: one host; the margin only widens the window read).
CLOCK_MARGIN_S = 5.0
#: The events a span reads: action phase moves (``action-<phase>``) and plan repairs.
ACTION_EVENT_PREFIX = "action-"
REPAIR_EVENT = "plan-invalid"
#: Subjects named in one events query (SQLite's variable limit is far above).
SUBJECTS_PER_QUERY = 500


@dataclass(frozen=True)
class TreeRows:
    """One root run's tree as the ledger holds it."""

    root_run_id: str
    #: Every run of the tree (``root_run_id`` is theirs), the root first, each after its parent.
    runs: list[sqlite3.Row]
    #: Their provider requests, in the order they were made.
    requests: list[sqlite3.Row]
    #: Their actions, by run, loop and index.
    actions: list[sqlite3.Row]
    #: A child's or delegate's run id -> the action of its parent that made it.
    spawned_by: dict[str, str]
    #: A child's run id -> its delegation id (children and delegations both have one).
    delegation_of: dict[str, str]
    #: (at, kind, subject, data) of the tree's action and repair events, in order.
    events: list[tuple[float, str, str, str]]


def read_tree(ledger: Ledger, root_run_id: str) -> TreeRows | None:
    """The tree of ``root_run_id``, or None when there is no such root run."""
    root = ledger.one("SELECT * FROM runs WHERE run_id = ? AND root_run_id = run_id", root_run_id)
    if root is None:
        return None
    # Down the tree by the parents' indexed children and delegations, not a scan of runs.
    runs = [root]
    spawned_by: dict[str, str] = {}
    delegation_of: dict[str, str] = {}
    requests: list[sqlite3.Row] = []
    actions: list[sqlite3.Row] = []
    for run in runs:  # grows as children are found
        run_id = run["run_id"]
        requests += ledger.all("SELECT * FROM provider_requests WHERE run_id = ? ORDER BY rowid", run_id)
        actions += ledger.all(
            "SELECT action_id, run_id, loop_index, action_index, tool, phase, policy, rerunnable, attempts, created_at,"
            " updated_at, executing_at, finished_at FROM actions WHERE run_id = ? ORDER BY loop_index, action_index",
            run_id,
        )
        made = ledger.all(
            "SELECT c.run_id, c.delegation_id, g.parent_action_id FROM children c"
            " JOIN isolated_groups g ON g.group_id = c.group_id WHERE g.parent_run_id = ? ORDER BY c.created_at",
            run_id,
        ) + ledger.all(
            "SELECT run_id, delegation_id, parent_action_id FROM delegations WHERE parent_run_id = ?"
            " ORDER BY created_at",
            run_id,
        )
        for row in made:
            child = ledger.one("SELECT * FROM runs WHERE run_id = ?", row["run_id"])
            if child is not None and row["run_id"] not in spawned_by:
                spawned_by[row["run_id"]] = row["parent_action_id"]
                delegation_of[row["run_id"]] = row["delegation_id"]
                runs.append(child)
    subjects = sorted({run["run_id"] for run in runs} | {action["action_id"] for action in actions})
    start = _first_cursor_at(ledger, float(root["created_at"]) - CLOCK_MARGIN_S)
    found: list[Any] = []
    # The subjects are named in the query, a chunk at a time, so only the tree's own
    # events are made into rows: runs that ran beside this tree fill the same window.
    for offset in range(0, len(subjects), SUBJECTS_PER_QUERY):
        chunk = subjects[offset:offset + SUBJECTS_PER_QUERY]
        found += ledger.all(
            "SELECT cursor, at, kind, subject, data FROM events WHERE cursor >= ?"
            f" AND subject IN ({','.join('?' * len(chunk))}) AND (kind LIKE 'action-%' OR kind = ?)",
            start,
            *chunk,
            REPAIR_EVENT,
        )
    found.sort(key=lambda row: row["cursor"])
    events = [(row["at"], row["kind"], row["subject"], row["data"]) for row in found]
    return TreeRows(root_run_id, runs, requests, actions, spawned_by, delegation_of, events)


def _first_cursor_at(ledger: Ledger, at: float) -> int:
    """The cursor of the first event at or after ``at`` (events are appended in time
    order), by binary search over the cursor: a few indexed reads."""
    bounds = ledger.one("SELECT MIN(cursor) AS lo, MAX(cursor) AS hi FROM events")
    if bounds is None or bounds["lo"] is None:
        return 0
    lo, hi = int(bounds["lo"]), int(bounds["hi"]) + 1
    while lo < hi:
        middle = (lo + hi) // 2
        row: Any = ledger.one("SELECT cursor, at FROM events WHERE cursor >= ? ORDER BY cursor LIMIT 1", middle)
        if row is None or row["at"] >= at:
            hi = middle
        else:
            lo = int(row["cursor"]) + 1
    return lo

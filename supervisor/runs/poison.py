"""Poison actions: an action whose execution keeps crashing its agent.

A read (or idempotent) action is run again after a crash: that is what makes a
kill harmless. But an action that itself kills its agent (a tool that calls
``os._exit``, segfaults, is killed by an rlimit) would then crash it on every
restart, and at every boot, until the group's restart intensity gave up and took
every agent of the group down with it.

So a crash is charged to the actions the agent had in flight (the file it keeps,
see actors/inflight.py), one row per crashed incarnation in ``action_crashes``.
An action charged ``POISON_CRASHES`` times is not run again: a read fails, with the
crashes in its error (``corral show``), and the run goes on; any other
rerunnable action, whose effect may have happened, waits for a person
(``needs-reconciliation``). Crashes are counted in the ledger, so the count holds
across restarts, ``corral down`` and ``up`` and boot recovery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import action_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_feature import RunFeatures

log = logging.getLogger("corral.poison")

#: Crashes of its agent after which an action is not run again. Below the default
#: restart intensity (3 restarts in 5 s), so the group never escalates for it.
POISON_CRASHES = 2


def charge(
    ledger: Ledger,
    action_ids: list[str],
    features: RunFeatures,
    *,
    agent_id: str,
    actor_id: str,
    incarnation: int,
    exit_code: int,
    is_read: Callable[[str], bool],
) -> list[str]:
    """Record that the actor died while it ran ``action_ids``; stop those that
    reached the limit. Returns the ids stopped as poison."""
    stopped = []
    for the_id in action_ids:
        row = ledger.one("SELECT * FROM actions WHERE action_id = ?", the_id)
        if row is None or row["agent_id"] != agent_id or row["phase"] != ActionPhase.EXECUTING:
            continue  # not this agent's, or finished after all: nothing to charge
        with ledger.tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO action_crashes (action_id, actor_id, boot_id, incarnation, exit_code, at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (the_id, actor_id, ledger.boot_id, incarnation, exit_code, time.time()),
            )
            crashes = crash_codes(ledger, the_id)
            ledger.event(
                "action-crashed", the_id, run=row["run_id"], tool=row["tool"], actor=actor_id,
                exit_code=exit_code, crashes=len(crashes),
            )
            if row["rerunnable"] and len(crashes) >= POISON_CRASHES:
                stop(ledger, row, crashes, is_read, features)
                stopped.append(the_id)
    return stopped


def crash_codes(ledger: Ledger, the_id: str) -> list[int]:
    """The exit codes of the crashes charged to an action, oldest first."""
    rows = ledger.all("SELECT exit_code FROM action_crashes WHERE action_id = ? ORDER BY at", the_id)
    return [int(row["exit_code"]) for row in rows]


def stop(
    ledger: Ledger, row: Any, crashes: list[int], is_read: Callable[[str], bool], features: RunFeatures
) -> None:
    """Never run ``row`` again: a read fails; anything else waits for a person."""
    codes = ", ".join(str(code) for code in crashes)
    why = (
        f"poison: running {row['tool']} crashed its agent {len(crashes)} times (exit codes {codes});"
        " it is not run again"
    )
    log.error("%s: %s", row["action_id"], why)
    with ledger.tx():
        ledger.event("action-poisoned", row["action_id"], run=row["run_id"], tool=row["tool"], crashes=len(crashes))
        if is_read(row["tool"]):
            action_store.move_action(ledger, row["action_id"], ActionPhase.FAILED, current=row, error=why, reason=why)
            action_store.write_receipt(ledger, row["action_id"], features)
        else:
            # Its effect may have happened, once or more: a person decides.
            action_store.mark_needs_reconciliation(ledger, row["action_id"], why, features)


def stop_at_boot(ledger: Ledger, is_read: Callable[[str], bool], features: RunFeatures) -> list[str]:
    """Recovery: an executing rerunnable action charged to the limit (by an older
    limit, or a boot that stopped before it could act) is not run again either."""
    stopped = []
    for row in ledger.all(
        "SELECT a.* FROM actions a WHERE a.phase = 'executing' AND a.rerunnable = 1"
        " AND (SELECT COUNT(*) FROM action_crashes c WHERE c.action_id = a.action_id) >= ?",
        POISON_CRASHES,
    ):
        stop(ledger, row, crash_codes(ledger, row["action_id"]), is_read, features)
        stopped.append(row["action_id"])
    return stopped


def show_section(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """``corral show``: every crash charged to an action of the run."""
    rows = ledger.all(
        "SELECT c.action_id, c.actor_id, c.incarnation, c.exit_code, c.at FROM action_crashes c"
        " JOIN actions a ON a.action_id = c.action_id WHERE a.run_id = ? ORDER BY c.at",
        run_id,
    )
    return [dict(row) for row in rows]

"""The single final reply: a journal ``prepared -> reply-appended -> completed``.

Each phase is its own commit, so a crash anywhere leaves a phase from which
``finalize`` (called again by the agent, or by recovery) carries on; the replies
table's UNIQUE run_id makes a second reply impossible even for a buggy caller.
"""

from __future__ import annotations

import time
from typing import Any

from corral.core.redact import redact_text
from corral.supervisor.errors import Conflict, Refused
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.loop_plan_store import final_blocked
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.runs.run_store import RunLimits, get_run, set_run_status


def blockers(ledger: Ledger, run_id: str, features: RunFeatures) -> list[str]:
    """Why the run may not finalize now: its own open work, then each feature's
    (``RunFeature.finalize_blockers``: children, sessions, the durable plan, a goal, evidence)."""
    reasons: list[str] = []
    open_actions = ledger.all(
        "SELECT action_id, phase FROM actions WHERE run_id = ? AND phase NOT IN ('ok', 'failed', 'denied')",
        run_id,
    )
    for row in open_actions:
        label = "unresolved reconciliation" if row["phase"] == "needs-reconciliation" else "pending action"
        reasons.append(f"{label} {row['action_id']} ({row['phase']})")
    unreceipted = ledger.all(
        "SELECT a.action_id FROM actions a LEFT JOIN receipts r ON r.action_id = a.action_id"
        " WHERE a.run_id = ? AND a.phase IN ('ok', 'failed', 'denied') AND r.action_id IS NULL",
        run_id,
    )
    reasons.extend(f"action {row['action_id']} has no receipt yet" for row in unreceipted)
    requests = ledger.all(
        "SELECT slot, status FROM provider_requests WHERE run_id = ? AND"
        " (status = 'started' OR status = 'needs-reconciliation')",
        run_id,
    )
    reasons.extend(f"provider request {row['slot']} is {row['status']}" for row in requests)
    reasons.extend(features.finalize_blockers(ledger, run_id))
    return reasons


def finalize(ledger: Ledger, run_id: str, reply: str, limits: RunLimits, features: RunFeatures) -> dict[str, Any]:
    """``run.finalize`` after its checks (supervisor/runs/run_actor_methods.py ``finalize``):
    a child may not; a guard may send the agent back to plan (``final_guard``: a
    steer); the blockers refuse it as a repair, or park the run for a person
    (``finalize_park``); else the journal is prepared and carried to the end."""
    run = get_run(ledger, run_id)
    if run["kind"] != "root":
        raise Refused(f"run {run_id} is a {run['kind']} run; only the root agent of a run writes the final reply")
    row = ledger.one("SELECT phase FROM finalizations WHERE run_id = ?", run_id)
    if row is None:
        for guard in features.final_guards:
            why = guard(ledger, run_id)
            if why:
                # Not a repair: the agent asks for its next step, and the guard's
                # cause (a steer) is applied there.
                raise Conflict(why)
        reasons = blockers(ledger, run_id, features)
        if reasons:
            for park in features.finalize_parkers:
                why = park(ledger, run_id, reasons)
                if why:
                    # Retrying will not help: a person has to act (pending shows why).
                    set_run_status(ledger, run_id, RunStatus.NEEDS_INPUT, features, why)
                    return {"status": RunStatus.NEEDS_INPUT.value, "reasons": reasons}
            return final_blocked(ledger, run_id, reasons, limits, features)
        with ledger.tx() as db:
            now = time.time()
            # A goal run's journal binds the goal it was prepared for, with the
            # system's evidence: the goal completes from this record (``final_snapshot``).
            db.execute(
                "INSERT INTO finalizations (run_id, phase, reply, created_at, updated_at, goal_snapshot)"
                " VALUES (?, 'prepared', ?, ?, ?, ?)",
                (run_id, redact_text(reply), now, now, features.final_snapshot(ledger, run_id, reply)),
            )
            ledger.event("finalization-prepared", run_id)
        ledger.failpoint("finalize.after-prepared")
    done = resume_finalization(ledger, run_id, features)
    if done["status"] == "invalidated":
        raise Conflict(done["reason"])  # the agent asks for its next step: the run plans again
    return done


def resume_finalization(ledger: Ledger, run_id: str, features: RunFeatures) -> dict[str, str]:
    row = ledger.one("SELECT phase, reply, goal_snapshot FROM finalizations WHERE run_id = ?", run_id)
    assert row is not None
    if row["phase"] == "prepared":
        why = features.final_stale(ledger, run_id, row["goal_snapshot"])
        if why is not None:
            # Prepared for a goal that changed since (edited, paused, cleared): no
            # reply is written; the same run plans again.
            with ledger.tx() as db:
                db.execute("DELETE FROM finalizations WHERE run_id = ? AND phase = 'prepared'", (run_id,))
                ledger.event("finalization-invalidated", run_id, why=why)
            return {"status": "invalidated", "reason": f"the final reply was not written: {why}"}
        with ledger.tx() as db:
            if not db.execute("SELECT 1 FROM replies WHERE run_id = ?", (run_id,)).fetchone():
                db.execute(
                    "INSERT INTO replies (run_id, text, created_at) VALUES (?, ?, ?)",
                    (run_id, row["reply"], time.time()),
                )
            db.execute(
                "UPDATE finalizations SET phase = 'reply-appended', updated_at = ? WHERE run_id = ?",
                (time.time(), run_id),
            )
            ledger.event("reply-appended", run_id)
        ledger.failpoint("finalize.after-reply")
    with ledger.tx() as db:
        current = db.execute("SELECT phase FROM finalizations WHERE run_id = ?", (run_id,)).fetchone()["phase"]
        if current == "reply-appended":
            db.execute(
                "UPDATE finalizations SET phase = 'completed', updated_at = ? WHERE run_id = ?",
                (time.time(), run_id),
            )
            set_run_status(ledger, run_id, RunStatus.COMPLETED, features)
    return {"status": "completed"}

"""A goal completes from its run's finalization record (seed 004 V1.18), not from a
model's tool: the final reply's journal (supervisor/runs/finalization.py) keeps a
snapshot of the goal it was prepared for (goal id, revision, fingerprint) with
the evidence the system itself reads (the durable plan, the latest verification,
the reply's SHA-256 and length). A goal edited since a finalization was prepared
voids that finalization (the run plans again); once the reply is committed, the
goal is completed from the snapshot, with that evidence: never the model's words.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from corral.supervisor.ledger.port import Ledger
from corral.supervisor.longtask import goal_shape


def current(ledger: Ledger, run_id: str) -> dict[str, Any] | None:
    """The run's goal identity now (None: not a goal run)."""
    goal = ledger.one("SELECT * FROM goals WHERE run_id = ?", run_id)
    if goal is None:
        return None
    revision = int(goal["revision"])
    return {
        "goal_id": goal["goal_id"],
        "goal_revision": revision,
        "goal_fingerprint": goal_shape.fingerprint(goal["goal_id"], revision, goal["text"],
                                                   goal_shape.stored_list(goal["constraints"]),
                                                   goal_shape.stored_list(goal["verification"])),
        "goal_status": goal["status"],
    }


def snapshot(ledger: Ledger, run_id: str, reply: str) -> str | None:
    """What a prepared finalization binds (JSON text), or None for a run without a goal."""
    from corral.supervisor.longtask import plan_store
    from corral.supervisor.project import verification_store

    goal = current(ledger, run_id)
    if goal is None:
        return None
    plan = plan_store.current(ledger, run_id)
    latest = verification_store.latest(ledger)
    evidence = {
        "goal_id": goal["goal_id"],
        "goal_revision": goal["goal_revision"],
        "goal_fingerprint": goal["goal_fingerprint"],
        "plan_revision": int(plan["revision"]),
        "plan_steps": len(plan["steps"]),
        "plan_steps_completed": sum(1 for step in plan["steps"] if step.get("status") == "completed"),
        "verification_id": latest["action_id"] if latest is not None else None,
        "verification_status": latest["status"] if latest is not None else None,
        "verification_revision": latest["revision"] if latest is not None else None,
        "response_sha256": hashlib.sha256(reply.encode("utf-8", "surrogatepass")).hexdigest(),
        "response_chars": len(reply),
    }
    return json.dumps(evidence, sort_keys=True)


def stale(ledger: Ledger, run_id: str, raw_snapshot: str | None) -> str | None:
    """Why a prepared finalization no longer binds the run's goal (None: it does)."""
    goal = current(ledger, run_id)
    if goal is None:
        return None
    if raw_snapshot is None:
        return "the final reply was prepared without the goal's snapshot"
    bound = json.loads(raw_snapshot)
    if goal["goal_status"] != "active":
        return f"the goal is {goal['goal_status']}"
    if (bound.get("goal_id"), bound.get("goal_fingerprint")) != (goal["goal_id"], goal["goal_fingerprint"]):
        return (f"the goal was edited (revision {bound.get('goal_revision')} -> {goal['goal_revision']})"
                " after the final reply was prepared")
    return None


def evidence(ledger: Ledger, run_id: str, completed_at: float) -> dict[str, Any]:
    """The completion record of a goal whose run just completed: its finalization's
    snapshot (``goal_snapshot: None``: a finalization from before snapshots)."""
    row = ledger.one("SELECT goal_snapshot FROM finalizations WHERE run_id = ?", run_id)
    raw = row["goal_snapshot"] if row is not None else None
    found: dict[str, Any] = json.loads(raw) if raw else {"goal_snapshot": None}
    return {"source": "finalization", "run_id": run_id, **found, "completed_at": completed_at}

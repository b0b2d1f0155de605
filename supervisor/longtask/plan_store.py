"""A run's durable plan (seed 004 V1.17): steps with an id, a text and a status,
and a revision that each update adds one to.

Updates come from the model's ordinary tool call (``plan.update``) and are applied
once per action id, so a replay after a crash returns the same revision. Statuses
move by one table: going back (``done`` to ``pending``, say) or dropping a step
needs a reason. A run whose plan still has unfinished steps cannot finalize.
"""

from __future__ import annotations

import enum
import json
import time
from typing import Any

from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.port import Ledger


class StepStatus(enum.StrEnum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    DONE = "done"
    BLOCKED = "blocked"
    DROPPED = "dropped"


#: Forward moves need nothing; the moves back (and dropping) need a reason.
FORWARD: dict[StepStatus, frozenset[StepStatus]] = {
    StepStatus.PENDING: frozenset({StepStatus.IN_PROGRESS, StepStatus.DONE, StepStatus.BLOCKED}),
    StepStatus.IN_PROGRESS: frozenset({StepStatus.DONE, StepStatus.BLOCKED}),
    StepStatus.BLOCKED: frozenset({StepStatus.IN_PROGRESS, StepStatus.DONE}),
    StepStatus.DONE: frozenset(),
    StepStatus.DROPPED: frozenset(),
}
UNFINISHED = frozenset({StepStatus.PENDING, StepStatus.IN_PROGRESS, StepStatus.BLOCKED})
MAX_STEPS = 200


class PlanRefused(BadRequest):
    """An update that breaks the plan's rules (the model sees why, as the tool's error)."""


def merge(steps: list[dict[str, Any]], changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan after ``changes`` (pure). New ids append; known ids change in place."""
    merged = [dict(step) for step in steps]
    by_id = {step["id"]: step for step in merged}
    for change in changes:
        step_id = change["id"]
        status = StepStatus(change.get("status", "pending"))
        reason = (change.get("reason") or "").strip()
        step = by_id.get(step_id)
        if step is None:
            if not change.get("text"):
                raise PlanRefused(f"step {step_id!r} is new: give it a text")
            if status is StepStatus.DROPPED and not reason:
                raise PlanRefused(f"step {step_id!r}: dropping a step needs a reason")
            step = {"id": step_id, "text": change["text"], "status": status.value, "reason": reason}
            merged.append(step)
            by_id[step_id] = step
            continue
        current = StepStatus(step["status"])
        if status is not current and status not in FORWARD[current] and not reason:
            raise PlanRefused(f"step {step_id!r} cannot go from {current} to {status} without a reason")
        step["status"] = status.value
        if change.get("text"):
            step["text"] = change["text"]
        if reason:
            step["reason"] = reason
    if len(merged) > MAX_STEPS:
        raise PlanRefused(f"a plan holds at most {MAX_STEPS} steps")
    return merged


def current(ledger: Ledger, run_id: str) -> dict[str, Any]:
    row = ledger.one("SELECT revision, steps FROM run_plans WHERE run_id = ?", run_id)
    if row is None:
        return {"revision": 0, "steps": []}
    return {"revision": int(row["revision"]), "steps": json.loads(row["steps"])}


def apply(ledger: Ledger, run_id: str, action_id: str, changes: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply an update once per action id: a replay returns the stored result."""
    with ledger.tx() as db:
        done = db.execute("SELECT result FROM plan_updates WHERE action_id = ?", (action_id,)).fetchone()
        if done is not None:
            result: dict[str, Any] = json.loads(done["result"])
            return result
        plan = current(ledger, run_id)
        steps = merge(plan["steps"], changes)
        revision = plan["revision"] + 1
        now = time.time()
        db.execute(
            "INSERT INTO run_plans (run_id, revision, steps, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (run_id) DO UPDATE SET revision = excluded.revision, steps = excluded.steps,"
            " updated_at = excluded.updated_at",
            (run_id, revision, json.dumps(steps), now),
        )
        result = {"revision": revision, "steps": steps,
                  "unfinished": [s["id"] for s in steps if StepStatus(s["status"]) in UNFINISHED]}
        db.execute("INSERT INTO plan_updates (action_id, run_id, revision, result, created_at) VALUES (?, ?, ?, ?, ?)",
                   (action_id, run_id, revision, json.dumps(result), now))
        ledger.event("plan-updated", run_id, revision=revision, unfinished=len(result["unfinished"]))
    return result


def blockers(ledger: Ledger, run_id: str) -> list[str]:
    """A final reply waits for every step to be done or dropped (with a reason)."""
    steps = current(ledger, run_id)["steps"]
    return [f"plan step {s['id']} is {s['status']} (finish it, or drop it with a reason)"
            for s in steps if StepStatus(s["status"]) in UNFINISHED]

"""What the agent should do next, derived from committed rows alone.

The agent keeps no state that a crash could lose: every step it takes is read off
the ledger here, from the run (run_store.py), its provider requests
(provider_store.py), its loop plan (loop_plan_store.py) and its actions
(action_store.py), with the features' boundary hooks and loop blockers
(supervisor/runs/run_hooks.py) applied at the safe points.
"""

from __future__ import annotations

import json
import time

from corral.mailbox.steps import Do, ParkStep, Step
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.action_store import write_receipt
from corral.supervisor.runs.loop_plan_store import get_plan, plan_raw_sha256
from corral.supervisor.runs.provider_store import control_pending, interrupt_provider_request, requests_for
from corral.supervisor.runs.run_state import TERMINAL as RUN_TERMINAL
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.runs.run_store import get_run, set_run_status


def _now() -> float:
    return time.time()


def next_step(ledger: Ledger, run_id: str, *, boundary: bool = True) -> Step:
    """What the agent should do next, from committed state alone. ``boundary=False``:
    the same call again, just after it advanced the loop (nothing else ran since,
    so the finalization and the boundary hooks are not checked twice)."""
    run = get_run(ledger, run_id)
    status = RunStatus(run["status"])
    if status in RUN_TERMINAL:
        return {"do": Do.DONE, "status": status.value}
    if status is not RunStatus.RUNNING:
        return {"do": Do.PARK, "status": status.value}
    if boundary:
        final = ledger.one("SELECT phase, reply FROM finalizations WHERE run_id = ?", run_id)
        if final is not None:
            return {"do": Do.FINALIZE, "reply": final["reply"]}
        commits = ledger.commits
        for hook in ledger.hooks.boundary:
            hook(ledger, run_id)  # e.g. a user's steer, applied at this safe boundary
        if ledger.commits != commits:
            run = get_run(ledger, run_id)  # a hook moved the run (a steer opens a loop)
            if RunStatus(run["status"]) is not RunStatus.RUNNING:
                return {"do": Do.PARK, "status": run["status"]}  # a hook parked it (a goal paused)
    loop = int(run["loop_index"])
    plan = get_plan(ledger, run_id, loop)
    if plan is None:
        requests = requests_for(ledger, run_id, loop)
        latest = requests[-1] if requests else None
        if latest is not None and latest["status"] == "completed" and latest["consumed"] == 0:
            return {
                "do": Do.PARSE,
                "slot": latest["slot"],
                "response": latest["response"],
                "raw_sha256": latest["raw_sha256"],
                "loop": loop,
            }
        # The lane is serial: an agent asking for its next step while its own request
        # is in flight lost that request (it crashed and restarted).
        if latest is not None and latest["status"] == "started":
            if not interrupt_provider_request(
                ledger, latest["slot"], run_id, ledger.hooks.idempotent_provider(run["provider"])
            ):
                return {"do": Do.PARK, "status": RunStatus.NEEDS_RECONCILIATION.value}
            if boundary and control_pending(ledger, run_id) is not None:
                # Lost while a steer or a pause waited: it counts as interrupted, and
                # that control applies now, at this boundary, before any new turn.
                return next_step(ledger, run_id, boundary=True)
        return {"do": Do.PROVIDER, "loop": loop}
    if plan.get("final") is not None:
        # Children or delegations still at work: wait for them (no provider call)
        # rather than have the final reply refused for what is only a matter of time.
        return _loop_blockers(ledger, run_id) or {"do": Do.FINALIZE, "reply": plan["final"]}
    rows = {
        row["action_index"]: row
        for row in ledger.all(
            "SELECT a.*, r.action_id IS NOT NULL AS has_receipt FROM actions a"
            " LEFT JOIN receipts r ON r.action_id = a.action_id"
            " WHERE a.run_id = ? AND a.loop_index = ? ORDER BY a.action_index",
            run_id,
            loop,
        )
    }
    for index, call in enumerate(plan.get("actions", [])):
        row = rows.get(index)
        if row is None:
            return {
                "do": Do.PREPARE,
                "loop": loop,
                "index": index,
                "tool": call["tool"],
                "input": call["input"],
                "plan_raw_sha256": plan_raw_sha256(ledger, run_id, loop),
            }
        phase = ActionPhase(row["phase"])
        if phase in (ActionPhase.PREPARED, ActionPhase.APPROVED, ActionPhase.EXECUTING):
            return {
                "do": Do.EXECUTE,
                "action_id": row["action_id"],
                "tool": row["tool"],
                "input": json.loads(row["input"]),
                "raw_sha256": row["raw_sha256"],
                "phase": phase.value,
            }
        if phase is ActionPhase.WAITING_CONFIRMATION:
            set_run_status(ledger, run_id, RunStatus.WAITING_CONFIRMATION, f"action {row['action_id']} waits")
            return {"do": Do.PARK, "status": RunStatus.WAITING_CONFIRMATION.value}
        if phase is ActionPhase.NEEDS_RECONCILIATION:
            set_run_status(ledger, run_id, RunStatus.NEEDS_RECONCILIATION, f"action {row['action_id']} unresolved")
            return {"do": Do.PARK, "status": RunStatus.NEEDS_RECONCILIATION.value}
        if not row["has_receipt"]:
            write_receipt(ledger, row["action_id"], repair=True)  # a terminal move left without its receipt
    blocked = _loop_blockers(ledger, run_id)
    if blocked:
        return blocked
    with ledger.tx() as db:
        db.execute(
            "UPDATE runs SET loop_index = loop_index + 1, updated_at = ? WHERE run_id = ? AND loop_index = ?",
            (_now(), run_id, loop),
        )
        ledger.event("loop-advanced", run_id, loop=loop + 1)
    return next_step(ledger, run_id, boundary=False)


def _loop_blockers(ledger: Ledger, run_id: str) -> ParkStep | None:
    """A join to wait for, say (supervisor/runs/run_hooks.py ``loop_blockers``)."""
    for check in ledger.hooks.loop_blockers:
        step = check(ledger, run_id)
        if step is not None:
            return step
    return None

"""What the agent should do next: ``advance`` gathers a run's committed state, asks
the pure ``decide`` (step_decision.py) and carries out what it decided.

The agent keeps no state that a crash could lose: every step it takes is read off
the ledger here, from the run (run_store.py), its provider requests
(provider_store.py), its loop plan (loop_plan_store.py) and its actions
(action_store.py), with the features' boundary checks and loop blockers
(supervisor/runs/run_feature.py) applied at the safe points. The writes are
``advance``'s alone: a parked status, a receipt a crash left unwritten, the
loop's advance, a lost provider request's end.
"""

from __future__ import annotations

import json
import time
from typing import assert_never

from corral.mailbox.steps import (
    DoneStep,
    ExecuteStep,
    FinalizeStep,
    ParkStep,
    ParseStep,
    PrepareStep,
    ProviderStep,
    Step,
)
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.action_store import write_receipt
from corral.supervisor.runs.provider_store import control_pending, interrupt_provider_request, requests_for
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.runs.run_store import get_run, set_run_status
from corral.supervisor.runs.step_decision import (
    ActionView,
    AdvanceLoop,
    AskProvider,
    Decision,
    Done,
    Execute,
    Finalize,
    Finalized,
    Park,
    ParkRun,
    Parse,
    PlannedCall,
    PlanView,
    Prepare,
    RecoverLostRequest,
    RequestView,
    StepState,
    decide,
    leaves_nothing_waiting,
)


def _now() -> float:
    return time.time()


def advance(ledger: Ledger, run_id: str, features: RunFeatures, *, boundary: bool = True) -> Step:
    """The agent's next step, with the writes it takes. ``features``: the
    supervisor's, in their order (their boundary hooks, loop blockers and provider
    idempotence). ``boundary=False``: the same call again, just after it advanced
    the loop (nothing else ran since, so the finalization and the boundary hooks are
    not checked twice)."""
    versions = ledger.run_versions
    checked = boundary and not versions.quiet(run_id)
    # Writes, not commits: a step may run inside the transaction of the step before
    # it (step_piggyback.py), where a hook's write commits nothing yet.
    version, changes = versions.version(run_id), ledger.changes()
    decision = decide(gather(ledger, run_id, features, boundary=checked))
    if checked and ledger.changes() == changes and leaves_nothing_waiting(decision):
        # The boundary's checks found nothing and wrote nothing, and no action or
        # request is left for a steer to wait on: until a write bumps the version,
        # the next boundary of this run would find the same (run_versions.py).
        versions.mark_quiet(run_id, version)
    return _apply(ledger, run_id, features, decision, boundary=boundary)


#: The name the actor methods call it by (run_actor_methods.py, step_piggyback.py).
next_step = advance


def gather(ledger: Ledger, run_id: str, features: RunFeatures, *, boundary: bool) -> StepState:
    """The committed state ``decide`` looks at, read only as far as it can reach. At a
    checked boundary (one not known quiet: run_versions.py) the features' boundary
    checks run first (a user's steer, a goal's pause: applied at this safe point), so
    the state is the one after them."""
    run = get_run(ledger, run_id)
    status = RunStatus(run["status"])
    if status is not RunStatus.RUNNING:
        return StepState(status, int(run["loop_index"]))
    moved = False
    if boundary:
        final = ledger.one("SELECT phase, reply FROM finalizations WHERE run_id = ?", run_id)
        if final is not None:
            return StepState(status, int(run["loop_index"]), final_reply=Finalized(final["reply"]))
        changes = ledger.changes()
        for hook in features.boundary:
            hook(ledger, run_id)
        if ledger.changes() != changes:
            run = get_run(ledger, run_id)  # a hook moved the run (a steer opens a loop)
            status = RunStatus(run["status"])
            moved = True
            if status is not RunStatus.RUNNING:
                return StepState(status, int(run["loop_index"]), moved_at_boundary=True)
    loop = int(run["loop_index"])
    committed = ledger.committed_plan(run_id, loop)
    if committed is None:
        requests = requests_for(ledger, run_id, loop)
        latest = requests[-1] if requests else None
        return StepState(
            status,
            loop,
            moved_at_boundary=moved,
            latest_request=None
            if latest is None
            else RequestView(
                latest["slot"], latest["status"], bool(latest["consumed"]), latest["response"], latest["raw_sha256"]
            ),
        )
    raw = json.loads(committed[0])
    final = raw.get("final")
    plan = PlanView(
        final=final,
        calls=() if final is not None else tuple(PlannedCall(c["tool"], c["input"]) for c in raw.get("actions", [])),
        raw_sha256=committed[1],
    )
    actions = (
        {}
        if final is not None
        else {
            row["action_index"]: ActionView(
                row["action_id"],
                row["tool"],
                row["input"],
                row["raw_sha256"],
                ActionPhase(row["phase"]),
                bool(row["has_receipt"]),
            )
            for row in ledger.all(
                "SELECT a.*, r.action_id IS NOT NULL AS has_receipt FROM actions a"
                " LEFT JOIN receipts r ON r.action_id = a.action_id"
                " WHERE a.run_id = ? AND a.loop_index = ? ORDER BY a.action_index",
                run_id,
                loop,
            )
        }
    )
    return StepState(status, loop, moved_at_boundary=moved, plan=plan, actions=actions)


def _apply(ledger: Ledger, run_id: str, features: RunFeatures, decision: Decision, *, boundary: bool) -> Step:
    """Carry out ``decision``: its writes, then the step the agent gets."""
    match decision:
        case Done(status):
            return DoneStep(status=status.value)
        case Park(status):
            return ParkStep(status=status.value)
        case ParkRun(status, reason, repairs):
            _repair(ledger, repairs, features)
            set_run_status(ledger, run_id, status, features, reason)
            return ParkStep(status=status.value)
        case Finalize(reply, after_blockers):
            blocked = _loop_blockers(ledger, run_id, features) if after_blockers else None
            return blocked or FinalizeStep(reply=reply)
        case Parse(slot, response, raw_sha256, loop):
            return ParseStep(slot=slot, response=response, raw_sha256=raw_sha256, loop=loop)
        case AskProvider(loop):
            return ProviderStep(loop=loop)
        case RecoverLostRequest(slot, loop):
            provider = get_run(ledger, run_id)["provider"]
            if not interrupt_provider_request(ledger, slot, run_id, features.idempotent_provider(provider), features):
                return ParkStep(status=RunStatus.NEEDS_RECONCILIATION.value)
            if boundary and control_pending(ledger, run_id, features) is not None:
                # Lost while a steer or a pause waited: it counts as interrupted, and
                # that control applies now, at this boundary, before any new turn.
                return advance(ledger, run_id, features, boundary=True)
            return ProviderStep(loop=loop)
        case Prepare(loop, index, tool, tool_input, plan_sha, repairs):
            _repair(ledger, repairs, features)
            return PrepareStep(loop=loop, index=index, tool=tool, input=tool_input, plan_raw_sha256=plan_sha)
        case Execute(action, repairs):
            _repair(ledger, repairs, features)
            return ExecuteStep(
                action_id=action.action_id,
                tool=action.tool,
                input=json.loads(action.input),
                raw_sha256=action.raw_sha256,
                phase=action.phase.value,
            )
        case AdvanceLoop(loop, repairs):
            _repair(ledger, repairs, features)
            blocked = _loop_blockers(ledger, run_id, features)
            if blocked:
                return blocked
            with ledger.tx() as db:
                db.execute(
                    "UPDATE runs SET loop_index = loop_index + 1, updated_at = ? WHERE run_id = ? AND loop_index = ?",
                    (_now(), run_id, loop),
                )
                ledger.emit("loop-advanced", run_id, loop=loop + 1)
            return advance(ledger, run_id, features, boundary=False)
        case _:
            assert_never(decision)


def _repair(ledger: Ledger, action_ids: tuple[str, ...], features: RunFeatures) -> None:
    for action_id in action_ids:
        write_receipt(ledger, action_id, features, repair=True)  # a terminal move left without its receipt


def _loop_blockers(ledger: Ledger, run_id: str, features: RunFeatures) -> ParkStep | None:
    """A join to wait for, say (``RunFeature.loop_blocker``)."""
    for check in features.loop_blockers:
        step = check(ledger, run_id)
        if step is not None:
            return step
    return None

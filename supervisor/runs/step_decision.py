"""What the agent should do next, as a pure function of its run's committed state.

``decide`` reads nothing and writes nothing: the state is what next_step.py's
``advance`` gathered from the ledger, and the decision says what ``advance`` then
writes (a parked status, a repaired receipt, the loop's advance) before it answers
the agent. Kept apart so every branch is a row of a table test
(tests/test_step_decision.py), as supervisor/tree/restart_policy.py is for restarts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_state import TERMINAL as RUN_TERMINAL
from corral.supervisor.runs.run_state import RunStatus

#: An action in one of these still runs (or may start): the agent executes it.
_TO_EXECUTE = frozenset({ActionPhase.PREPARED, ActionPhase.APPROVED, ActionPhase.EXECUTING})


# -- the state ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestView:
    """The loop's latest provider request (provider_store.py)."""

    slot: str
    status: str
    consumed: bool
    response: str | None
    raw_sha256: str | None


@dataclass(frozen=True, slots=True)
class ActionView:
    """One committed action of the loop's plan (action_store.py); ``input`` is its
    JSON text as committed."""

    action_id: str
    tool: str
    input: str
    raw_sha256: str | None
    phase: ActionPhase
    has_receipt: bool


@dataclass(frozen=True, slots=True)
class PlannedCall:
    tool: str
    input: dict[str, Any]


@dataclass(frozen=True, slots=True)
class PlanView:
    """The loop's committed plan (loop_plan_store.py)."""

    final: str | None
    calls: tuple[PlannedCall, ...]
    raw_sha256: str | None


@dataclass(frozen=True, slots=True)
class Finalized:
    """A committed finalization of the run (finalization.py), with its reply."""

    reply: str | None


@dataclass(frozen=True, slots=True)
class StepState:
    """What ``decide`` looks at. ``advance`` reads only the parts a decision can reach:
    nothing past a status that is not running, no plan past a finalization, no
    request once there is a plan, no action without one."""

    status: RunStatus
    loop: int
    #: A boundary hook (a steer, a goal's pause) moved the run just now.
    moved_at_boundary: bool = False
    final_reply: Finalized | None = None
    plan: PlanView | None = None
    latest_request: RequestView | None = None
    actions: Mapping[int, ActionView] = field(default_factory=dict)


# -- the decisions --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Done:
    status: RunStatus


@dataclass(frozen=True, slots=True)
class Park:
    status: RunStatus


@dataclass(frozen=True, slots=True)
class ParkRun:
    """Move the run to ``status`` (for ``reason``), then park."""

    status: RunStatus
    reason: str
    repair_receipts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Finalize:
    """Finalize with ``reply``; ``after_blockers``: unless a join still holds the
    loop (children or delegations at work: wait rather than have it refused)."""

    reply: str | None
    after_blockers: bool


@dataclass(frozen=True, slots=True)
class Parse:
    slot: str
    response: str | None
    raw_sha256: str | None
    loop: int


@dataclass(frozen=True, slots=True)
class AskProvider:
    loop: int


@dataclass(frozen=True, slots=True)
class RecoverLostRequest:
    """The lane is serial: an agent asking for its next step while its own request
    is in flight lost that request (it crashed and restarted). ``advance`` marks it
    interrupted or failed (provider_store.interrupt_provider_request), or parks."""

    slot: str
    loop: int


@dataclass(frozen=True, slots=True)
class Prepare:
    loop: int
    index: int
    tool: str
    input: dict[str, Any]
    plan_raw_sha256: str | None
    repair_receipts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Execute:
    action: ActionView
    repair_receipts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AdvanceLoop:
    """Every action of loop ``loop`` ended: unless a join holds it, open the next."""

    loop: int
    repair_receipts: tuple[str, ...] = ()


Decision = Done | Park | ParkRun | Finalize | Parse | AskProvider | RecoverLostRequest | Prepare | Execute | AdvanceLoop


def decide(state: StepState) -> Decision:
    """The one next step of a run in ``state``."""
    status = state.status
    if status is not RunStatus.RUNNING:
        if status in RUN_TERMINAL and not state.moved_at_boundary:
            return Done(status)
        return Park(status)
    if state.final_reply is not None:
        return Finalize(state.final_reply.reply, after_blockers=False)
    plan = state.plan
    if plan is None:
        return _without_plan(state.latest_request, state.loop)
    if plan.final is not None:
        return Finalize(plan.final, after_blockers=True)
    return _within_plan(plan, state.actions, state.loop)


def _without_plan(latest: RequestView | None, loop: int) -> Decision:
    if latest is None:
        return AskProvider(loop)
    if latest.status == "completed" and not latest.consumed:
        return Parse(latest.slot, latest.response, latest.raw_sha256, loop)  # handed off without its plan
    if latest.status == "started":
        return RecoverLostRequest(latest.slot, loop)
    return AskProvider(loop)


def _within_plan(plan: PlanView, actions: Mapping[int, ActionView], loop: int) -> Decision:
    repairs: tuple[str, ...] = ()
    for index, call in enumerate(plan.calls):
        row = actions.get(index)
        if row is None:
            return Prepare(loop, index, call.tool, call.input, plan.raw_sha256, repairs)
        phase = row.phase
        if phase in _TO_EXECUTE:
            return Execute(row, repairs)
        if phase is ActionPhase.WAITING_CONFIRMATION:
            return ParkRun(RunStatus.WAITING_CONFIRMATION, f"action {row.action_id} waits", repairs)
        if phase is ActionPhase.NEEDS_RECONCILIATION:
            return ParkRun(RunStatus.NEEDS_RECONCILIATION, f"action {row.action_id} unresolved", repairs)
        if not row.has_receipt:
            repairs = (*repairs, row.action_id)  # a terminal move left without its receipt
    return AdvanceLoop(loop, repairs)


def leaves_nothing_waiting(decision: Decision) -> bool:
    """After ``decision``, nothing of the run's loop waits on the boundary's checks:
    no action held for a person, approved, executing or unresolved (a steer waits
    for those), no lost provider request, no finalization under way. Only then may
    a boundary that found nothing be taken as quiet (run_versions.py)."""
    return isinstance(decision, AskProvider | Parse | Prepare | AdvanceLoop)

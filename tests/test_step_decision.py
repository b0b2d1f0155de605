"""The step decision as a pure function: committed state in, one decision out.

No ledger, no processes: each row is a run's state as the ledger would hold it and
the decision ``advance`` (supervisor/runs/next_step.py) must then carry out.
"""

from __future__ import annotations

import dataclasses

import pytest

from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.runs.step_decision import (
    ActionView,
    AdvanceLoop,
    AskProvider,
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

CALLS = (PlannedCall("fs.list", {"path": "."}), PlannedCall("fs.read", {"path": "a"}))
PLAN = PlanView(final=None, calls=CALLS, raw_sha256="p-sha")
RUNNING = StepState(status=RunStatus.RUNNING, loop=3)


def action(index: int, phase: ActionPhase, *, receipt: bool = True) -> ActionView:
    return ActionView(
        action_id=f"act-{index}",
        tool=CALLS[index].tool,
        input='{"path": "."}',
        raw_sha256="r",
        phase=phase,
        has_receipt=receipt,
    )


def request(status: str, *, consumed: bool = False) -> RequestView:
    return RequestView(slot="slot-1", status=status, consumed=consumed, response="resp", raw_sha256="h")


def state(**changes: object) -> StepState:
    return dataclasses.replace(RUNNING, **changes)  # type: ignore[arg-type]


ROWS = [
    # The run's status alone.
    ("completed run", state(status=RunStatus.COMPLETED), Done(RunStatus.COMPLETED)),
    ("cancelled run", state(status=RunStatus.CANCELLED, plan=PLAN), Done(RunStatus.CANCELLED)),
    ("waiting run", state(status=RunStatus.WAITING_CONFIRMATION), Park(RunStatus.WAITING_CONFIRMATION)),
    ("pending run", state(status=RunStatus.PENDING), Park(RunStatus.PENDING)),
    ("needs input", state(status=RunStatus.NEEDS_INPUT), Park(RunStatus.NEEDS_INPUT)),
    # A boundary hook moved it: parked with the status it left, even a terminal one.
    ("hook cancelled it", state(status=RunStatus.CANCELLED, moved_at_boundary=True), Park(RunStatus.CANCELLED)),
    ("hook paused it", state(status=RunStatus.NEEDS_INPUT, moved_at_boundary=True), Park(RunStatus.NEEDS_INPUT)),
    ("hook kept it running", state(moved_at_boundary=True), AskProvider(3)),
    # A committed finalization wins over any plan, without its blockers.
    ("finalization", state(final_reply=Finalized("done"), plan=PLAN), Finalize("done", after_blockers=False)),
    ("finalization without reply", state(final_reply=Finalized(None)), Finalize(None, after_blockers=False)),
    # No plan yet: the loop's latest provider request.
    ("no request", state(), AskProvider(3)),
    ("completed unconsumed", state(latest_request=request("completed")), Parse("slot-1", "resp", "h", 3)),
    ("completed consumed", state(latest_request=request("completed", consumed=True)), AskProvider(3)),
    ("failed request", state(latest_request=request("failed")), AskProvider(3)),
    ("lost in flight", state(latest_request=request("started")), RecoverLostRequest("slot-1", 3)),
    # A plan's final reply waits for its loop's blockers.
    ("plan final", state(plan=PlanView(final="bye", calls=(), raw_sha256=None)), Finalize("bye", after_blockers=True)),
    (
        "final over calls",
        state(plan=PlanView(final="", calls=CALLS, raw_sha256=None)),
        Finalize("", after_blockers=True),
    ),
    # The plan's actions, in order.
    ("first action", state(plan=PLAN), Prepare(3, 0, "fs.list", {"path": "."}, "p-sha")),
    (
        "second action",
        state(plan=PLAN, actions={0: action(0, ActionPhase.OK)}),
        Prepare(3, 1, "fs.read", {"path": "a"}, "p-sha"),
    ),
    *[
        (f"{phase.value} executes", state(plan=PLAN, actions={0: action(0, phase)}), Execute(action(0, phase)))
        for phase in (ActionPhase.PREPARED, ActionPhase.APPROVED, ActionPhase.EXECUTING)
    ],
    (
        "waits for a person",
        state(plan=PLAN, actions={0: action(0, ActionPhase.WAITING_CONFIRMATION)}),
        ParkRun(RunStatus.WAITING_CONFIRMATION, "action act-0 waits"),
    ),
    (
        "unknown outcome parks, never replays",
        state(plan=PLAN, actions={0: action(0, ActionPhase.OK), 1: action(1, ActionPhase.NEEDS_RECONCILIATION)}),
        ParkRun(RunStatus.NEEDS_RECONCILIATION, "action act-1 unresolved"),
    ),
    (
        "all ended",
        state(plan=PLAN, actions={0: action(0, ActionPhase.OK), 1: action(1, ActionPhase.DENIED)}),
        AdvanceLoop(3),
    ),
    ("empty plan", state(plan=PlanView(final=None, calls=(), raw_sha256=None)), AdvanceLoop(3)),
    (
        "rows past the plan are not the plan's",
        state(
            plan=PlanView(final=None, calls=CALLS[:1], raw_sha256=None),
            actions={0: action(0, ActionPhase.FAILED), 1: action(1, ActionPhase.EXECUTING)},
        ),
        AdvanceLoop(3),
    ),
    # A terminal move left without its receipt: repaired on the way past it.
    (
        "repairs then advances",
        state(plan=PLAN, actions={0: action(0, ActionPhase.OK, receipt=False), 1: action(1, ActionPhase.FAILED)}),
        AdvanceLoop(3, repair_receipts=("act-0",)),
    ),
    (
        "repairs then executes",
        state(plan=PLAN, actions={0: action(0, ActionPhase.OK, receipt=False), 1: action(1, ActionPhase.EXECUTING)}),
        Execute(action(1, ActionPhase.EXECUTING), repair_receipts=("act-0",)),
    ),
    (
        "repairs then prepares",
        state(plan=PLAN, actions={0: action(0, ActionPhase.DENIED, receipt=False)}),
        Prepare(3, 1, "fs.read", {"path": "a"}, "p-sha", repair_receipts=("act-0",)),
    ),
    (
        "repairs then parks",
        state(
            plan=PLAN,
            actions={0: action(0, ActionPhase.OK, receipt=False), 1: action(1, ActionPhase.WAITING_CONFIRMATION)},
        ),
        ParkRun(RunStatus.WAITING_CONFIRMATION, "action act-1 waits", repair_receipts=("act-0",)),
    ),
]


@pytest.mark.parametrize(("name", "given", "expected"), ROWS, ids=[row[0] for row in ROWS])
def test_decide(name: str, given: StepState, expected: object) -> None:
    assert decide(given) == expected


def test_decide_reads_nothing_but_its_state() -> None:
    """The same state decides the same way every time (no clock, no ledger)."""
    given = state(plan=PLAN, actions={0: action(0, ActionPhase.OK, receipt=False)})
    assert decide(given) == decide(given) == Prepare(3, 1, "fs.read", {"path": "a"}, "p-sha", ("act-0",))


def test_decisions_are_frozen() -> None:
    decision = decide(state())
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.loop = 4  # type: ignore[misc]


WAITING = [
    (AskProvider(3), True),
    (Parse("s", None, None, 3), True),
    (Prepare(3, 0, "fs.list", {}, None), True),
    (AdvanceLoop(3), True),
    # An action held (a steer waits for it), a lost request, a finalization, a parked run.
    (Execute(action(0, ActionPhase.EXECUTING)), False),
    (Execute(action(0, ActionPhase.APPROVED)), False),
    (ParkRun(RunStatus.WAITING_CONFIRMATION, "w"), False),
    (RecoverLostRequest("s", 3), False),
    (Finalize("bye", after_blockers=True), False),
    (Park(RunStatus.NEEDS_INPUT), False),
    (Done(RunStatus.COMPLETED), False),
]


@pytest.mark.parametrize(("decision", "expected"), WAITING, ids=[type(d).__name__ + str(e) for d, e in WAITING])
def test_leaves_nothing_waiting(decision: object, expected: bool) -> None:
    assert leaves_nothing_waiting(decision) is expected  # type: ignore[arg-type]

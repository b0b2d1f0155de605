"""The run state machine: one enum, one transition table; illegal moves raise."""

from __future__ import annotations

import enum

from corral.core.transitions import IllegalTransition


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_CONFIRMATION = "waiting-confirmation"
    WAITING_FOR_JOIN = "waiting-for-join"
    WAITING_FOR_PROVIDER_RETRY = "waiting-for-provider-retry"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    NEEDS_RECONCILIATION = "needs-reconciliation"
    #: A question to the user (``user.input_request``) waits for its answer.
    NEEDS_INPUT = "needs-input"


TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
#: Statuses in which a run holds no lane and makes no provider call.
PARKED = frozenset(
    {
        RunStatus.WAITING_CONFIRMATION,
        RunStatus.WAITING_FOR_JOIN,
        RunStatus.WAITING_FOR_PROVIDER_RETRY,
        RunStatus.NEEDS_RECONCILIATION,
        RunStatus.NEEDS_INPUT,
    }
)

#: Statuses that wait for a person (approve/deny, reconcile, answer): ``wait`` stops there.
NEEDS_PERSON = frozenset({RunStatus.WAITING_CONFIRMATION, RunStatus.NEEDS_RECONCILIATION, RunStatus.NEEDS_INPUT})

_ENDINGS = {RunStatus.FAILED, RunStatus.CANCELLED}

TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.PENDING: frozenset({RunStatus.RUNNING, *_ENDINGS}),
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.WAITING_CONFIRMATION,
            RunStatus.WAITING_FOR_JOIN,
            RunStatus.WAITING_FOR_PROVIDER_RETRY,
            RunStatus.NEEDS_RECONCILIATION,
            RunStatus.NEEDS_INPUT,
            RunStatus.COMPLETED,
            *_ENDINGS,
        }
    ),
    RunStatus.NEEDS_INPUT: frozenset({RunStatus.RUNNING, *_ENDINGS}),
    RunStatus.WAITING_CONFIRMATION: frozenset({RunStatus.RUNNING, RunStatus.NEEDS_RECONCILIATION, *_ENDINGS}),
    RunStatus.WAITING_FOR_JOIN: frozenset({RunStatus.RUNNING, *_ENDINGS}),
    RunStatus.WAITING_FOR_PROVIDER_RETRY: frozenset({RunStatus.RUNNING, RunStatus.NEEDS_RECONCILIATION, *_ENDINGS}),
    RunStatus.NEEDS_RECONCILIATION: frozenset({RunStatus.RUNNING, *_ENDINGS}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


def check_run_transition(current: RunStatus, new: RunStatus) -> RunStatus:
    if new is current and current not in TERMINAL:
        return new
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"run cannot go from {current} to {new}")
    return new

"""The task bridge's objects and their state machines (pure: no I/O).

A Task is an aggregate with one revision: every successful fact transaction on
it (publish, claim, renew, start, report, submit, decide, grant, release, expiry,
cancel) adds one. Its Assignment (a claim with a lease), Run (started once per
assignment), Submission and Decision hang off it. Each machine is an enum and one
transition table; an illegal move raises.
"""

from __future__ import annotations

import enum


class BridgeError(Exception):
    """A refused command. ``code`` is the protocol's error name (docs/bridge.md);
    ``data`` goes back to the caller (e.g. the current revision on a conflict)."""

    def __init__(self, code: str, message: str, **data: object) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


#: JSON-RPC error codes of the protocol's errors (-32000..-32099 is the server range).
ERROR_CODES = {
    "unauthorized": -32001,
    "forbidden": -32003,
    "not-found": -32004,
    "revision-conflict": -32009,
    "stale": -32010,
    "idempotency-conflict": -32011,
    "invalid-state": -32012,
    "capacity": -32013,
    "lease-expired": -32014,
    "invalid-params": -32602,
    "internal": -32603,
}


class TaskStatus(enum.StrEnum):
    DRAFT = "draft"
    OPEN = "open"  # published: may be discovered and claimed
    ASSIGNED = "assigned"  # claimed: an assignment holds its lease
    RUNNING = "running"  # started
    SUBMITTED = "submitted"  # waiting for its decision
    ACCEPTED = "accepted"
    CANCELLED = "cancelled"


TASK_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.DRAFT: frozenset({TaskStatus.OPEN, TaskStatus.CANCELLED}),
    TaskStatus.OPEN: frozenset({TaskStatus.ASSIGNED, TaskStatus.CANCELLED}),
    # Back to open: released, expired, or its binding disabled.
    TaskStatus.ASSIGNED: frozenset({TaskStatus.RUNNING, TaskStatus.OPEN, TaskStatus.CANCELLED}),
    TaskStatus.RUNNING: frozenset({TaskStatus.SUBMITTED, TaskStatus.OPEN, TaskStatus.CANCELLED}),
    # A rejection opens the task again (the redo: a new assignment, run and submission).
    TaskStatus.SUBMITTED: frozenset({TaskStatus.ACCEPTED, TaskStatus.OPEN, TaskStatus.CANCELLED}),
    TaskStatus.ACCEPTED: frozenset(),
    TaskStatus.CANCELLED: frozenset(),
}


class AssignmentStatus(enum.StrEnum):
    ACTIVE = "active"
    COMPLETED = "completed"  # by its submission
    RELEASED = "released"
    EXPIRED = "expired"
    REVOKED = "revoked"  # its grant was revoked or its binding disabled
    CANCELLED = "cancelled"


ASSIGNMENT_TRANSITIONS: dict[AssignmentStatus, frozenset[AssignmentStatus]] = {
    AssignmentStatus.ACTIVE: frozenset(
        {
            AssignmentStatus.COMPLETED,
            AssignmentStatus.RELEASED,
            AssignmentStatus.EXPIRED,
            AssignmentStatus.REVOKED,
            AssignmentStatus.CANCELLED,
        }
    ),
    **{status: frozenset() for status in AssignmentStatus if status is not AssignmentStatus.ACTIVE},
}


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    ENDED = "ended"  # its assignment ended first (expired, released, revoked, cancelled)


RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.RUNNING: frozenset({RunStatus.COMPLETED, RunStatus.ENDED}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.ENDED: frozenset(),
}

#: What a grant may allow on a task.
PERMISSIONS = ("read", "claim", "decide")


def check(table: dict[enum.StrEnum, frozenset[enum.StrEnum]], current: enum.StrEnum, target: enum.StrEnum) -> None:
    if target not in table[current]:
        raise BridgeError("invalid-state", f"cannot go from {current} to {target}", status=current.value)

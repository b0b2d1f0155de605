"""Who may do what on a task, and the checks every command shares: the
revision compare-and-set, live leases, and the views returned to callers."""

from __future__ import annotations

import json
import secrets
import sqlite3
from typing import Any

from corral.bridge.model import (
    ASSIGNMENT_TRANSITIONS,
    RUN_TRANSITIONS,
    TASK_TRANSITIONS,
    AssignmentStatus,
    BridgeError,
    RunStatus,
    TaskStatus,
    check,
)
from corral.bridge.store import Call, LeaseExpired, iso


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(8)}"


def task_row(call: Call, task_id: str) -> sqlite3.Row:
    row = call.one("SELECT * FROM tasks WHERE task_id = ?", task_id)
    if row is None:
        raise BridgeError("not-found", f"no task {task_id!r}")
    return row


def grants_of(call: Call, task_id: str, principal: str) -> list[sqlite3.Row]:
    return call.all(
        "SELECT * FROM grants WHERE task_id = ? AND principal = ? AND status = 'active' ORDER BY created_at",
        task_id,
        principal,
    )


def allowed(call: Call, task: sqlite3.Row, permission: str) -> bool:
    """The owner, the issuer and the named decider may read and decide the task;
    anyone else needs an active grant naming the permission. A parent's grants give
    nothing on a child."""
    if call.principal in (task["owner"], task["issuer"], task["decider"]) and permission in ("read", "decide"):
        return True
    return any(permission in json.loads(g["permissions"]) for g in grants_of(call, task["task_id"], call.principal))


def require(call: Call, task: sqlite3.Row, permission: str) -> None:
    if not allowed(call, task, permission):
        raise BridgeError("forbidden", f"{call.principal} may not {permission} task {task['task_id']}")


def require_manager(call: Call, task: sqlite3.Row) -> None:
    """Publishing, granting and cancelling are the owner's and the issuer's."""
    if call.principal not in (task["owner"], task["issuer"]):
        raise BridgeError("forbidden", f"only the owner or the issuer of task {task['task_id']} may do that")


def check_revision(task: sqlite3.Row, params: dict[str, Any]) -> None:
    if int(params["expected_revision"]) != int(task["revision"]):
        raise BridgeError(
            "revision-conflict",
            f"task {task['task_id']} is at revision {task['revision']}, not {params['expected_revision']}",
            current_revision=int(task["revision"]),
        )


def bump(call: Call, task: sqlite3.Row, kind: str, status: TaskStatus | None = None, **data: Any) -> int:
    """One fact transaction on the task: its revision + 1, its status moved (checked
    against the table), and one event carrying the new revision."""
    revision = int(task["revision"]) + 1
    current = TaskStatus(task["status"])
    if status is not None and status is not current:
        check(TASK_TRANSITIONS, current, status)  # type: ignore[arg-type]
    call.db.execute(
        "UPDATE tasks SET revision = ?, status = ?, updated_at = ? WHERE task_id = ?",
        (revision, (status or current).value, call.now, task["task_id"]),
    )
    call.event(task["task_id"], kind, revision, **data)
    return revision


def live_assignment(call: Call, task: sqlite3.Row, assignment_id: str) -> sqlite3.Row:
    """The caller's active assignment on this task, within its lease (a lease past
    its deadline raises LeaseExpired: the store rolls back and materialises it)."""
    row = call.one("SELECT * FROM assignments WHERE assignment_id = ?", assignment_id)
    if row is None or row["task_id"] != task["task_id"]:
        raise BridgeError("not-found", f"no assignment {assignment_id!r} on task {task['task_id']}")
    if row["principal"] != call.principal:
        raise BridgeError("forbidden", f"assignment {assignment_id} is not {call.principal}'s")
    if row["status"] != AssignmentStatus.ACTIVE:
        raise BridgeError("invalid-state", f"assignment {assignment_id} is {row['status']}", status=row["status"])
    if int(row["lease_deadline"]) <= call.now:
        raise LeaseExpired(assignment_id)
    return row


def end_assignment(call: Call, assignment: sqlite3.Row, status: AssignmentStatus, reason: str, *,
                   kind: str | None = None, **data: Any) -> int:
    """End an active assignment and its run; the task opens again. One revision and
    one event (``kind``, by default ``assignment.<status>``, with ``data``): the
    command that ends it adds nothing more. Returns the task's new revision."""
    check(ASSIGNMENT_TRANSITIONS, AssignmentStatus(assignment["status"]), status)  # type: ignore[arg-type]
    call.db.execute(
        "UPDATE assignments SET status = ?, ended_at = ? WHERE assignment_id = ?",
        (status.value, call.now, assignment["assignment_id"]),
    )
    run = call.one("SELECT * FROM runs WHERE assignment_id = ?", assignment["assignment_id"])
    if run is not None and run["status"] == RunStatus.RUNNING:
        check(RUN_TRANSITIONS, RunStatus.RUNNING, RunStatus.ENDED)  # type: ignore[arg-type]
        call.db.execute("UPDATE runs SET status = 'ended', ended_at = ? WHERE run_id = ?", (call.now, run["run_id"]))
    task = task_row(call, assignment["task_id"])
    ending = TaskStatus.CANCELLED if status is AssignmentStatus.CANCELLED else TaskStatus.OPEN
    return bump(call, task, kind or f"assignment.{status.value}", ending if TaskStatus(task["status"]) in (
        TaskStatus.ASSIGNED, TaskStatus.RUNNING) else None,
        **data, assignment_id=assignment["assignment_id"], reason=reason)


def expire(call: Call, assignment_id: str) -> None:
    """Materialise a lease past its deadline, once (the store calls this)."""
    row = call.one("SELECT * FROM assignments WHERE assignment_id = ?", assignment_id)
    if row is not None and row["status"] == AssignmentStatus.ACTIVE and int(row["lease_deadline"]) <= call.now:
        end_assignment(call, row, AssignmentStatus.EXPIRED, "lease deadline passed")


def lease_deadline(call: Call, task: sqlite3.Row, requested_ms: int | None, grant: sqlite3.Row | None,
                   binding: sqlite3.Row) -> int:
    """Now + the lease, capped by the claim grant's and the binding's caps."""
    lease = int(requested_ms or task["lease_ms"])
    for cap in (grant["lease_cap_ms"] if grant is not None else None, binding["lease_cap_ms"]):
        if cap is not None:
            lease = min(lease, int(cap))
    return call.now + lease


# -- views ------------------------------------------------------------------------


def task_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "task_id": row["task_id"],
        "owner": row["owner"],
        "issuer": row["issuer"],
        "decider": row["decider"],
        "title": row["title"],
        "body": json.loads(row["body"]),
        "status": row["status"],
        "revision": int(row["revision"]),
        "parent_id": row["parent_id"],
        "lease_ms": int(row["lease_ms"]),
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
    }


def assignment_view(row: sqlite3.Row, now: int) -> dict[str, Any]:
    return {
        "assignment_id": row["assignment_id"],
        "task_id": row["task_id"],
        "principal": row["principal"],
        "binding_id": row["binding_id"],
        "status": row["status"],
        "lease_deadline": iso(row["lease_deadline"]),
        "lease_expired": row["status"] == AssignmentStatus.ACTIVE and int(row["lease_deadline"]) <= now,
        "created_at": iso(row["created_at"]),
    }


def run_view(row: sqlite3.Row, reports: list[sqlite3.Row]) -> dict[str, Any]:
    return {
        "run_id": row["run_id"],
        "assignment_id": row["assignment_id"],
        "task_id": row["task_id"],
        "status": row["status"],
        "reports": [{"seq": int(r["seq"]), "body": json.loads(r["body"]), "at": iso(r["at"])} for r in reports],
        "created_at": iso(row["created_at"]),
    }


def submission_view(row: sqlite3.Row, decision: sqlite3.Row | None) -> dict[str, Any]:
    return {
        "submission_id": row["submission_id"],
        "run_id": row["run_id"],
        "assignment_id": row["assignment_id"],
        "task_id": row["task_id"],
        "result": json.loads(row["result"]),
        "at": iso(row["at"]),
        "decision": None if decision is None else {
            "decision_id": decision["decision_id"],
            "decider": decision["decider"],
            "verdict": decision["verdict"],
            "reason": decision["reason"],
            "at": iso(decision["at"]),
        },
    }


def grant_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "grant_id": row["grant_id"],
        "task_id": row["task_id"],
        "principal": row["principal"],
        "permissions": json.loads(row["permissions"]),
        "lease_cap_ms": row["lease_cap_ms"],
        "status": row["status"],
        "auth_epoch": int(row["auth_epoch"]),
    }


def binding_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "binding_id": row["binding_id"],
        "principal": row["principal"],
        "status": row["status"],
        "lease_cap_ms": row["lease_cap_ms"],
        "created_at": iso(row["created_at"]),
    }

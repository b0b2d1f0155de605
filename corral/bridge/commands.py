"""The bridge's commands: tasks, assignments, runs, decisions, grants and
bindings. Each runs inside the store's one transaction; each successful fact on a
task adds exactly one revision (``access.bump``)."""

from __future__ import annotations

import json
from typing import Any

from corral.bridge import access
from corral.bridge.access import new_id, require, require_manager, task_row
from corral.bridge.model import AssignmentStatus, BridgeError, RunStatus, TaskStatus
from corral.bridge.store import LIMITS, Call, LeaseExpired

# -- tasks --------------------------------------------------------------------------


def _insert_task(call: Call, params: dict[str, Any], owner: str, parent_id: str | None) -> str:
    if call.count("tasks") >= LIMITS["tasks"]:
        raise BridgeError("capacity", f"the bridge holds its limit of {LIMITS['tasks']} tasks (M1 deletes none)")
    task_id = new_id("task")
    status = TaskStatus.OPEN if params.get("publish") else TaskStatus.DRAFT
    call.db.execute(
        "INSERT INTO tasks (task_id, owner, issuer, decider, title, body, status, revision, parent_id, lease_ms,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)",
        (task_id, owner, call.principal, params.get("decider") or call.principal, params["title"],
         json.dumps(params.get("body", {}), sort_keys=True), status.value, parent_id,
         int(params.get("lease_ms", 60_000)), call.now, call.now),
    )
    call.event(task_id, "task.created", 1, status=status.value, parent_id=parent_id,
               grants=[g["principal"] for g in params.get("grants", [])])
    return task_id


def task_id_view(call: Call, task_id: str) -> dict[str, Any]:
    return {"task": access.task_view(task_row(call, task_id))}


def task_create(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    return task_id_view(call, _insert_task(call, params, call.principal, None))


def task_publish(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task = task_row(call, params["task_id"])
    require_manager(call, task)
    access.check_revision(task, params)
    if task["status"] != TaskStatus.DRAFT:
        raise BridgeError("invalid-state", f"task {task['task_id']} is {task['status']}, not a draft",
                          status=task["status"])
    access.bump(call, task, "task.published", TaskStatus.OPEN)
    return task_id_view(call, task["task_id"])


def task_cancel(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task = task_row(call, params["task_id"])
    require_manager(call, task)
    access.check_revision(task, params)
    active = call.one("SELECT * FROM assignments WHERE task_id = ? AND status = 'active'", task["task_id"])
    if active is not None:
        access.end_assignment(call, active, AssignmentStatus.CANCELLED, params["reason"])
    else:
        access.bump(call, task, "task.cancelled", TaskStatus.CANCELLED, reason=params["reason"])
    return task_id_view(call, task["task_id"])


def task_get(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task = task_row(call, params["task_id"])
    require(call, task, "read")
    assignments = call.all("SELECT * FROM assignments WHERE task_id = ? ORDER BY created_at", task["task_id"])
    submissions = call.all("SELECT * FROM submissions WHERE task_id = ? ORDER BY at", task["task_id"])
    children = call.all("SELECT child_id FROM relations WHERE parent_id = ? ORDER BY created_at", task["task_id"])
    return {
        "task": access.task_view(task),
        "assignments": [access.assignment_view(a, call.now) for a in assignments],
        "submissions": [
            access.submission_view(s, call.one("SELECT * FROM decisions WHERE submission_id = ?", s["submission_id"]))
            for s in submissions
        ],
        "children": [row["child_id"] for row in children],
    }


#: The live tasks the caller holds an active grant on: walked from the live tasks
#: (index tasks_by_status), not from every grant the caller ever had.
DISCOVER_SQL = (
    "SELECT DISTINCT t.* FROM tasks t JOIN grants g ON g.task_id = t.task_id"
    " WHERE g.principal = ? AND g.status = 'active' AND t.status IN ('open', 'assigned', 'running')"
    " ORDER BY t.created_at LIMIT ?"
)


def task_discover(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """Open tasks the caller may claim, and claimed ones whose lease has passed
    (a claim materialises that expiry and answers ``stale``; claim again)."""
    rows = call.all(DISCOVER_SQL, call.principal, int(params.get("limit", 100)))
    found = []
    for row in rows:
        if not access.allowed(call, row, "claim"):
            continue
        if row["status"] != TaskStatus.OPEN:
            active = call.one("SELECT lease_deadline FROM assignments WHERE task_id = ? AND status = 'active'",
                              row["task_id"])
            if active is None or int(active["lease_deadline"]) > call.now:
                continue
        found.append(access.task_view(row))
    return {"tasks": found}


def task_create_child(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """The child task, its relation and its grants in one transaction; the parent's
    revision is checked, not changed. The child has the parent's owner; the caller
    is its issuer: the parent's owner or whoever holds the parent's live assignment."""
    parent = task_row(call, params["parent_id"])
    access.check_revision(parent, params)
    if call.principal != parent["owner"]:
        active = call.one("SELECT * FROM assignments WHERE task_id = ? AND status = 'active' AND principal = ?",
                          parent["task_id"], call.principal)
        if active is None:
            raise BridgeError("forbidden", f"{call.principal} neither owns nor holds task {parent['task_id']}")
        access.live_assignment(call, parent, active["assignment_id"])
    child_id = _insert_task(call, params, parent["owner"], parent["task_id"])
    call.db.execute("INSERT INTO relations (child_id, parent_id, created_at) VALUES (?, ?, ?)",
                    (child_id, parent["task_id"], call.now))
    epoch = call.bump_auth_epoch() if params.get("grants") else call.auth_epoch()
    for grant in params.get("grants", []):
        _insert_grant(call, child_id, grant, epoch)
    return task_id_view(call, child_id)


# -- grants and bindings ---------------------------------------------------------------


def _insert_grant(call: Call, task_id: str, grant: dict[str, Any], epoch: int) -> str:
    grant_id = new_id("grt")
    call.db.execute(
        "INSERT INTO grants (grant_id, task_id, principal, permissions, lease_cap_ms, status, granted_by,"
        " auth_epoch, created_at) VALUES (?, ?, ?, ?, ?, 'active', ?, ?, ?)",
        (grant_id, task_id, grant["principal"], json.dumps(sorted(set(grant["permissions"]))),
         grant.get("lease_cap_ms"), call.principal, epoch, call.now),
    )
    return grant_id


def grant_create(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task = task_row(call, params["task_id"])
    require_manager(call, task)
    access.check_revision(task, params)
    epoch = call.bump_auth_epoch()
    grant_id = _insert_grant(call, task["task_id"], params, epoch)
    revision = access.bump(call, task, "grant.created", grant_id=grant_id, principal=params["principal"])
    row = call.one("SELECT * FROM grants WHERE grant_id = ?", grant_id)
    assert row is not None
    return {"grant": access.grant_view(row), "revision": revision}


def grant_revoke(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """Revoked now: an assignment that held the claim by it ends (revoked) in the
    same transaction, and its run with it."""
    task = task_row(call, params["task_id"])
    require_manager(call, task)
    access.check_revision(task, params)
    grant = call.one("SELECT * FROM grants WHERE grant_id = ? AND task_id = ?", params["grant_id"], task["task_id"])
    if grant is None:
        raise BridgeError("not-found", f"no grant {params['grant_id']!r} on task {task['task_id']}")
    if grant["status"] != "active":
        raise BridgeError("invalid-state", f"grant {grant['grant_id']} is already {grant['status']}")
    epoch = call.bump_auth_epoch()
    call.db.execute(
        "UPDATE grants SET status = 'revoked', revoked_at = ? WHERE grant_id = ?", (call.now, grant["grant_id"])
    )
    active = call.one("SELECT * FROM assignments WHERE grant_id = ? AND status = 'active'", grant["grant_id"])
    if active is not None:
        # One transaction, one revision: the revocation and the assignment it ends
        # are one fact (one event), as a cancel that ends an assignment is.
        revision = access.end_assignment(call, active, AssignmentStatus.REVOKED, params["reason"],
                                         kind="grant.revoked", grant_id=grant["grant_id"])
    else:
        revision = access.bump(call, task, "grant.revoked", grant_id=grant["grant_id"], reason=params["reason"])
    return {"grant_id": grant["grant_id"], "auth_epoch": epoch, "revision": revision}


def grant_list(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task = task_row(call, params["task_id"])
    require(call, task, "read")
    rows = call.all("SELECT * FROM grants WHERE task_id = ? ORDER BY created_at", task["task_id"])
    return {"grants": [access.grant_view(row) for row in rows]}


def binding_enable(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """A new binding, always a new id: re-enabling never revives old assignments."""
    binding_id = new_id("bnd")
    call.db.execute(
        "INSERT INTO bindings (binding_id, principal, status, lease_cap_ms, created_at) VALUES (?, ?, 'enabled', ?, ?)",
        (binding_id, call.principal, params.get("lease_cap_ms"), call.now),
    )
    epoch = call.bump_auth_epoch()
    row = call.one("SELECT * FROM bindings WHERE binding_id = ?", binding_id)
    assert row is not None
    return {"binding": access.binding_view(row), "auth_epoch": epoch}


def binding_disable(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    binding = call.one("SELECT * FROM bindings WHERE binding_id = ?", params["binding_id"])
    if binding is None or binding["principal"] != call.principal:
        raise BridgeError("not-found", f"no binding {params['binding_id']!r} of {call.principal}")
    if binding["status"] != "enabled":
        raise BridgeError("invalid-state", f"binding {binding['binding_id']} is already disabled")
    call.db.execute("UPDATE bindings SET status = 'disabled', disabled_at = ? WHERE binding_id = ?",
                    (call.now, binding["binding_id"]))
    ended = call.all("SELECT * FROM assignments WHERE binding_id = ? AND status = 'active'", binding["binding_id"])
    for assignment in ended:
        access.end_assignment(call, assignment, AssignmentStatus.REVOKED, "its binding was disabled")
    return {"binding_id": binding["binding_id"], "ended_assignments": [a["assignment_id"] for a in ended],
            "auth_epoch": call.bump_auth_epoch()}


def binding_list(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    rows = call.all("SELECT * FROM bindings WHERE principal = ? ORDER BY created_at", call.principal)
    return {"bindings": [access.binding_view(row) for row in rows]}


# -- assignments ------------------------------------------------------------------------


def assignment_claim(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task = task_row(call, params["task_id"])
    access.check_revision(task, params)
    active = call.one("SELECT * FROM assignments WHERE task_id = ? AND status = 'active'", task["task_id"])
    if active is not None and int(active["lease_deadline"]) <= call.now:
        raise LeaseExpired(active["assignment_id"])  # materialised once, then claim again
    grant = next((g for g in access.grants_of(call, task["task_id"], call.principal)
                  if "claim" in json.loads(g["permissions"])), None)
    if grant is None:
        raise BridgeError("forbidden", f"{call.principal} has no claim grant on task {task['task_id']}")
    if task["status"] != TaskStatus.OPEN:
        raise BridgeError("invalid-state", f"task {task['task_id']} is {task['status']}, not open",
                          status=task["status"])
    binding = call.one("SELECT * FROM bindings WHERE binding_id = ?", params["binding_id"])
    if binding is None or binding["principal"] != call.principal or binding["status"] != "enabled":
        raise BridgeError(
            "forbidden", f"binding {params['binding_id']!r} is not an enabled binding of {call.principal}"
        )
    deadline = access.lease_deadline(call, task, params.get("lease_ms"), grant, binding)
    assignment_id = new_id("asg")
    call.db.execute(
        "INSERT INTO assignments (assignment_id, task_id, principal, binding_id, grant_id, status, lease_deadline,"
        " created_at) VALUES (?, ?, ?, ?, ?, 'active', ?, ?)",
        (assignment_id, task["task_id"], call.principal, binding["binding_id"], grant["grant_id"], deadline, call.now),
    )
    revision = access.bump(call, task, "assignment.claimed", TaskStatus.ASSIGNED, assignment_id=assignment_id)
    return _assignment_reply(call, assignment_id, revision)


def assignment_renew(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task = task_row(call, params["task_id"])
    access.check_revision(task, params)
    assignment = access.live_assignment(call, task, params["assignment_id"])
    grant = call.one("SELECT * FROM grants WHERE grant_id = ?", assignment["grant_id"])
    binding = call.one("SELECT * FROM bindings WHERE binding_id = ?", assignment["binding_id"])
    assert binding is not None
    deadline = access.lease_deadline(call, task, params.get("lease_ms"), grant, binding)
    call.db.execute("UPDATE assignments SET lease_deadline = ? WHERE assignment_id = ?",
                    (deadline, assignment["assignment_id"]))
    revision = access.bump(call, task, "assignment.renewed", assignment_id=assignment["assignment_id"])
    return _assignment_reply(call, assignment["assignment_id"], revision)


def _assignment_reply(call: Call, assignment_id: str, revision: int) -> dict[str, Any]:
    """The assignment as the command left it, with the task's new revision."""
    row = call.one("SELECT * FROM assignments WHERE assignment_id = ?", assignment_id)
    assert row is not None
    return {"assignment": access.assignment_view(row, call.now), "revision": revision}


def assignment_release(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task = task_row(call, params["task_id"])
    access.check_revision(task, params)
    assignment = access.live_assignment(call, task, params["assignment_id"])
    access.end_assignment(call, assignment, AssignmentStatus.RELEASED, params["reason"])
    return {"assignment_id": assignment["assignment_id"], "revision": int(task_row(call, task["task_id"])["revision"])}


def assignment_get(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    row = call.one("SELECT * FROM assignments WHERE assignment_id = ?", params["assignment_id"])
    if row is None:
        raise BridgeError("not-found", f"no assignment {params['assignment_id']!r}")
    if row["principal"] != call.principal:
        require(call, task_row(call, row["task_id"]), "read")
    return {"assignment": access.assignment_view(row, call.now)}


# -- runs, submissions, decisions -----------------------------------------------------------


def _run_of(call: Call, run_id: str) -> Any:
    run = call.one("SELECT * FROM runs WHERE run_id = ?", run_id)
    if run is None:
        raise BridgeError("not-found", f"no run {run_id!r}")
    return run


def run_start(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task = task_row(call, params["task_id"])
    access.check_revision(task, params)
    assignment = access.live_assignment(call, task, params["assignment_id"])
    if call.one("SELECT 1 FROM runs WHERE assignment_id = ?", assignment["assignment_id"]):
        raise BridgeError("invalid-state", f"assignment {assignment['assignment_id']} already has its run")
    run_id = new_id("run")
    call.db.execute(
        "INSERT INTO runs (run_id, assignment_id, task_id, status, created_at) VALUES (?, ?, ?, 'running', ?)",
        (run_id, assignment["assignment_id"], task["task_id"], call.now),
    )
    revision = access.bump(call, task, "run.started", TaskStatus.RUNNING, run_id=run_id)
    return {"run": access.run_view(_run_of(call, run_id), []), "revision": revision}


def _live_run(call: Call, params: dict[str, Any]) -> tuple[Any, Any, Any]:
    task = task_row(call, params["task_id"])
    run = _run_of(call, params["run_id"])
    if run["task_id"] != task["task_id"]:
        raise BridgeError("not-found", f"run {run['run_id']} is not on task {task['task_id']}")
    access.check_revision(task, params)
    assignment = access.live_assignment(call, task, run["assignment_id"])
    if run["status"] != RunStatus.RUNNING:
        raise BridgeError("invalid-state", f"run {run['run_id']} is {run['status']}", status=run["status"])
    return task, run, assignment


def run_report(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    task, run, _ = _live_run(call, params)
    count = call.one("SELECT COUNT(*) AS n FROM reports WHERE run_id = ?", run["run_id"])
    seq = int(count["n"]) if count else 0
    if seq >= LIMITS["reports_per_run"]:
        raise BridgeError("capacity", f"run {run['run_id']} holds its limit of {LIMITS['reports_per_run']} reports")
    call.db.execute("INSERT INTO reports (run_id, seq, body, at) VALUES (?, ?, ?, ?)",
                    (run["run_id"], seq, json.dumps(params["body"], sort_keys=True), call.now))
    revision = access.bump(call, task, "run.reported", run_id=run["run_id"], seq=seq)
    return {"run_id": run["run_id"], "seq": seq, "revision": revision}


def run_submit(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """Completes the assignment and the run and creates the submission, together."""
    task, run, assignment = _live_run(call, params)
    submission_id = new_id("sub")
    call.db.execute("UPDATE assignments SET status = 'completed', ended_at = ? WHERE assignment_id = ?",
                    (call.now, assignment["assignment_id"]))
    call.db.execute("UPDATE runs SET status = 'completed', ended_at = ? WHERE run_id = ?", (call.now, run["run_id"]))
    call.db.execute(
        "INSERT INTO submissions (submission_id, run_id, assignment_id, task_id, result, at) VALUES (?, ?, ?, ?, ?, ?)",
        (submission_id, run["run_id"], assignment["assignment_id"], task["task_id"],
         json.dumps(params["result"], sort_keys=True), call.now),
    )
    revision = access.bump(call, task, "run.submitted", TaskStatus.SUBMITTED, submission_id=submission_id)
    row = call.one("SELECT * FROM submissions WHERE submission_id = ?", submission_id)
    return {"submission": access.submission_view(row, None), "revision": revision}  # type: ignore[arg-type]


def run_get(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    run = _run_of(call, params["run_id"])
    assignment = call.one("SELECT principal FROM assignments WHERE assignment_id = ?", run["assignment_id"])
    if assignment is None or assignment["principal"] != call.principal:
        require(call, task_row(call, run["task_id"]), "read")
    reports = call.all("SELECT * FROM reports WHERE run_id = ? ORDER BY seq", run["run_id"])
    return {"run": access.run_view(run, reports)}


def submission_get(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    row = call.one("SELECT * FROM submissions WHERE submission_id = ?", params["submission_id"])
    if row is None:
        raise BridgeError("not-found", f"no submission {params['submission_id']!r}")
    require(call, task_row(call, row["task_id"]), "read")  # history needs read permission now
    decision = call.one("SELECT * FROM decisions WHERE submission_id = ?", row["submission_id"])
    return {"submission": access.submission_view(row, decision)}


def decision_make(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """One decision per submission. Accept ends the task; reject opens it again for
    the redo (a new assignment, run and submission)."""
    task = task_row(call, params["task_id"])
    require(call, task, "decide")
    access.check_revision(task, params)
    submission = call.one("SELECT * FROM submissions WHERE submission_id = ? AND task_id = ?",
                          params["submission_id"], task["task_id"])
    if submission is None:
        raise BridgeError("not-found", f"no submission {params['submission_id']!r} on task {task['task_id']}")
    if call.one("SELECT 1 FROM decisions WHERE submission_id = ?", submission["submission_id"]):
        raise BridgeError("invalid-state", f"submission {submission['submission_id']} is already decided")
    decision_id = new_id("dec")
    call.db.execute(
        "INSERT INTO decisions (decision_id, submission_id, task_id, decider, verdict, reason, at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        (decision_id, submission["submission_id"], task["task_id"], call.principal, params["verdict"],
         params["reason"], call.now),
    )
    status = TaskStatus.ACCEPTED if params["verdict"] == "accept" else TaskStatus.OPEN
    revision = access.bump(call, task, f"decision.{params['verdict']}", status, decision_id=decision_id,
                           submission_id=submission["submission_id"])
    return {"decision_id": decision_id, "verdict": params["verdict"], "revision": revision}

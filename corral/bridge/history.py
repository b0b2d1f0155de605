"""Reading the bridge: snapshot at a watermark, the transaction history before and
after it, the audit log, and who the caller is. Reads check the caller's *current*
read permission: history is not a right to see what you may no longer read."""

from __future__ import annotations

import json
from typing import Any

from corral.bridge import access
from corral.bridge.model import BridgeError
from corral.bridge.store import Call, iso

PROTOCOL = "bridge-m1-1"
#: A snapshot holds at most this many tasks (M1: snapshots have an upper bound).
SNAPSHOT_MAX_TASKS = 1000
EVENTS_PAGE_MAX = 1000


def _readable_tasks(call: Call) -> list[Any]:
    rows = call.all(
        "SELECT * FROM tasks t WHERE t.owner = ? OR t.issuer = ? OR t.decider = ? OR EXISTS (SELECT 1 FROM grants g"
        " WHERE g.task_id = t.task_id AND g.principal = ? AND g.status = 'active'"
        " AND g.permissions LIKE '%\"read\"%') ORDER BY t.created_at LIMIT ?",
        call.principal, call.principal, call.principal, call.principal, SNAPSHOT_MAX_TASKS + 1,
    )
    return rows


def snapshot_get(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """Every fact of the tasks the caller may read, at watermark W (one read
    transaction): events after W continue from ``cursor`` = W."""
    watermark_row = call.one("SELECT COALESCE(MAX(seq), 0) AS w FROM events")
    watermark = int(watermark_row["w"]) if watermark_row else 0
    tasks = _readable_tasks(call)
    if len(tasks) > SNAPSHOT_MAX_TASKS:
        raise BridgeError("capacity", f"more than {SNAPSHOT_MAX_TASKS} readable tasks: read the event history instead")
    facts = []
    for task in tasks:
        task_id = task["task_id"]
        facts.append({
            "task": access.task_view(task),
            "assignments": [access.assignment_view(a, call.now) for a in call.all(
                "SELECT * FROM assignments WHERE task_id = ? ORDER BY created_at", task_id)],
            "runs": [access.run_view(r, call.all("SELECT * FROM reports WHERE run_id = ? ORDER BY seq", r["run_id"]))
                     for r in call.all("SELECT * FROM runs WHERE task_id = ? ORDER BY created_at", task_id)],
            "submissions": [
                access.submission_view(s, call.one("SELECT * FROM decisions WHERE submission_id = ?",
                                                   s["submission_id"]))
                for s in call.all("SELECT * FROM submissions WHERE task_id = ? ORDER BY at", task_id)
            ],
            "grants": [access.grant_view(g) for g in call.all(
                "SELECT * FROM grants WHERE task_id = ? ORDER BY created_at", task_id)],
            "children": [r["child_id"] for r in call.all(
                "SELECT child_id FROM relations WHERE parent_id = ? ORDER BY created_at", task_id)],
        })
    return {"watermark": watermark, "cursor": watermark, "auth_epoch": call.auth_epoch(), "tasks": facts,
            "at": iso(call.now)}


def events_open(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """Where the history read starts (``after``, 0: the beginning) and the watermark
    it is complete up to now."""
    watermark_row = call.one("SELECT COALESCE(MAX(seq), 0) AS w FROM events")
    return {"cursor": int(params.get("after", 0)), "watermark": int(watermark_row["w"]) if watermark_row else 0}


def events_read(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """Events after ``cursor``, oldest first, of the tasks the caller may read now;
    the cursor moves past the others too, so a reader never stalls on them."""
    limit = min(int(params.get("limit", 200)), EVENTS_PAGE_MAX)
    rows = call.all("SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?", int(params["cursor"]), limit)
    readable: dict[str, bool] = {}
    events = []
    for row in rows:
        task_id = row["task_id"]
        if task_id not in readable:
            task = call.one("SELECT * FROM tasks WHERE task_id = ?", task_id)
            readable[task_id] = task is not None and access.allowed(call, task, "read")
        if readable[task_id]:
            events.append({"seq": int(row["seq"]), "at": iso(row["at"]), "task_id": task_id, "kind": row["kind"],
                           "revision": int(row["revision"]), "principal": row["principal"],
                           "request_id": row["request_id"], "data": json.loads(row["data"])})
    cursor = int(rows[-1]["seq"]) if rows else int(params["cursor"])
    return {"events": events, "cursor": cursor, "more": len(rows) == limit}


def audit_read(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    """The caller's own audit rows: action, request id, outcome and reason."""
    rows = call.all("SELECT * FROM audit WHERE principal = ? AND seq > ? ORDER BY seq LIMIT ?",
                    call.principal, int(params.get("after", 0)), min(int(params.get("limit", 200)), EVENTS_PAGE_MAX))
    return {"audit": [{"seq": int(r["seq"]), "at": iso(r["at"]), "method": r["method"], "request_id": r["request_id"],
                       "outcome": r["outcome"], "reason": r["reason"]} for r in rows]}


def principal_whoami(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    return {"principal": call.principal, "auth_epoch": call.auth_epoch(), "at": iso(call.now)}


def bridge_info(call: Call, params: dict[str, Any]) -> dict[str, Any]:
    from corral.bridge.methods import METHODS

    return {"protocol": PROTOCOL, "methods": sorted(METHODS), "at": iso(call.now)}

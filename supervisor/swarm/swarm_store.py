"""Ledger operations of the swarm: spawn, child results, joins, delegation, claims.

Limits are checked before anything is created; each creation is one transaction;
every id is derived from the parent action id, never chosen by a model.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from corral.actors.tools.base import ToolError
from corral.actors.tools.paths import check_relative, resolve_in_workspace, scopes_overlap
from corral.core.redact import redact, summarize
from corral.supervisor.errors import BadRequest, NotFound, Refused
from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.runs.run_store import create_run, get_run, set_run_status
from corral.supervisor.spec.swarm_spec import SwarmSpec
from corral.supervisor.swarm.swarm_state import (
    ClaimPhase,
    DeliveryStatus,
    check_claim,
    check_delivery,
    delegation_id_for,
    group_id_for,
    instance_id_for,
    sha,
    static_delegation_id,
)

CHILD_TOOLS = ["fs.read", "fs.write", "fs.patch", "fs.list", "effect.record", "effect.barrier"]
SPECIALIST_TOOLS = CHILD_TOOLS


def _now() -> float:
    return time.time()


def _str_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise BadRequest(f"{what} must be a list of non-empty strings")
    return list(value)


def _relative_paths(paths: list[str], what: str) -> None:
    for path in paths:
        try:
            check_relative(path)
        except ToolError as exc:
            raise BadRequest(f"{what}: {exc}") from None


# -- isolated children --------------------------------------------------------------


def spawn_group(
    ledger: Ledger,
    spec: SwarmSpec,
    parent_run: sqlite3.Row,
    parent_action_id: str,
    children: Any,
    join_mode: Any,
) -> dict[str, Any]:
    group_id = group_id_for(parent_action_id)
    existing = ledger.one("SELECT * FROM isolated_groups WHERE group_id = ?", group_id)
    if existing is not None:
        return _group_view(ledger, group_id)  # replay of the same action: same group
    if parent_run["kind"] == "child":
        raise Refused("a child may not spawn isolated children", "limit")
    if parent_run["kind"] == "delegation":
        raise Refused("a delegated specialist run may not spawn isolated children", "limit")
    if parent_run["depth"] + 1 > spec.limits.max_depth:
        raise Refused(f"depth {parent_run['depth'] + 1} exceeds the limit of {spec.limits.max_depth}", "limit")
    if join_mode != "all":
        raise BadRequest("join_mode must be 'all'")
    if not isinstance(children, list) or not children:
        raise BadRequest("children must be a non-empty list")
    if len(children) > spec.limits.max_children_per_call:
        raise Refused(
            f"{len(children)} children requested; the limit is {spec.limits.max_children_per_call} per call",
            "limit",
        )
    parsed = []
    for index, child in enumerate(children):
        if not isinstance(child, dict):
            raise BadRequest(f"children[{index}] must be a map")
        unknown = set(child) - {
            "template",
            "task",
            "acceptance_criteria",
            "expected_artifacts",
            "write_scopes",
        }
        if unknown:
            raise BadRequest(f"children[{index}]: unknown fields {sorted(unknown)}")
        template = child.get("template")
        try:
            template_spec = spec.template(template) if isinstance(template, str) else None
        except KeyError:
            template_spec = None
        if template_spec is None:
            known = ", ".join(t.id for t in spec.templates) or "none declared"
            raise BadRequest(f"children[{index}]: unknown template {template!r} ({known})")
        task = child.get("task")
        if not isinstance(task, str) or not task.strip():
            raise BadRequest(f"children[{index}]: task must be a non-empty string")
        artifacts = _str_list(child.get("expected_artifacts", []), f"children[{index}].expected_artifacts")
        scopes = _str_list(child.get("write_scopes"), f"children[{index}].write_scopes")
        _relative_paths(artifacts, f"children[{index}].expected_artifacts")
        _relative_paths(scopes, f"children[{index}].write_scopes")
        for artifact in artifacts:
            if not any(scopes_overlap(artifact, scope) and _inside(artifact, scope) for scope in scopes):
                raise BadRequest(f"children[{index}]: artifact {artifact!r} lies outside its write scopes")
        parsed.append((template_spec, task, str(child.get("acceptance_criteria", "")), artifacts, scopes))
    for i, (_, _, _, _, left) in enumerate(parsed):
        for j, (_, _, _, _, right) in enumerate(parsed[i + 1 :], start=i + 1):
            for a in left:
                for b in right:
                    if scopes_overlap(a, b):
                        raise Refused(f"write scopes overlap: children[{i}] {a!r} and children[{j}] {b!r}", "limit")
    digest = sha(json.dumps([[t.id, task, artifacts, scopes] for t, task, _, artifacts, scopes in parsed]))
    duplicate = ledger.one(
        "SELECT parent_action_id FROM isolated_groups WHERE parent_run_id = ? AND request_digest = ?",
        parent_run["run_id"],
        digest,
    )
    if duplicate is not None:
        raise Refused(
            f"duplicate spawn refused: action {duplicate['parent_action_id']} already spawned these children",
            "duplicate",
        )
    options = json.loads(parent_run["options"])
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO isolated_groups (group_id, parent_run_id, parent_action_id, join_mode, request_digest,"
            " status, created_at) VALUES (?, ?, ?, 'all', ?, 'open', ?)",
            (group_id, parent_run["run_id"], parent_action_id, digest, _now()),
        )
        for index, (template_spec, task, criteria, artifacts, scopes) in enumerate(parsed):
            delegation_id = delegation_id_for(group_id, index)
            instance_id = instance_id_for(delegation_id)
            run_id = f"run-{instance_id}"
            create_run(
                ledger,
                agent_id=instance_id,
                task=_child_task(task, criteria, artifacts),
                provider=template_spec.provider,
                provider_config=template_spec.provider_config,
                kind="child",
                parent_run_id=parent_run["run_id"],
                root_run_id=parent_run["root_run_id"],
                depth=parent_run["depth"] + 1,
                run_id=run_id,
                options={
                    "workspace": options.get("workspace"),
                    "write_scopes": scopes,
                    "allowed_tools": CHILD_TOOLS,
                    "tool_globs": list(template_spec.tools) if template_spec.tools is not None else None,
                    "policy": {**spec.policy, **template_spec.policy},
                    "effects_file": options.get("effects_file"),
                    "limits": options.get("limits", {}),
                    "template": template_spec.id,
                },
            )
            db.execute(
                "INSERT INTO children (delegation_id, group_id, idx, instance_id, template, task,"
                " acceptance_criteria, expected_artifacts, write_scopes, run_id, status, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?)",
                (
                    delegation_id,
                    group_id,
                    index,
                    instance_id,
                    template_spec.id,
                    summarize(task, 2000),
                    summarize(criteria, 2000),
                    dumps(artifacts),
                    dumps(scopes),
                    run_id,
                    _now(),
                ),
            )
        ledger.event("group-spawned", group_id, parent_run=parent_run["run_id"], children=len(parsed))
    ledger.failpoint("spawn.after-commit")
    return _group_view(ledger, group_id)


def _inside(path: str, scope: str) -> bool:
    from pathlib import PurePosixPath

    scope_path = PurePosixPath(scope.rstrip("/") or ".")
    return str(scope_path) == "." or PurePosixPath(path).is_relative_to(scope_path)


def _child_task(task: str, criteria: str, artifacts: list[str]) -> str:
    lines = [task]
    if criteria:
        lines.append(f"Acceptance criteria: {criteria}")
    if artifacts:
        lines.append("Expected artifacts: " + ", ".join(artifacts))
    return "\n".join(lines)


def _group_view(ledger: Ledger, group_id: str) -> dict[str, Any]:
    children = ledger.all(
        "SELECT delegation_id, instance_id, run_id, template, status FROM children WHERE group_id = ? ORDER BY idx",
        group_id,
    )
    return {"group_id": group_id, "children": [dict(row) for row in children]}


def children_to_run(ledger: Ledger) -> list[sqlite3.Row]:
    return ledger.all(
        "SELECT c.* FROM children c JOIN runs r ON r.run_id = c.run_id"
        " WHERE c.status = 'running' AND r.status NOT IN ('completed', 'failed', 'cancelled') ORDER BY c.created_at"
    )


def _artifacts(workspace: Path, expected: list[str]) -> tuple[list[dict[str, str]], list[str]]:
    """sha256 recomputed by the supervisor from the files, not taken from the child."""
    found, missing = [], []
    for path in expected:
        try:
            target = resolve_in_workspace(workspace, path)
        except ToolError:
            missing.append(path)
            continue
        if target.is_file():
            import hashlib

            found.append({"path": path, "sha256": hashlib.sha256(target.read_bytes()).hexdigest()})
        else:
            missing.append(path)
    return found, missing


def _evidence(ledger: Ledger, run_id: str) -> list[str]:
    rows = ledger.all("SELECT tool, status, result_summary FROM receipts WHERE run_id = ? ORDER BY receipt_id", run_id)
    return [f"{row['tool']} {row['status']}: {row['result_summary']}" for row in rows][:20]


def _revision(artifacts: list[dict[str, str]]) -> str:
    return sha(json.dumps(sorted((a["path"], a["sha256"]) for a in artifacts)))[:16]


def finish_child(ledger: Ledger, run_id: str, summary: str | None, error: str | None) -> str | None:
    """A child run produced its result (or failed). Returns a new join delivery id, if any."""
    child = ledger.one("SELECT * FROM children WHERE run_id = ?", run_id)
    if child is None:
        raise NotFound(f"run {run_id} is not an isolated child")
    if child["status"] == "terminal":
        return None
    run = get_run(ledger, run_id)
    workspace = Path(json.loads(run["options"]).get("workspace") or ".")
    artifacts, missing = _artifacts(workspace, json.loads(child["expected_artifacts"]))
    if error is None and missing:
        error = "result contract broken: missing artifacts " + ", ".join(missing)
    status = "ok" if error is None else "failed"
    result = {
        "delegation_id": child["delegation_id"],
        "instance_id": child["instance_id"],
        "template": child["template"],
        "run_id": run_id,
        "status": status,
        "summary": summarize(summary or "", 500),
        "artifacts": artifacts,
        "evidence": _evidence(ledger, run_id),
        "verified_revision": _revision(artifacts),
        "error": error,
    }
    with ledger.tx() as db:
        db.execute(
            "UPDATE children SET status = 'terminal', result = ?, ended_at = ? WHERE run_id = ?",
            (dumps(redact(result)), _now(), run_id),
        )
        if RunStatus(run["status"]) not in TERMINAL:
            set_run_status(
                ledger,
                run_id,
                RunStatus.COMPLETED if status == "ok" else RunStatus.FAILED,
                None if status == "ok" else error,
            )
        ledger.event("child-finished", child["instance_id"], run=run_id, status=status, error=error or "")
        return _maybe_join(ledger, child["group_id"])


def _maybe_join(ledger: Ledger, group_id: str) -> str | None:
    open_children = ledger.one("SELECT COUNT(*) FROM children WHERE group_id = ? AND status != 'terminal'", group_id)
    if open_children is None or open_children[0]:
        return None
    group = ledger.one("SELECT * FROM isolated_groups WHERE group_id = ?", group_id)
    assert group is not None
    results = [
        json.loads(row["result"])
        for row in ledger.all("SELECT result FROM children WHERE group_id = ? ORDER BY idx", group_id)
    ]
    delivery_id = "dlv-" + sha(f"join\x00{group_id}")[:20]
    with ledger.tx() as db:
        if db.execute("SELECT 1 FROM deliveries WHERE source_id = ?", (group_id,)).fetchone():
            return None
        db.execute(
            "UPDATE isolated_groups SET status = 'joined', joined_at = ? WHERE group_id = ?",
            (_now(), group_id),
        )
        db.execute(
            "INSERT INTO deliveries (delivery_id, kind, source_id, target, parent_run_id, status, payload, created_at)"
            " VALUES (?, 'join', ?, 'parent-wake', ?, 'dispatched', ?, ?)",
            (
                delivery_id,
                group_id,
                group["parent_run_id"],
                dumps({"group_id": group_id, "results": results}),
                _now(),
            ),
        )
        ledger.event(
            "join-delivered",
            delivery_id,
            group=group_id,
            parent_run=group["parent_run_id"],
            failed=sum(1 for r in results if r["status"] != "ok"),
        )
    # This runs inside the child's own finishing transaction (even inside a run
    # status change): the failpoint waits for the commit.
    ledger.failpoint("join.after-delivery")
    return delivery_id


# -- static delegation ----------------------------------------------------------------


def delegate(
    ledger: Ledger,
    spec: SwarmSpec,
    parent_run: sqlite3.Row,
    parent_action_id: str,
    params: dict[str, Any],
) -> dict[str, Any]:
    delegation_id = static_delegation_id(parent_action_id)
    existing = ledger.one("SELECT * FROM delegations WHERE delegation_id = ?", delegation_id)
    if existing is not None:
        return {
            "delegation_id": delegation_id,
            "run_id": existing["run_id"],
            "target": existing["target_agent"],
        }
    if parent_run["kind"] != "root":
        raise Refused(f"a {parent_run['kind']} run may not delegate (depth is limited to 1)", "limit")
    target = params.get("agent_id")
    if not isinstance(target, str):
        raise BadRequest("agent_id must be a string")
    try:
        target_spec = spec.agent(target)
    except KeyError:
        raise BadRequest(f"no agent {target!r} in the swarm spec") from None
    if target_spec.role != "specialist":
        raise Refused(f"agent {target!r} is not a specialist (role = {target_spec.role})", "limit")
    if target == parent_run["agent_id"]:
        raise Refused("an agent may not delegate to itself", "limit")
    task = params.get("task")
    if not isinstance(task, str) or not task.strip():
        raise BadRequest("task must be a non-empty string")
    artifacts = _str_list(params.get("expected_artifacts", []), "expected_artifacts")
    _relative_paths(artifacts, "expected_artifacts")
    criteria = str(params.get("acceptance_criteria", ""))
    repair_of = params.get("repair_of")
    if repair_of is not None:
        original = ledger.one("SELECT * FROM delegations WHERE delegation_id = ?", repair_of)
        if original is None or original["parent_run_id"] != parent_run["run_id"]:
            raise BadRequest(f"repair_of {repair_of!r} is not a delegation of this run")
        if original["repair_of"] is not None:
            raise Refused("a repair may not be repaired again (repair depth is 1)", "limit")
        if original["target_agent"] != target:
            raise Refused(f"a repair goes to the same agent ({original['target_agent']})", "limit")
        result = json.loads(original["result"]) if original["result"] else {}
        if result.get("status") != "needs-repair":
            raise Refused(
                f"delegation {repair_of} does not need repair ({result.get('status', 'unfinished')})", "limit"
            )
        if ledger.one("SELECT 1 FROM delegations WHERE repair_of = ?", repair_of):
            raise Refused(f"delegation {repair_of} already has its one repair", "duplicate")
    else:
        digest_task = summarize(task, 2000)
        duplicate = ledger.one(
            "SELECT parent_action_id FROM delegations WHERE parent_run_id = ? AND target_agent = ? AND task = ?"
            " AND repair_of IS NULL",
            parent_run["run_id"],
            target,
            digest_task,
        )
        if duplicate is not None:
            raise Refused(
                f"duplicate delegation refused: action {duplicate['parent_action_id']} already delegated it",
                "duplicate",
            )
    options = {
        "workspace": str(target_spec.workspace),
        "write_scopes": list(target_spec.write_scopes),
        "allowed_tools": SPECIALIST_TOOLS,
        # The specialist's own allow list holds for delegated work too.
        "tool_globs": list(target_spec.tools) if target_spec.tools is not None else None,
        "policy": {**spec.policy, **target_spec.policy},
        "effects_file": json.loads(parent_run["options"]).get("effects_file"),
        "limits": {"max_repairs": target_spec.max_repairs},
    }
    run_id = f"run-{delegation_id[4:16]}"
    with ledger.tx() as db:
        create_run(
            ledger,
            agent_id=target,
            task=_child_task(task, criteria, artifacts),
            provider=target_spec.provider,
            provider_config=target_spec.provider_config,
            kind="delegation",
            parent_run_id=parent_run["run_id"],
            root_run_id=parent_run["root_run_id"],
            depth=parent_run["depth"] + 1,
            run_id=run_id,
            options=options,
        )
        db.execute(
            "INSERT INTO delegations (delegation_id, parent_run_id, parent_action_id, target_agent, task,"
            " acceptance_criteria, expected_artifacts, repair_of, run_id, status, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?)",
            (
                delegation_id,
                parent_run["run_id"],
                parent_action_id,
                target,
                summarize(task, 2000),
                summarize(criteria, 2000),
                dumps(artifacts),
                repair_of,
                run_id,
                _now(),
            ),
        )
        ledger.event(
            "delegated",
            delegation_id,
            parent_run=parent_run["run_id"],
            target=target,
            repair_of=repair_of or "",
        )
    ledger.failpoint("delegate.after-commit")
    return {"delegation_id": delegation_id, "run_id": run_id, "target": target}


def finish_delegation(ledger: Ledger, run_id: str, summary: str | None, error: str | None) -> str | None:
    row = ledger.one("SELECT * FROM delegations WHERE run_id = ?", run_id)
    if row is None:
        raise NotFound(f"run {run_id} is not a delegation")
    if row["status"] == "terminal":
        return None
    run = get_run(ledger, run_id)
    workspace = Path(json.loads(run["options"]).get("workspace") or ".")
    artifacts, missing = _artifacts(workspace, json.loads(row["expected_artifacts"]))
    status = "evidence-ready" if error is None and not missing else "needs-repair"
    result = {
        "delegation_id": row["delegation_id"],
        "agent_id": row["target_agent"],
        "run_id": run_id,
        "status": status,
        "summary": summarize(summary or "", 500),
        "artifacts": artifacts,
        "missing_artifacts": missing,
        "evidence": _evidence(ledger, run_id),
        "error": error,
        "repair_of": row["repair_of"],
    }
    delivery_id = "dlv-" + sha(f"receipt\x00{row['delegation_id']}")[:20]
    with ledger.tx() as db:
        db.execute(
            "UPDATE delegations SET status = 'terminal', result = ?, ended_at = ? WHERE run_id = ?",
            (dumps(redact(result)), _now(), run_id),
        )
        if RunStatus(run["status"]) not in TERMINAL:
            set_run_status(ledger, run_id, RunStatus.COMPLETED if error is None else RunStatus.FAILED, error)
        db.execute(
            "INSERT INTO deliveries (delivery_id, kind, source_id, target, parent_run_id, status, payload, created_at)"
            " VALUES (?, 'receipt', ?, 'parent-wake', ?, 'dispatched', ?, ?)",
            (delivery_id, row["delegation_id"], row["parent_run_id"], dumps(redact(result)), _now()),
        )
        ledger.event(
            "delegation-receipt",
            delivery_id,
            delegation=row["delegation_id"],
            status=status,
            parent_run=row["parent_run_id"],
        )
    return delivery_id


# -- claims --------------------------------------------------------------------------


def claim(ledger: Ledger, parent_run_id: str, action_id: str, delivery_ids: list[str] | None) -> dict[str, Any]:
    """Claim ready deliveries for the parent, all-or-nothing in a stable order."""
    journal = ledger.one("SELECT * FROM claim_journal WHERE action_id = ?", action_id)
    if journal is None:
        if delivery_ids is None:
            rows = ledger.all(
                "SELECT delivery_id FROM deliveries WHERE parent_run_id = ? AND status = 'dispatched'"
                " ORDER BY created_at, delivery_id",
                parent_run_id,
            )
            targets = [row["delivery_id"] for row in rows]
        else:
            targets = sorted(set(delivery_ids))
            for delivery_id in targets:
                row = ledger.one("SELECT * FROM deliveries WHERE delivery_id = ?", delivery_id)
                if row is None or row["parent_run_id"] != parent_run_id:
                    raise BadRequest(f"no delivery {delivery_id!r} for this run")
                if row["status"] != DeliveryStatus.DISPATCHED:
                    raise Refused(
                        f"delivery {delivery_id} is already {row['status']} (by {row['claimed_by_action_id']})",
                        "already-claimed",
                    )
        if not targets:
            return {"claim_id": None, "claimed": [], "open": open_work(ledger, parent_run_id)}
        claim_id = "clm-" + sha(action_id)[:20]
        with ledger.tx() as db:
            db.execute(
                "INSERT INTO claim_journal (claim_id, parent_run_id, action_id, delivery_ids, phase, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, 'prepared', ?, ?)",
                (claim_id, parent_run_id, action_id, dumps(targets), _now(), _now()),
            )
            ledger.event("claim-prepared", claim_id, action=action_id, deliveries=len(targets))
        ledger.failpoint("claim.after-prepared")
        journal = ledger.one("SELECT * FROM claim_journal WHERE action_id = ?", action_id)
        assert journal is not None
    if journal["phase"] == ClaimPhase.PREPARED:
        commit_claim(ledger, journal["claim_id"])
        ledger.failpoint("claim.after-commit")
    return claimed_view(ledger, journal["claim_id"])


def commit_claim(ledger: Ledger, claim_id: str) -> None:
    with ledger.tx() as db:
        journal = db.execute("SELECT * FROM claim_journal WHERE claim_id = ?", (claim_id,)).fetchone()
        check_claim(ClaimPhase(journal["phase"]), ClaimPhase.COMMITTED)
        for delivery_id in json.loads(journal["delivery_ids"]):
            row = db.execute("SELECT * FROM deliveries WHERE delivery_id = ?", (delivery_id,)).fetchone()
            if row["status"] != DeliveryStatus.DISPATCHED:
                # All or nothing: one lost race aborts the whole claim (rollback).
                raise Refused(f"delivery {delivery_id} was claimed by {row['claimed_by_action_id']}", "already-claimed")
            check_delivery(DeliveryStatus(row["status"]), DeliveryStatus.CLAIMED)
            db.execute(
                "UPDATE deliveries SET status = 'claimed-by-parent', claimed_by_action_id = ?, claim_id = ?,"
                " claimed_at = ? WHERE delivery_id = ?",
                (journal["action_id"], claim_id, _now(), delivery_id),
            )
        db.execute(
            "UPDATE claim_journal SET phase = 'committed', updated_at = ? WHERE claim_id = ?",
            (_now(), claim_id),
        )
        ledger.event("claim-committed", claim_id, action=journal["action_id"])


def claimed_view(ledger: Ledger, claim_id: str) -> dict[str, Any]:
    journal = ledger.one("SELECT * FROM claim_journal WHERE claim_id = ?", claim_id)
    assert journal is not None
    ids = json.loads(journal["delivery_ids"])
    rows = {
        row["delivery_id"]: row
        for row in ledger.all(f"SELECT * FROM deliveries WHERE delivery_id IN ({','.join('?' * len(ids))})", *ids)
    }
    claimed = [{"delivery_id": i, "kind": rows[i]["kind"], **json.loads(rows[i]["payload"])} for i in ids]
    return {"claim_id": claim_id, "claimed": claimed, "open": open_work(ledger, journal["parent_run_id"])}


def observe_claim(ledger: Ledger, action_id: str) -> None:
    """The claim's observation reached the parent's context (its receipt was written)."""
    with ledger.tx() as db:
        journal = db.execute("SELECT * FROM claim_journal WHERE action_id = ?", (action_id,)).fetchone()
        if journal is None or journal["phase"] != ClaimPhase.COMMITTED:
            return
        db.execute(
            "UPDATE claim_journal SET phase = 'observed', updated_at = ? WHERE claim_id = ?",
            (_now(), journal["claim_id"]),
        )
        ledger.event("claim-observed", journal["claim_id"], action=action_id)


def open_work(ledger: Ledger, run_id: str) -> int:
    groups = ledger.one("SELECT COUNT(*) FROM isolated_groups WHERE parent_run_id = ? AND status = 'open'", run_id)
    delegations = ledger.one(
        "SELECT COUNT(*) FROM delegations WHERE parent_run_id = ? AND status != 'terminal'", run_id
    )
    return int((groups[0] if groups else 0) + (delegations[0] if delegations else 0))


def blockers(ledger: Ledger, run_id: str) -> list[str]:
    reasons = []
    if open_work(ledger, run_id):
        reasons.append(f"{open_work(ledger, run_id)} child group(s)/delegation(s) still running")
    for row in ledger.all(
        "SELECT delivery_id, kind FROM deliveries WHERE parent_run_id = ? AND status = 'dispatched'", run_id
    ):
        reasons.append(f"unclaimed {row['kind']} delivery {row['delivery_id']}")
    for row in ledger.all(
        "SELECT claim_id, phase FROM claim_journal WHERE parent_run_id = ? AND phase != 'observed'", run_id
    ):
        reasons.append(f"claim {row['claim_id']} not yet observed ({row['phase']})")
    return reasons


def tombstone(ledger: Ledger, run_id: str, reason: str) -> list[str]:
    """A parent that ended: cancel its live children and delegations, suppress its deliveries."""
    cancelled: list[str] = []
    with ledger.tx() as db:
        for child in db.execute(
            "SELECT * FROM children WHERE status != 'terminal' AND group_id IN"
            " (SELECT group_id FROM isolated_groups WHERE parent_run_id = ?)",
            (run_id,),
        ).fetchall():
            result = {
                "delegation_id": child["delegation_id"],
                "instance_id": child["instance_id"],
                "template": child["template"],
                "run_id": child["run_id"],
                "status": "failed",
                "summary": "",
                "artifacts": [],
                "evidence": [],
                "verified_revision": None,
                "error": f"cancelled: {reason}",
            }
            db.execute(
                "UPDATE children SET status = 'terminal', result = ?, ended_at = ? WHERE delegation_id = ?",
                (dumps(result), _now(), child["delegation_id"]),
            )
            if RunStatus(get_run(ledger, child["run_id"])["status"]) not in TERMINAL:
                set_run_status(ledger, child["run_id"], RunStatus.CANCELLED, f"parent ended: {reason}")
            ledger.event("child-tombstone", child["instance_id"], parent_run=run_id)
            cancelled.append(child["instance_id"])
        for row in db.execute(
            "SELECT * FROM delegations WHERE parent_run_id = ? AND status != 'terminal'", (run_id,)
        ).fetchall():
            db.execute(
                "UPDATE delegations SET status = 'terminal', result = ?, ended_at = ? WHERE delegation_id = ?",
                (
                    dumps({"status": "needs-repair", "error": f"cancelled: {reason}"}),
                    _now(),
                    row["delegation_id"],
                ),
            )
            if RunStatus(get_run(ledger, row["run_id"])["status"]) not in TERMINAL:
                set_run_status(ledger, row["run_id"], RunStatus.CANCELLED, f"parent ended: {reason}")
        db.execute(
            "UPDATE isolated_groups SET status = 'joined' WHERE parent_run_id = ? AND status = 'open'",
            (run_id,),
        )
        for row in db.execute(
            "SELECT delivery_id FROM deliveries WHERE parent_run_id = ? AND status = 'dispatched'", (run_id,)
        ).fetchall():
            db.execute("UPDATE deliveries SET status = 'suppressed' WHERE delivery_id = ?", (row["delivery_id"],))
            ledger.event("delivery-suppressed", row["delivery_id"], parent_run=run_id)
    return cancelled

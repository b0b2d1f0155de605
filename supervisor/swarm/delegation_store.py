"""Static delegation in the ledger: a root run hands a task to a specialist agent
of the spec (one delegated run, at most one repair of it), and the specialist's
result comes back to the parent as a receipt delivery.

Every id is derived from the parent action id, never chosen by a model.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from corral.core.redact import redact, summarize
from corral.supervisor.errors import BadRequest, NotFound, Refused
from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.runs.run_output import output_of
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.runs.run_store import create_run, get_run, set_run_status
from corral.supervisor.spec.swarm_spec import SwarmSpec
from corral.supervisor.swarm.swarm_state import sha, static_delegation_id
from corral.supervisor.swarm.work_contract import (
    SPECIALIST_TOOLS,
    evidence,
    hashed_artifacts,
    refused_work,
    relative_paths,
    str_list,
    task_text,
)


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
        raise Refused(f"a {parent_run['kind']} run may not delegate (depth is limited to 1)", code="limit")
    target = params.get("agent_id")
    if not isinstance(target, str):
        raise BadRequest("agent_id must be a string")
    try:
        target_spec = spec.agent(target)
    except KeyError:
        raise BadRequest(f"no agent {target!r} in the swarm spec") from None
    if target_spec.role != "specialist":
        raise Refused(f"agent {target!r} is not a specialist (role = {target_spec.role})", code="limit")
    if target == parent_run["agent_id"]:
        raise Refused("an agent may not delegate to itself", code="limit")
    task = params.get("task")
    if not isinstance(task, str) or not task.strip():
        raise BadRequest("task must be a non-empty string")
    artifacts = str_list(params.get("expected_artifacts", []), "expected_artifacts")
    relative_paths(artifacts, "expected_artifacts")
    criteria = str(params.get("acceptance_criteria", ""))
    repair_of = params.get("repair_of")
    if repair_of is not None:
        original = ledger.one("SELECT * FROM delegations WHERE delegation_id = ?", repair_of)
        if original is None or original["parent_run_id"] != parent_run["run_id"]:
            raise BadRequest(f"repair_of {repair_of!r} is not a delegation of this run")
        if original["repair_of"] is not None:
            raise Refused("a repair may not be repaired again (repair depth is 1)", code="limit")
        if original["target_agent"] != target:
            raise Refused(f"a repair goes to the same agent ({original['target_agent']})", code="limit")
        result = json.loads(original["result"]) if original["result"] else {}
        if result.get("status") != "needs-repair":
            raise Refused(
                f"delegation {repair_of} does not need repair ({result.get('status', 'unfinished')})", code="limit"
            )
        if ledger.one("SELECT 1 FROM delegations WHERE repair_of = ?", repair_of):
            raise Refused(f"delegation {repair_of} already has its one repair", code="duplicate")
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
                code="duplicate",
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
        **target_spec.definition_options(),  # the specialist's own instructions
    }
    run_id = f"run-{delegation_id[4:16]}"
    with ledger.tx() as db:
        create_run(
            ledger,
            agent_id=target,
            task=task_text(task, criteria, artifacts),
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
                time.time(),
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
    artifacts, missing = hashed_artifacts(workspace, json.loads(row["expected_artifacts"]))
    # Work that was all refused or failed is no evidence, even with a hopeful reply.
    no_evidence = refused_work(ledger, run_id) if error is None else None
    status = "evidence-ready" if error is None and not missing and no_evidence is None else "needs-repair"
    result = {
        "delegation_id": row["delegation_id"],
        "agent_id": row["target_agent"],
        "run_id": run_id,
        "status": status,
        "summary": summarize(summary or "", 500),
        "output": output_of(run["options"], summary),  # the specialist's validated output, typed
        "artifacts": artifacts,
        "missing_artifacts": missing,
        "evidence": evidence(ledger, run_id),
        "error": error or no_evidence,
        "repair_of": row["repair_of"],
    }
    delivery_id = "dlv-" + sha(f"receipt\x00{row['delegation_id']}")[:20]
    with ledger.tx() as db:
        db.execute(
            "UPDATE delegations SET status = 'terminal', result = ?, ended_at = ? WHERE run_id = ?",
            (dumps(redact(result)), time.time(), run_id),
        )
        if RunStatus(run["status"]) not in TERMINAL:
            set_run_status(ledger, run_id, RunStatus.COMPLETED if error is None else RunStatus.FAILED, error)
        db.execute(
            "INSERT INTO deliveries (delivery_id, kind, source_id, target, parent_run_id, status, payload, created_at)"
            " VALUES (?, 'receipt', ?, 'parent-wake', ?, 'dispatched', ?, ?)",
            (delivery_id, row["delegation_id"], row["parent_run_id"], dumps(redact(result)), time.time()),
        )
        ledger.event(
            "delegation-receipt",
            delivery_id,
            delegation=row["delegation_id"],
            status=status,
            parent_run=row["parent_run_id"],
        )
    return delivery_id

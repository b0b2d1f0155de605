"""Isolated children in the ledger: a spawn (one group of children, each with its
own child run, checked against the limits before anything is created, in one
transaction), a child's result, and the join that delivers the group's results
to the parent once its last child finished.

Every id is derived from the parent action id, never chosen by a model.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from corral.core.redact import redact, summarize
from corral.supervisor.errors import NotFound, Refused
from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_output import output_of
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.runs.run_store import create_run, get_run, set_run_status
from corral.supervisor.spec.spec_models import DEFAULT_AUTO_COMPACT, DEFAULT_CONTEXT_WINDOW, DEFAULT_TOOL_OUTPUT
from corral.supervisor.spec.swarm_spec import SwarmSpec
from corral.supervisor.swarm.swarm_decisions import parent_view, plan_spawn
from corral.supervisor.swarm.swarm_state import delegation_id_for, group_id_for, instance_id_for, sha
from corral.supervisor.swarm.work_contract import (
    CHILD_TOOLS,
    evidence,
    hashed_artifacts,
    refused_work,
    revision,
    task_text,
)

#: The spec's token limits when an agent sets none (spec_models.AgentOptions.context_limits).
_DEFAULT_CONTEXT = {"window": DEFAULT_CONTEXT_WINDOW, "auto_compact": DEFAULT_AUTO_COMPACT,
                    "tool_output": DEFAULT_TOOL_OUTPUT}


def spawn_group(
    ledger: Ledger,
    spec: SwarmSpec,
    parent_run: sqlite3.Row,
    parent_action_id: str,
    children: Any,
    join_mode: Any,
    features: RunFeatures,
) -> dict[str, Any]:
    """Spawn one group of isolated children for ``parent_action_id``: the checks are
    swarm_decisions.plan_spawn's; a replay of the same action gets the same group."""
    group_id = group_id_for(parent_action_id)
    existing = ledger.one("SELECT * FROM isolated_groups WHERE group_id = ?", group_id)
    if existing is not None:
        return _group_view(ledger, group_id)  # replay of the same action: same group
    plan = plan_spawn(spec, parent_view(parent_run), children, join_mode)
    digest = plan.digest
    duplicate = ledger.one(
        "SELECT parent_action_id FROM isolated_groups WHERE parent_run_id = ? AND request_digest = ?",
        parent_run["run_id"],
        digest,
    )
    if duplicate is not None:
        raise Refused(
            f"duplicate spawn refused: action {duplicate['parent_action_id']} already spawned these children",
            code="duplicate",
        )
    options = json.loads(parent_run["options"])
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO isolated_groups (group_id, parent_run_id, parent_action_id, join_mode, request_digest,"
            " status, created_at) VALUES (?, ?, ?, 'all', ?, 'open', ?)",
            (group_id, parent_run["run_id"], parent_action_id, digest, time.time()),
        )
        for index, child in enumerate(plan.children):
            template_spec = child.template
            delegation_id = delegation_id_for(group_id, index)
            instance_id = instance_id_for(delegation_id)
            run_id = f"run-{instance_id}"
            create_run(
                ledger,
                features,
                agent_id=instance_id,
                task=task_text(child.task, child.criteria, list(child.artifacts)),
                provider=template_spec.provider,
                provider_config=template_spec.provider_config,
                kind="child",
                parent_run_id=parent_run["run_id"],
                root_run_id=parent_run["root_run_id"],
                depth=parent_run["depth"] + 1,
                run_id=run_id,
                options={
                    "workspace": options.get("workspace"),
                    "write_scopes": list(child.scopes),
                    "allowed_tools": CHILD_TOOLS,
                    "tool_globs": list(template_spec.tools) if template_spec.tools is not None else None,
                    "policy": {**spec.policy, **template_spec.policy},
                    "effects_file": options.get("effects_file"),
                    "limits": options.get("limits", {}),
                    # A template sets no token limits: its child keeps its parent's (the spec's
                    # defaults for a parent from before them), so its turns compact and fail
                    # closed as every run's do (seed 004 V1.21).
                    "context": options.get("context") or _DEFAULT_CONTEXT,
                    "template": template_spec.id,
                    **template_spec.definition_options(),  # its template's instructions, not the parent's
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
                    summarize(child.task, 2000),
                    summarize(child.criteria, 2000),
                    dumps(list(child.artifacts)),
                    dumps(list(child.scopes)),
                    run_id,
                    time.time(),
                ),
            )
        ledger.event("group-spawned", group_id, parent_run=parent_run["run_id"], children=len(plan.children))
    ledger.failpoint("spawn.after-commit")
    return _group_view(ledger, group_id)


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


def finish_child(
    ledger: Ledger, run_id: str, summary: str | None, error: str | None, features: RunFeatures
) -> str | None:
    """A child run produced its result (or failed). Returns a new join delivery id, if any."""
    child = ledger.one("SELECT * FROM children WHERE run_id = ?", run_id)
    if child is None:
        raise NotFound(f"run {run_id} is not an isolated child")
    if child["status"] == "terminal":
        return None
    run = get_run(ledger, run_id)
    workspace = Path(json.loads(run["options"]).get("workspace") or ".")
    artifacts, missing = hashed_artifacts(workspace, json.loads(child["expected_artifacts"]))
    if error is None and missing:
        error = "result contract broken: missing artifacts " + ", ".join(missing)
    if error is None:
        error = refused_work(ledger, run_id)  # all refused or failed: no evidence, whatever the reply says
    status = "ok" if error is None else "failed"
    result = {
        "delegation_id": child["delegation_id"],
        "instance_id": child["instance_id"],
        "template": child["template"],
        "run_id": run_id,
        "status": status,
        "summary": summarize(summary or "", 500),
        "output": output_of(run["options"], summary),  # the child's validated output
        "artifacts": artifacts,
        "evidence": evidence(ledger, run_id),
        "verified_revision": revision(artifacts),
        "error": error,
    }
    with ledger.tx() as db:
        db.execute(
            "UPDATE children SET status = 'terminal', result = ?, ended_at = ? WHERE run_id = ?",
            (dumps(redact(result)), time.time(), run_id),
        )
        if RunStatus(run["status"]) not in TERMINAL:
            set_run_status(
                ledger,
                run_id,
                RunStatus.COMPLETED if status == "ok" else RunStatus.FAILED,
                features,
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
            (time.time(), group_id),
        )
        db.execute(
            "INSERT INTO deliveries (delivery_id, kind, source_id, target, parent_run_id, status, payload, created_at)"
            " VALUES (?, 'join', ?, 'parent-wake', ?, 'dispatched', ?, ?)",
            (
                delivery_id,
                group_id,
                group["parent_run_id"],
                dumps({"group_id": group_id, "results": results}),
                time.time(),
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

"""Static delegation in the ledger: a root run hands a task to a specialist agent
of the spec (one delegated run, at most one repair of it), and the specialist's
result comes back to the parent as a receipt delivery.

A repair (seed 004 V1.28) is the parent's judgement, not the runtime's: it may send
back any receipt it has claimed, ``needs-repair`` or ``evidence-ready`` alike
(evidence-ready only means the evidence is there to be judged), once, to the same
specialist, never a repair of a repair. The parent reads a claimed delegation's
whole contract back with ``contract``.

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
from corral.supervisor.project.project_service import project_settings
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_output import output_of
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.runs.run_store import create_run, get_run, set_run_status
from corral.supervisor.spec.swarm_spec import SwarmSpec
from corral.supervisor.swarm.swarm_decisions import OriginalDelegation, judge_repair, parent_view, plan_delegation
from corral.supervisor.swarm.swarm_state import DeliveryStatus, sha, static_delegation_id
from corral.supervisor.swarm.work_contract import (
    SPECIALIST_TOOLS,
    delegation_task_text,
    evidence,
    hashed_artifacts,
    refused_work,
    stored_criteria,
    verification_of,
)

#: Static delegations of one parent run dispatched (running) or ready (delivered, not
#: yet claimed) at once (seed 004 V1.16).
MAX_OPEN_DELEGATIONS = 3


def open_delegations(ledger: Ledger, parent_run_id: str) -> list[str]:
    """The parent's delegations still running, or delivered and not yet claimed:
    ``target (task)`` each, oldest first."""
    rows = ledger.all(
        "SELECT d.target_agent, d.task FROM delegations d"
        " LEFT JOIN deliveries v ON v.source_id = d.delegation_id AND v.kind = 'receipt'"
        " WHERE d.parent_run_id = ? AND (d.status = 'running' OR v.status = 'dispatched')"
        " ORDER BY d.created_at, d.delegation_id",
        parent_run_id,
    )
    return [f"{row['target_agent']} ({summarize(row['task'], 80)})" for row in rows]


def delegate(
    ledger: Ledger,
    spec: SwarmSpec,
    parent_run: sqlite3.Row,
    parent_action_id: str,
    params: dict[str, Any],
    features: RunFeatures,
) -> dict[str, Any]:
    delegation_id = static_delegation_id(parent_action_id)
    existing = ledger.one("SELECT * FROM delegations WHERE delegation_id = ?", delegation_id)
    if existing is not None:
        return {
            "delegation_id": delegation_id,
            "run_id": existing["run_id"],
            "target": existing["target_agent"],
        }
    plan = plan_delegation(spec, parent_view(parent_run), params)
    target, target_spec, repair_of = plan.target.id, plan.target, plan.repair_of
    criteria, artifacts = list(plan.criteria), list(plan.artifacts)
    if repair_of is not None:
        original = ledger.one("SELECT * FROM delegations WHERE delegation_id = ?", repair_of)
        judge_repair(
            parent_run["run_id"], target, repair_of, _original(ledger, original), plan.criteria, plan.artifacts
        )
    else:
        duplicate = ledger.one(
            "SELECT parent_action_id FROM delegations WHERE parent_run_id = ? AND target_agent = ? AND task = ?"
            " AND repair_of IS NULL",
            parent_run["run_id"],
            target,
            summarize(plan.task, 2000),
        )
        if duplicate is not None:
            raise Refused(
                f"duplicate delegation refused: action {duplicate['parent_action_id']} already delegated it",
                code="duplicate",
            )
    outstanding = open_delegations(ledger, parent_run["run_id"])
    if len(outstanding) >= MAX_OPEN_DELEGATIONS:
        # Before the run is created (seed 004 V1.16); a replay of an action whose
        # delegation exists returned above, so it never counts twice.
        raise Refused(
            f"at most {MAX_OPEN_DELEGATIONS} specialists dispatched or ready at once for one run; "
            f"{', '.join(outstanding)} still are: claim their receipts (agent.run_status) before delegating more",
            code="delegation-capacity",
        )
    options = {
        "workspace": str(target_spec.workspace),
        "write_scopes": list(target_spec.write_scopes),
        "allowed_tools": SPECIALIST_TOOLS,
        # The specialist's own allow list holds for delegated work too.
        "tool_globs": list(target_spec.tools) if target_spec.tools is not None else None,
        "policy": {**spec.policy, **target_spec.policy},
        "effects_file": json.loads(parent_run["options"]).get("effects_file"),
        # The specialist's own budgets, provider retries included (V1.29 sets them per agent).
        "limits": {"max_repairs": target_spec.max_repairs, "max_provider_retries": target_spec.max_provider_retries,
                   "retry_base_s": target_spec.retry_base_s, "retry_cap_s": target_spec.retry_cap_s},
        # Whether its receipt is evidence-ready only after a passed project.verify.
        "require_verification": project_settings(spec.raw).verification_required,
        # The specialist's own token limits (seed 004 V1.21): its turns compact and fail closed.
        "context": target_spec.context_limits(),
        **target_spec.definition_options(),  # the specialist's own instructions
    }
    run_id = f"run-{delegation_id[4:16]}"
    contract = {
        "delegation_id": delegation_id,
        "agent_id": target,
        "run_id": run_id,
        "parent_agent": parent_run["agent_id"],
        "parent_run_id": parent_run["run_id"],
        "acceptance_criteria": criteria,
        "expected_artifacts": artifacts,
        "repair_of": repair_of,
    }
    with ledger.tx() as db:
        create_run(
            ledger,
            features,
            agent_id=target,
            task=delegation_task_text(plan.task, contract),
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
                summarize(plan.task, 2000),
                dumps(criteria),
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


def _original(ledger: Ledger, row: sqlite3.Row | None) -> OriginalDelegation | None:
    """The delegation a repair names, with its receipt's status and whether it has its repair."""
    if row is None:
        return None
    delivery = _receipt(ledger, row["delegation_id"])
    return OriginalDelegation(
        parent_run_id=row["parent_run_id"],
        repair_of=row["repair_of"],
        target_agent=row["target_agent"],
        receipt_status=delivery["status"] if delivery is not None else None,
        repaired=ledger.one("SELECT 1 FROM delegations WHERE repair_of = ?", row["delegation_id"]) is not None,
        criteria=tuple(stored_criteria(row["acceptance_criteria"])),
        artifacts=tuple(json.loads(row["expected_artifacts"])),
    )


def _receipt(ledger: Ledger, delegation_id: str) -> sqlite3.Row | None:
    return ledger.one("SELECT * FROM deliveries WHERE kind = 'receipt' AND source_id = ?", delegation_id)


def contract(ledger: Ledger, parent_run_id: str, delegation_id: str) -> dict[str, Any]:
    """One claimed delegation's whole contract and its delivered receipt, for the
    parent run that claimed it (the targeted read of ``agent.run_status``). Read
    only; never the task text."""
    row = ledger.one("SELECT * FROM delegations WHERE delegation_id = ?", delegation_id)
    if row is None:
        raise NotFound(f"no delegation {delegation_id!r}")
    if row["parent_run_id"] != parent_run_id:
        raise Refused(f"delegation {delegation_id} belongs to another parent run", code="limit")
    delivery = _receipt(ledger, delegation_id)
    if delivery is None or delivery["status"] != DeliveryStatus.CLAIMED:
        state = delivery["status"] if delivery is not None else "not delivered"
        raise Refused(f"delegation {delegation_id} is not claimed by this run ({state})", code="limit")
    result = json.loads(delivery["payload"])
    return {
        "delegation_id": delegation_id,
        "target_agent": row["target_agent"],
        "acceptance_criteria": stored_criteria(row["acceptance_criteria"]),
        "expected_artifacts": json.loads(row["expected_artifacts"]),
        "repair_of": row["repair_of"],
        "repaired_by": _repair_id(ledger, delegation_id),
        "delivery_id": delivery["delivery_id"],
        "delivery_status": delivery["status"],
        "terminal_status": get_run(ledger, row["run_id"])["status"],
        "contract_status": result.get("status"),
        "delivery": result,
    }


#: Rows of the contracts directory a claim returns (the targeted read has the rest).
MAX_CONTRACTS_LISTED = 32


def contracts_directory(ledger: Ledger, parent_run_id: str) -> list[dict[str, Any]]:
    """The run's claimed delegations, one line each, so the parent can find the one
    to read back whole (``contract``) or to repair, without its memory."""
    rows = ledger.all(
        "SELECT d.delegation_id, d.target_agent, d.repair_of, d.acceptance_criteria, d.expected_artifacts,"
        " v.payload FROM delegations d JOIN deliveries v ON v.kind = 'receipt' AND v.source_id = d.delegation_id"
        " WHERE d.parent_run_id = ? AND v.status = 'claimed-by-parent' ORDER BY d.created_at, d.delegation_id"
        " LIMIT ?",
        parent_run_id,
        MAX_CONTRACTS_LISTED,
    )
    return [
        {
            "delegation_id": row["delegation_id"],
            "target_agent": row["target_agent"],
            "repair_of": row["repair_of"],
            "contract_status": json.loads(row["payload"]).get("status"),
            "acceptance_criteria_count": len(stored_criteria(row["acceptance_criteria"])),
            "expected_artifacts_count": len(json.loads(row["expected_artifacts"])),
        }
        for row in rows
    ]


def _repair_id(ledger: Ledger, delegation_id: str) -> str | None:
    row = ledger.one("SELECT delegation_id FROM delegations WHERE repair_of = ?", delegation_id)
    return str(row["delegation_id"]) if row is not None else None


def finish_delegation(
    ledger: Ledger, run_id: str, summary: str | None, error: str | None, features: RunFeatures
) -> str | None:
    row = ledger.one("SELECT * FROM delegations WHERE run_id = ?", run_id)
    if row is None:
        raise NotFound(f"run {run_id} is not a delegation")
    if row["status"] == "terminal":
        return None
    run = get_run(ledger, run_id)
    options = json.loads(run["options"])
    workspace = Path(options.get("workspace") or ".")
    artifacts, missing = hashed_artifacts(workspace, json.loads(row["expected_artifacts"]))
    # Work that was all refused or failed is no evidence, even with a hopeful reply.
    no_evidence = refused_work(ledger, run_id) if error is None else None
    # Sources it changed need its own passed project.verify, on the real revision.
    required, verified, unverified = verification_of(ledger, run_id, options.get("require_verification") is True)
    ready = error is None and not missing and no_evidence is None and unverified is None
    status = "evidence-ready" if ready else "needs-repair"
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
        "error": error or no_evidence or unverified,
        "repair_of": row["repair_of"],
        "acceptance_criteria": stored_criteria(row["acceptance_criteria"]),
        "expected_artifacts": json.loads(row["expected_artifacts"]),
        "verification_required": required,
        "verified_revision": verified,
    }
    delivery_id = "dlv-" + sha(f"receipt\x00{row['delegation_id']}")[:20]
    with ledger.tx() as db:
        db.execute(
            "UPDATE delegations SET status = 'terminal', result = ?, ended_at = ? WHERE run_id = ?",
            (dumps(redact(result)), time.time(), run_id),
        )
        if RunStatus(run["status"]) not in TERMINAL:
            set_run_status(ledger, run_id, RunStatus.COMPLETED if error is None else RunStatus.FAILED, features, error)
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

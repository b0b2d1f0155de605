"""A spawn's and a delegation's checks, as pure functions: the request and what the
ledger already holds in, a plan (or a refusal) out; no reads, no writes.

children_store.spawn_group and delegation_store.delegate gather what these look at,
call them, and write what they planned in one transaction. A refusal raised here
has written nothing. Checked row by row in tests/test_swarm_decisions.py.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import NamedTuple

from corral.actors.tools.paths import scopes_overlap
from corral.supervisor.errors import BadRequest, Refused
from corral.supervisor.spec.spec_models import AgentSpec, TemplateSpec
from corral.supervisor.spec.swarm_spec import SwarmSpec
from corral.supervisor.swarm.swarm_state import DeliveryStatus, sha
from corral.supervisor.swarm.work_contract import MAX_ARTIFACTS, criteria_list, relative_paths, str_list

_CHILD_FIELDS = frozenset({"template", "task", "acceptance_criteria", "expected_artifacts", "write_scopes"})


class ParentView(NamedTuple):
    """The run that asks (its row in ``runs``)."""

    run_id: str
    kind: str
    depth: int
    agent_id: str


def parent_view(row: sqlite3.Row) -> ParentView:
    return ParentView(row["run_id"], row["kind"], int(row["depth"]), row["agent_id"])


# -- spawn ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChildPlan:
    template: TemplateSpec
    task: str
    criteria: str
    artifacts: tuple[str, ...]
    scopes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SpawnPlan:
    children: tuple[ChildPlan, ...]
    #: The request's identity within its parent run: the same children again is a duplicate.
    digest: str


def plan_spawn(spec: SwarmSpec, parent: ParentView, children: object, join_mode: object) -> SpawnPlan:
    """One group of isolated children for ``parent``, checked against the spec's
    limits; raises ``Refused`` (a limit) or ``BadRequest`` (a malformed request)."""
    if parent.kind == "child":
        raise Refused("a child may not spawn isolated children", code="limit")
    if parent.kind == "delegation":
        raise Refused("a delegated specialist run may not spawn isolated children", code="limit")
    if parent.depth + 1 > spec.limits.max_depth:
        raise Refused(f"depth {parent.depth + 1} exceeds the limit of {spec.limits.max_depth}", code="limit")
    if join_mode != "all":
        raise BadRequest("join_mode must be 'all'")
    if not isinstance(children, list) or not children:
        raise BadRequest("children must be a non-empty list")
    if len(children) > spec.limits.max_children_per_call:
        raise Refused(
            f"{len(children)} children requested; the limit is {spec.limits.max_children_per_call} per call",
            code="limit",
        )
    planned = tuple(_plan_child(spec, index, child) for index, child in enumerate(children))
    for i, left in enumerate(planned):
        for j, right in enumerate(planned[i + 1 :], start=i + 1):
            for a in left.scopes:
                for b in right.scopes:
                    if scopes_overlap(a, b):
                        raise Refused(
                            f"write scopes overlap: children[{i}] {a!r} and children[{j}] {b!r}", code="limit"
                        )
    digest = sha(json.dumps([[c.template.id, c.task, list(c.artifacts), list(c.scopes)] for c in planned]))
    return SpawnPlan(planned, digest)


def _plan_child(spec: SwarmSpec, index: int, child: object) -> ChildPlan:
    if not isinstance(child, dict):
        raise BadRequest(f"children[{index}] must be a map")
    unknown = set(child) - _CHILD_FIELDS
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
    artifacts = str_list(child.get("expected_artifacts", []), f"children[{index}].expected_artifacts")
    scopes = str_list(child.get("write_scopes"), f"children[{index}].write_scopes")
    relative_paths(artifacts, f"children[{index}].expected_artifacts")
    relative_paths(scopes, f"children[{index}].write_scopes")
    for artifact in artifacts:
        if not any(scopes_overlap(artifact, scope) and _inside(artifact, scope) for scope in scopes):
            raise BadRequest(f"children[{index}]: artifact {artifact!r} lies outside its write scopes")
    return ChildPlan(template_spec, task, str(child.get("acceptance_criteria", "")), tuple(artifacts), tuple(scopes))


def _inside(path: str, scope: str) -> bool:
    scope_path = PurePosixPath(scope.rstrip("/") or ".")
    return str(scope_path) == "." or PurePosixPath(path).is_relative_to(scope_path)


# -- delegation ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DelegationPlan:
    target: AgentSpec
    task: str
    artifacts: tuple[str, ...]
    #: Left out: none (a request that names none); given: the seed's 1-8 list.
    criteria: tuple[str, ...]
    repair_of: str | None


def plan_delegation(spec: SwarmSpec, parent: ParentView, params: Mapping[str, object]) -> DelegationPlan:
    """A delegation of ``params`` by ``parent``, before the ledger's own checks (a
    duplicate, or the repaired delegation: ``judge_repair``)."""
    if parent.kind != "root":
        raise Refused(f"a {parent.kind} run may not delegate (depth is limited to 1)", code="limit")
    target = params.get("agent_id")
    if not isinstance(target, str):
        raise BadRequest("agent_id must be a string")
    try:
        target_spec = spec.agent(target)
    except KeyError:
        raise BadRequest(f"no agent {target!r} in the swarm spec") from None
    if target_spec.role != "specialist":
        raise Refused(f"agent {target!r} is not a specialist (role = {target_spec.role})", code="limit")
    if target == parent.agent_id:
        raise Refused("an agent may not delegate to itself", code="limit")
    task = params.get("task")
    if not isinstance(task, str) or not task.strip():
        raise BadRequest("task must be a non-empty string")
    artifacts = str_list(params.get("expected_artifacts", []), "expected_artifacts")
    relative_paths(artifacts, "expected_artifacts")
    if len(artifacts) > MAX_ARTIFACTS or len(set(artifacts)) != len(artifacts):
        raise BadRequest(f"expected_artifacts must hold at most {MAX_ARTIFACTS} distinct paths")
    criteria = criteria_list(params["acceptance_criteria"]) if "acceptance_criteria" in params else []
    repair_of = params.get("repair_of")
    if repair_of is not None and not isinstance(repair_of, str):
        raise BadRequest("repair_of must be a delegation id")
    return DelegationPlan(target_spec, task, tuple(artifacts), tuple(criteria), repair_of)


class OriginalDelegation(NamedTuple):
    """The delegation a repair names, as the ledger holds it."""

    parent_run_id: str
    repair_of: str | None
    target_agent: str
    #: Its receipt's delivery status; None: not delivered yet.
    receipt_status: str | None
    #: It has its one repair already.
    repaired: bool
    criteria: tuple[str, ...]
    artifacts: tuple[str, ...]


def judge_repair(
    parent_run_id: str,
    target: str,
    repair_of: str,
    original: OriginalDelegation | None,
    criteria: tuple[str, ...],
    artifacts: tuple[str, ...],
) -> None:
    """A repair sends back work its parent has claimed and judged unmet, whatever the
    receipt's status: once, to the same specialist, under the same contract (its
    criteria and artifacts), never a repair of a repair. Raises when it may not."""
    if original is None:
        raise BadRequest(f"repair_of {repair_of!r}: no such delegation")
    if original.parent_run_id != parent_run_id:
        raise Refused(
            f"delegation {repair_of} belongs to another parent run: only the run that claimed it may send it back",
            code="limit",
        )
    if original.repair_of is not None:
        raise Refused("a repair may not be repaired again (repair depth is 1)", code="limit")
    if original.target_agent != target:
        raise Refused(f"a repair goes to the same agent ({original.target_agent})", code="limit")
    if original.receipt_status != DeliveryStatus.CLAIMED:
        state = original.receipt_status if original.receipt_status is not None else "not delivered"
        raise Refused(
            f"delegation {repair_of} is not claimed by this run ({state}): claim its receipt with"
            " agent.run_status, judge it, then repair it",
            code="limit",
        )
    if original.repaired:
        raise Refused(f"delegation {repair_of} already has its one repair", code="duplicate")
    if (original.criteria, original.artifacts) != (criteria, artifacts):
        # The whole contract in the refusal: the model corrects its call from it, not from memory.
        inherited = {"acceptance_criteria": list(original.criteria), "expected_artifacts": list(original.artifacts)}
        raise Refused(
            f"a repair inherits the contract of delegation {repair_of} unchanged: "
            + json.dumps(inherited, ensure_ascii=False),
            code="limit",
        )

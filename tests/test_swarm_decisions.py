"""A spawn's and a delegation's checks as pure functions: request in, plan or refusal out.

No ledger, no processes. What these decide, children_store.spawn_group and
delegation_store.delegate write (or refuse, having written nothing).
"""

from __future__ import annotations

from typing import Any

import pytest

from corral.supervisor.errors import BadRequest, Refused, SupervisorError
from corral.supervisor.spec.swarm_spec import parse_spec
from corral.supervisor.swarm.swarm_decisions import (
    OriginalDelegation,
    ParentView,
    judge_repair,
    plan_delegation,
    plan_spawn,
)

SPEC = parse_spec(
    {
        "limits": {"max_depth": 2, "max_children_per_call": 3},
        "templates": [{"id": "writer", "steps": [{"final": "x"}]}],
        "agents": [
            {"id": "boss", "steps": [{"final": "x"}]},
            {"id": "helper", "role": "specialist", "steps": [{"final": "x"}]},
        ],
    }
)
ROOT = ParentView(run_id="run-root", kind="root", depth=0, agent_id="boss")


def child(scope: str, **changes: Any) -> dict[str, Any]:
    return {
        "template": "writer",
        "task": f"work in {scope}",
        "write_scopes": [scope],
        "expected_artifacts": [f"{scope}/out.md"],
        **changes,
    }


SPAWN_REFUSED = [
    ("child may not spawn", ParentView("r", "child", 1, "x"), [child("a")], "all", Refused, "a child may not spawn"),
    ("delegated may not spawn", ParentView("r", "delegation", 1, "x"), [child("a")], "all", Refused, "specialist run"),
    ("too deep", ParentView("r", "root", 2, "x"), [child("a")], "all", Refused, "depth 3 exceeds the limit of 2"),
    ("join mode", ROOT, [child("a")], "any", BadRequest, "join_mode must be 'all'"),
    ("no children", ROOT, [], "all", BadRequest, "non-empty list"),
    ("children not a list", ROOT, {"a": 1}, "all", BadRequest, "non-empty list"),
    ("too many", ROOT, [child(s) for s in "abcd"], "all", Refused, "4 children requested; the limit is 3"),
    ("child not a map", ROOT, ["x"], "all", BadRequest, "children[0] must be a map"),
    ("unknown field", ROOT, [child("a", model="big")], "all", BadRequest, "unknown fields ['model']"),
    ("unknown template", ROOT, [child("a", template="poet")], "all", BadRequest, "unknown template 'poet' (writer)"),
    ("template not text", ROOT, [child("a", template=3)], "all", BadRequest, "unknown template 3"),
    ("empty task", ROOT, [child("a", task="  ")], "all", BadRequest, "task must be a non-empty string"),
    ("absolute scope", ROOT, [child("a", write_scopes=["/etc"])], "all", BadRequest, "write_scopes"),
    ("artifact outside", ROOT, [child("a", expected_artifacts=["b/x"])], "all", BadRequest, "outside its write"),
    ("overlap", ROOT, [child("a"), child("a/b")], "all", Refused, "write scopes overlap: children[0] 'a'"),
]


@pytest.mark.parametrize(
    ("name", "parent", "children", "join", "error", "says"), SPAWN_REFUSED, ids=[r[0] for r in SPAWN_REFUSED]
)
def test_spawn_refused(
    name: str, parent: ParentView, children: Any, join: Any, error: type[SupervisorError], says: str
) -> None:
    with pytest.raises(error) as raised:
        plan_spawn(SPEC, parent, children, join)
    assert type(raised.value) is error and says in str(raised.value)


def test_spawn_plans_each_child_and_one_digest() -> None:
    plan = plan_spawn(SPEC, ROOT, [child("a"), child("b", acceptance_criteria="tests pass")], "all")
    assert [(c.template.id, c.task, c.criteria, c.artifacts, c.scopes) for c in plan.children] == [
        ("writer", "work in a", "", ("a/out.md",), ("a",)),
        ("writer", "work in b", "tests pass", ("b/out.md",), ("b",)),
    ]
    # The digest is the request's identity: the same children, the same digest; criteria aside.
    assert plan.digest == plan_spawn(SPEC, ROOT, [child("a"), child("b")], "all").digest
    assert plan.digest != plan_spawn(SPEC, ROOT, [child("b"), child("a")], "all").digest


def ask(**changes: Any) -> dict[str, Any]:
    return {"agent_id": "helper", "task": "fix it", **changes}


DELEGATE_REFUSED = [
    ("child may not delegate", ParentView("r", "child", 1, "x"), ask(), Refused, "a child run may not delegate"),
    ("no agent id", ROOT, ask(agent_id=None), BadRequest, "agent_id must be a string"),
    ("unknown agent", ROOT, ask(agent_id="ghost"), BadRequest, "no agent 'ghost'"),
    ("not a specialist", ROOT, ask(agent_id="boss"), Refused, "is not a specialist"),
    ("itself", ParentView("r", "root", 0, "helper"), ask(), Refused, "may not delegate to itself"),
    ("empty task", ROOT, ask(task=""), BadRequest, "task must be a non-empty string"),
    ("duplicate artifacts", ROOT, ask(expected_artifacts=["a", "a"]), BadRequest, "distinct paths"),
    ("absolute artifact", ROOT, ask(expected_artifacts=["/a"]), BadRequest, "expected_artifacts"),
    ("repair of a number", ROOT, ask(repair_of=7), BadRequest, "repair_of must be a delegation id"),
]


@pytest.mark.parametrize(
    ("name", "parent", "params", "error", "says"), DELEGATE_REFUSED, ids=[r[0] for r in DELEGATE_REFUSED]
)
def test_delegation_refused(
    name: str, parent: ParentView, params: dict[str, Any], error: type[SupervisorError], says: str
) -> None:
    with pytest.raises(error) as raised:
        plan_delegation(SPEC, parent, params)
    assert type(raised.value) is error and says in str(raised.value)


def test_delegation_plan() -> None:
    plan = plan_delegation(SPEC, ROOT, ask(expected_artifacts=["out.md"], repair_of="del-1"))
    assert (plan.target.id, plan.task, plan.artifacts, plan.criteria, plan.repair_of) == (
        "helper",
        "fix it",
        ("out.md",),
        (),
        "del-1",
    )
    assert plan_delegation(SPEC, ROOT, ask()).repair_of is None


ORIGINAL = OriginalDelegation(
    parent_run_id="run-root",
    repair_of=None,
    target_agent="helper",
    receipt_status="claimed-by-parent",
    repaired=False,
    criteria=("tests pass",),
    artifacts=("out.md",),
)

REPAIRS = [
    ("the one repair", ORIGINAL, None),
    ("no such delegation", None, "no such delegation"),
    ("another parent's", ORIGINAL._replace(parent_run_id="run-other"), "belongs to another parent run"),
    ("repair of a repair", ORIGINAL._replace(repair_of="del-0"), "repair depth is 1"),
    ("another agent", ORIGINAL._replace(target_agent="other"), "goes to the same agent (other)"),
    ("not delivered", ORIGINAL._replace(receipt_status=None), "(not delivered)"),
    ("delivered, unclaimed", ORIGINAL._replace(receipt_status="dispatched"), "(dispatched)"),
    ("already repaired", ORIGINAL._replace(repaired=True), "already has its one repair"),
    ("another contract", ORIGINAL._replace(criteria=("docs",)), "inherits the contract"),
]


@pytest.mark.parametrize(("name", "original", "says"), REPAIRS, ids=[r[0] for r in REPAIRS])
def test_judge_repair(name: str, original: OriginalDelegation | None, says: str | None) -> None:
    def judge() -> None:
        judge_repair("run-root", "helper", "del-1", original, ("tests pass",), ("out.md",))

    if says is None:
        judge()
        return
    with pytest.raises((BadRequest, Refused)) as raised:
        judge()
    assert says in str(raised.value)

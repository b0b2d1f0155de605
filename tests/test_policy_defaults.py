"""Who decides an action by default (issue 40, item 5): seed 004 asks a person before
a write, a changeset or a command; ``[policy] default = "auto"`` is the one switch for
an unattended swarm, and it never lowers project.git_commit or project.restore."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from corral.actors.tools.declare import ToolDeclarationError, tool
from corral.supervisor.runs.run_core import RunCore
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.spec.swarm_spec import SpecError, parse_spec

ASKS = ("fs.write", "fs.patch", "project.changeset", "project.restore", "command.exec", "process.start",
        "process.stdin", "process.terminate", "project.git_commit")
FREE = ("fs.read", "fs.list", "project.diff", "agent.delegate", "effect.record")


def _core(tmp_path: Path, data: dict[str, Any]) -> RunCore:
    spec = parse_spec({"agents": [{"id": "a", "steps": [{"final": "ok"}]}], **data})
    return RunCore(cast(Any, None), RunFeatures(), spec=spec, home=tmp_path, tree=cast(Any, None), boot_id="b")


def _root(policy: dict[str, str] | None = None) -> dict[str, str]:
    return {"kind": "root", "options": json.dumps({"policy": policy} if policy else {})}


def test_writes_changesets_and_commands_ask_a_person_by_default(tmp_path: Path) -> None:
    core = _core(tmp_path, {})
    assert {name: core.policy_for(_root(), name) for name in ASKS} == dict.fromkeys(ASKS, "confirm")
    assert {name: core.policy_for(_root(), name) for name in FREE} == dict.fromkeys(FREE, "auto")


def test_the_unattended_switch_lowers_all_but_the_commit_and_the_restore(tmp_path: Path) -> None:
    core = _core(tmp_path, {"policy": {"default": "auto", "command.exec": "confirm"}})
    chosen = {name: core.policy_for(_root(), name) for name in ASKS}
    assert chosen == {**dict.fromkeys(ASKS, "auto"), "command.exec": "confirm", "project.git_commit": "confirm",
                      "project.restore": "confirm"}
    # The agent's own table wins over the spec's, its default included.
    assert core.policy_for(_root({"default": "deny"}), "fs.write") == "deny"
    assert core.policy_for(_root({"fs.*": "confirm"}), "fs.write") == "confirm"


def test_a_bad_default_and_a_tool_named_default_are_refused() -> None:
    with pytest.raises(SpecError, match="policy"):
        parse_spec({"policy": {"default": "sometimes"}})
    with pytest.raises(SpecError, match=r"policy\.project\.restore: .*always needs a person's approval"):
        parse_spec({"policy": {"project.restore": "auto"}})
    with pytest.raises(ToolDeclarationError, match="default"):
        tool(name="default")(lambda: None)


def test_the_action_history_takes_the_agent_audit_permission(tmp_path: Path) -> None:
    """Seed 004 V1.6: "权限复用 agent.audit，默认 auto，仍可由项目或 per-Agent policy 改为
    confirm 或 deny": a spec's or an agent's ``agent.audit`` key decides
    ``agent.action_history``; its own key, when named, still wins."""
    assert _core(tmp_path, {}).policy_for(_root(), "agent.action_history") == "auto"
    project = _core(tmp_path, {"policy": {"agent.audit": "confirm"}})
    assert project.policy_for(_root(), "agent.action_history") == "confirm"
    assert project.policy_for(_root({"agent.audit": "deny"}), "agent.action_history") == "deny"
    assert project.policy_for(_root(), "fs.read") == "auto"
    named = _core(tmp_path, {"policy": {"agent.audit": "deny", "agent.action_history": "auto"}})
    assert named.policy_for(_root(), "agent.action_history") == "auto"

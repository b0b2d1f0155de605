"""An isolated child's write outside its write scopes is refused before any policy
asks a person (seed 004, V1.34: "拒绝结果不进入 waiting-for-confirmation"), while its
write inside them still waits for the approval the policy asks for."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.supervisor.runs.child_scope import refused_write
from tests.harness import Daemon, ledger_rows, wait_for, wait_run

SPEC = """
[project]
root = "ws"
[policy]
"fs.write" = "confirm"

[[templates]]
id = "sneaky"
  [[templates.steps]]
  actions = [{ tool = "fs.write", input = { path = "elsewhere/x.md", content = "x" } }]
  [[templates.steps]]
  actions = [{ tool = "fs.write", input = { path = "s/out.md", content = "x" } }]
  [[templates.steps]]
  final = "tried"

[[agents]]
id = "parent"
  [[agents.steps]]
  actions = [{ tool = "agent.spawn_isolated", input = { children = [
      { template = "sneaky", task = "sneak", write_scopes = ["s"], expected_artifacts = ["s/out.md"] } ] } }]
  [[agents.steps]]
  actions = [{ tool = "agent.run_status", input = {} }]
  [[agents.steps]]
  final = "joined"
"""


def test_an_out_of_scope_child_write_is_denied_without_waiting_for_a_person(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(SPEC)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]

        # The child's row, once the parent's spawn has committed it.
        (found,) = wait_for("the child run", lambda: ledger_rows(
            daemon.home, "SELECT run_id FROM runs WHERE parent_run_id = ?", run_id))
        child = str(found["run_id"])
        # The in-scope write parks for the person the policy names: the policy does apply.
        wait_run(daemon, child, {"waiting-confirmation", "completed", "failed"})
        actions = ledger_rows(daemon.home, "SELECT action_id, tool, phase, error FROM actions WHERE run_id = ?"
                              " ORDER BY loop_index, action_index", child)
        assert [a["phase"] for a in actions] == ["denied", "waiting-confirmation"], actions
        assert "outside this agent's write scopes" in str(actions[0]["error"])
        # Never parked on its way to the refusal: no person was asked about it.
        assert ledger_rows(daemon.home, "SELECT 1 FROM events WHERE kind = 'action-waiting-confirmation'"
                           " AND subject = ?", actions[0]["action_id"]) == []
        assert not (short_tmp / "ws" / "elsewhere").exists()
    finally:
        daemon.shutdown()


def _child_spec(child_steps: str) -> str:
    return f"""
[project]
root = "ws"
[policy]
"fs.write" = "confirm"

[[templates]]
id = "sneaky"
{child_steps}
  [[templates.steps]]
  final = "tried"

[[agents]]
id = "parent"
  [[agents.steps]]
  actions = [{{ tool = "agent.spawn_isolated", input = {{ children = [
      {{ template = "sneaky", task = "sneak", write_scopes = ["s"], expected_artifacts = ["s/out.md"] }} ] }} }}]
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  final = "joined"
"""


def _child_actions(daemon: Daemon, run_id: str, statuses: set[str]) -> tuple[str, list[Any]]:
    (found,) = wait_for("the child run", lambda: ledger_rows(
        daemon.home, "SELECT run_id FROM runs WHERE parent_run_id = ?", run_id))
    child = str(found["run_id"])
    wait_run(daemon, child, statuses)
    return child, ledger_rows(daemon.home, "SELECT action_id, tool, phase, error FROM actions WHERE run_id = ?"
                              " ORDER BY loop_index, action_index", child)


def _asked_a_person(daemon: Daemon, action_ids: list[str]) -> list[Any]:
    return [row for the_id in action_ids for row in ledger_rows(
        daemon.home, "SELECT 1 FROM events WHERE kind = 'action-waiting-confirmation' AND subject = ?", the_id)]


def test_an_out_of_scope_write_whose_input_the_ledger_holds_redacted_is_denied_without_a_person(
        short_tmp: Path) -> None:
    """The path is no secret: the refusal needs no redacted body (``token = get_token()``
    makes the ledger hold the input redacted, with its raw copy in the spool)."""
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(_child_spec("""  [[templates.steps]]
  actions = [{ tool = "fs.write", input = { path = "elsewhere/auth.py", content = "token = get_token()\\n" } }]"""))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        _child, actions = _child_actions(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        assert [a["phase"] for a in actions] == ["denied"], actions
        assert "outside this agent's write scopes" in str(actions[0]["error"])
        assert _asked_a_person(daemon, [a["action_id"] for a in actions]) == []
        assert not (short_tmp / "ws" / "elsewhere").exists()
    finally:
        daemon.shutdown()


def test_one_out_of_scope_member_refuses_its_whole_plan_before_any_confirmation(short_tmp: Path) -> None:
    """"任一成员被拒绝时，batch 直接写成 aborted ... 不创建 confirmation，也不执行同批其它成员":
    the in-scope write planned with it never waits for a person, and never runs."""
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(_child_spec("""  [[templates.steps]]
  actions = [{ tool = "fs.write", input = { path = "s/out.md", content = "x" } },
             { tool = "fs.write", input = { path = "elsewhere/x.md", content = "x" } }]"""))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        _child, actions = _child_actions(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        assert [a["phase"] for a in actions] == ["denied", "denied"], actions
        assert "elsewhere/x.md" in str(actions[0]["error"]) and "outside" in str(actions[1]["error"])
        assert _asked_a_person(daemon, [a["action_id"] for a in actions]) == []
        assert not (short_tmp / "ws" / "s" / "out.md").exists()
        assert not (short_tmp / "ws" / "elsewhere").exists()
    finally:
        daemon.shutdown()


def test_an_approval_does_not_pass_the_scope_check_at_execution(short_tmp: Path) -> None:
    """"旧 pending / approved 动作 ... 真正进入执行器时仍会重新调用当前 scope 校验，approval
    不能穿透": a write approved while its scopes allowed it (an older version's pending
    action, here scopes narrowed in the ledger while the supervisor was down) is checked
    again when it would start, and fails without writing."""
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(_child_spec("""  [[templates.steps]]
  actions = [{ tool = "fs.write", input = { path = "s/out.md", content = "x" } }]"""))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        child, actions = _child_actions(daemon, run_id, {"waiting-confirmation"})
        assert [a["phase"] for a in actions] == ["waiting-confirmation"]
        daemon.shutdown()
        with sqlite3.connect(daemon.home / "ledger.db") as db:
            (options,) = db.execute("SELECT options FROM runs WHERE run_id = ?", (child,)).fetchone()
            narrowed = {**json.loads(options), "write_scopes": ["t"]}
            db.execute("UPDATE runs SET options = ? WHERE run_id = ?", (json.dumps(narrowed), child))
        daemon.up()
        daemon.call("continue_action", action_id=actions[0]["action_id"], decision="approve")
        wait_run(daemon, child, {"completed", "failed"})
        (row,) = ledger_rows(daemon.home, "SELECT phase, error FROM actions WHERE action_id = ?",
                             actions[0]["action_id"])
        assert row["phase"] == "failed" and "outside this agent's write scopes" in str(row["error"]), row
        # Refused before it started: never executing (the tool's own check would be later).
        assert ledger_rows(daemon.home, "SELECT 1 FROM events WHERE kind = 'action-executing' AND subject = ?",
                           actions[0]["action_id"]) == []
        assert not (short_tmp / "ws" / "s" / "out.md").exists()
    finally:
        daemon.shutdown()


def _changeset(*paths: str) -> str:
    changes = ", ".join(f'{{ path = "{path}", operation = "create", content = "x" }}' for path in paths)
    return f'{{ tool = "project.changeset", input = {{ changes = [{changes}] }} }}'


def test_a_child_keeps_its_changeset_inside_its_scopes_and_one_target_outside_refuses_it_whole(
    short_tmp: Path,
) -> None:
    """"项目内容写入只保留 file.write / file.patch / file.delete / project.patchset ... patchset 中任一
    目标越界时整组修改在 checkpoint、revision 和真实文件写入前失败": a child's changeset inside
    its scopes is applied; one with a target outside them is denied when prepared, with no
    checkpoint, no new revision and no file written, and never waits for a person."""
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(
        _child_spec(f"""  [templates.policy]
  "project.changeset" = "auto"
  [[templates.steps]]
  actions = [{_changeset("s/a.md", "s/b.md")}]
  [[templates.steps]]
  actions = [{_changeset("s/c.md", "elsewhere/d.md")}]""")
    )
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        _child, actions = _child_actions(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        assert [(a["tool"], a["phase"]) for a in actions] == [
            ("project.changeset", "ok"),
            ("project.changeset", "denied"),
        ], actions
        assert "outside this agent's write scopes" in str(actions[1]["error"]), actions
        assert _asked_a_person(daemon, [a["action_id"] for a in actions]) == []
        assert sorted(p.name for p in (short_tmp / "ws" / "s").iterdir()) == ["a.md", "b.md"]
        assert not (short_tmp / "ws" / "elsewhere").exists()
        # One revision, the applied changeset's: the refused one made none.
        revisions = ledger_rows(daemon.home, "SELECT action_id FROM project_revisions")
        assert [r["action_id"] for r in revisions] == [actions[0]["action_id"]], revisions
    finally:
        daemon.shutdown()


KEEP = "keep me\n"


def _keep_sha() -> str:
    return hashlib.sha256(KEEP.encode()).hexdigest()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(
            lambda: f'{{ path = "elsewhere/keep.md", operation = "delete", expected_sha256 = "{_keep_sha()}" }}',
            id="delete",
        ),
        pytest.param(
            lambda: '{ path = "elsewhere/keep.md", operation = "update", old_text = "keep", new_text = "lost" }',
            id="edit",
        ),
    ],
)
def test_a_childs_out_of_scope_changeset_delete_or_edit_is_denied_without_waiting_for_a_person(
    short_tmp: Path, change: Any
) -> None:
    """"每一个 create/update/delete 目标都必须 ... 完整落在该 child 的有效 writeScopes 内" and
    "拒绝结果不进入 waiting-for-confirmation": every operation kind's target counts when the
    action is prepared, not only a change that carries the whole ``content`` (the re-audit
    saw a delete of ``elsewhere/keep.md`` wait for a person)."""
    (short_tmp / "ws" / "elsewhere").mkdir(parents=True)
    (short_tmp / "ws" / "elsewhere" / "keep.md").write_text(KEEP)
    spec = short_tmp / "spec.toml"
    # A policy that asks a person: the refusal must come before it.
    spec.write_text(_child_spec(f"""  [templates.policy]
  "project.changeset" = "confirm"
  [[templates.steps]]
  actions = [{{ tool = "project.changeset", input = {{ changes = [{change()}] }} }}]"""))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        _child, actions = _child_actions(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        assert [(a["tool"], a["phase"]) for a in actions] == [("project.changeset", "denied")], actions
        assert "outside this agent's write scopes" in str(actions[0]["error"]), actions
        assert _asked_a_person(daemon, [a["action_id"] for a in actions]) == []
        assert (short_tmp / "ws" / "elsewhere" / "keep.md").read_text() == KEEP
        assert ledger_rows(daemon.home, "SELECT action_id FROM project_revisions") == []
    finally:
        daemon.shutdown()


def test_an_out_of_scope_changeset_edit_refuses_the_in_scope_write_planned_with_it(short_tmp: Path) -> None:
    """"任一成员被拒绝时 ... 不创建 confirmation，也不执行同批其它成员": the re-audit's batch
    [in-scope fs.write, out-of-scope changeset edit] ran the write and parked the edit."""
    (short_tmp / "ws" / "elsewhere").mkdir(parents=True)
    (short_tmp / "ws" / "elsewhere" / "keep.md").write_text(KEEP)
    spec = short_tmp / "spec.toml"
    spec.write_text(_child_spec("""  [templates.policy]
  "fs.write" = "auto"
  [[templates.steps]]
  actions = [{ tool = "fs.write", input = { path = "s/a.md", content = "x" } },
             { tool = "project.changeset", input = { changes = [
                 { path = "elsewhere/keep.md", operation = "update", old_text = "keep", new_text = "lost" } ] } }]"""))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        _child, actions = _child_actions(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        assert [(a["tool"], a["phase"]) for a in actions] == [
            ("fs.write", "denied"), ("project.changeset", "denied")], actions
        assert "elsewhere/keep.md" in str(actions[0]["error"]), actions
        assert _asked_a_person(daemon, [a["action_id"] for a in actions]) == []
        assert not (short_tmp / "ws" / "s" / "a.md").exists()
        assert (short_tmp / "ws" / "elsewhere" / "keep.md").read_text() == KEEP
    finally:
        daemon.shutdown()


@pytest.mark.parametrize(
    ("tool", "tool_input"),
    [
        ("fs.write", {"path": "elsewhere/x.md", "content": "x"}),
        ("fs.patch", {"path": "elsewhere/x.md", "old_text": "a", "new_text": "b", "expected_sha256": "0" * 64}),
        ("project.changeset", {"changes": [{"path": "elsewhere/x.md", "operation": "create", "content": "x"}]}),
        ("project.changeset", {"changes": [{"path": "elsewhere/x.md", "content": "x"}]}),
        ("project.changeset", {"changes": [{"path": "elsewhere/x.md", "operation": "update", "content": "x",
                                            "expected_sha256": "0" * 64}]}),
        ("project.changeset", {"changes": [{"path": "elsewhere/x.md", "operation": "update", "old_text": "a",
                                            "new_text": "b"}]}),
        ("project.changeset", {"changes": [{"path": "elsewhere/x.md", "operation": "delete",
                                            "expected_sha256": "0" * 64}]}),
        ("project.changeset", {"changes": [{"path": "s/in.md", "operation": "create", "content": "x"},
                                           {"path": "elsewhere/x.md", "operation": "delete",
                                            "expected_sha256": "0" * 64}]}),
    ],
)
def test_every_target_of_every_operation_kind_is_judged_against_the_scopes(
    tmp_path: Path, tool: str, tool_input: dict[str, Any]
) -> None:
    """The scope judgement sees every file a write tool names, whatever its operation."""
    (tmp_path / "s").mkdir()
    why = refused_write(tool, tool_input, tmp_path, ("s",))
    assert why is not None and "outside this agent's write scopes" in why, why


def test_targets_inside_the_scopes_are_not_refused(tmp_path: Path) -> None:
    tool_input = {"changes": [{"path": "s/a.md", "operation": "delete", "expected_sha256": "0" * 64},
                              {"path": "s/b.md", "operation": "update", "old_text": "a", "new_text": "b"}]}
    assert refused_write("project.changeset", tool_input, tmp_path, ("s",)) is None

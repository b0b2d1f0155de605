"""An isolated child's write outside its write scopes is refused before any policy
asks a person (seed 004, V1.34: "拒绝结果不进入 waiting-for-confirmation"), while its
write inside them still waits for the approval the policy asks for."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

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

"""An isolated child's write outside its write scopes is refused before any policy
asks a person (seed 004, V1.34: "拒绝结果不进入 waiting-for-confirmation"), while its
write inside them still waits for the approval the policy asks for."""

from __future__ import annotations

from pathlib import Path

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
        daemon.call("cancel", run_id=run_id)
    finally:
        daemon.shutdown()

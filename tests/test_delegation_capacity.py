"""A supervisor's concurrent specialists (seed 004 V1.16), through a running
supervisor: at most 3 static delegations of one parent run dispatched or ready at
once; a 4th new one is refused before its run is created, with a clear
observation, and is allowed once a claim frees a place; and each planning prompt
carries the original goal, the delegated goals and the receipts still pending."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness import Daemon, ledger_rows, wait_run


def _delegate(agent: str, task: str) -> str:
    return f'{{ tool = "agent.delegate", input = {{ agent_id = "{agent}", task = "{task}" }} }}'


def _specialist(agent_id: str) -> str:
    return f'[[agents]]\nid = "{agent_id}"\nrole = "specialist"\n[[agents.steps]]\nfinal = "{agent_id} done"\n'


SPEC = f"""
[project]
root = "ws"

[[agents]]
id = "boss"
role = "root"
[[agents.steps]]
actions = [{_delegate("a", "check the intro")}, {_delegate("b", "check the body")}, {_delegate("c", "check the end")}]
[[agents.steps]]
actions = [{_delegate("d", "check the index")}]
[[agents.steps]]
actions = [{{ tool = "agent.run_status", input = {{}} }}]
[[agents.steps]]
actions = [{_delegate("d", "check the index")}]
[[agents.steps]]
actions = [{{ tool = "agent.run_status", input = {{}} }}]
[[agents.steps]]
final = "all four checked"

{_specialist("a")}
{_specialist("b")}
{_specialist("c")}
{_specialist("d")}
"""


def _delegations(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(
        daemon.home,
        "SELECT loop_index, phase, error FROM actions WHERE run_id = ? AND tool = 'agent.delegate'"
        " ORDER BY loop_index, action_index",
        run_id,
    )


def test_a_fourth_specialist_is_refused_while_three_are_dispatched_or_ready(short_tmp: Path) -> None:
    """The seed: "同一 Supervisor 父 run 同时处于 dispatched / ready 的静态专业 Agent 最多 3 个；第 4 个新委派在
    创建 child 前拒绝"."""
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(SPEC)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="boss", task="review the whole document")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        actions = _delegations(daemon, run_id)
        assert [a["phase"] for a in actions] == ["ok", "ok", "ok", "failed", "ok"]
        refused = actions[3]["error"]
        assert "at most 3 specialists dispatched or ready" in refused and "claim" in refused
        targets = ledger_rows(
            daemon.home, "SELECT target_agent FROM delegations WHERE parent_run_id = ? ORDER BY created_at", run_id
        )
        assert [t["target_agent"] for t in targets] == ["a", "b", "c", "d"], "the refused one made no run"
        assert len(ledger_rows(daemon.home, "SELECT 1 FROM runs WHERE agent_id = 'd'")) == 1
    finally:
        daemon.shutdown()


COORDINATION = """
[project]
root = "ws"

[[agents]]
id = "boss"
role = "root"
[[agents.steps]]
actions = [{a}]
[[agents.steps]]
when_task = "ready: claim it with agent.run_status\\nyour final reply waits for: "
actions = [{{ tool = "agent.run_status", input = {{}} }}]
[[agents.steps]]
when_task = "]: evidence-ready: intro fine\\nnothing holds your final reply now"
final = "never chosen: it only keeps the count of steps that apply (the script's steps go by position)"
[[agents.steps]]
when_task = "nothing holds your final reply now"
final = "the intro is checked"

[[agents]]
id = "a"
role = "specialist"
[[agents.steps]]
final = "intro fine"
""".format(a=_delegate("a", "check the intro"))


def test_each_planning_prompt_carries_the_goal_the_delegated_goals_and_the_pending_receipts(short_tmp: Path) -> None:
    """The seed: "Supervisor planning prompt 必须持续携带当前用户原始目标、已委派目标、待回执集合、已认领结果和
    当前完成条件"."""
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(COORDINATION)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="boss", task="review the intro")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        # Each step's condition reads the task the provider got (the original goal,
        # then the note): turn 2 needs the pending receipt, turn 3 the claimed result
        # and nothing holding the final reply; a missing line skips its step and the
        # script runs out before the final reply.
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "the intro is checked", shown["run"]
        [root] = ledger_rows(daemon.home, "SELECT task FROM runs WHERE run_id = ?", run_id)
        assert root["task"] == "review the intro", "the run's own task is never rewritten"
    finally:
        daemon.shutdown()

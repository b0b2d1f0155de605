"""The durable plan (seed 004 V1.17), with real processes: an explanation and 1 to 8
distinct steps, each pending, in_progress or completed, at most one in_progress;
an identical update keeps the revision, a refused one changes nothing, a completed
step never goes back and is kept when an update leaves it out; unfinished steps hold
the final reply; and the plan is control-plane metadata: no approval, no project
revision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.supervisor.longtask.plan_store import MAX_STEPS, PlanRefused, merge
from tests.harness import Daemon, agent_spec, ledger_rows, wait_run, wait_supervisor_gone


def _update(explanation: str, *steps: tuple[str, str]) -> str:
    """One scripted ``plan.update`` step (TOML)."""
    listed = ", ".join(f'{{ step = "{title}", status = "{status}" }}' for title, status in steps)
    return (
        f'[[agents.steps]]\nactions = [{{ tool = "plan.update", input = {{ explanation = "{explanation}",'
        f" steps = [{listed}] }} }}]\n"
    )


START = _update(
    "survey first", ("read the notes", "completed"), ("write the draft", "in_progress"), ("check it", "pending")
)
FINISH = _update("all done", ("write the draft", "completed"), ("check it", "completed"))
STEPS = (
    START + START + '[[agents.steps]]\nfinal = "finished too early"\n' + FINISH + '[[agents.steps]]\nfinal = "done"\n'
)


def test_an_update_is_an_explanation_and_one_to_eight_distinct_steps_with_one_in_progress() -> None:
    """The seed: "steps 必须包含 1 到 8 个标题互不重复的步骤", "只允许提交 pending / in_progress /
    completed，同一更新至多一个 in_progress", "planUpdate.explanation 必须是非空有界文本"."""
    ok = merge([], "why", [{"step": "a", "status": "completed"}, {"step": "b", "status": "in_progress"}])
    assert ok == [{"step": "a", "status": "completed"}, {"step": "b", "status": "in_progress"}]
    nine = [{"step": f"s{n}", "status": "pending"} for n in range(MAX_STEPS + 1)]
    for explanation, steps, why in [
        ("why", [], "1 to 8 steps"),
        ("why", nine, "1 to 8 steps"),
        ("why", [{"step": "a", "status": "pending"}, {"step": "a", "status": "completed"}], "twice"),
        (
            "why",
            [{"step": "a", "status": "in_progress"}, {"step": "b", "status": "in_progress"}],
            "at most one step in_progress",
        ),
        ("why", [{"step": "a", "status": "done"}], "pending, in_progress or completed"),
        ("why", [{"step": "a", "status": "failed"}], "pending, in_progress or completed"),
        ("why", [{"step": " ", "status": "pending"}], "a title"),
        ("why", [{"step": "x" * 201, "status": "pending"}], "a title"),
        ("  ", [{"step": "a", "status": "pending"}], "explanation"),
        ("x" * 1001, [{"step": "a", "status": "pending"}], "explanation"),
    ]:
        with pytest.raises(PlanRefused, match=why):
            merge([], explanation, steps)


def test_completed_steps_never_go_back_and_are_merged_back_when_left_out() -> None:
    """The seed: "completed 不得回退"; "后续更新即使省略它们，Runtime 也会把终态步骤并回快照";
    "合并后仍受 8 步上限约束，超限整次拒绝"."""
    plan = merge([], "go", [{"step": "a", "status": "completed"}, {"step": "b", "status": "in_progress"}])
    with pytest.raises(PlanRefused, match="completed"):
        merge(plan, "go", [{"step": "a", "status": "pending"}, {"step": "b", "status": "in_progress"}])
    # Left out, "a" comes back where it was; the unfinished "b" may be renamed or dropped.
    assert merge(plan, "go", [{"step": "c", "status": "in_progress"}]) == [
        {"step": "a", "status": "completed"},
        {"step": "c", "status": "in_progress"},
    ]
    eight_more = [{"step": f"s{n}", "status": "pending"} for n in range(MAX_STEPS)]
    with pytest.raises(PlanRefused, match="1 to 8 steps"):
        merge(plan, "go", eight_more)


def _daemon(tmp: Path, steps: str, policy: str = "") -> Daemon:
    (tmp / "ws").mkdir()
    spec = tmp / "spec.toml"
    spec.write_text(agent_spec(steps=steps, policy=policy))
    return Daemon(tmp / "h", spec)


def _plan_actions(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(
        daemon.home,
        "SELECT phase, error, result, policy FROM actions"
        " WHERE run_id = ? AND tool = 'plan.update' ORDER BY loop_index",
        run_id,
    )


def _check_finished_plan(daemon: Daemon, run_id: str) -> None:
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"
    plan = shown["plan"]
    assert plan["revision"] == 2, "the identical second update kept revision 1; the finish made 2"
    assert plan["explanation"] == "all done"
    assert plan["steps"] == [
        {"step": "read the notes", "status": "completed"},
        {"step": "write the draft", "status": "completed"},
        {"step": "check it", "status": "completed"},
    ], "the left-out completed step is kept"
    assert plan["active_index"] is None
    blocked = ledger_rows(daemon.home, "SELECT data FROM events WHERE kind = 'final-blocked' AND subject = ?", run_id)
    assert len(blocked) == 1 and "plan step 2 (write the draft) is in_progress" in blocked[0]["data"]
    revisions = [json.loads(a["result"])["output"]["revision"] for a in _plan_actions(daemon, run_id)]
    assert revisions == [1, 1, 2], "an identical update does not add a revision"
    assert len(ledger_rows(daemon.home, "SELECT 1 FROM plan_updates WHERE run_id = ?", run_id)) == 3


def test_an_identical_update_keeps_the_revision_and_unfinished_steps_hold_the_final_reply(short_tmp: Path) -> None:
    """The seed: "完全相同的幂等更新不增加 revision"; "只要结构化计划中仍有非 completed 步骤，…非空
    response…都不能写 assistant"."""
    daemon = _daemon(short_tmp, STEPS)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        _check_finished_plan(daemon, run_id)
    finally:
        daemon.shutdown()


REFUSED = (
    START
    + _update("two at once", ("write the draft", "in_progress"), ("check it", "in_progress"))
    + _update("back", ("read the notes", "pending"), ("write the draft", "in_progress"))
    + _update("old words", ("read the notes", "done"))
    + FINISH
    + '[[agents.steps]]\nfinal = "done"\n'
)


def test_a_refused_update_changes_nothing_and_the_model_sees_why(short_tmp: Path) -> None:
    """The seed: "拒绝的更新也不改变现有快照"."""
    daemon = _daemon(short_tmp, REFUSED)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["plan"]["revision"] == 2
        actions = _plan_actions(daemon, run_id)
        assert [a["phase"] for a in actions] == ["ok", "failed", "failed", "failed", "ok"]
        errors = [a["error"] or "" for a in actions[1:4]]
        assert "at most one step in_progress" in errors[0]
        assert "completed" in errors[1] and "cannot go back" in errors[1]
        assert "'done' is not one of ['pending', 'in_progress', 'completed']" in errors[2], "refused by the schema"
        assert len(ledger_rows(daemon.home, "SELECT 1 FROM plan_updates WHERE run_id = ?", run_id)) == 2
    finally:
        daemon.shutdown()


def test_the_plan_is_control_plane_metadata_no_approval_and_no_project_revision(short_tmp: Path) -> None:
    """The seed: "planUpdate 是 Runtime 控制面元数据…不触发 confirm/deny，不推进 project revision"."""
    daemon = _daemon(
        short_tmp,
        START + FINISH + '[[agents.steps]]\nfinal = "done"\n',
        policy='[agents.policy]\ndefault = "confirm"\n"plan.*" = "deny"\n',
    )
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "waiting-confirmation"})
        assert shown["run"]["status"] == "completed", "a plan update never waits for a person, nor is denied"
        assert shown["plan"]["revision"] == 2
        policies = ledger_rows(daemon.home, "SELECT policy FROM actions WHERE run_id = ?", run_id)
        assert policies == [{"policy": "auto"}] * 2, "the policy table is never consulted for the plan"
        assert ledger_rows(daemon.home, "SELECT 1 FROM project_revisions") == []
    finally:
        daemon.shutdown()


def test_a_kill_after_a_plan_update_keeps_it_and_never_applies_it_twice(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, STEPS)
    try:
        first = daemon.up(env={"CORRAL_FAILPOINTS": "durable-plan.after-update=kill@once"})
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        wait_supervisor_gone(daemon, first.pid)
        assert (daemon.home / "failpoints" / "durable-plan.after-update.fired").exists()
        kept = ledger_rows(daemon.home, "SELECT revision FROM run_plans WHERE run_id = ?", run_id)
        assert kept == [{"revision": 1}], "the committed plan survived the kill"
        daemon.up()
        _check_finished_plan(daemon, run_id)
    finally:
        daemon.shutdown()

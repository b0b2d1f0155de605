"""The durable plan (seed 004 V1.17): updated by the model's tool call, monotonic,
part of what the model sees, gating completion, and kept across a kill."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.supervisor.longtask.plan_store import PlanRefused, merge
from tests.harness import Daemon, agent_spec, ledger_rows, wait_run, wait_supervisor_gone

PLAN = '{ id = "survey", text = "read the notes" }, { id = "draft", text = "write the draft" }, ' \
    '{ id = "review", text = "check it" }'
PROGRESS = '{ id = "survey", status = "done" }, { id = "draft", status = "in_progress" }'
FINISH = '{ id = "draft", status = "done" }, { id = "review", status = "dropped", reason = "the user reviews it" }'
STEPS = f"""
[[agents.steps]]
actions = [{{ tool = "plan.update", input = {{ steps = [{PLAN}] }} }}]
[[agents.steps]]
actions = [{{ tool = "plan.update", input = {{ steps = [{PROGRESS}] }} }}]
[[agents.steps]]
final = "finished too early"
[[agents.steps]]
actions = [{{ tool = "plan.update", input = {{ steps = [{FINISH}] }} }}]
[[agents.steps]]
final = "done"
"""


def test_plan_moves_forward_and_back_only_with_a_reason() -> None:
    steps = merge([], [{"id": "a", "text": "first"}, {"id": "b", "text": "second", "status": "in_progress"}])
    assert [(s["id"], s["status"]) for s in steps] == [("a", "pending"), ("b", "in_progress")]
    steps = merge(steps, [{"id": "a", "status": "done"}])
    with pytest.raises(PlanRefused, match="without a reason"):
        merge(steps, [{"id": "a", "status": "pending"}])
    reopened = merge(steps, [{"id": "a", "status": "pending", "reason": "the tests failed"}])
    assert reopened[0] == {"id": "a", "text": "first", "status": "pending", "reason": "the tests failed"}
    with pytest.raises(PlanRefused, match="needs a reason"):
        merge(steps, [{"id": "c", "text": "x", "status": "dropped"}])
    with pytest.raises(PlanRefused, match="without a reason"):
        merge(steps, [{"id": "b", "status": "dropped"}])
    with pytest.raises(PlanRefused, match="give it a text"):
        merge(steps, [{"id": "new"}])
    assert steps == merge(steps, [{"id": "b", "status": "in_progress"}]), "staying put is not a move"


def _daemon(tmp: Path) -> Daemon:
    (tmp / "ws").mkdir()
    spec = tmp / "spec.toml"
    spec.write_text(agent_spec(steps=STEPS))
    return Daemon(tmp / "h", spec)


def _check_finished_plan(daemon: Daemon, run_id: str) -> None:
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"
    plan = shown["plan"]
    assert plan["revision"] == 3, "one revision per update, a replay included"
    assert [(s["id"], s["status"]) for s in plan["steps"]] == [
        ("survey", "done"), ("draft", "done"), ("review", "dropped")]
    blocked = ledger_rows(daemon.home, "SELECT data FROM events WHERE kind = 'final-blocked' AND subject = ?", run_id)
    assert len(blocked) == 1 and "plan step draft is in_progress" in blocked[0]["data"]
    # The model saw its plan: the observation of each update is the whole plan.
    observations = [o for o in ledger_rows(daemon.home, "SELECT data FROM observations WHERE run_id = ?"
                                           " ORDER BY seq", run_id) if "plan revision" in o["data"]
                    or '"revision"' in o["data"]]
    assert len(observations) == 3
    assert len(ledger_rows(daemon.home, "SELECT 1 FROM plan_updates WHERE run_id = ?", run_id)) == 3


def test_unfinished_steps_hold_the_final_reply_until_done_or_dropped(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        _check_finished_plan(daemon, run_id)
    finally:
        daemon.shutdown()


def test_a_kill_after_a_plan_update_keeps_it_and_never_applies_it_twice(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp)
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

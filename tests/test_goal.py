"""Goal mode (seed 004 V1.18): a goal run ends only on the model's own verdict
that the goal is met, with evidence; not on a final reply alone."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness import Daemon, agent_spec, cli, ledger_rows, wait_run

STEPS = """
[[agents.steps]]
final = "too soon"
[[agents.steps]]
actions = [{ tool = "goal.verdict", input = { met = false, evidence = "the draft is missing" } }]
[[agents.steps]]
final = "still early"
[[agents.steps]]
actions = [{ tool = "goal.verdict", input = { met = true, evidence = "notes.md exists with 3 sections" } }]
[[agents.steps]]
final = "done"
"""


def _daemon(tmp: Path) -> Daemon:
    (tmp / "ws").mkdir()
    spec = tmp / "spec.toml"
    spec.write_text(agent_spec(steps=STEPS))
    return Daemon(tmp / "h", spec)


def test_a_goal_run_finishes_only_on_a_met_verdict_with_evidence(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp)
    try:
        daemon.up()
        started = cli(daemon.home, "run", "--agent", "writer", "--goal", "write the launch notes", "--json")
        assert started.returncode == 0, started.stderr
        run_id = json.loads(started.stdout)["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"
        assert shown["run"]["task"] == "write the launch notes", "the goal is the first task"
        blocked = ledger_rows(daemon.home, "SELECT data FROM events WHERE kind = 'final-blocked' AND subject = ?"
                              " ORDER BY cursor", run_id)
        assert len(blocked) == 2
        assert "judge it first with goal.verdict" in blocked[0]["data"]
        assert "not met" in blocked[1]["data"] and "the draft is missing" in blocked[1]["data"]
        status = cli(daemon.home, "goal", "status", run_id, "--json")
        assert status.returncode == 0, status.stderr
        goal = json.loads(status.stdout)
        assert goal["goal"] == "write the launch notes" and goal["blockers"] == []
        assert [(v["met"], v["evidence"]) for v in goal["verdicts"]] == [
            (False, "the draft is missing"), (True, "notes.md exists with 3 sections")]
        text = cli(daemon.home, "goal", "status", run_id)
        assert "verdict: met - notes.md exists" in text.stdout
    finally:
        daemon.shutdown()


def test_without_a_goal_a_verdict_is_refused_and_the_first_final_reply_stands(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="no goal here")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        # Without a goal the first final reply stands; the scripted verdicts never ran.
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "too soon"
        assert ledger_rows(daemon.home, "SELECT * FROM goal_verdicts") == []
        assert json.loads(cli(daemon.home, "goal", "status", run_id, "--json").stdout)["goal"] is None
        script = json.dumps({"steps": [
            {"actions": [{"tool": "goal.verdict", "input": {"met": True, "evidence": "x"}}]}, {"final": "ok"}]})
        refused = daemon.call("run", agent_id="writer", task="verdict without a goal", script=script)["run_id"]
        shown = wait_run(daemon, refused, {"completed", "failed"})
        assert [(a["tool"], a["phase"]) for a in shown["actions"]] == [("goal.verdict", "failed")]
        assert "has no goal" in shown["actions"][0]["error"]
        assert ledger_rows(daemon.home, "SELECT * FROM goal_verdicts") == []
        missing = cli(daemon.home, "run", "--agent", "writer")
        assert missing.returncode == 2 and "--goal" in missing.stderr
        bad = cli(daemon.home, "goal", "status", "run-nosuchrun00")
        assert bad.returncode != 0 and "no run" in bad.stderr
    finally:
        daemon.shutdown()


def test_a_steer_after_the_last_verdict_asks_for_a_new_one(tmp_path: Path) -> None:
    import time

    from corral.supervisor.ledger.port import SqliteLedger
    from corral.supervisor.longtask import goal_store
    from corral.supervisor.runs import run_store

    ledger = SqliteLedger(tmp_path / "l.db")
    try:
        run_id = run_store.create_run(ledger, agent_id="writer", task="g", provider="scripted",
                                      provider_config={"script": {"steps": []}},
                                      options={"goal": {"text": "write the notes"}})
        goal_store.record_verdict(ledger, run_id, "act-1", True, "checked")
        assert goal_store.blockers(ledger, run_id) == []
        again = goal_store.record_verdict(ledger, run_id, "act-1", False, "a replay")
        assert again["met"] is True, "a verdict is recorded once per action id"
        with ledger.tx() as db:
            db.execute("INSERT INTO steers (steer_id, run_id, text, created_at) VALUES ('s1', ?, 'also a FAQ', ?)",
                       (run_id, time.time() + 1))
        assert goal_store.blockers(ledger, run_id) == [
            "the user refined the goal after your last verdict: judge it again with goal.verdict"]
        assert [r["text"] for r in goal_store.status(ledger, run_id)["refinements"]] == ["also a FAQ"]
    finally:
        ledger.close()

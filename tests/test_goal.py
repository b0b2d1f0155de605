"""Goal mode (seed 004 V1.18): a goal run ends only on the model's own verdict
that the goal is met, with evidence; not on a final reply alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.procs import wait_exit
from corral.supervisor.runs.run_feature import RunFeatures
from tests.harness import Daemon, agent_spec, cli, ledger_rows, module_daemon, running, wait_run

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

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


@pytest.fixture(scope="module")
def writer_daemon() -> Iterator[Daemon]:
    """One supervisor for the tests that do not restart it."""
    with module_daemon(agent_spec(steps=STEPS), home="h") as daemon:
        yield daemon


def test_a_goal_run_finishes_only_on_a_met_verdict_with_evidence(writer_daemon: Daemon) -> None:
    daemon = writer_daemon
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


def test_without_a_goal_a_verdict_is_refused_and_the_first_final_reply_stands(writer_daemon: Daemon) -> None:
    daemon = writer_daemon
    run_id = daemon.call("run", agent_id="writer", task="no goal here")["run_id"]
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    # Without a goal the first final reply stands; the scripted verdicts never ran.
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "too soon"
    assert ledger_rows(daemon.home, "SELECT * FROM goal_verdicts WHERE run_id = ?", run_id) == []
    assert json.loads(cli(daemon.home, "goal", "status", run_id, "--json").stdout)["goal"] is None
    script = json.dumps({"steps": [
        {"actions": [{"tool": "goal.verdict", "input": {"met": True, "evidence": "x"}}]}, {"final": "ok"}]})
    refused = daemon.call("run", agent_id="writer", task="verdict without a goal", script=script)["run_id"]
    shown = wait_run(daemon, refused, {"completed", "failed"})
    assert [(a["tool"], a["phase"]) for a in shown["actions"]] == [("goal.verdict", "failed")]
    assert "has no goal" in shown["actions"][0]["error"]
    assert ledger_rows(daemon.home, "SELECT * FROM goal_verdicts WHERE run_id IN (?, ?)", run_id, refused) == []
    missing = cli(daemon.home, "run", "--agent", "writer")
    assert missing.returncode == 2 and "--goal" in missing.stderr
    bad = cli(daemon.home, "goal", "status", "run-nosuchrun00")
    assert bad.returncode != 0 and "no run" in bad.stderr


@pytest.fixture
def goal_run(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    """A ledger holding one goal run ("write the notes") whose first verdict says met."""
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
    from corral.supervisor.longtask import goal_store
    from corral.supervisor.runs import run_store

    ledger = SqliteLedger(tmp_path / "l.db")
    try:
        run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="writer", task="g", provider="scripted",
                                      provider_config={"script": {"steps": []}},
                                      options={"goal": {"text": "write the notes"}})
        goal_store.record_verdict(ledger, run_id, "act-1", True, "checked")
        assert goal_store.blockers(ledger, run_id) == []
        yield ledger, run_id
    finally:
        ledger.close()


def test_a_steer_after_the_last_verdict_asks_for_a_new_one(goal_run: tuple[Any, str]) -> None:
    import time

    from corral.supervisor.longtask import goal_store

    ledger, run_id = goal_run
    again = goal_store.record_verdict(ledger, run_id, "act-1", False, "a replay")
    assert again["met"] is True, "a verdict is recorded once per action id"
    with ledger.tx() as db:
        db.execute("INSERT INTO steers (steer_id, run_id, text, created_at) VALUES ('s1', ?, 'also a FAQ', ?)",
                   (run_id, time.time() + 1))
    assert goal_store.blockers(ledger, run_id) == [
        "the user refined the goal after your last verdict: judge it again with goal.verdict"]
    assert [r["text"] for r in goal_store.status(ledger, run_id)["refinements"]] == ["also a FAQ"]


# -- the goal lifecycle (seed 004 V1.18) -----------------------------------------------------

LIFECYCLE_SPEC = """
[project]
root = "ws"
[[agents]]
id = "llm"
provider = "openai"
[agents.openai]
base_url = "{url}"
model = "fake-model"
timeout_s = 60
[[agents]]
id = "drafter"
[agents.policy]
"fs.write" = "confirm"
  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "page.md", content = "draft" } }]
"""


def _goal(daemon: Daemon, run_id: str) -> dict[str, Any]:
    result: dict[str, Any] = daemon.call("goal.status", run_id=run_id)
    return result


def _turns(daemon: Daemon, run_id: str) -> list[tuple[str, int]]:
    rows = ledger_rows(daemon.home, "SELECT status, provider_interrupted FROM provider_requests WHERE run_id = ?"
                       " ORDER BY started_at", run_id)
    return [(row["status"], row["provider_interrupted"]) for row in rows]


def test_a_goal_pauses_across_restarts_with_zero_provider_calls_then_edits_resumes_and_completes(
    short_tmp: Path,
) -> None:
    """Pause with the provider turn held at the server, the supervisor SIGKILLed right
    after the pause request; restarted twice while paused: zero provider calls. An
    edit bumps the revision and reaches the run as a steer (still no call); resume
    goes on in the same run, and the verdict that completes the goal binds revision 2."""
    from fake_openai import FakeOpenAIServer, Reply, completion
    from loopback_http import serve_in_thread

    verdict = {"actions": [{"tool": "goal.verdict", "input": {"met": True, "evidence": "notes and summary"}}],
               "planUpdate": None}  # the json_schema way requires it (seed 004 V1.17), null when unchanged
    server = FakeOpenAIServer([
        Reply(hang=True),  # the goal run's first turn, in flight when the pause comes
        # A run of the same agent, after a restart.
        Reply(body=completion('{"final": "other done", "planUpdate": null}')),
        Reply(body=completion(json.dumps(verdict))),
        Reply(body=completion('{"final": "done", "planUpdate": null}')),
    ])
    (short_tmp / "ws").mkdir()
    env = {"OPENAI_API_KEY": "sk-test", "CORRAL_FAILPOINTS": "goal.after-pause-request=kill@once"}
    spec = LIFECYCLE_SPEC.replace("{url}", "URL")
    with serve_in_thread(server) as url, running(short_tmp / "home", spec.replace("URL", url), env) as daemon:
        run_id: str = daemon.call("run", agent_id="llm", goal="write the notes")["run_id"]
        daemon.wait_until(lambda _: len(server.requests) == 1, what="the goal run's provider turn in flight")
        pid = daemon.endpoint.pid
        with pytest.raises(Exception):  # noqa: B017 - the supervisor dies before it answers
            daemon.call("goal.pause", run_id=run_id)
        assert wait_exit(pid, 10)
        daemon.up()
        wait_run(daemon, run_id, {"needs-input"})
        assert _goal(daemon, run_id)["lifecycle"]["status"] == "paused"
        assert _turns(daemon, run_id) == [("interrupted", 1)], "lost while pausing: interrupted, not re-sent"
        daemon.kill_supervisor()
        daemon.up()
        # The agent is up and claims work: another run of it completes; the paused one stays parked.
        other: str = daemon.call("run", agent_id="llm", task="something else")["run_id"]
        assert wait_run(daemon, other, {"completed", "failed"})["run"]["status"] == "completed"
        assert len(server.requests) == 2 and _turns(daemon, run_id) == [("interrupted", 1)], "zero calls paused"
        assert daemon.call("show", run_id=run_id)["run"]["status"] == "needs-input"
        edited = cli(daemon.home, "goal", "edit", run_id, "write the notes and a summary", "--json")
        assert edited.returncode == 0, edited.stderr
        edit = json.loads(edited.stdout)
        assert edit["revision"] == 2 and edit["changed"] is True and edit["steer_id"]
        daemon.wait_until(lambda _: bool(ledger_rows(daemon.home, "SELECT 1 FROM steers WHERE run_id = ? AND"
                                                     " applied_at IS NOT NULL", run_id)), what="the edit's steer")
        wait_run(daemon, run_id, {"needs-input"})
        assert len(server.requests) == 2, "an edit of a paused goal makes no provider call"
        again = daemon.call("goal.edit", run_id=run_id, text="write the notes and a summary")
        assert again["revision"] == 2 and again["changed"] is False
        assert daemon.call("goal.resume", run_id=run_id)["status"] == "active"
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"
        assert len(server.requests) == 4
        assert _turns(daemon, run_id) == [("interrupted", 1), ("completed", 0), ("completed", 0)]
        goal = _goal(daemon, run_id)
        assert goal["lifecycle"]["status"] == "completed" and goal["lifecycle"]["revision"] == 2
        assert [v["goal_revision"] for v in goal["verdicts"]] == [2]
        text = cli(daemon.home, "goal", "status", run_id).stdout
        assert "goal (completed, revision 2): write the notes and a summary" in text
        _one_goal_per_conversation_pause_while_parked_and_clear(daemon)  # the same supervisor: one boot fewer


def _one_goal_per_conversation_pause_while_parked_and_clear(daemon: Daemon) -> None:
    """A run parked for an approval holds no lane: its goal pauses at once. A second
    goal in the conversation is refused until the first is cleared (its run cancelled)."""
    conversation = daemon.call("conversation.new", agent_id="drafter")["conversation_id"]
    first: str = daemon.call("run", agent_id="drafter", goal="draft the page", conversation_id=conversation)["run_id"]
    wait_run(daemon, first, {"waiting-confirmation"})
    with pytest.raises(Exception, match="already has a active goal"):
        daemon.call("run", agent_id="drafter", goal="another goal", conversation_id=conversation)
    paused = json.loads(cli(daemon.home, "goal", "pause", first, "--json").stdout)
    assert paused["status"] == "paused" and paused["revision"] == 1
    # A chat line while the goal is paused steers it (nothing asked a question), and
    # a chat's `/goal set` (a goal turn) is refused while the run is live.
    line = daemon.call("conversation.send", conversation_id=conversation, text="also add a title")
    assert line["as"] == "steer" and line["run_id"] == first
    with pytest.raises(Exception, match="is live"):
        daemon.call("conversation.send", conversation_id=conversation, text="a new goal", goal=True)
    cleared = cli(daemon.home, "goal", "clear", first, "--json")
    assert cleared.returncode == 0 and json.loads(cleared.stdout)["status"] == "cleared", cleared.stderr
    assert daemon.call("show", run_id=first)["run"]["status"] == "cancelled"
    refused = cli(daemon.home, "goal", "resume", first)
    assert refused.returncode != 0 and "cleared" in refused.stderr
    sent = daemon.call("conversation.send", conversation_id=conversation, text="draft it again", goal=True)
    second: str = sent["run_id"]
    assert sent["as"] == "run" and _goal(daemon, second)["lifecycle"]["status"] == "active"
    wait_run(daemon, second, {"waiting-confirmation"})
    assert daemon.call("goal.clear", run_id=second)["status"] == "cleared"
    assert not (daemon.home.parent / "ws" / "page.md").exists(), "no write was ever approved"


def test_a_verdict_binds_to_the_goal_revision(goal_run: tuple[Any, str]) -> None:
    from corral.supervisor.longtask import goal_store

    ledger, run_id = goal_run
    assert goal_store.edit(ledger, run_id, "write the notes and a FAQ", NO_FEATURES)["revision"] == 2
    assert goal_store.blockers(ledger, run_id) == [
        "the goal was edited (revision 2) after your verdict on revision 1: judge the current goal with"
        " goal.verdict"]
    goal_store.record_verdict(ledger, run_id, "act-2", True, "checked again")
    assert goal_store.blockers(ledger, run_id) == []
    # Pending, not claimed yet: it parks at its first boundary, before any provider turn.
    assert goal_store.request_pause(ledger, run_id)["status"] == "pause-requested"
    assert goal_store.blockers(ledger, run_id) == [
        "the goal is pause-requested: no final reply until it is active again"]
    assert goal_store.holds_provider(ledger, run_id) is not None

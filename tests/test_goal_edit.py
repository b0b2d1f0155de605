"""A goal edit voids what was planned for the old goal (seed 004 V1.18).

Each action is bound to its run's goal id and revision when it is prepared. An
edit that bumps the revision turns every action of the run that has not started
(waiting for a person, approved, or merely prepared) into a blocked receipt the
agent sees; it never runs, an approval of it is refused, and the same run plans
again for the edited goal. A goal also carries up to 8 constraints and 8
verification items, an edit may name the revision it was made on (a stale one
is refused, naming the current one), and the goal completes from the run's
finalization record, with evidence the system writes, not the model."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from corral.core.procs import wait_exit
from corral.supervisor.runs.run_feature import RunFeatures
from tests.harness import Daemon, agent_spec, cli, ledger_rows, module_daemon, running, wait_run

STEPS = """
[[agents.steps]]
actions = [{ tool = "fs.write", input = { path = "page.md", content = "the old goal's draft" } }]
[[agents.steps]]
actions = [{ tool = "goal.verdict", input = { met = true, evidence = "planned again for the edited goal" } }]
[[agents.steps]]
final = "done"
"""
CONFIRM_WRITES = '[agents.policy]\n"fs.write" = "confirm"'


@pytest.fixture(scope="module")
def drafter() -> Iterator[Daemon]:
    with module_daemon(agent_spec(agent="drafter", policy=CONFIRM_WRITES, steps=STEPS), home="h") as daemon:
        yield daemon


def _page(daemon: Daemon) -> Path:
    return daemon.home.parent / "ws" / "page.md"


def _action(daemon: Daemon, action_id: str) -> dict[str, Any]:
    rows = ledger_rows(daemon.home, "SELECT phase, error, goal_id, goal_revision FROM actions WHERE action_id = ?",
                       action_id)
    assert len(rows) == 1
    return rows[0]


def _seen(daemon: Daemon, run_id: str, action_id: str) -> dict[str, Any]:
    """The observation the model was given for the action."""
    rows = ledger_rows(daemon.home, "SELECT data FROM observations WHERE run_id = ? AND source = ?", run_id,
                       action_id)
    assert len(rows) == 1
    data: dict[str, Any] = json.loads(rows[0]["data"])
    return data


def test_an_edit_blocks_the_write_waiting_for_approval_and_the_run_plans_again(drafter: Daemon) -> None:
    daemon = drafter
    run_id: str = daemon.call("run", agent_id="drafter", goal="draft the page")["run_id"]
    shown = wait_run(daemon, run_id, {"waiting-confirmation"})
    action_id = shown["actions"][0]["action_id"]
    goal = daemon.call("goal.status", run_id=run_id)["lifecycle"]
    bound = _action(daemon, action_id)
    assert (bound["goal_id"], bound["goal_revision"]) == (goal["goal_id"], 1), "bound to the goal it was made for"

    edited = cli(daemon.home, "goal", "edit", run_id, "draft the page in French", "--expected-revision", "1",
                 "--json")
    assert edited.returncode == 0, edited.stderr
    edit = json.loads(edited.stdout)
    assert edit["revision"] == 2 and edit["changed"] is True and edit["blocked"] == [action_id]
    blocked = _action(daemon, action_id)
    assert blocked["phase"] == "denied" and "the goal was edited (revision 1 -> 2)" in blocked["error"]
    approve = cli(daemon.home, "approve", action_id)
    assert approve.returncode != 0 and "the goal was edited" in approve.stderr, approve.stdout

    shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input", "needs-reconciliation"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done", shown["run"]
    seen = _seen(daemon, run_id, action_id)
    assert seen["status"] == "denied" and "the goal was edited (revision 1 -> 2)" in seen["error"]
    receipt = ledger_rows(daemon.home, "SELECT status, note FROM receipts WHERE action_id = ?", action_id)
    assert receipt == [{"status": "denied", "note": "blocked: goal edited to revision 2"}]
    assert not _page(daemon).exists(), "the old goal's write never ran"
    tools = [(a["tool"], a["phase"]) for a in daemon.call("show", run_id=run_id)["actions"]]
    assert tools == [("fs.write", "denied"), ("goal.verdict", "ok")], "the same run planned again"


def test_an_approved_write_not_started_is_blocked_by_an_edit_while_the_goal_is_paused(drafter: Daemon) -> None:
    daemon = drafter
    run_id: str = daemon.call("run", agent_id="drafter", goal="draft the page")["run_id"]
    action_id = wait_run(daemon, run_id, {"waiting-confirmation"})["actions"][0]["action_id"]
    assert daemon.call("goal.pause", run_id=run_id)["status"] == "paused"
    approved = cli(daemon.home, "approve", action_id)
    assert approved.returncode == 0, approved.stderr
    wait_run(daemon, run_id, {"needs-input"})  # parked by the paused goal before the write began
    assert _action(daemon, action_id)["phase"] == "approved"

    edit = daemon.call("goal.edit", run_id=run_id, text="draft the page in French", expected_revision=1)
    assert edit["revision"] == 2 and edit["blocked"] == [action_id]
    blocked = _action(daemon, action_id)
    assert blocked["phase"] == "failed" and "did not run" in blocked["error"]
    daemon.wait_until(lambda _: bool(ledger_rows(daemon.home, "SELECT 1 FROM steers WHERE run_id = ? AND"
                                                 " applied_at IS NOT NULL", run_id)), what="the edit's steer")
    wait_run(daemon, run_id, {"needs-input"})  # parked again: the goal is still paused
    assert _action(daemon, action_id)["phase"] == "failed"
    assert daemon.call("goal.resume", run_id=run_id)["status"] == "active"
    shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input", "needs-reconciliation"})
    assert shown["run"]["status"] == "completed", shown["run"]
    assert "the goal was edited (revision 1 -> 2)" in _seen(daemon, run_id, action_id)["error"]
    assert not _page(daemon).exists(), "the approval made for the old goal never ran"


def test_while_a_goal_is_active_or_paused_its_conversation_starts_no_other_run(drafter: Daemon) -> None:
    """V1.18: "Goal 活跃或暂停期间，当前 Session 禁止另起不相关 run；后续普通输入默认继续走同
    run steer，独立任务应使用另一 Session". A conversation is corral's session."""
    daemon = drafter
    conversation = daemon.call("conversation.new", agent_id="drafter")["conversation_id"]
    run_id: str = daemon.call("run", agent_id="drafter", goal="draft the page",
                              conversation_id=conversation)["run_id"]
    wait_run(daemon, run_id, {"waiting-confirmation"})
    runs_before = ledger_rows(daemon.home, "SELECT run_id FROM runs")
    for state in ("active", "paused"):
        with pytest.raises(Exception, match=f"has a {state} goal \\(run {run_id}\\)"):
            daemon.call("run", agent_id="drafter", task="an unrelated task", conversation_id=conversation)
        if state == "active":
            assert daemon.call("goal.pause", run_id=run_id)["status"] == "paused"
    assert ledger_rows(daemon.home, "SELECT run_id FROM runs") == runs_before
    line = daemon.call("conversation.send", conversation_id=conversation, text="keep it short")
    assert line["as"] == "steer" and line["run_id"] == run_id
    # An independent task goes to another conversation (another session).
    other = daemon.call("conversation.new", agent_id="drafter")["conversation_id"]
    elsewhere: str = daemon.call("run", agent_id="drafter", task="an unrelated task", conversation_id=other)["run_id"]
    daemon.call("cancel", run_id=elsewhere)
    assert daemon.call("goal.clear", run_id=run_id)["status"] == "cleared"


def test_constraints_verification_and_expected_revision(drafter: Daemon) -> None:
    daemon = drafter
    runs_before = len(ledger_rows(daemon.home, "SELECT run_id FROM runs"))
    nine = [arg for index in range(9) for arg in ("--constraint", f"rule {index}")]
    refused = cli(daemon.home, "run", "--agent", "drafter", "--goal", "draft the page", *nine)
    assert refused.returncode != 0 and "at most 8 constraints" in refused.stderr, refused.stderr
    assert len(ledger_rows(daemon.home, "SELECT run_id FROM runs")) == runs_before, "no run started"

    started = cli(daemon.home, "run", "--agent", "drafter", "--goal", "draft the page", "--constraint",
                  "no tables", "--verify", "page.md has a title", "--json")
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    shown = wait_run(daemon, run_id, {"waiting-confirmation"})
    assert "no tables" in shown["run"]["task"] and "page.md has a title" in shown["run"]["task"], "the model sees them"
    goal = daemon.call("goal.status", run_id=run_id)["lifecycle"]
    assert (goal["constraints"], goal["verification"], goal["revision"]) == (
        ["no tables"], ["page.md has a title"], 1)
    assert daemon.call("goal.pause", run_id=run_id)["status"] == "paused"  # the run stays live, parked

    too_many = cli(daemon.home, "goal", "edit", run_id, *[a for i in range(9) for a in ("--verify", f"check {i}")])
    assert too_many.returncode != 0 and "at most 8 verification items" in too_many.stderr, too_many.stderr
    changed = cli(daemon.home, "goal", "edit", run_id, "--constraint", "no tables", "--constraint", "no emoji",
                  "--expected-revision", "1", "--json")
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["revision"] == 2, "a new constraint is a new revision, the text kept"
    again = cli(daemon.home, "goal", "edit", run_id, "--constraint", "no tables", "--constraint", "no emoji",
                "--expected-revision", "1", "--json")
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["revision"], json.loads(again.stdout)["changed"]) == (2, False), "a retry"
    stale = cli(daemon.home, "goal", "edit", run_id, "another page", "--expected-revision", "1")
    assert stale.returncode != 0 and "revision 2, not 1" in stale.stderr, stale.stderr
    goal = daemon.call("goal.status", run_id=run_id)["lifecycle"]
    assert (goal["text"], goal["constraints"], goal["revision"]) == ("draft the page", ["no tables", "no emoji"], 2)
    text = cli(daemon.home, "goal", "status", run_id).stdout
    assert "constraint: no emoji" in text and "verification: page.md has a title" in text
    assert daemon.call("goal.clear", run_id=run_id)["status"] == "cleared"


VERDICT_THEN_FINAL = """
[[agents.steps]]
actions = [{ tool = "goal.verdict", input = { met = true, evidence = "written" } }]
[[agents.steps]]
final = "done"
"""


def test_the_goal_completes_from_the_finalization_record_after_a_crash(short_tmp: Path) -> None:
    """The supervisor is SIGKILLed once the final reply is appended and before the run
    completed: at boot the journal carries the run to completed, and the goal is
    completed from the journal's goal snapshot, with the system's evidence."""
    (short_tmp / "ws").mkdir()
    env = {"CORRAL_FAILPOINTS": "finalize.after-reply=kill@once"}
    with running(short_tmp / "home", agent_spec(steps=VERDICT_THEN_FINAL), env) as daemon:
        run_id: str = daemon.call("run", agent_id="writer", goal="write the notes")["run_id"]
        pid = daemon.endpoint.pid
        assert wait_exit(pid, 60), "killed at finalize.after-reply"
        # Read from the ledger, not asked: the run may reach its kill before any call.
        (goal,) = ledger_rows(daemon.home, "SELECT goal_id FROM goals WHERE run_id = ?", run_id)
        goal_id = goal["goal_id"]
        snapshot = ledger_rows(daemon.home, "SELECT phase, goal_snapshot FROM finalizations WHERE run_id = ?", run_id)
        assert snapshot[0]["phase"] == "reply-appended"
        assert json.loads(snapshot[0]["goal_snapshot"])["goal_revision"] == 1
        daemon.up()
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"
        lifecycle = daemon.call("goal.status", run_id=run_id)["lifecycle"]
        assert lifecycle["status"] == "completed"
        completion = lifecycle["completion"]
        assert completion["source"] == "finalization" and completion["goal_id"] == goal_id
        assert completion["goal_revision"] == 1
        assert completion["response_sha256"] == hashlib.sha256(b"done").hexdigest()
        assert completion["response_chars"] == 4
        assert completion["goal_fingerprint"] == json.loads(snapshot[0]["goal_snapshot"])["goal_fingerprint"]
        assert "plan_revision" in completion and "verification_id" in completion
        assert "written" not in json.dumps(completion), "the system's evidence, not the model's words"


def test_the_binding_the_block_and_the_compare_and_set_on_both_ledgers(open_ledger: Any) -> None:
    """The same rules on SQLite and on a PostgreSQL partition held as a node holds it
    (fenced writes, cached reads): the binding is read in the insert itself."""
    from corral.supervisor.errors import Conflict
    from corral.supervisor.longtask import goal_completion, goal_store
    from corral.supervisor.runs import action_store, resolutions, run_store
    from corral.supervisor.runs.run_state import RunStatus

    ledger = open_ledger()
    features = _with_goals(ledger)
    run_id = run_store.create_run(ledger, features, agent_id="drafter", task="g", provider="scripted",
                                  provider_config={"script": {"steps": []}},
                                  options={"goal": {"text": "draft the page", "constraints": ["no tables"]}})
    goal = goal_store.goal_row(ledger, run_id)
    run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, features, "claimed")
    waiting, approved = (
        action_store.prepare_action(ledger, run_id, 0, index, "fs.write", {"path": f"p{index}.md", "content": "x"},
                                    features, rerunnable=False, policy="confirm") for index in (0, 1))
    assert (waiting["goal_id"], waiting["goal_revision"]) == (goal["goal_id"], 1)
    for row in (waiting, approved):
        action_store.begin_action(ledger, row["action_id"], features)
    resolutions.continue_action(ledger, approved["action_id"], "approve", None, features)
    prepared = action_store.prepare_action(ledger, run_id, 0, 2, "fs.write", {"path": "p2.md", "content": "x"},
                                           features, rerunnable=False, policy="auto")
    snapshot = goal_completion.snapshot(ledger, run_id, "done")
    assert goal_completion.stale(ledger, run_id, snapshot) is None

    edit = goal_store.edit(ledger, run_id, "draft the page in French", features, 1)
    assert edit["revision"] == 2 and edit["constraints"] == ["no tables"], "the lists left out are kept"
    assert edit["blocked"] == [waiting["action_id"], approved["action_id"], prepared["action_id"]]
    phases = {row["action_id"]: row["phase"] for row in ledger.all("SELECT * FROM actions WHERE run_id = ?", run_id)}
    assert phases == {waiting["action_id"]: "denied", approved["action_id"]: "failed",
                      prepared["action_id"]: "denied"}
    notes = ledger.all("SELECT note FROM receipts WHERE run_id = ?", run_id)
    assert [row["note"] for row in notes] == ["blocked: goal edited to revision 2"] * 3
    assert run_store.get_run(ledger, run_id)["status"] == "running", "nothing waits for a person any more"
    with pytest.raises(Conflict, match="the goal was edited"):
        resolutions.continue_action(ledger, waiting["action_id"], "approve", None, features)
    assert "edited (revision 1 -> 2)" in str(goal_completion.stale(ledger, run_id, snapshot))
    after = action_store.prepare_action(ledger, run_id, 1, 0, "fs.write", {"path": "p.md", "content": "y"}, features,
                                        rerunnable=False, policy="confirm")
    assert after["goal_revision"] == 2

    assert goal_store.edit(ledger, run_id, "draft the page in French", features, 1)["changed"] is False, "a retry"
    with pytest.raises(Conflict, match="revision 2, not 1"):
        goal_store.edit(ledger, run_id, "another page", features, 1)
    with pytest.raises(Conflict, match="revision 2, not 3"):
        goal_store.edit(ledger, run_id, "another page", features, 3)
    assert goal_store.goal_row(ledger, run_id)["text"] == "draft the page in French"
    secret = "sk-abcdefghijklmnopqrstuvwxyz0123456789"
    kept = goal_store.edit(ledger, run_id, None, features, 2, verification=[f"the page works with key {secret}"])
    assert kept["revision"] == 3 and kept["verification"] == ["the page works with key [redacted]"]
    assert secret not in json.dumps([dict(row) for row in ledger.all("SELECT * FROM goals")])


def _with_goals(ledger: Any) -> RunFeatures:
    """The run layer knows goals only through the goal feature (supervisor/runs/run_feature.py):
    the features a supervisor with goals alone would hand the run layer's calls."""
    from corral.supervisor.longtask.goal_service import GoalFeature

    features = RunFeatures()
    features.install([GoalFeature(cast(Any, None))])  # its ``show`` alone needs the service
    return features


def test_an_action_bound_to_an_older_goal_revision_never_starts_at_its_boundary(open_ledger: Any) -> None:
    """The edit's own sweep aside, the boundary checks the binding itself: an
    unstarted action whose goal moved on (a revision written by another path) is
    blocked when it would begin, whether it was approved or needs no person."""
    from corral.mailbox.steps import Begin
    from corral.supervisor.longtask import goal_store
    from corral.supervisor.runs import action_store, resolutions, run_store
    from corral.supervisor.runs.run_state import RunStatus

    ledger = open_ledger()
    features = _with_goals(ledger)
    run_id = run_store.create_run(ledger, features, agent_id="drafter", task="g", provider="scripted",
                                  provider_config={"script": {"steps": []}}, options={"goal": {"text": "draft"}})
    goal_store.goal_row(ledger, run_id)
    run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, features, "claimed")
    approved = action_store.prepare_action(ledger, run_id, 0, 0, "fs.write", {"path": "a.md", "content": "x"}, features,
                                           rerunnable=False, policy="confirm")
    action_store.begin_action(ledger, approved["action_id"], features)
    resolutions.continue_action(ledger, approved["action_id"], "approve", None, features)
    auto = action_store.prepare_action(ledger, run_id, 0, 1, "fs.write", {"path": "b.md", "content": "x"}, features,
                                       rerunnable=False, policy="auto")
    with ledger.tx() as db:
        db.execute("UPDATE goals SET revision = 2 WHERE run_id = ?", (run_id,))
    skipped = [action_store.begin_action(ledger, row["action_id"], features) for row in (approved, auto)]
    assert skipped == [{"begin": Begin.SKIP, "phase": "failed"}, {"begin": Begin.SKIP, "phase": "denied"}]
    rows = ledger.all("SELECT a.phase, a.error, r.note FROM actions a JOIN receipts r ON r.action_id = a.action_id"
                      " WHERE a.run_id = ? ORDER BY a.action_index", run_id)
    assert [(row["phase"], row["note"]) for row in rows] == [
        ("failed", "blocked: goal edited to revision 2"), ("denied", "blocked: goal edited to revision 2")]
    assert all("(revision 1 -> 2)" in row["error"] for row in rows)
    current = action_store.prepare_action(ledger, run_id, 1, 0, "fs.write", {"path": "c.md", "content": "x"}, features,
                                          rerunnable=False, policy="auto")
    begun = action_store.begin_action(ledger, current["action_id"], features)
    assert begun["begin"] is Begin.EXECUTE, "bound to revision 2"


def test_a_finalization_prepared_for_an_older_goal_is_voided_and_writes_no_reply(open_ledger: Any) -> None:
    """A journal left ``prepared`` (a crash) whose goal changed since is voided when it
    is carried on: no reply, the run still running, the goal not completed."""
    import time

    from corral.supervisor.longtask import goal_completion, goal_store
    from corral.supervisor.runs import finalization, run_store
    from corral.supervisor.runs.run_state import RunStatus

    ledger = open_ledger()
    features = _with_goals(ledger)
    run_id = run_store.create_run(ledger, features, agent_id="writer", task="g", provider="scripted",
                                  provider_config={"script": {"steps": []}}, options={"goal": {"text": "notes"}})
    goal_store.goal_row(ledger, run_id)
    run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, features, "claimed")
    with ledger.tx() as db:
        db.execute("INSERT INTO finalizations (run_id, phase, reply, created_at, updated_at, goal_snapshot)"
                   " VALUES (?, 'prepared', 'done', ?, ?, ?)",
                   (run_id, time.time(), time.time(), goal_completion.snapshot(ledger, run_id, "done")))
        db.execute("UPDATE goals SET revision = 2 WHERE run_id = ?", (run_id,))
    result = finalization.resume_finalization(ledger, run_id, features)
    assert result["status"] == "invalidated" and "revision 1 -> 2" in result["reason"]
    assert ledger.all("SELECT * FROM finalizations WHERE run_id = ?", run_id) == []
    assert ledger.all("SELECT * FROM replies WHERE run_id = ?", run_id) == []
    assert run_store.get_run(ledger, run_id)["status"] == "running"
    assert goal_store.goal_row(ledger, run_id)["status"] == "active"

"""Interactive runs (issue 17): steers applied once at a safe boundary, questions
answered once, conversations and forks; with real SIGKILLs of the agent and the
supervisor between record and application."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from corral.core.procs import wait_exit
from tests.harness import Daemon, cli, ledger_rows, running, wait_run

QUESTION_SPEC = """
name = "interactive"
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
[[agents]]
id = "root"
  [[agents.steps]]
  actions = [{ tool = "user.input_request", input = { question = "Which colour?", options = ["red", "blue"] } }]
  [[agents.steps]]
  when_observed = "blue"
  actions = [{ tool = "effect.record", input = { label = "paint-blue" } }]
  [[agents.steps]]
  final = "painted"
"""

# Before the steer the script plans "old"; a steer always opens a new loop, and
# with "go green" in the history the second applicable step is "green".
STEER_SPEC = """
name = "steering"
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
[[agents]]
id = "root"
  [[agents.steps]]
  unless_observed = "go green"
  actions = [{ tool = "effect.record", input = { label = "old" } }]
  [[agents.steps]]
  when_observed = "go green"
  final = "never used: loop 0 was spent before the steer"
  [[agents.steps]]
  when_observed = "go green"
  actions = [{ tool = "effect.record", input = { label = "green" } }]
  [[agents.steps]]
  when_observed = "go green"
  final = "done green"
  [[agents.steps]]
  unless_observed = "go green"
  final = "done old"
"""


@pytest.fixture
def project(short_tmp: Path) -> Path:
    (short_tmp / "ws").mkdir()
    return short_tmp


def _effects(project: Path) -> list[str]:
    path = project / "effects.log"
    if not path.exists():
        return []
    return [json.loads(line)["label"] for line in path.read_text().splitlines() if line.strip()]


def _run(daemon: Daemon, task: str = "paint") -> str:
    run_id: str = daemon.call("run", agent_id="root", task=task)["run_id"]
    return run_id


def _agent_pid(daemon: Daemon) -> int:
    pid = daemon.actor("root")["pid"]
    assert isinstance(pid, int)
    return pid


def _release(daemon: Daemon, name: str) -> None:
    directory = daemon.home / "failpoints"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.release").touch()


def _wait_request_started(daemon: Daemon, run_id: str) -> None:
    daemon.wait_until(
        lambda _: bool(ledger_rows(daemon.home, "SELECT 1 FROM provider_requests WHERE run_id = ?", run_id)),
        what="the run's first provider request",
    )


def _observations(daemon: Daemon, run_id: str, prefix: str) -> list[dict[str, Any]]:
    return ledger_rows(
        daemon.home, "SELECT source, data FROM observations WHERE run_id = ? AND source LIKE ?", run_id, prefix + "%"
    )


# -- questions -----------------------------------------------------------------------------


def test_a_question_parks_the_run_and_its_answer_is_observed_once(project: Path) -> None:
    with running(project / "home", QUESTION_SPEC) as daemon:
        run_id = _run(daemon)
        shown = wait_run(daemon, run_id, {"needs-input"})
        requests_parked = len(shown["provider_requests"])
        pending = daemon.call("pending")
        (question,) = pending["questions"]
        assert question["question"] == "Which colour?" and question["options"] == ["red", "blue"]
        assert "asks: Which colour?" in cli(daemon.home, "pending").stdout
        # Parked: the lane is free, no provider call is made meanwhile.
        other = daemon.call("run", agent_id="root", task="second task")["run_id"]
        wait_run(daemon, other, {"needs-input"})
        assert len(daemon.call("show", run_id=run_id)["provider_requests"]) == requests_parked
        bad = cli(daemon.home, "answer", run_id, "green")
        assert bad.returncode != 0 and "must be one of: red, blue" in bad.stderr
        assert cli(daemon.home, "answer", run_id, "blue").returncode == 0
        again = cli(daemon.home, "answer", run_id, "red")
        assert again.returncode != 0 and "already answered" in again.stderr
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "painted"
        asked = shown["actions"][0]
        assert asked["tool"] == "user.input_request" and asked["phase"] == "ok"
        answers = [row for row in _observations(daemon, run_id, "act-") if "answer" in row["data"]]
        assert len(answers) == 1 and '"blue"' in answers[0]["data"]
        assert _effects(project).count("paint-blue") == 1
        daemon.call("cancel", run_id=other)


@pytest.mark.parametrize("victim", ["agent", "supervisor"])
def test_a_kill_between_question_and_answer_loses_nothing(project: Path, victim: str) -> None:
    with running(project / "home", QUESTION_SPEC) as daemon:
        run_id = _run(daemon)
        wait_run(daemon, run_id, {"needs-input"})
        if victim == "agent":
            pid = _agent_pid(daemon)
            os.kill(pid, signal.SIGKILL)
            assert wait_exit(pid, 10)
            daemon.wait_until(lambda s: daemon.actor("root")["restarts"] >= 1, what="the agent's restart")
        else:
            daemon.kill_supervisor()
            daemon.up()
        assert wait_run(daemon, run_id, {"needs-input"})["run"]["status"] == "needs-input"
        assert cli(daemon.home, "answer", run_id, "blue").returncode == 0
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        assert len(ledger_rows(daemon.home, "SELECT * FROM input_requests WHERE run_id = ?", run_id)) == 1
        assert _effects(project) == ["paint-blue"]


def test_a_supervisor_killed_right_after_the_answer_keeps_it_and_refuses_another(project: Path) -> None:
    env = {"CORRAL_FAILPOINTS": "input.after-answer=kill@once"}
    with running(project / "home", QUESTION_SPEC, env=env) as daemon:
        run_id = _run(daemon)
        wait_run(daemon, run_id, {"needs-input"})
        pid = daemon.endpoint.pid
        lost = cli(daemon.home, "answer", run_id, "blue")
        assert lost.returncode != 0  # the reply died with the supervisor
        assert wait_exit(pid, 10)
        daemon.up()
        again = cli(daemon.home, "answer", run_id, "red")
        assert again.returncode != 0 and "already answered" in again.stderr
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        assert _effects(project) == ["paint-blue"]
        (row,) = ledger_rows(daemon.home, "SELECT answer FROM input_requests WHERE run_id = ?", run_id)
        assert row["answer"] == "blue"


def test_cancelling_a_run_that_waits_for_input_closes_its_question(project: Path) -> None:
    with running(project / "home", QUESTION_SPEC) as daemon:
        run_id = _run(daemon)
        wait_run(daemon, run_id, {"needs-input"})
        daemon.call("cancel", run_id=run_id)
        shown = wait_run(daemon, run_id, {"cancelled"})
        assert shown["actions"][0]["phase"] == "failed"
        late = cli(daemon.home, "answer", run_id, "blue")
        assert late.returncode != 0 and "cancelled and takes no answer" in late.stderr
        assert daemon.call("pending")["questions"] == []


# -- steers ---------------------------------------------------------------------------------


def _steered_run_ends_green(daemon: Daemon, project: Path, run_id: str) -> dict[str, Any]:
    shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
    assert shown["run"]["status"] == "completed", shown["run"]
    assert shown["final_reply"] == "done green"
    # The plan made before the steer never ran: its response was discarded.
    assert _effects(project) == ["green"]
    (steer,) = shown["interactive"]["steers"]
    assert steer["applied_at"] is not None
    assert len(_observations(daemon, run_id, "steer:")) == 1
    assert len(ledger_rows(daemon.home, "SELECT * FROM replies WHERE run_id = ?", run_id)) == 1
    return shown


def test_a_steer_discards_the_stale_plan_and_is_applied_once(project: Path) -> None:
    env = {"CORRAL_FAILPOINTS": "provider.before-handoff=block@once"}
    with running(project / "home", STEER_SPEC, env=env) as daemon:
        run_id = _run(daemon, "paint the fence")
        _wait_request_started(daemon, run_id)  # the agent holds its answer, not yet handed off
        result = cli(daemon.home, "steer", run_id, "go green instead", "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["run_id"] == run_id
        _release(daemon, "provider.before-handoff")
        shown = _steered_run_ends_green(daemon, project, run_id)
        # The stale answer was committed, then consumed by the steer, never planned.
        assert all(action["loop_index"] >= 1 for action in shown["actions"])


@pytest.mark.parametrize("victim", ["agent", "supervisor"])
def test_a_kill_between_a_steer_and_its_application_still_applies_it_once(project: Path, victim: str) -> None:
    env = {"CORRAL_FAILPOINTS": "provider.before-handoff=block@once"}
    with running(project / "home", STEER_SPEC, env=env) as daemon:
        run_id = _run(daemon, "paint the fence")
        _wait_request_started(daemon, run_id)
        assert cli(daemon.home, "steer", run_id, "go green instead").returncode == 0
        if victim == "agent":
            pid = _agent_pid(daemon)
            os.kill(pid, signal.SIGKILL)
            assert wait_exit(pid, 10)
        else:
            daemon.kill_supervisor()
            daemon.up()
        _steered_run_ends_green(daemon, project, run_id)


def test_a_supervisor_killed_right_after_recording_a_steer_keeps_it(project: Path) -> None:
    env = {"CORRAL_FAILPOINTS": "provider.before-handoff=block@once,steer.after-record=kill@once"}
    with running(project / "home", STEER_SPEC, env=env) as daemon:
        run_id = _run(daemon, "paint the fence")
        _wait_request_started(daemon, run_id)
        pid = daemon.endpoint.pid
        assert cli(daemon.home, "steer", run_id, "go green instead").returncode != 0
        assert wait_exit(pid, 10)
        daemon.up()
        _steered_run_ends_green(daemon, project, run_id)


def test_steering_a_finished_run_is_a_clear_error(project: Path) -> None:
    with running(project / "home", STEER_SPEC) as daemon:
        run_id = _run(daemon)
        wait_run(daemon, run_id, {"completed"})
        result = cli(daemon.home, "steer", run_id, "go green")
        assert result.returncode != 0
        assert "is completed" in result.stderr and "Start a new run instead" in result.stderr
        assert ledger_rows(daemon.home, "SELECT * FROM steers") == []
        for bad in (("steer", "run-nope", "x"), ("steer", run_id, "")):
            assert cli(daemon.home, *bad).returncode != 0


# -- conversations ------------------------------------------------------------------------------


CHAT_SPEC = """
name = "chat"
[project]
root = "ws"
[[agents]]
id = "root"
  [[agents.steps]]
  when_task = "second"
  final = "second answer"
  [[agents.steps]]
  unless_task = "second"
  final = "first answer"
"""


def test_a_conversation_carries_its_turns_and_a_fork_keeps_them_apart(project: Path) -> None:
    with running(project / "home", CHAT_SPEC) as daemon:
        conversation = daemon.call("conversation.new", agent_id="root")["conversation_id"]
        first = daemon.call("conversation.send", conversation_id=conversation, text="first question")
        assert first["as"] == "run"
        wait_run(daemon, first["run_id"], {"completed"})
        fork = daemon.call("conversation.fork", conversation_id=conversation)
        assert fork["turns"] == 1
        second = daemon.call("conversation.send", conversation_id=conversation, text="second question")
        shown = wait_run(daemon, second["run_id"], {"completed"})
        # The new turn's run saw the earlier turn.
        assert "User: first question" in shown["run"]["task"] and "You: first answer" in shown["run"]["task"]
        assert shown["final_reply"] == "second answer"
        own = daemon.call("conversation.show", conversation_id=conversation)["turns"]
        forked = daemon.call("conversation.show", conversation_id=fork["conversation_id"])["turns"]
        assert [t["reply"] for t in own] == ["first answer", "second answer"]
        assert [t["reply"] for t in forked] == ["first answer"]
        third = daemon.call("conversation.send", conversation_id=fork["conversation_id"], text="other branch")
        wait_run(daemon, third["run_id"], {"completed"})
        assert len(daemon.call("conversation.show", conversation_id=conversation)["turns"]) == 2
        assert len(daemon.call("conversation.show", conversation_id=fork["conversation_id"])["turns"]) == 2
        assert cli(daemon.home, "fork", "conv-nope").returncode != 0

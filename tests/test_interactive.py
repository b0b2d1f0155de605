"""Interactive runs (issue 17): steers applied once at a safe boundary, conversations
and forks (questions: tests/test_questions.py); with real SIGKILLs of the agent and the
supervisor between record and application."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.procs import wait_exit
from corral.supervisor.runs.run_feature import RunFeatures
from tests.harness import CORRAL, Daemon, cli, ledger_rows, module_daemon, running, wait_run

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

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
        result = cli(daemon.home, "steer", run_id, "--stdin", "--json", stdin="go green instead")
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
        assert cli(daemon.home, "steer", run_id, "--stdin", stdin="go green instead").returncode == 0
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
        assert cli(daemon.home, "steer", run_id, "--stdin", stdin="go green instead").returncode != 0
        assert wait_exit(pid, 10)
        daemon.up()
        _steered_run_ends_green(daemon, project, run_id)


def test_steering_a_finished_run_is_a_clear_error(steer_daemon: Daemon) -> None:
    daemon = steer_daemon
    run_id = _run(daemon)
    wait_run(daemon, run_id, {"completed"})
    result = cli(daemon.home, "steer", run_id, "--stdin", stdin="go green")
    assert result.returncode != 0
    assert "is completed" in result.stderr and "Start a new run instead" in result.stderr
    assert ledger_rows(daemon.home, "SELECT * FROM steers WHERE run_id = ?", run_id) == []
    unknown = cli(daemon.home, "steer", "run-nope", "--stdin", stdin="x")
    empty = cli(daemon.home, "steer", run_id, "--stdin", stdin="")
    assert unknown.returncode != 0 and "run-nope" in unknown.stderr
    assert empty.returncode != 0 and "Traceback" not in empty.stderr


# -- steers that wait for a person's decision (seed 004 V1.13) ----------------------------------

# "editor" writes with confirmation. Loop 0 writes a.md; the steer ("also add a note")
# applies after that write's receipt and opens loop 1, where the script writes the note.
EDITOR_AGENT = """
[[agents]]
id = "editor"
[agents.policy]
"fs.write" = "confirm"
  [[agents.steps]]
  unless_observed = "add a note"
  actions = [{ tool = "fs.write", input = { path = "a.md", content = "hello" } }]
  [[agents.steps]]
  when_observed = "add a note"
  final = "never used: loop 0 was spent before the steer"
  [[agents.steps]]
  when_observed = "add a note"
  actions = [{ tool = "fs.write", input = { path = "note.md", content = "a note" } }]
  [[agents.steps]]
  when_observed = "add a note"
  final = "wrote both"
"""


@pytest.fixture(scope="module")
def steer_daemon() -> Iterator[Daemon]:
    """One supervisor for the steer tests that do not restart it."""
    with module_daemon(STEER_SPEC + EDITOR_AGENT) as daemon:
        yield daemon


def _waiting_action(daemon: Daemon, run_id: str, path: str) -> dict[str, Any]:
    def waiting() -> list[dict[str, Any]]:
        rows = ledger_rows(daemon.home, "SELECT action_id, input FROM actions WHERE run_id = ?"
                           " AND phase = 'waiting-confirmation'", run_id)
        return [row for row in rows if json.loads(row["input"]).get("path") == path]

    daemon.wait_until(lambda _: bool(waiting()), what=f"the write of {path} waiting for confirmation")
    (action,) = waiting()
    return action


def test_a_steer_never_discards_an_action_waiting_for_approval(steer_daemon: Daemon) -> None:
    """The live bug of issue 36: steer, then approve. The approval executes the
    original write; the steer applies after its receipt; the run does both."""
    daemon = steer_daemon
    run_id: str = daemon.call("run", agent_id="editor", task="write a.md")["run_id"]
    first = _waiting_action(daemon, run_id, "a.md")
    steered = cli(daemon.home, "steer", run_id, "--stdin", "--json", stdin="also add a note")
    assert steered.returncode == 0, steered.stderr
    approved = cli(daemon.home, "approve", first["action_id"])
    assert approved.returncode == 0 and "approved" in approved.stdout, approved.stderr
    second = _waiting_action(daemon, run_id, "note.md")
    assert cli(daemon.home, "approve", second["action_id"]).returncode == 0
    shown = wait_run(daemon, run_id, {"completed", "failed", "cancelled"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "wrote both"
    ws = daemon.home.parent / "ws"
    assert (ws / "a.md").read_text() == "hello" and (ws / "note.md").read_text() == "a note"
    assert [(a["action_id"], a["phase"]) for a in shown["actions"]] == [
        (first["action_id"], "ok"), (second["action_id"], "ok")], "each write once, none superseded"
    # Ledger order: the write's receipt, then the steer, then the note's write.
    order = [row["source"] for row in ledger_rows(
        daemon.home, "SELECT source FROM observations WHERE run_id = ? ORDER BY seq", run_id)]
    steer_source = f"steer:{json.loads(steered.stdout)['steer_id']}"
    assert order.index(first["action_id"]) < order.index(steer_source) < order.index(second["action_id"])
    late = cli(daemon.home, "approve", first["action_id"])
    assert late.returncode != 0 and "approved" not in late.stdout and "not waiting for confirmation" in late.stderr


def test_steer_ids_sizes_and_the_per_run_cap(steer_daemon: Daemon) -> None:
    daemon = steer_daemon
    script = json.dumps({"steps": [{"actions": [{"tool": "fs.write", "input": {"path": "x.md", "content": "x"}}]}]})
    run_id: str = daemon.call("run", agent_id="editor", task="park", script=script)["run_id"]
    wait_run(daemon, run_id, {"waiting-confirmation"})
    first = cli(daemon.home, "steer", run_id, "--stdin", "--steer-id", "s-1", "--json", stdin="first")
    again = cli(daemon.home, "steer", run_id, "--stdin", "--steer-id", "s-1", "--json", stdin="first")
    assert first.returncode == 0 and again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["existing"] is True
    conflict = cli(daemon.home, "steer", run_id, "--stdin", "--steer-id", "s-1", stdin="other text")
    assert conflict.returncode != 0 and "steer-id-conflict" in conflict.stderr
    too_long = cli(daemon.home, "steer", run_id, "--stdin", stdin="é" * 2049)  # 4098 bytes of UTF-8
    assert too_long.returncode != 0 and "over 4096 bytes" in too_long.stderr
    assert len(ledger_rows(daemon.home, "SELECT * FROM steers WHERE run_id = ?", run_id)) == 1
    for n in range(15):
        daemon.call("steer", run_id=run_id, text=f"more {n}")
    over = cli(daemon.home, "steer", run_id, "--stdin", stdin="one too many")
    assert over.returncode != 0 and "16 steers" in over.stderr
    assert len(ledger_rows(daemon.home, "SELECT * FROM steers WHERE run_id = ?", run_id)) == 16
    daemon.call("cancel", run_id=run_id)


def test_a_runs_steers_hold_at_most_16_kib_in_all(steer_daemon: Daemon) -> None:
    """V1.13: "每 run 最多 16 条、总计最多 16 KiB": four full 4 KiB steers fill a run's
    16 KiB; one more byte is refused, with the run's steers unchanged."""
    daemon = steer_daemon
    script = json.dumps({"steps": [{"actions": [{"tool": "fs.write", "input": {"path": "z.md", "content": "z"}}]}]})
    run_id: str = daemon.call("run", agent_id="editor", task="park", script=script)["run_id"]
    wait_run(daemon, run_id, {"waiting-confirmation"})
    for n in range(4):
        daemon.call("steer", run_id=run_id, text=str(n) * 4096)
    over = cli(daemon.home, "steer", run_id, "--stdin", stdin="x")
    assert over.returncode != 0 and "16384 bytes in all" in over.stderr, over.stderr
    assert len(ledger_rows(daemon.home, "SELECT * FROM steers WHERE run_id = ?", run_id)) == 4
    daemon.call("cancel", run_id=run_id)


def test_a_steer_read_from_stdin_never_shows_in_the_command_line(steer_daemon: Daemon) -> None:
    """V1.13: ``corral steer RUN --stdin`` takes the text from stdin, so it is not in
    ``ps``; a TEXT argument (with or without --stdin), or no --stdin, is refused and
    records nothing."""
    daemon = steer_daemon
    script = json.dumps({"steps": [{"actions": [{"tool": "fs.write", "input": {"path": "y.md", "content": "y"}}]}]})
    run_id: str = daemon.call("run", agent_id="editor", task="park", script=script)["run_id"]
    wait_run(daemon, run_id, {"waiting-confirmation"})

    def steer(*args: str, text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CORRAL, "--home", str(daemon.home), "steer", run_id, *args], input=text,
                              capture_output=True, text=True, timeout=60, check=False)

    secret_plan = "switch to the blue palette\nand keep the header"
    sent = steer("--stdin", "--json", text=secret_plan)
    assert sent.returncode == 0, sent.stderr
    (row,) = ledger_rows(daemon.home, "SELECT text FROM steers WHERE run_id = ?", run_id)
    assert row["text"] == secret_plan
    both = steer("inline text", "--stdin", text="piped text")
    neither = steer(text="")
    inline = steer("inline text", text="")
    assert both.returncode != 0 and "--stdin" in both.stderr
    assert neither.returncode != 0 and "--stdin" in neither.stderr
    # The seed: "正文只能从 stdin 读取" (the text is read from stdin only).
    assert inline.returncode != 0 and "only from stdin" in inline.stderr, inline.stderr
    assert len(ledger_rows(daemon.home, "SELECT * FROM steers WHERE run_id = ?", run_id)) == 1
    daemon.call("cancel", run_id=run_id)


def test_children_refuse_steers_and_a_superseded_action_refuses_approval(tmp_path: Path) -> None:
    from corral.supervisor.errors import BadRequest, Conflict
    from corral.supervisor.interactive import steer_store
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
    from corral.supervisor.runs import action_store, resolutions, run_store

    ledger = SqliteLedger(tmp_path / "l.db")
    try:
        config: dict[str, Any] = {"script": {"steps": []}}
        root = run_store.create_run(ledger, NO_FEATURES,
                                    agent_id="a", task="t", provider="scripted", provider_config=config)
        child = run_store.create_run(ledger, NO_FEATURES,
                                     agent_id="c", task="t", provider="scripted", provider_config=config,
                                     kind="child", parent_run_id=root, root_run_id=root, depth=1)
        with pytest.raises(Conflict, match=f"only a root run is steered \\(steer {root} instead\\)"):
            steer_store.record_steer(ledger, child, "do it differently", NO_FEATURES)
        with pytest.raises(BadRequest, match="control characters"):
            steer_store.record_steer(ledger, root, "a\x00b", NO_FEATURES)
        run_store.set_run_status(ledger, root, run_store.RunStatus.RUNNING, NO_FEATURES)
        prepared = action_store.prepare_action(ledger, root, 0, 0, "fs.write", {"path": "a", "content": "b"},
                                               NO_FEATURES, rerunnable=False, policy="auto")
        steer_store.record_steer(ledger, root, "stop that", NO_FEATURES)
        assert steer_store.apply_steers(ledger, root, NO_FEATURES) == 1
        action = action_store.get_action(ledger, prepared["action_id"])
        assert action["phase"] == "denied" and action["reason"] == steer_store.SUPERSEDED
        assert ledger.one("SELECT 1 FROM receipts WHERE action_id = ?", prepared["action_id"]) is not None
        with pytest.raises(Conflict, match=r"superseded by the user's steer.*nothing was approved"):
            resolutions.continue_action(ledger, prepared["action_id"], "approve", None, NO_FEATURES)
    finally:
        ledger.close()


def test_steers_apply_in_their_ledger_sequence_even_when_the_clock_steps_back(tmp_path: Path) -> None:
    """Seed 004 V1.13: "sequence 在项目写锁内从 ledger 单调递增，不能使用时间戳". The wall clock
    stepping back between two steers (their ``created_at`` reversed here, as a clock
    set back would record them) does not reorder them: the ledger's sequence does."""
    from corral.supervisor.interactive import steer_store
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
    from corral.supervisor.runs import run_store

    ledger = SqliteLedger(tmp_path / "l.db")
    try:
        config: dict[str, Any] = {"script": {"steps": []}}
        root = run_store.create_run(ledger, NO_FEATURES,
                                    agent_id="a", task="t", provider="scripted", provider_config=config)
        run_store.set_run_status(ledger, root, run_store.RunStatus.RUNNING, NO_FEATURES)
        for n, steer_id in enumerate(("s-first", "s-second", "s-third")):
            steer_store.record_steer(ledger, root, f"instruction {n}", NO_FEATURES, steer_id=steer_id)
        with ledger.tx() as db:  # the clock stepped back an hour before the second and third
            db.execute("UPDATE steers SET created_at = created_at - 3600 WHERE steer_id != 's-first'")
        assert [row["steer_id"] for row in steer_store.pending_steers(ledger, root)] == [
            "s-first", "s-second", "s-third"]
        assert [row["seq"] for row in ledger.all("SELECT seq FROM steers WHERE run_id = ? ORDER BY seq", root)] == [
            1, 2, 3]
        assert steer_store.apply_steers(ledger, root, NO_FEATURES) == 3
        texts = [json.loads(row["data"])["text"] for row in ledger.all(
            "SELECT data FROM observations WHERE run_id = ? ORDER BY seq", root)]
        assert texts == ["instruction 0", "instruction 1", "instruction 2"]
        assert [row["steer_id"] for row in steer_store.steers_of(ledger, root)] == ["s-first", "s-second", "s-third"]
    finally:
        ledger.close()


def test_a_fork_is_refused_while_a_delegated_run_under_an_ended_turn_still_lives(tmp_path: Path) -> None:
    """Seed 004 V1.14: a fork copies only what is persisted, so it waits while any run
    of the conversation's swarm still moves: here the turn's root has ended but the
    specialist it delegated to is still running. Once that run ends, the fork goes."""
    from corral.supervisor.errors import SupervisorError
    from corral.supervisor.interactive import interactive_store
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
    from corral.supervisor.runs import run_store

    ledger = SqliteLedger(tmp_path / "l.db")
    try:
        config: dict[str, Any] = {"script": {"steps": []}}
        conversation = interactive_store.new_conversation(ledger, "boss")
        root = run_store.create_run(ledger, NO_FEATURES, agent_id="boss", task="t", provider="scripted",
                                    provider_config=config, conversation_id=conversation)
        worker = run_store.create_run(ledger, NO_FEATURES, agent_id="w", task="t", provider="scripted",
                                      provider_config=config, kind="delegation", parent_run_id=root,
                                      root_run_id=root, depth=1)
        run_store.set_run_status(ledger, root, run_store.RunStatus.RUNNING, NO_FEATURES)
        run_store.set_run_status(ledger, root, run_store.RunStatus.COMPLETED, NO_FEATURES)
        run_store.set_run_status(ledger, worker, run_store.RunStatus.RUNNING, NO_FEATURES)
        assert interactive_store.fork_blockers(ledger, conversation) == [
            f"run {root} has a live delegation run {worker} (running)"]
        with pytest.raises(SupervisorError, match=f"live delegation run {worker}"):
            interactive_store.fork(ledger, conversation)
        run_store.set_run_status(ledger, worker, run_store.RunStatus.COMPLETED, NO_FEATURES)
        forked = interactive_store.fork(ledger, conversation)
        assert forked["forked_from"] == conversation
    finally:
        ledger.close()


def test_a_steer_joins_its_conversation_once_so_later_turns_and_forks_see_it(tmp_path: Path) -> None:
    """Seed 004 V1.13: the steer is persisted to the conversation with a deterministic
    message id ("conversation 使用由完整身份派生的确定性 messageId"), exactly once: a strict
    re-audit saw a steer typed in the chat applied to its run but missing from /history
    and from the next turn's "Conversation so far"."""
    from corral.supervisor.interactive import interactive_store, steer_store
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
    from corral.supervisor.runs import run_store

    ledger = SqliteLedger(tmp_path / "l.db")
    try:
        conversation = interactive_store.new_conversation(ledger, "a")
        run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="a", task="t", provider="scripted",
                                      provider_config={"script": {"steps": []}}, conversation_id=conversation)
        run_store.set_run_status(ledger, run_id, run_store.RunStatus.RUNNING, NO_FEATURES)
        for _ in range(2):  # the same steer again (a retried CLI call): one message
            steer_store.record_steer(ledger, run_id, "use tabs, not spaces", NO_FEATURES, steer_id="s-tabs")
        (turn,) = interactive_store.turns(ledger, conversation)
        assert [(m["message_id"], m["role"], m["kind"], m["text"]) for m in turn["messages"]] == [
            ("msg-s-tabs-steer", "user", "steer", "use tabs, not spaces")]
    finally:
        ledger.close()


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


# -- a steer interrupts the provider turn in flight (seed 004 V1.13) -------------------------------

LLM_SPEC = """
[project]
root = "ws"
[[agents]]
id = "llm"
provider = "openai"
[agents.openai]
base_url = "{url}"
model = "fake-model"
timeout_s = 60
"""


def test_a_steer_interrupts_the_provider_turn_in_flight_and_a_kill_then_loses_nothing(short_tmp: Path) -> None:
    """The turn is held at the server; the steer interrupts it (recorded
    ``interrupted``, never retried), the supervisor is SIGKILLed right after, and the
    restarted one applies the steer: one new turn, no request sent twice."""
    from fake_openai import FakeOpenAIServer, Reply, completion
    from loopback_http import serve_in_thread

    steered = completion('{"final": "steered reply", "planUpdate": null}')
    server = FakeOpenAIServer([Reply(hang=True), Reply(body=steered)])
    (short_tmp / "ws").mkdir()
    env = {"OPENAI_API_KEY": "sk-test", "CORRAL_FAILPOINTS": "steer.after-interrupt=kill@once"}
    with serve_in_thread(server) as url, running(short_tmp / "home", LLM_SPEC.replace("{url}", url), env) as daemon:
        run_id: str = daemon.call("run", agent_id="llm", task="plan the release")["run_id"]
        daemon.wait_until(lambda _: len(server.requests) == 1, what="the provider turn in flight")
        pid = daemon.endpoint.pid
        # Its reply may die with the supervisor.
        cli(daemon.home, "steer", run_id, "--stdin", stdin="answer briefly instead")
        assert wait_exit(pid, 10), "the supervisor is killed once the interrupted turn is recorded"
        daemon.up()
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "steered reply"
        assert len(server.requests) == 2, "the interrupted turn was never sent again"
        turns = ledger_rows(daemon.home, "SELECT loop_index, status, provider_interrupted FROM provider_requests"
                            " WHERE run_id = ? ORDER BY started_at", run_id)
        assert [(t["loop_index"], t["status"], t["provider_interrupted"]) for t in turns] == [
            (0, "interrupted", 1), (1, "completed", 0)]
        (steer,) = ledger_rows(daemon.home, "SELECT applied_loop FROM steers WHERE run_id = ?", run_id)
        assert steer["applied_loop"] == 1
        kinds = {event["kind"] for event in daemon.events() if event["subject"] == run_id}
        assert "provider-request-failed" not in kinds and "run-waiting-for-provider-retry" not in kinds

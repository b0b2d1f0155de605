"""``corral chat`` in a real terminal (a pty, driven by pexpect): turns, approvals
with a key, questions, the slash commands, --json, a supervisor restart in the
middle of the conversation, and the one ``[turn.report]`` each turn ends with,
validated against its JSON Schema (seed 004 V1.15)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pexpect
import pytest

from tests.harness import Daemon, cli, ledger_rows, running

SCHEMA = json.loads((Path(__file__).parent.parent / "docs" / "schemas" / "swarm-turn-report.v1.json").read_text())
REPORT = r"\[turn\.report\] (\{[^\r\n]*\})"

CHAT_SPEC = """
name = "chat"
[project]
root = "ws"
[[agents]]
id = "project-supervisor"
  [[agents.steps]]
  when_task = "colour"
    [[agents.steps.actions]]
    tool = "user.input_request"
      [[agents.steps.actions.input.questions]]
      id = "colour"
      header = "Colour"
      question = "Which colour?"
      options = [{ label = "red", description = "warm" }, { label = "blue", description = "cool" }]
  [[agents.steps]]
  when_task = "colour"
  final = "painted it"
  [[agents.steps]]
  unless_task = "colour"
  actions = [{ tool = "fs.write", input = { path = "hello.txt", content = "hi" } }]
  [[agents.steps]]
  unless_task = "colour"
  final = "wrote hello.txt"
[policy]
"fs.write" = "confirm"
"""
TIMEOUT = 60


def _spawn(daemon: Daemon, *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        sys.executable,
        ["-m", "corral", "--home", str(daemon.home), "chat", *args],
        encoding="utf-8",
        timeout=TIMEOUT,
        env={**os.environ, "TERM": "dumb"},
        dimensions=(40, 200),
    )
    child.expect(r"session (conv-[0-9a-f]+)")
    return child


def _close(child: pexpect.spawn) -> None:
    if child.isalive():
        child.sendline("/quit")
        child.expect(pexpect.EOF)
        assert "[turn.report]" not in child.before  # /quit never makes up a report
    child.close()
    assert child.exitstatus == 0, child.before


def _report(child: pexpect.spawn, **expected: Any) -> dict[str, Any]:
    """The next turn report the chat prints: valid against the schema, and as expected."""
    child.expect(REPORT)
    report: dict[str, Any] = json.loads(child.match.group(1))
    jsonschema.Draft202012Validator(SCHEMA).validate(report)
    assert {key: report[key] for key in expected} == expected, report
    return report


def test_chat_in_a_terminal_turns_approvals_questions_and_a_restart(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", CHAT_SPEC) as daemon:
        child = _spawn(daemon)
        conversation = child.match.group(1)
        try:
            child.sendline("/help")
            child.expect("/history")
            child.sendline("hello there")
            child.expect(r"approve act-[0-9a-f]+: fs\.write\(.*hello\.txt\)\s+\[y/n\]")
            # An approval is part of the turn: no report until it is decided (seed 004
            # V1.15: a turn settles only when nothing is waiting-for-confirmation).
            child.sendline("/compact")
            child.expect(r"\[compaction requested for (run-[0-9a-f]+)")
            run_id = child.match.group(1)
            child.sendline("y")
            child.expect(r"\[approved act-")
            assert "[turn.report]" not in child.before
            child.expect("agent> wrote hello.txt")
            done = _report(child, outcome="settled", run_status="completed", run_id=run_id,
                           conversation_id=conversation, agent_id="project-supervisor",
                           new_assistant_messages=1, final_reply_chars=len("wrote hello.txt"),
                           reconciliation_agents=0)
            assert done["runtimes"] == {"busy": 0, "idle": 1}
            assert "hello" not in json.dumps(done) and "ws" not in json.dumps(done)  # counts and ids only
            child.sendline("/history")
            child.expect("you> hello there")
            child.expect("agent> wrote hello.txt")
            child.sendline("please pick a colour")
            child.expect(r"agent asks>\s+\[Colour\] Which colour\?.*1\. red - warm\s+2\. blue - cool")
            _report(child, outcome="waiting-for-person", run_status="needs-input")
            child.sendline("/status")
            child.expect("live run: run-.* needs-input")
            # The supervisor dies in the middle of the conversation and comes back.
            daemon.kill_supervisor()
            child.expect(r"\[the supervisor is gone; reconnecting")
            daemon.up()
            child.expect(r"\[reconnected\]")
            child.sendline("blue")
            child.expect(r"\[answer recorded\]")
            child.expect("agent> painted it")
            _report(child, outcome="settled", run_status="completed", final_reply_chars=len("painted it"))
            child.sendline("/history")
            child.expect("you> please pick a colour")
            child.expect("agent> painted it")
            child.sendline("/goal status")
            child.expect(r"goal of run-[0-9a-f]+: \(no goal\)")
            child.sendline("/goal edit")
            child.expect(r"usage: /goal")
            child.sendline("/goal pause")  # a clear refusal from the supervisor, never a traceback
            child.expect(r"conflict: run run-[0-9a-f]+ has no goal")
            child.sendline("/compact")
            child.expect("no live run to compact")
            child.sendline("/mcp")
            child.expect(r"no MCP servers")
            child.sendline("/agents")
            child.expect(r"project-supervisor\s+running")
            child.sendline("/nonsense")
            child.expect("unknown command /nonsense")
            supervisor = daemon.call("ping")["pid"]
        finally:
            _close(child)
        # Leaving the chat leaves the supervisor running.
        assert daemon.call("ping")["pid"] == supervisor
        os.kill(supervisor, 0)
        assert (short_tmp / "ws" / "hello.txt").read_text() == "hi"
        runs = ledger_rows(daemon.home, "SELECT status FROM runs WHERE conversation_id = ?", conversation)
        assert [r["status"] for r in runs] == ["completed", "completed"]
        # The same session can be picked up again, with its history.
        again = _spawn(daemon, "--session", conversation)
        try:
            again.sendline("/history")
            again.expect("agent> painted it")
        finally:
            _close(again)
        assert conversation in cli(daemon.home, "chat", "--list").stdout


SWARM_SPEC = """
name = "chat-swarm"
[project]
root = "ws"
[[agents]]
id = "project-supervisor"
role = "root"
  [[agents.steps]]
  actions = [{ tool = "agent.delegate", input = { agent_id = "w", task = "write the notes" } }]
  [[agents.steps]]
  actions = [{ tool = "agent.run_status", input = {} }]
  [[agents.steps]]
  final = "summed up"
[[agents]]
id = "w"
role = "specialist"
  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "notes.txt", content = "n" } }]
  [[agents.steps]]
  final = "w done"
[policy]
"fs.write" = "confirm"
"""


def test_a_specialists_approval_is_shown_and_decided_in_the_chat(short_tmp: Path) -> None:
    """Seed 004 V1.15: "确认动作在终端显示 Agent、run、action、tool 和安全摘要，并接受 approve / reject…
    不能要求回到开发窗口", and the delegation, its source and its receipt are shown ("委派来源、
    父 Agent、delegationId…join / receipt 事件"). A strict re-audit saw a delegated
    specialist's write wait while the chat said "nothing waits for approval"."""
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", SWARM_SPEC) as daemon:
        child = _spawn(daemon)
        try:
            child.sendline("write the notes, please")
            child.expect(r"\[delegation ([\w-]+) -> w \(parent project-supervisor, run (run-[0-9a-f]+)\)\]")
            delegation, parent = child.match.group(1), child.match.group(2)
            child.expect(r"fs\.write .*run (run-[0-9a-f]+)\s+agent w")
            specialist = child.match.group(1)
            assert specialist != parent
            child.expect(r"approve act-[0-9a-f]+: fs\.write\(.*notes\.txt\)\s+\[y/n\]")
            child.sendline("y")
            child.expect(r"\[approved act-")
            assert "[turn.report]" not in child.before and "nothing waits for approval" not in child.before
            child.expect(rf"\[delegation run {specialist} of w: completed\]")
            child.expect(rf"\[receipt of delegation {delegation}: [\w-]+ -> parent run {parent}\]")
            child.expect("agent> summed up")
            report = _report(child, outcome="settled", run_status="completed", run_id=parent)
            assert report["children"] == {"total": 1, "live": 0}
        finally:
            _close(child)
    assert (short_tmp / "ws" / "notes.txt").read_text() == "n"


def test_the_chat_says_plainly_when_a_run_or_an_action_needs_reconciliation(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 004 V1.15: "失败、取消和 reconciliation 要明确显示": the run's and the action's
    ``needs-reconciliation`` each get their own line, naming what and how to decide it."""
    from corral.cli.chat import Chat

    chat = Chat(None, "conv-1", as_json=False)  # type: ignore[arg-type]  # no call is made for these events
    chat.show_event({"kind": "action-needs-reconciliation", "subject": "act-1", "data": {"run": "run-1"}})
    chat.show_event({"kind": "run-needs-reconciliation", "subject": "run-1", "data": {"reason": "outcome unknown"}})
    shown = capsys.readouterr().out
    assert "! act-1 needs reconciliation" in shown and "corral reconcile act-1" in shown
    assert "! run run-1 needs reconciliation: outcome unknown" in shown


def test_chat_json_prints_one_object_per_turn_event(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", CHAT_SPEC) as daemon:
        result = subprocess.run(
            [sys.executable, "-m", "corral", "--home", str(daemon.home), "chat", "--json"],
            input="please pick a colour\n",
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        events = [json.loads(line) for line in result.stdout.splitlines()]
        kinds = [event["event"] for event in events]
        assert kinds[0] == "session" and "turn" in kinds and "question" in kinds
        question = next(event for event in events if event["event"] == "question")
        assert [o["label"] for o in question["request"]["questions"][0]["options"]] == ["red", "blue"]
        # The end of input waited for the turn to settle: one report, the last object.
        assert kinds.count("turn.report") == 1 and kinds[-1] == "turn.report"
        report = events[-1]["report"]
        jsonschema.Draft202012Validator(SCHEMA).validate(report)
        assert (report["outcome"], report["run_status"]) == ("waiting-for-person", "needs-input")
        assert events[-1]["text"] == "[turn.report] " + json.dumps(report, sort_keys=True, separators=(",", ":"))
        bad = cli(daemon.home, "chat", "no-such-agent")
        assert bad.returncode != 0 and "no-such-agent" in bad.stderr


def test_the_turn_report_waits_for_children_and_receipts_and_names_reconciliation() -> None:
    from corral.supervisor.interactive.turn_report import build

    root = {"run_id": "run-1", "agent_id": "boss", "status": "waiting-for-join"}
    child = {"run_id": "run-2", "agent_id": "helper", "status": "running"}
    moving = build("conv-1", root, [root, child], [("helper", "executing", "running")], None)
    assert not moving.settled and moving.report["runtimes"] == {"busy": 2, "idle": 0}
    assert moving.report["children"] == {"total": 1, "live": 1}
    confirming = build("conv-1", root, [root, {**child, "status": "waiting-confirmation"}],
                       [("helper", "waiting-confirmation", "waiting-confirmation")], None)
    assert not confirming.settled  # an approval is decided within the turn
    asks = build("conv-1", root, [root, {**child, "status": "needs-input"}], [("helper", "executing", "needs-input")],
                 None)
    assert asks.settled and asks.report["outcome"] == "waiting-for-person"  # a question's action waits with it
    done = {**root, "status": "completed"}
    receipt_due = build("conv-1", done, [done, {**child, "status": "completed"}], [("boss", "approved", "completed")],
                        "ok")
    assert not receipt_due.settled  # an approved action has no receipt yet
    stuck = build("conv-1", done, [done, {**child, "status": "completed"}],
                  [("helper", "needs-reconciliation", "completed")], "ok")
    assert stuck.settled and stuck.report["outcome"] == "needs-reconciliation"
    assert stuck.report["reconciliation_agents"] == 1 and stuck.report["final_reply_chars"] == 2
    jsonschema.Draft202012Validator(SCHEMA).validate(stuck.report)
    with pytest.raises(jsonschema.ValidationError):  # the schema admits nothing else (no text, no path)
        jsonschema.Draft202012Validator(SCHEMA).validate({**stuck.report, "reply": "ok"})


PLAN_SPEC = """
name = "chat"
[project]
root = "ws"
[[agents]]
id = "project-supervisor"
  [[agents.steps]]
  actions = [{ tool = "fs.list", input = { path = "." } }]
  planUpdate = { explanation = "zq-internal why", steps = [
    { step = "survey", status = "completed" }, { step = "write the draft", status = "in_progress" },
    { step = "check it", status = "pending" }] }
  [[agents.steps]]
  final = "all done"
  planUpdate = { explanation = "zq-internal done", steps = [
    { step = "write the draft", status = "completed" }, { step = "check it", status = "completed" }] }
"""


def test_the_chat_shows_a_compact_plan_summary_and_nothing_internal(short_tmp: Path) -> None:
    """Seed 004 V1.17: "正式用户的 Project Supervisor 聊天只展示紧凑摘要：已完成数/总数、当前步骤、等待对象、
    下一步和当前专业 Agent 协作数量。不得展示 planRevision、内部 explanation、完整步骤列表"."""
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", PLAN_SPEC) as daemon:
        result = subprocess.run(
            [sys.executable, "-m", "corral", "--home", str(daemon.home), "chat", "--json"],
            input="write the notes\n", capture_output=True, text=True, timeout=TIMEOUT, check=False,
        )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    plans = [event for event in events if event["event"] == "plan"]
    assert [(p["completed"], p["total"]) for p in plans] == [(1, 3), (3, 3)], plans
    # The step by its title, or by its number when the plan moved on before the chat read it.
    assert (plans[0]["current"], plans[0]["next"]) in (("write the draft", "check it"), ("step 2", "step 3"))
    assert plans[1]["current"] is None and plans[1]["next"] is None
    assert plans[0]["text"] == (f"  [plan: 1/3 completed; now: {plans[0]['current']}; next: {plans[0]['next']};"
                                " specialists: 0]")
    assert "zq-internal" not in result.stdout and "revision" not in json.dumps(plans), "no explanation, no revision"
    assert "survey" not in json.dumps(plans), "no full step list"

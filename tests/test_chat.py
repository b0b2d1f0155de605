"""``corral chat`` in a real terminal (a pty, driven by pexpect): turns, approvals
with a key, questions, /history and /steer, --json, and a supervisor restart in
the middle of the conversation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pexpect

from tests.harness import Daemon, cli, ledger_rows, running

CHAT_SPEC = """
name = "chat"
[project]
root = "ws"
[[agents]]
id = "project-supervisor"
  [[agents.steps]]
  when_task = "colour"
  actions = [{ tool = "user.input_request", input = { question = "Which colour?", options = ["red", "blue"] } }]
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
    child.close()
    assert child.exitstatus == 0, child.before


def test_chat_in_a_terminal_turns_approvals_questions_and_a_restart(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", CHAT_SPEC) as daemon:
        child = _spawn(daemon)
        conversation = child.match.group(1)
        try:
            child.sendline("/help")
            child.expect("/history")
            child.sendline("hello there")
            child.expect(r"approve fs\.write\(.*hello\.txt\)\s+\[y/n\]")
            child.sendline("y")
            child.expect(r"\[approved act-")
            child.expect("agent> wrote hello.txt")
            child.sendline("/history")
            child.expect("you> hello there")
            child.expect("agent> wrote hello.txt")
            child.sendline("please pick a colour")
            child.expect(r"agent asks> Which colour\?\s+\(red / blue\)")
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
            child.sendline("/history")
            child.expect("you> please pick a colour")
            child.expect("agent> painted it")
            child.sendline("/nonsense")
            child.expect("unknown command /nonsense")
        finally:
            _close(child)
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
        assert question["options"] == ["red", "blue"]
        bad = cli(daemon.home, "chat", "no-such-agent")
        assert bad.returncode != 0 and "no-such-agent" in bad.stderr

"""The live status line of ``corral run --wait`` (corral/cli/progress.py): the pure
reducer over a recorded event sequence, the supervisor's in-memory progress
reports, and one real run in a terminal (a pty, driven by pexpect) whose final
output is what a non-terminal run prints."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, cast

import pexpect
import pytest

from corral.cli import progress
from corral.client_types import Event
from corral.mailbox.protocol import ProtocolError, ReplyDelta, decode
from corral.supervisor.interactive.reply_stream_service import MAX_PROGRESS_RUNS, ReplyStreamService
from tests.harness import cli, running

ROOT = "run-aaaaaaaaaaaaaaaaaaaaaaaaa"
CHILD = "run-child-111111111111"
DELEGATE = "run-222222222222"
OTHER = "run-333333333333"
T0 = 1_796_440_000.0


def _event(at: float, kind: str, subject: str, **data: Any) -> Event:
    return Event.from_row({"cursor": 0, "kind": kind, "subject": subject, "at": T0 + at, "data": data})


def _report(at: float, slot: str, tokens: int, first_at: float, first_tokens: int) -> Event:
    """A provider progress report as ``progress_events`` makes it from the supervisor's answer."""
    reply = {"progress": {ROOT: {"slot": slot, "tokens": tokens, "at": T0 + at,
                                 "first_at": T0 + first_at, "first_tokens": first_tokens}}}
    (event,) = progress.progress_events(reply)
    return event


# A run as the event stream records it (kinds and data as the supervisor writes them),
# with provider progress reports in between.
RECORDED = [
    _event(0.0, "run-created", ROOT, agent="project-supervisor", run_kind="root", task="Prepare the launch plan"),
    _event(0.1, "run-running", ROOT, previous="pending", reason=""),
    _event(0.2, "provider-request-started", ROOT, attempt=0, slot=f"{ROOT}:0"),
    _report(2.0, f"{ROOT}:0", 1, 2.0, 1),
    _report(6.0, f"{ROOT}:0", 41, 2.0, 1),
    _event(6.5, "provider-response-committed", ROOT, chars=300, slot=f"{ROOT}:0"),
    _event(6.5, "plan-committed", ROOT, actions=2, final=False, loop=0),
    _event(6.6, "action-executing", "act-1", reason="", run=ROOT, tool="agent.delegate"),
    _event(6.6, "run-created", DELEGATE, agent="researcher", run_kind="delegation", task="Survey"),
    _event(6.6, "delegated", "dlg-2", parent_run=ROOT, repair_of="", target="researcher"),
    _event(6.7, "run-running", DELEGATE, previous="pending", reason=""),
    _event(6.7, "run-running", OTHER, previous="pending", reason=""),  # another run, not a child
    _event(6.8, "action-ok", "act-1", reason="", run=ROOT, tool="agent.delegate"),
    _event(6.9, "action-executing", "act-2", reason="", run=ROOT, tool="agent.spawn_isolated"),
    _event(7.0, "group-spawned", "grp-1", children=1, parent_run=ROOT),
    _event(7.1, "run-running", CHILD, previous="pending", reason=""),
    _event(7.2, "run-completed", DELEGATE, previous="running", reason=""),
    _event(7.3, "run-waiting-for-join", ROOT, previous="running", reason="1 group(s) still running"),
]
SHOWN = {"swarm": {"delegations": [{"run_id": DELEGATE}], "groups": [{"children": [{"run_id": CHILD}]}]}}


def _replay(events: list[Event]) -> progress.RunProgress:
    view = progress.RunProgress(ROOT)
    for event in events:
        view = progress.reduce(view, event)
        if progress.adds_children(view, event):
            view = progress.with_children(view, SHOWN)
    return view


def test_the_reducer_follows_state_step_tool_tokens_and_children() -> None:
    assert progress.status_line(_replay(RECORDED[:3])) == "running · step 0 · model reading the prompt"
    generating = _replay(RECORDED[:5])
    assert generating.state == "running" and generating.task == "Prepare the launch plan"
    assert generating.generation is not None and generating.generation.tokens == 41
    # 40 tokens between the first report (t=2) and this one (t=6): from the events' times.
    assert generating.generation.tokens_per_s == pytest.approx(10.0)
    assert progress.status_line(generating) == "running · step 0 · model generating: 41 tokens, 10.0 tokens/s"

    view = _replay(RECORDED)
    assert view.state == "waiting-for-join" and not view.settled
    assert (view.tool, view.tool_phase) == ("agent.spawn_isolated", "executing")
    assert view.children == (DELEGATE, CHILD)
    assert view.child_states() == {"completed": 1, "running": 1}
    assert progress.status_line(view) == (
        "waiting-for-join · step 0 · tool agent.spawn_isolated executing · children 2: 1 completed, 1 running"
    )


def test_late_or_repeated_progress_reports_change_nothing() -> None:
    view = _replay(RECORDED[:6])  # the lifecycle's response is committed
    late = _report(7.0, f"{ROOT}:0", 60, 2.0, 1)
    assert progress.reduce(view, late) == view
    again = _replay(RECORDED[:5])
    assert progress.reduce(again, RECORDED[4]) == again
    # The next lifecycle starts from nothing; its first report gives no rate yet.
    view = progress.reduce(view, _event(8.0, "provider-request-started", ROOT, attempt=0, slot=f"{ROOT}:1"))
    view = progress.reduce(view, _report(9.0, f"{ROOT}:1", 3, 9.0, 3))
    assert view.generation is not None and view.generation.tokens == 3 and view.generation.tokens_per_s is None
    assert progress.status_line(view).endswith("model generating: 3 tokens")


def test_the_streamed_reply_is_kept_and_a_restart_clears_it() -> None:
    view = progress.RunProgress(ROOT)
    for event in (
        _event(1, "reply-delta", ROOT, slot="s0", seq=1, text="Hello wor"),
        _event(2, "reply-stream-restart", ROOT, previous="s0", slot="s1"),
        _event(3, "reply-delta", ROOT, slot="s1", seq=1, text="Hello "),
        _event(4, "reply-delta", ROOT, slot="s1", seq=2, text="world."),
        _event(5, "run-completed", ROOT, previous="running", reason=""),
    ):
        view = progress.reduce(view, event)
    assert view.reply == "Hello world." and view.settled


def test_tool_calls_are_shown_with_their_arguments_and_secrets_masked() -> None:
    secret = "AKIAQ3EGZXKP7RT2LMNB"
    line = progress.format_call("notify.send", {"channel": "ops", "text": f"key {secret}", "body": "x" * 100})
    assert line.startswith('notify.send(channel="ops", text="key ')
    assert secret not in line
    assert '"' + "x" * 59 + "…" in line


def _service() -> ReplyStreamService:
    return ReplyStreamService(cast(Any, None))


def test_the_supervisor_keeps_only_the_newest_report_per_run_in_memory() -> None:
    service = _service()
    service._progress_report(ROOT, "s0", 1)
    first = service.progress[ROOT]
    service._progress_report(ROOT, "s0", 9)
    kept = service.progress[ROOT]
    # A count, never the words: a plan's text stays out of every stream (seed 004 V1.19).
    assert set(kept) == {"slot", "tokens", "at", "first_at", "first_tokens"}
    assert (kept["tokens"], kept["first_tokens"], kept["first_at"]) == (9, 1, first["at"])
    service._progress_report(ROOT, "s1", 2)  # a new lifecycle: measured afresh
    assert service.progress[ROOT]["first_tokens"] == 2
    for index in range(MAX_PROGRESS_RUNS + 5):
        service._progress_report(f"run-{index:012x}", "s", index)
    assert len(service.progress) == MAX_PROGRESS_RUNS and ROOT not in service.progress
    # The report's shape is checked at the boundary (``ReplyDelta``): a count out of
    # range, not a count, or any words beside it never reach the service.
    report = {"method": "reply.delta", "params": {"run_id": ROOT, "slot": "s", "seq": 1, "text": ""}}
    assert decode(report) == ReplyDelta(ROOT, "s", 1, "")
    for bad in ({"tokens": -1}, {"tokens": True}, {"tokens": "3"}, {"tokens": 10**10},
                {"tokens": 9, "tail": '{"actions": [{"tool"'}):
        with pytest.raises(ProtocolError):
            decode({**report, "params": {**report["params"], **bad}})


SPEC = """
name = "progress"
[project]
root = "ws"
[[agents]]
id = "writer"
  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "notes.md", content = "hello" } }]
  [[agents.steps]]
  final = "wrote notes.md"
"""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_run_wait_on_a_terminal_shows_the_status_line_and_ends_as_without_one(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", SPEC) as daemon:
        child = pexpect.spawn(
            sys.executable,
            ["-m", "corral", "--home", str(daemon.home), "run", "--agent", "writer", "--task", "notes", "--wait"],
            encoding="utf-8",
            timeout=60,
            env={**os.environ, "TERM": "xterm"},
            dimensions=(40, 200),
        )
        child.expect(pexpect.EOF)
        child.close()
        screen = child.before.replace("\r\n", "\n").replace("\r", "\n")
        assert child.exitstatus == 0, screen
        run_id = re.search(r"^run (run-[0-9a-f]+) ", ANSI.sub("", screen), re.MULTILINE)
        assert run_id is not None, screen
        assert re.search(rf"{run_id.group(1)}  \w+ · step \d", screen), screen  # the status line was drawn
        # Without a terminal (and with --quiet): the result alone, as before.
        shown = cli(daemon.home, "show", run_id.group(1))
        assert shown.returncode == 0 and "final reply: wrote notes.md" in shown.stdout
        assert ANSI.sub("", screen).endswith(shown.stdout), screen
        plain = cli(daemon.home, "run", "--agent", "writer", "--task", "notes", "--wait")
        assert plain.returncode == 0 and "\x1b" not in plain.stdout + plain.stderr
        assert plain.stdout.startswith("run run-") and plain.stdout.endswith("final reply: wrote notes.md\n")
        # Without a terminal, stderr says the run id at once and each state change
        # (tests/test_actionable_errors.py); --quiet keeps only the run id.
        plain_id = plain.stdout.split()[1]
        assert plain.stderr.splitlines()[0].startswith(f"corral run: {plain_id} started"), plain.stderr
        assert f"corral run: {plain_id} completed" in plain.stderr
        quiet = cli(daemon.home, "run", "--agent", "writer", "--task", "notes", "--wait", "--quiet")
        assert quiet.returncode == 0 and len(quiet.stderr.splitlines()) == 1, quiet.stderr

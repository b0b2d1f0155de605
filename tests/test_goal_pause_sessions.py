"""A goal's pause ends the run's process sessions before it commits (seed 004 V1.18).

The seed: "Runner-owned process session 在暂停提交前终止，恢复后由 Agent 根据
observation 重规划，禁止按 PID 重连或重放未知 start" (the run's process sessions
are terminated before the pause commits; after the resume the agent plans again
from what it observed, never reattaching by pid or replaying a start).

Everything is real: the supervisor, the agent, one session actor per process, the
process itself (bubblewrap where this host runs it). The order is read from the
ledger: the session's terminal event comes before the goal's ``goal-paused``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil

from tests.harness import Daemon, cli, ledger_rows, running, wait_run
from tests.test_process_sessions import PID, SANDBOX_TABLE, call

SLEEPER = "echo ready; exec sleep 117"
#: Prints nothing: a poll of it waits its whole wait_ms.
QUIET_SLEEPER = "exec sleep 117"


def _spec(steps: str) -> str:
    return f"""
[project]
root = "ws"
{SANDBOX_TABLE}
[[agents]]
id = "writer"
[agents.policy]
"fs.write" = "confirm"
{steps}
"""


# Loop 0 starts the process; loop 1 parks for a person on a write.
PARKED = f"""
[[agents.steps]]
actions = [{call("process.start", SLEEPER)}]
[[agents.steps]]
actions = [{{ tool = "fs.write", input = {{ path = "page.md", content = "draft" }} }}]
[[agents.steps]]
actions = [{{ tool = "goal.verdict", input = {{ met = true, evidence = "written after the resume" }} }}]
[[agents.steps]]
final = "done"
"""

# Loop 0 starts the process; loop 1 polls it for a long while (the run holds its lane).
POLLING = f"""
[[agents.steps]]
actions = [{call("process.start", QUIET_SLEEPER)}]
[[agents.steps]]
actions = [{{ tool = "process.poll", input = {{ process_id = {PID}, wait_ms = 25000 }} }}]
[[agents.steps]]
actions = [{{ tool = "goal.verdict", input = {{ met = true, evidence = "polled" }} }}]
[[agents.steps]]
final = "done"
"""


def _sleepers() -> list[psutil.Process]:
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.cmdline() == ["sleep", "117"]:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _sessions(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(daemon.home, "SELECT process_id, state FROM sessions WHERE run_id = ?", run_id)


def _cursor(daemon: Daemon, kind: str, subject: str) -> int:
    rows = ledger_rows(daemon.home, "SELECT cursor FROM events WHERE kind = ? AND subject = ? ORDER BY cursor",
                       kind, subject)
    assert len(rows) == 1, (kind, subject, rows)
    return int(rows[0]["cursor"])


def _wait_session_running(daemon: Daemon, run_id: str) -> str:
    def running_one(_: Any) -> bool:
        # The row says running once the launch is recorded; the program may still be
        # the trampoline for a moment (its exec comes after): wait for both.
        return [row["state"] for row in _sessions(daemon, run_id)] == ["running"] and len(_sleepers()) == 1

    daemon.wait_until(running_one, what="the process session running")
    (row,) = _sessions(daemon, run_id)
    return str(row["process_id"])


def _ended_before_the_pause(daemon: Daemon, run_id: str, process_id: str) -> None:
    (row,) = _sessions(daemon, run_id)
    assert row["state"] == "terminated", row
    assert _sleepers() == [], "the process itself is gone"
    ended = _cursor(daemon, "session-terminated", process_id)
    goal_id = ledger_rows(daemon.home, "SELECT goal_id FROM goals WHERE run_id = ?", run_id)[0]["goal_id"]
    paused = ledger_rows(daemon.home, "SELECT cursor, data FROM events WHERE kind = 'goal-paused' AND subject = ?",
                         run_id)
    assert len(paused) == 1 and json.loads(paused[0]["data"])["goal"] == goal_id
    assert ended < int(paused[0]["cursor"]), "the session ended before the pause committed"


def test_a_pause_of_a_parked_run_ends_its_process_sessions_before_it_commits(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "h", _spec(PARKED)) as daemon:
        run_id: str = daemon.call("run", agent_id="writer", goal="draft the page")["run_id"]
        write = wait_run(daemon, run_id, {"waiting-confirmation"})["actions"][-1]
        process_id = _wait_session_running(daemon, run_id)

        paused = daemon.call("goal.pause", run_id=run_id)
        assert paused["status"] == "paused"
        _ended_before_the_pause(daemon, run_id, process_id)
        assert paused["terminated_sessions"] == [process_id]

        # Resumed, the run goes on with what it observed; nothing is started again.
        assert daemon.call("goal.resume", run_id=run_id)["status"] == "active"
        assert cli(daemon.home, "approve", write["action_id"]).returncode == 0
        done = wait_run(daemon, run_id, {"completed", "failed", "needs-input", "needs-reconciliation"})
        assert done["run"]["status"] == "completed", done["run"]
        assert len(_sessions(daemon, run_id)) == 1


def test_a_pause_of_a_running_run_ends_its_process_sessions_before_it_parks(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "h", _spec(POLLING)) as daemon:
        run_id: str = daemon.call("run", agent_id="writer", goal="watch the process")["run_id"]
        process_id = _wait_session_running(daemon, run_id)
        daemon.wait_until(lambda _: bool(ledger_rows(
            daemon.home, "SELECT 1 FROM actions WHERE run_id = ? AND tool = 'process.poll' AND phase = 'executing'",
            run_id)), what="the long poll under way")

        answer = daemon.call("goal.pause", run_id=run_id)
        daemon.wait_until(lambda _: daemon.call("goal.status", run_id=run_id)["lifecycle"]["status"] == "paused",
                          what="the goal paused at the run's next boundary")
        assert wait_run(daemon, run_id, {"needs-input"})["run"]["status"] == "needs-input"
        _ended_before_the_pause(daemon, run_id, process_id)
        assert answer["terminated_sessions"] == [process_id]
        daemon.call("cancel", run_id=run_id)

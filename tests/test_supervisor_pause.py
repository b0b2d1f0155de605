"""Issue 48, B.4: a paused supervisor loses nothing.

The supervisor is SIGSTOPped (Ctrl-Z, a debugger, a cgroup freeze, a swap stall)
while an agent runs a command; the pause outlasts the stall timeout and the
command ends during it. The actors did nothing wrong: the silence was the
supervisor's. Once it runs again it must not kill the agent or the fork server,
and the command's outcome must be recorded (phase ``ok``, not
``needs-reconciliation``).

No wall-clock bet: the command waits for a file the test creates (an explicit
wake-up). The test waits until the supervisor is seen stopped, then until the
monotonic clock has moved past the stall timeout, then wakes the command, waits
until it said it is done, and only then sends SIGCONT.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral.sandbox.bwrap import bwrap_available
from corral.supervisor.tree.liveness import FORKSERVER, judge, pause_limit
from tests.harness import Daemon, actor_running, ledger_rows, running, show, wait_for

STALL_S = 3.0
SANDBOX_TABLE = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'
# Started, held until the test's wake-up, then done: each step a file in the workspace.
SCRIPT = ": > started; while [ ! -e go ]; do sleep 0.02; done; : > done"

SPEC = f"""
[supervisor]
stall_timeout_s = {STALL_S}
transport = "TRANSPORT"
[project]
root = "ws"
{SANDBOX_TABLE}
[[agents]]
id = "worker"
[[agents.steps]]
actions = [{{ tool = "command.exec", input = {{ program = "sh", args = ["-c", '{SCRIPT}'] }} }}]
[[agents.steps]]
final = "done"
"""


def _events(daemon: Daemon, kind: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events() if e["kind"] == kind]


def _settled(daemon: Daemon, run_id: str, timeout: float = 90) -> dict[str, Any]:
    """The run once it ended, or once an action of it lost its outcome (a run whose
    action needs reconciliation would wait for a person forever)."""
    deadline = time.monotonic() + timeout
    cursor = 0
    while True:
        shown = show(daemon, run_id)
        if shown["run"]["status"] in ("completed", "failed", "cancelled"):
            return shown
        if any(a["phase"] == "needs-reconciliation" for a in shown["actions"]):
            return shown
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"run {run_id} stuck in {shown['run']['status']}: {json.dumps(shown)[:1500]}"
        cursor = daemon.call("events", timeout=remaining + 5, since=cursor, wait_ms=int(min(remaining, 2) * 1000))[
            "cursor"
        ]


@pytest.mark.parametrize("transport", ["nng", "unix"])
def test_a_supervisor_stopped_past_the_stall_timeout_kills_nobody_and_loses_no_outcome(
    short_tmp: Path, transport: str
) -> None:
    workspace = short_tmp / "ws"
    workspace.mkdir()
    with running(short_tmp / "home", SPEC.replace("TRANSPORT", transport)) as daemon:
        agent_pid = daemon.actor("worker")["pid"]
        forkserver_pid = daemon.status()["forkserver"]["pid"]
        run_id = daemon.call("run", agent_id="worker", task="run the held command")["run_id"]
        wait_for("the command to start (its executing record committed)", (workspace / "started").exists)

        supervisor = psutil.Process(daemon.endpoint.pid)
        os.kill(supervisor.pid, signal.SIGSTOP)
        try:
            # SIGSTOP is asynchronous: the pause starts when the kernel says it stopped.
            wait_for("the supervisor to be stopped", lambda: supervisor.status() == psutil.STATUS_STOPPED)
            stopped_at = time.monotonic()  # the supervisor heard nothing from anyone since
            # The stall timeout passes while it is stopped: to a supervisor that reads its
            # clock on waking up, every actor looks silent past it. The agent's heartbeats
            # pile up unread in its link meanwhile, ahead of the outcome it sends next.
            wait_for("the stall timeout to pass", lambda: time.monotonic() > stopped_at + 1.5 * STALL_S)
            (workspace / "go").touch()
            wait_for("the command to end while the supervisor is stopped", (workspace / "done").exists)
            assert supervisor.status() == psutil.STATUS_STOPPED
        finally:
            os.kill(supervisor.pid, signal.SIGCONT)

        shown = _settled(daemon, run_id)
        (action,) = shown["actions"]
        assert action["tool"] == "command.exec"
        assert action["phase"] == "ok", action  # succeeded, its outcome recorded
        assert shown["run"]["status"] == "completed", shown["run"]

        # Nobody was killed for the supervisor's own silence.
        assert _events(daemon, "actor-stall-killed") == []
        assert _events(daemon, "forkserver-stall-killed") == []
        worker = daemon.actor("worker")
        assert (worker["pid"], worker["incarnation"], worker["restarts"]) == (agent_pid, 1, 0)
        assert ledger_rows(daemon.home, "SELECT restarts, incarnation FROM actors WHERE actor_id = ?", "worker") == [
            {"restarts": 0, "incarnation": 1}
        ]
        forkserver = daemon.status()["forkserver"]
        assert (forkserver["pid"], forkserver["replacements"]) == (forkserver_pid, 0)
        # The pause was seen for what it was, and said (a loaded machine may add short ones).
        gaps = [e["data"]["gap_s"] for e in _events(daemon, "supervisor-paused")]
        assert any(gap >= 1.5 * STALL_S - 0.1 for gap in gaps), gaps

        # It still judges stalls after a pause: an agent stopped now is killed and restarted.
        os.kill(agent_pid, signal.SIGSTOP)
        try:
            daemon.wait_until(actor_running("worker", incarnation=2), timeout=60, what="the stopped agent replaced")
        finally:
            if psutil.pid_exists(agent_pid):
                os.kill(agent_pid, signal.SIGCONT)
        assert [e["subject"] for e in _events(daemon, "actor-stall-killed")] == ["worker"]


def test_the_decision_judges_nobody_across_a_gap_in_its_own_loop() -> None:
    """The pure decision: a wake-up far past the loop's cadence is the supervisor's
    pause, and nobody is stalled by it; after the renewal, silence counts again."""
    timeout = 4.0
    limit = pause_limit(timeout)
    heard = {"a": 0.0, "b": 9.5, FORKSERVER: 0.0}
    # On time, a is silent past the timeout, b is not: a is stalled.
    on_time = judge(10.0 - limit / 2, 10.0, heard, timeout_s=timeout)
    assert not on_time.paused and on_time.stalled == {"a", FORKSERVER}
    assert set(on_time.quiet) == {"a", FORKSERVER}
    # The same silences after a gap in the loop: nobody is judged.
    late = judge(10.0 - limit - 0.01, 10.0, heard, timeout_s=timeout)
    assert late.paused and late.gap_s == pytest.approx(limit + 0.01)
    assert late.stalled == frozenset() and dict(late.quiet) == {}
    # Renewed at the pause's end: silence counts from there; past the timeout again, a stall.
    assert judge(10.5, 11.0, heard, timeout_s=timeout, renewed_at=10.0).quiet == {}
    later = {**heard, "b": 12.0}
    assert set(judge(12.5, 12.9, later, timeout_s=timeout, renewed_at=10.0).quiet) == {"a", FORKSERVER}
    assert judge(14.5, 14.9, {**later, "b": 14.0}, timeout_s=timeout, renewed_at=10.0).stalled == {"a", FORKSERVER}

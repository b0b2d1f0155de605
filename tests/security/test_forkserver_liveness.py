"""Issue 32, case 14: the fork server is supervised for liveness like every actor.

A real SIGSTOP: the fork server stops answering its probes, ``corral status`` says
degraded, the supervisor kills it (SIGKILL ends a stopped process) and starts a new
one; the spawn that waited on it goes to the new one, the actors that died with it
start again (without counting against their group), and runs go on. Waiting is on
status and events only: the supervisor's own stall timeout decides when, the test
never races it. A fork server that dies is replaced the same way (it used to take
the supervisor down with it)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import psutil

from tests.harness import Daemon, actor_running, running, wait_run

SPEC = """
[supervisor]
stall_timeout_s = 4
[project]
root = "ws"
[[actors]]
id = "echo"
template = "echo"
[[agents]]
id = "worker"
[[agents.steps]]
actions = [{ tool = "fs.list", input = { path = "." } }]
[[agents.steps]]
final = "done"
"""


def _kinds(daemon: Daemon) -> list[str]:
    return [e["kind"] for e in daemon.events() if e["kind"].startswith("forkserver-")]


def _forkserver(daemon: Daemon) -> int:
    """The fork server's pid, found among the supervisor's children (not by asking it)."""
    for child in psutil.Process(daemon.endpoint.pid).children():
        if "corral.sandbox.forkserver" in " ".join(child.cmdline()) or child.name().startswith("corral:fork"):
            return int(child.pid)
    raise AssertionError("no fork server among the supervisor's children")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _recovered_from(old: int) -> Any:
    def check(status: dict[str, Any]) -> bool:
        return (
            status["forkserver"]["pid"] not in (None, old)
            and status["degraded"] == ""
            and all(actor["status"] == "running" for actor in status["actors"])
        )

    return check


def test_a_stopped_fork_server_is_reported_killed_and_replaced(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", SPEC) as daemon:
        daemon.wait_until(actor_running("worker"), what="the agent running")
        stopped = _forkserver(daemon)
        os.kill(stopped, signal.SIGSTOP)
        try:
            # A restart now needs a spawn, which waits on the stopped fork server.
            os.kill(daemon.actor("echo")["pid"], signal.SIGKILL)
            daemon.wait_until(
                lambda s: any(a["id"] == "echo" and a["status"] != "running" for a in s["actors"]),
                what="the killed actor seen dead",
            )
            status = daemon.wait_until(lambda s: "fork server" in s["degraded"], what="status: degraded")
            assert f"pid {stopped}" in status["degraded"] and "no actor can start" in status["degraded"]

            status = daemon.wait_until(_recovered_from(stopped), what="a new fork server, the actors back")
            assert status["forkserver"]["replacements"] == 1
            assert _gone(stopped)  # killed, stopped as it was, and reaped by the supervisor
        finally:
            if not _gone(stopped):
                os.kill(stopped, signal.SIGCONT)
                os.kill(stopped, signal.SIGKILL)
        assert _kinds(daemon) == ["forkserver-stalled", "forkserver-stall-killed", "forkserver-recovered"]
        # The actors that died with it were started again without counting as crashes.
        assert {g["id"]: g["status"] for g in status["groups"]} == {"root": "running"}
        assert daemon.actor("echo")["incarnation"] >= 2 and daemon.actor("worker")["incarnation"] == 2
        run_id = daemon.call("run", agent_id="worker", task="after the replacement")["run_id"]
        assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"

        # A fork server that dies is replaced too, and the supervisor lives on.
        supervisor = daemon.endpoint.pid
        second = status["forkserver"]["pid"]
        os.kill(second, signal.SIGKILL)
        status = daemon.wait_until(_recovered_from(second), what="the dead fork server replaced")
        assert status["forkserver"]["replacements"] == 2 and status["pid"] == supervisor
        assert status["forkserver"]["pid"] == _forkserver(daemon)
        run_id = daemon.call("run", agent_id="worker", task="after the second one")["run_id"]
        assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"

"""Issue 14, items 10-11: stopped processes are noticed (heartbeats and a stall
watchdog; exits seen without the fork server), and long polls cannot starve the
control API."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import psutil

from corral import client
from tests.harness import Daemon, actor_running, running, wait_run

SPEC = """
[supervisor]
stall_timeout_s = 2
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
[[actors]]
id = "echo"
template = "echo"
[[agents]]
id = "worker"
[[agents.steps]]
actions = [{ tool = "effect.barrier", input = { name = "slow", parties = 2, timeout_ms = 5000 } }]
[[agents.steps]]
final = "done"
"""


def _events(daemon: Daemon, kind: str, subject: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events() if e["kind"] == kind and e["subject"] == subject]


def test_a_busy_agent_keeps_beating_and_a_stopped_one_is_killed_and_restarted(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", SPEC) as daemon:
        # Busy: a tool call that lasts longer than the stall timeout is not a stall.
        run_id = daemon.call("run", agent_id="worker", task="wait at the barrier")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        assert shown["actions"][0]["phase"] == "failed"  # the barrier timed out after 5 s
        assert _events(daemon, "actor-stall-killed", "worker") == []
        assert daemon.actor("worker")["incarnation"] == 1

        # Stopped: no heartbeat; reported as stalled, then killed and restarted.
        pid = daemon.actor("worker")["pid"]
        os.kill(pid, signal.SIGSTOP)
        try:
            daemon.wait_until(
                lambda s: any(a["id"] == "worker" and a["stalled_s"] is not None for a in s["actors"]),
                timeout=30,
                what="the stopped agent reported as stalled",
            )
            daemon.wait_until(actor_running("worker", incarnation=2), timeout=30, what="the agent restarted")
        finally:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGCONT)
        assert len(_events(daemon, "actor-stall-killed", "worker")) == 1
        assert daemon.actor("worker")["restarts"] == 1
        again = daemon.call("run", agent_id="worker", task="after the restart")["run_id"]
        assert wait_run(daemon, again, {"completed", "failed"})["run"]["status"] == "completed"
        assert daemon.actor("echo")["incarnation"] == 1  # nobody else was touched


def _forkserver(daemon: Daemon) -> psutil.Process:
    supervisor = psutil.Process(daemon.endpoint.pid)
    for child in supervisor.children():
        if "forkserver" in " ".join(child.cmdline()) or child.name().endswith("forkserver"):
            return child
    raise AssertionError("no fork server among the supervisor's children")


def test_a_dead_actor_is_seen_dead_while_the_fork_server_is_stopped(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", SPEC.replace("stall_timeout_s = 2", "stall_timeout_s = 60")) as daemon:
        forkserver = _forkserver(daemon)
        echo_pid = daemon.actor("echo")["pid"]
        forkserver.suspend()
        try:
            os.kill(echo_pid, signal.SIGKILL)
            daemon.wait_until(
                lambda s: any(a["id"] == "echo" and a["status"] != "running" for a in s["actors"]),
                timeout=20,
                what="the killed actor seen as not running while its parent is stopped",
            )
        finally:
            forkserver.resume()
        daemon.wait_until(actor_running("echo", incarnation=2), timeout=30, what="echo restarted")


def test_long_polls_do_not_starve_the_control_api(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", SPEC) as daemon:
        cursor = daemon.status()["cursor"] + 10_000  # nothing will reach it: every poll waits its full time
        stop = threading.Event()
        errors: list[BaseException] = []

        def follow() -> None:
            while not stop.is_set():
                try:
                    client.call(daemon.home, "events", timeout=40, since=cursor, wait_ms=30_000)
                except BaseException as exc:
                    if not stop.is_set():
                        errors.append(exc)
                    return

        followers = [threading.Thread(target=follow, daemon=True) for _ in range(50)]
        for thread in followers:
            thread.start()
        try:
            # Every follower is parked in a long poll now or soon; the API still answers.
            for _ in range(20):
                assert daemon.call("ping", timeout=10)["pong"] is True
            run_id = daemon.call("run", agent_id="worker", task="while 50 clients follow", timeout=10)["run_id"]
            assert daemon.call("show", run_id=run_id, timeout=10)["run"]["run_id"] == run_id
            assert errors == []
        finally:
            stop.set()
            daemon.shutdown()
            for thread in followers:
                thread.join(timeout=60)

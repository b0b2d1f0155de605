"""Real supervisor daemons and real actor processes, killed with SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest

from corral import PROTOCOL_VERSION
from corral.mailbox import Envelope, Kind, encode
from corral.mailbox.control import ControlClient, ControlError
from corral.supervisor.home import home_dir as homes
from tests.harness import Daemon, actor_running, cli, running

GROUP_SPEC = """
[[groups]]
id = "g"
strategy = "{strategy}"
max_restarts = {max_restarts}
period_s = 30

[[actors]]
id = "w"
template = "echo"
count = 3
group = "g"
restart = "{restart}"
"""


def spec(strategy: str = "one_for_one", restart: str = "permanent", max_restarts: int = 5) -> str:
    return GROUP_SPEC.format(strategy=strategy, restart=restart, max_restarts=max_restarts)


def pids(status: dict[str, Any]) -> dict[str, int]:
    return {a["id"]: a["pid"] for a in status["actors"]}


def all_running(status: dict[str, Any]) -> bool:
    return all(a["status"] == "running" for a in status["actors"])


def test_one_for_one_restarts_only_the_killed_actor(short_tmp: Path) -> None:
    with running(short_tmp / "h", spec("one_for_one")) as daemon:
        before = pids(daemon.wait_until(all_running, what="all running"))
        os.kill(before["w-2"], signal.SIGKILL)
        after = daemon.wait_until(actor_running("w-2", incarnation=2), what="w-2 restarted")
        assert pids(after)["w-1"] == before["w-1"]
        assert pids(after)["w-3"] == before["w-3"]
        assert pids(after)["w-2"] != before["w-2"]
        result = cli(daemon.home, "status", "--json")
        import json

        restarts = {a["id"]: a["restarts"] for a in json.loads(result.stdout)["actors"]}
        assert restarts == {"w-1": 0, "w-2": 1, "w-3": 0}
        kinds = [e["kind"] for e in daemon.events() if e["subject"] == "w-2"]
        assert "actor-exited" in kinds and "actor-restarted" in kinds


def test_a_supervisor_started_with_pythonpath_set_runs_and_names_its_processes(short_tmp: Path) -> None:
    # python-prctl's set_proctitle crashed (SIGSEGV) a supervisor whose environment
    # began with PYTHONPATH, as a shell's `PYTHONPATH=... corral up` makes it:
    # `corral up` then failed with an empty log.
    extra = short_tmp / "extra"
    extra.mkdir()
    spec_path = short_tmp / "spec.toml"
    spec_path.write_text(spec())
    daemon = Daemon(short_tmp / "h", spec_path)
    env = {"PYTHONPATH": str(extra), **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}}
    try:
        up = subprocess.run(
            [sys.executable, "-m", "corral", "--home", str(daemon.home), "up", "--spec", str(spec_path)],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )
        assert up.returncode == 0, up.stderr
        daemon.pids_seen.add(daemon.endpoint.pid)
        status = daemon.wait_until(all_running, what="all running")
        supervisor = psutil.Process(daemon.endpoint.pid)
        assert supervisor.cmdline()[0] == "corral:supervisor" and supervisor.name() == "corral:sup"
        for actor in status["actors"]:
            assert psutil.Process(actor["pid"]).cmdline()[0] == f"corral:{actor['id']}"
    finally:
        daemon.shutdown()


def test_one_for_all_restarts_every_sibling(short_tmp: Path) -> None:
    with running(short_tmp / "h", spec("one_for_all")) as daemon:
        before = pids(daemon.wait_until(all_running))
        os.kill(before["w-2"], signal.SIGKILL)
        after = daemon.wait_until(
            lambda s: all_running(s) and all(a["incarnation"] == 2 for a in s["actors"]), what="all restarted"
        )
        assert all(pids(after)[k] != before[k] for k in before)


def test_rest_for_one_restarts_the_later_siblings_only(short_tmp: Path) -> None:
    with running(short_tmp / "h", spec("rest_for_one")) as daemon:
        before = pids(daemon.wait_until(all_running))
        os.kill(before["w-2"], signal.SIGKILL)
        after = daemon.wait_until(
            lambda s: (
                all_running(s) and {a["id"]: a["incarnation"] for a in s["actors"]} == {"w-1": 1, "w-2": 2, "w-3": 2}
            ),
            what="w-2 and w-3 restarted",
        )
        assert pids(after)["w-1"] == before["w-1"]
        assert pids(after)["w-3"] != before["w-3"]


def test_transient_actor_exiting_zero_stays_down_but_a_crash_restarts(short_tmp: Path) -> None:
    with running(short_tmp / "h", spec(restart="transient")) as daemon:
        daemon.wait_until(all_running)
        _ask_to_exit(daemon, "w-1", 0)
        status = daemon.wait_until(lambda s: daemon_actor(s, "w-1")["status"] == "stopped", what="w-1 stopped")
        assert daemon_actor(status, "w-1")["restarts"] == 0
        assert daemon_actor(status, "w-1")["last_exit"] == 0
        _ask_to_exit(daemon, "w-2", 3)
        status = daemon.wait_until(actor_running("w-2", incarnation=2), what="w-2 restarted after exit 3")
        assert daemon_actor(status, "w-2")["restarts"] == 1


def _ask_to_exit(daemon: Daemon, actor_id: str, code: int) -> None:
    """The actor replies, then exits; its reply may not outlive it (actor-gone)."""
    try:
        daemon.call("request_actor", actor_id=actor_id, body={"op": "exit", "code": code})
    except ControlError as exc:
        assert exc.code == "actor-gone", exc


def daemon_actor(status: dict[str, Any], actor_id: str) -> dict[str, Any]:
    return next(a for a in status["actors"] if a["id"] == actor_id)


def test_exceeding_intensity_escalates_and_the_event_says_why(short_tmp: Path) -> None:
    with running(short_tmp / "h", spec(max_restarts=1)) as daemon:
        first = pids(daemon.wait_until(all_running))
        os.kill(first["w-1"], signal.SIGKILL)
        second = pids(daemon.wait_until(actor_running("w-1", incarnation=2)))
        os.kill(second["w-1"], signal.SIGKILL)
        status = daemon.wait_until(lambda s: s["groups"][-1]["status"] == "escalated", what="group escalated")
        assert "restart intensity exceeded" in status["groups"][-1]["reason"]
        daemon.wait_until(lambda s: all(a["pid"] is None for a in s["actors"]), what="group stopped")
        escalations = [e for e in daemon.events() if e["kind"] == "group-escalated"]
        assert len(escalations) == 1
        assert "more than 1 restarts" in escalations[0]["data"]["reason"]
        for pid in first.values():
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_killing_the_supervisor_takes_every_actor_down_and_a_new_boot_keeps_history(short_tmp: Path) -> None:
    with running(short_tmp / "h", spec()) as daemon:
        daemon.wait_until(all_running)
        old_boot = daemon.endpoint.boot_id
        tree = [psutil.Process(p) for p in daemon.tree_pids()]
        assert len(tree) >= 5  # supervisor, fork server, three actors
        daemon.kill_supervisor()
        _gone, alive = psutil.wait_procs(tree, timeout=1.0)
        alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert alive == [], f"survived the supervisor: {alive}"
        new = daemon.up(spec=False)
        assert new.boot_id != old_boot
        status = daemon.wait_until(all_running)
        boots = status["boots"]
        assert [b["boot_id"] for b in boots] == [old_boot, new.boot_id]
        assert boots[0]["end_reason"] == "crashed"
        old_events = [e for e in daemon.events() if e["boot_id"] == old_boot]
        assert any(e["kind"] == "actor-ready" for e in old_events)


def _endpoint_identity(home: Path) -> dict[str, object]:
    """The endpoint file less its heartbeat: the live supervisor rewrites the
    heartbeat on its own timer, so comparing bytes raced that timer (a loaded
    machine lost the race). Who holds the home is everything else in it."""
    fields = json.loads((home / "endpoint.json").read_text())
    assert isinstance(fields.pop("heartbeat"), (int, float))
    return dict(fields)


def test_a_second_up_on_a_live_home_fails_clearly_and_changes_nothing(short_tmp: Path) -> None:
    with running(short_tmp / "h", spec()) as daemon:
        daemon.wait_until(all_running)
        before = daemon.status()
        endpoint_before = _endpoint_identity(daemon.home)
        result = cli(daemon.home, "up")
        assert result.returncode != 0
        assert "already running" in result.stderr
        # Also through the daemon's own lock, bypassing the CLI's early check.
        import sys
        from subprocess import run

        direct = run(
            [sys.executable, "-m", "corral.supervisor", "--home", str(daemon.home)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert direct.returncode == 3
        assert "another supervisor" in direct.stderr
        assert _endpoint_identity(daemon.home) == endpoint_before
        after = daemon.status()
        assert pids(after) == pids(before)
        assert after["boot_id"] == before["boot_id"]


def test_bad_frames_tokens_and_versions_get_clear_errors_and_the_supervisor_keeps_serving(
    short_tmp: Path,
) -> None:
    with running(short_tmp / "h", spec()) as daemon:
        daemon.wait_until(all_running)
        endpoint = daemon.endpoint
        cursor = daemon.status()["cursor"]
        with ControlClient(endpoint.control, endpoint.token) as control:
            garbage = control.call_raw(b"\x00\xffnot msgpack at all")
            assert garbage.kind is Kind.ERROR and garbage.body["code"] == "malformed-frame"
            big = Envelope(Kind.REQUEST, "cli", "supervisor", {"method": "ping", "params": {}}, token=endpoint.token)
            frame = encode(big)[:-1] + b""
            huge = msgpack.packb(
                [
                    PROTOCOL_VERSION,
                    "request",
                    "x",
                    None,
                    "cli",
                    "supervisor",
                    1.0,
                    {"method": "ping", "params": {"pad": "x" * (1024 * 1024 + 10)}},
                    endpoint.token,
                ]
            )
            oversized = control.call_raw(huge)
            assert oversized.body["code"] == "frame-too-large"
            wrong_version = msgpack.packb(
                [
                    PROTOCOL_VERSION + 7,
                    "request",
                    "x",
                    None,
                    "cli",
                    "supervisor",
                    1.0,
                    {"method": "ping", "params": {}},
                    endpoint.token,
                ]
            )
            assert control.call_raw(wrong_version).body["code"] == "protocol-version"
            assert control.call("ping")["pong"] is True
            del frame
        with ControlClient(endpoint.control, "0" * 64) as impostor, pytest.raises(ControlError) as err:
            impostor.call("down")
        assert err.value.code == "bad-token"
        with ControlClient(endpoint.control, endpoint.token) as control, pytest.raises(ControlError) as err2:
            control.call("no_such_method")
        assert err2.value.code == "unknown-method"
        after = daemon.status()
        assert after["boot_id"] == endpoint.boot_id
        assert all_running(after)
        assert not [e for e in daemon.events(cursor) if e["kind"].startswith("boot")]


def test_a_malformed_spec_is_refused_before_anything_starts(short_tmp: Path) -> None:
    bad = short_tmp / "bad.toml"
    bad.write_text('[[actors]]\nid = "x"\ntemplate = "echo"\nrestart = "sometimes"\n')
    result = cli(short_tmp / "h", "up", "--spec", str(bad))
    assert result.returncode == 2
    assert "not one of" in result.stderr
    assert not (short_tmp / "h" / "endpoint.json").exists()
    assert not homes.is_locked(short_tmp / "h")


def test_home_endpoint_and_lock_permissions(short_tmp: Path) -> None:
    with running(short_tmp / "h", spec()) as daemon:
        assert (daemon.home.stat().st_mode & 0o777) == 0o700
        assert ((daemon.home / "endpoint.json").stat().st_mode & 0o777) == 0o600
        assert ((daemon.home / "supervisor.lock").stat().st_mode & 0o777) == 0o600
        endpoint = daemon.endpoint
        assert endpoint.control.startswith("ipc://" + str(daemon.home))
        assert len(endpoint.token) == 64


def test_actor_to_actor_requests_route_through_the_supervisor(short_tmp: Path) -> None:
    with running(short_tmp / "h", spec()) as daemon:
        daemon.wait_until(all_running)
        reply = daemon.call("request_actor", actor_id="w-3", body={"hello": 1})
        assert reply["echo"] == {"hello": 1}


def test_down_stops_actors_gracefully(short_tmp: Path) -> None:
    daemon = Daemon(short_tmp / "h", None)
    try:
        (short_tmp / "s.toml").write_text(spec())
        daemon.spec = short_tmp / "s.toml"
        daemon.up()
        status = daemon.wait_until(all_running)
        procs = [psutil.Process(p) for p in pids(status).values()]
        result = cli(daemon.home, "down")
        assert result.returncode == 0, result.stderr
        psutil.wait_procs(procs, timeout=10)
        from corral.supervisor.ledger.ledger_sqlite import SqliteLedger

        ledger = SqliteLedger(daemon.home / "ledger.db", readonly=True)
        rows = ledger.all("SELECT status, last_exit FROM actors")
        assert {tuple(r) for r in rows} == {("stopped", 0)}
        assert ledger.one("SELECT end_reason FROM boots")[0] == "down"
        ledger.close()
    finally:
        daemon.shutdown()


def test_tcp_loopback_transport(short_tmp: Path) -> None:
    text = '[supervisor]\ntransport = "tcp"\n' + spec()
    with running(short_tmp / "h", text) as daemon:
        assert daemon.endpoint.control.startswith("tcp://127.0.0.1:")
        daemon.wait_until(all_running)
        assert daemon.call("request_actor", actor_id="w-1", body={"x": 1})["echo"] == {"x": 1}


def test_fork_server_preload_starts_no_thread_and_leaves_every_template_imported() -> None:
    # The fork server forks after preloading; a thread started by any import would
    # make every fork unsafe (a lock held by that thread stays held in the child).
    probe = (
        "import os, sys\n"
        "import corral.actors.runtime as runtime\n"
        "runtime.preload()\n"
        "print(len(os.listdir('/proc/self/task')))\n"
        "print(','.join(sorted(m for m in ('corral.actors.agent', 'corral.actors.echo',"
        " 'corral.actors.session', 'corral.actors.providers.openai', 'corral.actors.tools.swarm',"
        " 'corral.actors.tools.process') if m in sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    threads, modules = done.stdout.split()
    assert threads == "1"
    assert modules.split(",") == [
        "corral.actors.agent",
        "corral.actors.echo",
        "corral.actors.providers.openai",
        "corral.actors.session",
        "corral.actors.tools.process",
        "corral.actors.tools.swarm",
    ]

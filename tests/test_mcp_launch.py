"""How a stdio MCP server is started and ended (issue 48, D.9 and D.18), on real
processes: a real venv whose python is a symlink, and a real server that starts
workers the way npx and uvx do, one of them in a session of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral import client
from corral.client_spec import start_spec
from corral.core.procs import wait_exit
from corral.supervisor.spec.swarm_spec import SpecError, parse_spec
from tests.harness import Daemon, cli, running, wait_for

SERVERS = Path(__file__).parent / "mcp_servers"
PROBE_MODULE = "corral_venv_only_probe"  # importable in the test's venv only


def _server(daemon: Daemon, server_id: str) -> dict[str, Any]:
    servers = {server["id"]: server for server in daemon.call("mcp.list")["servers"]}
    return dict(servers[server_id])


def _wait_server(daemon: Daemon, server_id: str, *, restarts: int = 0) -> dict[str, Any]:
    def ready(_: dict[str, Any]) -> bool:
        server = _server(daemon, server_id)
        if server["status"] == "failed":
            raise AssertionError(f"mcp server {server_id} failed: {server['error']}")
        return bool(server["status"] == "ready" and server["restarts"] >= restarts)

    daemon.wait_until(ready, timeout=90, what=f"mcp server {server_id} ready")
    return _server(daemon, server_id)


# -- D.9: the program is run by the path written -----------------------------------------


def _venv(where: Path) -> Path:
    """A real venv (``python -m venv``) whose site-packages holds the probe server
    under a name no other interpreter can import, and a .pth that lends it the
    mcp SDK of the interpreter running the tests."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    assert python.is_symlink(), "a venv's python is a symlink to the base interpreter"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    import mcp  # where the SDK really is (a worktree's venv may lend it from another)

    lent = {sysconfig.get_paths()["purelib"], str(Path(mcp.__file__).resolve().parents[1])}
    (Path(site) / "corral_test_sdk.pth").write_text("".join(f"{entry}\n" for entry in sorted(lent)))
    shutil.copy(SERVERS / "venv_probe.py", Path(site) / f"{PROBE_MODULE}.py")
    return where


def test_a_venv_python_found_on_path_runs_the_server_in_that_venv(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = _venv(short_tmp / "venv")
    (short_tmp / "ws").mkdir()
    # The venv's bin on PATH (outside the project), its python by a bare name: `python`
    # itself means corral's interpreter, so the versioned name reaches the venv's link.
    path = f"{venv / 'bin'}:{os.environ.get('PATH', '')}"
    monkeypatch.setenv("PATH", path)
    spec = f"""
[project]
root = "ws"
[[mcp_servers]]
id = "probe"
command = ["python{sys.version_info.major}.{sys.version_info.minor}", "-m", "{PROBE_MODULE}"]
approval = "auto"
startup_timeout_s = 60
max_restarts = 0
"""
    with running(short_tmp / "home", spec, env={"PATH": path}) as daemon:
        _wait_server(daemon, "probe")
        call = cli(daemon.home, "mcp", "call", "probe", "where", "--json")
        assert call.returncode == 0, call.stderr
        assert Path(json.loads(call.stdout)["result"]["text"]).resolve() == venv.resolve()


def test_a_program_on_path_is_judged_where_it_points_and_kept_as_found(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = short_tmp / "conf"
    (conf / "bin").mkdir(parents=True)
    target = short_tmp / "real-server"
    target.write_text("#!/bin/sh\n")
    target.chmod(0o755)
    (conf / "bin" / "server").symlink_to(target)
    (conf / "bin" / "plain").write_text("")
    (conf / "bin" / "to-plain").symlink_to(conf / "bin" / "plain")
    (conf / "bin" / "dangling").symlink_to(short_tmp / "nowhere")
    (conf / "ws").mkdir()
    monkeypatch.setenv("PATH", str(conf / "bin"))
    source = str(conf / "swarm.toml")
    spec = parse_spec({"project": {"root": "ws"}, "mcp_servers": [{"id": "a", "command": ["server", "-x"]}]}, source)
    assert spec.mcp_servers[0].command == (str(conf / "bin" / "server"), "-x")  # the link, not its target
    assert spec.mcp_servers[0].cwd == str(short_tmp)  # unset: the resolved program's directory
    # The judgement follows the link: to a file that is not executable, or to nothing.
    for name in ("to-plain", "dangling", "plain"):
        with pytest.raises(SpecError, match=rf"no program '{name}' on a trusted PATH"):
            parse_spec({"project": {"root": "ws"}, "mcp_servers": [{"id": "a", "command": [name]}]}, source)


# -- D.18: a server's workers end with it ------------------------------------------------


def _spawner(spawn_dir: Path) -> str:
    return f"""
[project]
root = "ws"
[[mcp_servers]]
id = "spawner"
command = ["python", "{SERVERS / 'spawner_server.py'}"]
env = {{ SPAWN_DIR = "{spawn_dir}" }}
startup_timeout_s = 60
"""


def _workers(spawn_dir: Path, not_of: int = 0) -> tuple[int, dict[str, psutil.Process]]:
    """The server's pid and its workers, for the one incarnation of the server
    other than ``not_of``; the workers pinned by psutil (pid and start time), so
    a recycled pid is never taken for one of them."""

    def published() -> dict[str, int] | None:
        found: dict[str, dict[int, int]] = {"group": {}, "session": {}}
        for path in spawn_dir.glob("*.pid"):
            kind, _, pid = path.stem.partition("-")
            found[kind][int(pid)] = int(path.read_text())
        servers = (set(found["group"]) & set(found["session"])) - {not_of}
        if len(servers) != 1:
            return None
        (server,) = servers
        return {"server": server, **{kind: found[kind][server] for kind in found}}

    pids = wait_for("the server's workers to publish their pids", published, timeout=90)
    server = pids.pop("server")
    return server, {kind: psutil.Process(pid) for kind, pid in pids.items()}


def _alive(proc: psutil.Process) -> bool:
    """Running, and not a zombie (a dead worker re-parented to this test, the
    conftest's subreaper, waits there to be reaped)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _end(workers: dict[str, psutil.Process]) -> None:
    for proc in workers.values():
        if _alive(proc):
            proc.kill()
    psutil.wait_procs(list(workers.values()), timeout=10)  # reaps those that are this test's children


def test_corral_down_ends_the_workers_a_server_started_in_its_group_and_in_a_new_session(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spawn_dir = short_tmp / "spawned"
    spawn_dir.mkdir()
    workers: dict[str, psutil.Process] = {}
    try:
        with running(short_tmp / "home", _spawner(spawn_dir)) as daemon:
            _wait_server(daemon, "spawner")
            _, workers = _workers(spawn_dir)
            assert all(_alive(proc) for proc in workers.values())
            assert os.getpgid(workers["session"].pid) != os.getpgid(workers["group"].pid)  # out of the group's reach
            supervisor = daemon.endpoint.pid
            client.call(daemon.home, "down", timeout=30)
            assert wait_exit(supervisor, 60)
            # The supervisor exits after its actors: whatever is left now was left for good.
            left = {kind: proc.pid for kind, proc in workers.items() if _alive(proc)}
            assert left == {}, f"workers outlived corral down: {left}"
    finally:
        _end(workers)


def test_a_sigkilled_actors_successor_ends_the_workers_its_server_left(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spawn_dir = short_tmp / "spawned"
    spawn_dir.mkdir()
    first: dict[str, psutil.Process] = {}
    second: dict[str, psutil.Process] = {}
    try:
        with running(short_tmp / "home", _spawner(spawn_dir)) as daemon:
            _wait_server(daemon, "spawner")
            old_server, first = _workers(spawn_dir)
            # SIGKILL: the actor runs no clean-up; its server dies by its parent-death signal.
            daemon.call("kill_actor", actor_id="mcp-spawner")
            _wait_server(daemon, "spawner", restarts=1)
            # The new incarnation ended the old one's workers before its server started.
            left = {kind: proc.pid for kind, proc in first.items() if _alive(proc)}
            assert left == {}, f"workers outlived their server's restart: {left}"
            _, second = _workers(spawn_dir, not_of=old_server)
            assert all(_alive(proc) for proc in second.values())
    finally:
        _end(first)
        _end(second)


def test_a_sigkilled_actors_server_and_its_group_die_with_it(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spawn_dir = short_tmp / "spawned"
    spawn_dir.mkdir()
    workers: dict[str, psutil.Process] = {}
    try:
        with running(short_tmp / "home", _spawner(spawn_dir) + "max_restarts = 0\n") as daemon:
            _wait_server(daemon, "spawner")
            server_pid, workers = _workers(spawn_dir)
            server = psutil.Process(server_pid)
            # SIGKILL, and no successor: only the launcher's watcher is left to act.
            daemon.call("kill_actor", actor_id="mcp-spawner")
            assert wait_exit(server.pid, 60), "the server outlived its SIGKILLed actor"
            assert wait_exit(workers["group"].pid, 60), "the server's group outlived its SIGKILLed actor"
            # The worker in a session of its own is out of the group's reach: the next
            # incarnation ends it (the test above); with none, it is this test's to end.
    finally:
        _end(workers)


def test_the_actor_reaps_the_orphans_of_its_servers_tree_while_it_runs(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spawn_dir = short_tmp / "spawned"
    spawn_dir.mkdir()
    workers: dict[str, psutil.Process] = {}
    try:
        with running(short_tmp / "home", _spawner(spawn_dir)) as daemon:
            _wait_server(daemon, "spawner")
            _, workers = _workers(spawn_dir)
            marker = short_tmp / "orphan.pid"
            call = cli(daemon.home, "mcp", "call", "spawner", "orphan", "--args", json.dumps({"path": str(marker)}),
                       "--approve")
            assert call.returncode == 0, call.stderr
            orphan = int(wait_for("the orphan's pid", lambda: marker.is_file() and marker.read_text()))
            # It was re-parented to the actor (a subreaper), and exited: the actor reaps it.
            wait_for("the actor to reap the orphan's zombie", lambda: not psutil.pid_exists(orphan), timeout=60)
    finally:
        _end(workers)


def test_a_spec_given_as_data_keeps_the_program_name_written(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = short_tmp / "real-server"
    target.write_text("#!/bin/sh\n")
    target.chmod(0o755)
    (short_tmp / "bin").mkdir()
    (short_tmp / "bin" / "server").symlink_to(target)
    (short_tmp / "ws").mkdir()
    monkeypatch.chdir(short_tmp / "ws")  # a dict's project root is the current directory
    monkeypatch.setenv("PATH", str(short_tmp / "bin"))
    started = start_spec(short_tmp / "home", {"mcp_servers": [{"id": "s", "command": ["server"]}]})
    assert started.path is not None
    written = tomllib.loads(started.path.read_text())
    assert written["mcp_servers"][0]["command"] == ["server"]  # a name: PATH finds it where the supervisor reads it

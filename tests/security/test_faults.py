"""Issue 14, items 7-9: a damaged ledger is refused with a clear message, the home
lock cannot be unlinked away, `corral doctor` says what is wrong, and a full disk
leaves the supervisor up, read-only, until space returns (a real tmpfs in a user
and mount namespace)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.core.procs import wait_exit
from corral.supervisor.home import home_dir as homes
from tests.harness import Daemon, cli, running, wait_run

ECHO = '[[actors]]\nid = "echo"\ntemplate = "echo"\n'


def _ledger_with_history(home: Path) -> Path:
    with running(home, ECHO) as daemon:
        daemon.call("ping")
    return home / homes.LEDGER


def _up_fails(home: Path) -> str:
    result = cli(home, "up")
    if result.returncode == 0:
        Daemon(home).shutdown()
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr and "sqlite3." not in result.stderr, result.stderr
    assert not (home / homes.ENDPOINT).exists()
    return result.stderr


def test_a_zero_length_ledger_is_refused_not_replaced(short_tmp: Path) -> None:
    ledger = _ledger_with_history(short_tmp / "home")
    ledger.write_bytes(b"")
    message = _up_fails(short_tmp / "home")
    assert "is empty" in message and str(ledger) in message and "backup" in message
    assert ledger.stat().st_size == 0  # nothing silently re-created


@pytest.mark.parametrize("damage", ["garbage-header", "truncated-header"])
def test_a_ledger_with_a_bad_header_gives_a_clear_error(short_tmp: Path, damage: str) -> None:
    ledger = _ledger_with_history(short_tmp / "home")
    data = ledger.read_bytes()
    ledger.write_bytes(b"this is not a database at all" + data[32:] if damage == "garbage-header" else data[:10])
    message = _up_fails(short_tmp / "home")
    assert "not an SQLite database" in message and str(ledger) in message


def test_pages_damaged_mid_file_are_found_at_start_up(short_tmp: Path) -> None:
    home = short_tmp / "home"
    with running(home, ECHO) as daemon:
        for index in range(40):  # enough history for several pages of events
            daemon.call("request_actor", actor_id="echo", body={"n": index, "pad": "x" * 2000})
    ledger = home / homes.LEDGER
    db = sqlite3.connect(ledger)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.close()
    assert pages > 8
    with open(ledger, "r+b") as handle:
        for page in (pages // 2, pages // 2 + 1, pages - 2):
            handle.seek(page * page_size)
            handle.write(os.urandom(page_size))
    message = _up_fails(home)
    assert "damaged" in message or "malformed" in message, message
    doctor = cli(home, "doctor", "--json")
    assert doctor.returncode == 1
    report = json.loads(doctor.stdout)
    assert not report["healthy"]
    assert [f["level"] for f in report["findings"] if f["check"] == "ledger"] == ["error"]


def test_doctor_on_a_healthy_and_a_stale_home(short_tmp: Path) -> None:
    home = short_tmp / "home"
    with running(home, ECHO) as daemon:
        healthy = cli(home, "doctor", "--json")
        assert healthy.returncode == 0, healthy.stdout
        findings = {f["check"]: f for f in json.loads(healthy.stdout)["findings"]}
        assert findings["lock"]["level"] == "ok" and str(daemon.endpoint.pid) in findings["lock"]["detail"]
        assert findings["ledger"]["level"] == "ok"
        pid = daemon.kill_supervisor()
        wait_exit(pid, 10)
        os.chmod(home / homes.LEDGER, 0o644)
        stale = cli(home, "doctor")
        assert stale.returncode == 1
        assert "left from a supervisor that is gone" in stale.stdout
        assert "readable by others" in stale.stdout and "->" in stale.stdout
        os.chmod(home / homes.LEDGER, 0o600)


def test_deleting_the_lock_file_does_not_let_a_second_supervisor_in(short_tmp: Path) -> None:
    home = short_tmp / "home"
    with running(home, ECHO) as first:
        pid = first.endpoint.pid
        (home / homes.LOCK).unlink()
        second = cli(home, "up")
        assert second.returncode != 0
        assert "already running" in second.stderr or "another supervisor" in second.stderr
        assert first.call("ping")["pid"] == pid  # alive and still the owner
        boots = first.call("status")["boots"]
        assert [b["end_reason"] for b in boots] == [None]  # not marked crashed


def test_a_supervisor_whose_home_is_replaced_stops(short_tmp: Path) -> None:
    home = short_tmp / "home"
    daemon = Daemon(home)
    try:
        daemon.up(spec=False)
        pid = daemon.endpoint.pid
        moved = short_tmp / "moved"
        home.rename(moved)
        home.mkdir(mode=0o700)
        assert wait_exit(pid, 30), "the supervisor kept running on a home that is gone"
        log = (moved / "logs" / "supervisor.log").read_text()
        assert "removed or replaced" in log
    finally:
        daemon.shutdown()


# -- a full disk -------------------------------------------------------------------------

SPEC = """
[supervisor]
transport = "tcp"
heartbeat_s = 0.2
[project]
root = "ws"
[policy]
default = "auto"
[[actors]]
id = "echo"
template = "echo"
[[agents]]
id = "writer"
[[agents.steps]]
actions = [{ tool = "fs.write", input = { path = "out.txt", content = "written" } }]
[[agents.steps]]
final = "done"
"""


def _namespace_ok() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-Urm", "true"], capture_output=True, check=False
    ).returncode == 0


@pytest.mark.skipif(not _namespace_ok(), reason="user and mount namespaces are not available here")
def test_a_full_disk_leaves_the_supervisor_up_read_only_until_space_returns(short_tmp: Path) -> None:
    mount = short_tmp / "small"
    mount.mkdir()
    (short_tmp / "spec.toml").write_text(SPEC)
    inner_home = mount / "home"
    script = (
        f"mount -t tmpfs -o size=3m tmpfs {mount} && mkdir {mount}/ws && "
        f"exec {sys.executable} -m corral --home {inner_home} up --foreground --spec {short_tmp / 'spec.toml'}"
    )
    # The spec's project root is relative to the spec file: point it into the tmpfs.
    (short_tmp / "spec.toml").write_text(SPEC.replace('root = "ws"', f'root = "{mount}/ws"'))
    proc = subprocess.Popen(["unshare", "-Urm", "sh", "-c", script], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        # The tmpfs exists only inside the namespace: reach it through the process's root.
        home = Path(f"/proc/{proc.pid}/root") / str(inner_home).lstrip("/")
        deadline = time.monotonic() + 60
        while not (home / homes.ENDPOINT).exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "supervisor did not come up"
            time.sleep(0.05)
        daemon = Daemon(home)
        actors_before = {a["id"]: a["pid"] for a in daemon.status()["actors"]}
        filler = Path(f"/proc/{proc.pid}/root") / str(mount).lstrip("/") / "filler"
        with open(filler, "wb", buffering=0) as handle:  # unbuffered: nothing left to flush at close
            try:
                while True:
                    handle.write(b"\0" * 65536)
            except OSError:
                pass
        from corral.mailbox.control import ControlError

        with pytest.raises(ControlError) as refused:
            daemon.call("run", agent_id="writer", task="write while the disk is full", run_id="run-full01")
        assert refused.value.code == "disk-full" and "free space" in refused.value.message.lower()
        deadline = time.monotonic() + 30
        while not daemon.status()["degraded"]:
            assert time.monotonic() < deadline, "the supervisor never said it is degraded"
            time.sleep(0.2)
        status = daemon.status()
        assert {a["id"]: a["pid"] for a in status["actors"]} == actors_before  # actors kept
        assert proc.poll() is None  # and the supervisor is up
        filler.unlink()
        deadline = time.monotonic() + 30
        while daemon.status()["degraded"]:
            assert time.monotonic() < deadline, "the supervisor did not recover by itself"
            time.sleep(0.2)
        run_id = daemon.call("run", agent_id="writer", task="write now", run_id="run-full02")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        daemon.call("down")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_crash_while_the_ledger_is_created_leaves_no_empty_ledger(short_tmp: Path) -> None:
    """A new ledger is built beside its name and renamed into place: a supervisor
    killed in between leaves no ledger.db at all (never an empty one, which would be
    refused as damage), and the next `corral up` simply starts."""
    home = short_tmp / "home"
    killed = cli(home, "up", env={"CORRAL_FAILPOINTS": "ledger.after-staging=kill"})
    assert killed.returncode != 0
    assert not (home / homes.LEDGER).exists() and (home / (homes.LEDGER + ".new")).exists()
    with running(home, ECHO) as daemon:
        assert daemon.call("ping")["pong"] is True
    assert not (home / (homes.LEDGER + ".new")).exists()

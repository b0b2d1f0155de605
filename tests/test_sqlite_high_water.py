"""Issue 48 D.19: damage inside the SQLite write-ahead log must not silently drop
committed runs.

SQLite's recovery stops at the first WAL frame whose checksum fails and keeps the
database as it was before it: consistent, but older. Before the fix, 64 bytes
overwritten in the first frame after a completed run and a SIGKILL gave a `corral
up` that succeeded without a word, a `corral doctor` with every check `ok`, and a
run that no longer existed. The ledger now keeps a high-water mark outside the WAL
(the last event it made durable): `corral up` refuses a ledger behind it, before
writing anything (the log keeps the commits past the damage), and `corral doctor`
reports the loss and what to do.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from corral.sandbox.bwrap import bwrap_available
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.high_water import HighWater, read_mark
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.ledger.port import LedgerError
from tests.harness import Daemon, cli, running, wait_run
from tests.test_intent import act, script

SANDBOX = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'

SPEC = f"""
[project]
root = "ws"
{SANDBOX}
[chaos]
effects_file = "effects.log"
[[agents]]
id = "writer"
  [[agents.steps]]
  final = "each run brings its own script"
"""

#: The WAL's header, then each frame's own header, then its page.
WAL_HEADER, FRAME_HEADER = 32, 24


def _complete_a_run(daemon: Daemon, label: str) -> str:
    run_id: str = daemon.call("run", agent_id="writer", task=label, script=script(
        [act("effect.record", label=label)], "done",
    ))["run_id"]
    assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"
    return run_id


def _runs_in_the_ledger(ledger: Path) -> set[str]:
    """What SQLite itself recovers from the files (read-only: nothing is written)."""
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    try:
        return {row[0] for row in db.execute("SELECT run_id FROM runs")}
    finally:
        db.close()


def _doctor(home: Path) -> tuple[int, dict[str, dict[str, str]]]:
    result = cli(home, "doctor", "--json")
    report = json.loads(result.stdout)
    return result.returncode, {finding["check"]: finding for finding in report["findings"]}


def test_a_damaged_wal_that_lost_a_completed_run_is_refused_and_reported(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    home = short_tmp / "home"
    ledger = home / homes.LEDGER
    wal = ledger.with_name(ledger.name + "-wal")
    with running(home, SPEC) as daemon:
        # A SIGKILL alone loses nothing, and is no reason to refuse a restart.
        first = _complete_a_run(daemon, "before")
        daemon.kill_supervisor()
        daemon.up()
        assert daemon.call("show", run_id=first)["run"]["status"] == "completed"

        run_id = _complete_a_run(daemon, "lost")
        daemon.kill_supervisor()  # no checkpoint: the run's commits are in the WAL only
        assert wal.stat().st_size > WAL_HEADER + FRAME_HEADER + 4096
        with open(wal, "r+b") as handle:
            handle.seek(WAL_HEADER + FRAME_HEADER + 1024)
            original = handle.read(64)
            damage = bytes(b ^ 0xFF for b in original)
            handle.seek(WAL_HEADER + FRAME_HEADER + 1024)
            handle.write(damage)
        # The premise: SQLite's recovery silently drops the completed run.
        assert run_id not in _runs_in_the_ledger(ledger)
        damaged_log = wal.read_bytes()

        up = cli(home, "up")
        if up.returncode == 0:
            Daemon(home).shutdown()
        assert up.returncode != 0, f"corral up started on a ledger that lost a completed run: {up.stdout}"
        assert "Traceback" not in up.stderr, up.stderr
        message = up.stderr
        assert "lost" in message and "high-water" in message and str(ledger) in message, message
        assert "backup" in message and "corral doctor" in message, message
        assert not homes.is_locked(home), "a supervisor runs on it"
        assert wal.read_bytes() == damaged_log, "the refused start wrote over the damaged log"

        code, findings = _doctor(home)
        assert code != 0
        assert findings["high-water"]["level"] == "error", findings
        assert "lost" in findings["high-water"]["detail"], findings["high-water"]
        advice = findings["high-water"]["advice"]
        assert "backup" in advice and "-wal" in advice and "high-water" in advice, advice

        # The way out the advice names: accept the loss by moving the mark away.
        mark = next(home.glob(f"{homes.LEDGER}*high-water*"))
        mark.rename(short_tmp / "kept-mark")
        daemon.up()
        assert daemon.call("ping")
    code, findings = _doctor(home)
    assert code == 0 and findings["high-water"]["level"] == "ok", findings


def test_reads_without_a_supervisor_warn_that_the_ledger_is_behind_its_mark(short_tmp: Path) -> None:
    """Issue 48 (red team): after WAL damage, ``corral up`` refuses, but the offline
    reads answered from the older ledger without a word (``not-found: no run``).
    Each now says, on stderr (and in ``--json``), that the ledger is behind its
    high-water mark and what to do; an undamaged ledger read the same way says nothing."""
    (short_tmp / "ws").mkdir()
    home = short_tmp / "home"
    ledger = home / homes.LEDGER
    wal = ledger.with_name(ledger.name + "-wal")
    with running(home, SPEC) as daemon:
        first = _complete_a_run(daemon, "before")
        daemon.kill_supervisor()
        # The control: a SIGKILL alone loses nothing, and the reads say nothing of a mark.
        for args in (("show", first), ("runs",), ("status",)):
            quiet = cli(home, *args)
            assert "high-water" not in quiet.stderr, (args, quiet.stderr)
        assert "ledger_behind" not in json.loads(cli(home, "show", first, "--json").stdout)
        daemon.up()
        daemon.shutdown()  # a clean stop checkpoints: the first run is in the database file, not the log
        daemon.up()
        lost = _complete_a_run(daemon, "lost")
        daemon.kill_supervisor()  # no checkpoint: the run's commits are in the WAL only
        with open(wal, "r+b") as handle:
            handle.seek(200)
            original = handle.read(64)
            handle.seek(200)
            handle.write(bytes(b ^ 0xFF for b in original))
        assert lost not in _runs_in_the_ledger(ledger)  # the premise: SQLite dropped it
        damaged_log = wal.read_bytes()

        def warned(result: subprocess.CompletedProcess[str]) -> None:
            assert "Traceback" not in result.stderr, result.stderr
            assert "WARNING" in result.stderr and "behind its high-water mark" in result.stderr, result.stderr
            assert "lost committed work" in result.stderr and "backup" in result.stderr, result.stderr
            assert "corral doctor" in result.stderr, result.stderr

        missing = cli(home, "show", lost)
        assert missing.returncode != 0 and "not-found" in missing.stderr
        warned(missing)
        shown = cli(home, "show", first, "--json")
        assert shown.returncode == 0, shown.stderr
        warned(shown)
        behind = json.loads(shown.stdout)["ledger_behind"]
        assert behind["holds"] < behind["mark"] and "backup" in behind["advice"], behind
        listed = cli(home, "runs", "--json")
        warned(listed)
        runs = json.loads(listed.stdout)
        assert [run["run_id"] for run in runs] == [first]
        assert all(run["ledger_behind"] == behind for run in runs), runs
        warned(cli(home, "runs"))
        status = cli(home, "status")
        assert status.returncode != 0
        warned(status)
        assert wal.read_bytes() == damaged_log, "a read wrote over the damaged log"
        assert not homes.is_locked(home)


# -- the mark itself ---------------------------------------------------------------------


def test_the_mark_moves_only_once_commits_are_durable(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path, check=True, group_commit=True)
    try:
        start = read_mark(path)
        assert start == newest(ledger)
        with ledger.tx():
            cursor = ledger.event("probe", "one")
        assert read_mark(path) == start, "the mark moved before the fsync that makes the commit durable"
        ledger.sync()
        assert read_mark(path) == cursor
        with pytest.raises(RuntimeError), ledger.tx():  # rolled back: its event never existed
            ledger.event("probe", "two")
            raise RuntimeError("roll it back")
        ledger.sync()
        assert read_mark(path) == cursor == newest(ledger)
    finally:
        ledger.close()
    # Without group commit, synchronous = FULL: each fsync'd commit moves it.
    ledger = SqliteLedger(path, check=True)
    try:
        with ledger.tx():
            cursor = ledger.event("probe", "three")
        assert read_mark(path) == cursor
        with ledger.tx(fsync=False):  # not durable yet
            relaxed = ledger.event("probe", "four")
        assert read_mark(path) == cursor
        with ledger.tx():
            pass  # the next fsync'd commit makes the one before durable too
        assert read_mark(path) == relaxed
    finally:
        ledger.close()


def test_an_older_copy_or_a_damaged_mark_is_refused_and_a_new_ledger_starts_a_new_mark(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    SqliteLedger(path, check=True).close()
    older = tmp_path / "older.db"
    older.write_bytes(path.read_bytes())
    ledger = SqliteLedger(path, check=True)
    with ledger.tx():
        ledger.event("probe", "after the copy")
    ledger.close()
    path.write_bytes(older.read_bytes())  # a restore from an older copy
    with pytest.raises(LedgerError, match="lost committed work") as refused:
        SqliteLedger(path, check=True)
    assert "backup" in str(refused.value) and "high-water" in str(refused.value)
    assert SqliteLedger(path, readonly=True).one("SELECT 1") is not None  # reading is not refused

    mark = path.with_name(path.name + "-high-water")
    mark.write_bytes(b"corral ledger high-water v1: event 00000000000000000009 crc32 00000000\n")
    with pytest.raises(LedgerError, match=r"high-water mark .* is damaged"):
        SqliteLedger(path, check=True)

    path.unlink()  # moved away on purpose: a new ledger, judged by a mark of its own
    SqliteLedger(path, check=True).close()
    assert read_mark(path) == _newest_of(path)


def newest(ledger: SqliteLedger) -> int:
    row = ledger.one("SELECT MAX(cursor) FROM events")
    return int(row[0] or 0) if row else 0


def _newest_of(path: Path) -> int:
    ledger = SqliteLedger(path, readonly=True)
    try:
        return newest(ledger)
    finally:
        ledger.close()


def test_a_mark_that_cannot_be_written_stays_behind_and_fails_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    mark = HighWater(path)
    mark.start(5)
    # A file the process can no longer write (as on a failing disk): EBADF on pwrite.
    os.close(mark._fd)
    mark._fd = os.open(path.with_name(path.name + "-high-water"), os.O_RDONLY)
    mark.advance(9)  # no exception: the commit it follows stands
    assert mark.value == 5 and read_mark(path) == 5
    mark.close()

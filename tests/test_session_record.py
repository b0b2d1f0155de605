"""Seed 004, V1.11 and V1.11.1: what the process record (the ``sessions`` row) and
the command log (``command_launches``) keep of a launch.

- V1.11: "command log、terminal receipt、Agent DB 和 process record 至少记录固定
  sandboxMode / networkAccess / sandboxBackend / sandboxProfileVersion".
- V1.11.1: "process record v3 增加 sandboxEstablishment / targetExec /
  launchFailureKind / sandboxReadyAt / execEstablishedAt".

Real supervisor and agent, on a PATH without bubblewrap (so both cases run on any
host): a launch the sandbox requirement refuses, and one the spec allows to run
unsandboxed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.harness import ledger_rows, wait_run
from tests.test_process_sessions import NO_BWRAP, _daemon, _spec, sessions


def _no_bwrap_env(short_tmp: Path) -> dict[str, str]:
    bin_dir = short_tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    shell = shutil.which("sh")
    assert shell is not None
    if not (bin_dir / "sh").exists():
        os.symlink(shell, bin_dir / "sh")
    return {"PATH": str(bin_dir)}


def test_a_refused_launch_records_that_the_sandbox_was_never_established(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, _spec(NO_BWRAP, sandbox=""), home="h1", env=_no_bwrap_env(short_tmp))
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="try without a sandbox")["run_id"]
        wait_run(daemon, run_id, {"completed", "failed"})
        (row,) = sessions(daemon, run_id)
        assert row["state"] == "failed"
        assert row["sandbox_establishment"] == "failed" and row["target_exec"] == "not-executed"
        assert row["launch_failure_kind"] == "sandbox-unavailable"
        assert row["sandbox_ready_at"] is None and row["exec_established_at"] is None
    finally:
        daemon.shutdown()


def test_every_launch_record_names_its_sandbox_and_when_the_target_was_established(short_tmp: Path) -> None:
    spec = _spec(NO_BWRAP, sandbox='[sandbox]\nmode = "allow-unsandboxed"')
    daemon = _daemon(short_tmp, spec, home="h2", env=_no_bwrap_env(short_tmp))
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="run without a sandbox, as allowed")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        facts = {
            "sandbox_mode": "unsandboxed",
            "network_access": 1,
            "sandbox_backend": "none",
            "sandbox_profile_version": 1,
        }
        (row,) = sessions(daemon, run_id)
        assert {key: row[key] for key in facts} == facts
        assert row["sandbox_establishment"] == "unsandboxed" and row["target_exec"] == "established"
        assert row["launch_failure_kind"] is None
        assert row["created_at"] <= row["sandbox_ready_at"] <= row["exec_established_at"]
        (launch,) = ledger_rows(daemon.home, "SELECT * FROM command_launches")
        assert {key: launch[key] for key in facts} == facts
    finally:
        daemon.shutdown()


def test_an_existing_home_gains_the_columns_and_its_old_records_keep_null(tmp_path: Path) -> None:
    """The migration on a home made by the corral before it (its sessions row kept,
    the new facts unknown: NULL); tests/test_ledger_port.py applies every migration
    on PostgreSQL too."""
    import sqlite3

    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
    from corral.supervisor.ledger.port import split_sql
    from corral.supervisor.ledger.schema import MIGRATIONS

    path = tmp_path / "ledger.db"
    db = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:-1]:
        for statement in split_sql(migration):
            db.execute(statement)
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) - 1}")
    db.execute(
        "INSERT INTO sessions (process_id, run_id, agent_id, start_action_id, actor_id, program, argv_summary,"
        " cwd, state, launch_mode, boot_id, created_at, updated_at) VALUES"
        " ('proc-old', 'run-old', 'a', 'act-old', 'actor', 'sh', 'sh', '.', 'exited', 'sandboxed', 'b', 1, 1)"
    )
    db.close()
    ledger = SqliteLedger(path)
    assert ledger.schema_version == len(MIGRATIONS)
    row = ledger.one("SELECT * FROM sessions WHERE process_id = 'proc-old'")
    assert row["launch_mode"] == "sandboxed"
    assert [row[key] for key in ("sandbox_mode", "sandbox_establishment", "target_exec", "sandbox_ready_at")] == [
        None,
        None,
        None,
        None,
    ]

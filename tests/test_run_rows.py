"""Rows kept by run (supervisor/runs/run_versions.py: ``row``, ``keep_row``): the run's
row and its collaboration binding are read once, and every write to them, whoever
makes it, is seen at the next read; a read inside a transaction that rolled back
is never reused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.runs import run_store
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_versions import ABSENT

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    ledger = SqliteLedger(tmp_path / "l.db")
    ledger.begin_boot("b", 1, 1)
    try:
        yield ledger
    finally:
        ledger.close()


def _reads(ledger: SqliteLedger, table: str) -> list[str]:
    seen: list[str] = []
    ledger.db.set_trace_callback(lambda sql: seen.append(sql) if f"FROM {table} WHERE" in sql else None)
    return seen


def test_a_run_row_is_read_once_and_any_write_to_it_is_seen(ledger: SqliteLedger) -> None:
    run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="a", task="t", provider="scripted", provider_config={})
    seen = _reads(ledger, "runs")
    assert run_store.get_run(ledger, run_id)["status"] == "pending"
    assert run_store.get_run(ledger, run_id)["status"] == "pending"
    assert len(seen) == 1, "the second read is answered from the kept row"
    # A write by plain SQL, not through any store, is seen too (the trigger drops it).
    with ledger.tx() as db:
        db.execute("UPDATE runs SET task = 'changed' WHERE run_id = ?", (run_id,))
    assert run_store.get_run(ledger, run_id)["task"] == "changed"
    run_store.set_run_status(ledger, run_id, run_store.RunStatus.RUNNING, NO_FEATURES)
    assert run_store.get_run(ledger, run_id)["status"] == "running"


def test_a_row_read_in_a_rolled_back_transaction_is_not_reused(ledger: SqliteLedger) -> None:
    run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="a", task="t", provider="scripted", provider_config={})
    with pytest.raises(RuntimeError), ledger.tx() as db:
        db.execute("UPDATE runs SET task = 'never committed' WHERE run_id = ?", (run_id,))
        assert run_store.get_run(ledger, run_id)["task"] == "never committed"  # its own write, kept
        raise RuntimeError("roll it back")
    assert run_store.get_run(ledger, run_id)["task"] == "t"


def test_an_absent_binding_is_kept_until_one_is_written(ledger: SqliteLedger) -> None:
    run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="a", task="t", provider="scripted", provider_config={})
    versions = ledger.run_versions
    versions.keep_row("collaboration_bindings", run_id, ABSENT, ledger)
    assert versions.row("collaboration_bindings", run_id, ledger) is ABSENT
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO collaboration_bindings (run_id, policy, digest, loop_index, bound_at)"
            " VALUES (?, '{}', 'd', 0, 0)",
            (run_id,),
        )
    assert versions.row("collaboration_bindings", run_id, ledger) is None, "the insert dropped the absent mark"


def test_a_ledger_that_sees_no_writes_keeps_no_rows(tmp_path: Path, ledger: SqliteLedger) -> None:
    run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="a", task="t", provider="scripted", provider_config={})
    ledger.run_versions.kept = False  # as a PostgreSQL ledger: its writes bump nothing here
    seen = _reads(ledger, "runs")
    run_store.get_run(ledger, run_id)
    run_store.get_run(ledger, run_id)
    assert len(seen) == 2

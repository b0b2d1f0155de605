"""A loop's plan is read once (issue 50 §4): a step asks for the plan of a loop
that has none yet several times before it is committed; the SQLite ledger keeps
the loop as planless until an insert into ``plans`` (any store's, from a TEMP
trigger on the one writer's connection) says otherwise. ``commit_plan`` inserts
first and reads only on a replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.runs import loop_plan_store, run_store
from corral.supervisor.runs.run_feature import RunFeatures

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()


def _ledger(tmp_path: Path) -> tuple[SqliteLedger, str, list[str]]:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.begin_boot("b1", 1, 1)
    run_id = run_store.create_run(
        ledger, NO_FEATURES, agent_id="writer", task="t", provider="scripted", provider_config={"script": {"steps": []}}
    )
    statements: list[str] = []
    ledger.db.set_trace_callback(statements.append)
    return ledger, run_id, statements


def _plan_reads(statements: list[str]) -> int:
    return sum(1 for sql in statements if sql.lstrip().upper().startswith("SELECT") and "FROM plans" in sql)


def test_a_planless_loop_is_read_once_until_its_plan_is_inserted(tmp_path: Path) -> None:
    ledger, run_id, statements = _ledger(tmp_path)
    assert ledger.committed_plan(run_id, 0) is None
    assert ledger.committed_plan(run_id, 0) is None
    assert loop_plan_store.get_plan(ledger, run_id, 0) is None
    assert _plan_reads(statements) == 1
    loop_plan_store.commit_plan(ledger, run_id, 0, f"{run_id}:0", {"final": "done"})
    assert loop_plan_store.get_plan(ledger, run_id, 0) == {"final": "done"}
    assert _plan_reads(statements) == 1, "the plan just written is known without reading it back"
    # Any insert, not only commit_plan's, ends the loop's planless mark.
    with ledger.tx() as db:
        assert ledger.committed_plan(run_id, 1) is None
        db.execute(
            "INSERT INTO plans (run_id, loop_index, plan, created_at) VALUES (?, 1, ?, 0)", (run_id, '{"final": "x"}')
        )
        assert loop_plan_store.get_plan(ledger, run_id, 1) == {"final": "x"}
    ledger.close()


def test_a_rolled_back_plan_is_not_seen_and_the_loop_is_read_again(tmp_path: Path) -> None:
    ledger, run_id, statements = _ledger(tmp_path)
    assert ledger.committed_plan(run_id, 0) is None
    with pytest.raises(RuntimeError), ledger.tx():
        loop_plan_store.commit_plan(ledger, run_id, 0, f"{run_id}:0", {"final": "lost"})
        assert loop_plan_store.get_plan(ledger, run_id, 0) == {"final": "lost"}
        raise RuntimeError("roll it back")
    before = _plan_reads(statements)
    assert ledger.committed_plan(run_id, 0) is None
    assert _plan_reads(statements) == before + 1, "read again: the insert that was rolled back ended the mark"
    ledger.close()


def test_commit_plan_inserts_without_a_read_and_a_replay_returns_the_first(tmp_path: Path) -> None:
    ledger, run_id, statements = _ledger(tmp_path)
    first = loop_plan_store.commit_plan(ledger, run_id, 0, f"{run_id}:0", {"final": "first"})
    assert first == {"final": "first"} and _plan_reads(statements) == 0
    again = loop_plan_store.commit_plan(ledger, run_id, 0, f"{run_id}:0", {"final": "second"})
    assert again == {"final": "first"}, "the plan committed first stands"
    kinds = [e["kind"] for e in ledger.events_since(0, limit=100)]
    assert kinds.count("plan-committed") == 1
    ledger.close()

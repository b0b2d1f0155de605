"""Spec parsing errors are exact; the ledger migrates, uses WAL and keeps events append-only."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.ledger.schema import MIGRATIONS
from corral.supervisor.spec.swarm_spec import SpecError, load_spec, parse_spec


def test_a_full_spec_parses_and_expands_counts() -> None:
    spec = parse_spec(
        {
            "groups": [{"id": "w", "strategy": "rest_for_one", "max_restarts": 2, "period_s": 3}],
            "actors": [{"id": "echo", "template": "echo", "count": 3, "group": "w", "restart": "transient"}],
        }
    )
    assert [a.id for a in spec.actors] == ["echo-1", "echo-2", "echo-3"]
    assert spec.group("w").strategy.value == "rest_for_one"
    assert spec.actors[0].restart.value == "transient"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"actors": [{"id": "e", "template": "echo", "restrat": "permanent"}]}, "did you mean 'restart'"),
        ({"actors": [{"id": "e", "template": "nope"}]}, "unknown template"),
        ({"actors": [{"id": "e", "template": "echo", "count": 0}]}, "count"),
        ({"actors": [{"id": "e", "template": "echo", "group": "ghost"}]}, "no group 'ghost'"),
        ({"actors": [{"id": "Bad Id", "template": "echo"}]}, "must match"),
        ({"actors": [{"id": "e", "template": "echo"}, {"id": "e", "template": "echo"}]}, "duplicate"),
        ({"groups": [{"id": "g", "strategy": "one_for_some"}]}, "not one of"),
        ({"groups": [{"id": "g", "max_restarts": "3"}]}, "expected int"),
        ({"supervisor": {"transport": "udp"}}, "transport"),
        ({"surprise": 1}, "unknown key 'surprise'"),
        ({"agents": [{"id": "w", "steps": [{"final": "x", "when_observd": "a"}]}]}, r"unknown keys \['when_observd'\]"),
        ({"ledger": {"url": "mysql://x/y"}}, "must be postgresql://"),
        ({"ledger": {"node": "Not A Node"}}, "node id"),
        ({"ledger": {"lease_s": 0}}, "lease_s"),
        ({"ledger": {"retire_idle_s": "soon"}}, "retire_idle_s"),
        ({"ledger": {"url": "postgresql://h/db", "replicas": 2}}, "ledger: unknown key 'replicas'"),
        ({"project": {"preview_url": "http://localhost:8000/"}}, "must be 127.0.0.1"),
        ({"project": {"preview_url": "http://10.0.0.5:8000/"}}, "10.0.0.5 is not 127.0.0.1"),
        ({"project": {"preview_url": "http://[::1]:8000/"}}, "::1 is not 127.0.0.1"),
        ({"project": {"preview_url": "http://127.0.0.1/"}}, "port must be given"),
        ({"project": {"preview_url": "http://u:p@127.0.0.1:80/"}}, "credentials"),
        ({"project": {"preview_url": "https://127.0.0.1:80/"}}, "scheme must be http"),
    ],
)
def test_bad_specs_name_the_exact_problem(data: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(data)


def test_unreadable_and_non_toml_spec_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[actors]\nid = ")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(bad)


def test_ledger_migrates_to_latest_in_wal_mode_and_reopens(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    assert ledger.schema_version == len(MIGRATIONS)
    assert ledger.one("PRAGMA journal_mode")[0] == "wal"
    ledger.begin_boot("b1", 1, 1)
    ledger.close()
    again = SqliteLedger(tmp_path / "l.db")
    assert again.schema_version == len(MIGRATIONS)
    assert again.one("SELECT COUNT(*) FROM boots")[0] == 1
    again.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM isolated_groups WHERE parent_run_id = 'r' AND status = 'open'",
        "SELECT COUNT(*) FROM delegations WHERE parent_run_id = 'r' AND status != 'terminal'",
        "SELECT * FROM intent_updates WHERE run_id = 'r' AND applied_at IS NULL ORDER BY contract_version",
        "SELECT delivery_id FROM deliveries WHERE parent_run_id = 'r' AND status = 'dispatched'",
        "SELECT claim_id, phase FROM claim_journal WHERE parent_run_id = 'r' AND phase != 'observed'",
        "SELECT action_id FROM input_requests WHERE run_id = 'r' AND answer IS NULL",
        "SELECT a.*, r.action_id IS NOT NULL AS has_receipt FROM actions a LEFT JOIN receipts r"
        " ON r.action_id = a.action_id WHERE a.run_id = 'r' AND a.loop_index = 1 ORDER BY a.action_index",
    ],
)
def test_what_a_step_asks_about_its_run_is_found_by_index_not_by_scan(tmp_path: Path, sql: str) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    plan = [str(row[3]) for row in ledger.all("EXPLAIN QUERY PLAN " + sql)]
    ledger.close()
    assert plan and not any(step.startswith("SCAN") for step in plan), plan


def test_ledger_refuses_a_newer_schema(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "l.db")
    db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 5}")
    db.close()
    with pytest.raises(RuntimeError, match="newer than this corral"):
        SqliteLedger(tmp_path / "l.db")


def test_events_have_monotonic_cursors_and_are_append_only(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    ledger.begin_boot("b1", 1, 1)
    first = ledger.event("a", "x", n=1)
    second = ledger.event("b", "x", n=2)
    assert second > first
    assert [e["kind"] for e in ledger.events_since(first)] == ["b"]
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        ledger.db.execute("UPDATE events SET kind = 'z'")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        ledger.db.execute("DELETE FROM events")
    ledger.close()


def test_a_failed_transaction_leaves_nothing(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    ledger.begin_boot("b1", 1, 1)
    before = ledger.last_cursor()
    with pytest.raises(ZeroDivisionError), ledger.tx():
        ledger.event("half", "x")
        _ = 1 / 0
    assert ledger.last_cursor() == before
    ledger.close()


def test_event_data_is_redacted(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    ledger.begin_boot("b1", 1, 1)
    ledger.event("leak", "x", note="key sk-abcdefghijklmnopqrstuvwxyz123456", api_key="hunter22222")
    text = (tmp_path / "l.db").read_bytes() + (tmp_path / "l.db-wal").read_bytes()
    assert b"sk-abcdefghijklmnopqrstuvwxyz123456" not in text
    assert b"hunter22222" not in text
    ledger.close()

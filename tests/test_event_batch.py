"""A transaction's events are appended together (issue 50 §4): ``Ledger.emit`` keeps
them until the transaction's commit and SQLite writes them with one multi-row
INSERT, in the order they were emitted, with the cursors they would have had one
by one. A rollback drops them with everything else; a read inside the transaction
sees them; ``event`` (which answers a cursor) keeps its place in the order."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from corral.supervisor.ledger.ledger_sqlite import SqliteLedger


def _kinds(ledger: SqliteLedger) -> list[str]:
    return [event["kind"] for event in ledger.events_since(0, limit=1000) if event["kind"] != "boot-started"]


def _event_inserts(ledger: SqliteLedger, statements: list[str]) -> int:
    return sum(1 for sql in statements if sql.lstrip().upper().startswith("INSERT INTO EVENTS"))


def test_a_transactions_events_are_one_insert_in_their_order(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.begin_boot("b1", 1, 1)
    before = ledger.last_cursor()
    statements: list[str] = []
    ledger.db.set_trace_callback(statements.append)
    try:
        with ledger.tx():
            ledger.emit("one", "x", n=1)
            ledger.emit("two", "x", n=2, token="sk-live-abcdefghijklmnopqrstuvwxyz")
            ledger.emit("three", "y")
    finally:
        ledger.db.set_trace_callback(None)
    assert _event_inserts(ledger, statements) == 1, statements
    page = ledger.events_since(before)
    assert [(e["kind"], e["subject"], e["cursor"]) for e in page] == [
        ("one", "x", before + 1),
        ("two", "x", before + 2),
        ("three", "y", before + 3),
    ]
    assert page[1]["data"] == {"n": 2, "token": "[redacted]"}, "an emitted event is redacted as event()'s are"
    assert page[0]["boot_id"] == "b1"
    ledger.close()


def test_emitted_events_roll_back_and_are_seen_inside_their_transaction(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.begin_boot("b1", 1, 1)
    with pytest.raises(RuntimeError), ledger.tx():
        ledger.emit("lost", "x")
        raise RuntimeError("roll it back")
    assert "lost" not in _kinds(ledger)
    with ledger.tx():
        ledger.emit("first", "x")
        assert [e["kind"] for e in ledger.events_since(0)][-1] == "first", "a read in the transaction sees it"
        cursor = ledger.event("second", "x")  # answers its cursor: the emitted one goes first
        ledger.emit("third", "x")
    assert _kinds(ledger)[-3:] == ["first", "second", "third"]
    assert ledger.events_since(cursor - 1)[0]["kind"] == "second"
    # Outside a transaction an emitted event is its own commit, at once.
    ledger.emit("alone", "x")
    assert _kinds(ledger)[-1] == "alone"
    ledger.close()


def test_the_high_water_mark_covers_emitted_events(tmp_path: Path) -> None:
    from corral.supervisor.ledger.high_water import read_mark

    path = tmp_path / "ledger.db"
    ledger = SqliteLedger(path, check=True)
    try:
        with ledger.tx():
            ledger.emit("probe", "one")
            ledger.emit("probe", "two")
        assert read_mark(path) == ledger.last_cursor(), "the mark names the commit's last event"
    finally:
        ledger.close()


def test_many_emitted_events_fit_sqlites_limits(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.begin_boot("b1", 1, 1)
    with ledger.tx():
        for n in range(2500):
            ledger.emit("bulk", "x", n=n)
    page = ledger.events_since(0, limit=5000, max_bytes=10**7)
    assert [e["data"]["n"] for e in page if e["kind"] == "bulk"] == list(range(2500))
    db = sqlite3.connect(tmp_path / "ledger.db")
    assert db.execute("SELECT COUNT(*) FROM events WHERE kind = 'bulk'").fetchone()[0] == 2500
    db.close()
    ledger.close()

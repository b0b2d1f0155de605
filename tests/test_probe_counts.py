"""The bench's per-operation counts (supervisor/probe_counts.py): each statement the
ledger's connection runs is counted once, by shape, however many triggers it fires."""

from __future__ import annotations

import sqlite3

from corral.supervisor.probe_counts import ProbeCounts, statement_shape


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute("CREATE TABLE t (a, b)")
    db.execute("CREATE TABLE u (a)")
    db.execute("CREATE TEMP TRIGGER t_copy AFTER INSERT ON t BEGIN INSERT INTO u VALUES (new.a); END")
    db.execute("CREATE TEMP TRIGGER t_copy2 AFTER INSERT ON t BEGIN INSERT INTO u VALUES (new.b); END")
    return db


def test_a_write_that_fires_triggers_is_one_statement_and_two_reads_are_two() -> None:
    db = _db()
    counts = ProbeCounts(db)
    counts.start()
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO t VALUES (?, ?)", (1, "x"))
    db.execute("SELECT * FROM t WHERE a = ?", (1,))
    db.execute("SELECT * FROM t WHERE a = ?", (1,))
    db.execute("INSERT INTO t VALUES (?, ?)", (2, "it's"))
    db.execute("COMMIT")
    seen = counts.stop()
    assert seen["statements"] == 6
    assert seen["shapes"] == {
        "BEGIN IMMEDIATE": 1,
        "INSERT INTO t VALUES (?, ?)": 2,
        "SELECT * FROM t WHERE a = ?": 2,
        "COMMIT": 1,
    }
    assert seen["calls"] > 0
    db.execute("SELECT 1")  # stopped: no longer counted
    assert counts.statements.total() == 6


def test_a_shape_hides_the_values() -> None:
    shaped = statement_shape("UPDATE x SET a = 'it''s',  b = 1.5e3 WHERE id = 42")
    assert shaped == "UPDATE x SET a = ?, b = ? WHERE id = ?"


def test_a_backend_without_a_sqlite_connection_counts_calls_only() -> None:
    counts = ProbeCounts(object())
    counts.start()
    sum(range(3))
    seen = counts.stop()
    assert seen["statements"] is None
    assert seen["calls"] > 0

"""The PostgreSQL ledger's pipeline (supervisor/ledger/ledger_pg_wire.py): a
transaction's statements travel together, values are bound and statements
prepared by the server, and a failure anywhere in a batch commits none of it.

Ledger-level, on the worker's PostgreSQL server: no supervisor is started. The
fenced node's batch is test_ledger_port.py's takeover tests.
"""

from __future__ import annotations

from typing import Any

import pytest

from corral.supervisor.runs.run_feature import RunFeatures

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()


def _writer(url: str) -> tuple[Any, Any]:
    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_pg import PostgresLedger
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn = connect_cluster(url)
    hold = cluster.acquire_own(conn, "node-a", None, 30.0, None)
    ledger = PostgresLedger(url, hold.partition, epoch=hold.epoch)
    ledger.begin_boot("b1", 1, 1)
    return conn, ledger


def _kinds(ledger: Any) -> list[str]:
    return [row["kind"] for row in ledger.all("SELECT kind FROM events ORDER BY cursor")]


def test_a_transactions_writes_and_commit_are_one_round_trip(pg_url: str) -> None:
    conn, ledger = _writer(pg_url)
    try:
        ledger.event("warm", "x")  # takes a block of event cursors: later events need no answer
        before = ledger.db.round_trips
        with ledger.tx() as db:
            for index in range(5):
                ledger.event("batched", f"e{index}")
            db.execute("UPDATE boots SET pid = ? WHERE boot_id = ?", (7, "b1"))
        assert ledger.db.round_trips - before == 1, "BEGIN, fence, six writes, marker and COMMIT: one round trip"
        assert _kinds(ledger).count("batched") == 5
        assert ledger.one("SELECT pid FROM boots WHERE boot_id = ?", "b1")["pid"] == 7
        with ledger.tx():
            pass
        # The events read above asked; the boot's row is this writer's own insert, kept
        # through its keyed UPDATE (known_rows.py), and asked nothing.
        assert ledger.db.round_trips - before == 2, "an empty transaction sends nothing"
    finally:
        ledger.close()
        conn.close()


def test_a_failing_statement_in_a_batch_rolls_all_of_it_back(pg_url: str) -> None:
    import psycopg

    conn, ledger = _writer(pg_url)
    try:
        insert = "INSERT INTO boots (boot_id, seq, pid, protocol, started_at) VALUES (?, ?, ?, ?, ?)"
        for attempt in range(3):  # the statements get prepared on the way: they keep working after a failure
            with pytest.raises(psycopg.errors.UniqueViolation), ledger.tx() as db:
                ledger.event("before-the-failure", "x")
                db.execute(insert, ("b1", 99, 1, 1, 0.0))  # b1 exists: the batch fails here, at the COMMIT
                ledger.event("after-the-failure", "x")
            kinds = _kinds(ledger)
            assert "before-the-failure" not in kinds and "after-the-failure" not in kinds, attempt
        with ledger.tx() as db:
            db.execute(insert, ("b2", 2, 1, 1, 0.0))
            ledger.event("after", "x")
        assert _kinds(ledger)[-1] == "after"
        assert ledger.one("SELECT seq FROM boots WHERE boot_id = ?", "b2")["seq"] == 2
    finally:
        ledger.close()
        conn.close()


def test_values_the_server_binds_are_typed_as_sqlite_would_take_them(pg_url: str) -> None:
    """A value only tested for NULL is cast (sql_dialect.py); a statement used with
    values of other types (a small int, a large one, None, a str) is prepared once
    per set of types, and each gets its right answer."""
    conn, ledger = _writer(pg_url)
    try:
        test = "SELECT CASE WHEN ? IS NULL THEN 'null' ELSE 'value' END AS v"
        for value, expected in [(None, "null"), ("x", "value"), (5, "value"), (2**40, "value"), (None, "null")] * 2:
            assert ledger.one(test, value)["v"] == expected, value
        seq = "SELECT boot_id FROM boots WHERE seq = ?"
        for value in [1, 2**40, "1", 1]:
            row = ledger.one(seq, value)
            assert (row["boot_id"] if row else None) == ("b1" if value in (1, "1") else None), value
    finally:
        ledger.close()
        conn.close()


def test_the_read_cache_takes_an_order_by_list_for_no_join() -> None:
    from corral.supervisor.ledger.read_cache import classify

    steers = "SELECT steer_id, text FROM steers WHERE run_id = ? AND applied_at IS NULL ORDER BY created_at, steer_id"
    assert classify(steers) == ("read", "steers")
    assert classify("SELECT * FROM runs r, actions a WHERE a.run_id = r.run_id") == ("uncached", "")


def test_a_write_keeps_the_cached_reads_of_other_rows_and_drops_its_own(pg_url: str) -> None:
    from corral.supervisor.runs import run_store

    conn, ledger = _writer(pg_url)
    try:
        runs = [
            run_store.create_run(ledger, NO_FEATURES, agent_id=f"w{i}", task="t", provider="scripted",
                                 provider_config={"script": {"steps": []}})
            for i in range(2)
        ]
        status = "SELECT status FROM runs WHERE run_id = ?"
        assert ledger.one(status, runs[0])["status"] == "pending"
        with ledger.tx() as db:
            db.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", (runs[1],))
        misses = ledger.cache.misses
        assert ledger.one(status, runs[0])["status"] == "pending"
        assert ledger.cache.misses == misses, "another run's write kept this run's read"
        with ledger.tx() as db:
            db.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", (runs[0],))
        assert ledger.one(status, runs[0])["status"] == "running", "its own row's write dropped it"
        with ledger.tx() as db:  # keyed on another column: may touch any run's row
            db.execute("UPDATE runs SET status = 'failed' WHERE agent_id = ?", ("w0",))
        assert ledger.one(status, runs[0])["status"] == "failed"
        owner = "SELECT agent_id FROM runs WHERE run_id = ?"
        assert ledger.one(owner, runs[0])["agent_id"] == "w0"
        with ledger.tx() as db:
            db.execute("UPDATE runs SET status = 'cancelled' WHERE run_id = ?", (runs[0],))
        misses = ledger.cache.misses
        assert ledger.one(owner, runs[0])["agent_id"] == "w0"
        assert ledger.cache.misses == misses, "a write of other columns of the same row kept the read"
        with ledger.tx() as db:
            db.execute("UPDATE runs SET agent_id = ? WHERE run_id = ?", ("w9", runs[0]))
        assert ledger.one(owner, runs[0])["agent_id"] == "w9"
    finally:
        ledger.close()
        conn.close()


@pytest.mark.parametrize(
    ("write", "kept"),
    [  # the read is of action 'b'; each write's values are ('x', 'b', 'c')
        ("UPDATE actions SET phase = ? WHERE action_id = ? AND phase = ?", False),  # action 'b' itself
        ("UPDATE actions SET phase = ?, run_id = ? WHERE action_id = ?", True),  # action 'c'
        ("DELETE FROM actions WHERE action_id = ?", True),  # action 'x'
        ("UPDATE actions SET action_id = ? WHERE action_id = ? AND phase = ?", False),  # it moves the key
        ("UPDATE actions SET phase = ? WHERE phase = ? OR action_id = ?", False),
        ("DELETE FROM actions WHERE run_id = ? AND action_id = ? AND phase = ?", False),  # keyed on another column
        ("INSERT OR IGNORE INTO actions (action_id, run_id, phase) VALUES (?, ?, ?)", True),  # action 'x'
        ("INSERT INTO actions (phase, action_id, run_id) VALUES (?, ?, ?)", False),  # action 'b'
        ("INSERT INTO actions (phase, run_id) VALUES (?, ?)", False),  # action_id left to its default
        # A subquery among the values and a RETURNING: its own action 'x' still (the ? are counted through it).
        ("INSERT INTO actions (phase, goal, action_id) VALUES ('p', (SELECT g FROM goals WHERE run_id = ?), ?)"
         " RETURNING *", False),  # ('x', 'b', ...): its action is 'b'
        ("INSERT INTO actions (action_id, goal, phase) VALUES (?, (SELECT g FROM goals WHERE run_id = ?), ?)"
         " RETURNING *", True),  # action 'x'
        ("INSERT INTO actions (action_id, phase) VALUES (?, ?), (?, ?)", False),  # several rows: not proven
        ("INSERT INTO actions (action_id, phase) VALUES ((SELECT ?), ?)", False),  # the key from a subquery
    ],
)
def test_which_writes_keep_a_keyed_read(write: str, kept: bool) -> None:
    from corral.supervisor.ledger.read_cache import ReadCache

    cache = ReadCache()
    read = "SELECT * FROM actions WHERE action_id = ?"
    cache.put("actions", read, ("b",), [("b", "prepared")])
    cache.before(write, ("x", "b", "c"))
    assert (cache.get(read, ("b",)) is not None) is kept

"""Issue 51 §4: round trips a durable action no longer waits for, on a PostgreSQL
node's ledger (no supervisor: the stores on a fenced writer).

- A row the writer has in its read cache stays there through its own keyed
  UPDATEs (supervisor/ledger/read_cache.py: the new values put in, typed as the
  server would return them), and an INSERT ... RETURNING * puts the new row
  there: the action read back after ``executing`` costs no round trip, and what
  the cache answers is what the database holds, value for value and type for type.
- An observation's insert waits for no answer (nobody reads its row count): it
  travels with the transaction's COMMIT.
"""

from __future__ import annotations

from typing import Any

import pytest

from corral.supervisor.runs.run_feature import RunFeatures

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

pytest.importorskip("psycopg")


def _writer(url: str) -> tuple[Any, Any]:
    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_pg import PostgresLedger
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn = connect_cluster(url)
    hold = cluster.acquire_own(conn, "node-a", None, 30.0, None)
    ledger = PostgresLedger(url, hold.partition, epoch=hold.epoch)
    ledger.begin_boot("b1", 1, 1)
    return conn, ledger


def _run(ledger: Any) -> str:
    from corral.supervisor.runs import run_store

    run_id: str = run_store.create_run(
        ledger, NO_FEATURES, agent_id="w", task="t", provider="scripted", provider_config={"script": {"steps": []}}
    )
    return run_id


def _as_held(ledger: Any, table: str, key: str, value: Any) -> list[tuple[str, Any, type]]:
    """The row as the database holds it, read past the cache: (column, value, type)."""
    from corral.supervisor.ledger.ledger_pg_wire import Connection

    fresh = Connection(ledger.raw)  # the same connection, no cache
    row = fresh.execute(f"SELECT * FROM {table} WHERE {key} = ?", (value,)).fetchone()
    assert row is not None
    return _typed_values(row)


def _as_cached(ledger: Any, sql: str, value: Any) -> tuple[list[tuple[str, Any, type]], int]:
    """The row the ledger answers, and the round trips it took."""
    before = ledger.db.round_trips
    row = ledger.one(sql, value)
    assert row is not None
    return _typed_values(row), ledger.db.round_trips - before


def _typed_values(row: Any) -> list[tuple[str, Any, type]]:
    names = row.keys()  # a row is a tuple of values, with sqlite3.Row's keys()
    return [(name, value, type(value)) for name, value in zip(names, row, strict=True)]


def test_an_action_read_back_after_its_moves_costs_no_round_trip_and_is_what_the_database_holds(
    pg_url: str,
) -> None:
    from corral.supervisor.runs import action_store

    conn, ledger = _writer(pg_url)
    try:
        run_id = _run(ledger)
        read = "SELECT * FROM actions WHERE action_id = ?"
        row = action_store.prepare_action(
            ledger, run_id, 0, 0, "fs.list", {"path": "."}, NO_FEATURES, rerunnable=True, policy="allow"
        )
        the_id = row["action_id"]
        cached, trips = _as_cached(ledger, read, the_id)
        assert trips == 0, "the inserted row came back from its INSERT ... RETURNING *"
        assert cached == _as_held(ledger, "actions", "action_id", the_id)
        begun = action_store.begin_action(ledger, the_id, NO_FEATURES)
        assert begun["phase"] == "executing"
        cached, trips = _as_cached(ledger, read, the_id)
        assert trips == 0, "executing's UPDATE (attempts = attempts + 1 among its assignments) kept the row"
        assert cached == _as_held(ledger, "actions", "action_id", the_id)
        assert dict((n, v) for n, v, _ in cached)["attempts"] == 1
        action_store.finish_action(ledger, the_id, True, {"entries": ["a", "b"]}, "2 entries", None, NO_FEATURES)
        cached, trips = _as_cached(ledger, read, the_id)
        assert trips == 0
        assert cached == _as_held(ledger, "actions", "action_id", the_id)
        assert dict((n, v) for n, v, _ in cached)["phase"] == "ok"
    finally:
        ledger.close()
        conn.close()


def test_a_compare_and_set_is_applied_when_it_holds_and_changes_nothing_when_not(pg_url: str) -> None:
    conn, ledger = _writer(pg_url)
    try:
        run_id = _run(ledger)
        read = "SELECT * FROM runs WHERE run_id = ?"
        advance = "UPDATE runs SET loop_index = loop_index + 1, updated_at = ? WHERE run_id = ? AND loop_index = ?"
        ledger.one(read, run_id)
        for expected_loop, updated_at, loop in [(1, 5.0, 0), (1, 6.0, 0), (2, 7, 1)]:  # the second: loop moved on
            with ledger.tx() as db:
                db.execute(advance, (updated_at, run_id, loop))
            cached, trips = _as_cached(ledger, read, run_id)
            assert trips == 0
            assert cached == _as_held(ledger, "runs", "run_id", run_id)
            assert dict((n, v) for n, v, _ in cached)["loop_index"] == expected_loop
        assert dict((n, v) for n, v, _ in cached)["updated_at"] == 7.0  # an int bound to a REAL column: a float
    finally:
        ledger.close()
        conn.close()


def test_a_batch_of_actions_keeps_each_others_rows(pg_url: str) -> None:
    """Three actions prepared and begun in one transaction (an agent's read batch):
    each INSERT names its own action, so it keeps the rows of the others."""
    from corral.supervisor.runs import action_store

    conn, ledger = _writer(pg_url)
    try:
        run_id = _run(ledger)
        ids = []
        with ledger.tx():
            for index in range(3):
                row = action_store.prepare_action(
                    ledger, run_id, 0, index, "fs.list", {"path": "."}, NO_FEATURES, rerunnable=True, policy="allow"
                )
                action_store.begin_action(ledger, row["action_id"], NO_FEATURES, current=row)
                ids.append(row["action_id"])
        for the_id in ids:
            cached, trips = _as_cached(ledger, "SELECT * FROM actions WHERE action_id = ?", the_id)
            assert trips == 0, the_id
            assert cached == _as_held(ledger, "actions", "action_id", the_id)
    finally:
        ledger.close()
        conn.close()


@pytest.mark.parametrize(
    "update",
    [
        "UPDATE runs SET loop_index = loop_index * 2 WHERE run_id = ?",  # an expression it does not evaluate
        "UPDATE runs SET loop_index = 7 WHERE run_id = ? AND status = 'pending'",  # more than the key
        "UPDATE runs SET loop_index = (SELECT 7) WHERE run_id = ?",
    ],
)
def test_a_write_it_cannot_apply_drops_the_row_and_the_next_read_asks(pg_url: str, update: str) -> None:
    conn, ledger = _writer(pg_url)
    try:
        run_id = _run(ledger)
        read = "SELECT * FROM runs WHERE run_id = ?"
        ledger.one(read, run_id)
        with ledger.tx() as db:
            db.execute("UPDATE runs SET loop_index = ? WHERE run_id = ?", (3, run_id))
        cached, trips = _as_cached(ledger, read, run_id)
        assert trips == 0, "a keyed UPDATE of plain values kept it"
        with ledger.tx() as db:
            db.execute(update, (run_id,))
        cached, trips = _as_cached(ledger, read, run_id)
        assert trips == 1
        assert cached == _as_held(ledger, "runs", "run_id", run_id)
    finally:
        ledger.close()
        conn.close()


def test_a_rolled_back_update_leaves_no_patched_row(pg_url: str) -> None:
    conn, ledger = _writer(pg_url)
    try:
        run_id = _run(ledger)
        read = "SELECT * FROM runs WHERE run_id = ?"
        ledger.one(read, run_id)
        with pytest.raises(RuntimeError), ledger.tx() as db:
            db.execute("UPDATE runs SET loop_index = ? WHERE run_id = ?", (9, run_id))
            raise RuntimeError("the store gives up before its commit")
        cached, _ = _as_cached(ledger, read, run_id)
        assert dict((n, v) for n, v, _ in cached)["loop_index"] == 0
        assert cached == _as_held(ledger, "runs", "run_id", run_id)
    finally:
        ledger.close()
        conn.close()


def test_an_observation_waits_for_no_answer_of_its_own(pg_url: str) -> None:
    from corral.supervisor.runs import run_store

    conn, ledger = _writer(pg_url)
    try:
        run_id = _run(ledger)
        before = ledger.db.round_trips
        with ledger.tx():
            run_store.add_observation(ledger, run_id, "a-1", 0, {"seen": 1})
            run_store.add_observation(ledger, run_id, "a-2", 0, {"seen": 2})
            run_store.add_observation(ledger, run_id, "a-1", 0, {"seen": 3})  # once per source
        assert ledger.db.round_trips - before == 1, "both inserts went with the COMMIT"
        assert run_store.history(ledger, run_id) == [{"seen": 1}, {"seen": 2}]
    finally:
        ledger.close()
        conn.close()


def _read(ledger: Any, sql: str, *args: Any) -> tuple[list[tuple[Any, ...]], int]:
    """A read through the ledger (its cache), and the round trips it took."""
    before = ledger.db.round_trips
    rows = [tuple(row) for row in ledger.all(sql, *args)]
    return rows, ledger.db.round_trips - before


def _held(ledger: Any, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    from corral.supervisor.ledger.ledger_pg_wire import Connection

    return [tuple(row) for row in Connection(ledger.raw).execute(sql, args).fetchall()]


def test_a_row_this_writer_inserted_answers_a_read_by_its_key(pg_url: str) -> None:
    """A provider request and a plan, inserted at one step boundary and read back by
    their keys at the next: no round trip, and the database's answer."""
    conn, ledger = _writer(pg_url)
    try:
        run_id = _run(ledger)
        slot = f"{run_id}:0"
        with ledger.tx() as db:
            db.execute(
                "INSERT INTO provider_requests (slot, run_id, loop_index, attempt, status, boot_id, started_at)"
                " VALUES (?, ?, ?, ?, 'started', ?, ?)",
                (slot, run_id, 0, 1, "b1", 12),
            )
            db.execute(
                "INSERT INTO plans (run_id, loop_index, plan, raw_sha256, created_at) VALUES (?, ?, ?, ?, ?)",
                (run_id, 0, '{"steps": []}', None, 13.5),
            )
        reads = [
            ("SELECT status FROM provider_requests WHERE slot = ? AND run_id = ?", (slot, run_id)),
            ("SELECT status, started_at, attempt FROM provider_requests WHERE slot = ?", (slot,)),
            ("SELECT status FROM provider_requests WHERE slot = ? AND run_id = ?", (slot, "another-run")),
            ("SELECT plan, raw_sha256 FROM plans WHERE run_id = ? AND loop_index = ?", (run_id, 0)),
            ("SELECT plan FROM plans WHERE loop_index = ? AND run_id = ?", (0, run_id)),
        ]
        for sql, args in reads:
            rows, trips = _read(ledger, sql, *args)
            assert trips == 0, sql
            assert rows == _held(ledger, sql, *args), sql
            assert [[type(v) for v in row] for row in rows] == [
                [type(v) for v in row] for row in _held(ledger, sql, *args)
            ]
        # A keyed UPDATE it can apply; a read it cannot answer (a column the insert left to its default) asks.
        status = "SELECT status, response FROM provider_requests WHERE slot = ?"
        with ledger.tx() as db:
            db.execute("UPDATE provider_requests SET status = 'completed', response = ? WHERE slot = ?", ("r", slot))
        rows, trips = _read(ledger, status, slot)
        assert (rows, trips) == ([("completed", "r")], 0)
        rows, trips = _read(ledger, "SELECT consumed FROM provider_requests WHERE slot = ?", slot)
        assert (rows, trips) == ([(0,)], 1)
        # Any other write of the table forgets its rows: the next read asks.
        with ledger.tx() as db:
            db.execute("UPDATE provider_requests SET consumed = 1 WHERE run_id = ?", (run_id,))
        sql, args = reads[1]
        rows, trips = _read(ledger, sql, *args)
        assert trips == 1
        assert rows == _held(ledger, sql, *args)
    finally:
        ledger.close()
        conn.close()


def test_a_rolled_back_insert_is_not_known(pg_url: str) -> None:
    conn, ledger = _writer(pg_url)
    try:
        run_id = _run(ledger)
        read = "SELECT plan FROM plans WHERE run_id = ? AND loop_index = ?"
        with pytest.raises(RuntimeError), ledger.tx() as db:
            db.execute(
                "INSERT INTO plans (run_id, loop_index, plan, raw_sha256, created_at) VALUES (?, ?, ?, ?, ?)",
                (run_id, 0, "{}", None, 1.0),
            )
            raise RuntimeError("the store gives up before its commit")
        rows, trips = _read(ledger, read, run_id, 0)
        assert (rows, trips) == ([], 1)
    finally:
        ledger.close()
        conn.close()

"""The ledger port: every test here runs on SQLite and on a real PostgreSQL server
(``open_ledger`` is parametrised over both backends). test_swarm.py's join, claim
and delivery tests run the same way."""

from __future__ import annotations

from typing import Any

import pytest

from corral.supervisor.errors import Conflict
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.ledger.schema import MIGRATIONS
from corral.supervisor.runs import action_store, loop_plan_store, provider_store, recovery, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import RunStatus

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()


def _new_run(ledger: Ledger, task: str = "t") -> str:
    return run_store.create_run(
        ledger, NO_FEATURES,
        agent_id="writer", task=task, provider="scripted", provider_config={"script": {"steps": []}}
    )


def test_a_new_ledger_is_at_the_latest_schema_and_reopens(open_ledger: Any) -> None:
    ledger = open_ledger()
    assert ledger.schema_version == len(MIGRATIONS)
    ledger.begin_boot("b1", 1, 1)
    again = open_ledger()
    assert again.schema_version == len(MIGRATIONS)
    assert again.one("SELECT COUNT(*) AS n FROM boots")["n"] == 1


def test_rows_read_by_index_by_name_and_as_a_dict(open_ledger: Any) -> None:
    ledger = open_ledger()
    ledger.begin_boot("b1", 42, 7)
    row = ledger.one("SELECT boot_id, pid, protocol FROM boots")
    assert (row[0], row["pid"], row["protocol"]) == ("b1", 42, 7)
    assert list(row.keys()) == ["boot_id", "pid", "protocol"]
    assert dict(row) == {"boot_id": "b1", "pid": 42, "protocol": 7}
    assert ledger.one("SELECT boot_id FROM boots WHERE pid = ?", 999) is None


def test_events_have_monotonic_cursors_pages_and_are_append_only(open_ledger: Any) -> None:
    ledger = open_ledger()
    ledger.begin_boot("b1", 1, 1)
    cursors = [ledger.event("step", "x", n=n) for n in range(30)]
    assert cursors == sorted(cursors) and len(set(cursors)) == 30
    assert ledger.last_cursor() == cursors[-1]
    page = ledger.events_since(cursors[4], limit=10)
    assert [event["data"]["n"] for event in page] == list(range(5, 15))
    small = ledger.events_since(0, limit=1000, max_bytes=200)
    assert 1 <= len(small) < 31
    for statement in ("UPDATE events SET kind = 'z'", "DELETE FROM events"):
        with pytest.raises(Exception, match="append-only"), ledger.tx() as db:
            db.execute(statement)
    assert ledger.last_cursor() == cursors[-1]


def test_a_failed_transaction_leaves_nothing_and_nested_ones_join(open_ledger: Any) -> None:
    ledger = open_ledger()
    ledger.begin_boot("b1", 1, 1)
    before, commits = ledger.last_cursor(), ledger.commits
    with pytest.raises(ZeroDivisionError), ledger.tx():
        ledger.event("half", "x")
        with ledger.tx():
            ledger.event("inner", "x")
        _ = 1 / 0
    assert ledger.last_cursor() == before
    assert ledger.commits == commits
    seen: list[int] = []
    ledger.on_commit(lambda: seen.append(ledger.commits))
    with ledger.tx():
        ledger.event("a", "x")
        ledger.event("b", "x")
    assert [event["kind"] for event in ledger.events_since(before)] == ["a", "b"]
    assert seen == [commits + 1], "one commit, one notification, for a nested pair"


def test_what_waits_for_a_commit_runs_after_it_and_never_after_a_rollback(open_ledger: Any) -> None:
    ledger = open_ledger()
    ledger.begin_boot("b1", 1, 1)
    seen: list[tuple[str, int]] = []
    ledger.after_commit(lambda: seen.append(("outside", ledger.commits)))
    assert seen == [("outside", ledger.commits)], "outside a transaction: at once"
    commits = ledger.commits
    with ledger.tx():
        ledger.event("a", "x")
        with ledger.tx():
            ledger.after_commit(lambda: seen.append(("joined", ledger.commits)))
        assert len(seen) == 1, "not before the outer commit"
    assert seen[1] == ("joined", commits + 1)
    with pytest.raises(ZeroDivisionError), ledger.tx():
        ledger.after_commit(lambda: seen.append(("rolled back", ledger.commits)))
        _ = 1 / 0
    with ledger.tx():
        pass
    assert [what for what, _ in seen] == ["outside", "joined"], "a rollback drops what waited for it"


def test_a_plan_read_inside_a_rolled_back_transaction_is_not_remembered(open_ledger: Any) -> None:
    ledger = open_ledger()
    run_id = _new_run(ledger)
    run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, NO_FEATURES)
    slot = provider_store.begin_provider_request(ledger, run_id, 0, RunFeatures())["slot"]
    with pytest.raises(ZeroDivisionError), ledger.tx():
        loop_plan_store.commit_plan(ledger, run_id, 0, slot, {"final": "never committed"})
        assert loop_plan_store.get_plan(ledger, run_id, 0) == {"final": "never committed"}
        _ = 1 / 0
    assert loop_plan_store.get_plan(ledger, run_id, 0) is None
    loop_plan_store.commit_plan(ledger, run_id, 0, slot, {"final": "ok"})
    assert loop_plan_store.get_plan(ledger, run_id, 0) == {"final": "ok"}
    assert loop_plan_store.get_plan(ledger, run_id, 0) == {"final": "ok"}, "read again: the same plan"


def test_insert_or_ignore_json_fields_and_insertion_order(open_ledger: Any) -> None:
    ledger = open_ledger()
    run_id = _new_run(ledger)
    with ledger.tx() as db:
        for n in range(2):
            db.execute(
                "INSERT OR IGNORE INTO intent_receipts (receipt_id, run_id, event_ref, data, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                ("r1", run_id, "e1", f'{{"decision": "allow", "n": {n}}}', 1.0),
            )
    rows = ledger.all(
        "SELECT run_id, data FROM intent_receipts WHERE event_ref = ? AND json_extract(data, '$.decision') = ?",
        "e1",
        "allow",
    )
    assert len(rows) == 1 and '"n": 0' in rows[0]["data"], "the second insert was ignored"
    run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, NO_FEATURES)
    first = provider_store.begin_provider_request(ledger, run_id, 0, RunFeatures())["slot"]
    provider_store.provider_failed(ledger, run_id, first, "transient", "try again",
                                   run_store.RunLimits(retry_base_s=0.0), NO_FEATURES)
    second = provider_store.begin_provider_request(ledger, run_id, 0, RunFeatures())["slot"]
    listed = ledger.all("SELECT rowid, * FROM provider_requests WHERE run_id = ? ORDER BY rowid", run_id)
    assert [row["slot"] for row in listed] == [first, second], "rows come back in insertion order"


def test_a_run_and_its_action_lifecycle(open_ledger: Any) -> None:
    ledger = open_ledger()
    ledger.begin_boot("b1", 1, 1)
    run_id = _new_run(ledger)
    claimed = run_store.claim_run(ledger, "writer", NO_FEATURES)
    assert claimed is not None and claimed["run_id"] == run_id
    assert claimed["status"] == RunStatus.RUNNING
    assert run_store.claim_run(ledger, "reviewer", NO_FEATURES) is None, "another agent's lane is empty"
    assert run_store.get_run(ledger, run_id)["status"] == RunStatus.RUNNING
    row = action_store.prepare_action(ledger, run_id, 0, 0, "fs.write", {"path": "a"}, NO_FEATURES,
                                      rerunnable=False, policy="auto")
    action_id = row["action_id"]
    assert action_store.get_action(ledger, action_id)["phase"] == ActionPhase.PREPARED
    again = action_store.prepare_action(ledger, run_id, 0, 0, "fs.write", {"path": "a"}, NO_FEATURES, rerunnable=False,
                                        policy="auto")
    assert again["action_id"] == action_id, "preparing is idempotent by position"
    begun = action_store.begin_action(ledger, action_id, NO_FEATURES)
    assert begun["phase"] == ActionPhase.EXECUTING
    with pytest.raises(Exception):  # noqa: B017 - each backend names its own error
        action_store.move_action(ledger, action_id, ActionPhase.PREPARED)
    assert action_store.get_action(ledger, action_id)["phase"] == ActionPhase.EXECUTING
    commits = ledger.commits
    action_store.finish_action(ledger, action_id, True, {"bytes": 1}, "wrote a", None, NO_FEATURES)
    assert ledger.commits == commits + 1, "the outcome, its receipt and its observation: one commit"
    # A lost reply: the same finish again.
    action_store.finish_action(ledger, action_id, True, {"bytes": 1}, "wrote a", None, NO_FEATURES)
    receipts = ledger.all("SELECT status FROM receipts WHERE action_id = ?", action_id)
    assert [row["status"] for row in receipts] == ["ok"]
    kinds = [e["kind"] for e in ledger.events_since(0, 1000) if e["subject"] == action_id]
    assert kinds == ["action-prepared", "action-executing", "action-ok"], "the terminal event announces the receipt"
    assert [entry["action_id"] for entry in run_store.history(ledger, run_id)] == [action_id]
    with pytest.raises(Conflict):
        action_store.prepare_action(ledger, run_id, 0, 0, "fs.write", {"path": "b"}, NO_FEATURES,
                                    rerunnable=False, policy="auto")
    assert run_store.get_run(ledger, run_id)["status"] == RunStatus.FAILED, "a different call: failed closed"
    assert action_store.get_action(ledger, action_id)["phase"] == ActionPhase.OK


def test_history_is_the_observations_in_order_and_its_tail_past_a_count(open_ledger: Any) -> None:
    ledger = open_ledger()
    ledger.begin_boot("b1", 1, 1)
    run_id = _new_run(ledger)
    for n in range(5):
        run_store.add_observation(ledger, run_id, f"src-{n}", n, {"n": n})
    run_store.add_observation(ledger, run_id, "src-1", 9, {"n": 99})  # once per source: changes nothing
    assert [entry["n"] for entry in run_store.history(ledger, run_id)] == [0, 1, 2, 3, 4]
    assert [entry["n"] for entry in run_store.history(ledger, run_id, after=3)] == [3, 4]
    assert run_store.history(ledger, run_id, after=5) == []


def test_recovery_marks_an_unknown_outcome_and_never_replays_it(open_ledger: Any) -> None:
    """A restart (a new boot on the same ledger) scans what the last one left:
    a side effect that was executing becomes needs-reconciliation."""
    ledger = open_ledger()
    ledger.begin_boot("b1", 1, 1)
    run_id = _new_run(ledger)
    run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, NO_FEATURES)
    effect = action_store.prepare_action(ledger, run_id, 0, 0, "fs.write", {"path": "a"}, NO_FEATURES, rerunnable=False,
                                      policy="auto")["action_id"]
    read = action_store.prepare_action(ledger, run_id, 0, 1, "fs.read", {"path": "a"}, NO_FEATURES, rerunnable=True,
                                    policy="auto")["action_id"]
    action_store.begin_action(ledger, effect, NO_FEATURES)
    action_store.begin_action(ledger, read, NO_FEATURES)
    after_crash = open_ledger()
    after_crash.begin_boot("b2", 2, 1)
    boots = after_crash.all("SELECT boot_id, end_reason FROM boots ORDER BY seq")
    assert [(row["boot_id"], row["end_reason"]) for row in boots] == [("b1", "crashed"), ("b2", None)]
    report = recovery.recover(after_crash, RunFeatures(), lambda provider: True)
    assert report.reconciliations == [effect]
    assert report.rerun_read_only == 1, "a read may run again: recovery leaves it to the next step"
    assert action_store.get_action(after_crash, effect)["phase"] == ActionPhase.NEEDS_RECONCILIATION
    second = recovery.recover(after_crash, RunFeatures(), lambda provider: True)
    assert second.reconciliations == [], "recovery is idempotent"


def test_a_terminal_action_left_without_its_receipt_gets_one_at_recovery(open_ledger: Any) -> None:
    """A ledger written before a receipt shared its terminal move's commit: recovery
    writes the missing receipt once, announced by its own event (the terminal
    event came earlier, alone)."""
    ledger = open_ledger()
    ledger.begin_boot("b1", 1, 1)
    run_id = _new_run(ledger)
    the_id = action_store.prepare_action(ledger, run_id, 0, 0, "fs.read", {"path": "a"}, NO_FEATURES, rerunnable=True,
                                         policy="auto")["action_id"]
    action_store.begin_action(ledger, the_id, NO_FEATURES)
    action_store.move_action(ledger, the_id, ActionPhase.OK, result='{"summary": "read a"}')
    assert ledger.all("SELECT 1 FROM receipts WHERE action_id = ?", the_id) == []
    after = open_ledger()
    after.begin_boot("b2", 2, 1)
    assert recovery.recover(after, RunFeatures(), lambda provider: True).receipts_repaired == 1
    assert recovery.recover(after, RunFeatures(), lambda provider: True).receipts_repaired == 0, "once"
    assert [row["status"] for row in after.all("SELECT status FROM receipts WHERE action_id = ?", the_id)] == ["ok"]
    kinds = [e["kind"] for e in after.events_since(0, 1000) if e["subject"] == the_id]
    assert kinds == ["action-prepared", "action-executing", "action-ok", "receipt-written"]


def test_delivery_claims_move_one_way(open_ledger: Any) -> None:
    ledger = open_ledger()
    run_id = _new_run(ledger)
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO deliveries (delivery_id, kind, source_id, target, parent_run_id, status, payload,"
            " created_at) VALUES ('d1', 'child-result', 'c1', 'writer', ?, 'dispatched', '{}', 1)",
            (run_id,),
        )
        db.execute("UPDATE deliveries SET status = 'claimed' WHERE delivery_id = 'd1'")
    with pytest.raises(Exception, match="one way"), ledger.tx() as db:
        db.execute("UPDATE deliveries SET status = 'dispatched' WHERE delivery_id = 'd1'")
    assert ledger.one("SELECT status FROM deliveries WHERE delivery_id = 'd1'")["status"] == "claimed"


# -- PostgreSQL alone: fencing and the writer's read cache -----------------------------


def _held_partition(url: str, node: str = "node-a") -> Any:
    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn = connect_cluster(url)
    return conn, cluster.acquire_own(conn, node, None, 30.0, None)


def _expire(conn: Any, partition: str) -> None:
    conn.execute("UPDATE corral_cluster.partitions SET lease_until = clock_timestamp() - interval '1 second'"
                 " WHERE name = %s", (partition,))


def test_a_fenced_writer_commits_nothing_more(pg_url: str) -> None:
    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_pg import Fenced, PostgresLedger

    conn, hold = _held_partition(pg_url)
    fenced: list[str] = []
    ledger = PostgresLedger(pg_url, hold.partition, epoch=hold.epoch, on_fenced=fenced.append)
    try:
        ledger.begin_boot("b1", 1, 1)
        assert cluster.adopt(conn, hold.partition, "node-b", 30.0) is None, "a live lease is not taken"
        _expire(conn, hold.partition)
        taken = cluster.adopt(conn, hold.partition, "node-b", 30.0)
        assert taken is not None and taken.epoch == hold.epoch + 1
        before = ledger.last_cursor()
        for _ in range(2):
            with pytest.raises(Fenced, match="held by node node-b"), ledger.tx():
                ledger.event("late", "x")
        assert ledger.last_cursor() == before
        assert len(fenced) == 1, "the daemon is told once"
        assert not cluster.renew(conn, hold, "node-a", 30.0), "nor may it renew"
    finally:
        ledger.close()
        conn.close()


def test_a_takeover_waits_for_the_holders_open_transaction(pg_url: str) -> None:
    """The fence row is locked FOR SHARE by every write: a takeover queues behind
    an open one, so that write lands before the new epoch, never after it."""
    import threading

    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_pg import PostgresLedger
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn, hold = _held_partition(pg_url)
    ledger = PostgresLedger(pg_url, hold.partition, epoch=hold.epoch)
    other = connect_cluster(pg_url)
    try:
        ledger.begin_boot("b1", 1, 1)
        _expire(conn, hold.partition)
        taken: list[Any] = []
        with ledger.tx():
            cursor = ledger.event("inside", "x")
            ledger.db.flush()  # the opening (with its fence) and the write reach the server
            thread = threading.Thread(target=lambda: taken.append(cluster.adopt(other, hold.partition, "node-b", 30)))
            thread.start()
            while not conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%partitions%%'"
            ).fetchone():
                assert thread.is_alive() and not taken, "the takeover must wait for the open write"
        thread.join()
        assert taken[0] is not None and taken[0].epoch == hold.epoch + 1
        assert ledger.events_since(cursor - 1)[0]["kind"] == "inside", "the write before the takeover landed"
    finally:
        ledger.close()
        other.close()
        conn.close()


def test_a_takeover_before_a_transactions_first_statement_refuses_its_commit(pg_url: str) -> None:
    """A transaction opens (BEGIN, the fence) with its first statement: a takeover
    before it is found by the fence in the pipeline, the statements after it are
    not run, and the transaction commits nothing."""
    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_pg import Fenced, PostgresLedger

    conn, hold = _held_partition(pg_url)
    ledger = PostgresLedger(pg_url, hold.partition, epoch=hold.epoch)
    try:
        ledger.begin_boot("b1", 1, 1)
        before = ledger.last_cursor()
        with pytest.raises(Fenced, match="held by node node-b"), ledger.tx():
            assert not ledger.db.sent, "the transaction has not been opened on the server"
            _expire(conn, hold.partition)
            assert cluster.adopt(conn, hold.partition, "node-b", 30.0) is not None
            ledger.event("pipelined", "x")
        assert ledger.last_cursor() == before
    finally:
        ledger.close()
        conn.close()


def test_the_writers_read_cache_sees_its_own_writes_and_forgets_a_rollback(pg_url: str) -> None:
    from corral.supervisor.ledger.ledger_pg import PostgresLedger

    conn, hold = _held_partition(pg_url)
    ledger = PostgresLedger(pg_url, hold.partition, epoch=hold.epoch)
    try:
        assert ledger.cache is not None
        run_id = _new_run(ledger)
        status = lambda: ledger.one("SELECT status FROM runs WHERE run_id = ?", run_id)["status"]  # noqa: E731
        assert status() == "pending" and status() == "pending"
        assert ledger.cache.hits >= 1
        run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, NO_FEATURES)
        assert status() == "running", "a write to runs drops what was read of runs"
        with pytest.raises(ZeroDivisionError), ledger.tx() as db:
            db.execute("UPDATE runs SET status = 'failed' WHERE run_id = ?", (run_id,))
            assert status() == "failed"
            _ = 1 / 0
        assert status() == "running", "nothing of a rolled-back transaction is remembered"
    finally:
        ledger.close()
        conn.close()


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT * FROM actions WHERE action_id = ?", ("read", "actions")),
        ("SELECT a.* FROM actions a LEFT JOIN receipts r ON r.action_id = a.action_id", ("uncached", "")),
        ("SELECT x FROM runs WHERE run_id IN (SELECT run_id FROM actions)", ("uncached", "")),
        ("SELECT 1 FROM runs, actions WHERE 1", ("uncached", "")),
        ("INSERT OR IGNORE INTO steers (a) VALUES (?)", ("write", "steers")),
        ("UPDATE actions SET phase = ? WHERE action_id = ?", ("write", "actions")),
        ("DELETE FROM compaction_requests WHERE run_id = ?", ("write", "compaction_requests")),
        ("CREATE TABLE t (a TEXT)", ("other", "")),
    ],
)
def test_which_statements_the_read_cache_may_answer(sql: str, expected: tuple[str, str]) -> None:
    from corral.supervisor.ledger.read_cache import classify

    assert classify(sql) == expected

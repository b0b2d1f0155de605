"""Issue 51 §4: a node's PostgreSQL ledger runs the transactions of different runs
at once, each on a connection of its own, so one transaction waiting on the server
(a slow commit, a lock, a database far away) does not hold every other run.

Ledger-level, on the worker's PostgreSQL server, with no supervisor: two trio
tasks run their ledger work as the node runs an actor's request
(supervisor/ledger/cooperative.py). Run A's transaction is held open by an
advisory lock this test holds on a connection of its own; it is released only
once run B's commit is seen from outside, so the order is proved, not timed.
"""

from __future__ import annotations

from typing import Any

import trio

#: The lock the test holds while run A waits for it inside its transaction.
LOCK = 51_004
#: Only a guard against a node that cannot overlap (today's single connection):
#: run A then gives up waiting after this, and the test fails on its assertions.
GUARD_LOCK_TIMEOUT = "5s"


def _writer(url: str) -> tuple[Any, Any]:
    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_pg import PostgresLedger
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn = connect_cluster(url)
    hold = cluster.acquire_own(conn, "node-a", None, 30.0, None)
    ledger = PostgresLedger(url, hold.partition, epoch=hold.epoch, group_commit=True)
    ledger.begin_boot("b1", 1, 1)
    return conn, ledger


def _committed_kinds(outside: Any, ledger: Any) -> list[str]:
    rows = outside.execute(f"SELECT kind FROM {ledger.schema}.events ORDER BY cursor").fetchall()
    return [str(row[0]) for row in rows]


async def _until_waiting(outside: Any, order: list[str]) -> bool:
    """Until run A's backend waits for the lock (the server says so), or run A
    ended without ever waiting alongside this task (a node that cannot overlap)."""
    while "a-ended" not in order:
        waiting = outside.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted", (LOCK,)
        ).fetchone()[0]
        if waiting:
            return True
        await trio.sleep(0.01)
    return False


def test_a_run_commits_while_another_runs_transaction_is_held_open(pg_url: str) -> None:
    import psycopg

    from corral.supervisor.ledger.cooperative import cooperatively

    conn, ledger = _writer(pg_url)
    outside = psycopg.connect(pg_url, autocommit=True)
    order: list[str] = []
    seen: dict[str, Any] = {}
    try:
        outside.execute("SELECT pg_advisory_lock(%s)", (LOCK,))

        async def run_a() -> None:
            try:
                with ledger.tx() as db:
                    db.execute(f"SET LOCAL lock_timeout = '{GUARD_LOCK_TIMEOUT}'")
                    ledger.event("a-wrote", "run-a")
                    ledger.one("SELECT pg_advisory_xact_lock(?)", LOCK)  # held by the test
                    order.append("a-got-the-lock")
            except psycopg.errors.LockNotAvailable:
                order.append("a-gave-up")
            order.append("a-ended")

        async def run_b() -> None:
            if not await _until_waiting(outside, order):
                return
            with ledger.tx():
                ledger.event("b-wrote", "run-b")
            order.append("b-committed")
            seen["committed"] = _committed_kinds(outside, ledger)
            seen["stream"] = [event["kind"] for event in ledger.events_since(0)]
            outside.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cooperatively, run_a)
                nursery.start_soon(cooperatively, run_b)

        trio.run(main)
        assert order == ["b-committed", "a-got-the-lock", "a-ended"], order
        assert "b-wrote" in seen["committed"] and "a-wrote" not in seen["committed"], seen
        # Run A holds an earlier event cursor than B's: a reader of the event stream
        # is shown nothing past a cursor still held by an open transaction, so it
        # never pages past A's event before A commits.
        assert "b-wrote" not in seen["stream"] and "a-wrote" not in seen["stream"], seen
        stream = [event["kind"] for event in ledger.events_since(0)]
        assert stream.index("a-wrote") < stream.index("b-wrote"), stream
        assert _committed_kinds(outside, ledger)[-2:] == ["a-wrote", "b-wrote"]
    finally:
        outside.close()
        ledger.close()
        conn.close()


def test_a_write_outside_a_request_gives_up_on_a_row_a_waiting_request_holds(pg_url: str) -> None:
    """Code that is not run cooperatively (a background loop, a control call) blocks
    the event loop while it waits: waiting for a row that a suspended request's
    transaction holds would wait forever. It gives up instead, having committed
    nothing (``LedgerUnavailable``: its caller is held and asks again)."""
    import psycopg

    from corral.supervisor.ledger.cooperative import cooperatively
    from corral.supervisor.ledger.ledger_link import LedgerUnavailable

    conn, ledger = _writer(pg_url)
    outside = psycopg.connect(pg_url, autocommit=True)
    order: list[str] = []
    try:
        outside.execute("SELECT pg_advisory_lock(%s)", (LOCK,))

        async def request() -> None:
            try:
                await _request()
            except (psycopg.Error, LedgerUnavailable):
                order.append("request-failed")

        async def _request() -> None:
            with ledger.tx() as db:
                # Guards for a node without the bound: this wait gives up, then the
                # server ends the session and with it the row lock, so the test
                # fails on its assertions instead of hanging.
                db.execute(f"SET LOCAL lock_timeout = '{GUARD_LOCK_TIMEOUT}'")
                db.execute(f"SET LOCAL idle_in_transaction_session_timeout = '{GUARD_LOCK_TIMEOUT}'")
                db.execute("UPDATE boots SET pid = ? WHERE boot_id = ?", (41, "b1"))
                ledger.one("SELECT pg_advisory_xact_lock(?)", LOCK)  # held by the test
            order.append("request-committed")

        async def background() -> None:
            if not await _until_waiting(outside, order):
                return
            try:
                with ledger.tx() as db:
                    db.execute("UPDATE boots SET pid = ? WHERE boot_id = ?", (42, "b1"))
                order.append("background-committed")
            except LedgerUnavailable as exc:
                order.append("background-held")
                seen = str(exc)
                assert "nothing was committed" in seen, seen
            outside.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cooperatively, request)
                nursery.start_soon(background)  # not cooperative

        trio.run(main)
        assert order == ["background-held", "request-committed"], order
        assert ledger.one("SELECT pid FROM boots WHERE boot_id = ?", "b1")["pid"] == 41
        with ledger.tx() as db:  # asked again, once the request is done: it goes through
            db.execute("UPDATE boots SET pid = ? WHERE boot_id = ?", (42, "b1"))
        assert outside.execute(f"SELECT pid FROM {ledger.schema}.boots WHERE boot_id = 'b1'").fetchone()[0] == 42
    finally:
        outside.close()
        ledger.close()
        conn.close()


def test_a_row_read_while_another_transaction_changes_it_is_not_kept_past_that_commit(pg_url: str) -> None:
    """The read cache is shared by the writer's connections. A read on one connection
    while a transaction on another has changed the row (not committed yet) sees the
    row as it was: that is right then, and must not be what the cache answers once
    the change commits."""
    import psycopg

    from corral.supervisor.ledger.cooperative import cooperatively

    conn, ledger = _writer(pg_url)
    outside = psycopg.connect(pg_url, autocommit=True)
    order: list[str] = []
    pid = "SELECT pid FROM boots WHERE boot_id = ?"
    try:
        assert ledger.one(pid, "b1")["pid"] == 1
        outside.execute("SELECT pg_advisory_lock(%s)", (LOCK,))

        async def changes() -> None:
            with ledger.tx() as db:
                db.execute(f"SET LOCAL lock_timeout = '{GUARD_LOCK_TIMEOUT}'")
                # An expression: the cache drops the row rather than patching it.
                db.execute("UPDATE boots SET pid = ABS(?) WHERE boot_id = ?", (-41, "b1"))
                ledger.one("SELECT pg_advisory_xact_lock(?)", LOCK)  # held by the test
            order.append("a-ended")

        async def reads() -> None:
            if not await _until_waiting(outside, order):
                return
            order.append(f"b-read-{ledger.one(pid, 'b1')['pid']}")
            outside.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cooperatively, changes)
                nursery.start_soon(cooperatively, reads)

        trio.run(main)
        assert order == ["b-read-1", "a-ended"], order
        assert ledger.one(pid, "b1")["pid"] == 41, "the cache kept the row as it was before the commit"
    finally:
        outside.close()
        ledger.close()
        conn.close()

"""One run identity across the cluster, on a real PostgreSQL and real nodes.

A client that chose its run id (the client always does: it is the request's
idempotency key) may send it to any node: after the node it first asked died,
to another one; to the first one again once it is back (writing to a new
partition, its old one still in its adopter's hands); or to two nodes at once.
Every time there is one run, and its effect happens at most once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.core.procs import wait_exit
from corral.supervisor.ledger.port import RunIdTaken
from corral.supervisor.runs.run_feature import RunFeatures
from tests.harness import Daemon, drive_to_end, effects, ledger_rows, wait_for
from tests.test_cluster import ONE_EFFECT, _adopted, _up

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

TASK = "record one effect"


@pytest.fixture
def cluster(short_tmp: Path, pg_url: str) -> Iterator[dict[str, Any]]:
    """Two nodes' daemons (not started) on one spec with one effect per run, as
    tests/test_cluster.py has them; all shut down and reaped afterwards."""
    from corral.supervisor.ledger.ledger_spec import URL_ENV

    (short_tmp / "project").mkdir()
    spec = short_tmp / "one-effect.toml"
    spec.write_text(ONE_EFFECT)
    env = {URL_ENV: pg_url}
    nodes = {name: Daemon(short_tmp / name, spec, env) for name in ("a", "b")}
    extra: list[Daemon] = []
    try:
        yield {"nodes": nodes, "url": pg_url, "tmp": short_tmp, "extra": extra, "env": env}
    finally:
        for daemon in [*extra, *nodes.values()]:
            daemon.shutdown()


def _copies(url: str, run_id: str) -> list[str]:
    """The partitions holding a run with this id."""
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn = connect_cluster(url)
    try:
        found = []
        for name, schema in conn.execute("SELECT name, schema_name FROM corral_cluster.partitions ORDER BY name"):
            if conn.execute(f"SELECT 1 FROM {schema}.runs WHERE run_id = %s", (run_id,)).fetchone():
                found.append(str(name))
        return found
    finally:
        conn.close()



def _effects_of(path: Path, run_id: str) -> int:
    return len([line for line in effects(path) if line["run_id"] == run_id]) if path.exists() else 0


def test_a_run_id_resubmitted_to_another_node_and_back_after_a_kill_is_one_run(
    cluster: dict[str, Any],
) -> None:
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    url, effects_log = cluster["url"], cluster["tmp"] / "effects.log"
    a_pid = _up(a, "node-a", {"CORRAL_FAILPOINTS": "action.after-executing=block@once"})
    _up(b, "node-b")
    run_id = "run-cluster-same-1"
    assert a.call("run", agent_id="writer", task=TASK, run_id=run_id)["run_id"] == run_id
    wait_for("node a inside its failpoint", (a.home / "failpoints" / "action.after-executing.fired").exists)
    os.killpg(a_pid, signal.SIGKILL)
    assert wait_exit(a_pid, 10)

    # The client lost node a's answer and retries on node b: the run it gets is
    # the one node a made, wherever it is now.
    again = b.call("run", agent_id="writer", task=TASK, run_id=run_id)
    assert again["run_id"] == run_id and again.get("existing") is True, again
    assert again["status"] in ("pending", "running", "needs-reconciliation"), again
    assert _copies(url, run_id) == ["node-a"], "one run, in the partition that made it"

    # Node b adopts a's partition; the run's effect is unknown, so it parks.
    adopted = _adopted(cluster, b, "node-a")
    wait_for("the adoption's recovery", lambda: ledger_rows(
        adopted.home, "SELECT 1 FROM runs WHERE run_id = ? AND status = 'needs-reconciliation'", run_id))

    # Node a comes back while its partition is still in b's hands (the parked
    # run is unfinished): it writes to a new partition. The retry there is
    # still the one run.
    a.env.pop("CORRAL_FAILPOINTS")
    _up(a, "node-a")
    assert a.status()["cluster"]["partition"] != "node-a", "its old partition stays with its adopter"
    back = a.call("run", agent_id="writer", task=TASK, run_id=run_id)
    assert back["run_id"] == run_id and back.get("existing") is True, back
    assert back["status"] == "needs-reconciliation", back
    assert _copies(url, run_id) == ["node-a"]

    shown, reconciled = drive_to_end(adopted, run_id, effects_log)
    assert shown["run"]["status"] == "completed", shown["run"]
    assert reconciled == 1, "the unknown outcome was reconciled, never replayed"
    for node in (a, b):
        done = node.call("run", agent_id="writer", task=TASK, run_id=run_id)
        assert (done["run_id"], done.get("existing"), done["status"]) == (run_id, True, "completed"), done
    assert _copies(url, run_id) == ["node-a"]
    assert _effects_of(effects_log, run_id) <= 1, "the effect happened at most once across the cluster"


def test_a_finished_run_id_resubmitted_to_another_node_after_a_kill_is_not_run_again(
    cluster: dict[str, Any],
) -> None:
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    url, effects_log = cluster["url"], cluster["tmp"] / "effects.log"
    a_pid = _up(a, "node-a")
    _up(b, "node-b")
    run_id = "run-cluster-done-1"
    a.call("run", agent_id="writer", task=TASK, run_id=run_id)
    shown, _ = drive_to_end(a, run_id, effects_log)
    assert shown["run"]["status"] == "completed"
    os.killpg(a_pid, signal.SIGKILL)
    assert wait_exit(a_pid, 10)

    again = b.call("run", agent_id="writer", task=TASK, run_id=run_id)
    assert (again["run_id"], again.get("existing"), again["status"]) == (run_id, True, "completed"), again
    # The Python client, given its own id as the request's idempotency key.
    with corral.Client(b.home) as client:
        result = client.run("writer", TASK, run_id=run_id, wait=False)
    assert (result.run_id, result.status) == (run_id, "completed")
    assert _copies(url, run_id) == ["node-a"]
    assert _effects_of(effects_log, run_id) == 1


def test_two_nodes_given_the_same_new_run_id_at_once_create_one_run(cluster: dict[str, Any]) -> None:
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    url, effects_log = cluster["url"], cluster["tmp"] / "effects.log"
    # Nobody is killed here: a lease long enough that node a, held inside its
    # transaction (its event loop too, so its renewals), keeps it however slow b is.
    assert a.spec is not None and "lease_s = 1.5" in ONE_EFFECT
    a.spec = b.spec = a.spec.with_name("long-lease.toml")
    a.spec.write_text(ONE_EFFECT.replace("lease_s = 1.5", "lease_s = 120"))
    _up(a, "node-a", {"CORRAL_FAILPOINTS": "run.creating=block@once"})
    _up(b, "node-b")
    run_id = "run-cluster-race-1"
    answers: dict[str, Any] = {}

    def submit(name: str) -> None:
        node = cluster["nodes"][name]
        try:
            answers[name] = node.call("run", timeout=90, agent_id="writer", task=TASK, run_id=run_id)
        except Exception as exc:  # the assertion below names it
            answers[name] = exc

    first = threading.Thread(target=submit, args=("a",))
    first.start()
    # Node a is inside the run's creating transaction, not committed: now node b
    # is given the same id.
    wait_for("node a inside its creating transaction", (a.home / "failpoints" / "run.creating.fired").exists)
    second = threading.Thread(target=submit, args=("b",))
    second.start()
    try:
        # Node b either answered already, or waits on node a's uncommitted claim
        # of the id (a row lock, seen in the server's own view).
        wait_for("node b to answer or to wait on node a's transaction",
                 lambda: "b" in answers or _waits_on_a_lock(url, "node-b"))
    finally:
        (a.home / "failpoints" / "run.creating.release").touch()
        first.join(120)
        second.join(120)
    for name in ("a", "b"):
        answer = answers[name]
        assert isinstance(answer, dict) and answer["run_id"] == run_id, (name, answer)
    assert sorted(bool(answers[name].get("existing")) for name in ("a", "b")) == [False, True], answers
    owners = _copies(url, run_id)
    assert len(owners) == 1, f"exactly one run was created: {owners}"
    owner = a if owners == ["node-a"] else b
    shown, _ = drive_to_end(owner, run_id, effects_log)
    assert shown["run"]["status"] == "completed"
    assert _effects_of(effects_log, run_id) == 1


def _waits_on_a_lock(url: str, partition: str) -> bool:
    from corral.supervisor.ledger.ledger_pg_wire import connect

    conn = connect(url, "corral-test")
    try:
        row = conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            (f"corral-ledger:{partition}",),
        ).fetchone()
        return row is not None
    finally:
        conn.close()


@pytest.mark.parametrize("first_commits", [True, False])
def test_a_run_id_another_node_is_creating_waits_for_it_then_is_refused_or_taken(
    pg_url: str, first_commits: bool
) -> None:
    """Two writers' creating transactions overlap in the server (the node test
    above cannot hold them so: a transaction's statements reach the server with
    its COMMIT). The second waits on the first's claim of the id: refused if it
    committed, its own if it rolled back. Both are fenced partition writers."""
    from corral.supervisor.cluster import cluster_tables
    from corral.supervisor.ledger.ledger_pg import PostgresLedger
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster
    from corral.supervisor.runs.run_store import create_run

    conn = connect_cluster(pg_url)
    ledgers = {}
    try:
        for name in ("p1", "p2"):
            hold = cluster_tables.acquire_own(conn, name, None, 600.0, None)
            ledgers[name] = PostgresLedger(pg_url, name, epoch=hold.epoch)
        one, two = ledgers["p1"], ledgers["p2"]
        run_id = "run-overlap-" + ("commit" if first_commits else "rollback")

        def create(ledger: PostgresLedger) -> str:
            return create_run(ledger, NO_FEATURES,
                              agent_id="writer", task=TASK, provider="scripted", provider_config={},
                              run_id=run_id)

        second: dict[str, Any] = {}

        def other() -> None:
            try:
                second["run"] = create(two)
            except RunIdTaken as exc:
                second["taken"] = exc.run_id

        thread = threading.Thread(target=other)

        class Abandon(Exception):
            pass

        with contextlib.suppress(Abandon), one.tx() as db:
            create(one)
            db.execute("SELECT 1").fetchone()  # the claim is in the server now, uncommitted
            thread.start()
            wait_for("the second writer to wait on the first's claim", lambda: _waits_on_a_lock(pg_url, "p2"))
            if not first_commits:
                raise Abandon
        thread.join(60)
        mine = "p1" if first_commits else "p2"
        assert second == ({"taken": run_id} if first_commits else {"run": run_id}), second
        assert _copies(pg_url, run_id) == [mine]
        elsewhere = (two if first_commits else one).run_elsewhere(run_id)
        assert elsewhere is not None and elsewhere["partition"] == mine, elsewhere
        assert elsewhere["status"] == "pending"
    finally:
        for ledger in ledgers.values():
            ledger.close()
        conn.close()


def test_runs_of_a_partition_made_before_cluster_wide_ids_claim_theirs_when_it_is_opened(pg_url: str) -> None:
    """A partition written by an older corral has runs and no claims: its writer
    claims them when it opens it, so a submit elsewhere finds them."""
    from corral.supervisor.cluster import cluster_tables
    from corral.supervisor.ledger.ledger_pg import PostgresLedger
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster
    from corral.supervisor.runs.run_store import create_run

    conn = connect_cluster(pg_url)
    holds = {name: cluster_tables.acquire_own(conn, name, None, 600.0, None) for name in ("old", "other")}
    old = PostgresLedger(pg_url, "old", epoch=holds["old"].epoch)
    create_run(old, NO_FEATURES,
               agent_id="writer", task=TASK, provider="scripted", provider_config={}, run_id="run-from-before")
    with old.tx() as db:  # as an older corral left it: no claim, never backfilled
        db.execute("DELETE FROM corral_cluster.run_ids")
        db.execute("DELETE FROM corral_meta WHERE key = 'run_ids_claimed'")
    old.close()
    other = PostgresLedger(pg_url, "other", epoch=holds["other"].epoch)
    try:
        assert other.run_elsewhere("run-from-before") is None
        PostgresLedger(pg_url, "old", epoch=holds["old"].epoch).close()  # the upgraded corral opens it
        found = other.run_elsewhere("run-from-before")
        assert found is not None and (found["partition"], found["status"]) == ("old", "pending"), found
    finally:
        other.close()
        conn.close()

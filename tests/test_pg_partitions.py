"""No partition of a cluster is left without a live owner, and a run waiting for
reconciliation is reconciled from any node.

Real nodes (each its own process group and home, as on separate hosts) on a real
PostgreSQL server; nodes are SIGKILLed at named failpoints. Waiting is on the
cluster tables, status and failpoint markers, never on timers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.chaos.invariants import check_all
from corral.chaos.reconciler import decide, pending_reconciliations
from corral.core.procs import wait_exit
from corral.supervisor.cluster import cluster_tables as cluster
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_pg import PostgresLedger
from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster
from corral.supervisor.ledger.ledger_spec import URL_ENV
from tests.harness import Daemon, adopted_daemon, cli, effects, ledger_rows, one_effect_spec, show, wait_for

LEASE_S = 1.5

ONE_EFFECT = one_effect_spec(f"lease_s = {LEASE_S}\nretire_idle_s = 1.0")


@pytest.fixture
def nodes(short_tmp: Path, pg_url: str) -> Iterator[dict[str, Any]]:
    (short_tmp / "project").mkdir()
    spec = short_tmp / "swarm.toml"
    spec.write_text(ONE_EFFECT)
    env = {URL_ENV: pg_url}
    daemons = {name: Daemon(short_tmp / name, spec, dict(env)) for name in ("a", "b")}
    extra: list[Daemon] = []
    try:
        yield {**daemons, "url": pg_url, "tmp": short_tmp, "extra": extra, "env": env}
    finally:
        for daemon in [*extra, *daemons.values()]:
            daemon.shutdown()


def _up(daemon: Daemon, node: str, failpoints: str = "") -> int:
    env = {**daemon.env, **({"CORRAL_FAILPOINTS": failpoints} if failpoints else {})}
    result = cli(daemon.home, "up", "--spec", str(daemon.spec), "--node", node, env=env)
    assert result.returncode == 0, result.stderr + result.stdout
    pid = homes.read_endpoint(daemon.home).pid
    daemon.pids_seen.add(pid)
    return pid


def _partitions(url: str) -> dict[str, dict[str, Any]]:
    """Every partition, with whether its holder is a live node (by the database's clock)."""
    with contextlib.closing(connect_cluster(url)) as conn:
        view = cluster.view(conn)
        wanted = dict(conn.execute(f"SELECT name, wanted_by FROM {cluster.CLUSTER_SCHEMA}.partitions").fetchall())
    live = {row["node_id"] for row in view["nodes"] if row["status"] == "up" and (row["lease_left_s"] or 0) > 0}
    return {row["name"]: {**row, "holder_live": row["holder"] in live, "wanted_by": wanted.get(row["name"])}
            for row in view["partitions"]}


def _owned(url: str) -> bool:
    """Every partition's lease is held by a live node."""
    return all(row["holder_live"] and row["lease_left_s"] > 0 for row in _partitions(url).values())


def _killed_mid_effect(nodes: dict[str, Any]) -> tuple[str, Daemon]:
    """Node a dies (its whole process group) with ``executing`` committed and its
    agent not yet told; node b adopts its partition, whose run then waits for a
    person to reconcile the effect."""
    a, b = nodes["a"], nodes["b"]
    a_pid = _up(a, "node-a", "action.after-executing=block@once")
    _up(b, "node-b")
    run_id = a.call("run", agent_id="writer", task="record one effect")["run_id"]
    wait_for("node a inside its failpoint", (a.home / "failpoints" / "action.after-executing.fired").exists)
    os.killpg(a_pid, signal.SIGKILL)
    assert wait_exit(a_pid, 10)
    adopted = adopted_daemon(b, "node-a", nodes["env"])
    nodes["extra"].append(adopted)
    wait_for("the adoption's recovery", lambda: ledger_rows(
        adopted.home, "SELECT 1 FROM runs WHERE run_id = ? AND status = 'needs-reconciliation'", run_id))
    return run_id, adopted


def test_a_node_back_beside_a_busy_adopter_takes_its_partition_back_and_reconciles_from_home(
    nodes: dict[str, Any],
) -> None:
    a, url = nodes["a"], nodes["url"]
    run_id, adopted = _killed_mid_effect(nodes)

    # Node a comes back while b's adoption still has a run to finish: a writes its
    # new runs to a new partition, and still asks for its old one.
    _up(a, "node-a")
    assert a.status()["cluster"]["partition"] == "node-a-2"
    held = _partitions(url)["node-a"]
    assert (held["holder"], held["wanted_by"]) == ("node-b", "node-a")

    # The person is on node a's host: the action is reconciled from there, by the
    # CLI, though node b holds the partition.
    with contextlib.closing(PostgresLedger(url, "node-a", readonly=True)) as ledger:
        [pending] = pending_reconciliations(ledger)
    outcome, note = decide(pending, nodes["tmp"] / "effects.log")
    done = cli(a.home, "reconcile", pending["action_id"], "--as", outcome, "--note", note, env=a.env)
    assert done.returncode == 0, done.stderr + done.stdout
    assert f"(run {run_id})" in done.stdout
    phase = ledger_rows(adopted.home, "SELECT phase FROM actions WHERE action_id = ?", pending["action_id"])
    assert phase == [{"phase": outcome}]

    wait_for("the run to finish on the adopter", lambda: show(a, run_id)["run"]["status"] == "completed")
    # Its runs are over: the adopter hands the partition over, and node a owns it
    # (no supervisor: its runs are over), beside the one it writes to.
    wait_for("every partition held by a live node", lambda: _owned(url) and _partitions(url)["node-a"]["holder"]
             == "node-a")
    parts = _partitions(url)
    assert {name: row["holder"] for name, row in parts.items()} == {
        "node-a": "node-a", "node-a-2": "node-a", "node-b": "node-b"}
    assert parts["node-a"]["wanted_by"] is None
    wait_for("node a to keep its old partition dormant", lambda: a.status()["cluster"]["dormant"] == ["node-a"])

    # A second try reaches the dormant partition: node a serves it again, and its
    # supervisor refuses with the reason, changing nothing.
    again = cli(a.home, "reconcile", pending["action_id"], "--as", outcome, "--note", note, env=a.env)
    assert again.returncode != 0 and "only needs-reconciliation actions are reconciled" in again.stderr, again
    assert ledger_rows(adopted.home, "SELECT phase FROM actions WHERE action_id = ?", pending["action_id"]) == phase
    wait_for("node a's partition dormant again", lambda: a.status()["cluster"]["dormant"] == ["node-a"])
    wait_for("every partition held by a live node", lambda: _owned(url))
    lines = [line for line in effects(nodes["tmp"] / "effects.log") if line["run_id"] == run_id]
    assert len(lines) == (1 if outcome == "ok" else 0), "reconciled by evidence, never replayed"
    with contextlib.closing(PostgresLedger(url, "node-a", readonly=True)) as ledger:
        own = nodes["tmp"] / "effects-node-a.log"
        own.write_text("".join(json.dumps(line) + "\n" for line in lines))
        for check in check_all(ledger, own):
            assert check.passed, (check.name, check.failures)


def test_a_dead_nodes_idle_partition_gets_a_live_owner_and_goes_home_when_it_returns(
    nodes: dict[str, Any],
) -> None:
    a, b, url = nodes["a"], nodes["b"], nodes["url"]
    a_pid = _up(a, "node-a")
    _up(b, "node-b")
    # Node a dies with nothing unfinished: nothing to adopt, but its partition must
    # not be left to nobody.
    os.killpg(a_pid, signal.SIGKILL)
    assert wait_exit(a_pid, 10)
    wait_for("a live node to hold node a's partition", lambda: _partitions(url)["node-a"]["holder"] == "node-b", 90)
    wait_for("every partition held by a live node", lambda: _owned(url))
    held = _partitions(url)["node-a"]
    assert (held["holder"], held["epoch"], held["adopted_from"]) == ("node-b", 2, "node-a")
    assert b.status()["cluster"]["dormant"] == ["node-a"]
    shown = cli(b.home, "status", env=b.env)
    assert "held by this node with no supervisor (their runs are over): node-a" in shown.stdout, shown
    assert not (b.home / "adopted" / "node-a").exists(), "an idle partition needs no supervisor"

    # Node a comes back: it asks for its partition, and b lets it go at once.
    _up(a, "node-a")
    assert a.status()["cluster"]["partition"] == "node-a"
    wait_for("b to forget the partition it let go", lambda: b.status()["cluster"]["dormant"] == [])
    held = _partitions(url)["node-a"]
    assert (held["holder"], held["epoch"]) == ("node-a", 3)
    # Its first renewal follows its boot (a lease may lapse meanwhile): then all are held.
    wait_for("every partition held by a live node", lambda: _owned(url))

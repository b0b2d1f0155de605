"""Every connection of a node that writes is fenced: a node taken over commits
nothing more, on any of its connections, however late it wakes.

A real node on a real PostgreSQL server is held at a named failpoint while its
partition is taken over (the epoch bumped, as adoption does); then it is let go.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import client
from corral.core.procs import wait_exit
from corral.supervisor.cluster import cluster_tables as cluster
from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster, schema_of
from corral.supervisor.ledger.ledger_spec import URL_ENV
from tests.harness import Daemon, cli, one_effect_spec, wait_for

LEASE_S = 1.5

ONE_EFFECT = one_effect_spec(f"lease_s = {LEASE_S}")


@pytest.fixture
def node_a(short_tmp: Path, pg_url: str) -> Iterator[Daemon]:
    (short_tmp / "project").mkdir()
    spec = short_tmp / "swarm.toml"
    spec.write_text(ONE_EFFECT)
    daemon = Daemon(short_tmp / "a", spec, {URL_ENV: pg_url})
    try:
        yield daemon
    finally:
        daemon.shutdown()


def _partition(url: str, name: str) -> dict[str, Any]:
    with contextlib.closing(connect_cluster(url)) as conn:
        return next(row for row in cluster.view(conn)["partitions"] if row["name"] == name)


def _syncs(url: str, partition: str) -> int:
    """Group commit's counter row in the partition (what its sync connection writes)."""
    with contextlib.closing(connect_cluster(url)) as conn:
        row = conn.execute(f"SELECT value FROM {schema_of(partition)}.corral_meta WHERE key = 'syncs'").fetchone()
        return int(row[0]) if row else 0


def test_group_commits_sync_connection_is_fenced_after_a_takeover(node_a: Daemon, pg_url: str) -> None:
    up = cli(node_a.home, "up", "--spec", str(node_a.spec), "--node", "node-a",
             env={**node_a.env, "CORRAL_FAILPOINTS": "ledger.before-sync=block@once"})
    assert up.returncode == 0, up.stderr + up.stdout
    pid = node_a.endpoint.pid
    node_a.pids_seen.add(pid)
    # A run's creation commits, and its reply waits for group commit's sync: the
    # node is held there, its commits in the WAL, nothing flushed yet.
    caller = threading.Thread(target=lambda: _quietly(node_a.home), daemon=True)
    caller.start()
    fired = node_a.home / "failpoints" / "ledger.before-sync.fired"
    wait_for("node a held before its sync", fired.exists)
    # Its lease runs out while it is held; another node takes the partition over,
    # exactly as adoption does (a new epoch).
    wait_for("node a's lease to run out", lambda: _partition(pg_url, "node-a")["lease_left_s"] < 0)
    with contextlib.closing(connect_cluster(pg_url)) as conn:
        hold = cluster.adopt(conn, "node-a", "node-b", 60.0)
    assert hold is not None and hold.epoch == 2
    before = _syncs(pg_url, "node-a")

    (node_a.home / "failpoints" / "ledger.before-sync.release").touch()
    assert wait_exit(pid, 30), "a fenced node stops"
    caller.join(30)
    assert _syncs(pg_url, "node-a") == before, "the sync connection wrote after the takeover"
    log = (node_a.home / "logs" / "supervisor.log").read_text()
    assert "fenced, stopping at once" in log
    held = _partition(pg_url, "node-a")
    assert (held["holder"], held["epoch"]) == ("node-b", 2)


def _quietly(home: Path) -> None:
    """A run's creation, whose reply never comes (its node stops, fenced)."""
    with contextlib.suppress(Exception):
        client.call(home, "run", timeout=60, agent_id="writer", task="record one effect", run_id="run-tfenced0001")

"""One project, one revision, across a PostgreSQL cluster (seed 004 V1.1 §2: "项目
execution-owner 是项目级跨进程系统锁，不按 AppData 分叉；不同 AppData 启动的 Runner 不能同时接管同一项目").

A cluster's nodes take no project lock of their own; they share one ledger, each
writing its own partition. Before, each partition kept its own project revision, so
two nodes on one project root counted two revisions for the same files: a
verification in one could stand while the other changed the sources. Now the
revision is one number per project root for the whole cluster
(``corral_cluster.project_heads``); each partition still lists the revisions its
own actions made. Real PostgreSQL, two partitions held as nodes hold them."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral.supervisor.cluster import cluster_tables as cluster
from corral.supervisor.ledger.ledger_pg import PostgresLedger
from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster
from corral.supervisor.project import preview_gate, revision_store, verification_store


@pytest.fixture
def partitions(pg_url: str) -> Iterator[Any]:
    opened: list[PostgresLedger] = []

    def hold(partition: str, project: str) -> PostgresLedger:
        with contextlib.closing(connect_cluster(pg_url)) as conn:
            held = cluster.acquire_own(conn, partition, None, 300.0, None)
        ledger = PostgresLedger(pg_url, held.partition, epoch=held.epoch, project=project)
        opened.append(ledger)
        return ledger

    yield hold
    for ledger in opened:
        ledger.close()


def _write(ledger: PostgresLedger, action_id: str) -> int:
    return revision_store.record(ledger, {"action_id": action_id, "run_id": f"run-{action_id}", "tool": "fs.write"})


def test_two_partitions_on_one_project_root_keep_one_revision(partitions: Any) -> None:
    a, b = partitions("node-a", "/srv/game"), partitions("node-b", "/srv/game")
    other = partitions("node-c", "/srv/elsewhere")
    assert _write(a, "a1") == 1
    assert revision_store.current(b) == 1, "the other node sees the write to the same project"
    # A verification node A starts on revision 1 is stale once node B writes revision 2.
    assert _write(b, "b1") == 2 and revision_store.current(a) == 2
    stale = verification_store.record(a, "a-verify", "run-a1", revision=1, fingerprint="f" * 64, passed=True,
                                      sources_changed=False, outputs=[])
    assert stale["status"] == "stale"
    assert _write(a, "a2") == 3, "numbers never repeat across the nodes"
    assert _write(a, "a2") == 3, "one action makes one revision, however often it is recorded"
    assert revision_store.current(other) == 0, "another project root counts its own"
    assert [row["revision"] for row in a.all("SELECT revision FROM project_revisions ORDER BY revision")] == [1, 3]


def _preview(ledger: PostgresLedger, action_id: str, run_id: str, revision: int) -> None:
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO actions (action_id, run_id, agent_id, loop_index, action_index, tool, input, fingerprint,"
            " phase, rerunnable, policy, result, boot_id, created_at, updated_at, finished_at)"
            " VALUES (?, ?, 'writer', 0, 0, 'preview.validate', '{}', 'f', 'ok', 0, 'auto', ?, 'b', ?, ?, ?)",
            (action_id, run_id, json.dumps({"output": {"passed": True, "revision": revision}}), time.time(),
             time.time(), time.time()),
        )


def test_a_preview_speaks_for_the_revision_it_saw_on_every_node(partitions: Any) -> None:
    """The preview gate (V1.1 §3) on a cluster: a preview passed on revision 1 stops
    counting once another node writes revision 2 to the same root."""
    a, b = partitions("node-a", "/srv/game"), partitions("node-b", "/srv/game")
    revision_store.record(a, {"action_id": "a1", "run_id": "run-a", "tool": "fs.write"})
    _preview(a, "a-preview", "run-a", 1)
    assert preview_gate.missing_reason(a, "run-a") is None
    revision_store.record(b, {"action_id": "b1", "run_id": "run-b", "tool": "fs.write"})
    reason = preview_gate.missing_reason(a, "run-a")
    assert reason is not None and "revision 2" in reason

"""The shared run queue of a PostgreSQL cluster, as the ledger's statements see it.

A root run submitted to a node that has no room for it waits in
``corral_cluster.queue`` (its id claimed cluster-wide as ``QUEUED`` in
``run_ids``, in the same transaction). A node with room takes it in the
transaction that creates the run in its own partition, fenced like every write
of that node: the queue row is locked ``FOR UPDATE SKIP LOCKED`` and deleted,
and the id's ``run_ids`` row moves to the partition. Two nodes never take one
run: the second skips the locked row (and finds it gone once the first
committed). PostgreSQL is the engine here, as DBOS's queues use it: no
consensus of our own.

The decisions (which agent has room, what goes back on a node's death) are in
supervisor/cluster/run_queue.py; these are the statements.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from corral.core import failpoints
from corral.supervisor.ledger.ledger_pg_cluster import CLUSTER_SCHEMA, QUEUED, schema_of
from corral.supervisor.ledger.port import LedgerError

_C = CLUSTER_SCHEMA


class QueuedRunTaken(Exception):
    """Another node took this queued run first (or is taking it now): nothing was written."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"queued run {run_id} was taken by another node")
        self.run_id = run_id


@dataclass(frozen=True)
class Queued:
    """A run waiting in the shared queue: the submit's parameters, as given."""

    run_id: str
    agent_id: str
    params: dict[str, Any]


def enqueue(db: Any, run_id: str, agent_id: str, params: dict[str, Any], node: str) -> None:
    """In the submitting node's (fenced) transaction: the id claimed as queued
    (``RunIdTaken`` at commit if the cluster has it), and the queue row."""
    db.send(
        f"INSERT INTO {_C}.run_ids (run_id, partition, created_at) VALUES (%s, %s, clock_timestamp())", (run_id, QUEUED)
    )
    db.send(
        f"INSERT INTO {_C}.queue (run_id, agent_id, params, submitted_by, submitted_at)"
        " VALUES (%s, %s, %s::jsonb, %s, clock_timestamp())",
        (run_id, agent_id, json.dumps(params), node),
    )


def take(db: Any, run_id: str) -> None:
    """In the claiming node's creating transaction, before the run id is claimed
    for its partition: the queue row locked and gone, the queued claim of the id
    let go. A row another node holds (or took) raises ``QueuedRunTaken``: the
    transaction rolls back, nothing is written."""
    row = db.send(
        f"DELETE FROM {_C}.queue WHERE run_id = (SELECT run_id FROM {_C}.queue WHERE run_id = %s"
        " AND cancelled_at IS NULL FOR UPDATE SKIP LOCKED) RETURNING run_id",
        (run_id,),
    ).fetchone()
    if row is None:
        raise QueuedRunTaken(run_id)
    db.send(f"DELETE FROM {_C}.run_ids WHERE run_id = %s AND partition = %s", (run_id, QUEUED))
    failpoints.hit("queue.claiming")  # the row is this node's, uncommitted: another node claims now


def waiting(conn: Any, agent_ids: list[str], limit: int) -> list[Queued]:
    """The oldest queued runs of these agents that no node is taking right now
    (a read on an autocommit connection: the locks end with the statement;
    taking one is ``take``, in the creating transaction)."""
    if not agent_ids or limit <= 0:
        return []
    rows = conn.execute(
        f"SELECT run_id, agent_id, params FROM {_C}.queue WHERE agent_id = ANY(%s) AND cancelled_at IS NULL"
        " ORDER BY submitted_at, run_id LIMIT %s FOR UPDATE SKIP LOCKED",
        (agent_ids, limit),
    ).fetchall()
    return [Queued(str(r[0]), str(r[1]), r[2] if isinstance(r[2], dict) else json.loads(r[2])) for r in rows]


def queued_run(db: Any, run_id: str) -> dict[str, Any] | None:
    """A run of the shared queue as a submit answers it (None: not queued)."""
    row = db.send(f"SELECT agent_id, cancelled_at IS NOT NULL FROM {_C}.queue WHERE run_id = %s",
                  (run_id,)).fetchone()
    if row is None:
        return None
    if row[1]:
        return {"run_id": run_id, "agent_id": str(row[0]), "status": "cancelled", "final_reply": None}
    return {"run_id": run_id, "agent_id": str(row[0]), "status": "pending", "queued": True}


def depth(conn: Any) -> int:
    """Runs waiting for a node (not those cancelled while they waited)."""
    row = conn.execute(f"SELECT COUNT(*) FROM {_C}.queue WHERE cancelled_at IS NULL").fetchone()
    return int(row[0]) if row else 0


def submit(conn: Any, run_id: str, agent_id: str, params: dict[str, Any], by: str) -> bool:
    """A client's submit, on its own autocommit connection (no partition is
    its): the id claimed as queued and the queue row, in one transaction.
    False: the cluster already has this id (nothing was written)."""
    with conn.transaction():
        claimed = conn.execute(
            f"INSERT INTO {_C}.run_ids (run_id, partition, created_at) VALUES (%s, %s, clock_timestamp())"
            " ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
            (run_id, QUEUED),
        ).fetchone()
        if claimed is None:
            return False
        conn.execute(
            f"INSERT INTO {_C}.queue (run_id, agent_id, params, submitted_by, submitted_at)"
            " VALUES (%s, %s, %s::jsonb, %s, clock_timestamp())",
            (run_id, agent_id, json.dumps(params), by),
        )
    return True


def cancel(conn: Any, run_id: str) -> bool | None:
    """Cancel a run still waiting in the queue: its row stays, as its record, and
    no node takes it. A node taking it now holds the row: this waits for that
    transaction, then finds it gone. True: cancelled now; False: it was already;
    None: not in the queue (a node has it: its holder cancels it)."""
    with conn.transaction():
        row = conn.execute(f"SELECT cancelled_at IS NOT NULL FROM {_C}.queue WHERE run_id = %s FOR UPDATE",
                           (run_id,)).fetchone()
        if row is None:
            return None
        if row[0]:
            return False
        conn.execute(f"UPDATE {_C}.queue SET cancelled_at = clock_timestamp() WHERE run_id = %s", (run_id,))
    return True


def run_elsewhere(db: Any, run_id: str, partition: str, where: str) -> dict[str, Any] | None:
    """The run ``run_id`` another partition (not ``partition``) holds, or the shared
    queue, read through ``db`` (not the read cache: it is another writer's); None:
    none does."""
    row = db.send(
        f"SELECT i.partition, p.schema_name FROM {CLUSTER_SCHEMA}.run_ids i"
        f" LEFT JOIN {CLUSTER_SCHEMA}.partitions p ON p.name = i.partition"
        " WHERE i.run_id = %s AND i.partition <> %s",
        (run_id, partition),
    ).fetchone()
    if row is not None and row[0] == QUEUED:
        return queued_run(db, run_id)  # None: taken meanwhile
    if row is None or row[1] is None:
        return None
    holder, schema = str(row[0]), str(row[1])
    if schema != schema_of(holder):
        raise LedgerError(f"{where}: partition {holder} names schema {schema!r}")
    run = db.send(
        f"SELECT r.agent_id, r.status, p.text FROM {schema}.runs r"
        f" LEFT JOIN {schema}.replies p ON p.run_id = r.run_id WHERE r.run_id = %s",
        (run_id,),
    ).fetchone()
    if run is None:  # claimed with its run in one transaction: not reached
        return None
    return {"run_id": run_id, "agent_id": str(run[0]), "status": str(run[1]), "partition": holder,
            "final_reply": run[2]}

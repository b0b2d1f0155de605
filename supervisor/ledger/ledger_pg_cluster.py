"""The cluster tables of a PostgreSQL ledger: nodes, partitions and their leases,
and the fence functions every write transaction of a node calls.

A partition is a PostgreSQL schema named after its node (``schema_of``); its row
in ``corral_cluster.partitions`` holds the lease and the fencing token (the
epoch). supervisor/ledger/ledger_pg.py checks the fence; supervisor/cluster/cluster_tables.py takes
partitions over and renews leases.
"""

from __future__ import annotations

import re
from typing import Any

from corral.supervisor.ledger.ledger_pg_wire import connect
from corral.supervisor.ledger.port import LedgerError

CLUSTER_SCHEMA = "corral_cluster"
#: What the fence raises when a writer's epoch is stale (a class of our own).
FENCE_SQLSTATE = "CF001"
#: What it raises when the writer's lease lapsed (nobody took it over yet).
LAPSED_SQLSTATE = "CF002"
#: A holder renews its lease; ``renew`` in supervisor/cluster/cluster_tables.py and a writer whose
#: lease is about to lapse use it (the row must still be this holder's epoch).
RENEW_SQL = (
    f"UPDATE {CLUSTER_SCHEMA}.partitions SET lease_until = clock_timestamp() + make_interval(secs => %s)"
    " WHERE name = %s AND epoch = %s AND holder = %s RETURNING epoch"
)
#: ``run_ids.partition`` of a run waiting in the shared queue (no partition name
#: starts with "~": ``PARTITION_NAME``).
QUEUED = "~queued"
#: The channel a request for a partition's holder is announced on (its payload:
#: the partition), so the holder takes it at once rather than at its next tick
#: (supervisor/cluster/forwarding.py, node_requests.py).
REQUESTS_CHANNEL = "corral_requests"
#: The key of ``run_ids``: a second claim of a run id violates it.
RUN_ID_KEY = "run_ids_pkey"
PARTITION_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")

CLUSTER_DDL = [
    f"""
CREATE SCHEMA IF NOT EXISTS {CLUSTER_SCHEMA}
""",
    f"""
CREATE TABLE IF NOT EXISTS {CLUSTER_SCHEMA}.nodes (
    node_id      TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          BIGINT NOT NULL,
    home         TEXT NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    heartbeat_at TIMESTAMPTZ NOT NULL,
    lease_until  TIMESTAMPTZ NOT NULL,
    status       TEXT NOT NULL
)
""",
    f"""
CREATE TABLE IF NOT EXISTS {CLUSTER_SCHEMA}.partitions (
    name         TEXT PRIMARY KEY,
    schema_name  TEXT NOT NULL UNIQUE,
    holder       TEXT NOT NULL,
    epoch        BIGINT NOT NULL,
    lease_until  TIMESTAMPTZ NOT NULL,
    spec_path    TEXT,
    created_at   TIMESTAMPTZ NOT NULL,
    adopted_from TEXT,
    adopted_at   TIMESTAMPTZ
)
""",
    # The node whose partition this is asks for it back (supervisor/cluster/cluster_tables.py). Only
    # when missing: ALTER TABLE locks the table against every node's writes.
    f"""
DO $wanted$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = '{CLUSTER_SCHEMA}'
                   AND table_name = 'partitions' AND column_name = 'wanted_by') THEN
        ALTER TABLE {CLUSTER_SCHEMA}.partitions ADD COLUMN wanted_by TEXT;
    END IF;
END $wanted$
""",
    # What a node takes on at once (supervisor/cluster/run_queue.py), for status.
    f"""
DO $capacity$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = '{CLUSTER_SCHEMA}'
                   AND table_name = 'nodes' AND column_name = 'capacity') THEN
        ALTER TABLE {CLUSTER_SCHEMA}.nodes ADD COLUMN capacity JSONB;
    END IF;
END $capacity$
""",
    # A call for a partition made on another node (``corral reconcile`` there): the
    # partition's holder takes it, runs it on its own fenced ledger, and answers
    # (supervisor/cluster/forwarding.py). Only the holder writes a partition.
    f"""
CREATE TABLE IF NOT EXISTS {CLUSTER_SCHEMA}.requests (
    id           BIGSERIAL PRIMARY KEY,
    partition    TEXT NOT NULL,
    call         TEXT NOT NULL,
    params       JSONB NOT NULL,
    asked_by     TEXT NOT NULL,
    asked_at     TIMESTAMPTZ NOT NULL,
    taken_by     TEXT,
    taken_at     TIMESTAMPTZ,
    answer       JSONB,
    answered_at  TIMESTAMPTZ
)
""",
    # Every run's id, cluster-wide: written in the run's creating transaction
    # (supervisor/ledger/ledger_pg.py ``claim_run_id``), fenced with it, so the
    # id is unique across partitions and a submit on any node finds the run.
    # One project revision per project root for the whole cluster (seed 004 V1.1 §2: one
    # execution owner per project, never one per home): every partition's write to a
    # root advances its one number here, in the write's own fenced transaction
    # (supervisor/project/revision_store.py, supervisor/ledger/ledger_pg.py ``project_head``).
    f"""
CREATE TABLE IF NOT EXISTS {CLUSTER_SCHEMA}.project_heads (
    project      TEXT PRIMARY KEY,
    revision     BIGINT NOT NULL
)
""",
    f"""
CREATE TABLE IF NOT EXISTS {CLUSTER_SCHEMA}.run_ids (
    run_id       TEXT PRIMARY KEY,
    partition    TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL
)
""",
    # The shared queue: root runs submitted to the cluster that no node took yet
    # (supervisor/cluster/run_queue.py). A node takes one ``FOR UPDATE SKIP
    # LOCKED`` in the transaction that creates the run in its partition, and the
    # row goes with it; a dead node's runs that never started come back here.
    f"""
CREATE TABLE IF NOT EXISTS {CLUSTER_SCHEMA}.queue (
    run_id       TEXT PRIMARY KEY,
    agent_id     TEXT NOT NULL,
    params       JSONB NOT NULL,
    submitted_by TEXT NOT NULL,
    submitted_at TIMESTAMPTZ NOT NULL
)
""",
    # A queued run a client cancelled before any node took it: its row stays, as
    # the run's record (its id stays its own), and no node takes it
    # (supervisor/ledger/ledger_pg_queue.py). The agents a node runs, so that a
    # client with no node tells an agent nobody runs (supervisor/cluster/front_door.py).
    f"""
DO $door$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = '{CLUSTER_SCHEMA}'
                   AND table_name = 'queue' AND column_name = 'cancelled_at') THEN
        ALTER TABLE {CLUSTER_SCHEMA}.queue ADD COLUMN cancelled_at TIMESTAMPTZ;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = '{CLUSTER_SCHEMA}'
                   AND table_name = 'nodes' AND column_name = 'agents') THEN
        ALTER TABLE {CLUSTER_SCHEMA}.nodes ADD COLUMN agents JSONB;
    END IF;
END $door$
""",
    # Only when missing: CREATE INDEX IF NOT EXISTS locks its table first, and would
    # wait behind any node's open write to it (a queued run being taken), so a
    # node's boot, and every cluster connection, would stall behind it.
    f"""
DO $indexes$ BEGIN
    IF to_regclass('{CLUSTER_SCHEMA}.queue_order') IS NULL THEN
        CREATE INDEX queue_order ON {CLUSTER_SCHEMA}.queue (submitted_at);
    END IF;
    IF to_regclass('{CLUSTER_SCHEMA}.requests_open') IS NULL THEN
        CREATE INDEX requests_open ON {CLUSTER_SCHEMA}.requests (partition) WHERE taken_by IS NULL;
    END IF;
END $indexes$
""",
    f"""
CREATE OR REPLACE FUNCTION {CLUSTER_SCHEMA}.fence(wanted TEXT, mine BIGINT) RETURNS void AS $fence$
DECLARE
    held BIGINT;
    held_by TEXT;
BEGIN
    SELECT epoch, holder INTO held, held_by FROM {CLUSTER_SCHEMA}.partitions WHERE name = wanted FOR SHARE;
    IF held IS DISTINCT FROM mine THEN
        RAISE EXCEPTION 'corral-fenced: partition % is now held by node % at epoch % (this writer had epoch %)',
            wanted, coalesce(held_by, 'nobody'), held, mine USING ERRCODE = '{FENCE_SQLSTATE}';
    END IF;
END
$fence$ LANGUAGE plpgsql
""",
    # A node's writer: its epoch, and a live lease. A lapsed lease is renewed before
    # the next write (the writer learns it here), or the writer finds it fenced.
    f"""
CREATE OR REPLACE FUNCTION {CLUSTER_SCHEMA}.fence_lease(wanted TEXT, mine BIGINT) RETURNS void AS $fence$
DECLARE
    held BIGINT;
    held_by TEXT;
    live BOOLEAN;
BEGIN
    SELECT epoch, holder, lease_until >= clock_timestamp() INTO held, held_by, live
        FROM {CLUSTER_SCHEMA}.partitions WHERE name = wanted FOR SHARE;
    IF held IS DISTINCT FROM mine THEN
        RAISE EXCEPTION 'corral-fenced: partition % is now held by node % at epoch % (this writer had epoch %)',
            wanted, coalesce(held_by, 'nobody'), held, mine USING ERRCODE = '{FENCE_SQLSTATE}';
    END IF;
    IF NOT live THEN
        RAISE EXCEPTION 'corral-lease-lapsed: the lease on partition % lapsed', wanted
            USING ERRCODE = '{LAPSED_SQLSTATE}';
    END IF;
END
$fence$ LANGUAGE plpgsql
""",
]


def is_postgres_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def schema_of(partition: str) -> str:
    if not PARTITION_NAME.match(partition):
        raise LedgerError(
            f"partition/node name {partition!r}: use 1-48 lowercase letters, digits, '-' or '_',"
            " starting with a letter or digit"
        )
    return "corral_p_" + partition.replace("-", "_")


def ensure_cluster(conn: Any) -> None:
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('corral_cluster'))")
        for statement in CLUSTER_DDL:
            conn.execute(statement)


def connect_cluster(url: str, node: str = "", timeout: int = 10) -> Any:
    """A connection for the cluster tables alone (nodes, partitions)."""
    conn = connect(url, f"corral-cluster:{node}" if node else "corral-cluster", timeout)
    ensure_cluster(conn)
    return conn

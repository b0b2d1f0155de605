"""Reading any partition of the cluster, read-only: a node's ``show`` of a run
another partition holds (``PartitionReader``), and a client with no node
(front_door.py). Only a partition's holder writes it; anyone may read it, so no
run becomes readable only with SQL.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from corral.supervisor.cluster import cluster_tables as cluster
from corral.supervisor.cluster import run_queue
from corral.supervisor.ledger.ledger_pg import PostgresLedger
from corral.supervisor.ledger.ledger_pg_cluster import CLUSTER_SCHEMA, QUEUED, schema_of
from corral.supervisor.ledger.ledger_pg_wire import connect
from corral.supervisor.runs import action_store
from corral.supervisor.runs.run_store import get_run
from corral.supervisor.runs.run_views import show_record

if TYPE_CHECKING:
    from corral.supervisor.cluster.node_service import NodeState

_C = CLUSTER_SCHEMA
#: What ``pending`` lists of each waiting action (its approval view needs the
#: workspace files of the node that runs it: ``corral approve --show`` there).
_PENDING_KEYS = ("action_id", "run_id", "agent_id", "tool", "phase", "fingerprint", "reason")
#: The run statuses ``pending`` lists: each waits for a person or a retry.
_WAITING_RUNS = (
    "waiting-confirmation",
    "needs-reconciliation",
    "waiting-for-provider-retry",
    "waiting-for-join",
    "needs-input",
)


def where_is(conn: Any, run_id: str, besides: str = "") -> str | None:
    """The partition that holds run ``run_id`` (not ``besides``), or ``QUEUED``;
    None: none does. Its cluster-wide id first, then (a run made before ids were
    claimed cluster-wide) each partition."""
    row = conn.execute(f"SELECT partition FROM {_C}.run_ids WHERE run_id = %s", (run_id,)).fetchone()
    if row is not None:
        return None if row[0] == besides else str(row[0])
    return cluster.partition_of_run(conn, run_id, besides)


def show_run(conn: Any, url: str, run_id: str, besides: str = "") -> dict[str, Any] | None:
    """``show`` of a run anywhere in the cluster but ``besides``, with its
    partition named; a run waiting in the shared queue as the queue has it."""
    queued = run_queue.queued_view(conn, run_id)
    if queued is not None:
        return queued  # in the shared queue: no node took it (or it was cancelled there)
    name = where_is(conn, run_id, besides)
    if name is None or name == QUEUED:
        return None
    other = PostgresLedger(url, name, readonly=True)
    try:
        # The features' sections read their own supervisor's partition: not shown here.
        shown = show_record(other, get_run(other, run_id))
    finally:
        other.close()
    return {**shown, "partition": name}


def pending(conn: Any) -> dict[str, Any]:
    """What waits for a person in every partition: ``pending`` as a node answers
    it for its own, each action and run with its partition."""
    actions: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    for name, schema in _partitions(conn):
        for row in conn.execute(
            f"SELECT * FROM {schema}.actions WHERE phase IN ('waiting-confirmation', 'needs-reconciliation')"
            " ORDER BY created_at"
        ).fetchall():
            action = {key: row[key] for key in _PENDING_KEYS}
            summary = action_store.input_summary(str(row["tool"]), json.loads(row["input"]))
            actions.append({**action, "input_summary": summary, "approval": None, "partition": name})
        requests += [
            {**{k: r[k] for k in ("slot", "run_id", "status", "error_kind")}, "partition": name}
            for r in conn.execute(
                f"SELECT slot, run_id, status, error_kind FROM {schema}.provider_requests"
                " WHERE status = 'needs-reconciliation'"
            ).fetchall()
        ]
        runs += [
            {**{k: r[k] for k in ("run_id", "agent_id", "status", "reason")}, "partition": name}
            for r in conn.execute(
                f"SELECT run_id, agent_id, status, reason FROM {schema}.runs WHERE status = ANY(%s)",
                (list(_WAITING_RUNS),),
            ).fetchall()
        ]
    return {"actions": actions, "provider_requests": requests, "provider_retries": [], "runs": runs}


def _partitions(conn: Any) -> list[tuple[str, str]]:
    """Every partition whose tables are made."""
    rows = conn.execute(
        f"SELECT name, schema_name FROM {_C}.partitions"
        " WHERE to_regclass(quote_ident(schema_name) || '.runs') IS NOT NULL ORDER BY name"
    ).fetchall()
    return [(str(name), str(schema)) for name, schema in rows if schema == schema_of(str(name))]


class PartitionReader:
    """``show`` for a run of any partition of the cluster (one a node adopted, one
    retired, one its node left behind), read-only. The run layer asks it for a
    run its own partition does not hold (supervisor/runs/run_views.py
    ``ShowElsewhere``)."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        #: Its own connection for ``wait``'s polls (the cluster connection is the tick's).
        self._conn: Any = None

    async def show(self, run_id: str) -> dict[str, Any] | None:
        state = self.state
        if state.conn is None or state.placement.url is None:
            return None
        return show_run(state.conn, state.placement.url, run_id, state.hold.partition)

    async def statuses(self, run_ids: list[str]) -> dict[str, str]:
        """The status of each of these runs the cluster holds elsewhere (queued: pending)."""
        state = self.state
        if state.placement.url is None:
            return {}
        if self._conn is None:
            self._conn = connect(state.placement.url, f"corral-reader:{state.placement.node}")
        try:
            return run_queue.statuses(self._conn, run_ids, state.hold.partition)
        except Exception:
            conn, self._conn = self._conn, None
            conn.close()
            raise


def partition_reader(state: NodeState | None) -> PartitionReader | None:
    """Where ``show`` finds the runs of the cluster's other partitions (None: no cluster)."""
    return None if state is None else PartitionReader(state)

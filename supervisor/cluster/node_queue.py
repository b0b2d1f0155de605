"""A node's part in the cluster's shared queue, wired into its supervisor
(supervisor/cluster/run_queue.py is the queue; supervisor/cluster/node_service.py the node)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from corral.supervisor.cluster import cluster_tables as cluster
from corral.supervisor.cluster import run_queue
from corral.supervisor.ledger.ledger_pg import PostgresLedger
from corral.supervisor.ledger.ledger_pg_cluster import schema_of
from corral.supervisor.ledger.ledger_spec import QueueSettings

if TYPE_CHECKING:
    from corral.supervisor.cluster.node_service import NodeState
    from corral.supervisor.daemon import Supervisor

log = logging.getLogger("corral.node")


def join(sup: Supervisor, state: NodeState, ledger: PostgresLedger, settings: QueueSettings) -> run_queue.RunQueue:
    """This node's part in the cluster's shared queue (supervisor/cluster/run_queue.py):
    the queue, whose part in runs the node's ``ClusterFeature`` is (node_service.py)."""
    capacity = run_queue.Capacity(settings.max_runs, settings.max_runs_per_agent)
    queue = run_queue.RunQueue(
        ledger, state.placement.node, [agent.id for agent in sup.spec.agents], capacity, settings.poll_s
    )
    queue.create = lambda params: sup.runs.create(params, from_queue=True)
    state.queue = queue  # its loop and its close are the node's (node_service.py ``NodePart``)
    if state.conn is not None:
        run_queue.publish_capacity(state.conn, state.placement.node, capacity, queue.agents)
    return queue


async def requeue_taken(state: NodeState, hold: cluster.Hold) -> tuple[list[str], bool]:
    """A partition just taken over: its runs that never started go back to the
    shared queue (run_queue.py). Their ids, and whether nothing else of it is
    unfinished, so that it needs no supervisor (this node keeps it dormant)."""
    if state.placement.queue is None:
        return [], False
    try:
        moved = await trio.to_thread.run_sync(run_queue.requeue, state.conn, hold.partition, hold.epoch)
        idle = bool(moved) and not await trio.to_thread.run_sync(
            cluster.has_unfinished_runs, state.conn, schema_of(hold.partition)
        )
    except Exception as exc:  # its supervisor runs them instead, as before the queue
        log.warning("partition %s: its runs that never started stay there (%s)", hold.partition, exc)
        return [], False
    if moved:
        log.warning(
            "partition %s: %d run(s) that never started went back to the shared queue", hold.partition, len(moved)
        )
        if state.queue is not None:
            state.queue.wakeup.set()
    if idle:
        state.dormant[hold.partition] = hold.epoch
    return moved, idle

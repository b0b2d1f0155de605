"""A partition's holder answers the calls others left for it (forwarding.py):
``reconcile`` from another node, and a remote client's approve, deny, cancel
and approval view (front_door.py), run on this holder's own fenced ledger.

A call is announced on ``REQUESTS_CHANNEL`` with the partition's name: the
holder listens there on a connection of its own and takes the call at once. The
lease tick takes the open calls too (node_service.py), so one announced while
this connection was away waits at most a tick.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from corral.supervisor.cluster import forwarding
from corral.supervisor.ledger.ledger_pg_cluster import REQUESTS_CHANNEL
from corral.supervisor.ledger.ledger_pg_wire import connect

if TYPE_CHECKING:
    from corral.supervisor.cluster.node_service import NodeState
    from corral.supervisor.daemon import Supervisor

log = logging.getLogger("corral.node")
#: How long one wait for an announcement blocks its worker thread: what a
#: shutdown waits for at most (the wait is not cancellable).
LISTEN_SLICE_S = 0.5
#: After the listening connection failed, wait this long before making it again.
RELISTEN_S = 1.0


def handlers(sup: Supervisor) -> Mapping[forwarding.ForwardedCall, forwarding.Handler]:
    """Each call a holder answers: its control method, as a local caller gets it."""
    runs = sup.runs
    return {
        forwarding.ForwardedCall.RECONCILE: runs.reconcile,
        forwarding.ForwardedCall.DECIDE: runs.continue_action,
        forwarding.ForwardedCall.CANCEL: runs.cancel,
        forwarding.ForwardedCall.APPROVAL: sup.views.approval,
    }


async def serve_requests(sup: Supervisor, conn: Any, requests: list[forwarding.Request]) -> None:
    """Calls left for this partition, taken: each run here and answered once
    durable. ``conn``: where the answers are written (raises if it fails: the
    asker then says the outcome is not known, and ``show`` tells it)."""
    table = handlers(sup)
    for request in requests:
        reply = await forwarding.serve(request, table, sup.group_commit.barrier)
        log.info("answered a %s from %s: %s", request.call, request.asked_by, "refused" if "error" in reply else "done")
        await trio.to_thread.run_sync(forwarding.answer, conn, request.id, reply)


async def listen(sup: Supervisor, state: NodeState) -> None:
    """Take this partition's calls as they are announced, on a connection of its own."""
    assert state.placement.url is not None
    partition, node = state.hold.partition, state.placement.node
    while True:
        conn = None
        try:
            conn = await trio.to_thread.run_sync(connect, state.placement.url, f"corral-requests:{partition}")
            await trio.to_thread.run_sync(conn.execute, f"LISTEN {REQUESTS_CHANNEL}")
            # Announced before this connection listened: taken now.
            announced = True
            while True:
                if announced:
                    taken = await trio.to_thread.run_sync(forwarding.take_requests, conn, partition, node)
                    await serve_requests(sup, conn, taken)
                announced = await trio.to_thread.run_sync(_announced, conn, partition)
        except Exception as exc:  # the database is away: the tick takes the calls meanwhile
            log.warning("requests for partition %s: %s; listening again", partition, exc)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
        await trio.sleep(RELISTEN_S)


def _announced(conn: Any, partition: str) -> bool:
    """In a worker thread: whether a call for ``partition`` was announced within
    a slice (others' announcements are dropped)."""
    return any(note.payload == partition for note in conn.notifies(timeout=LISTEN_SLICE_S, stop_after=1))

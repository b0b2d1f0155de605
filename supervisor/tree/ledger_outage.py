"""A group whose actors crash while the ledger is away waits for the ledger.

A PostgreSQL ledger can be away for a while (a server restarting, refused
connections). Actors do not crash for it (their requests wait: actors/runtime.py),
but one that crashes for any reason meanwhile is restarted into a supervisor that
can record nothing, and a few such crashes would exceed its group's restart
intensity: the group would give up for good, its runs stuck, though nothing is
wrong once the database is back.

So a group that exceeds its intensity while the ledger is away, or with a crash
of this outage in its window, does not escalate: it stops its actors, says
``waiting-for-ledger`` (status), and starts them again, with a fresh intensity,
once the ledger is back (``group-resumed``). A group that exceeds its intensity
with the ledger up all along escalates as before.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.supervisor.ledger.ledger_link import ledger_available, wait_available
from corral.supervisor.tree.actor_state import ActorState
from corral.supervisor.tree.restart_policy import Intensity

if TYPE_CHECKING:
    from corral.supervisor.tree.supervision_tree import ActorSlot, GroupRuntime, SupervisionTree

log = logging.getLogger("corral.tree")

#: A group's status while it waits for the ledger (``running`` and ``escalated`` are the others).
WAITING = "waiting-for-ledger"


@dataclass
class OutageMemory:
    """When (monotonic) a member of the group last exited while the ledger was away."""

    last_exit_s: float = -math.inf

    def saw_exit(self, ledger: object, now: float) -> None:
        if not ledger_available(ledger):
            self.last_exit_s = now

    def blames_outage(self, ledger: object, now: float, period_s: float) -> bool:
        """Whether restarts that exceeded the intensity within ``period_s`` owe to an
        outage: the ledger is away now, or a crash of the window came while it was."""
        return not ledger_available(ledger) or now - self.last_exit_s < period_s


async def wait_for_ledger(tree: SupervisionTree, group: GroupRuntime, trigger: ActorSlot, code: int) -> None:
    """Instead of escalating: stop the group, wait for the ledger, start it again.
    Called with the group's lock held; the wait runs in the tree's nursery."""
    group.status = WAITING
    group.reason = (f"waiting for the ledger: {trigger.id} exited with {code} while it was unreachable;"
                    " the group starts again once it is back")
    log.warning("group %s: %s", group.spec.id, group.reason)
    stopped = []
    for actor_id in reversed(group.order):
        slot = tree.slots[actor_id]
        if slot.state is ActorState.STOPPED and slot.id != trigger.id:
            continue  # down already, for its own reasons (a temporary actor that ended)
        await tree.stop_actor(slot, reason="the group waits for the ledger")
        stopped.append(actor_id)
    tree._changed()
    tree.start_soon(_resume, tree, group, list(reversed(stopped)))


async def _resume(tree: SupervisionTree, group: GroupRuntime, members: list[str]) -> None:
    await wait_available(tree.ledger)
    async with group.lock:
        if group.status != WAITING or tree.shutting_down:
            return
        group.intensity = Intensity(group.spec.max_restarts, group.spec.period_s)
        group.status, group.reason = "running", None
        log.warning("group %s: the ledger is back; starting %s again", group.spec.id, ", ".join(members))
        tree._event("group-resumed", group.spec.id, actors=members, at=time.time())
        for actor_id in members:
            slot = tree.slots[actor_id]
            if slot.state is ActorState.STOPPED:
                slot.move(ActorState.RESTARTING)
                slot.restarts += 1
                await tree.start_actor(slot)
    tree._changed()

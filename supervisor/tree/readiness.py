"""Readiness of a service actor (an MCP server, a local model) that reports ready
once per incarnation: a restart must report again before requests go to it."""

from __future__ import annotations

from collections.abc import Callable

import trio

from corral.supervisor.tree.actor_state import ActorState
from corral.supervisor.tree.supervision_tree import ActorSlot

#: How often a wait re-reads the actor's state (a restart sends no report).
SLOT_POLL_S = 0.05


class ReportedReadiness:
    """Mixed into a service's state dataclass, which declares these fields."""

    #: The incarnation that reported ready (-1: none yet).
    incarnation: int
    #: Set (and replaced) on every report, to wake waiters.
    changed: trio.Event

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def ready_in(self, slot: ActorSlot | None) -> bool:
        return slot is not None and slot.state is ActorState.RUNNING and self.incarnation == slot.incarnation

    async def wait_ready(self, slot_of: Callable[[], ActorSlot | None], deadline: float, after: int = -1) -> bool:
        """True once an incarnation newer than ``after`` reported ready (a retry
        must not go to the actor that just failed); False at the deadline or when
        the actor is stopped or escalated."""
        while True:
            slot = slot_of()
            if self.ready_in(slot) and self.incarnation > after:
                return True
            if trio.current_time() >= deadline:
                return False
            if slot is None or slot.state in (ActorState.ESCALATED, ActorState.STOPPED):
                return False
            # A report wakes this at once; a restart changes the slot without one,
            # so look again after a short while either way.
            with trio.move_on_at(min(deadline, trio.current_time() + SLOT_POLL_S)):
                await self.changed.wait()

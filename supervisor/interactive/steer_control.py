"""The steer path on the supervisor (seed 004 V1.13): record a steer, interrupt the
provider turn it makes stale, wake the run's agent. A goal edit and a goal pause
(supervisor/longtask/goal_service.py) go the same way.

The interrupt is a tell to the run's agent naming the turn's slot; the agent
stops waiting for it (actors/provider_interrupts.py) and reports
``provider.interrupted``, recorded here as an ``interrupted`` turn (never a
transient failure, so never retried as one). A turn that began after the steer
was committed is not begun at all (the provider guards), and one lost in a crash
while a steer waited counts as interrupted too (provider_store.py).
"""

from __future__ import annotations

from typing import Any

from corral.mailbox.protocol import Ack, ProviderInterrupted
from corral.supervisor.interactive import steer_store
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import provider_store, run_store
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.tree.supervision_tree import ActorSlot


class SteerControl:
    def __init__(self, ledger: Ledger, runs: RunService) -> None:
        self.ledger = ledger
        #: Tells and wakes the agent that drives a run.
        self.runs = runs

    async def steer(self, run_id: str, text: Any, steer_id: Any = None) -> dict[str, Any]:
        """Recorded (committed) before the answer; then the turn in flight is interrupted."""
        reply = steer_store.record_steer(self.ledger, run_id, text, self.runs.features, steer_id)
        if not reply.get("existing"):
            reply["interrupted"] = await self.interrupt_in_flight(run_id)
        await self.runs.wake_run(run_id)
        return reply

    async def interrupt_in_flight(self, run_id: str) -> str | None:
        """Tell the run's agent to stop waiting for its provider turn in flight, if
        one is; the slot told, or None."""
        row = self.ledger.one(
            "SELECT slot FROM provider_requests WHERE run_id = ? AND status = 'started' ORDER BY started_at DESC"
            " LIMIT 1",
            run_id,
        )
        if row is None:
            return None
        agent_id = run_store.get_run(self.ledger, run_id)["agent_id"]
        if self.runs.tree.slots.get(agent_id) is None:
            return None
        await self.runs.tree.tell(agent_id, {"op": "interrupt", "run_id": run_id, "slot": row["slot"]})
        return str(row["slot"])

    async def provider_interrupted(self, slot: ActorSlot, request: ProviderInterrupted) -> Ack:
        """From the agent: it stopped waiting for the turn ``slot`` as told."""
        run = self.runs.run_of(slot, request.run_id)
        provider_store.provider_interrupted(self.ledger, run["run_id"], request.slot)
        self.ledger.failpoint("steer.after-interrupt")
        return Ack()

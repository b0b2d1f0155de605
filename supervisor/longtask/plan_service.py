"""The durable plan's supervisor side: ``plan.update`` for the agent's tool, the
completion gate, and the plan in ``corral show`` (supervisor/longtask/plan_store.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.mailbox.protocol import PlanUpdate
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.longtask import plan_store
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_service import RunService

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree.supervision_tree import ActorSlot


class PlanService:
    def __init__(self, ledger: Ledger, runs: RunService) -> None:
        self.ledger = ledger
        #: Finds the run and the ``plan.update`` action an update is for.
        self.runs = runs

    async def update(self, slot: ActorSlot, request: PlanUpdate) -> dict[str, Any]:
        action = self.runs.tool_action(slot, request.run_id, request.action_id, "plan.update")
        result = plan_store.apply(self.ledger, request.run_id, action["action_id"], request.explanation, request.steps)
        self.ledger.failpoint("durable-plan.after-update")
        return result

    def show_section(self, run_id: str) -> dict[str, Any]:
        return plan_store.current(self.ledger, run_id)


class PlanFeature(RunFeature):
    """The durable plan in runs: open steps hold the final reply; ``show`` lists it."""

    def __init__(self, service: PlanService) -> None:
        self.service = service

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        return plan_store.blockers(ledger, run_id)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"plan": self.service.show_section(run_id)}


def install(sup: Supervisor) -> PlanService:
    service = PlanService(sup.ledger, sup.runs)
    sup.methods.plans = service
    return service

"""The durable plan's supervisor side: the model's plan update, checked as its
answer's plan is guarded and applied as it commits; the completion gate; and the
plan in ``corral show`` (supervisor/longtask/plan_store.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.supervisor.ledger.port import Ledger
from corral.supervisor.longtask import plan_store
from corral.supervisor.runs.run_feature import PlanRefusal, RunFeature

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

#: A refused update is a plan refused for what it means (seed 004 V1.33's category).
_CATEGORY, _RULE = "plan-semantics", "plan-update"


class PlanService:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def show_section(self, run_id: str) -> dict[str, Any]:
        return plan_store.current(self.ledger, run_id)


class PlanFeature(RunFeature):
    """The durable plan in runs: an answer's update is checked with its plan and
    applied as it commits; open steps hold the final reply; ``show`` lists it."""

    def __init__(self, service: PlanService) -> None:
        self.service = service

    def plan_guard(self, run: Any, loop: int, plan: dict[str, Any]) -> PlanRefusal | None:
        update = plan.get("plan_update")
        if not isinstance(update, dict):
            return None
        try:
            plan_store.check(self.service.ledger, run["run_id"], loop, update.get("explanation"), update.get("steps"))
        except plan_store.PlanRefused as exc:
            return PlanRefusal(_CATEGORY, f"your plan update was refused: {exc}", _RULE)
        return None

    def plan_committing(self, ledger: Ledger, run_id: str, loop: int, plan: dict[str, Any]) -> PlanRefusal | None:
        update = plan.get("plan_update")
        if not isinstance(update, dict):
            return None
        try:
            plan_store.apply(ledger, run_id, loop, update.get("explanation"), update.get("steps"))
        except plan_store.PlanRefused as exc:  # the plan moved since the guard read it
            return PlanRefusal(_CATEGORY, f"your plan update was refused: {exc}", _RULE)
        ledger.failpoint("durable-plan.after-update")
        return None

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        return plan_store.blockers(ledger, run_id)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"plan": self.service.show_section(run_id)}


def install(sup: Supervisor) -> PlanService:
    return PlanService(sup.ledger)

"""Goal mode on the supervisor (supervisor/longtask/goal_store.py): ``goal.verdict`` for the
agent's tool, the completion gate, ``goal.status`` for people."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.supervisor.errors import BadRequest, NotFound
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.longtask import goal_store
from corral.supervisor.params import param_str
from corral.supervisor.runs.run_service import RunService

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree.supervision_tree import ActorSlot


class GoalService:
    def __init__(self, ledger: Ledger, runs: RunService) -> None:
        self.ledger = ledger
        #: Finds the run and the ``goal.verdict`` action a verdict is for.
        self.runs = runs

    async def verdict(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        run_id, action = self.runs.ledger_tool_action(slot, params, "goal.verdict")
        if goal_store.goal_of(self.ledger, run_id) is None:
            raise BadRequest(f"run {run_id} has no goal (start it with corral run --goal)")
        met, evidence = params.get("met"), params.get("evidence")
        if not isinstance(met, bool):
            raise BadRequest("met must be true or false")
        if not isinstance(evidence, str) or not evidence.strip() or len(evidence) > goal_store.MAX_EVIDENCE_CHARS:
            raise BadRequest(f"evidence must be 1 to {goal_store.MAX_EVIDENCE_CHARS} characters")
        return goal_store.record_verdict(self.ledger, run_id, action["action_id"], met, evidence.strip())

    async def status(self, params: dict[str, Any]) -> dict[str, Any]:
        run_id = param_str(params, "run_id", limit=64)
        if self.ledger.one("SELECT 1 FROM runs WHERE run_id = ?", run_id) is None:
            raise NotFound(f"no run {run_id!r}")
        return goal_store.status(self.ledger, run_id)

    def show_section(self, run_id: str) -> dict[str, Any]:
        return {"goal": goal_store.goal_of(self.ledger, run_id), "verdicts": goal_store.verdicts(self.ledger, run_id)}


def install(sup: Supervisor) -> GoalService:
    service = GoalService(sup.ledger, sup.runs)
    sup.actor_methods["goal.verdict"] = service.verdict
    sup.control_methods["goal.status"] = service.status
    sup.hooks.finalize_blockers.append(goal_store.blockers)
    sup.hooks.show_sections["goal"] = service.show_section
    return service

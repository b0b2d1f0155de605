"""The durable plan's supervisor side: ``plan.update`` for the agent's tool, the
completion gate, and the plan in ``corral show`` (supervisor/plan_store.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.core import failpoints
from corral.supervisor import finalization, plan_store, run_store
from corral.supervisor.errors import BadRequest
from corral.supervisor.params import param_str

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree import ActorSlot


def install(sup: Supervisor) -> None:
    from corral.supervisor import run_service

    runs = sup.services["runs"]

    async def update(slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        run_id = param_str(params, "run_id", limit=64)
        runs.check_owner(slot, run_id)
        action = run_store.get_action(sup.ledger, param_str(params, "action_id", limit=64))
        if action["run_id"] != run_id or action["tool"] != "plan.update":
            raise BadRequest(f"action {action['action_id']} is not a plan.update of run {run_id}")
        steps = params.get("steps")
        if not isinstance(steps, list) or not steps:
            raise BadRequest("steps must be a non-empty list")
        result = plan_store.apply(sup.ledger, run_id, action["action_id"], steps)
        failpoints.hit("durable-plan.after-update")
        return result

    sup.actor_methods["plan.update"] = update
    finalization.BLOCKERS.append(plan_store.blockers)
    run_service.SHOW_SECTIONS["plan"] = lambda run_id: plan_store.current(sup.ledger, run_id)

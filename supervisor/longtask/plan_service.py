"""The durable plan's supervisor side: ``plan.update`` for the agent's tool, the
completion gate, and the plan in ``corral show`` (supervisor/longtask/plan_store.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.supervisor.errors import BadRequest
from corral.supervisor.longtask import plan_store

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree.supervision_tree import ActorSlot


def install(sup: Supervisor) -> None:
    runs = sup.runs

    async def update(slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        run_id, action = runs.ledger_tool_action(slot, params, "plan.update")
        steps = params.get("steps")
        if not isinstance(steps, list) or not steps:
            raise BadRequest("steps must be a non-empty list")
        result = plan_store.apply(sup.ledger, run_id, action["action_id"], steps)
        sup.ledger.failpoint("durable-plan.after-update")
        return result

    sup.actor_methods["plan.update"] = update
    sup.hooks.finalize_blockers.append(plan_store.blockers)
    sup.hooks.show_sections["plan"] = lambda run_id: plan_store.current(sup.ledger, run_id)

"""``plan.update``: the model keeps its plan in the ledger (supervisor/longtask/plan_store.py).

Its only effect is a supervisor transaction keyed by the action id, so recovery
may run it again and gets the same revision. The observation is the whole plan
as it now stands, so the model always sees its latest plan in its context.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict

from corral.actors.tools.base import Tool, ToolContext, ToolResult, ledger_call, schema


class PlanStep(TypedDict):
    id: str
    text: NotRequired[str]
    status: NotRequired[Literal["pending", "in_progress", "done", "blocked", "dropped"]]
    reason: NotRequired[str]


class PlanUpdateArgs(TypedDict):
    steps: list[PlanStep]


class PlanUpdate:
    ledger_idempotent = True
    schema = schema(
        "plan.update",
        "Add steps to your plan or change their status (pending, in_progress, done, blocked, dropped). Going"
        " back, or dropping a step, needs a reason. The run cannot finish while steps are unfinished.",
        PlanUpdateArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        plan = await ledger_call(ctx, "plan.update", "plan-refused", steps=tool_input["steps"])
        open_steps = plan["unfinished"]
        return ToolResult(True, plan, f"plan revision {plan['revision']}: {len(plan['steps'])} steps,"
                                      f" {len(open_steps)} unfinished")


TOOLS: list[Tool] = [PlanUpdate()]

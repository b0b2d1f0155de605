"""``plan.update``: the model keeps its plan in the ledger (supervisor/plan_store.py).

Its only effect is a supervisor transaction keyed by the action id, so recovery
may run it again and gets the same revision. The observation is the whole plan
as it now stands, so the model always sees its latest plan in its context.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict

from corral.actors.tools.base import Tool, ToolContext, ToolError, ToolResult, schema
from corral.mailbox.errors import RemoteError


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
        try:
            plan = await ctx.call("plan.update", run_id=ctx.run_id, action_id=ctx.action_id,
                                  steps=tool_input["steps"])
        except RemoteError as exc:
            if exc.code == "bad-request":
                raise ToolError(exc.message, "plan-refused") from None
            raise
        open_steps = plan["unfinished"]
        return ToolResult(True, plan, f"plan revision {plan['revision']}: {len(plan['steps'])} steps,"
                                      f" {len(open_steps)} unfinished")


TOOLS: list[Tool] = [PlanUpdate()]

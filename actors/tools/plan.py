"""``plan.update``: the model keeps its plan in the ledger (supervisor/longtask/plan_store.py).

The update is control-plane metadata (seed 004 V1.17): no policy applies to it, so
it never waits for a person nor is denied, and it moves no project revision.

Its only effect is a supervisor transaction keyed by the action id, so recovery
may run it again and gets the same revision. The observation is the whole plan
as it now stands, so the model always sees its latest plan in its context.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field
from typing_extensions import TypedDict

from corral.actors.tools.base import Tool, ToolContext, ToolResult, ledger_ask, schema
from corral.mailbox.protocol import PlanUpdate as PlanUpdateRecord

#: The seed's bounds (V1.17): 1 to 8 steps, bounded titles and explanation; the
#: supervisor's rules (supervisor/longtask/plan_store.py) use the same numbers.
MAX_STEPS = 8
MAX_TITLE_CHARS = 200
MAX_EXPLANATION_CHARS = 1000


class PlanStep(TypedDict):
    step: Annotated[str, Field(min_length=1, max_length=MAX_TITLE_CHARS, description="the step's title")]
    status: Literal["pending", "in_progress", "completed"]


class PlanUpdateArgs(TypedDict):
    explanation: Annotated[
        str, Field(min_length=1, max_length=MAX_EXPLANATION_CHARS, description="why the plan is now this")
    ]
    steps: Annotated[list[PlanStep], Field(min_length=1, max_length=MAX_STEPS)]


class PlanUpdate:
    ledger_idempotent = True
    #: Control-plane metadata (seed 004 V1.17): no policy applies, nothing asks a person.
    control_plane = True
    schema = schema(
        "plan.update",
        f"Your plan as it now stands: an explanation and 1 to {MAX_STEPS} steps with distinct titles, each"
        " pending, in_progress (at most one) or completed. A completed step stays completed; one you leave out"
        " is kept. The run cannot finish while a step is not completed.",
        PlanUpdateArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        update = PlanUpdateRecord(
            run_id=ctx.run_id, action_id=ctx.action_id, explanation=tool_input["explanation"], steps=tool_input["steps"]
        )
        plan = await ledger_ask(ctx, update, "plan-refused")
        open_steps = plan["unfinished"]
        return ToolResult(
            True, plan, f"plan revision {plan['revision']}: {len(plan['steps'])} steps, {len(open_steps)} not completed"
        )


TOOLS: list[Tool] = [PlanUpdate()]

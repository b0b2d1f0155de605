"""``goal.verdict``: the model judges its goal, with evidence (supervisor/longtask/goal_store.py).

A goal run finishes only after a verdict that says *met*. The verdict is a ledger
transaction keyed by the action id: a replay after a crash records nothing twice.
"""

from __future__ import annotations

from typing import Any

import msgspec
from typing_extensions import TypedDict

from corral.actors.tools.base import Tool, ToolContext, ToolResult, ledger_ask, schema
from corral.mailbox.protocol import GoalVerdict as GoalVerdictRecord


class VerdictArgs(TypedDict):
    met: bool
    evidence: str


class GoalVerdict:
    ledger_idempotent = True
    schema = schema(
        "goal.verdict",
        "Judge whether the run's goal is met, with the evidence (what you checked and found). A goal run"
        " cannot give its final reply before a verdict that says met.",
        VerdictArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        record = GoalVerdictRecord(
            run_id=ctx.run_id, action_id=ctx.action_id, met=tool_input["met"], evidence=tool_input["evidence"]
        )
        verdict = await ledger_ask(ctx, record, "verdict-refused")
        return ToolResult(True, msgspec.to_builtins(verdict), "goal met" if verdict.met else "goal not met yet")


TOOLS: list[Tool] = [GoalVerdict()]

"""``goal.verdict``: the model judges its goal, with evidence (supervisor/longtask/goal_store.py).

A goal run finishes only after a verdict that says *met*. The verdict is a ledger
transaction keyed by the action id: a replay after a crash records nothing twice.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import TypedDict

from corral.actors.tools.base import Tool, ToolContext, ToolResult, ledger_call, schema


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
        verdict = await ledger_call(ctx, "goal.verdict", "verdict-refused", met=tool_input["met"],
                                    evidence=tool_input["evidence"])
        return ToolResult(True, verdict, "goal met" if verdict["met"] else "goal not met yet")


TOOLS: list[Tool] = [GoalVerdict()]

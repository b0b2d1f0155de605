"""``user.input_request``: ask the user a question and wait for the answer.

Its only effect is a supervisor transaction keyed by the action id: the question
is recorded and the run parks in ``needs-input`` (lane released, no provider
call, no timeout). The action stays executing until ``corral answer`` finishes
it with the answer as its output, so the model sees the answer once, as this
tool's observation. A replay after a crash finds the same question.
"""

from __future__ import annotations

from typing import Any, NotRequired

from typing_extensions import TypedDict

from corral.actors.tools.base import ActionParked, Tool, ToolContext, ToolResult, schema


class InputRequestArgs(TypedDict):
    question: str
    options: NotRequired[list[str]]


class InputRequest:
    ledger_idempotent = True
    schema = schema(
        "user.input_request",
        "Ask the user a question (optionally with options to choose from) and wait for the answer.",
        InputRequestArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        await ctx.call(
            "input.request",
            run_id=ctx.run_id,
            action_id=ctx.action_id,
            question=tool_input["question"],
            options=tool_input.get("options"),
        )
        raise ActionParked("waiting for the user's answer")


TOOLS: list[Tool] = [InputRequest()]

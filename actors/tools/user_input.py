"""``user.input_request``: ask the user 1-3 structured questions and wait for the answers.

Each question has an ``id`` (snake_case), a ``header`` (at most 12 characters), a
one-line ``question`` and 2-3 ``options``, each a ``label`` with a
``description``; the user picks a label per question or writes free text (always
allowed: neither the model nor a spec turns it off). It must be the only action of its
plan, and isolated children and delegated specialists may not ask (they report to
their parent). Seed 004, V1.23.

Its only effect is a supervisor transaction keyed by the action id: the request
is recorded and the run parks in ``needs-input`` (lane released, no provider
call, no timeout). The action stays executing until the answer finishes it with
the answers as its output, so the model sees them once, as this tool's
observation. A replay after a crash finds the same request.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field
from typing_extensions import TypedDict

from corral.actors.tools.base import ActionParked, Tool, ToolContext, ToolResult, ledger_ask, schema
from corral.mailbox.protocol import InputRequest as InputRequestRecord


class QuestionOption(TypedDict):
    label: Annotated[str, Field(description="a short answer the user can pick")]
    description: Annotated[str, Field(description="one line on what picking it means")]


class Question(TypedDict):
    id: Annotated[str, Field(description="snake_case, unique in this request")]
    header: Annotated[str, Field(min_length=1, max_length=12, description="a tag of at most 12 characters")]
    question: Annotated[str, Field(description="one sentence")]
    options: Annotated[list[QuestionOption], Field(min_length=2, max_length=3, description="2 or 3 options")]


class InputRequestArgs(TypedDict):
    questions: Annotated[list[Question], Field(min_length=1, max_length=3, description="1 to 3 questions")]


class InputRequest:
    ledger_idempotent = True
    schema = schema(
        "user.input_request",
        "Ask the user 1-3 questions, each with 2-3 options, when the answer would materially change the result"
        " (not for facts you can read, nor for permission). Must be the only action of its plan; the run waits"
        " for the answers, which come back as this tool's observation.",
        InputRequestArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        request = InputRequestRecord(run_id=ctx.run_id, action_id=ctx.action_id, questions=tool_input["questions"])
        await ledger_ask(ctx, request, "bad-input")
        raise ActionParked("waiting for the user's answer")


TOOLS: list[Tool] = [InputRequest()]

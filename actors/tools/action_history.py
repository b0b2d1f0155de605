"""``agent.action_history``: the receipts of this agent's own finished actions.

Seed 004 brings this tool in with V1.6 (its limits, its filters, its own calls
left out, a 7,200-character detail budget, no absolute path, and no answer while
the run's isolated join waits to be claimed); V1.9 then has ``command.exec`` name
its ``sourceActionId`` so the model need not come here for it, and compaction
keeps the newest answer in view. The supervisor decides all of it
(supervisor/interactive/own_history.py).

Newest first, at most ``limit`` (1-10, default 5), each with its run, session and
action ids, tool, status, execution mode, fingerprint, a summary of its call and of
its result, and when it ran; a ``project.changeset`` adds its safe detail
(checkpoint, revision, change count) or ``detail_unavailable``: never file
contents, command output or secrets (receipts hold none, and the supervisor
redacts them again); ``truncated`` when the budget left detail out. The supervisor
checks each receipt again against its action and its run as it reads it, and a
receipt the ledger no longer bears out fails the read (``receipt-invalid``).
Without ``run_id`` it reads the current run;
``run_id`` names another of the agent's own runs, or ``"all"`` for every one.
The calling action is never listed, nor, unless ``tool`` names it, any other call
of this tool. Another agent's actions are out of reach.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

import msgspec
from pydantic import Field
from typing_extensions import TypedDict

from corral.actors.tools.base import Tool, ToolContext, ToolResult, ledger_ask, schema
from corral.mailbox.protocol import HistoryActions


class ActionHistoryArgs(TypedDict):
    run_id: NotRequired[Annotated[str, Field(description="one of your runs, or 'all' (default: this run)")]]
    action_id: NotRequired[Annotated[str, Field(description="one action (act-...)")]]
    tool: NotRequired[Annotated[str, Field(description="only this tool's actions")]]
    status: NotRequired[Literal["ok", "failed", "denied"]]
    limit: NotRequired[Annotated[int, Field(ge=1, le=10, description="at most this many (default 5)")]]


class ActionHistory:
    #: Seed 004 V1.6: "权限复用 agent.audit，默认 auto，仍可由项目或 per-Agent policy 改为
    #: confirm 或 deny": a spec's or an agent's ``agent.audit`` policy decides it.
    permission = "agent.audit"
    schema = schema(
        "agent.action_history",
        "Receipts of your own finished actions, newest first (default: this run; run_id='all' for all your runs).",
        ActionHistoryArgs,
        read_only=True,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        query = HistoryActions(
            run_id=ctx.run_id,
            action_id=ctx.action_id,
            of_run=tool_input.get("run_id"),
            of_action=tool_input.get("action_id"),
            tool=tool_input.get("tool"),
            status=tool_input.get("status"),
            limit=tool_input.get("limit"),
        )
        reply = await ledger_ask(ctx, query, "bad-input")
        more = ", more before them" if reply.more else ""
        summary = f"{len(reply.receipts)} receipt(s) of {reply.agent_id}{more}"
        return ToolResult(True, msgspec.to_builtins(reply), summary)


TOOLS: list[Tool] = [ActionHistory()]

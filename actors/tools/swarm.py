"""agent.spawn_isolated, agent.delegate, agent.run_status.

Their only effect is a supervisor transaction keyed by the action id, so a replay
returns the first result: recovery may run them again (``ledger_idempotent``).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypeVar

import msgspec
from typing_extensions import TypedDict

from corral.actors.tools.base import Tool, ToolContext, ToolError, ToolResult, schema
from corral.mailbox.protocol import SpawnChild, SwarmClaim, SwarmContract, SwarmDelegate, SwarmSpawn

T = TypeVar("T")


def _record(kind: type[T], value: Any, name: str) -> T:
    """A tool input field as its record (the tool's schema checked it already; a
    value that still does not fit is the model's bad input, named)."""
    try:
        return msgspec.convert(value, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise ToolError(f"{name}: {exc}", "bad-input") from None


class ChildArgs(TypedDict):
    template: str
    task: str
    acceptance_criteria: NotRequired[str]
    expected_artifacts: NotRequired[list[str]]
    write_scopes: list[str]


class SpawnArgs(TypedDict):
    children: list[ChildArgs]
    join_mode: NotRequired[Literal["all"]]


class DelegateArgs(TypedDict):
    agent_id: str
    task: str
    #: 1 to 8 distinct conditions the parent will judge the work by (seed 004 V1.28).
    acceptance_criteria: NotRequired[list[str]]
    expected_artifacts: NotRequired[list[str]]
    repair_of: NotRequired[str]


class RunStatusArgs(TypedDict):
    delivery_ids: NotRequired[list[str]]
    #: Read back one claimed delegation's whole contract and receipt instead of claiming.
    delegation_id: NotRequired[str]


class SpawnIsolated:
    ledger_idempotent = True
    schema = schema(
        "agent.spawn_isolated",
        "Run isolated child agents in parallel; their results arrive as one join delivery. Every child needs"
        " write_scopes, a read-only check too: the narrowest directory that holds its expected_artifacts, never a"
        " sibling child's scope or a shared parent directory.",
        SpawnArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        spawn = SwarmSpawn(
            run_id=ctx.run_id,
            action_id=ctx.action_id,
            children=_record(list[SpawnChild], tool_input["children"], "children"),
            join_mode=tool_input.get("join_mode", "all"),
        )
        reply = await ctx.ask(spawn)
        names = ", ".join(child.instance_id for child in reply.children)
        return ToolResult(True, msgspec.to_builtins(reply), f"spawned group {reply.group_id} ({names})")


class Delegate:
    ledger_idempotent = True
    schema = schema(
        "agent.delegate",
        "Give a task to a specialist agent; its receipt arrives as a delivery to claim. repair_of sends a claimed"
        " delegation's work back once when it does not meet its acceptance criteria, whatever its status.",
        DelegateArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        reply = await ctx.ask(
            SwarmDelegate(
                run_id=ctx.run_id,
                action_id=ctx.action_id,
                agent_id=tool_input["agent_id"],
                task=tool_input["task"],
                acceptance_criteria=tool_input.get("acceptance_criteria"),
                expected_artifacts=tool_input.get("expected_artifacts"),
                repair_of=tool_input.get("repair_of"),
            )
        )
        return ToolResult(True, msgspec.to_builtins(reply), f"delegated {reply.delegation_id} to {reply.target}")


class RunStatus:
    ledger_idempotent = True
    schema = schema(
        "agent.run_status",
        "Claim the join deliveries and receipts that are ready for this run (all-or-nothing); with delegation_id,"
        " read back that claimed delegation's contract and receipt instead.",
        RunStatusArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        if tool_input.get("delegation_id") is not None:
            contract = await ctx.ask(SwarmContract(run_id=ctx.run_id, delegation_id=tool_input["delegation_id"]))
            return ToolResult(
                True,
                msgspec.to_builtins(contract),
                f"contract of {contract.delegation_id}: {contract.contract_status},"
                f" {len(contract.acceptance_criteria)} criteria",
            )
        claim = SwarmClaim(run_id=ctx.run_id, action_id=ctx.action_id, delivery_ids=tool_input.get("delivery_ids"))
        reply = await ctx.ask(claim)
        kinds = [f"{d['kind']}:{d.get('status', 'joined')}" for d in reply.claimed]
        earlier = reply.claimed_isolated_joins
        # Seed 004 V1.9: a later query says which groups are settled, so a model that
        # lost the first answer to compaction does not poll for them again.
        settled = (
            (
                f"; {len(earlier)} group(s) claimed earlier ({', '.join(j.group_id for j in earlier)}):"
                " no need to query them again"
            )
            if earlier
            else ""
        )
        return ToolResult(
            True,
            msgspec.to_builtins(reply),
            f"claimed {len(reply.claimed)} ({', '.join(kinds) or 'none'}), {reply.open} still open{settled}",
        )


TOOLS: list[Tool] = [SpawnIsolated(), Delegate(), RunStatus()]

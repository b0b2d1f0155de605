"""agent.spawn_isolated, agent.delegate, agent.run_status.

Their only effect is a supervisor transaction keyed by the action id, so a replay
returns the first result: recovery may run them again (``ledger_idempotent``).
"""

from __future__ import annotations

from typing import Any

from corral.actors.tools.base import Tool, ToolContext, ToolResult, schema

_CHILD = {
    "type": "object",
    "properties": {
        "template": {"type": "string"},
        "task": {"type": "string"},
        "acceptance_criteria": {"type": "string"},
        "expected_artifacts": {"type": "array", "items": {"type": "string"}},
        "write_scopes": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["template", "task", "write_scopes"],
    "additionalProperties": False,
}


class SpawnIsolated:
    ledger_idempotent = True
    schema = schema(
        "agent.spawn_isolated",
        "Run isolated child agents in parallel; their results arrive as one join delivery.",
        {"children": {"type": "array", "items": _CHILD}, "join_mode": {"type": "string", "enum": ["all"]}},
        ["children"],
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        reply = await ctx.call(
            "swarm.spawn",
            run_id=ctx.run_id,
            action_id=ctx.action_id,
            children=tool_input["children"],
            join_mode=tool_input.get("join_mode", "all"),
        )
        names = ", ".join(child["instance_id"] for child in reply["children"])
        return ToolResult(True, reply, f"spawned group {reply['group_id']} ({names})")


class Delegate:
    ledger_idempotent = True
    schema = schema(
        "agent.delegate",
        "Give a task to a specialist agent; its receipt arrives as a delivery to claim.",
        {
            "agent_id": {"type": "string"},
            "task": {"type": "string"},
            "acceptance_criteria": {"type": "string"},
            "expected_artifacts": {"type": "array", "items": {"type": "string"}},
            "repair_of": {"type": "string"},
        },
        ["agent_id", "task"],
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        reply = await ctx.call("swarm.delegate", run_id=ctx.run_id, action_id=ctx.action_id, **tool_input)
        return ToolResult(True, reply, f"delegated {reply['delegation_id']} to {reply['target']}")


class RunStatus:
    ledger_idempotent = True
    schema = schema(
        "agent.run_status",
        "Claim the join deliveries and receipts that are ready for this run (all-or-nothing).",
        {"delivery_ids": {"type": "array", "items": {"type": "string"}}},
        [],
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        reply = await ctx.call(
            "swarm.claim",
            run_id=ctx.run_id,
            action_id=ctx.action_id,
            delivery_ids=tool_input.get("delivery_ids"),
        )
        kinds = [f"{d['kind']}:{d.get('status', 'joined')}" for d in reply["claimed"]]
        return ToolResult(
            True,
            reply,
            f"claimed {len(reply['claimed'])} ({', '.join(kinds) or 'none'}), {reply['open']} still open",
        )


TOOLS: list[Tool] = [SpawnIsolated(), Delegate(), RunStatus()]

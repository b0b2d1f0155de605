"""``mcp.<server>.<tool>``: MCP tools in the agent's catalog.

The run's claim carries the MCP tools this run pinned (see
supervisor/mcp/mcp_catalog.py). Each becomes one entry of the agent's tool table with
the server's own input schema, so a provider sees it like any other tool. Running
it is one request to the supervisor (``mcp.call``), made only after ``executing``
is committed; the supervisor relays it to the server's actor and decides what an
unknown outcome means for the action.
"""

from __future__ import annotations

from typing import Any

import msgspec

from corral.actors.providers.base import ToolSchema
from corral.actors.tools.base import ToolContext, ToolError, ToolResult
from corral.core.redact import summarize
from corral.mailbox.protocol import McpCall

#: Above the server's call timeout and the relay's own slack.
CALL_TIMEOUT_SLACK_S = 15.0


class McpTool:
    def __init__(self, entry: dict[str, Any], call_timeout_s: float = 60.0) -> None:
        self.entry = entry
        self.effect: str = entry["effect"]
        self.call_timeout_s = call_timeout_s
        self.schema = ToolSchema(
            name=entry["full_name"],
            description=entry.get("description") or f"{entry['name']} (MCP server {entry['server']})",
            input_schema=entry["input_schema"],
            read_only=self.effect == "read",
        )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        answer = await ctx.ask(
            McpCall(action_id=ctx.action_id, arguments=tool_input), timeout=self.call_timeout_s + CALL_TIMEOUT_SLACK_S
        )
        result = answer.result
        if not answer.ok or isinstance(result, msgspec.UnsetType):
            error = answer.error if isinstance(answer.error, str) else "the MCP call failed"
            raise ToolError(error, answer.code if isinstance(answer.code, str) else "mcp-failed")
        output: dict[str, Any] = {"text": result.text}
        if result.structured is not None:
            output["structured"] = result.structured
        if result.other_content:
            # Images, audio, resources: their facts only, never their bytes.
            output["other_content"] = msgspec.to_builtins(result.other_content)
        if isinstance(answer.sidecar, str) and answer.sidecar:
            output["sidecar"] = answer.sidecar
            output["bytes"] = None if isinstance(answer.bytes, msgspec.UnsetType) else answer.bytes
            output["truncated"] = True
        name = self.schema.name
        if result.is_error:
            # The server's own word that the call failed: a failed action with its message.
            return ToolResult(False, output, f"{name} failed: {summarize(result.text, 150)}")
        return ToolResult(True, output, f"{name}: {summarize(result.text, 120) or 'ok'}")


def mcp_tools(entries: list[dict[str, Any]] | None) -> dict[str, McpTool]:
    return {entry["full_name"]: McpTool(entry) for entry in entries or []}

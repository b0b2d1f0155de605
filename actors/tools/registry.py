"""Which tools exist, and which an actor of a given kind may use."""

from __future__ import annotations

from collections.abc import Mapping

from corral.actors.providers.base import ToolSchema
from corral.actors.tools import action_history, goal, image_inspect, preview, process, project, swarm, user_input
from corral.actors.tools.base import Tool
from corral.actors.tools.effect import EffectBarrier, EffectRecord
from corral.actors.tools.fs import FsList, FsPatch, FsRead, FsWrite

_BUILTIN: list[Tool] = [FsRead(), FsWrite(), FsPatch(), FsList(), EffectRecord(), EffectBarrier()]

#: The built-in tool families beside the files and effects above, in catalog order:
#: the swarm's, process sessions and commands, questions to a person, the agent's own
#: action history, the goal verdict, the project's changeset and git tools, and the browser
#: check of its preview and the look at its images.
_FAMILIES: tuple[list[Tool], ...] = (
    swarm.TOOLS, process.TOOLS, user_input.TOOLS, action_history.TOOLS, goal.TOOLS, project.TOOLS,
    preview.TOOLS, image_inspect.TOOLS,
)


def builtin_tools() -> dict[str, Tool]:
    tools = {tool.schema.name: tool for tool in _BUILTIN}
    for family in _FAMILIES:
        tools.update({tool.schema.name: tool for tool in family})
    return tools


def all_tools(user_tools: Mapping[str, Tool]) -> dict[str, Tool]:
    """The one catalog: built-ins, then the user's ``@corral.tool`` functions, as the
    caller built them from the spec's tool modules (``user_code.tool_catalog``; the
    spec refuses a user tool named like a built-in). MCP tools join per run, from
    the servers' catalogs."""
    tools = builtin_tools()
    tools.update({name: tool for name, tool in user_tools.items() if name not in tools})
    return tools


def schemas(tools: dict[str, Tool]) -> tuple[ToolSchema, ...]:
    return tuple(tool.schema for tool in tools.values())


def rerunnable(tool: Tool) -> bool:
    """May recovery run this tool again? Its effect class decides: read and idempotent
    tools may (an idempotent one with the same key), and so may ledger tools whose
    only effect is a supervisor transaction keyed by the action id; external ones never."""
    return tool.schema.effect_class in ("read", "idempotent") or bool(getattr(tool, "ledger_idempotent", False))

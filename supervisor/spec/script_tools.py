"""The tool names a scripted provider's steps call, checked when the script is
loaded (``corral up`` for a spec's steps or script file, ``corral run --script``
for a run's): a misspelled name is an error with a did-you-mean there, not a
repair loop at run time that ends in "unknown tool".

A name is judged exactly as the agent will judge it at run time: the catalog (the
built-ins and the user's tools) narrowed by the agent's ``tools`` globs. A
declared MCP server's tools are known only once it runs, so ``mcp.<server>.<tool>``
passes when the server is declared and the globs allow the name; a name holding a
``${...}`` placeholder is filled at run time and is not judged.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from corral.supervisor.spec.spec_base import SpecError, did_you_mean

if TYPE_CHECKING:
    from corral.supervisor.spec.spec_models import AgentSpec, TemplateSpec
    from corral.supervisor.spec.swarm_spec import SwarmSpec


def check_spec_scripts(spec: SwarmSpec) -> None:
    """Every tool a scripted agent's (or template's) steps call is one it has, else a
    SpecError naming the place: ``agents[0].steps[1].actions[0].tool`` for inline
    steps, ``agents[0].script: steps[1]...`` for a script file."""
    from corral.actors.tools.registry import all_tools

    catalog = all_tools(spec.user_tools)
    mcp_ids = {server.id for server in spec.mcp_servers}
    sections: tuple[tuple[str, Sequence[AgentSpec | TemplateSpec]], ...] = (
        ("agents", spec.agents), ("templates", spec.templates),
    )
    for section, members in sections:
        tables = spec.raw.get(section) or []
        for index, member in enumerate(members):
            if member.provider != "scripted":
                continue
            problem = script_problem(member.provider_config["script"], member.tools, catalog, mcp_ids)
            if problem is None:
                continue
            inline = index < len(tables) and isinstance(tables[index], dict) and "steps" in tables[index]
            where = f"{section}[{index}]"
            raise SpecError(f"{where}.{problem}" if inline else f"{where}.script: {problem}")


def script_problem(
    script: dict[str, Any], globs: Iterable[str] | None, catalog: Collection[str], mcp_ids: Collection[str]
) -> str | None:
    """The first step action naming a tool this agent does not have, said with its
    place (``steps[1].actions[0].tool: ...``), or None: every name is one it has."""
    patterns = tuple(globs) if globs is not None else None

    def allowed(name: str) -> bool:
        return patterns is None or any(fnmatch.fnmatchcase(name, glob) for glob in patterns)

    offered = sorted(name for name in catalog if allowed(name))
    for index, step in enumerate(script.get("steps") or ()):
        actions = step.get("actions") if isinstance(step, dict) else None
        if not isinstance(actions, list):
            continue  # a malformed plan is the run's repair to exercise, not a name to judge
        for position, action in enumerate(actions):
            name = action.get("tool") if isinstance(action, dict) else None
            if not isinstance(name, str) or "${" in name:
                continue
            where = f"steps[{index}].actions[{position}].tool"
            if name in catalog or _mcp_server_declared(name, mcp_ids):
                if not allowed(name):
                    return (f"{where}: {name!r} is not one of this agent's tools"
                            f" (tools = {list(patterns or ())}){did_you_mean(name, offered)}")
                continue
            hint = did_you_mean(name, offered) or did_you_mean(name, sorted(catalog))
            return f"{where}: no tool {name!r}{hint}"
    return None


def _mcp_server_declared(name: str, mcp_ids: Collection[str]) -> bool:
    from corral.supervisor.mcp.mcp_spec import split_tool_name

    parts = split_tool_name(name, mcp_ids)
    return parts is not None and parts[0] in mcp_ids

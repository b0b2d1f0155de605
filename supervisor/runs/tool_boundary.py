"""The tools a run may use at most, as code rather than as the run's stored data
(seed 004 V1.34: for an isolated child, "模板 Agent、项目 policy、legacy 空策略和用户
approval 都不能放宽这组边界").

A run's ``allowed_tools`` (written when the supervisor creates a child or a
delegated run) bounds every tool it prepares, whichever route prepares it: corral's
registry or an MCP server's (``mcp.<server>.<tool>``, which never goes through the
registry). For an isolated child the bound is also ``CHILD_TOOLS`` itself, so a
child row an older build stored with a wider list, or with none, is held to it.
The bound is judged when the action is prepared (its policy is then ``deny``, so no
person is asked) and again when it would begin (an older build's pending or
approved action: "approval 不能穿透").
"""

from __future__ import annotations

from typing import Any

from corral.supervisor.runs.run_store import run_options

#: The file tools and effects, every delegated run's (a specialist's too).
FILE_TOOLS = ["fs.read", "fs.write", "fs.patch", "fs.list", "effect.record", "effect.barrier"]
#: The tools of an isolated child's run (its template may narrow them further): the
#: file tools, effects, the atomic multi-file write (the seed's project.patchset,
#: each target checked against the scopes before its checkpoint: child_scope.py) and
#: the browser check of the project's existing preview (a child starts no preview:
#: with no session of its own, preview.validate checks the spec's page; it writes
#: nothing in the project). No command, verification, commit, delegation, spawn,
#: restore or MCP tool: a child's writes are checked against its write scopes only
#: where a tool names the files it writes, and a process it started could write
#: anywhere in the project root (V1.34).
CHILD_TOOLS = [*FILE_TOOLS, "project.changeset", "preview.validate"]
_CHILD_TOOL_SET = frozenset(CHILD_TOOLS)
#: The run kind of an isolated child (supervisor/swarm/children_store.py).
CHILD_KIND = "child"
#: Every MCP tool (``mcp.<server>.<tool>``), as an effective policy shows it: the
#: seed's ``mcp.call``, to which its dynamic MCP functions normalize.
MCP_TOOLS = "mcp.*"


def run_tools(run: Any) -> frozenset[str] | None:
    """The tools ``run`` may use at most; None: no bound (a root run)."""
    stored = run_options(run).get("allowed_tools")
    # A stored value that is no list is refused whole (fail closed), not ignored.
    listed = None if stored is None else frozenset(str(t) for t in stored) if isinstance(stored, list) else frozenset()
    if run["kind"] == CHILD_KIND:
        return _CHILD_TOOL_SET if listed is None else listed & _CHILD_TOOL_SET
    return listed


def refusal(run: Any, tool: str) -> str | None:
    """Why ``run`` may not use ``tool`` at all, whatever its policy; None when it may."""
    allowed = run_tools(run)
    if allowed is None or tool in allowed:
        return None
    return f"{tool} is not allowed in a {run['kind']} run"


def mcp_row(run: Any) -> dict[str, str]:
    """The effective policy's row for every MCP tool, when the run's bound holds none
    (a child's: ``deny``); otherwise nothing, each server's own rule applies."""
    allowed = run_tools(run)
    if allowed is None or any(tool.startswith("mcp.") for tool in allowed):
        return {}
    return {MCP_TOOLS: "deny"}

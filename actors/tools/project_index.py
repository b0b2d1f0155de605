"""``project.index`` (seed 004 V1.1 §1): the repository context, built again now.

The same build core as the agent's prompt (actors/project_context.py): documents
with their scope, SHA-256 and truncation marker, the skill catalog (with the
entries it skipped and why), the layout (top-level tree, manifests and their
script names, git summary, languages, entry candidates) and the fingerprint.
With ``path``, the AGENTS.md files that apply to that path, root first, with their
text: what to follow before changing it.
"""

from __future__ import annotations

from typing import Any, NotRequired

import trio
from typing_extensions import TypedDict

from corral.actors.project_context import load
from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema


class IndexArgs(TypedDict):
    #: A workspace-relative path: also return the AGENTS.md files on its ancestor chain.
    path: NotRequired[str]


def _scoped_path(raw: str) -> str:
    path = raw.replace("\\", "/").strip()
    if len(path) > 1000 or path.startswith("/") or "\0" in path or ".." in path.split("/"):
        raise ToolError("path must be a relative path inside the workspace, without '..'", "bad-input")
    return path


class ProjectIndex:
    schema = schema(
        "project.index",
        "Refresh the repository context: scoped AGENTS.md files, README/CONTEXT, the skill catalog, the layout"
        " (tree, manifests and scripts, git, languages, entry candidates) and its fingerprint. With path: the"
        " AGENTS.md files that apply to that path, root first.",
        IndexArgs,
        read_only=True,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        path = _scoped_path(tool_input["path"]) if "path" in tool_input else None
        context = await trio.to_thread.run_sync(load, ctx.workspace, ctx.home)
        output: dict[str, Any] = {"fingerprint": context.fingerprint, "summary": context.summary()}
        if path is not None:
            output["applicable"] = [
                {"path": d.path, "scope": d.scope, "sha256": d.sha256, "truncated": d.truncated, "text": d.text}
                for d in context.applicable(path)
            ]
        shown = len(context.documents)
        return ToolResult(True, output, f"repository context {context.fingerprint[:12]}: {shown} documents,"
                                        f" {len(context.skills)} skills")

"""``project.restore`` (seed 004 V1.3): put a checkpoint's files back.

Every file the checkpoint recorded gets its recorded content back, and a file it
recorded as absent is deleted, all together or not at all, after a checkpoint of
their current content (so a restore can itself be undone: its output names that
checkpoint). It needs a person's approval by default (``confirm``), like a commit.
Paths are checked as every write is (workspace, write scopes, control and secret
files), and a checkpoint of another workspace is refused.
"""

from __future__ import annotations

from typing import Any

import trio
from typing_extensions import TypedDict

from corral.actors.tools import project_apply as apply
from corral.actors.tools import project_checkpoints as checkpoints
from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.fs import SOURCES_CHANGED
from corral.actors.tools.project_diff import checkpoint_for


class RestoreArgs(TypedDict):
    checkpoint: str


class ProjectRestore:
    #: Puts older content over the current files: a person approves unless the spec says otherwise.
    default_policy = "confirm"
    #: Putting files back is a person's decision (seed 004 V1.3): no default or glob lowers it.
    min_policy = "confirm"
    schema = schema(
        "project.restore",
        "Put back the files of a checkpoint (from project.changeset or project.diff): each recorded file gets its"
        " recorded content, a file recorded as absent is deleted. Takes a checkpoint first, so it can be undone."
        " Needs approval.",
        RestoreArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        name = self.schema.name
        if not tool_input["checkpoint"]:
            raise ToolError("name the checkpoint to restore", "bad-input")
        undo_id = checkpoints.checkpoint_id(ctx.run_id, ctx.action_id, name, tool_input)

        def work() -> tuple[checkpoints.Checkpoint, list[apply.Planned], checkpoints.Checkpoint]:
            source = checkpoint_for(ctx, tool_input["checkpoint"])
            prior = checkpoints.find(ctx.home, undo_id)
            planned = []
            for path in sorted(source.files):
                after = checkpoints.prior_content(ctx.home, source, path)
                apply.check_writable(ctx, path, delete=after is None)
                before = apply.base(ctx, prior, path)
                if before != after:
                    operation = "delete" if after is None else "create" if before is None else "update"
                    planned.append(apply.Planned(path, operation, before, after))
            return source, planned, apply.apply_plan(ctx, planned, undo_id, name)

        source, planned, undo = await trio.to_thread.run_sync(work)
        return ToolResult(
            True,
            {"restored": source.id, "undo_checkpoint": undo.id, "files": apply.describe(planned),
             SOURCES_CHANGED: bool(planned)},
            f"restored {len(planned)} files from {source.id}; undo with {undo.id}",
        )

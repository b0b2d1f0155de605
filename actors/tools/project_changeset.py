"""``project.changeset`` (seed 004 V1.3): several file changes, atomically.

Every change is checked first (inside the workspace and the agent's write scopes,
the expected old content when given), then each file is written to a temporary
file next to it, fsync'd, and renamed into place. Nothing is written unless
everything checks. The output is the review: a diff and the SHA-256 before and
after, per file. Applying the same changeset again changes nothing (idempotent).
"""

from __future__ import annotations

import difflib
from typing import Any, NotRequired

import trio
from typing_extensions import TypedDict

from corral.actors.tools import fs
from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.paths import check_write_scope
from corral.actors.tools.project_common import MAX_DIFF_CHARS, MAX_FILE_BYTES, MAX_FILES, old_content, sha256, target


class Change(TypedDict):
    path: str
    content: str
    expected_sha256: NotRequired[str]


class ChangesetArgs(TypedDict):
    changes: list[Change]


class Changeset:
    schema = schema(
        "project.changeset",
        "Write several files at once, atomically (all or nothing). Give each file's full new content; add"
        " expected_sha256 to insist on the current content. Returns the review: a diff and hashes per file.",
        ChangesetArgs,
        read_only=False,
        effect="idempotent",
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        changes = tool_input["changes"]
        if not 0 < len(changes) <= MAX_FILES:
            raise ToolError(f"a changeset holds 1 to {MAX_FILES} files", "bad-changeset")
        planned = []
        for change in changes:
            path = target(ctx, change["path"])
            new = change["content"].encode()
            if len(new) > MAX_FILE_BYTES:
                raise ToolError(f"{change['path']}: over {MAX_FILE_BYTES} bytes", "too-big")
            old = old_content(ctx, change["path"])
            expected = change.get("expected_sha256")
            if expected and sha256(old) != expected and sha256(old) != sha256(new):
                raise ToolError(f"{change['path']}: its content changed since you read it (sha256 {sha256(old)})",
                                "stale-content")
            planned.append((change["path"], path, old, new))
        if len({path for _, path, _, _ in planned}) != len(planned):
            raise ToolError("a changeset names each file once", "bad-changeset")
        await trio.to_thread.run_sync(_apply, ctx, [(name, new) for name, _, _, new in planned])
        review = [
            {
                "path": name,
                "sha256_before": sha256(old) if old else None,
                "sha256_after": sha256(new),
                "diff": "".join(difflib.unified_diff(old.decode(errors="replace").splitlines(keepends=True),
                                                     new.decode(errors="replace").splitlines(keepends=True),
                                                     f"a/{name}", f"b/{name}"))[:MAX_DIFF_CHARS // len(planned)],
            }
            for name, _, old, new in planned
        ]
        return ToolResult(True, {"files": review}, f"changeset of {len(review)} files applied")


def _apply(ctx: ToolContext, writes: list[tuple[str, bytes]]) -> None:
    """Every file staged first (checked, written beside its target, fsync'd), then
    all renamed: a refusal or failure before the renames changes nothing."""
    for raw, _ in writes:  # every path checked before any directory is made
        check_write_scope(ctx.workspace, fs.confined(ctx, raw), ctx.write_scopes, raw)
    staged: list[fs.Staged] = []
    try:
        for raw, data in writes:
            staged.append(fs.stage_write(ctx, raw, data))
    except BaseException:
        fs.discard_staged(staged)
        raise
    fs.commit_staged(staged)



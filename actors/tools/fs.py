"""fs.read, fs.write, fs.patch, fs.list: confined to the workspace and write scopes."""

from __future__ import annotations

import hashlib
import os
from typing import Any, NotRequired

from typing_extensions import TypedDict

from corral.actors.tools.base import ASKS_A_PERSON, ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.paths import check_write_scope
from corral.actors.tools.staging import (
    Staged,
    _open_parent,
    commit_staged,
    confined,
    discard_staged,
    open_to_read,
    stage_write,
)
from corral.sandbox.control_paths import is_control_name

# stage_write, commit_staged, discard_staged and Staged are the staging of
# project.changeset; confined is its path check and read_confined its read;
# _open_parent is tested directly.
__all__ = [
    "SOURCES_CHANGED",
    "FsList",
    "FsPatch",
    "FsRead",
    "FsWrite",
    "Staged",
    "_open_parent",
    "commit_staged",
    "confined",
    "discard_staged",
    "read_confined",
    "stage_write",
]


class PathArgs(TypedDict):
    path: str


class ListArgs(TypedDict):
    path: NotRequired[str]


class WriteArgs(TypedDict):
    path: str
    content: str


class PatchArgs(TypedDict):
    path: str
    old_text: str
    new_text: str
    expected_sha256: str


#: The output key of a tool whose committed result changed the project's sources:
#: its receipt makes the next project revision (supervisor/project/revision_store.py).
SOURCES_CHANGED = "sources_changed"

MAX_READ = 64 * 1024
MAX_WRITE = 512 * 1024
MAX_LIST = 500


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FsRead:
    schema = schema(
        "fs.read",
        "Read a text file of the workspace; returns content and sha256.",
        PathArgs,
        read_only=True,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        data = read_confined(ctx, tool_input["path"])
        text = data[:MAX_READ].decode(errors="replace")
        return ToolResult(
            True,
            {
                "path": tool_input["path"],
                "content": text,
                "sha256": _sha(data),
                "truncated": len(data) > MAX_READ,
            },
            f"read {tool_input['path']} ({len(data)} bytes)",
        )


class FsList:
    schema = schema("fs.list", "List a directory of the workspace.", ListArgs, read_only=True)

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        raw = tool_input.get("path", ".")
        target = ctx.workspace.resolve() if raw in (".", "") else confined(ctx, raw)
        if not target.is_dir():
            raise ToolError(f"no directory {raw!r}", "not-found")
        home = ctx.home.resolve()
        entries = []
        for entry in sorted(target.iterdir())[:MAX_LIST]:
            if is_control_name(entry.name) or entry == home:
                continue
            entries.append(entry.name + ("/" if entry.is_dir() else ""))
        return ToolResult(True, {"path": raw, "entries": entries}, f"listed {raw} ({len(entries)} entries)")


def _write_confined(ctx: ToolContext, raw: str, data: bytes) -> None:
    commit_staged([stage_write(ctx, raw, data)])


def read_confined(ctx: ToolContext, raw: str) -> bytes:
    """The bytes of the workspace file ``raw``: confined, no symlink followed at any
    level, and not a secret or control file under another name (staging.open_to_read)."""
    with os.fdopen(open_to_read(ctx, raw), "rb") as handle:
        return handle.read()


class FsWrite:
    default_policy = ASKS_A_PERSON
    schema = schema(
        "fs.write",
        "Create or replace a text file inside the write scopes.",
        WriteArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        data = tool_input["content"].encode()
        if len(data) > MAX_WRITE:
            raise ToolError(f"content is {len(data)} bytes; the limit is {MAX_WRITE}", "bad-input")
        _write_confined(ctx, tool_input["path"], data)
        return ToolResult(
            True,
            {"path": tool_input["path"], "sha256": _sha(data), "bytes": len(data), SOURCES_CHANGED: True},
            f"wrote {tool_input['path']} ({len(data)} bytes, sha256 {_sha(data)[:12]})",
        )


class FsPatch:
    default_policy = ASKS_A_PERSON
    schema = schema(
        "fs.patch",
        "Replace one exact occurrence of old_text; expected_sha256 must match the file as last read.",
        PatchArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        raw = tool_input["path"]
        check_write_scope(ctx.workspace, confined(ctx, raw), ctx.write_scopes, raw)
        data = read_confined(ctx, raw)
        if _sha(data) != tool_input["expected_sha256"]:
            raise ToolError(f"{raw!r} changed since it was read (sha256 mismatch)", "stale")
        text = data.decode()
        count = text.count(tool_input["old_text"])
        if count != 1:
            raise ToolError(f"old_text occurs {count} times in {raw!r}; it must occur exactly once", "bad-input")
        new = text.replace(tool_input["old_text"], tool_input["new_text"]).encode()
        _write_confined(ctx, raw, new)
        return ToolResult(True, {"path": raw, "sha256": _sha(new), SOURCES_CHANGED: True},
                          f"patched {raw} (sha256 {_sha(new)[:12]})")

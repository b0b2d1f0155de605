"""fs.read, fs.write, fs.patch, fs.list: confined to the workspace and write scopes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import Any, NotRequired

from typing_extensions import TypedDict

from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.paths import check_write_scope, resolve_in_workspace
from corral.sandbox.control_paths import is_control_name


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
        target = confined(ctx, tool_input["path"])
        if not target.is_file():
            raise ToolError(f"no file {tool_input['path']!r}", "not-found")
        data = target.read_bytes()
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


def confined(ctx: ToolContext, raw: str) -> Path:
    return resolve_in_workspace(ctx.workspace, raw, forbidden=(ctx.home,))


def _open_parent(root: Path, parent: PurePosixPath, raw: str) -> int:
    """An fd of ``root/parent``, walked one directory at a time with O_NOFOLLOW
    (creating what is missing), so no symlink swapped in after the path check can
    take the write elsewhere: not out of the workspace, not into ``.git``."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for part in parent.parts:
            try:
                child = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass  # another writer (a sibling child, say) made it meanwhile: open it, checked
                child = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            except (NotADirectoryError, OSError) as exc:
                why = f"{raw!r}: {part!r} is not a plain directory ({exc.strerror})"
                raise ToolError(why, "path-refused") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _write_confined(ctx: ToolContext, raw: str, data: bytes) -> None:
    commit_staged([stage_write(ctx, raw, data)])


#: A file written next to its target, fsync'd, not yet renamed: (parent fd, temp name, final name).
Staged = tuple[int, str, str]


def stage_write(ctx: ToolContext, raw: str, data: bytes) -> Staged:
    """Check ``raw`` (workspace, write scopes, no symlink on the way) and write
    ``data`` beside it; ``commit_staged`` renames it into place. Several staged
    files make an all-or-nothing changeset (project.changeset)."""
    target = confined(ctx, raw)
    check_write_scope(ctx.workspace, target, ctx.write_scopes, raw)
    if target.is_dir():
        raise ToolError(f"{raw!r} is a directory", "bad-input")
    root = ctx.workspace.resolve()
    inside = PurePosixPath(target.relative_to(root))
    parent_fd = _open_parent(root, inside.parent, raw)
    try:
        tmp = f".{inside.name}.corral-tmp"
        # O_NOFOLLOW: a symlink planted as the temp name cannot redirect the write.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=parent_fd)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        os.close(parent_fd)
        raise
    return parent_fd, tmp, inside.name


def commit_staged(staged: list[Staged]) -> None:
    try:
        for parent_fd, tmp, name in staged:
            os.replace(tmp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
            os.fsync(parent_fd)
    finally:
        for parent_fd, _, _ in staged:
            os.close(parent_fd)


def discard_staged(staged: list[Staged]) -> None:
    for parent_fd, tmp, _ in staged:
        try:
            os.unlink(tmp, dir_fd=parent_fd)
        except OSError:
            pass
        os.close(parent_fd)


class FsWrite:
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
            {"path": tool_input["path"], "sha256": _sha(data), "bytes": len(data)},
            f"wrote {tool_input['path']} ({len(data)} bytes, sha256 {_sha(data)[:12]})",
        )


class FsPatch:
    schema = schema(
        "fs.patch",
        "Replace one exact occurrence of old_text; expected_sha256 must match the file as last read.",
        PatchArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        raw = tool_input["path"]
        target = confined(ctx, raw)
        check_write_scope(ctx.workspace, target, ctx.write_scopes, raw)
        if not target.is_file():
            raise ToolError(f"no file {raw!r}", "not-found")
        data = target.read_bytes()
        if _sha(data) != tool_input["expected_sha256"]:
            raise ToolError(f"{raw!r} changed since it was read (sha256 mismatch)", "stale")
        text = data.decode()
        count = text.count(tool_input["old_text"])
        if count != 1:
            raise ToolError(f"old_text occurs {count} times in {raw!r}; it must occur exactly once", "bad-input")
        new = text.replace(tool_input["old_text"], tool_input["new_text"]).encode()
        _write_confined(ctx, raw, new)
        return ToolResult(True, {"path": raw, "sha256": _sha(new)}, f"patched {raw} (sha256 {_sha(new)[:12]})")

"""``project.diff`` (seed 004 V1.3): what changed since a checkpoint, bounded.

The files compared are those the checkpoint recorded and those every later
checkpoint of the same run recorded (each with the content it had before its
first later change): every change by project.changeset and project.restore is
checkpointed first, so that is every file they changed since. Each file's status
(added, deleted, modified) and SHA-256 before and after are always shown; with
``include_content`` also a unified diff (3 lines of context) while the budget
lasts. A binary or non-UTF-8 file, or a file whose diff would not fit what is
left of ``max_chars``, shows no hunks and says so (``binary`` / ``truncated``);
the whole result says ``truncated`` when anything was left out. The current files
are read as fs.read reads them (confined after resolution, no symlink followed, no
secret under another name: a refused file is shown as ``hidden``), both sides go
through the one redaction path and the one path scrub (seed 004 V1.3: "进入 LLM
observation 前统一做路径和凭据清洗": the project's root as ``<project>``, any other
absolute path as ``<absolute-path>``), and after the hunks every file the checkpoints
hold is read again, changed or not: a change in between fails the call rather than
mixing two states.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, NotRequired

import trio
from typing_extensions import TypedDict

from corral.actors.tools import project_apply as apply
from corral.actors.tools import project_checkpoints as checkpoints
from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema
from corral.core import failpoints
from corral.core.path_scrub import scrub_paths
from corral.core.redact import redact_text

DEFAULT_FILES = 20
MAX_FILES = 100
#: The seed's public bound of max_chars (and its default).
MAX_CHARS = 24_000
CONTEXT_LINES = 3
#: Held between the hunks and the second read (a test changes a file there).
FAILPOINT = "changeset.diff-read"


class DiffArgs(TypedDict):
    since_checkpoint: NotRequired[str]
    include_content: NotRequired[bool]
    max_files: NotRequired[int]
    max_chars: NotRequired[int]


@dataclass(frozen=True)
class _File:
    path: str
    before: bytes | None
    now: bytes | None
    hidden: bool = False

    @property
    def status(self) -> str:
        if self.hidden:
            return "hidden"
        if self.before is None:
            return "added"
        return "deleted" if self.now is None else "modified"


def checkpoint_for(ctx: ToolContext, cp_id: str | None) -> checkpoints.Checkpoint:
    """The checkpoint named (of any run in this home), or the run's latest; it must
    be of this workspace."""
    if cp_id:
        found = checkpoints.find(ctx.home, cp_id)
        if found is None:
            raise ToolError(f"no checkpoint {cp_id}", "not-found")
    else:
        taken = checkpoints.of_run(ctx.home, ctx.run_id)
        if not taken:
            raise ToolError("this run has no checkpoint yet (project.changeset takes one)", "not-found")
        found = taken[-1]
    if found.workspace != str(ctx.workspace.resolve()):
        raise ToolError(f"checkpoint {found.id} is of another workspace", "bad-checkpoint")
    return found


def _recorded(ctx: ToolContext, since: checkpoints.Checkpoint) -> dict[str, str | None]:
    """Each path's digest at ``since``: its own record, else the first later one."""
    recorded: dict[str, str | None] = {}
    taken = checkpoints.of_run(ctx.home, since.run_id)
    later = [c for c in taken if (c.created_ns, c.id) > (since.created_ns, since.id)]
    for checkpoint in [since, *later]:
        for path, digest in checkpoint.files.items():
            recorded.setdefault(path, digest)
    return recorded


def _baseline(ctx: ToolContext, since: checkpoints.Checkpoint) -> dict[str, bytes | None]:
    """Each path's content at ``since``."""
    return {path: None if digest is None else checkpoints.blob(ctx.home, digest)
            for path, digest in sorted(_recorded(ctx, since).items())}


def _now(ctx: ToolContext, path: str) -> tuple[bytes | None, bool]:
    try:
        return apply.current(ctx, path), False
    except ToolError:
        return None, True  # now refused (a secret's other name, outside the workspace): never shown


def _text(data: bytes | None) -> str | None:
    if data is None:
        return ""
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _clean(text: str, roots: tuple[str, ...]) -> list[str]:
    """A side of a diff as the model may read it: no secret, no absolute path."""
    return scrub_paths(redact_text(text), roots).splitlines(keepends=True)


def _entry(item: _File, include: bool, budget: int, roots: tuple[str, ...]) -> tuple[dict[str, Any], int]:
    """The file's entry and the characters of budget it used."""
    entry: dict[str, Any] = {
        "path": item.path,
        "status": item.status,
        "sha256_before": checkpoints.sha256(item.before) if item.before is not None else None,
        "sha256_after": checkpoints.sha256(item.now) if item.now is not None and not item.hidden else None,
        "binary": False,
        "truncated": False,
    }
    if not include or item.hidden:
        return entry, 0
    before, after = _text(item.before), _text(item.now)
    if before is None or after is None:
        entry["binary"] = True
        return entry, 0
    diff = "".join(difflib.unified_diff(
        _clean(before, roots), _clean(after, roots), f"a/{item.path}", f"b/{item.path}", n=CONTEXT_LINES))
    if len(diff) > budget:
        entry["truncated"] = True
        return entry, 0
    entry["diff"] = diff
    return entry, len(diff)


def _bounded(tool_input: dict[str, Any], key: str, default: int, cap: int) -> int:
    value = tool_input.get(key, default)
    if not 1 <= value <= cap:
        raise ToolError(f"{key} is 1 to {cap}", "bad-input")
    return int(value)


class ProjectDiff:
    schema = schema(
        "project.diff",
        "What changed since a checkpoint (default: this run's latest): per file its status and sha256 before and"
        f" after; with include_content=true also unified diff hunks, at most max_chars (<= {MAX_CHARS}) characters"
        f" over max_files (default {DEFAULT_FILES}) files. Files left out say truncated; binary files say binary.",
        DiffArgs,
        read_only=True,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        max_files = _bounded(tool_input, "max_files", DEFAULT_FILES, MAX_FILES)
        max_chars = _bounded(tool_input, "max_chars", MAX_CHARS, MAX_CHARS)
        include = bool(tool_input.get("include_content", False))

        def work() -> dict[str, Any]:
            since = checkpoint_for(ctx, tool_input.get("since_checkpoint"))
            changed = []
            read = {}
            for path, before in _baseline(ctx, since).items():
                now, hidden = read[path] = _now(ctx, path)
                if hidden or now != before:
                    changed.append(_File(path, before, now, hidden))
            files, budget = [], max_chars
            roots = (str(ctx.workspace), str(ctx.workspace.resolve()))
            for item in changed[:max_files]:
                entry, used = _entry(item, include, budget, roots)
                budget -= used
                files.append(entry)
            failpoints.hit(FAILPOINT)
            # The whole path-level diff again, every file the checkpoints hold, changed
            # or not (seed 004 V1.3: "生成 hunks 后重新计算路径级差异；前后快照不一致时整个结果失败"):
            # the same state throughout, or no answer.
            for path in _recorded(ctx, since).keys() | read.keys():
                if read.get(path) != _now(ctx, path):
                    raise ToolError(f"{path} changed while the diff was made; ask again", "concurrent-change")
            return {
                "checkpoint": since.id,
                "files": files,
                "files_changed": len(changed),
                "truncated": len(changed) > max_files or any(f["truncated"] for f in files),
                "binary": any(f["binary"] for f in files),
            }

        output = await trio.to_thread.run_sync(work)
        return ToolResult(True, output, f"diff since {output['checkpoint']}: {output['files_changed']} files changed"
                          + (" (truncated)" if output["truncated"] else ""))

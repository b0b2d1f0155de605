"""``project.git_inspect`` (seed 004 V1.4 ``git.inspect``, command id
``project.git_inspect``): one read-only review of the working tree, before and after a
change, without asking for a ``command.exec``.

It returns HEAD, the branch, and the safe staged / unstaged / untracked paths (status
read with ``--porcelain=v1 -z``); with ``include_diff`` (the default) the content diff
of the safe staged and unstaged tracked paths, separately. Untracked files are listed,
never read. The seed's ``includeDiff`` / ``maxFiles`` / ``maxChars`` are corral's
snake_case ``include_diff`` / ``max_files`` / ``max_chars``: 20 files and 24,000
characters by default, at most 50 files and 24,000 characters; past a bound the output
says ``truncated: true``.

The status and HEAD are read before and after the diff; if they differ the whole
review fails (``snapshot-drift``): a tree that moved while it was read is no review
(the seed: "status 和 diff 前后的安全快照不一致时整次失败"). Secret paths (by the deny list
and by what their names say: ``secrets.yaml``), databases, dumps, key stores, control
directories and other VCSs' never appear (git_snapshot.safe_names), nor a path that is
no plain file (a symlink, a fifo, a device, a submodule: ``_plain_files``); git runs as host_git.py
runs it. It never advances the project revision nor touches the verification gate.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired

import trio
from typing_extensions import TypedDict

from corral.actors.repo_walk import SKIP_DIRS
from corral.actors.tools import git_snapshot
from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.git_exact_commit import Head, read_head
from corral.actors.tools.host_git import HostGit, HostGitError
from corral.core import failpoints

DEFAULT_MAX_FILES = 20
MAX_FILES = 50
DEFAULT_MAX_CHARS = 24_000
MAX_CHARS = 24_000
#: Paths listed per kind (staged, unstaged, untracked); past it, ``truncated``.
MAX_LISTED = git_snapshot.MAX_CHANGES
#: Between the first reads (status, HEAD, diff) and the second: a test moves the tree here.
FAILPOINT = "git.inspect-read"

_DIFF = ("diff", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames", "--ignore-submodules=all")


class InspectArgs(TypedDict):
    include_diff: NotRequired[bool]
    max_files: NotRequired[int]
    max_chars: NotRequired[int]


@dataclass(frozen=True)
class Bounds:
    include_diff: bool
    max_files: int
    max_chars: int


def bounds(tool_input: dict[str, Any]) -> Bounds:
    """The inputs, checked: bad input is refused, never clamped silently."""
    include = tool_input.get("include_diff", True)
    if not isinstance(include, bool):
        raise ToolError("include_diff must be true or false", "bad-input")
    values = []
    for key, default, top in (("max_files", DEFAULT_MAX_FILES, MAX_FILES), ("max_chars", DEFAULT_MAX_CHARS, MAX_CHARS)):
        value = tool_input.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ToolError(f"{key} must be a whole number within 1..{top}", "bad-input")
        values.append(value)
    return Bounds(include, values[0], values[1])


@dataclass(frozen=True)
class Status:
    raw: str
    head: Head
    staged: list[str]
    unstaged: list[str]
    untracked: list[str]


def _run(git: HostGit, *args: str, literal: bool = False) -> str:
    try:
        done = git.run(*args, literal_paths=literal)
    except HostGitError as exc:
        raise ToolError(str(exc), "git-failed") from None
    if done.returncode != 0:
        raise ToolError(done.stderr.strip()[:300] or f"git {args[0]} failed", "git-failed")
    return done.stdout


def _status(ctx: ToolContext, git: HostGit, *, check_files: bool = True) -> Status:
    raw = _run(git, *git_snapshot.STATUS_ARGS)
    head = read_head(git)
    entries = [(entry[:2], entry[3:]) for entry in raw.split("\0") if len(entry) > 3]
    try:
        safe = set(git_snapshot.safe_names(ctx.workspace, (ctx.home,), [path for _, path in entries]))
    except HostGitError as exc:
        raise ToolError(str(exc), "git-failed") from None
    kept = [(code, path) for code, path in entries if path in safe and code != "!!" and not _generated(path)]
    if check_files:
        plain = _plain_files(ctx.workspace, git, [path for _, path in kept])
        kept = [(code, path) for code, path in kept if path in plain]
    return Status(
        raw,
        head,
        staged=sorted(path for code, path in kept if code[0] not in " ?"),
        unstaged=sorted(path for code, path in kept if code[1] not in " ?"),
        untracked=sorted(path for code, path in kept if code == "??"),
    )


#: The modes of a plain file in git (a symlink is 120000, a submodule 160000; 000000: none on that side).
_PLAIN_MODES = frozenset({"000000", "100644", "100755"})


def _plain_files(workspace: Path, git: HostGit, paths: list[str]) -> set[str]:
    """The paths that are plain files wherever the review could read them (seed 004 V1.4:
    "所有路径必须通过可移植路径、项目边界、普通文件…校验"): a portable name; in the working tree
    a regular file reached without a symlink on the way (or gone: a deletion), and a regular
    file's mode in HEAD and in the index. A symlink's diff prints the path it names (often a
    host path), a fifo would block a read, a device is no project file: none is listed, none
    diffed."""
    if not paths:
        return set()
    root = workspace.resolve()
    plain = {path for path in paths if _portable(path) and _plain_in_tree(root, path)}
    for staged in (True, False):
        raw = (
            _run(
                git,
                "diff",
                "--raw",
                "-z",
                "--no-renames",
                "--ignore-submodules=all",
                *(["--cached"] if staged else []),
                "--",
                *sorted(plain),
                literal=True,
            )
            if plain
            else ""
        )
        fields = raw.split("\0")
        for header, path in zip(fields[0::2], fields[1::2], strict=False):
            modes = header.lstrip(":").split(" ")[:2]
            if any(mode not in _PLAIN_MODES for mode in modes):
                plain.discard(path)
    return plain


#: Names no portable file system takes: Windows' device names (with any extension).
_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul", *(f"com{n}" for n in range(1, 10)), *(f"lpt{n}" for n in range(1, 10))}
)
_NOT_PORTABLE = frozenset('\\<>:"|?*')


def _portable(path: str) -> bool:
    """A path every file system can hold as it is (seed 004 V1.4 "可移植路径"): printable
    characters, none Windows refuses, no part ending in a dot or a space, no device name."""
    if not path.isprintable() or any(char in _NOT_PORTABLE for char in path):
        return False
    parts = path.rstrip("/").split("/")
    return not any(part.endswith((".", " ")) or part.split(".")[0].lower() in _DEVICE_NAMES for part in parts)


def _plain_in_tree(root: Path, path: str) -> bool:
    """A regular file below ``root`` reached without following a symlink, or nothing there."""
    parts = path.split("/")
    if path.endswith("/") or "" in parts or "." in parts or ".." in parts:
        return False  # a directory git lists whole (a nested repository), or no plain path
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                return True  # its directory is gone: a deletion
            except OSError:
                return False  # a symlink (or a file) on the way
            os.close(fd)
            fd = child
        try:
            info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode)
    finally:
        os.close(fd)


def _generated(path: str) -> bool:
    """A path under a dependency, build or cache directory (``node_modules/``,
    ``.venv/``, ``__pycache__/``, ``build/``...): never the project's own change, and
    never in a review (seed 004 V1.4: "依赖、构建和缓存目录不得出现在返回值或 diff 中")."""
    # git lists an untracked directory whole, with its slash; a file's last part is no directory.
    directories = path.rstrip("/").split("/") if path.endswith("/") else path.split("/")[:-1]
    return any(part in SKIP_DIRS for part in directories)


def _diff(git: HostGit, paths: list[str], staged: bool) -> str:
    if not paths:
        return ""
    return _run(git, *_DIFF, *(["--cached"] if staged else []), "--", *paths, literal=True)


Mark = tuple[int, int, int, int] | None


def _marks(workspace: Path, paths: list[str]) -> dict[str, Mark]:
    """What says a listed file (and the index) did not change: inode, size and the
    modification and change times, never its content (an untracked file is never
    read). A write, even one that keeps the status text, moves the change time."""
    marks: dict[str, Mark] = {}
    for path in [*paths, ".git/index"]:
        try:
            info = os.lstat(workspace / path)
        except FileNotFoundError:
            marks[path] = None
            continue
        marks[path] = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    return marks


def inspect(ctx: ToolContext, limits: Bounds) -> dict[str, Any]:
    """The review (blocking: git and file reads). Its safe snapshot is the status, HEAD
    and branch, and each listed path's marks, before and after: any difference fails
    the whole review (seed 004 V1.4: "status 和 diff 前后的安全快照不一致时整次失败")."""
    git = HostGit(ctx.workspace)
    before = _status(ctx, git)
    listed = sorted({*before.staged, *before.unstaged, *before.untracked})
    marked = _marks(ctx.workspace, listed)
    truncated = any(len(paths) > MAX_LISTED for paths in (before.staged, before.unstaged, before.untracked))
    output: dict[str, Any] = {
        "head": before.head.commit,
        "branch": (before.head.branch or "").removeprefix("refs/heads/") or None,
        "staged": before.staged[:MAX_LISTED],
        "unstaged": before.unstaged[:MAX_LISTED],
        "untracked": before.untracked[:MAX_LISTED],
    }
    if limits.include_diff:
        tracked = sorted({*before.staged, *before.unstaged})
        files = tracked[: limits.max_files]
        truncated |= len(tracked) > len(files)
        staged = _diff(git, [path for path in files if path in set(before.staged)], staged=True)
        unstaged = _diff(git, [path for path in files if path in set(before.unstaged)], staged=False)
        if len(staged) + len(unstaged) > limits.max_chars:
            truncated = True
            staged = staged[: limits.max_chars]
            unstaged = unstaged[: limits.max_chars - len(staged)]
        output |= {
            "diff": {"staged": staged, "unstaged": unstaged},
            "diff_files": files,
            "max_files": limits.max_files,
            "max_chars": limits.max_chars,
        }
    failpoints.hit(FAILPOINT)
    after = _status(ctx, git, check_files=False)
    if after.raw != before.raw or after.head != before.head or _marks(ctx.workspace, listed) != marked:
        raise ToolError(
            "the working tree changed while it was reviewed (status, HEAD, branch or a listed file moved"
            " between the reads): inspect it again",
            "snapshot-drift",
        )
    output["truncated"] = truncated
    return output


class GitInspect:
    schema = schema(
        "project.git_inspect",
        "Review the git working tree, read-only, before and after a change: HEAD, the branch, the safe staged,"
        " unstaged and untracked paths, and (include_diff, default true) the staged and unstaged content diff of"
        " tracked files. max_files (default 20, at most 50) and max_chars (default 24000, at most 24000) bound the"
        " diff; `truncated` is true when anything was left out. Untracked files are listed, never read.",
        InspectArgs,
        read_only=True,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        limits = bounds(tool_input)
        output = await trio.to_thread.run_sync(inspect, ctx, limits)
        changed = len({*output["staged"], *output["unstaged"], *output["untracked"]})
        shown = f", diff of {len(output['diff_files'])} files" if limits.include_diff else ""
        return ToolResult(
            True, output, f"git inspect: {changed} changed paths{shown}{' (truncated)' if output['truncated'] else ''}"
        )

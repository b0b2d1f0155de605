"""``project.git_status``, ``project.git_diff`` and ``project.git_commit`` (seed 004
V1.12).

``project.git_commit`` is the only git write. It commits exactly the reviewed
files, and only if their content still has the reviewed SHA-256. It needs approval
by default (``confirm``). It never pushes, fetches, pulls, switches branches,
merges, rebases, resets, stashes, tags or touches submodules or worktrees. Inside
the command sandbox ``.git`` is mounted read-only, so ``command.exec`` cannot get
round it (sandbox/bwrap.py).

Git runs with a fixed argv and never runs a program the repository names (hooks,
fsmonitor, drivers, filters, pager...), nor shows a secret file: see host_git.py.
"""

from __future__ import annotations

import subprocess
from typing import Any, NotRequired

import trio
from typing_extensions import TypedDict

from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.host_git import (
    HostGit,
    HostGitError,
    SecretPaths,
    exclusions,
    status_lines,
    status_names,
)
from corral.actors.tools.project_common import MAX_DIFF_CHARS, MAX_FILES, old_content, sha256, target


def _git(ctx: ToolContext, *args: str, literal_paths: bool = False) -> subprocess.CompletedProcess[str]:
    try:
        return HostGit(ctx.workspace).run(*args, literal_paths=literal_paths)
    except HostGitError as exc:
        raise ToolError(str(exc), "git-failed") from None


def _secrets(ctx: ToolContext) -> SecretPaths:
    return SecretPaths(ctx.workspace, (ctx.home,))


def _checked(done: subprocess.CompletedProcess[str], what: str) -> str:
    if done.returncode != 0:
        raise ToolError(done.stderr.strip()[:300] or f"git {what} failed", "git-failed")
    return done.stdout


class NoArgs(TypedDict):
    pass


class DiffArgs(TypedDict):
    staged: NotRequired[bool]


class GitStatus:
    schema = schema("project.git_status", "The repository's status (branch, changed files).", NoArgs,
                    read_only=True)

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        def status() -> str:
            raw = _checked(_git(ctx, "status", "--porcelain=v1", "-z", "--branch", "--no-renames",
                                "--ignore-submodules=all"), "status")
            names = status_names(raw)
            hidden = _secrets(ctx).hidden(names)
            return status_lines(raw, {name: name in hidden for name in names})

        text = await trio.to_thread.run_sync(status)
        return ToolResult(True, {"status": text[:MAX_DIFF_CHARS]}, "git status")


class GitDiff:
    schema = schema("project.git_diff", "The repository's diff (staged with staged=true).", DiffArgs,
                    read_only=True)

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        staged = ["--cached"] if tool_input.get("staged") else []
        common = ["--no-ext-diff", "--no-textconv", "--no-color", "--no-renames", "--ignore-submodules=all", *staged]

        def diff() -> str:
            # The changed names first, then the diff without the secret ones: their
            # content never reaches the output.
            names = [n for n in _checked(_git(ctx, "diff", "--name-only", "-z", *common), "diff").split("\0") if n]
            try:
                excluded = exclusions(_secrets(ctx).hidden(names))
            except HostGitError as exc:
                raise ToolError(str(exc), "git-failed") from None
            return _checked(_git(ctx, "diff", *common, "--", ".", *excluded), "diff")

        text = await trio.to_thread.run_sync(diff)
        return ToolResult(True, {"diff": text[:MAX_DIFF_CHARS]}, f"git diff ({len(text)} chars)")


class Reviewed(TypedDict):
    path: str
    sha256: str


class CommitArgs(TypedDict):
    message: str
    files: list[Reviewed]


class GitCommit:
    #: A commit needs a person's approval unless the spec's policy says otherwise.
    default_policy = "confirm"
    schema = schema(
        "project.git_commit",
        "Commit the reviewed files (each with the sha256 from the changeset's review) with a message. The"
        " only git write; it needs approval.",
        CommitArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        files = tool_input["files"]
        message = tool_input["message"].strip()
        if not message or len(message) > 5000:
            raise ToolError("the message must be 1 to 5000 characters", "bad-message")
        if not 0 < len(files) <= MAX_FILES:
            raise ToolError(f"commit 1 to {MAX_FILES} reviewed files", "bad-changeset")
        paths = []
        for entry in files:
            path = target(ctx, entry["path"])
            current = sha256(old_content(ctx, entry["path"])) if path.is_file() else None
            if current != entry["sha256"]:
                raise ToolError(f"{entry['path']} is not the reviewed content (sha256 {current})", "not-reviewed")
            paths.append(path.relative_to(ctx.workspace.resolve()).as_posix())

        def commit() -> subprocess.CompletedProcess[str]:
            # Literal pathspecs: a file named `*.py` is that file, not every Python file.
            added = _git(ctx, "add", "--", *paths, literal_paths=True)
            if added.returncode != 0:
                return added
            return _git(ctx, "-c", "user.name=corral agent", "-c", f"user.email={ctx.agent_id}@corral.invalid",
                        "commit", "--no-verify", "-m", message, "--", *paths, literal_paths=True)

        done = await trio.to_thread.run_sync(commit)
        if done.returncode != 0:
            raise ToolError((done.stderr or done.stdout).strip()[:300] or "git commit failed", "git-failed")
        head = await trio.to_thread.run_sync(lambda: _git(ctx, "rev-parse", "HEAD"))
        return ToolResult(True, {"commit": head.stdout.strip(), "files": paths},
                          f"committed {len(paths)} files as {head.stdout.strip()[:12]}")



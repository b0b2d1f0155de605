"""``project.git_status``, ``project.git_diff``, ``project.git_snapshot`` and
``project.git_commit`` (seed 004 V1.12).

``project.git_commit`` is the only git write. It commits exactly the given paths,
only if HEAD is still the expected commit and the paths' content still has the
snapshot fingerprint ``project.git_snapshot`` gave (git_exact_commit.py builds the
commit in an index of its own). It always needs approval, and children and
delegated specialists never get it (the run layer applies ``min_policy`` and
``denied_run_kinds``). It never pushes, fetches, pulls, switches branches, merges,
rebases, resets, stashes, tags or touches submodules or worktrees. Inside the
command sandbox ``.git`` is mounted read-only, so ``command.exec`` cannot get round
it (sandbox/bwrap.py).

Git runs with a fixed argv and never runs a program the repository names (hooks,
fsmonitor, drivers, filters, pager...), nor shows a secret file: see host_git.py.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import PurePosixPath
from typing import Any, NotRequired

import trio
from typing_extensions import TypedDict

from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.git_exact_commit import (
    MAX_COMMIT_PATHS,
    MAX_MESSAGE_CHARS,
    PathState,
    commit_exact,
    read_head,
    snapshot_fingerprint,
)
from corral.actors.tools.host_git import (
    HostGit,
    HostGitError,
    SecretPaths,
    exclusions,
    status_lines,
    status_names,
)
from corral.actors.tools.project_common import MAX_DIFF_CHARS, target
from corral.actors.tools.project_verify import require_verification
from corral.actors.tools.staging import open_to_read

#: A file larger than this is not read into memory to be committed.
MAX_COMMIT_FILE_BYTES = 8 << 20


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
    schema = schema("project.git_status", "The repository's status (branch, changed files) and its HEAD commit.",
                    NoArgs, read_only=True)

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        def status() -> tuple[str, str | None]:
            raw = _checked(_git(ctx, "status", "--porcelain=v1", "-z", "--branch", "--no-renames",
                                "--ignore-submodules=all"), "status")
            names = status_names(raw)
            hidden = _secrets(ctx).hidden(names)
            return status_lines(raw, {name: name in hidden for name in names}), read_head(HostGit(ctx.workspace)).commit

        text, head = await trio.to_thread.run_sync(status)
        return ToolResult(True, {"status": text[:MAX_DIFF_CHARS], "head": head}, "git status")


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


class SnapshotArgs(TypedDict):
    paths: list[str]


class CommitArgs(TypedDict):
    message: str
    paths: list[str]
    expected_head: str
    expected_snapshot_fingerprint: str


def read_states(ctx: ToolContext, raw_paths: list[str]) -> list[PathState]:
    """The paths to commit as they are now: each one's bytes (read like fs.read reads:
    confined, no symlink, no secret under any name), or None when it is deleted."""
    if not 0 < len(raw_paths) <= MAX_COMMIT_PATHS:
        raise ToolError(f"give 1 to {MAX_COMMIT_PATHS} paths", "bad-input")
    root = ctx.workspace.resolve()
    states: dict[str, PathState] = {}
    for raw in raw_paths:
        path = target(ctx, raw)
        name = path.relative_to(root).as_posix()
        if name != PurePosixPath(raw).as_posix() or name == ".":
            raise ToolError(f"path {raw!r} is not a plain path of a file (a link, or the workspace itself)",
                            "path-refused")
        if name in states:
            raise ToolError(f"path {raw!r} is given twice", "bad-input")
        states[name] = _read_state(ctx, raw, name)
    return list(states.values())


def _read_state(ctx: ToolContext, raw: str, name: str) -> PathState:
    try:
        fd = open_to_read(ctx, raw)
    except ToolError as exc:
        if exc.code != "not-found":
            raise
        if os.path.lexists(ctx.workspace.resolve() / name):
            raise ToolError(f"path {raw!r} is not a plain file", "path-refused") from None
        return PathState(name, None)
    with os.fdopen(fd, "rb") as handle:
        executable = bool(os.fstat(handle.fileno()).st_mode & stat.S_IXUSR)
        data = handle.read(MAX_COMMIT_FILE_BYTES + 1)
    if len(data) > MAX_COMMIT_FILE_BYTES:
        raise ToolError(f"{raw} is larger than {MAX_COMMIT_FILE_BYTES} bytes: commit it yourself", "too-large")
    return PathState(name, data, executable)


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: JSON can carry one
        return False
    return True


class GitSnapshot:
    schema = schema(
        "project.git_snapshot",
        "What project.git_commit needs, read-only: the current HEAD (`head`), the branch, each path's sha256"
        " (null: deleted) and the snapshot `fingerprint` of the paths. Pass `head` and `fingerprint` to"
        " project.git_commit as expected_head and expected_snapshot_fingerprint.",
        SnapshotArgs,
        read_only=True,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        states = await trio.to_thread.run_sync(read_states, ctx, tool_input["paths"])
        head = await trio.to_thread.run_sync(lambda: read_head(HostGit(ctx.workspace)))
        fingerprint = snapshot_fingerprint(states)
        return ToolResult(
            True,
            {"head": head.commit, "branch": head.branch, "fingerprint": fingerprint,
             "files": [{"path": state.path, "sha256": state.sha256} for state in states]},
            f"snapshot of {len(states)} paths: {fingerprint[:12]} on {(head.commit or 'no commit')[:12]}",
        )


class GitCommit:
    #: A person approves every commit: the default, and no policy goes below it (a spec
    #: that sets it to auto is a spec error; a glob that says auto does not lower it).
    default_policy = "confirm"
    min_policy = "confirm"
    #: Isolated children and delegated specialists never commit: the parent agent, which
    #: has the whole project's context, does (seed 004 V1.12).
    denied_run_kinds = ("child", "delegation")
    schema = schema(
        "project.git_commit",
        "Commit exactly `paths` (changed, new or deleted files) with `message`, on the current branch. First call"
        " project.git_snapshot(paths) and pass its `head` as expected_head and its `fingerprint` as"
        " expected_snapshot_fingerprint: if either changed since, nothing is committed. What the user staged is"
        " never included. The only git write; it always needs approval and a passed project verification.",
        CommitArgs,
        read_only=False,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        if ctx.is_child:
            raise ToolError("an isolated child never commits: deliver the change, and the parent agent commits it",
                            "not-allowed")
        # A passed project.verify on the current project revision, first (seed 004 V1.12).
        await require_verification(ctx)
        message = tool_input["message"].strip()
        if not message or len(message) > MAX_MESSAGE_CHARS or "\0" in message or not _is_utf8(message):
            raise ToolError(f"the message must be 1 to {MAX_MESSAGE_CHARS} characters of UTF-8 text, with no NUL",
                            "bad-message")
        states = await trio.to_thread.run_sync(read_states, ctx, tool_input["paths"])
        if snapshot_fingerprint(states) != tool_input["expected_snapshot_fingerprint"]:
            raise ToolError("the paths' content is not the snapshot's (a file changed since, or other paths):"
                            " review the change again and take a new project.git_snapshot", "snapshot-changed")
        expected_head = tool_input["expected_head"]
        done = await trio.to_thread.run_sync(lambda: commit_exact(ctx.workspace, states, message, expected_head))
        branch = done.branch.removeprefix("refs/heads/")
        output = {"commit": done.commit, "parent": done.parent, "branch": branch,
                  "paths": [state.path for state in states],
                  "message_sha256": hashlib.sha256(message.encode()).hexdigest(),
                  "index_refreshed": done.index_refreshed}
        if not done.index_refreshed:
            output["note"] = ("the commit is made, but the index was locked: the committed paths may show as"
                              " staged until `git reset -q -- <paths>`")
        counted = f"{len(states)} path{'' if len(states) == 1 else 's'}"
        return ToolResult(True, output, f"committed {counted} as {done.commit[:12]} on {branch}")

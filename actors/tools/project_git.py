"""``project.git_status``, ``project.git_diff``, ``project.git_snapshot`` and
``project.git_commit`` (seed 004 V1.12).

``project.git_commit`` is the only git write. It commits exactly the given paths,
only if HEAD is still the expected commit, nothing is staged, and the repository
still has the snapshot fingerprint ``project.git_snapshot`` gave: HEAD, the branch
and every safe change, not only the paths' (git_snapshot.py; git_exact_commit.py
builds the commit in an index of its own). It needs a passed ``project.verify`` of
the same run on the current, non-zero project revision (project_verify.py
``require_verification``). It always needs approval, and children and
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

from corral.actors.tools import git_snapshot
from corral.actors.tools.base import ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.git_exact_commit import (
    MAX_COMMIT_PATHS,
    MAX_MESSAGE_CHARS,
    PathState,
    commit_exact,
    read_head,
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
from corral.mailbox.protocol import ProjectCommitMoved

#: A file larger than this is not read into memory to be committed.
MAX_COMMIT_FILE_BYTES = git_snapshot.MAX_FILE_BYTES
#: Changes listed in a snapshot's output (its fingerprint covers them all).
MAX_SHOWN_CHANGES = 100


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
    paths: NotRequired[list[str]]


class CommitArgs(TypedDict):
    message: str
    paths: list[str]
    expected_head: str
    expected_snapshot_fingerprint: str


def _snapshot(ctx: ToolContext) -> git_snapshot.Snapshot:
    return git_snapshot.take(ctx.workspace, (ctx.home,))


def read_states(ctx: ToolContext, raw_paths: list[str], *, at_least: int = 1) -> list[PathState]:
    """The paths to commit as they are now: each one's bytes (read like fs.read reads:
    confined, no symlink, no secret under any name), or None when it is deleted."""
    if not at_least <= len(raw_paths) <= MAX_COMMIT_PATHS:
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
        "What project.git_commit needs, read-only: the current HEAD (`head`), the branch, every changed path"
        " (`changes`: path, status code, sha256), how many paths are `staged` (a commit needs 0), each given"
        " path's sha256 (null: deleted) and the snapshot `fingerprint` of HEAD, the branch and all the changes."
        " Pass `head` and `fingerprint` to project.git_commit as expected_head and expected_snapshot_fingerprint.",
        SnapshotArgs,
        read_only=True,
    )

    async def run(self, ctx: ToolContext, tool_input: dict[str, Any]) -> ToolResult:
        states = await trio.to_thread.run_sync(lambda: read_states(ctx, tool_input.get("paths") or [], at_least=0))
        snap = await trio.to_thread.run_sync(_snapshot, ctx)
        fingerprint = snap.fingerprint
        return ToolResult(
            True,
            {"head": snap.head.commit, "branch": snap.head.branch, "fingerprint": fingerprint, "staged": snap.staged,
             "changes": [{"path": c.path, "code": c.code, "sha256": c.sha256}
                         for c in snap.changes[:MAX_SHOWN_CHANGES]],
             "changes_total": len(snap.changes),
             "files": [{"path": state.path, "sha256": state.sha256} for state in states]},
            f"snapshot of {len(snap.changes)} changed paths ({snap.staged} staged): {fingerprint[:12]} on"
            f" {(snap.head.commit or 'no commit')[:12]}",
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
        " project.git_snapshot and pass its `head` as expected_head and its `fingerprint` as"
        " expected_snapshot_fingerprint: if HEAD, the branch or any change moved since, nothing is committed."
        " Nothing may be staged. The only git write; it always needs approval and a passed project.verify of this"
        " run on the current project revision.",
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
        expected_head = tool_input["expected_head"]
        head = await trio.to_thread.run_sync(lambda: read_head(HostGit(ctx.workspace)))
        if head.commit is not None and head.commit != expected_head:
            raise ToolError(f"HEAD is {head.commit}, not the expected {expected_head}: take a new snapshot",
                            "head-changed")
        snap = await trio.to_thread.run_sync(_snapshot, ctx)
        if snap.fingerprint != tool_input["expected_snapshot_fingerprint"]:
            raise ToolError("the repository is not the snapshot's (HEAD, the branch, a change or what is staged"
                            " moved since): review the changes again and take a new project.git_snapshot",
                            "snapshot-changed")
        _check_paths(states, snap)
        secrets = _secrets(ctx)

        def keep_moved(commit: str, parent: str, branch: str) -> None:
            # From the commit's worker thread: the supervisor keeps the commit's safe
            # fields in the action's record before the index is installed (seed 004 V1.12).
            moved = ProjectCommitMoved(run_id=ctx.run_id, action_id=ctx.action_id, commit=commit, parent=parent,
                                       branch=branch)
            trio.from_thread.run(ctx.ask, moved)

        done = await trio.to_thread.run_sync(
            lambda: commit_exact(ctx.workspace, states, message, expected_head, lambda names: secrets.hidden(names),
                                 keep_moved))
        branch = done.branch.removeprefix("refs/heads/")
        committed = {state.path for state in states}
        output = {"commit": done.commit, "parent": done.parent, "branch": branch,
                  "paths": [state.path for state in states],
                  "message_sha256": hashlib.sha256(message.encode()).hexdigest(),
                  # The seed's "剩余变更计数" (V1.12): the snapshot's safe changes left
                  # uncommitted (the snapshot is the tree the commit was made from).
                  "remaining_changes": len({change.path for change in snap.changes} - committed),
                  "index_refreshed": done.index_refreshed}
        if not done.index_refreshed:
            output["note"] = ("the commit is made, but the index was locked: the committed paths may show as"
                              " staged until `git reset -q -- <paths>`")
        counted = f"{len(states)} path{'' if len(states) == 1 else 's'}"
        return ToolResult(True, output, f"committed {counted} as {done.commit[:12]} on {branch}")


def _check_paths(states: list[PathState], snap: git_snapshot.Snapshot) -> None:
    """Each path to commit is one of the snapshot's changes, with the bytes it hashed."""
    changed = {change.path: change for change in snap.changes}
    for state in states:
        change = changed.get(state.path)
        if change is None:
            raise ToolError(f"{state.path} has no change the snapshot lists: only a changed, new or deleted path"
                            " is committed", "path-unchanged")
        if change.sha256 != state.sha256:
            raise ToolError(f"{state.path} changed while it was read: take a new snapshot", "snapshot-changed")

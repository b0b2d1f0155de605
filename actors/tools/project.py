"""Changesets and git (seed 004 V1.3, V1.4, V1.12).

* ``project.changeset`` applies several file changes atomically: every change is
  checked first (inside the workspace and the agent's write scopes, the expected
  old content when given), then each file is written to a temporary file next
  to it, fsync'd, and renamed into place. Nothing is written unless everything
  checks. The output is the review: a diff and the SHA-256 before and after, per
  file. Applying the same changeset again changes nothing (idempotent).
* ``project.git_status`` and ``project.git_diff`` read the repository.
* ``project.git_commit`` is the only git write. It commits exactly the reviewed
  files, and only if their content still has the reviewed SHA-256. It needs
  approval by default (``confirm``). It never pushes, fetches, pulls, switches
  branches, merges, rebases, resets, stashes, tags or touches submodules or
  worktrees. Inside the command sandbox ``.git`` is mounted read-only, so
  ``command.exec`` cannot get round it (sandbox/bwrap.py).

Git runs with a fixed argv and never runs a program the repository names (hooks,
fsmonitor, drivers, filters, pager...), nor shows a secret file: see host_git.py.
"""

from __future__ import annotations

import difflib
import hashlib
import subprocess
from pathlib import Path
from typing import Any, NotRequired

import trio
from typing_extensions import TypedDict

from corral.actors.tools import fs
from corral.actors.tools.base import Tool, ToolContext, ToolError, ToolResult, schema
from corral.actors.tools.host_git import (
    HostGit,
    HostGitError,
    SecretPaths,
    exclusions,
    status_lines,
    status_names,
)
from corral.actors.tools.paths import check_write_scope

MAX_FILES = 50
MAX_FILE_BYTES = 1 << 20
MAX_DIFF_CHARS = 60_000


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _target(ctx: ToolContext, relative: str) -> Path:
    """The one path check of the file tools (workspace, home, control paths)."""
    return fs.confined(ctx, relative)


def _old_content(ctx: ToolContext, relative: str) -> bytes:
    """The file's bytes as fs.read reads them (no symlink followed at any level, not a
    secret or control file under another name), or b"" when there is no file. The
    hash of these bytes is shown and compared with the caller's: read through a hard
    link to `.env`, it would confirm a guess of the secret."""
    try:
        return fs.read_confined(ctx, relative)
    except ToolError as exc:
        if exc.code == "not-found":
            return b""
        raise


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
            path = _target(ctx, change["path"])
            new = change["content"].encode()
            if len(new) > MAX_FILE_BYTES:
                raise ToolError(f"{change['path']}: over {MAX_FILE_BYTES} bytes", "too-big")
            old = _old_content(ctx, change["path"])
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
            path = _target(ctx, entry["path"])
            current = sha256(_old_content(ctx, entry["path"])) if path.is_file() else None
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


TOOLS: list[Tool] = [Changeset(), GitStatus(), GitDiff(), GitCommit()]

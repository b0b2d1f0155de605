"""The commit snapshot of a repository (seed 004 V1.12 ``commitSnapshotFingerprint``):
HEAD, the attached branch, and every safe changed path (staged, unstaged or
untracked) with its porcelain code and the SHA-256 of its working-tree bytes.

A commit binds this whole picture, not only its own paths: a file the commit does
not name that changes, appears or is staged between the review and the commit
moves it, and the commit is refused. Secret files and control directories
(``.git``, ``.corral``, a home inside the workspace) are never part of it, so
corral's own control-plane writes make no false drift, and their names never leave.

The status is read twice, before and after the bytes: a tree that changed while it
was read gives no snapshot. Past MAX_CHANGES paths, or a changed file larger than
MAX_FILE_BYTES, no snapshot is given either (the seed: "路径数量或对象摘要超过上限时，
不签发可提交快照").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from corral.actors.tools.base import ToolError
from corral.actors.tools.git_exact_commit import Head, StatusEntry, commit_snapshot_fingerprint, read_head
from corral.actors.tools.host_git import HostGit, HostGitError, SecretPaths
from corral.core import nesting
from corral.sandbox.control_paths import is_control_name

#: Safe changed paths one snapshot covers.
MAX_CHANGES = 256
#: A changed file larger than this is not hashed (nor committed: project_git.py).
MAX_FILE_BYTES = 8 << 20

STATUS_ARGS = ("status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all", "--ignore-submodules=all")


@dataclass(frozen=True)
class Snapshot:
    head: Head
    changes: tuple[StatusEntry, ...]
    #: Paths with staged content, secret ones included (counted, never named).
    staged: int

    @property
    def fingerprint(self) -> str:
        return commit_snapshot_fingerprint(self.head.commit, self.head.branch, self.changes)


def _status(git: HostGit) -> str:
    try:
        done = git.run(*STATUS_ARGS)
    except HostGitError as exc:
        raise ToolError(str(exc), "git-failed") from None
    if done.returncode != 0:
        raise ToolError(done.stderr.strip()[:300] or "git status failed", "git-failed")
    return done.stdout


def _entries(raw: str) -> list[tuple[str, str]]:
    """(code, path) of each ``XY path`` entry of ``--porcelain=v1 -z --no-renames``."""
    return [(entry[:2], entry[3:]) for entry in raw.split("\0") if len(entry) > 3]


def _digest(root: Path, path: str) -> str | None:
    try:
        read = nesting.read_inside(root, path, MAX_FILE_BYTES + 1)
    except nesting.NotReadable:
        return None  # deleted, or not a regular file: its code says which
    if read.size > MAX_FILE_BYTES:
        raise ToolError(f"{path} is larger than {MAX_FILE_BYTES} bytes: no commit snapshot covers it; commit it"
                        " yourself", "too-large")
    return hashlib.sha256(read.data).hexdigest()


def safe_names(workspace: Path, homes: Sequence[Path], names: Sequence[str]) -> list[str]:
    """``names`` without the secret ones and those under a control directory."""
    hidden = SecretPaths(workspace, tuple(homes)).hidden(names)
    return [name for name in names
            if name not in hidden and not any(is_control_name(part) for part in PurePosixPath(name).parts)]


def take(workspace: Path, homes: Sequence[Path]) -> Snapshot:
    """The snapshot of ``workspace`` now (blocking: git and file reads)."""
    git = HostGit(workspace)
    root = workspace.resolve()
    before = _status(git)
    head = read_head(git)
    entries = _entries(before)
    try:
        safe = set(safe_names(workspace, homes, [path for _, path in entries]))
    except HostGitError as exc:
        raise ToolError(str(exc), "git-failed") from None
    if len(safe) > MAX_CHANGES:
        raise ToolError(f"{len(safe)} changed paths: a commit snapshot covers at most {MAX_CHANGES}",
                        "too-many-changes")
    changes = tuple(StatusEntry(path, code, _digest(root, path)) for code, path in entries if path in safe)
    staged = sum(1 for code, _ in entries if code[0] not in " ?")
    if _status(git) != before or read_head(git) != head:
        raise ToolError("the working tree changed while its snapshot was read: take it again", "snapshot-drift")
    return Snapshot(head, changes, staged)

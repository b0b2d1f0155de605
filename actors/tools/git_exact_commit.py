"""corral's one git write: a commit of exactly some paths, with exactly the bytes that
were checked, built in an index of its own (seed 004 V1.12).

The user's index is never used to build the commit, so what they staged is never
swept into it. The tree is built in a temporary index (``GIT_INDEX_FILE``): the
expected HEAD's tree, then the chosen paths with the bytes corral read and compared
with the caller's snapshot fingerprint (``hash-object --no-filters``: no clean filter
changes them). ``commit-tree`` makes the commit with the expected HEAD as its parent,
and ``update-ref HEAD <new> <expected>`` moves the branch only if it still points at
the expected commit (a compare-and-swap: a concurrent commit wins, this one fails).

The real ``.git/index.lock`` is held from before the index is read to the new
index's install (seed 004 V1.12): another git holding it refuses the commit; a
failed ``update-ref`` that leaves the branch where it was (or unreadable) is an
unknown outcome for a person, never a plain failure.

Afterwards the user's index gets the committed paths' new entries, and nothing else:
an index still holding the old content of a committed path would show it as staged
(``MM``), and the user's next plain ``git commit`` would silently revert it. A
index must hold nothing staged at all (seed 004 V1.12: "已有 staged 内容一律拒绝"): any
staged path, named or not, refuses the commit beforehand, so no staged work is ever
overwritten or left to be swept into the user's next commit beside corral's.

Every git here runs through HostGit (host_git.py): no hooks, filters, drivers, pager
or global config. The identity is the repository's own ``user.name`` and
``user.email`` (its ``.git/config``), never one corral invents; the global config
does not count, as no other setting of it does.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.actors.tools.base import OUTCOME_UNKNOWN, ToolError
from corral.actors.tools.host_git import HostGit, HostGitError, Identity
from corral.core import failpoints

#: The seed's bound on one commit's paths.
MAX_COMMIT_PATHS = 12
MAX_MESSAGE_CHARS = 5000
#: A fixed line in the HEAD and branch reflogs: the message itself stays in the commit.
REFLOG_MESSAGE = "commit: corral project.git_commit"
_OBJECT_ID = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_SET_IDENTITY = (
    " Set it in this repository (corral reads no global git config):"
    ' git config user.name "Your Name" && git config user.email you@example.com'
)


@dataclass(frozen=True)
class PathState:
    """One path to commit as corral read it: its bytes, or None when it is deleted."""

    path: str
    data: bytes | None
    executable: bool = False

    @property
    def sha256(self) -> str | None:
        return None if self.data is None else hashlib.sha256(self.data).hexdigest()


def snapshot_fingerprint(states: Sequence[PathState]) -> str:
    """sha256 of the JSON ``[[path, sha256 or null], ...]`` sorted by path, compact
    (``separators=(",", ":")``): the same content of the same paths, the same value."""
    pairs = sorted([state.path, state.sha256] for state in states)
    return hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class StatusEntry:
    """One safe changed path of ``git status --porcelain=v1``: its two-letter code and
    the SHA-256 of its working-tree bytes (None: deleted, or not a regular file)."""

    path: str
    code: str
    sha256: str | None


def commit_snapshot_fingerprint(head: str | None, branch: str | None, entries: Sequence[StatusEntry]) -> str:
    """sha256 of the compact JSON ``{"branch", "changes": [[path, code, sha256], ...]
    sorted by path, "head"}``: HEAD, the attached branch and every safe change."""
    changes = sorted([entry.path, entry.code, entry.sha256] for entry in entries)
    text = json.dumps({"branch": branch, "changes": changes, "head": head}, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Head:
    commit: str | None  # None: an unborn branch
    branch: str | None  # refs/heads/<name>; None: a detached HEAD


@dataclass(frozen=True)
class Committed:
    commit: str
    parent: str
    branch: str
    #: Whether the user's index got the committed paths (always, once committed: an
    #: index that could not be installed is an unknown outcome instead).
    index_refreshed: bool


def _git(git: HostGit, *args: str, literal_paths: bool = False, index_file: Path | None = None,
         identity: Identity | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return git.run(*args, literal_paths=literal_paths, index_file=index_file, identity=identity)
    except HostGitError as exc:
        raise ToolError(str(exc), "git-failed") from None


def _out(done: subprocess.CompletedProcess[str], what: str) -> str:
    if done.returncode != 0:
        raise ToolError(done.stderr.strip()[:300] or f"git {what} failed", "git-failed")
    return done.stdout.strip()


def read_head(git: HostGit) -> Head:
    ref = _git(git, "symbolic-ref", "-q", "HEAD")
    branch = ref.stdout.strip() if ref.returncode == 0 and ref.stdout.startswith("refs/heads/") else None
    head = _git(git, "rev-parse", "-q", "--verify", "HEAD^{commit}")
    return Head(head.stdout.strip() if head.returncode == 0 else None, branch)


def repository_identity(git: HostGit) -> Identity:
    """``user.name`` and ``user.email`` of the repository's own config (``--local``: not
    the global or system one, and no include), or a clear error saying how to set them."""
    values = []
    for key in ("user.name", "user.email"):
        done = _git(git, "config", "--local", "--get", key)
        value = done.stdout.strip() if done.returncode == 0 else ""
        if not value or any(ch in value for ch in "<>\n\0"):
            raise ToolError(f"the repository has no usable {key}: corral commits as the repository's own"
                            f" identity and never invents one.{_SET_IDENTITY}", "no-identity")
        values.append(value)
    return Identity(values[0], values[1])


#: Staged paths named in a refusal.
MAX_NAMED_STAGED = 5


def _no_hidden(names: Sequence[str]) -> set[str]:
    return set()


def _nothing_kept(commit: str, parent: str, branch: str) -> None:
    return None


#: Called once the branch moved, before the index is installed: keeps the commit's
#: safe fields where a crash cannot lose them (the action's record). May raise.
KeepMoved = Callable[[str, str, str], None]
#: Between the branch's move (its fields kept) and the index's install.
AFTER_REF_FAILPOINT = "commit.after-ref"


def commit_exact(workspace: Path, states: Sequence[PathState], message: str, expected_head: str,
                 hidden: Callable[[Sequence[str]], set[str]] = _no_hidden,
                 keep_moved: KeepMoved = _nothing_kept) -> Committed:
    """Commit exactly ``states`` on the current branch, whose tip must be ``expected_head``,
    with nothing staged in the real index. ``hidden``: the names a refusal never shows."""
    if not _OBJECT_ID.match(expected_head):
        raise ToolError("expected_head must be a full commit id (project.git_snapshot gives it)", "bad-input")
    if not (workspace / ".git").is_dir() or (workspace / ".git").is_symlink():
        raise ToolError("the workspace's .git is not a directory (a worktree, a submodule or a link):"
                        " project.git_commit commits in a plain repository only", "not-supported")
    git = HostGit(workspace)
    head = read_head(git)
    if head.branch is None:
        raise ToolError("HEAD is detached: project.git_commit commits on a local branch only", "not-supported")
    if head.commit is None:
        raise ToolError(f"{head.branch} has no commit yet: make the first commit yourself", "not-supported")
    if head.commit != expected_head:
        raise ToolError(f"HEAD is {head.commit}, not the expected {expected_head}: take a new snapshot",
                        "head-changed")
    identity = repository_identity(git)
    # Seed 004 V1.12: the real .git/index.lock is held from here to the new index's
    # install, so no other git writes the index meanwhile (one holding it refuses this).
    lock = _take_index_lock(workspace / ".git")
    try:
        return _commit_locked(git, lock, head, states, message, identity, hidden, keep_moved)
    finally:
        lock.unlink(missing_ok=True)


def _take_index_lock(git_dir: Path) -> Path:
    lock = git_dir / "index.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise ToolError("the repository's .git/index.lock exists: another git is writing the index; nothing was"
                        " committed (try again once it is done, or remove a stale lock)", "index-locked") from None
    except OSError as exc:
        raise ToolError(f"could not take .git/index.lock ({exc.strerror}); nothing was committed",
                        "index-locked") from None
    os.close(fd)
    return lock


def _commit_locked(git: HostGit, lock: Path, head: Head, states: Sequence[PathState], message: str,
                   identity: Identity, hidden: Callable[[Sequence[str]], set[str]], keep_moved: KeepMoved) -> Committed:
    assert head.commit is not None and head.branch is not None
    staged = [name for name in _out(_git(git, "diff-index", "--cached", "--name-only", "-z", "--no-renames",
                                         head.commit), "diff-index").split("\0") if name]
    if staged:
        secret = hidden(staged)
        shown = [name for name in staged if name not in secret][:MAX_NAMED_STAGED]
        count = f"{len(staged)} staged path{'' if len(staged) == 1 else 's'}"
        named = f" ({', '.join(shown)[:300]}{', ...' if len(shown) < len(staged) else ''})" if shown else ""
        raise ToolError(f"the index holds {count}{named}: project.git_commit commits only with an empty index and"
                        " never takes or overwrites what was staged; commit or unstage it first", "staged-changes")
    with tempfile.TemporaryDirectory(prefix="corral-commit-") as scratch:
        index = Path(scratch) / "index"
        _out(_git(git, "read-tree", head.commit, index_file=index), "read-tree")
        entries = _entries(git, Path(scratch), states)
        _out(_git(git, "update-index", *entries, index_file=index), "update-index")
        tree = _out(_git(git, "write-tree", index_file=index), "write-tree")
        if tree == _out(_git(git, "rev-parse", f"{head.commit}^{{tree}}"), "rev-parse"):
            raise ToolError("the paths have the content HEAD has: there is nothing to commit", "nothing-to-commit")
        message_file = Path(scratch) / "message"
        message_file.write_bytes(message.encode() + (b"" if message.endswith("\n") else b"\n"))
        new = _out(_git(git, "commit-tree", tree, "-p", head.commit, "-F", str(message_file), identity=identity),
                   "commit-tree")
        moved = _git(git, "update-ref", "-m", REFLOG_MESSAGE, "HEAD", new, head.commit, identity=identity)
        if moved.returncode != 0:
            try:
                now = read_head(git).commit
            except ToolError:
                now = None
            if now is not None and now not in (head.commit, new):
                raise ToolError(f"HEAD moved to {now} meanwhile: nothing was committed; take a new snapshot",
                                "head-changed")
            # Seed 004 V1.12: a ref still at the expected commit, at the candidate or
            # unreadable after a failed update-ref is uncertain: for a person, never retried.
            raise ToolError(f"git update-ref of {head.branch} failed and HEAD is {now or 'unreadable'}"
                            f" (candidate commit {new}, expected {head.commit}): check the branch before"
                            f" anything else; {moved.stderr.strip()[:200]}", OUTCOME_UNKNOWN)
        try:
            keep_moved(new, head.commit, head.branch)
        except Exception as exc:  # the commit exists; not knowing it was kept is for a person
            raise ToolError(f"committed {new} on {head.branch} (parent {head.commit}), but could not keep that in"
                            f" the action's record ({exc})", OUTCOME_UNKNOWN) from None
        failpoints.hit(AFTER_REF_FAILPOINT)
        _install_index(git, lock, entries, new, head)
    return Committed(new, head.commit, head.branch, True)


def _install_index(git: HostGit, lock: Path, entries: list[str], new: str, head: Head) -> None:
    """The user's index with the committed paths' new entries (it held nothing staged,
    so it now matches the new HEAD), written into the held lock file and renamed over
    the index (atomic in its directory). After the ref moved, a failure here is an
    unknown outcome: the commit exists, the index may be stale."""
    index = lock.parent / "index"
    try:
        lock.write_bytes(index.read_bytes() if index.exists() else b"")
        if not index.exists():
            _out(_git(git, "read-tree", head.commit or new, index_file=lock), "read-tree")
        _out(_git(git, "update-index", *entries, index_file=lock), "update-index")
        with lock.open("rb") as written:
            os.fsync(written.fileno())
        os.replace(lock, index)
    except (OSError, ToolError) as exc:
        raise ToolError(f"committed {new} on {head.branch}, but the index could not be installed ({exc}):"
                        " check `git status` before anything else", OUTCOME_UNKNOWN) from None


def _entries(git: HostGit, scratch: Path, states: Sequence[PathState]) -> list[str]:
    """``update-index`` arguments that set every path: written blobs (``hash-object
    --no-filters`` of the bytes corral read) with ``--cacheinfo``, then the deleted ones."""
    written = [state for state in states if state.data is not None]
    files = []
    for number, state in enumerate(written):
        blob_file = scratch / f"blob-{number}"
        blob_file.write_bytes(state.data or b"")
        files.append(str(blob_file))
    blobs = _out(_git(git, "hash-object", "-w", "--no-filters", "--", *files), "hash-object").split() if files else []
    if len(blobs) != len(written):
        raise ToolError("git hash-object gave an unexpected answer", "git-failed")
    entries = ["--add"]
    for state, blob in zip(written, blobs, strict=True):
        entries += ["--cacheinfo", "100755" if state.executable else "100644", blob, state.path]
    deleted = [state.path for state in states if state.data is None]
    return [*entries, "--force-remove", "--", *deleted]

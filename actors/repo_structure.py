"""The repository's structure, as the stale-context fingerprint sees it (seed 004
V1.1 §1, V1.24: "v2 fingerprint 覆盖……既有仓库结构"): the bounded tree (every path the
walk saw, file or directory: actors/repo_walk.py), each manifest's bytes, and the
git state (whether ``.git`` is a repository directory, the attached branch, HEAD's
commit).

A file's content edit is not structure (the project revision and the verification
gate speak for content); a file added, removed or renamed, a manifest edited, a
commit or a branch switch is. The plan's own writes move it too, which the guard
excludes (supervisor/context/repo_fingerprint_service.py).

Git is read from its files, never by running git: ``.git/HEAD``, the branch's loose
ref or its line in ``packed-refs``. Each read is bounded and follows no symlink
(corral.core.nesting). A ``.git`` that is a file (a worktree's or a submodule's
pointer) is recorded by its digest only: what it points to is outside the workspace.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import rfc8785

from corral.actors import repo_walk
from corral.core import nesting

#: What is read of one manifest, of ``.git/HEAD`` and a ref, of ``packed-refs``.
MAX_MANIFEST_BYTES = 256 * 1024
MAX_REF_BYTES = 1024
MAX_PACKED_REFS_BYTES = 4 << 20
_REF_NAME = re.compile(r"^refs/heads/[A-Za-z0-9._/+-]{1,200}$")
#: The names of the fingerprinted sources (the guard's observation names them).
TREE, GIT = "repository tree", "git state"


def manifest_source(path: str) -> str:
    return f"manifest at {path}"


def is_source(name: str) -> bool:
    """Whether a source name (a stamp's ``sources`` key) is a part of the structure."""
    return name in (TREE, GIT) or name.startswith("manifest at ")


@dataclass(frozen=True)
class Structure:
    #: repo_walk.Walk.tree_digest, and whether the walk was cut.
    tree: str = ""
    truncated: bool = False
    #: (path, sha256 of its bytes, or why it was not read), sorted by path.
    manifests: tuple[tuple[str, str], ...] = ()
    #: (key, value) of the git state, sorted.
    git: tuple[tuple[str, str], ...] = ()

    def canonical(self) -> dict[str, Any]:
        return {"tree": self.tree, "truncated": self.truncated, "manifests": dict(self.manifests),
                "git": dict(self.git)}

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(rfc8785.dumps(self.canonical())).hexdigest()

    def sources(self) -> dict[str, str]:
        """Each part by a readable name: the first 16 hex digits of its digest."""
        tree = hashlib.sha256(f"{self.tree}:{self.truncated}".encode()).hexdigest()
        found = {TREE: tree[:16], GIT: hashlib.sha256(rfc8785.dumps(dict(self.git))).hexdigest()[:16]}
        found.update({manifest_source(path): digest[:16] for path, digest in self.manifests})
        return found


def _read(root: Path, relative: str, limit: int) -> bytes | None:
    try:
        read = nesting.read_inside(root, relative, limit)
    except nesting.NotReadable:
        return None
    return read.data


def _manifest(root: Path, path: str) -> str:
    data = _read(root, path, MAX_MANIFEST_BYTES)
    return hashlib.sha256(data).hexdigest() if data is not None else "unreadable"


def _git(root: Path) -> tuple[dict[str, str], list[str], list[str]]:
    """The git state, the files read and the directories whose stat says a ref moved."""
    files, dirs = [".git/HEAD", ".git/packed-refs"], [".git"]
    head = _read(root, ".git/HEAD", MAX_REF_BYTES)
    if head is None:
        pointer = _read(root, ".git", MAX_REF_BYTES)
        if pointer is None:
            return {"repository": "no"}, [], [".git"] if (root / ".git").is_dir() else []
        return {"repository": "pointer", "pointer": hashlib.sha256(pointer).hexdigest()}, [".git"], []
    text = head.decode("utf-8", errors="replace").strip()
    if not text.startswith("ref: "):
        return {"repository": "yes", "branch": "", "head": text[:64]}, files, dirs
    ref = text.removeprefix("ref: ")
    if not _REF_NAME.match(ref):
        return {"repository": "yes", "branch": "unusual", "head": hashlib.sha256(head).hexdigest()}, files, dirs
    loose = f".git/{ref}"
    files.append(loose)
    dirs.append(str(Path(loose).parent))
    commit = _read(root, loose, MAX_REF_BYTES)
    if commit is not None:
        return {"repository": "yes", "branch": ref, "head": commit.decode("ascii", errors="replace").strip()[:64]}, \
            files, dirs
    packed = _read(root, ".git/packed-refs", MAX_PACKED_REFS_BYTES) or b""
    found = ""
    for line in packed.decode("utf-8", errors="replace").splitlines():
        sha, _, name = line.partition(" ")
        if name == ref:
            found = sha[:64]
            break
    return {"repository": "yes", "branch": ref, "head": found}, files, dirs


def read(root: Path, walk: repo_walk.Walk) -> tuple[Structure, list[str], list[str]]:
    """The structure of ``root`` (resolved) given its walk, with the files it read and
    the directories whose stat a cache must watch (their own stat: added refs)."""
    manifests = tuple(sorted((path, _manifest(root, path)) for path in walk.manifests))
    git, files, dirs = _git(root)
    structure = Structure(walk.tree_digest, walk.truncated, manifests, tuple(sorted(git.items())))
    return structure, [*walk.manifests, *files], dirs

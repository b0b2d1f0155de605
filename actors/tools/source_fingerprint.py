"""A bounded, deterministic fingerprint of a workspace's sources (seed 004 V1.2):
taken before and after a command (``command.exec``, ``project.verify``), so a
command that changed a source counts as a write.

Each file contributes its relative path, size, mtime_ns and inode, walked in name
order without following symlinks (a symlink contributes its own entry). Skipped:
control entries (``.git``, ``.corral``) and the corral home, secret files
(``.env*``, keys: corral.sandbox.control_paths), and heavy generated directories
(``node_modules``, virtualenvs, caches, build output), which hold no sources. The
walk stops after MAX_ENTRIES directory entries or MAX_FILES files and says so
(``complete`` false): a cut fingerprint never shows the tree unchanged.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from corral.sandbox.control_paths import is_control_name, is_secret_name

MAX_ENTRIES = 20_000
MAX_FILES = 10_000
#: Directories of generated files, never sources.
HEAVY_DIRS = frozenset({
    "node_modules", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox",
    ".nox", "target", ".gradle", ".next", ".cache",
})


@dataclass(frozen=True)
class SourceFingerprint:
    digest: str
    files: int
    #: False when the walk hit its bound: the digest covers only part of the tree.
    complete: bool

    def same_as(self, other: SourceFingerprint) -> bool:
        """Whether nothing changed between the two (never, if either was cut)."""
        return self.complete and other.complete and self.digest == other.digest


def _skipped(entry: os.DirEntry[str], home: Path) -> bool:
    if is_control_name(entry.name) or is_secret_name(entry.name) or entry.name.startswith(".env"):
        return True
    if entry.is_dir(follow_symlinks=False):
        return entry.name in HEAVY_DIRS or Path(entry.path) == home
    return False


def fingerprint(workspace: Path, home: Path) -> SourceFingerprint:
    root = workspace.resolve()
    home = home.resolve()
    digest = hashlib.sha256()
    entries = files = 0
    stack = [root]
    complete = True
    while stack and complete:
        directory = stack.pop()
        try:
            with os.scandir(directory) as listing:
                children = sorted(listing, key=lambda e: e.name)
        except OSError:
            continue  # gone or unreadable: it is no source the command can see either
        subdirs = []
        for entry in children:
            entries += 1
            if entries > MAX_ENTRIES:
                complete = False
                break
            if _skipped(entry, home):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            relative = os.path.relpath(entry.path, root)
            if stat.S_ISDIR(info.st_mode):
                subdirs.append(Path(entry.path))
                digest.update(f"d {relative}\n".encode(errors="surrogateescape"))
                continue
            files += 1
            if files > MAX_FILES:
                complete = False
                break
            digest.update(f"f {relative} {info.st_size} {info.st_mtime_ns} {info.st_ino}\n"
                          .encode(errors="surrogateescape"))
        stack.extend(reversed(subdirs))
    return SourceFingerprint(digest.hexdigest(), min(files, MAX_FILES), complete)

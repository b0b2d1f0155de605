"""The one deny list of control paths, shared by the file tools and the sandbox.

A control path is something an agent must never write (and mostly never read):
corral's own control directory and home, a version-control directory (writing
``.git/config`` or a hook is code execution on the host at the next ``git
status``), and files that hold secrets. The file tools refuse these paths at any
depth and through any symlink (actors/tools/paths.py); the bubblewrap profile masks
the same entries inside the sandbox (sandbox/bwrap.py). Keep every rule here, so
the two can never disagree.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

#: Directory (or file) names that are control paths at any depth. ``.git`` is also a
#: *file* in a worktree or a submodule (``gitdir: ...``): refused all the same.
CONTROL_NAMES: tuple[str, ...] = (".corral", ".git")

#: Names of files holding secrets: never read by a tool, bound empty in the sandbox.
SECRET_PATTERNS: tuple[str, ...] = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    "id_dsa*",
    "*.p12",
    "*.pfx",
    "credentials*",
    ".netrc",
    ".pgpass",
    ".npmrc",
    ".pypirc",
)

#: A project walk for secret files stops here and fails closed (see secret_entries).
MAX_WALK_ENTRIES = 200_000


class ControlPathError(ValueError):
    """A path that reaches a control path; the message names the rule."""


#: All secret patterns as one regex: the sandbox tests every name of a project tree
#: on each launch, and one match per name is much cheaper than one per pattern.
_SECRET_RE = re.compile("|".join(fnmatch.translate(pattern) for pattern in SECRET_PATTERNS))


def is_control_name(name: str) -> bool:
    # Case-insensitive: on a case-insensitive file system (macOS, a mounted FAT or
    # NTFS volume) `.GIT/config` *is* `.git/config`; refusing `.GIT` on Linux costs nothing.
    return name.lower() in CONTROL_NAMES


def is_secret_name(name: str) -> bool:
    return _SECRET_RE.match(name.lower()) is not None


def refusal(parts: Iterable[str]) -> str | None:
    """Why a relative path (its parts) is a control path, or None."""
    for part in parts:
        if is_control_name(part):
            return f"reaches the control directory {part}/"
        if is_secret_name(part):
            return "names a secrets file"
    return None


def check_not_control(relative: os.PathLike[str] | str, raw: str) -> None:
    why = refusal(PurePosixPath(relative).parts)
    if why is not None:
        raise ControlPathError(f"path {raw!r} {why}")


def check_outside(target: Path, forbidden: Iterable[Path], raw: str, *, workspace: Path) -> None:
    """A resolved target must not lie in (or be) a forbidden directory that lies in
    the workspace, e.g. a home at ``<project>/state``. (A workspace inside such a
    directory is a different layout: what is outside the workspace is out of reach
    anyway.)"""
    for directory in forbidden:
        real = directory.resolve()
        if workspace == real or real in workspace.parents:
            continue
        if target == real or real in target.parents:
            raise ControlPathError(f"path {raw!r} reaches corral's home directory")


def _walk(root: Path) -> Iterator[tuple[Path, list[str], list[str]]]:
    for directory, dirs, files in os.walk(root, followlinks=False):
        yield Path(directory), dirs, files


def sandbox_entries(root: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """What the sandbox must treat specially under ``root``, at any depth:
    (read-only control entries such as ``.git``, hidden control dirs such as
    ``.corral``, secret files and dirs to mask). Symlinks are never followed and never
    returned: binding over a symlink would land on its target."""
    read_only: list[Path] = []
    hidden: list[Path] = []
    secrets: list[Path] = []
    others: list[Path] = []
    secret_inodes: set[tuple[int, int]] = set()
    seen = 0
    for directory, dirs, files in _walk(root):
        seen += len(dirs) + len(files)
        if seen > MAX_WALK_ENTRIES:
            raise ControlPathError(
                f"{root} has more than {MAX_WALK_ENTRIES} entries; the sandbox cannot check it for secret"
                " files (narrow the workspace)"
            )
        keep: list[str] = []
        for name in dirs:
            path = directory / name
            if path.is_symlink():
                # `.git -> gitdata`: the control directory is its target; protect that
                # (binding over the link itself would land there anyway).
                target = path.resolve()
                if is_control_name(name) and target.is_dir() and (target == root or root in target.parents):
                    (read_only if name.lower() == ".git" else hidden).append(target)
                continue
            if name.lower() == ".git":
                read_only.append(path)
            elif is_control_name(name):
                hidden.append(path)
            elif is_secret_name(name):
                secrets.append(path)
            else:
                keep.append(name)
        dirs[:] = keep  # never descend into what is masked anyway
        for name in files:
            path = directory / name
            if path.is_symlink():
                # A secret-named link is masked at its target, when that is in reach.
                if is_secret_name(name) or is_control_name(name):
                    target = path.resolve()
                    if target.is_file() and (target == root or root in target.parents):
                        secrets.append(target)
                continue
            if is_control_name(name):
                read_only.append(path)
            elif is_secret_name(name):
                secrets.append(path)
                info = _lstat(path)
                if info is not None and stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
                    secret_inodes.add((info.st_dev, info.st_ino))
            else:
                others.append(path)
    if secret_inodes:
        # A hard link to a secret under a harmless name (`innocent.txt`) is the same
        # bytes: mask it too. Rare, so the stat of every file is paid only then.
        for path in others:
            info = _lstat(path)
            if info is not None and (info.st_dev, info.st_ino) in secret_inodes:
                secrets.append(path)
    return read_only, hidden, secrets


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except OSError:
        return None

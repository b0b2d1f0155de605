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


def is_secret_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_PATTERNS)


def refusal(parts: Iterable[str]) -> str | None:
    """Why a relative path (its parts) is a control path, or None."""
    for part in parts:
        if part in CONTROL_NAMES:
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
                continue
            if name == ".git":
                read_only.append(path)
            elif name in CONTROL_NAMES:
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
                if is_secret_name(name) or name in CONTROL_NAMES:
                    target = path.resolve()
                    if target.is_file() and (target == root or root in target.parents):
                        secrets.append(target)
                continue
            if name in CONTROL_NAMES:
                read_only.append(path)
            elif is_secret_name(name):
                secrets.append(path)
    return read_only, hidden, secrets

"""Confinement of agent-supplied paths to a workspace and its write scopes.

A path from an actor is relative, has no ``..``, does not reach a control path
(corral's home and control directory, ``.git`` at any depth, secrets: the one list
in corral.sandbox.control_paths), and still lies inside the workspace once every
symlink is resolved. Each rule fails with its own clear message, before anything
is touched. What only the tree on disk can tell (a gitdir a ``.git`` file names, a
repository shape, another name of the same inode) is judged by the staging and the
reads of actors/tools/staging.py, which also walk the resolved parent directory by
directory with O_NOFOLLOW, so a symlink swapped in after the check cannot redirect them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from corral.actors.tools.base import ToolError
from corral.sandbox.control_paths import (
    CONTROL_NAMES,
    SECRET_PATTERNS,
    ControlPathError,
    check_not_control,
    check_outside,
    is_secret_path,
)

__all__ = [
    "CONTROL_NAMES",
    "SECRET_PATTERNS",
    "check_relative",
    "check_write_scope",
    "resolve_in_workspace",
    "scopes_overlap",
]


def _refuse(message: str) -> ToolError:
    return ToolError(message, "path-refused")


def check_relative(raw: str) -> PurePosixPath:
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise _refuse("path must be a non-empty string")
    if len(raw) > 4096:
        raise _refuse("path is too long")
    path = PurePosixPath(raw)
    if path.is_absolute() or raw.startswith("~"):
        raise _refuse(f"path {raw!r} must be relative to the workspace")
    if ".." in path.parts:
        raise _refuse(f"path {raw!r} may not contain '..'")
    try:
        check_not_control(path, raw)
    except ControlPathError as exc:
        raise _refuse(str(exc)) from None
    return path


def resolve_in_workspace(workspace: Path, raw: str, *, forbidden: Iterable[Path] = ()) -> Path:
    """The resolved target of ``raw`` inside ``workspace``. ``forbidden`` are further
    directories no tool may reach (the home, wherever it lies)."""
    relative = check_relative(raw)
    root = workspace.resolve()
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise _refuse(f"path {raw!r} escapes the workspace through a symlink")
    # A symlink inside may still point at a control path or a secret.
    inside = target.relative_to(root)
    try:
        if str(inside) != ".":
            check_not_control(inside, raw)
            # A pattern with a slash may reach above the workspace root: a workspace
            # that is ~/.docker holds the secret `config.json`.
            if is_secret_path(target.parts):
                raise ControlPathError(f"path {raw!r} names a secrets file")
        check_outside(target, forbidden, raw, workspace=root)
    except ControlPathError as exc:
        raise _refuse(str(exc)) from None
    return target


def check_write_scope(workspace: Path, target: Path, scopes: tuple[str, ...], raw: str) -> None:
    root = workspace.resolve()
    inside = target.relative_to(root)
    for scope in scopes:
        scope_path = PurePosixPath(scope.rstrip("/")) if scope not in (".", "./", "") else PurePosixPath(".")
        if str(scope_path) == "." or PurePosixPath(inside).is_relative_to(scope_path):
            return
    raise _refuse(f"path {raw!r} is outside this agent's write scopes ({', '.join(scopes) or 'none'})")


def scopes_overlap(a: str, b: str) -> bool:
    left = PurePosixPath(os.path.normpath(a.rstrip("/") or "."))
    right = PurePosixPath(os.path.normpath(b.rstrip("/") or "."))
    if str(left) == "." or str(right) == ".":
        return True
    return left == right or left.is_relative_to(right) or right.is_relative_to(left)

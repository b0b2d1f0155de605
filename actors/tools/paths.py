"""Confinement of agent-supplied paths to a workspace and its write scopes.

A path from an actor is relative, has no ``..``, does not reach the control
directory or secrets, and still lies inside the workspace once every symlink is
resolved. Each rule fails with its own clear message, before anything is touched.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path, PurePosixPath

from corral.actors.tools.base import ToolError

CONTROL_DIRS = (".corral",)
SECRET_PATTERNS = (
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    "*.p12",
    "credentials*",
    ".netrc",
    ".pgpass",
)


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
    for part in path.parts:
        if part in CONTROL_DIRS:
            raise _refuse(f"path {raw!r} reaches the control directory {part}/")
        if any(fnmatch.fnmatch(part, pattern) for pattern in SECRET_PATTERNS):
            raise _refuse(f"path {raw!r} names a secrets file")
    return path


def resolve_in_workspace(workspace: Path, raw: str) -> Path:
    relative = check_relative(raw)
    root = workspace.resolve()
    target = (root / relative).resolve()
    if target != root and root not in target.parents:
        raise _refuse(f"path {raw!r} escapes the workspace through a symlink")
    # A symlink inside may still point at the control directory or a secret.
    inside = target.relative_to(root)
    if str(inside) != ".":
        check_relative(str(inside))
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

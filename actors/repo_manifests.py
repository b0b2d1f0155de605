"""Manifest and git summaries for the start-up context (seed 004 V1.1 §1).

A manifest gives its package name and the names of its scripts (what the project
says can be run; running one still goes through the command tools). Git gives a
fixed, safe summary: whether the workspace is a repository, the branch, HEAD's
short sha and how many files changed; always through corral's own host git
(actors/tools/host_git.py), which never runs a program the repository names.

A manifest is the repository's, so hostile: it is read without following a
symlink, at most MAX_MANIFEST_BYTES, and its nesting is bounded before a parser
sees it (100,000 levels in 200 KB raised RecursionError in the agent, issue 48).
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from corral.actors.tools.host_git import HostGit, HostGitError
from corral.core import nesting

MAX_MANIFEST_BYTES = 256 * 1024
#: Arrays and tables nest at most this deep in a manifest (real ones: under ten).
MAX_MANIFEST_DEPTH = 64
MAX_SCRIPTS = 30
_GO_MODULE = re.compile(r"^\s*module\s+(\S+)", re.MULTILINE)


def _names(value: object) -> list[str]:
    return sorted(str(key)[:80] for key in value) if isinstance(value, dict) else []


def _table(data: dict[str, Any], *path: str) -> Any:
    node: Any = data
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _parsed(path: str, text: str) -> tuple[str, list[str]]:
    """(package name, script names) of one manifest; a name it cannot parse is empty."""
    name = Path(path).name
    if name == "go.mod":
        found = _GO_MODULE.search(text)
        return (found.group(1)[:200] if found else ""), []
    if name == "package.json":
        nesting.check_json(text, MAX_MANIFEST_DEPTH)
        data = json.loads(text)
        if not isinstance(data, dict):
            return "", []
        return str(data.get("name") or "")[:200], _names(data.get("scripts"))
    nesting.check_toml(text, MAX_MANIFEST_DEPTH)
    data = tomllib.loads(text)
    if name == "Cargo.toml":
        bins = data.get("bin")
        names = sorted(str(b.get("name"))[:80] for b in bins if isinstance(b, dict)) if isinstance(bins, list) else []
        return str(_table(data, "package", "name") or "")[:200], names
    scripts = (_names(_table(data, "project", "scripts")) + _names(_table(data, "tool", "poetry", "scripts"))
               + _names(_table(data, "tool", "pdm", "scripts")))
    package = _table(data, "project", "name") or _table(data, "tool", "poetry", "name") or ""
    return str(package)[:200], sorted(set(scripts))


def manifest(root: Path, path: str) -> dict[str, Any]:
    """``{path, name, scripts, scripts_truncated}`` or ``{path, error}``."""
    try:
        read = nesting.read_inside(root, path, MAX_MANIFEST_BYTES)
    except nesting.NotReadable as exc:
        return {"path": path, "error": str(exc)}
    if read.truncated:
        return {"path": path, "error": f"larger than {MAX_MANIFEST_BYTES // 1024} KiB"}
    try:
        name, scripts = _parsed(path, read.data.decode("utf-8", errors="replace"))
    except nesting.TooDeep as exc:
        return {"path": path, "error": str(exc)}
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        return {"path": path, "error": f"does not parse ({str(exc).splitlines()[0][:120]})"}
    except RecursionError:  # the depth check above should make this unreachable
        return {"path": path, "error": "nested too deeply to parse"}
    return {"path": path, "name": name, "scripts": scripts[:MAX_SCRIPTS],
            "scripts_truncated": len(scripts) > MAX_SCRIPTS}


def git_summary(root: Path) -> dict[str, Any]:
    """``{repository: false}``, or the branch, HEAD's short sha and the changed-file counts."""
    if not os.path.lexists(root / ".git"):
        return {"repository": False}  # the common case costs no process
    try:
        done = HostGit(root).run("status", "--porcelain=v2", "-z", "--branch", "--no-renames",
                                 "--ignore-submodules=all", "--untracked-files=normal")
    except HostGitError:
        return {"repository": False}
    if done.returncode != 0:
        return {"repository": False}
    branch, head = "", ""
    changed = untracked = conflicted = 0
    for record in done.stdout.split("\0"):
        if record.startswith("# branch.head "):
            branch = record.removeprefix("# branch.head ")[:200]
        elif record.startswith("# branch.oid "):
            oid = record.removeprefix("# branch.oid ")
            head = oid[:12] if oid != "(initial)" else ""
        elif record.startswith(("1 ", "2 ")):
            changed += 1
        elif record.startswith("u "):
            conflicted += 1
        elif record.startswith("? "):
            untracked += 1
    return {"repository": True, "branch": branch, "head": head, "changed": changed, "untracked": untracked,
            "conflicted": conflicted}

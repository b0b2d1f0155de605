"""Path scopes: corral's extension of an intent contract's ``scope``.

An entry of ``scope.include`` or ``scope.exclude`` is a path rule only when it is
written ``path:<relative path>`` (optionally ending in ``/**``, which means the
same: the entry and everything beneath it). Any other entry (``workspace``,
``the docs``) is a plain-language note, as the reference guard reads every
entry, and is never taken for a directory. A malformed path rule (absolute,
``..``, ``.`` or empty segments, a backslash, a wildcard anywhere but the final
``/**``) makes the contract invalid, so a rule is never read as something it
does not say.

A path an action names is judged after the file tools' own resolution
(actors/tools/paths.py: relative, no ``..``, no control path, every symlink
resolved, still inside the workspace); a path the file tools refuse is refused
here too. Rules are resolved the same way and compared with the resolved path
component by component, never as strings. ``exclude`` covers every access;
``include`` (when it has path rules) covers writes. Commands are confined by the
OS instead: ``sandbox_paths`` gives the sandbox the resolved include paths as
its only writable binds and the resolved exclude paths as masks.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from corral.actors.tools.base import ToolError
from corral.actors.tools.paths import resolve_in_workspace
from corral.supervisor.intent.intent_classify import CORRAL_TAGS
from corral.supervisor.intent.intent_shell import js_trim

PREFIX = "path:"
_WILDCARDS = frozenset("*?[]{}")

#: Tools whose paths are judged: (the input keys holding them, whether they write).
READS = frozenset({"fs.read", "fs.list"})
WRITES = frozenset({"fs.write", "fs.patch", "project.changeset", "project.git_commit"})
COMMANDS = frozenset({"command.exec", "process.start"})


class ScopeError(ValueError):
    pass


@dataclass(frozen=True)
class PathRule:
    bucket: str  # "scope.include" or "scope.exclude"
    raw: str
    relative: PurePosixPath  # PurePosixPath(".") is the whole workspace

    @property
    def rule_id(self) -> str:
        return f"{self.bucket}:{hashlib.sha256(self.raw.encode()).hexdigest()[:16]}"


@dataclass(frozen=True)
class Scope:
    include: tuple[PathRule, ...] = ()
    exclude: tuple[PathRule, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.include or self.exclude)


def parse_rule(entry: str) -> PurePosixPath | None:
    """The path of a ``path:`` entry, None for a plain-language entry; ScopeError
    when the entry says ``path:`` but is not one unambiguous relative path."""
    text = js_trim(entry)
    if not text.lower().startswith(PREFIX):
        return None
    body = text[len(PREFIX):]
    if body in ("**", "."):
        return PurePosixPath(".")
    body = body.removesuffix("/**")
    problem = None
    if not body:
        problem = "names no path"
    elif body.startswith("/") or body.startswith("~"):
        problem = "must be relative to the workspace"
    elif "\\" in body or "\x00" in body:
        problem = "may not hold a backslash or NUL"
    elif any(char in _WILDCARDS for char in body):
        problem = "may not hold a wildcard (only a final /** is allowed, meaning the whole subtree)"
    elif any(part in ("", ".", "..") for part in body.split("/")):
        problem = "must be normalised (no empty, '.' or '..' segments, no trailing '/')"
    if problem:
        raise ScopeError(f"path rule {text!r} {problem}")
    return PurePosixPath(body)


def scope_of(projection: dict[str, Any]) -> Scope:
    """The path rules of a projection (ScopeError on a malformed one)."""
    scope = projection.get("scope") or {}

    def rules(bucket: str) -> tuple[PathRule, ...]:
        found = []
        for index, entry in enumerate(scope.get(bucket) or []):
            try:
                relative = parse_rule(str(entry))
            except ScopeError as exc:
                raise ScopeError(f"scope.{bucket}[{index}]: {exc}") from None
            if relative is not None:
                found.append(PathRule(f"scope.{bucket}", js_trim(str(entry)), relative))
        return tuple(found)

    return Scope(rules("include"), rules("exclude"))


#: A plain-language entry written as a path would be: one word holding a ``/`` or a
#: wildcard, or starting with ``.`` or ``~``, or a file name with an extension
#: (``secrets.txt``). Such a note limits nothing, which its author rarely means.
_PATH_LIKE = re.compile(r"^(?:[^\s]*[/*?\[\]{}][^\s]*|[.~][^\s]+|[\w-]+(?:\.[A-Za-z0-9_-]{1,10})+)$")


#: How many warnings a contract gets, and the longest entry judged (a path is short).
MAX_NOTES = 20
MAX_NOTE_CHARS = 240


def _suggested(text: str) -> tuple[str | None, str]:
    """The ``path:`` rule nearest to a path-like note (None: none is), and what to
    say of it. Leading ``./`` and repeated or trailing slashes are dropped; a
    wildcard a rule cannot hold makes it the whole folder before it
    (``src/*.py`` -> ``path:src/**``), which is said."""
    parts = [part for part in text.removeprefix("./").split("/") if part not in ("", ".")]
    if text.startswith(("/", "~")) or ".." in parts or not parts:
        return None, "a path rule is written path:<a path relative to the workspace>"
    subtree = parts[-1] == "**"
    if subtree:
        parts = parts[:-1]
    wild = next((at for at, part in enumerate(parts) if any(char in _WILDCARDS for char in part)), None)
    if wild == 0:
        return None, "a path rule takes no wildcard but a final /**: name the folder or the file"
    note = ""
    if wild is not None:
        parts, subtree = parts[:wild], True
        note = f" (a path rule takes no wildcard but a final /**: this covers all of {'/'.join(parts)})"
    candidate = PREFIX + ("/".join(parts) + ("/**" if subtree else "") if parts else "**")
    try:
        parse_rule(candidate)
    except ScopeError:
        return None, "a path rule is written path:<a path relative to the workspace>"
    return candidate, f"write {json.dumps(candidate)} to enforce it{note}"


def path_like_notes(projection: dict[str, Any]) -> list[str]:
    """A warning for each scope entry that reads as a plain-language note but looks
    like a path (``exclude: ["src/**"]`` protects nothing), with the ``path:``
    spelling that would be enforced. Pure: the contract's text alone."""
    scope = projection.get("scope") or {}
    warnings = []
    for bucket in ("include", "exclude"):
        for index, entry in enumerate(scope.get(bucket) or []):
            text = js_trim(str(entry))
            if len(text) > MAX_NOTE_CHARS or text.lower().startswith(PREFIX) or not _PATH_LIKE.match(text):
                continue
            _rule, advice = _suggested(text)
            warnings.append(f"scope.{bucket}[{index}] {json.dumps(text)} looks like a path but is read as a"
                            f" plain-language note and limits nothing; {advice}")
    if len(warnings) > MAX_NOTES:  # kept with the run's options: bounded whatever the contract
        warnings[MAX_NOTES - 1:] = [f"... and {len(warnings) - MAX_NOTES + 1} more scope entries like these"]
    return warnings


@dataclass(frozen=True)
class PathVerdict:
    raw: str
    #: Relative to the workspace, as resolved ("" when the path was refused).
    resolved: str
    #: path_in_scope | path_excluded | path_outside_scope | path_refused
    code: str
    rule: PathRule | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.code == "path_in_scope"


def _resolved_rule(root: Path, rule: PathRule) -> Path:
    try:
        return (root / rule.relative).resolve()
    except (OSError, RuntimeError):  # a symlink loop: the rule means its own spelling
        return root / rule.relative


def _covers(rule_target: Path, target: Path) -> bool:
    return target == rule_target or rule_target in target.parents


def judge_path(scope: Scope, workspace: Path, home: Path, raw: str, *, write: bool) -> PathVerdict:
    try:
        target = resolve_in_workspace(workspace, raw, forbidden=(home,))
    except ToolError as exc:
        return PathVerdict(raw, "", "path_refused", None, str(exc))
    except (OSError, RuntimeError) as exc:  # a symlink loop, a path too long to resolve
        return PathVerdict(raw, "", "path_refused", None, f"path {raw!r} cannot be resolved: {exc}")
    root = workspace.resolve()
    shown = target.relative_to(root).as_posix()
    for rule in scope.exclude:
        if _covers(_resolved_rule(root, rule), target):
            return PathVerdict(raw, shown, "path_excluded", rule,
                               f"{raw!r} resolves to {shown!r}, which the contract excludes ({rule.raw})")
    if write and scope.include and not any(_covers(_resolved_rule(root, rule), target) for rule in scope.include):
        wanted = ", ".join(rule.raw for rule in scope.include)
        return PathVerdict(raw, shown, "path_outside_scope", None,
                           f"{raw!r} resolves to {shown!r}, outside the contract's scope ({wanted})")
    return PathVerdict(raw, shown, "path_in_scope")


def _strings(values: Iterable[Any], key: str) -> list[str]:
    return [str(value[key]) for value in values if isinstance(value, dict) and isinstance(value.get(key), str)]


def action_paths(tool: str, tool_input: dict[str, Any]) -> list[tuple[str, bool]] | None:
    """(path, is a write) for every path a tool will touch; [] for a tool that
    touches none; None for a tool whose paths cannot be known beforehand."""
    if tool in READS:
        raw = tool_input.get("path", ".")
        return [(raw if isinstance(raw, str) and raw else ".", False)]
    if tool in ("fs.write", "fs.patch"):
        raw = tool_input.get("path")
        return [(raw, True)] if isinstance(raw, str) else []
    if tool == "project.changeset":
        changes = tool_input.get("changes")
        return [(path, True) for path in _strings(changes if isinstance(changes, list) else [], "path")]
    if tool in ("project.git_commit", "project.git_snapshot"):
        paths = tool_input.get("paths")
        write = tool == "project.git_commit"
        return [(path, write) for path in (paths if isinstance(paths, list) else []) if isinstance(path, str)]
    if tool in COMMANDS:
        # The working directory only: what the command then touches, the sandbox confines.
        cwd = tool_input.get("cwd")
        return [(cwd if isinstance(cwd, str) and cwd else ".", False)]
    if tool in CORRAL_TAGS:
        return []
    return None


#: Tools whose output may hold any changed file's content: under an exclude rule they
#: could show an excluded file, so they cannot be judged.
_SHOWS_ANY_DIFF = frozenset({"project.git_diff", "project.git_inspect"})


def judge_action(scope: Scope, workspace: Path, home: Path, tool: str,
                 tool_input: dict[str, Any]) -> list[PathVerdict] | None:
    """The verdict on every path of an action, or None when a scoped contract
    cannot judge it (a tool whose paths are not known, a diff that may show
    excluded files): such an action is blocked."""
    paths = action_paths(tool, tool_input)
    if paths is None or (tool in _SHOWS_ANY_DIFF and scope.exclude):
        return None if scope.active else []
    return [judge_path(scope, workspace, home, raw, write=write) for raw, write in paths]


def sandbox_paths(scope: Scope, workspace: Path) -> tuple[list[str] | None, list[str]]:
    """(writable, masked) for a command's sandbox: the resolved include paths that
    exist inside the workspace (None: no include path rule, the workspace stays
    writable) and the resolved exclude paths that exist inside it."""
    root = workspace.resolve()

    def existing(rules: tuple[PathRule, ...]) -> list[str]:
        found = []
        for rule in rules:
            target = _resolved_rule(root, rule)
            try:
                present = target.exists()
            except OSError:  # unreadable: the sandboxed command cannot reach it either
                present = False
            if present and (target == root or root in target.parents):
                found.append(str(target))
        return sorted(set(found))

    return (existing(scope.include) if scope.include else None), existing(scope.exclude)

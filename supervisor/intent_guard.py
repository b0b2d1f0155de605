"""The execution guard: every proposed action, classified against the bound contract.

Pure logic. An action has classes: its tool name, plus a kind (``read``,
``write``, ``exec``, ``delegate``, ``ask-user``, ``mcp`` and ``mcp:<server>``,
``effect``). Entries of ``authorization`` and ``must_and_must_not.must_not`` are
globs matched against those classes:

* ``forbidden`` or ``must_not`` -> ``block`` (the action is denied);
* ``requires_user`` -> ``ask`` (that one action waits for approval);
* otherwise ``continue`` (the normal policy decides).

``scope`` applies to the paths of file and process tools: ``exclude`` to every
access, ``include`` to writes and commands (a read outside it is not an effect).
A directory pattern (``docs/``, ``docs/**``) covers what is below it. The stricter
of guard and policy wins; the guard never loosens the policy.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

_KINDS = {
    "fs.read": "read",
    "fs.list": "read",
    "fs.write": "write",
    "fs.patch": "write",
    "command.exec": "exec",
    "command.output_read": "read",
    "process.start": "exec",
    "process.stdin": "exec",
    "process.poll": "read",
    "process.terminate": "exec",
    "user.input_request": "ask-user",
    "effect.record": "effect",
    "effect.barrier": "effect",
}


@dataclass(frozen=True)
class Decision:
    decision: str  # continue | ask | block
    severity: str
    reason_codes: tuple[str, ...]
    rule_ids: tuple[str, ...] = ()
    detail: str = ""
    visibility: str = "silent"
    extra: dict[str, Any] = field(default_factory=dict)


def action_classes(tool: str) -> set[str]:
    classes = {tool}
    if tool.startswith("agent."):
        classes.add("delegate")
    elif tool.startswith("mcp."):
        classes |= {"mcp", f"mcp:{tool.split('.')[1]}"}
    elif tool in _KINDS:
        classes.add(_KINDS[tool])
    return classes


def action_paths(tool: str, tool_input: dict[str, Any]) -> list[str]:
    if tool.startswith("fs."):
        path = tool_input.get("path")
        return [str(path)] if isinstance(path, str) else []
    if tool in ("command.exec", "process.start"):
        cwd = tool_input.get("cwd")
        return [str(cwd) if isinstance(cwd, str) and cwd else "."]
    return []


def _normal(path: str) -> str:
    return path.strip().lstrip("./") if path not in (".", "./") else "."


def path_matches(path: str, pattern: str) -> bool:
    path, raw = _normal(path), pattern.strip()
    base = raw.removesuffix("/**").removesuffix("/").lstrip("./")
    if raw.endswith(("/", "/**")) or "*" not in raw:
        return path == base or path.startswith(base + "/")
    return fnmatch.fnmatchcase(path, raw.lstrip("./"))


def _matching(entries: list[str], classes: set[str]) -> list[str]:
    return [entry for entry in entries if any(fnmatch.fnmatchcase(cls, entry) for cls in classes)]


def classify(projection: dict[str, Any], tool: str, tool_input: dict[str, Any]) -> Decision:
    classes = action_classes(tool)
    read_only = "read" in classes
    authorization = projection.get("authorization", {})
    forbidden = _matching(list(authorization.get("forbidden", [])), classes)
    if forbidden:
        return Decision("block", "high", ("forbidden",), tuple(f"authorization.forbidden:{e}" for e in forbidden),
                        f"{tool} is forbidden by the intent contract ({', '.join(forbidden)})", "model")
    must_not = _matching(list(projection.get("must_and_must_not", {}).get("must_not", [])), classes)
    if must_not:
        return Decision("block", "high", ("must-not",), tuple(f"must_not:{e}" for e in must_not),
                        f"{tool} is a class the intent contract says must not happen ({', '.join(must_not)})", "model")
    scope = projection.get("scope", {})
    for path in action_paths(tool, tool_input):
        excluded = [p for p in scope.get("exclude", []) if path_matches(path, p)]
        if excluded:
            return Decision("block", "high", ("out-of-scope",), tuple(f"scope.exclude:{e}" for e in excluded),
                            f"{path} is excluded by the intent contract's scope", "model")
        include = list(scope.get("include", []))
        if include and not read_only and not any(path_matches(path, p) for p in include):
            return Decision("block", "high", ("out-of-scope",), ("scope.include",),
                            f"{path} is outside the intent contract's scope ({', '.join(include)})", "model")
    asks = _matching(list(authorization.get("requires_user", [])), classes)
    if asks:
        return Decision("ask", "medium", ("requires-user",), tuple(f"authorization.requires_user:{e}" for e in asks),
                        f"{tool} needs the user's approval by the intent contract", "user")
    allowed = _matching(list(authorization.get("allowed", [])), classes)
    if allowed:
        return Decision("continue", "low", ("allowed",), tuple(f"authorization.allowed:{e}" for e in allowed))
    return Decision("continue", "low", ("no-rule",))


# -- completion evidence ------------------------------------------------------------------


def evidence_sources(tool: str, tool_input: dict[str, Any]) -> set[str]:
    """What a finished, successful action proves, in the contract's source terms."""
    if tool in ("fs.write", "fs.patch"):
        return {"file"}
    if tool in ("command.exec", "process.start"):
        text = " ".join(str(part) for part in (tool_input.get("argv") or [tool_input.get("command", "")]))
        return {"command", "test"} if any(word in text for word in ("test", "pytest", "check")) else {"command"}
    if tool.startswith("mcp."):
        return {"api"}
    if tool == "user.input_request":
        return {"user"}
    return set()


def missing_evidence(projection: dict[str, Any], refs: list[tuple[str, set[str]]]) -> tuple[list[str], list[str]]:
    """(unmet requirements, the refs used): each item needs its own verified ref
    from one of its acceptable sources."""
    used: list[str] = []
    missing: list[str] = []
    for item in projection.get("completion_evidence", []):
        wanted = set(item.get("acceptable_sources", []))
        found = next((ref for ref, sources in refs if ref not in used and sources & wanted), None)
        if found is None:
            missing.append(str(item.get("requirement", "")))
        else:
            used.append(found)
    return missing, used

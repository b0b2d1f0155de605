"""What a goal is made of (seed 004 V1.18), checked and put in words; no I/O.

A goal is an outcome (its text) with at most :data:`MAX_ITEMS` constraints and
at most :data:`MAX_ITEMS` verification items (what shows the outcome is met;
none given: the outcome itself is the standard). Its fingerprint covers the
three and names the goal and revision, so an action, a finalization or a
completion bound to it can tell an edited goal from the one it was made for.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from corral.core.redact import redact_text
from corral.supervisor.errors import BadRequest

MAX_ITEMS = 8
MAX_ITEM_CHARS = 300
MAX_GOAL_CHARS = 4000
#: Control characters an item may not carry (one line each).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LABELS = {"constraints": "constraints", "verification": "verification items"}


def goal_list(value: Any, name: str) -> list[str]:
    """A ``constraints`` or ``verification`` list: up to 8 one-line strings, kept
    redacted (as the goal's text is: the ledger never holds a secret)."""
    label = _LABELS[name]
    if value is None:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"{name} must be a list of strings (at most {MAX_ITEMS} {label})")
    if len(value) > MAX_ITEMS:
        raise BadRequest(f"a goal has at most {MAX_ITEMS} {label}; {len(value)} were given")
    items: list[str] = []
    for item in value:
        if not isinstance(item, str) or not item.strip():
            raise BadRequest(f"each of the goal's {label} must be a non-empty string")
        if len(item) > MAX_ITEM_CHARS or _CONTROL.search(item):
            raise BadRequest(f"each of the goal's {label} is one line of at most {MAX_ITEM_CHARS} characters")
        items.append(redact_text(item.strip()))
    if len(set(items)) != len(items):
        raise BadRequest(f"the goal's {label} repeat an item")
    return items


def goal_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_GOAL_CHARS:
        raise BadRequest(f"the goal must be 1 to {MAX_GOAL_CHARS} characters")
    return redact_text(value.strip())


def goal_param(value: Any) -> tuple[str, list[str], list[str]]:
    """A run's ``goal``: its text, or a table ``{text, constraints, verification}``."""
    if isinstance(value, dict):
        unknown = set(value) - {"text", "constraints", "verification"}
        if unknown:
            raise BadRequest(f"a goal has text, constraints and verification, not {', '.join(sorted(unknown))}")
        return (goal_text(value.get("text")), goal_list(value.get("constraints"), "constraints"),
                goal_list(value.get("verification"), "verification"))
    return goal_text(value), [], []


def task_text(text: str, constraints: list[str], verification: list[str]) -> str:
    """The goal as the model reads it (its first task, and an edit's steer)."""
    parts = [text]
    if constraints:
        parts.append("Constraints:\n" + "\n".join(f"- {item}" for item in constraints))
    if verification:
        parts.append("It is met when (verification):\n" + "\n".join(f"- {item}" for item in verification))
    return "\n\n".join(parts)


def durable_context(goal: dict[str, Any]) -> str:
    """The goal as every provider turn of its run reads it first (seed 004 V1.18: an
    explicit durable-goal context): its identity and revision, the objective, the
    constraints and the verification, from the goal store."""
    lines = [f"DURABLE GOAL (goal {goal['goal_id']}, revision {goal['revision']}, {goal['status']}). This is the"
             " current goal, read from corral's goal store for this turn; it supersedes any earlier revision"
             " of it in the task or the history below.",
             f"Objective: {goal['text']}"]
    constraints, verification = goal["constraints"], goal["verification"]
    lines.append("Constraints:" if constraints else "Constraints: none given.")
    lines += [f"- {item}" for item in constraints]
    lines.append("Verification (it is met when):" if verification
                 else "Verification: none given; the objective itself is the standard.")
    lines += [f"- {item}" for item in verification]
    lines.append("Before your final reply, judge the current goal with goal.verdict (met, evidence).")
    return "\n".join(lines)


def fingerprint(goal_id: str, revision: int, text: str, constraints: list[str], verification: list[str]) -> str:
    body = {"goal_id": goal_id, "revision": revision, "text": text, "constraints": constraints,
            "verification": verification}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def blocked_reason(old: int, new: int) -> str:
    """What an action made for goal revision ``old`` says once the goal is at ``new``."""
    return (f"blocked: the goal was edited (revision {old} -> {new}) before this action started; it did not run."
            " Plan again for the current goal")


def stored_list(raw: Any) -> list[str]:
    """A list as the ledger keeps it (JSON text; NULL: none)."""
    if not raw:
        return []
    items = json.loads(raw)
    return [str(item) for item in items] if isinstance(items, list) else []

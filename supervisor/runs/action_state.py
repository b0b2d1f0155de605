"""The action lifecycle: deterministic ids, canonical fingerprints, one table.

``prepared -> (waiting-confirmation -> approved | denied) -> executing -> ok | failed``
or ``needs-reconciliation`` when the outcome cannot be proven. A side effect starts
only after ``executing`` is committed, so ``executing`` without a terminal record
means "may have happened": recovery never replays it.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any

from corral.core.transitions import IllegalTransition


class ActionPhase(enum.StrEnum):
    PREPARED = "prepared"
    WAITING_CONFIRMATION = "waiting-confirmation"
    APPROVED = "approved"
    DENIED = "denied"
    EXECUTING = "executing"
    OK = "ok"
    FAILED = "failed"
    NEEDS_RECONCILIATION = "needs-reconciliation"


TERMINAL = frozenset({ActionPhase.OK, ActionPhase.FAILED, ActionPhase.DENIED})

TRANSITIONS: dict[ActionPhase, frozenset[ActionPhase]] = {
    ActionPhase.PREPARED: frozenset(
        {ActionPhase.WAITING_CONFIRMATION, ActionPhase.EXECUTING, ActionPhase.DENIED, ActionPhase.FAILED}
    ),
    ActionPhase.WAITING_CONFIRMATION: frozenset({ActionPhase.APPROVED, ActionPhase.DENIED, ActionPhase.FAILED}),
    ActionPhase.APPROVED: frozenset({ActionPhase.EXECUTING, ActionPhase.FAILED}),
    ActionPhase.EXECUTING: frozenset({ActionPhase.OK, ActionPhase.FAILED, ActionPhase.NEEDS_RECONCILIATION}),
    ActionPhase.NEEDS_RECONCILIATION: frozenset({ActionPhase.OK, ActionPhase.FAILED}),
    ActionPhase.OK: frozenset(),
    ActionPhase.FAILED: frozenset(),
    ActionPhase.DENIED: frozenset(),
}


def check_action_transition(current: ActionPhase, new: ActionPhase) -> ActionPhase:
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"action cannot go from {current} to {new}")
    return new


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def action_id(run_id: str, loop_index: int, action_index: int) -> str:
    """Derived, never chosen by a model: the same step always has the same id."""
    return "act-" + sha256_hex(f"{run_id}\x00{loop_index}\x00{action_index}")[:24]


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(tool: str, tool_input: dict[str, Any]) -> str:
    return sha256_hex(canonical_json({"tool": tool, "input": tool_input}))

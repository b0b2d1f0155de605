"""The action lifecycle: deterministic ids, canonical fingerprints, one table.

``prepared -> (waiting-confirmation -> approved | denied) -> executing -> ok | failed``
or ``needs-reconciliation`` when the outcome cannot be proven. A side effect starts
only after ``executing`` is committed, so ``executing`` without a terminal record
means "may have happened": recovery never replays it.
"""

from __future__ import annotations

import enum

# One definition, shared with the agent (its receipt names the fingerprint it ran).
from corral.core.fingerprint import canonical_json as canonical_json
from corral.core.fingerprint import fingerprint as fingerprint
from corral.core.fingerprint import sha256_hex as sha256_hex
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


def action_id(run_id: str, loop_index: int, action_index: int) -> str:
    """Derived, never chosen by a model: the same step always has the same id."""
    return "act-" + sha256_hex(f"{run_id}\x00{loop_index}\x00{action_index}")[:24]

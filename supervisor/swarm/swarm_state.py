"""State machines of the swarm layer, each one enum and one table."""

from __future__ import annotations

import enum
import hashlib

from corral.core.transitions import IllegalTransition


class DeliveryStatus(enum.StrEnum):
    DISPATCHED = "dispatched"
    CLAIMED = "claimed-by-parent"
    SUPPRESSED = "suppressed"


class ClaimPhase(enum.StrEnum):
    PREPARED = "prepared"
    COMMITTED = "committed"
    OBSERVED = "observed"


class ChildStatus(enum.StrEnum):
    RUNNING = "running"
    TERMINAL = "terminal"


DELIVERY_TRANSITIONS = {
    DeliveryStatus.DISPATCHED: frozenset({DeliveryStatus.CLAIMED, DeliveryStatus.SUPPRESSED}),
    DeliveryStatus.CLAIMED: frozenset(),
    DeliveryStatus.SUPPRESSED: frozenset(),
}

CLAIM_TRANSITIONS = {
    ClaimPhase.PREPARED: frozenset({ClaimPhase.COMMITTED}),
    ClaimPhase.COMMITTED: frozenset({ClaimPhase.OBSERVED}),
    ClaimPhase.OBSERVED: frozenset(),
}


def check_delivery(current: DeliveryStatus, new: DeliveryStatus) -> None:
    if new not in DELIVERY_TRANSITIONS[current]:
        raise IllegalTransition(f"delivery cannot go from {current} to {new}")


def check_claim(current: ClaimPhase, new: ClaimPhase) -> None:
    if new not in CLAIM_TRANSITIONS[current]:
        raise IllegalTransition(f"claim cannot go from {current} to {new}")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def group_id_for(parent_action_id: str) -> str:
    return "grp-" + sha(parent_action_id)[:20]


def delegation_id_for(group_id: str, index: int) -> str:
    return "dlg-" + sha(f"{group_id}\x00{index}")[:20]


def instance_id_for(delegation_id: str) -> str:
    return "child-" + delegation_id[4:16]


def static_delegation_id(parent_action_id: str) -> str:
    return "dlg-" + sha(f"static\x00{parent_action_id}")[:20]

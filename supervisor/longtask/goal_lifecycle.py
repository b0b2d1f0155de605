"""A goal's lifecycle (seed 004 V1.18): one enum, one transition table.

``active -> pause-requested -> paused -> active``; ``active | pause-requested |
paused -> clearing -> cleared``; ``active -> completed``. Pausing and resuming
keep the revision; only an edit of the goal's text bumps it. A pause is a
request first: the run stops at its next safe boundary (a provider turn in
flight is interrupted, an action under way finishes), and only then is the goal
``paused``. Illegal moves raise.
"""

from __future__ import annotations

import enum

from corral.core.transitions import IllegalTransition


class GoalStatus(enum.StrEnum):
    ACTIVE = "active"
    PAUSE_REQUESTED = "pause-requested"
    PAUSED = "paused"
    CLEARING = "clearing"
    CLEARED = "cleared"
    COMPLETED = "completed"


TERMINAL = frozenset({GoalStatus.CLEARED, GoalStatus.COMPLETED})
#: Statuses in which the goal's run makes no provider call.
HOLDING = frozenset({GoalStatus.PAUSE_REQUESTED, GoalStatus.PAUSED, GoalStatus.CLEARING})
#: Statuses in which the goal's text may be edited.
EDITABLE = frozenset({GoalStatus.ACTIVE, GoalStatus.PAUSE_REQUESTED, GoalStatus.PAUSED})

TRANSITIONS: dict[GoalStatus, frozenset[GoalStatus]] = {
    GoalStatus.ACTIVE: frozenset({GoalStatus.PAUSE_REQUESTED, GoalStatus.CLEARING, GoalStatus.COMPLETED}),
    GoalStatus.PAUSE_REQUESTED: frozenset({GoalStatus.PAUSED, GoalStatus.CLEARING}),
    GoalStatus.PAUSED: frozenset({GoalStatus.ACTIVE, GoalStatus.CLEARING}),
    GoalStatus.CLEARING: frozenset({GoalStatus.CLEARED}),
    GoalStatus.CLEARED: frozenset(),
    GoalStatus.COMPLETED: frozenset(),
}


def check_goal_transition(current: GoalStatus, new: GoalStatus) -> GoalStatus:
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"a goal cannot go from {current} to {new}")
    return new

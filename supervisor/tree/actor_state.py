"""The actor slot state machine: one enum, one transition table."""

from __future__ import annotations

import enum

from corral.core.transitions import IllegalTransition


class ActorState(enum.StrEnum):
    STARTING = "starting"  # launched, no hello yet
    RUNNING = "running"  # hello accepted
    STOPPING = "stopping"  # asked to shut down by its supervisor
    RESTARTING = "restarting"  # exited; a restart is scheduled (backoff)
    STOPPED = "stopped"  # exited and stays down (shutdown, temporary, transient exit 0)
    ESCALATED = "escalated"  # its group exceeded restart intensity and gave up


TRANSITIONS: dict[ActorState, frozenset[ActorState]] = {
    ActorState.STARTING: frozenset(
        {
            ActorState.RUNNING,
            ActorState.STOPPING,
            ActorState.RESTARTING,
            ActorState.STOPPED,
            ActorState.ESCALATED,
        }
    ),
    ActorState.RUNNING: frozenset(
        {ActorState.STOPPING, ActorState.RESTARTING, ActorState.STOPPED, ActorState.ESCALATED}
    ),
    ActorState.STOPPING: frozenset({ActorState.STOPPED, ActorState.ESCALATED}),
    ActorState.RESTARTING: frozenset({ActorState.STARTING, ActorState.STOPPED, ActorState.ESCALATED}),
    # A sibling stopped for a one_for_all/rest_for_one restart comes back.
    ActorState.STOPPED: frozenset({ActorState.STARTING, ActorState.RESTARTING}),
    ActorState.ESCALATED: frozenset({ActorState.STARTING}),
}


def check_transition(current: ActorState, new: ActorState) -> ActorState:
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"actor cannot go from {current} to {new}")
    return new

"""The one error every state machine in corral raises for a move its table forbids.

The actor slots, runs, actions, swarm deliveries and claims (supervisor) and the
process sessions (the session actor's engine and the supervisor's session records)
each keep one enum and one transition table; all of them refuse an illegal move
with :class:`IllegalTransition`. It lives here, with nothing imported, so that both
processes can raise and catch the same class without importing each other's layers.
"""

from __future__ import annotations


class IllegalTransition(RuntimeError):
    """A state machine was asked for a move its transition table does not allow."""

    #: Stable and machine-readable, like the session errors' codes (a session actor
    #: answers a refused request with it).
    code = "illegal-transition"

"""The provider turns of one agent that a steer or a goal pause may interrupt.

The supervisor tells the agent ``{"op": "interrupt", "slot": ...}`` (seed 004
V1.13, V1.18): the planning or final-reply request of that slot is cancelled
where it waits (a trio cancel scope around ``provider.complete``), never a tool,
a side effect or a receipt. An interrupt that arrives before its turn's scope is
open (the tell can overtake the step that began the request) is kept and
cancels the scope as it opens. Cancelling only stops this client from waiting;
the supervisor records the turn ``interrupted`` and never sends it again.
"""

from __future__ import annotations

import trio

#: Interrupts kept for turns not open yet; the oldest go first (a slot is unique,
#: so one that never opens here only costs its entry).
MAX_EARLY = 64


class ProviderInterrupts:
    def __init__(self) -> None:
        self.open_scopes: dict[str, trio.CancelScope] = {}
        self.early: list[str] = []

    def ask(self, slot: str) -> None:
        """The supervisor's interrupt of ``slot``: cancel it now, or as it opens."""
        scope = self.open_scopes.get(slot)
        if scope is not None:
            scope.cancel()
            return
        if slot not in self.early:
            self.early.append(slot)
            del self.early[:-MAX_EARLY]

    def open(self, slot: str) -> trio.CancelScope:
        """The scope the turn of ``slot`` waits in (close it with :meth:`close`)."""
        scope = trio.CancelScope()
        self.open_scopes[slot] = scope
        if slot in self.early:
            self.early.remove(slot)
            scope.cancel()
        return scope

    def close(self, slot: str) -> None:
        self.open_scopes.pop(slot, None)

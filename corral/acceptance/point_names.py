"""The suites' and points' names alone, for the CLI's ``--help``: the CLI builds every
subcommand's parser at start, and the points themselves import the whole suite
(flows, oracles, the model resolver), which would cost every ``corral`` command
~0.2 s of CPU. points.py refuses to load if its points and these names differ."""

from __future__ import annotations

SUITES = ("full", "reduced")
POINT_NAMES = (
    "startup-context", "tool-plan", "read-patch-confirm", "confirm-after-exit", "kill-recovery", "verify-preview",
    "delegates-and-group", "retry-planning", "retry-final-reply", "chat-autonomous", "chat-static-isolated",
    "ledger-consistency", "secret-leaks",
)


def names() -> tuple[str, ...]:
    return (*SUITES, *POINT_NAMES)

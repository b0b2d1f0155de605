"""When ``corral demo`` on the local model gives up.

A fixed 600 s was wrong both ways: a slow laptop's honest run timed out, and a
hung model was waited on for ten minutes. The demo instead gives up when nothing
has moved (no event, no newly generated token) for as long as the model, at the
speed measured in this run, would need to read and answer one whole context
window, with slack, and never sooner than a floor. Until a speed is measured (the
model loads, reads its first prompt) the allowance is the first-turn one.

``DemoBudget`` is the pure decision (the caller passes the times, monotonic
seconds, and what it saw); ``Pace`` feeds it from the supervisor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from corral.client_types import Event

#: Until the model's speed is known: loading it from disk and its first turn.
FIRST_TURN_S = 600.0
#: Never less than this between signs of progress.
FLOOR_S = 60.0
#: Tokens one turn may take at most: the demo's model context (demo_local.toml ``n_ctx``).
TURN_TOKENS = 2048
#: Slack over the measured pace (a loaded machine, a longer prompt).
SLACK = 3.0


@dataclass
class DemoBudget:
    #: When progress was last seen.
    last_progress: float
    #: The fastest generation measured so far (tokens/s), or None.
    tokens_per_s: float | None = None
    #: Tokens generated, as last reported (a rise is progress).
    tokens_seen: int = 0

    def observe(self, now: float, *, events: int = 0, tokens: int = 0, tokens_per_s: float | None = None) -> None:
        """What one poll saw: ``events`` new events, ``tokens`` generated so far by
        the generations under way, their measured pace."""
        if events or tokens > self.tokens_seen:
            self.last_progress = now
        self.tokens_seen = tokens
        if tokens_per_s is not None and tokens_per_s > 0:
            # The best pace seen: a slow moment (a long prompt) must not stretch the
            # budget of the whole demo, a fast one shows what the machine can do.
            self.tokens_per_s = max(self.tokens_per_s or 0.0, tokens_per_s)

    def allowance(self) -> float:
        """Seconds without progress before giving up."""
        if self.tokens_per_s is None:
            return FIRST_TURN_S
        return max(FLOOR_S, TURN_TOKENS / self.tokens_per_s * SLACK)

    def expired(self, now: float) -> bool:
        return now - self.last_progress > self.allowance()


class Pace:
    """The demo's side of the budget: what each poll saw (new events, and the
    supervisor's in-memory progress reports of the runs under way), fed to it."""

    def __init__(self, api: Any, now: float) -> None:
        self.api = api
        self.budget = DemoBudget(last_progress=now)
        #: Runs created and not ended (their progress is asked for), oldest first.
        self.runs: dict[str, None] = {}

    def observe(self, events: list[Event]) -> None:
        from corral.cli import progress
        from corral.mailbox.control import ControlError

        for event in events:
            if event.kind == "run-created":
                self.runs[event.subject] = None
            elif event.kind in ("run-completed", "run-failed", "run-cancelled"):
                self.runs.pop(event.subject, None)
        asked = list(self.runs)[-progress.MAX_PROGRESS_RUNS:]
        try:
            reports = progress.progress_events(self.api.call("progress", run_ids=asked)) if asked else []
        except ControlError:
            reports = []  # a supervisor without progress reports: events alone show progress
        generations = [progress.reduce(progress.RunProgress(e.subject), e).generation for e in reports]
        live = [g for g in generations if g is not None]
        rates = [g.tokens_per_s for g in live if g.tokens_per_s]
        self.budget.observe(time.monotonic(), events=len(events), tokens=sum(g.tokens for g in live),
                            tokens_per_s=max(rates) if rates else None)

    def why(self) -> str:
        pace = self.budget.tokens_per_s
        measured = f"the model's measured pace, {pace:.1f} tokens/s" if pace else "no model pace measured yet"
        return f"nothing moved for {self.budget.allowance():.0f}s ({measured}; give --timeout to wait longer)"

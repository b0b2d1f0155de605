"""Restart decisions, as pure functions: no processes, no clocks of their own.

Mirrors OTP's supervisor: restart types decide *whether* an exited child comes
back, the strategy decides *which* siblings go with it, and the intensity (max
restarts within a period) decides when to give up and escalate.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from dataclasses import dataclass


class RestartType(enum.StrEnum):
    PERMANENT = "permanent"  # always restarted
    TRANSIENT = "transient"  # restarted only after an abnormal exit
    TEMPORARY = "temporary"  # never restarted


class Strategy(enum.StrEnum):
    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


def should_restart(restart: RestartType, exit_code: int) -> bool:
    if restart is RestartType.PERMANENT:
        return True
    if restart is RestartType.TRANSIENT:
        return exit_code != 0
    return False


@dataclass(frozen=True)
class RestartPlan:
    #: Siblings to stop first (by their shutdown specs), in reverse start order.
    stop: tuple[str, ...]
    #: Children to start again, in start order (the failed one included).
    start: tuple[str, ...]


def plan_restart(strategy: Strategy, order: list[str], failed: str) -> RestartPlan:
    """Which children a failure of ``failed`` takes down and brings back."""
    if failed not in order:
        raise ValueError(f"{failed!r} is not a child of this group")
    index = order.index(failed)
    if strategy is Strategy.ONE_FOR_ONE:
        return RestartPlan((), (failed,))
    affected = order if strategy is Strategy.ONE_FOR_ALL else order[index:]
    others = [child for child in affected if child != failed]
    return RestartPlan(tuple(reversed(others)), tuple(affected))


class Intensity:
    """At most ``max_restarts`` within ``period_s``; one more means escalate."""

    def __init__(self, max_restarts: int, period_s: float) -> None:
        if max_restarts < 0 or period_s <= 0:
            raise ValueError("intensity needs max_restarts >= 0 and period_s > 0")
        self.max_restarts = max_restarts
        self.period_s = period_s
        self._times: deque[float] = deque()

    def record(self, now: float) -> bool:
        """Record a restart at ``now``; True when it exceeds the intensity."""
        self._times.append(now)
        while self._times and self._times[0] <= now - self.period_s:
            self._times.popleft()
        return len(self._times) > self.max_restarts

    @property
    def recent(self) -> int:
        return len(self._times)


def backoff_delay(attempt: int, base_s: float, cap_s: float, jitter: float, rng: random.Random) -> float:
    """Delay before restart number ``attempt`` (1-based) within the current period.

    The first restart is immediate, as in OTP: a single crash should cost nothing.
    Repeated ones back off exponentially, with jitter so that a group of children
    that failed together does not come back in lockstep.
    """
    if attempt <= 1:
        return 0.0
    raw = min(cap_s, base_s * float(2 ** (attempt - 2)))
    return max(0.0, raw * (1.0 + jitter * (2 * rng.random() - 1)))

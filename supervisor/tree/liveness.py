"""Who is stalled, as a pure function of the watchdog's clock readings: no
processes, no links, no clock of its own (supervisor/tree/stall_watchdog.py reads
trio's clock, drains the links and kills).

A silence is evidence against an actor only if the supervisor was there to hear
it. The supervisor can be paused itself: SIGSTOP or Ctrl-Z, a debugger, a cgroup
freeze, a swap stall, a long blocking call on its trio thread. Its actors go on
meanwhile; their heartbeats and their outcomes wait unread in the links, and on
waking every one of them looks silent for the whole pause.

Such a pause shows as a gap in the watchdog's own loop, which wakes once a tick:
a wake-up more than :data:`PAUSE_TICKS` ticks after the last one means that the
supervisor was not running, whatever the cause. Then nobody is judged on that
tick: the watchdog drains the links and renews everyone's last heard to the end
of the pause, and silence counts again from there.

Why the loop's own gaps, not CLOCK_BOOTTIME against CLOCK_MONOTONIC: those two
differ only by the time the whole machine was suspended, which stops the actors
as well (and CLOCK_MONOTONIC, trio's clock, does not count it: no false stall).
A SIGSTOP, a freeze, a debugger or a swap stall stops the supervisor alone while
both clocks run on; only the gap between two ticks of its own loop shows them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

#: A wake-up this many ticks after the previous one is a pause of the supervisor:
#: one tick late is load (a loaded machine wakes the loop late), two is not running.
PAUSE_TICKS = 2.0


class ForkServerKey(enum.Enum):
    """The fork server's key among the actors' ids in a last-heard map (an enum
    member: no actor id can be equal to it)."""

    FORKSERVER = "forkserver"


FORKSERVER = ForkServerKey.FORKSERVER

K = TypeVar("K", bound=Hashable)


def tick_interval(timeout_s: float) -> float:
    """The watchdog's cadence: four ticks per stall timeout, at most one a second."""
    return min(1.0, timeout_s / 4)


def pause_limit(timeout_s: float) -> float:
    """The longest gap between two ticks that is not a pause of the supervisor."""
    return PAUSE_TICKS * tick_interval(timeout_s)


@dataclass(frozen=True)
class Judgement(Generic[K]):
    """One tick's verdict."""

    #: Time since the previous tick.
    gap_s: float
    #: The gap is a pause of the supervisor: nobody is judged; drain, then renew.
    paused: bool
    #: Silence (s) of each one silent past half the timeout: reported as stalled.
    quiet: Mapping[K, float] = field(default_factory=dict)
    #: Those silent past the whole timeout: killed.
    stalled: frozenset[K] = frozenset()


def judge(
    last_tick: float,
    now: float,
    last_heard: Mapping[K, float],
    *,
    timeout_s: float,
    renewed_at: float = -math.inf,
) -> Judgement[K]:
    """Who is stalled at ``now``, given the previous tick at ``last_tick``, when each
    one was last heard from, and when the last pause ended (``renewed_at``: nobody
    has been silent for longer than since then)."""
    gap = now - last_tick
    if gap > pause_limit(timeout_s):
        return Judgement(gap, True)
    silences = {key: now - max(heard, renewed_at) for key, heard in last_heard.items()}
    quiet = {key: silent for key, silent in silences.items() if silent > timeout_s / 2}
    return Judgement(gap, False, quiet, frozenset(key for key, silent in quiet.items() if silent > timeout_s))

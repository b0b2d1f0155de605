"""The stall watchdog: liveness beyond the pidfd. A process that is alive but silent
(SIGSTOPped, wedged in a loop that never yields) is reported, then killed and
restarted per its policy, counting against the restart intensity; the fork server
likewise, replaced.

Who is stalled is decided in ``liveness`` (pure); this module reads the clock,
asks the fork server for a sign of life, drains the links after a pause of the
supervisor itself, and kills.
"""

from __future__ import annotations

import logging
import math
import signal
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import trio

from corral.sandbox.launcher import Launcher
from corral.supervisor.tree.actor_state import ActorState
from corral.supervisor.tree.liveness import FORKSERVER, ForkServerKey, Judgement, judge, tick_interval

if TYPE_CHECKING:
    from corral.supervisor.tree.supervision_tree import ActorSlot

log = logging.getLogger("corral.tree")

#: An event that guards nothing: (kind, subject, data).
EventSink = Callable[..., None]
#: An actor's event, with its row brought up to date: (slot, event=kind, data).
RecordSink = Callable[..., None]

HeardKey = str | ForkServerKey


class StallWatchdog:
    def __init__(
        self,
        slots: Mapping[str, ActorSlot],
        launcher: Launcher,
        timeout_s: float,
        *,
        record: RecordSink,
        event: EventSink,
    ) -> None:
        self.slots = slots
        self.launcher = launcher
        self.timeout_s = timeout_s
        self._record = record
        self._event = event

    async def run(self) -> None:
        timeout = self.timeout_s
        tick = tick_interval(timeout)
        last_tick = trio.current_time()
        renewed_at = -math.inf
        while True:
            await trio.sleep(tick)
            now = trio.current_time()
            self.launcher.probe()
            verdict = judge(last_tick, now, self._last_heard(now), timeout_s=timeout, renewed_at=renewed_at)
            if verdict.paused:
                # The silence was the supervisor's own: what its actors sent meanwhile
                # is read first, and everyone's silence counts from the end of the pause.
                drained = await self._drain_links(tick)
                renewed_at = last_tick = trio.current_time()
                log.warning(
                    "the supervisor itself was not running for %.1f s (stopped, frozen or starved);"
                    " nobody is judged stalled for it (%d messages its actors sent meanwhile read)",
                    verdict.gap_s,
                    drained,
                )
                self._event("supervisor-paused", "supervisor", gap_s=round(verdict.gap_s, 1), drained=drained)
                continue
            last_tick = now
            self._judge_forkserver(verdict)
            self._judge_actors(verdict, now)

    def _watched(self) -> list[ActorSlot]:
        return [
            slot
            for slot in self.slots.values()
            if slot.state is ActorState.RUNNING and slot.process is not None and slot.last_seen
        ]

    def _last_heard(self, now: float) -> dict[HeardKey, float]:
        heard: dict[HeardKey, float] = {slot.id: slot.last_seen for slot in self._watched()}
        silent = self.launcher.silence()
        if silent is not None:  # None: one is starting (its imports may take a while)
            heard[FORKSERVER] = now - silent
        return heard

    async def _drain_links(self, budget_s: float) -> int:
        """Let every link's reader take in what its actor sent while the supervisor
        was away (heartbeats, outcomes), until two passes of the scheduler in a row
        read nothing new and every inbox is empty, or ``budget_s`` passed. Returns how
        many frames were read meanwhile."""

        def frames() -> tuple[int, int]:
            channels = [slot.channel for slot in self.slots.values() if slot.channel is not None]
            read = sum(channel.frames_in for channel in channels)
            return read, sum(channel.inbox.statistics().current_buffer_used for channel in channels)

        start, _queued = frames()
        previous, quiet = start, 0
        deadline = trio.current_time() + budget_s
        while quiet < 2 and trio.current_time() < deadline:
            await trio.sleep(0)  # one pass: readers whose links are readable run
            read, queued = frames()
            quiet = quiet + 1 if read == previous and not queued else 0
            previous = read
        return max(0, previous - start)

    def _judge_actors(self, verdict: Judgement[HeardKey], now: float) -> None:
        timeout = self.timeout_s
        for slot in self._watched():
            silent = verdict.quiet.get(slot.id)
            if silent is None:
                continue
            if not slot.stalled_since:
                slot.stalled_since = slot.last_seen
                self._record(slot, event="actor-stalled", silent_s=round(silent, 1))
            if slot.id in verdict.stalled and slot.process is not None:
                log.error("%s: silent for %.1f s (stall timeout %.1f s); killing it", slot.id, silent, timeout)
                self._record(slot, event="actor-stall-killed", silent_s=round(silent, 1))
                slot.last_seen = now  # one kill per stall; the exit handling takes over
                slot.process.kill_group(signal.SIGKILL)

    def _judge_forkserver(self, verdict: Judgement[HeardKey]) -> None:
        """The fork server, like an actor: asked for a sign of life at every tick;
        silent past half the stall timeout, reported (``corral status`` says
        degraded: no actor can start); past the timeout, killed and replaced (its
        actors die with it and start again from the new one)."""
        launcher = self.launcher
        timeout = self.timeout_s
        silent = launcher.silence()
        if silent is None:
            return  # one is starting: degraded stays as it was until it answers
        pid = launcher.forkserver_pid
        judged = verdict.quiet.get(FORKSERVER)
        if judged is not None and not launcher.degraded:
            launcher.degraded = (
                f"the fork server (pid {pid}) has not answered for {judged:.1f} s: no actor can start;"
                f" it is replaced after {timeout:g} s of silence"
            )
            log.error("%s", launcher.degraded)
            self._event("forkserver-stalled", "forkserver", pid=pid, silent_s=round(judged, 1))
        if judged is not None and FORKSERVER in verdict.stalled:
            self._event("forkserver-stall-killed", "forkserver", pid=pid, silent_s=round(judged, 1))
            launcher.replace(f"was silent for {judged:.1f} s (stall timeout {timeout:g} s)")
        elif silent <= timeout / 2 and launcher.degraded:
            # Its own answer clears it, never a renewal after a pause of the supervisor.
            log.info("the fork server (pid %s) answers again", pid)
            launcher.degraded = ""
            self._event("forkserver-recovered", "forkserver", pid=pid, replacements=launcher.replacements)

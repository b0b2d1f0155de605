"""Load probes for bench/: a sink that counts one-way tells, an event emitter and
the per-operation counts (statements, Python calls).

They exist only when a spec asks for them (``[supervisor] probes = true``): a
production supervisor carries no method whose only use is to be measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from corral.mailbox.protocol import Ack, BenchSink, BenchSinkCount, BenchSinkReset, SinkCount
from corral.supervisor.errors import BadRequest, Conflict
from corral.supervisor.params import param_int
from corral.supervisor.probe_counts import ProbeCounts

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.ledger.port import Ledger
    from corral.supervisor.tree.supervision_tree import ActorSlot


class LoadProbes:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        #: Tells counted, never stored: the mailbox's cost, not the ledger's.
        self.counted = 0
        self.counts = ProbeCounts(ledger.db)

    async def sink(self, slot: ActorSlot, request: BenchSink) -> Ack:
        self.counted += 1
        return Ack()

    async def sink_count(self, slot: ActorSlot, request: BenchSinkCount) -> SinkCount:
        return SinkCount(self.counted)

    async def sink_reset(self, slot: ActorSlot, request: BenchSinkReset) -> Ack:
        self.counted = 0
        return Ack()

    async def emit_events(self, params: dict[str, Any]) -> dict[str, Any]:
        """Load for the dashboard's live-stream bench: ``n`` events of kind
        ``bench-load`` at ``rate`` per second, committed every 5 ms (never fsync'd:
        they guard nothing). Answers when the last one is committed."""
        n = param_int(params, "n", 1000, low=1, high=1_000_000)
        rate = param_int(params, "rate", 5000, low=1, high=1_000_000)
        start = trio.current_time()
        done, first, last = 0, 0, 0
        while done < n:
            due = min(n, int((trio.current_time() - start) * rate) + 1)
            if due > done:
                with self.ledger.tx(fsync=False):
                    for index in range(done, due):
                        last = self.ledger.event("bench-load", "bench", i=index)
                        first = first or last
                done = due
            await trio.sleep(0.005)
        return {"emitted": n, "first": first, "last": last, "elapsed_s": round(trio.current_time() - start, 3)}

    async def count(self, params: dict[str, Any]) -> dict[str, Any]:
        """``bench.count``: ``{"on": true}`` starts counting SQL statements and the
        main thread's Python calls; ``{"on": false}`` stops and returns the counts
        (supervisor/probe_counts.py)."""
        on = params.get("on")
        if not isinstance(on, bool):
            raise BadRequest("bench.count takes on: true or false")
        if on:
            self.counts.start()
            return {"counting": True}
        if not self.counts.on:
            raise Conflict("bench.count: not counting (start with on: true)")
        return self.counts.stop()


def install(sup: Supervisor) -> LoadProbes:
    probes = LoadProbes(sup.ledger)
    sup.methods.probes = probes
    sup.control_methods["bench.emit_events"] = probes.emit_events
    sup.control_methods["bench.count"] = probes.count
    return probes

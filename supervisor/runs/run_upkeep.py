"""The run layer at boot and in the background: recovery, the provider retry
timer, what an agent's crash is charged to, and the run layer's parts of
``status`` and of ``busy``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import trio

from corral.actors import inflight
from corral.actors.providers.registry import is_idempotent
from corral.supervisor.errors import SupervisorError
from corral.supervisor.runs import poison, provider_store, recovery, run_store, sealed_input
from corral.supervisor.runs.run_core import RunCore
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.tree.supervision_tree import ActorSlot

log = logging.getLogger("corral.runs")


class RunUpkeep(RunCore):
    def busy(self) -> list[str]:
        rows = self.ledger.all(
            "SELECT status, COUNT(*) AS n FROM runs WHERE status NOT IN"
            " ('completed', 'failed', 'cancelled') GROUP BY status"
        )
        return [f"{row['n']} run(s) {row['status']}" for row in rows]

    def on_actor_exit(self, slot: ActorSlot, code: int, crashed: bool) -> None:
        """An agent died: a crash is charged to the actions it had in flight, and
        those that keep crashing it are stopped as poison (supervisor/runs/poison.py)."""
        in_flight = inflight.take(self.home, slot.id)
        if not crashed or not in_flight:
            return
        try:
            stopped = poison.charge(
                self.ledger,
                in_flight,
                self.features,
                agent_id=str(slot.spec.params.get("agent_id", slot.id)),
                actor_id=slot.id,
                incarnation=slot.incarnation,
                exit_code=code,
                is_read=self.is_read,
            )
        except SupervisorError as exc:  # a full disk: this crash goes uncounted, the next one counts
            log.warning("%s: its crash (exit %s) was not charged to %s: %s", slot.id, code, in_flight, exc)
            return
        except Exception:  # bookkeeping: it must never stop the tree from restarting the agent
            log.exception("%s: its crash (exit %s) was not charged to %s", slot.id, code, in_flight)
            return
        if stopped:
            log.error("%s: %s crashed it too often; not run again", slot.id, ", ".join(stopped))

    async def recover(self) -> None:
        inflight.reset(self.home)  # what earlier boots' actors had in flight is no crash of theirs
        self.recovery_report = recovery.recover(self.ledger, self.features, is_idempotent, self.is_read)
        sealed_input.sweep(sealed_input.spool_dir(self.home), self.ledger)
        report = self.recovery_report
        self.ledger.event(
            "recovery-done",
            self.boot_id,
            finalizations=report.finalizations,
            reconciliations=len(report.reconciliations),
            receipts=report.receipts_repaired,
            poisoned=len(report.poisoned),
            provider_requests=report.provider_requests,
            runs=report.runs_resumed,
        )

    async def retry_timer(self) -> None:
        """Wakes runs whose provider retry is due, never before the stored retry_at."""
        while True:
            due = provider_store.due_retries(self.ledger)
            now = trio.current_time()
            wall = time.time()
            earliest = min((at for _, at in due), default=math.inf)
            if earliest <= wall:
                for run_id, at in due:
                    if at <= wall:
                        run_store.set_run_status(
                            self.ledger, run_id, RunStatus.RUNNING, self.features, "provider retry due"
                        )
                        await self.wake_run(run_id)
                continue
            changed = self.retry_changed
            with trio.move_on_at(now + (earliest - wall) if earliest != math.inf else math.inf):
                await changed.wait()

    def status_section(self) -> dict[str, Any]:
        rows = self.ledger.all("SELECT status, COUNT(*) AS n FROM runs GROUP BY status")
        report = self.recovery_report
        return {
            "by_status": {row["status"]: row["n"] for row in rows},
            "recovery": None
            if report is None
            else {
                "finalizations": report.finalizations,
                "reconciliations": report.reconciliations,
                "receipts_repaired": report.receipts_repaired,
            },
            # Each agent's provider and resolved web search switch (seed 004 V1.20):
            # booleans only, never a key or a provider's other settings.
            "agents": {
                agent.id: {"provider": agent.provider, "web_search": agent.provider_config.get("web_search") is True}
                for agent in self.spec.agents
            },
        }

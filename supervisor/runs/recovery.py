"""Recovery at supervisor start, in order: finalizations, pending actions, runs.

Nothing whose side effect may have started is replayed: an ``executing``
side-effecting action becomes ``needs-reconciliation`` and waits for a person.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import finalization, poison
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.action_store import mark_needs_reconciliation, move_action, write_receipt
from corral.supervisor.runs.provider_store import interrupt_provider_request
from corral.supervisor.runs.run_feature import RunFeatures


@dataclass
class RecoveryReport:
    finalizations: int = 0
    reconciliations: list[str] = field(default_factory=list)
    rerun_read_only: int = 0
    #: Actions not run again because they crashed their agent too often.
    poisoned: list[str] = field(default_factory=list)
    receipts_repaired: int = 0
    provider_requests: int = 0
    runs_resumed: int = 0
    notes: list[str] = field(default_factory=list)


def recover(
    ledger: Ledger,
    features: RunFeatures,
    idempotent_provider: Callable[[str], bool],
    is_read: Callable[[str], bool] = lambda _: False,
) -> RecoveryReport:
    """``is_read``: whether a tool is a read (a poison read fails; other poison
    actions wait for a person)."""
    report = RecoveryReport()
    for row in ledger.all("SELECT run_id FROM finalizations WHERE phase != 'completed'"):
        finalization.resume_finalization(ledger, row["run_id"], features)
        report.finalizations += 1

    # Before the re-runs below: an action that crashed its agent too often is not
    # re-run at boot either (else every `corral up` would start the crash loop again).
    report.poisoned = poison.stop_at_boot(ledger, is_read, features)
    for row in ledger.all("SELECT action_id, rerunnable, tool FROM actions WHERE phase = 'executing'"):
        if row["rerunnable"]:
            report.rerun_read_only += 1  # next_step runs it again; nothing outside changed
            continue
        mark_needs_reconciliation(
            ledger,
            row["action_id"],
            "the supervisor stopped while it was executing; the side effect may or may not have happened",
            features,
        )
        report.reconciliations.append(row["action_id"])
    for row in ledger.all(
        "SELECT a.action_id FROM actions a LEFT JOIN receipts r ON r.action_id = a.action_id"
        " WHERE a.phase IN ('ok', 'failed', 'denied') AND r.action_id IS NULL"
    ):
        write_receipt(ledger, row["action_id"], features, repair=True)
        report.receipts_repaired += 1
    for row in ledger.all(
        "SELECT a.action_id FROM actions a JOIN runs r ON r.run_id = a.run_id"
        " WHERE a.phase IN ('prepared', 'approved', 'waiting-confirmation')"
        " AND r.status IN ('completed', 'failed', 'cancelled')"
    ):
        with ledger.tx():  # the terminal move and its receipt: one commit, one event
            move_action(ledger, row["action_id"], ActionPhase.FAILED, reason="its run ended", error="run ended")
            write_receipt(ledger, row["action_id"], features)

    for row in ledger.all(
        "SELECT slot, run_id, provider FROM provider_requests p JOIN runs USING (run_id) WHERE p.status = 'started'"
    ):
        report.provider_requests += 1
        idempotent = idempotent_provider(row["provider"])
        if not interrupt_provider_request(ledger, row["slot"], row["run_id"], idempotent, features):
            report.reconciliations.append(row["slot"])
    for step in features.recovery_steps:  # joins, claims, sessions: after the core
        step(ledger, report)
    report.runs_resumed = len(ledger.all("SELECT run_id FROM runs WHERE status IN ('running', 'pending')"))
    return report

"""After a crash: a ``project.verify`` whose verification was recorded has a known
outcome.

Recovery parks every external action that was executing (its side effect may or
may not have happened) for a person. For ``project.verify`` the ledger can say
more: the verification is recorded in the same ledger, once per action, before the
tool returns. If that record exists, the commands ran and their result is known.
The action then ends from the record, with no person and nothing run again. Without
a record, a verify command may have run and written files, so it stays with a
person.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corral.actors.tools.fs import SOURCES_CHANGED
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.project import verification_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.action_store import move_action, write_receipt
from corral.supervisor.runs.resolutions import reopen_run
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_store import bounded_json

if TYPE_CHECKING:
    from corral.supervisor.runs.recovery import RecoveryReport

VERIFY_TOOL = "project.verify"


def recover(ledger: Ledger, report: RecoveryReport, features: RunFeatures) -> None:
    """Ends each parked ``project.verify`` that has its verification recorded."""
    for row in ledger.all(
        "SELECT action_id, run_id FROM actions WHERE phase = 'needs-reconciliation' AND tool = ?", VERIFY_TOOL
    ):
        recorded = verification_store.get(ledger, row["action_id"])
        if recorded is None:
            continue
        passed = recorded["status"] == verification_store.VerificationStatus.PASSED
        output: dict[str, object] = {"verification": recorded}
        if recorded["status"] == verification_store.VerificationStatus.STALE:
            # Stale may mean its commands changed the sources: counting a write that
            # did not happen only asks for one more verification; missing one would not.
            output[SOURCES_CHANGED] = True
        summary = f"verification {recorded['status']} at revision {recorded['revision']} (recorded before a crash)"
        with ledger.tx():
            move_action(
                ledger,
                row["action_id"],
                ActionPhase.OK if passed else ActionPhase.FAILED,
                reason="its verification was recorded before the crash: the outcome is known",
                result=bounded_json({"output": output, "summary": summary}),
                error=None if passed else summary,
            )
            write_receipt(ledger, row["action_id"], features, note="recovered from its verification record")
            reopen_run(ledger, row["run_id"], features)
        if row["action_id"] in report.reconciliations:
            report.reconciliations.remove(row["action_id"])
        report.notes.append(f"{row['action_id']}: project.verify ended from its recorded verification")

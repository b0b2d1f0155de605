"""What people decide: approve or deny a waiting action, reconcile an unknown one."""

from __future__ import annotations

import hmac

from corral.supervisor.errors import BadRequest, Conflict
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.action_store import get_action, move_action, write_receipt
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.runs.run_store import get_run, set_run_status


def continue_action(
    ledger: Ledger, action_id: str, decision: str, expected_fingerprint: str | None, features: RunFeatures
) -> str:
    """Approve or deny, bound to the exact action id and fingerprint. Returns the run id."""
    if decision not in ("approve", "deny"):
        raise BadRequest("decision must be 'approve' or 'deny'")
    row = get_action(ledger, action_id)
    # The phase first: an action no longer waiting says why, whatever fingerprint came.
    if row["phase"] != ActionPhase.WAITING_CONFIRMATION:
        # Say why (superseded by a steer, denied, run cancelled): nothing was decided.
        why = f" ({row['reason']})" if row["reason"] else ""
        raise Conflict(f"action {action_id} is {row['phase']}{why}, not waiting for confirmation; nothing was"
                       f" {'approved' if decision == 'approve' else 'denied'}")
    if expected_fingerprint is not None and not hmac.compare_digest(row["fingerprint"], expected_fingerprint):
        raise Conflict(f"action {action_id} has fingerprint {row['fingerprint'][:12]}…, not the one approved")
    with ledger.tx():
        if decision == "approve":
            move_action(ledger, action_id, ActionPhase.APPROVED, reason="approved")
        else:
            move_action(ledger, action_id, ActionPhase.DENIED, reason="denied by a person", error="denied by a person")
            write_receipt(ledger, action_id, features)  # in the denial's commit: its event is the receipt's
        reopen_run(ledger, row["run_id"], features)
    return str(row["run_id"])


def reconcile(ledger: Ledger, action_id: str, outcome: str, note: str, features: RunFeatures) -> str:
    if outcome not in ("ok", "failed"):
        raise BadRequest("--as must be 'ok' or 'failed'")
    if not note.strip():
        raise BadRequest("a reconciliation needs a --note saying what was checked")
    row = get_action(ledger, action_id)
    if row["phase"] != ActionPhase.NEEDS_RECONCILIATION:
        raise Conflict(f"action {action_id} is {row['phase']}; only needs-reconciliation actions are reconciled")
    with ledger.tx():
        move_action(
            ledger,
            action_id,
            ActionPhase(outcome),
            reason=f"reconciled by a person as {outcome}",
            error=None if outcome == "ok" else f"reconciled as failed: {note[:200]}",
        )
        write_receipt(ledger, action_id, features, note=note)
        reopen_run(ledger, row["run_id"], features)
    return str(row["run_id"])


def reopen_run(ledger: Ledger, run_id: str, features: RunFeatures) -> None:
    """A parked run goes back to running once nothing it waits for is open."""
    run = get_run(ledger, run_id)
    status = RunStatus(run["status"])
    if status not in (RunStatus.WAITING_CONFIRMATION, RunStatus.NEEDS_RECONCILIATION):
        return
    still_open = ledger.one(
        "SELECT COUNT(*) FROM actions WHERE run_id = ? AND phase IN ('waiting-confirmation', 'needs-reconciliation')",
        run_id,
    )
    provider_open = ledger.one(
        "SELECT COUNT(*) FROM provider_requests WHERE run_id = ? AND status = 'needs-reconciliation'", run_id
    )
    if (still_open[0] if still_open else 0) == 0 and (provider_open[0] if provider_open else 0) == 0:
        set_run_status(ledger, run_id, RunStatus.RUNNING, features, "resumed")


def reconcile_provider_request(ledger: Ledger, slot: str, note: str, features: RunFeatures) -> str:
    """A provider request with an unknown outcome: the person says it may be sent again."""
    row = ledger.one("SELECT * FROM provider_requests WHERE slot = ?", slot)
    if row is None:
        raise BadRequest(f"no provider request {slot!r}")
    if row["status"] != "needs-reconciliation":
        raise Conflict(f"provider request {slot} is {row['status']}")
    with ledger.tx() as db:
        db.execute(
            "UPDATE provider_requests SET status = 'failed', error_kind = 'reconciled', error = ?,"
            " retry_at = NULL WHERE slot = ?",
            (note[:200], slot),
        )
        ledger.event("provider-request-reconciled", row["run_id"], slot=slot)
        reopen_run(ledger, row["run_id"], features)
    return str(row["run_id"])

"""A parent run's swarm work as a whole: how much of it is still open, what keeps
the parent from finalizing (open work, unclaimed deliveries, unobserved claims),
and the tombstone when the parent ends (its live children and delegations
cancelled, its undelivered results suppressed).
"""

from __future__ import annotations

import time

from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.runs.run_store import get_run, set_run_status


def open_work(ledger: Ledger, run_id: str) -> int:
    groups = ledger.one("SELECT COUNT(*) FROM isolated_groups WHERE parent_run_id = ? AND status = 'open'", run_id)
    delegations = ledger.one(
        "SELECT COUNT(*) FROM delegations WHERE parent_run_id = ? AND status != 'terminal'", run_id
    )
    return int((groups[0] if groups else 0) + (delegations[0] if delegations else 0))


def past_claims(ledger: Ledger, run_id: str) -> bool:
    """Whether a parent run is past its claims: it claimed a delivery, and nothing of its
    swarm is open (no child group or delegation running, no delivery unclaimed, no claim
    unobserved). What it does next closes its work (seed 004 V1.40: "已完成工具行动、协作回执
    认领和验证后" comes the final reply)."""
    claimed = ledger.one(
        "SELECT 1 FROM deliveries WHERE parent_run_id = ? AND status = 'claimed-by-parent' LIMIT 1", run_id
    )
    return claimed is not None and not blockers(ledger, run_id)


def blockers(ledger: Ledger, run_id: str) -> list[str]:
    reasons = []
    if open_work(ledger, run_id):
        reasons.append(f"{open_work(ledger, run_id)} child group(s)/delegation(s) still running")
    for row in ledger.all(
        "SELECT delivery_id, kind FROM deliveries WHERE parent_run_id = ? AND status = 'dispatched'", run_id
    ):
        reasons.append(f"unclaimed {row['kind']} delivery {row['delivery_id']}")
    for row in ledger.all(
        "SELECT claim_id, phase FROM claim_journal WHERE parent_run_id = ? AND phase != 'observed'", run_id
    ):
        reasons.append(f"claim {row['claim_id']} not yet observed ({row['phase']})")
    return reasons


def tombstone(ledger: Ledger, run_id: str, reason: str, features: RunFeatures) -> list[str]:
    """A parent that ended: cancel its live children and delegations, suppress its deliveries."""
    cancelled: list[str] = []
    with ledger.tx() as db:
        for child in db.execute(
            "SELECT * FROM children WHERE status != 'terminal' AND group_id IN"
            " (SELECT group_id FROM isolated_groups WHERE parent_run_id = ?)",
            (run_id,),
        ).fetchall():
            result = {
                "delegation_id": child["delegation_id"],
                "instance_id": child["instance_id"],
                "template": child["template"],
                "run_id": child["run_id"],
                "status": "failed",
                "summary": "",
                "artifacts": [],
                "evidence": [],
                "verified_revision": None,
                "error": f"cancelled: {reason}",
            }
            db.execute(
                "UPDATE children SET status = 'terminal', result = ?, ended_at = ? WHERE delegation_id = ?",
                (dumps(result), time.time(), child["delegation_id"]),
            )
            if RunStatus(get_run(ledger, child["run_id"])["status"]) not in TERMINAL:
                set_run_status(ledger, child["run_id"], RunStatus.CANCELLED, features, f"parent ended: {reason}")
            ledger.event("child-tombstone", child["instance_id"], parent_run=run_id)
            cancelled.append(child["instance_id"])
        for row in db.execute(
            "SELECT * FROM delegations WHERE parent_run_id = ? AND status != 'terminal'", (run_id,)
        ).fetchall():
            db.execute(
                "UPDATE delegations SET status = 'terminal', result = ?, ended_at = ? WHERE delegation_id = ?",
                (
                    dumps({"status": "needs-repair", "error": f"cancelled: {reason}"}),
                    time.time(),
                    row["delegation_id"],
                ),
            )
            if RunStatus(get_run(ledger, row["run_id"])["status"]) not in TERMINAL:
                set_run_status(ledger, row["run_id"], RunStatus.CANCELLED, features, f"parent ended: {reason}")
        db.execute(
            "UPDATE isolated_groups SET status = 'joined' WHERE parent_run_id = ? AND status = 'open'",
            (run_id,),
        )
        for row in db.execute(
            "SELECT delivery_id FROM deliveries WHERE parent_run_id = ? AND status = 'dispatched'", (run_id,)
        ).fetchall():
            db.execute("UPDATE deliveries SET status = 'suppressed' WHERE delivery_id = ?", (row["delivery_id"],))
            ledger.event("delivery-suppressed", row["delivery_id"], parent_run=run_id)
    return cancelled

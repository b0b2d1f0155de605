"""The preview gate (seed 004 V1.1 §3, ``[project] require_preview``): a root run
whose tree changed sources finalizes only when a ``preview.validate`` passed after
the project's latest change (its current revision), beside the verification gate.

The browser check itself runs in the agent (actors/tools/preview.py); its receipt
is an ordinary action row, so the gate reads ``actions``: a passed check is one
that ended ``ok``, and "after the change" compares the supervisor's own clock on
both rows (the revision's ``created_at``, the action's ``finished_at``).
"""

from __future__ import annotations

from corral.supervisor.ledger.port import Ledger
from corral.supervisor.project import revision_store

PREVIEW_TOOL = "preview.validate"


def missing_reason(ledger: Ledger, root_run_id: str) -> str | None:
    """Why the run may not finalize for want of a passed preview, or None."""
    if revision_store.last_change_in_tree(ledger, root_run_id) is None:
        return None
    latest = ledger.one("SELECT revision, created_at FROM project_revisions ORDER BY revision DESC LIMIT 1")
    if latest is None:
        return None
    passed = ledger.one("SELECT 1 AS found FROM actions WHERE tool = ? AND phase = 'ok' AND finished_at >= ?"
                        " LIMIT 1", PREVIEW_TOOL, latest["created_at"])
    if passed is not None:
        return None
    return f"sources changed at revision {latest['revision']}; run preview.validate (a passing check is required)"


def final_blockers(ledger: Ledger, run_id: str) -> list[str]:
    reason = missing_reason(ledger, run_id)
    return [reason] if reason else []

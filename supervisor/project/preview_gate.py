"""The preview gate (seed 004 V1.1 §3, ``[project] require_preview``): a root run
whose tree changed sources finalizes only when a ``preview.validate`` passed after
the project's latest change (its current revision), beside the verification gate.

The browser check itself runs in the agent (actors/tools/preview.py); its receipt
is an ordinary action row, so the gate reads ``actions``: a passed check is one
that ended ``ok``, and it speaks for the revision it read before and after its
check (its output's ``revision``; a revision that moved meanwhile fails the check).
"After the latest change" is that revision being the current one: the project's,
which a cluster's nodes share (revision_store.py), so a change another node made
after the check voids it too, where comparing this ledger's clocks would not.
"""

from __future__ import annotations

import json

from corral.supervisor.ledger.port import Ledger
from corral.supervisor.project import revision_store

PREVIEW_TOOL = "preview.validate"


def missing_reason(ledger: Ledger, root_run_id: str) -> str | None:
    """Why the run may not finalize for want of a passed preview, or None."""
    if revision_store.last_change_in_tree(ledger, root_run_id) is None:
        return None
    current = revision_store.current(ledger)
    for row in ledger.all("SELECT result FROM actions WHERE tool = ? AND phase = 'ok'", PREVIEW_TOOL):
        if _checked_revision(row["result"]) == current:
            return None
    return f"sources changed at revision {current}; run preview.validate (a passing check is required)"


def _checked_revision(result: str | None) -> int | None:
    """The revision a passed check saw, from its stored result (None: none readable)."""
    try:
        output = json.loads(result or "").get("output")
    except (ValueError, AttributeError):
        return None
    if not isinstance(output, dict) or output.get("passed") is not True:
        return None
    revision = output.get("revision")
    return revision if isinstance(revision, int) and not isinstance(revision, bool) else None


def final_blockers(ledger: Ledger, run_id: str) -> list[str]:
    reason = missing_reason(ledger, run_id)
    return [reason] if reason else []

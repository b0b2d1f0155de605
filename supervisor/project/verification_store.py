"""Verifications (seed 004 V1.2, V1.12): what ``project.verify`` found, bound to the
project revision and the source fingerprint it started on.

One row per ``project.verify`` action, written once: a repeated record of the same
action returns the first. Its status is ``passed`` (every command exited 0 and
the sources did not change under it), ``failed`` (with each command's bounded,
redacted output) or ``stale`` (the revision moved while it ran, or the commands
changed the sources themselves). Only a ``passed`` row on the current revision
lets a final reply of a run that changed sources through; a commit needs one of
its own run, on a non-zero revision.
"""

from __future__ import annotations

import enum
import json
import time
from typing import Any

from corral.core.redact import redact, summarize
from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.project import revision_store

#: Characters of one command's output kept (its last lines: where a failure shows).
MAX_OUTPUT_CHARS = 4000


class VerificationStatus(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    STALE = "stale"


def _view(row: Any) -> dict[str, Any]:
    return {
        "action_id": row["action_id"],
        "run_id": row["run_id"],
        "revision": int(row["revision"]),
        "fingerprint": row["fingerprint"],
        "status": row["status"],
        "commands": int(row["commands"]),
        "output": json.loads(row["output"]),
        "created_at": row["created_at"],
    }


def get(ledger: Ledger, action_id: str) -> dict[str, Any] | None:
    row = ledger.one("SELECT * FROM project_verifications WHERE action_id = ?", action_id)
    return _view(row) if row is not None else None


def _bounded_outputs(outputs: Any) -> list[dict[str, Any]]:
    """Each command's argv, status, exit code and output tail: redacted, bounded."""
    if not isinstance(outputs, list) or len(outputs) > 64:
        raise BadRequest("outputs must be a list of at most 64 commands")
    kept: list[dict[str, Any]] = []
    for item in outputs:
        if not isinstance(item, dict):
            raise BadRequest("each output must be a map")
        text = str(item.get("output", ""))
        kept.append(redact({
            "argv": [summarize(str(arg), 200) for arg in item.get("argv", [])][:64],
            "status": summarize(str(item.get("status", "")), 40),
            "exit_code": item.get("exit_code") if isinstance(item.get("exit_code"), int) else None,
            "output": text[-MAX_OUTPUT_CHARS:],
        }))
    return kept


def record(
    ledger: Ledger,
    run_id: str,
    action_id: str,
    *,
    revision: int,
    fingerprint: str,
    passed: bool,
    sources_changed: bool,
    outputs: Any,
) -> dict[str, Any]:
    """Record a verification once per action; a repeat returns the first record."""
    kept = _bounded_outputs(outputs)
    with ledger.tx() as db:
        known = get(ledger, action_id)
        if known is not None:
            return known
        now = revision_store.current(ledger)
        if now != revision or sources_changed:
            status = VerificationStatus.STALE
        else:
            status = VerificationStatus.PASSED if passed else VerificationStatus.FAILED
        db.execute(
            "INSERT INTO project_verifications (action_id, run_id, revision, fingerprint, status, commands, output,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (action_id, run_id, revision, fingerprint, status.value, len(kept), dumps(kept), time.time()),
        )
        ledger.event("project-verification", action_id, run=run_id, revision=revision, status=status.value,
                     current_revision=now)
    recorded = get(ledger, action_id)
    assert recorded is not None
    return recorded


def on_revision(ledger: Ledger, revision: int) -> dict[str, Any] | None:
    """The verification that speaks for ``revision``: a passed one if there is one,
    else the latest."""
    row = ledger.one(
        "SELECT * FROM project_verifications WHERE revision = ? ORDER BY CASE WHEN status = 'passed' THEN 0 ELSE 1"
        " END, created_at DESC LIMIT 1", revision)
    return _view(row) if row is not None else None


def latest(ledger: Ledger) -> dict[str, Any] | None:
    row = ledger.one("SELECT * FROM project_verifications ORDER BY created_at DESC LIMIT 1")
    return _view(row) if row is not None else None


def state(ledger: Ledger) -> dict[str, Any]:
    """The current revision, the verification that speaks for it (or the latest
    one, of an older revision), and whether it passed on the current revision."""
    revision = revision_store.current(ledger)
    verification = on_revision(ledger, revision) or latest(ledger)
    passed = verification is not None and verification["revision"] == revision \
        and verification["status"] == VerificationStatus.PASSED
    return {"revision": revision, "verification": verification, "passed_on_current": passed}


def passed_by_run(ledger: Ledger, run_id: str, revision: int) -> bool:
    """Whether ``run_id`` itself has a passed verification of ``revision`` (the gated
    commit's credential, seed 004 V1.12: "当前 run 必须已在当前非零项目 revision 上取得
    passed 验证凭证"; another run's verification does not count)."""
    return ledger.one("SELECT 1 FROM project_verifications WHERE run_id = ? AND revision = ? AND status = ?",
                      run_id, revision, VerificationStatus.PASSED.value) is not None


def missing_reason(ledger: Ledger) -> str | None:
    """Why the current revision is not verified, or None when it is."""
    now = state(ledger)
    if now["passed_on_current"]:
        return None
    reason = f"sources changed at revision {now['revision']}; run project.verify"
    last = now["verification"]
    if last is not None:
        reason += f" (the last verification, at revision {last['revision']}, is {last['status']})"
    return reason

"""The provider lifecycle of a compaction's summary request (seed 004 V1.21: "compaction
请求使用…独立 requestKind=context-compaction 和由 source fingerprint 派生的稳定 request slot…
复用 V1.18 Provider lifecycle/orphan barrier；未知 started…进入 needs-reconciliation，绝不重发").

It is a row of ``provider_requests`` like a planning turn's, with
``request_kind = 'context-compaction'`` (no turn of its loop: provider_store.requests_for
leaves it out), so what holds for a planning turn holds for it: the row is committed
``started`` before the agent sends anything; a transient failure schedules a durable
retry (``provider_store.provider_failed``: attempt and retry_at on disk, the run
``waiting-for-provider-retry``, woken by the retry timer or ``corral resume``); a row
left ``started`` by a crash is failed (an idempotent provider) or parked
``needs-reconciliation`` and never sent again (``provider_store.interrupt_provider_request``,
at boot by recovery.py, or here when the agent asks again); the summary and the row's
``completed`` commit in one transaction (compaction_service.compacted), so a completed
request never lacks its summary.

Its slot is ``<run>:compact-<to_seq>``: the covered range names the request (two
compactions of one run never cover the same range); a retry is
``<run>:compact-<to_seq>-transient-<n>``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from corral.supervisor.errors import Conflict, Refused
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.provider_store import control_pending, interrupt_provider_request
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_store import get_run

KIND = "context-compaction"


@dataclass(frozen=True)
class Begun:
    slot: str
    attempt: int


@dataclass(frozen=True)
class Parked:
    """The run waits for a person: a compaction request's outcome was lost."""

    slot: str


def slot_base(run_id: str, to_seq: int) -> str:
    return f"{run_id}:compact-{to_seq}"


def begin(ledger: Ledger, run_id: str, loop: int, to_seq: int, features: RunFeatures) -> Begun | Parked:
    """Commit the summary request ``started`` before it is sent, after settling the
    last one: a request still ``started`` when the run asks for its next step was lost
    with its agent (the orphan rule applies: it is never sent again blindly)."""
    latest = ledger.one(
        "SELECT slot, status, retry_at FROM provider_requests WHERE run_id = ? AND request_kind = ?"
        " ORDER BY rowid DESC LIMIT 1",
        run_id,
        KIND,
    )
    if latest is not None and latest["status"] == "started":
        provider = get_run(ledger, run_id)["provider"]
        if not interrupt_provider_request(ledger, latest["slot"], run_id, features.idempotent_provider(provider),
                                          features):
            return Parked(latest["slot"])
    if latest is not None and latest["status"] == "failed" and latest["retry_at"] and latest["retry_at"] > time.time():
        raise Refused(f"retry of {latest['slot']} is not due before {latest['retry_at']:.3f}")
    why = control_pending(ledger, run_id, features)  # a steer to apply first, a goal pausing: no request now
    if why is not None:
        raise Conflict(why)
    base = slot_base(run_id, to_seq)
    earlier = ledger.all(
        "SELECT slot, status, attempt FROM provider_requests WHERE run_id = ? AND request_kind = ?"
        " AND (slot = ? OR slot LIKE ?) ORDER BY rowid",
        run_id,
        KIND,
        base,
        f"{base}-transient-%",
    )
    # As a planning turn's: each failure of this request (a crash's included) counts
    # against max_provider_retries; the slot says how many were sent before.
    attempt = int(earlier[-1]["attempt"]) + 1 if earlier and earlier[-1]["status"] == "failed" else 0
    slot = f"{base}-transient-{len(earlier)}" if earlier else base
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO provider_requests (slot, run_id, loop_index, attempt, status, boot_id, started_at,"
            " request_kind) VALUES (?, ?, ?, ?, 'started', ?, ?, ?)",
            (slot, run_id, loop, attempt, ledger.boot_id, time.time(), KIND),
        )
        ledger.emit("provider-request-started", run_id, slot=slot, attempt=attempt, request_kind=KIND)
    return Begun(slot, attempt)


def complete(ledger: Ledger, db: Any, run_id: str, slot: str) -> None:
    """Inside the caller's transaction ``db`` (the one that stores the summary): the
    request ends ``completed``. Reported again after it completed, it changes nothing."""
    row = db.execute(
        "SELECT status FROM provider_requests WHERE slot = ? AND run_id = ? AND request_kind = ?", (slot, run_id, KIND)
    ).fetchone()
    if row is None:
        raise Conflict(f"no compaction request {slot!r} of run {run_id}")
    if row["status"] == "completed":
        return
    if row["status"] != "started":
        raise Conflict(f"compaction request {slot} is {row['status']}, not started")
    db.execute(
        "UPDATE provider_requests SET status = 'completed', finished_at = ? WHERE slot = ? AND run_id = ?",
        (time.time(), slot, run_id),
    )
    ledger.emit("provider-request-completed", run_id, slot=slot, request_kind=KIND)

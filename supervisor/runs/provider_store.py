"""Ledger operations of a run's provider requests: each request's lifecycle
(started, completed with its response, failed with a durable retry, or parked as
needs-reconciliation when a crash lost its outcome), and its slot name.

Every function here is one transaction (or a read) on the ledger.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from corral.actors.providers.base import MAX_RESPONSE_CHARS
from corral.core.path_scrub import scrub_urls
from corral.core.redact import redact_text, summarize
from corral.mailbox.protocol import RequestIdentity
from corral.supervisor.errors import Conflict, NotFound, Refused
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import retry_identity
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.runs.run_store import RunLimits, get_run, set_run_status
from corral.supervisor.runs.transcript_store import TurnNotes, keep_texts

#: A provider turn a steer or a goal pause interrupted (provider_interrupted = 1).
INTERRUPTED = "interrupted"


def _now() -> float:
    return time.time()


def requests_for(ledger: Ledger, run_id: str, loop_index: int) -> list[sqlite3.Row]:
    """The loop's planning turns (a compaction request is no turn of its loop:
    supervisor/longtask/compaction_requests.py)."""
    return ledger.all(
        "SELECT rowid, * FROM provider_requests WHERE run_id = ? AND loop_index = ? AND request_kind = 'tool-plan'"
        " ORDER BY rowid",
        run_id,
        loop_index,
    )


def begin_provider_request(
    ledger: Ledger, run_id: str, loop_index: int, features: RunFeatures, identity: RequestIdentity | None = None
) -> dict[str, Any]:
    """A provider request's lifecycle begins (its slot and attempt). ``identity``:
    the request about to be sent. The retry of a failed request that kept its
    identity is begun only with one, and only when it is the same request: a
    changed one supersedes the retry (``retry-superseded``, naming the changed
    parts), opens a new loop and is refused, so the next step plans afresh as a new
    request."""
    begun = _begin(ledger, run_id, loop_index, features, identity, defer=False)
    assert begun is not None  # only a deferred begin is left undone
    return begun


def begin_unless_retry(ledger: Ledger, run_id: str, loop_index: int, features: RunFeatures) -> dict[str, Any] | None:
    """As begin_provider_request, before the request is built (step_piggyback.py):
    None, nothing begun, when it would be the retry of a request that kept its
    identity; the agent begins that one itself, with the request it will send."""
    return _begin(ledger, run_id, loop_index, features, None, defer=True)


def _begin(
    ledger: Ledger,
    run_id: str,
    loop_index: int,
    features: RunFeatures,
    identity: RequestIdentity | None,
    *,
    defer: bool,
) -> dict[str, Any] | None:
    requests = requests_for(ledger, run_id, loop_index)
    latest = requests[-1] if requests else None
    if latest is not None and latest["status"] == "started":
        raise Conflict(f"request {latest['slot']} is already in flight")
    if latest is not None and latest["status"] == "failed" and latest["retry_at"] and latest["retry_at"] > _now():
        raise Refused(f"retry of {latest['slot']} is not due before {latest['retry_at']:.3f}")
    why = control_pending(ledger, run_id, features)  # a steer to apply first, a goal pausing: no request now
    if why is not None:
        raise Conflict(why)
    kept = latest["request_identity"] if latest is not None and latest["status"] == "failed" else None
    if latest is not None and kept is not None:
        if identity is None:
            if defer:
                return None
            raise Conflict(f"the retry of {latest['slot']} must be begun with the request it sends")
        changed = retry_identity.changed_parts(kept, identity)
        if changed:
            _superseded_by_change(ledger, run_id, loop_index, latest["slot"], changed)
            raise Conflict(f"the retry of {latest['slot']} is superseded ({', '.join(changed)} changed);"
                           " plan again")
    slot, attempt = _next_request_slot(requests, run_id, loop_index)
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO provider_requests (slot, run_id, loop_index, attempt, status, boot_id, started_at)"
            " VALUES (?, ?, ?, ?, 'started', ?, ?)",
            (slot, run_id, loop_index, attempt, ledger.boot_id, _now()),
        )
        ledger.emit("provider-request-started", run_id, slot=slot, attempt=attempt)
    return {"slot": slot, "attempt": attempt}


def _next_request_slot(requests: list[sqlite3.Row], run_id: str, loop_index: int) -> tuple[str, int]:
    """``<run>:<loop>`` first; ``-transient-N`` after N transient failures; a repair
    (an invalid plan sent back to the model) starts a new base ``:repair-K``; a turn
    interrupted by a steer or a pause is followed by a new lifecycle ``-interrupted-N``
    (never the same slot again, and not counted as a retry)."""
    base = f"{run_id}:{loop_index}"
    transient = interrupted = 0
    for request in requests:
        if request["status"] == "completed" and request["consumed"] == 2:
            base = f"{run_id}:{loop_index}:repair-{_repair_number(request['slot']) + 1}"
            transient = interrupted = 0
        elif request["status"] == "failed":
            transient = int(request["attempt"]) + 1
        elif request["status"] == INTERRUPTED:
            interrupted += 1
            transient = 0
    if interrupted:
        base = f"{base}-interrupted-{interrupted}"
    return (f"{base}-transient-{transient}" if transient else base), transient


def _repair_number(slot: str) -> int:
    marker = ":repair-"
    if marker not in slot:
        return 0
    tail = slot.split(marker, 1)[1]
    return int(tail.split("-", 1)[0])


def provider_handoff(
    ledger: Ledger, run_id: str, slot: str, text: str, raw_sha256: str | None = None, notes: TurnNotes | None = None
) -> None:
    """Commit a successful response before anyone parses or acts on it. The ledger
    keeps it redacted; ``raw_sha256`` names the raw copy in the private spool;
    ``notes``: what the turn was sent, for its transcript (transcript_store.py)."""
    notes = notes or TurnNotes()
    stored = redact_text(text[:MAX_RESPONSE_CHARS])
    search = None if notes.web_search is None else int(notes.web_search)
    with ledger.tx() as db:
        # Completed only from started; read only when it was not (to say why).
        if not db.execute(
            "UPDATE provider_requests SET status = 'completed', response = ?, raw_sha256 = ?, finished_at = ?,"
            " system_sha256 = ?, catalog_sha256 = ?, history_seq = ?,"
            " reasoning_effort = COALESCE(?, reasoning_effort), web_search = COALESCE(?, web_search)"
            " WHERE slot = ? AND run_id = ? AND status = 'started'",
            (stored, raw_sha256, _now(), notes.system_sha256, notes.catalog_sha256, notes.seen,
             notes.reasoning_effort, search, slot, run_id),
        ).rowcount:
            row = db.execute(
                "SELECT status FROM provider_requests WHERE slot = ? AND run_id = ?", (slot, run_id)
            ).fetchone()
            if row is None:
                raise NotFound(f"no provider request {slot!r}")
            raise Conflict(f"provider request {slot} is {row['status']}, not started")
        keep_texts(db, notes, parameters=False)  # set above, on the same row
        ledger.emit("provider-response-committed", run_id, slot=slot, chars=len(stored))


def stored_response(ledger: Ledger, run_id: str, slot: str) -> str | None:
    """The response a completed request stored (redacted), or None."""
    row = ledger.one("SELECT response FROM provider_requests WHERE slot = ? AND run_id = ?", slot, run_id)
    return None if row is None else row["response"]


def secret_refused(ledger: Ledger, run_id: str, slot: str, reason: str, features: RunFeatures) -> None:
    """A response that held a secret value (supervisor/runs/response_secrets.py): its
    handoff fails closed. From ``started`` (the handoff itself) or ``completed`` and
    not yet consumed (its plan, decoded, held one): the request becomes
    needs-reconciliation with no response stored, and so does the run. A person's
    reconciliation lets it be sent again (resolutions.reconcile_provider_request)."""
    with ledger.tx() as db:
        row = db.execute(
            "SELECT status, consumed FROM provider_requests WHERE slot = ? AND run_id = ?", (slot, run_id)
        ).fetchone()
        if row is None:
            raise NotFound(f"no provider request {slot!r}")
        if not (row["status"] == "started" or (row["status"] == "completed" and not row["consumed"])):
            raise Conflict(f"provider request {slot} is {row['status']}; its response cannot be refused now")
        db.execute(
            "UPDATE provider_requests SET status = 'needs-reconciliation', response = NULL, raw_sha256 = NULL,"
            " error_kind = 'secret', error = ?, finished_at = COALESCE(finished_at, ?) WHERE slot = ?",
            (reason, _now(), slot),
        )
        ledger.emit("provider-request-needs-reconciliation", run_id, slot=slot, why="secret")
        if RunStatus(get_run(ledger, run_id)["status"]) not in TERMINAL:
            set_run_status(ledger, run_id, RunStatus.NEEDS_RECONCILIATION, features, reason)


def provider_failed(
    ledger: Ledger,
    run_id: str,
    slot: str,
    kind: str,
    error: str,
    limits: RunLimits,
    features: RunFeatures,
    notes: TurnNotes | None = None,
    identity: RequestIdentity | None = None,
) -> dict[str, Any]:
    """A failed lifecycle. Transient kinds schedule a durable retry; others fail the run.
    ``notes``: what the turn was sent, for its transcript; ``identity``: the request's,
    kept with its retry (compared when the retry falls due: begin_provider_request)."""
    notes = notes or TurnNotes()
    error = scrub_urls(error)  # the public row, event and reason name no provider URL
    with ledger.tx() as db:
        row = db.execute("SELECT * FROM provider_requests WHERE slot = ? AND run_id = ?", (slot, run_id)).fetchone()
        if row is None:
            raise NotFound(f"no provider request {slot!r}")
        if row["status"] != "started":
            raise Conflict(f"provider request {slot} is {row['status']}, not started")
        attempt = int(row["attempt"]) + 1
        retry = kind == "transient" and attempt <= limits.max_provider_retries
        retry_at = None
        if retry:
            retry_at = _now() + min(limits.retry_cap_s, limits.retry_base_s * 2 ** (attempt - 1))
        keep_texts(db, notes)
        db.execute(
            "UPDATE provider_requests SET status = 'failed', error_kind = ?, error = ?, retry_at = ?,"
            " finished_at = ?, system_sha256 = ?, catalog_sha256 = ?, history_seq = ?, request_identity = ?"
            " WHERE slot = ?",
            (kind, summarize(error, 300), retry_at, _now(), notes.system_sha256, notes.catalog_sha256, notes.seen,
             retry_identity.stored(identity) if retry else None, slot),
        )
        ledger.emit(
            "provider-request-failed",
            run_id,
            slot=slot,
            kind=kind,
            error=summarize(error, 200),
            retry_at=retry_at or 0,
        )
        if retry:
            set_run_status(
                ledger,
                run_id,
                RunStatus.WAITING_FOR_PROVIDER_RETRY,
                features,
                f"provider {kind} error; attempt {attempt} at {retry_at:.3f}",
            )
        else:
            why = f"provider failed ({kind}): {summarize(error, 200)}"
            set_run_status(ledger, run_id, RunStatus.FAILED, features, why)
    return {"retry": retry, "retry_at": retry_at, "attempt": attempt}


def provider_interrupted(ledger: Ledger, run_id: str, slot: str) -> dict[str, Any]:
    """The agent stopped waiting for ``slot`` because a steer or a goal pause asked
    it to (seed 004 V1.13): the turn ends ``interrupted`` with provider_interrupted
    set. Not a failure: no retry is scheduled, and the run's next provider turn is a
    new lifecycle, after the steer (or the resume). Reported twice, it changes nothing."""
    with ledger.tx() as db:
        row = db.execute("SELECT status FROM provider_requests WHERE slot = ? AND run_id = ?",
                         (slot, run_id)).fetchone()
        if row is None:
            raise NotFound(f"no provider request {slot!r}")
        if row["status"] == INTERRUPTED:
            return {"slot": slot, "status": INTERRUPTED}
        if row["status"] != "started":
            raise Conflict(f"provider request {slot} is {row['status']}, not started")
        _mark_interrupted(ledger, db, run_id, slot, "interrupted by a steer or a goal pause")
    return {"slot": slot, "status": INTERRUPTED}


def _mark_interrupted(ledger: Ledger, db: Any, run_id: str, slot: str, why: str) -> None:
    db.execute(
        "UPDATE provider_requests SET status = ?, provider_interrupted = 1, error_kind = 'interrupted', error = ?,"
        " retry_at = NULL, finished_at = ? WHERE slot = ?",
        (INTERRUPTED, why, _now(), slot),
    )
    ledger.emit("provider-request-interrupted", run_id, slot=slot, provider_interrupted=True)


def control_pending(ledger: Ledger, run_id: str, features: RunFeatures) -> str | None:
    """Why no provider turn of ``run_id`` may be in flight now (a steer to apply, a
    goal pausing), or None: the features' ``provider_guards``. None without asking them
    when the run's boundary was quiet since (run_versions.py): what they read is unchanged."""
    if ledger.run_versions.quiet(run_id):
        return None
    for guard in features.provider_guards:
        why = guard(ledger, run_id)
        if why:
            return why
    return None


def interrupt_provider_request(ledger: Ledger, slot: str, run_id: str, idempotent: bool, features: RunFeatures) -> bool:
    """A request whose outcome was lost with its process. When a steer or a pause
    was waiting for it, it counts as interrupted (its answer would have been
    discarded anyway) and the run goes on (True) without sending it again. Else an
    idempotent provider's request is failed and may be sent again (True); any other
    is parked as needs-reconciliation and never re-sent silently (False)."""
    control = control_pending(ledger, run_id, features)
    if control is not None:
        with ledger.tx() as db:
            _mark_interrupted(ledger, db, run_id, slot, f"lost with its process while a control waited: {control}")
        return True
    with ledger.tx() as db:
        if idempotent:
            db.execute("UPDATE provider_requests SET status = 'failed', error_kind = 'interrupted',"
                       " error = 'interrupted by a crash', retry_at = NULL WHERE slot = ?", (slot,))
            ledger.emit("provider-request-interrupted", run_id, slot=slot)
            return True
        db.execute("UPDATE provider_requests SET status = 'needs-reconciliation' WHERE slot = ?", (slot,))
        ledger.emit("provider-request-needs-reconciliation", run_id, slot=slot)
        run = get_run(ledger, run_id)
        if run["status"] in (RunStatus.RUNNING, RunStatus.WAITING_FOR_PROVIDER_RETRY):
            set_run_status(ledger, run_id, RunStatus.NEEDS_RECONCILIATION, features,
                           f"provider request {slot} was in flight at a crash; not re-sent")
    return False


def drop_retry(ledger: Ledger, run_id: str, why: str, features: RunFeatures) -> bool:
    """A run waiting for its provider retry gives the retry up at once (seed 004
    V1.39: "有效 steer 会删除旧 sidecar"; "steer 使用同一 run 的新 cursor 重新规划，不复用旧
    attempt"): the pending retry is superseded (``retry-superseded``, naming ``why``)
    and the run runs again, so its next boundary applies what superseded it (the
    steer, in a new loop) instead of waiting out the backoff. False (nothing
    changes) when the run waits for no retry. Inside the caller's transaction when
    it has one."""
    with ledger.tx() as db:
        if RunStatus(get_run(ledger, run_id)["status"]) is not RunStatus.WAITING_FOR_PROVIDER_RETRY:
            return False
        row = db.execute(
            "SELECT slot FROM provider_requests WHERE run_id = ? AND status = 'failed' AND retry_at IS NOT NULL"
            " ORDER BY rowid DESC LIMIT 1",
            (run_id,),
        ).fetchone()
        _supersede(ledger, db, run_id, row["slot"] if row is not None else None, (why,))
        set_run_status(ledger, run_id, RunStatus.RUNNING, features, f"provider retry superseded: {why}")
    return True


def _superseded_by_change(ledger: Ledger, run_id: str, loop_index: int, slot: str, changed: tuple[str, ...]) -> None:
    """The due retry of ``slot`` is not the request the run would send now: it is
    never sent, and the run plans again in a new loop (a new request, attempt 0)."""
    with ledger.tx() as db:
        _supersede(ledger, db, run_id, slot, changed)
        db.execute(
            "UPDATE runs SET loop_index = loop_index + 1, updated_at = ? WHERE run_id = ? AND loop_index = ?",
            (_now(), run_id, loop_index),
        )
        ledger.emit("loop-advanced", run_id, loop=loop_index + 1, reason="retry-superseded")


def _supersede(ledger: Ledger, db: Any, run_id: str, slot: str | None, changed: tuple[str, ...]) -> None:
    """The retry of ``slot`` will never be sent: its retry_at is cleared and the
    audit names only what changed (field names, never their values)."""
    db.execute(
        "UPDATE provider_requests SET retry_at = NULL WHERE run_id = ? AND status = 'failed' AND retry_at IS NOT NULL",
        (run_id,),
    )
    ledger.emit("retry-superseded", run_id, slot=slot or "", changed=list(changed))


def due_retries(ledger: Ledger) -> list[tuple[str, float]]:
    """Runs parked for a provider retry, with the retry_at that the ledger keeps."""
    rows = ledger.all(
        "SELECT r.run_id, MAX(p.retry_at) AS retry_at FROM runs r JOIN provider_requests p ON p.run_id = r.run_id"
        " WHERE r.status = 'waiting-for-provider-retry' AND p.status = 'failed' GROUP BY r.run_id"
    )
    return [(row["run_id"], float(row["retry_at"] or 0)) for row in rows]

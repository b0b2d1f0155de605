"""Ledger operations of runs, plans, provider requests, actions and receipts.

Everything the agent does next is derived from committed rows by ``next_step``;
the agent keeps no state that a crash could lose. Every function here is one
transaction (or a read) on the ledger: no processes, no network, so it is tested
directly.
"""

from __future__ import annotations

import json
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from corral.actors.providers.base import MAX_RESPONSE_CHARS
from corral.actors.tools.base import is_sealed
from corral.core.redact import redact, redact_text, summarize
from corral.mailbox.steps import Begin, Begun, Do, ParkStep, Step
from corral.supervisor.errors import BadRequest, Conflict, NotFound, Refused
from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.runs.action_state import (
    TERMINAL as ACTION_TERMINAL,
)
from corral.supervisor.runs.action_state import (
    ActionPhase,
    action_id,
    canonical_json,
    check_action_transition,
    fingerprint,
)
from corral.supervisor.runs.run_state import TERMINAL as RUN_TERMINAL
from corral.supervisor.runs.run_state import RunStatus, check_run_transition

MAX_RESULT_CHARS = 64 * 1024
#: What a run id looks like ("run-" and what create_run or a client chose).
RUN_ID = re.compile(r"^run-[a-z0-9-]{6,40}$")


@dataclass(frozen=True)
class RunLimits:
    max_repairs: int = 2
    max_provider_retries: int = 3
    retry_base_s: float = 0.5
    retry_cap_s: float = 30.0


def _now() -> float:
    return time.time()


def _bounded(value: Any, limit: int = MAX_RESULT_CHARS) -> str:
    text = dumps(redact(value))
    if len(text) > limit:
        text = dumps({"truncated": True, "preview": text[: limit - 200]})
    return text


# -- runs ----------------------------------------------------------------------------


#: A task is stored and shown again (show, runs); bounded so replies fit a frame.
MAX_TASK_CHARS = 20_000


def create_run(
    ledger: Ledger,
    *,
    agent_id: str,
    task: str,
    provider: str,
    provider_config: dict[str, Any],
    kind: str = "root",
    parent_run_id: str | None = None,
    root_run_id: str | None = None,
    depth: int = 0,
    options: dict[str, Any] | None = None,
    run_id: str | None = None,
    session_id: str | None = None,
    conversation_id: str | None = None,
) -> str:
    if not task.strip():
        raise BadRequest("task must not be empty")
    if len(task) > MAX_TASK_CHARS:
        raise BadRequest(f"task is longer than {MAX_TASK_CHARS} characters")
    run_id = run_id or "run-" + secrets.token_hex(6)
    options = dict(options or {})
    # A scripted provider's script is data the tools act on: the row shows it
    # redacted, and the agent gets the raw copy (see supervisor/runs/sealed_input.py).
    raw_sha = ledger.hooks.keep_raw_copy(run_id, "provider-config", "config", provider_config, redact(provider_config))
    if raw_sha is not None:
        options["provider_config_raw_sha256"] = raw_sha
    now = _now()
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO runs (run_id, agent_id, session_id, kind, parent_run_id, root_run_id, depth, task,"
            " status, provider, provider_config, options, created_at, updated_at, conversation_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                agent_id,
                session_id or "sess-" + secrets.token_hex(6),
                kind,
                parent_run_id,
                root_run_id or run_id,
                depth,
                redact_text(task),
                provider,
                dumps(redact(provider_config)),
                dumps(options),
                now,
                now,
                conversation_id,
            ),
        )
        ledger.event("run-created", run_id, agent=agent_id, run_kind=kind, task=summarize(task, 120))
    return run_id


def get_run(ledger: Ledger, run_id: str) -> sqlite3.Row:
    row = ledger.one("SELECT * FROM runs WHERE run_id = ?", run_id)
    if row is None:
        raise NotFound(f"no run {run_id!r}")
    return row


def set_run_status(ledger: Ledger, run_id: str, status: RunStatus, reason: str | None = None) -> bool:
    """Move a run; a no-op (False) when it is already there. Illegal moves raise."""
    with ledger.tx() as db:
        row = get_run(ledger, run_id)
        current = RunStatus(row["status"])
        if current is status:
            return False
        check_run_transition(current, status)
        now = _now()
        db.execute(
            "UPDATE runs SET status = ?, reason = ?, updated_at = ?,"
            " started_at = COALESCE(started_at, CASE WHEN ? = 'running' THEN ? END),"
            " ended_at = CASE WHEN ? IN ('completed', 'failed', 'cancelled') THEN ? ELSE ended_at END"
            " WHERE run_id = ?",
            (
                status.value,
                redact_text(reason) if reason else None,
                now,
                status.value,
                now,
                status.value,
                now,
                run_id,
            ),
        )
        ledger.event("run-" + status.value, run_id, reason=reason or "", previous=current.value)
        for hook in ledger.hooks.on_status:
            hook(ledger, run_id, status, reason)
    return True


def claim_run(ledger: Ledger, agent_id: str) -> sqlite3.Row | None:
    """The agent's lane: the oldest run it should work on now, moved to running."""
    row = ledger.one(
        "SELECT * FROM runs WHERE agent_id = ? AND status IN ('running', 'pending')"
        " ORDER BY CASE status WHEN 'running' THEN 0 ELSE 1 END, created_at LIMIT 1",
        agent_id,
    )
    if row is None:
        return None
    if row["status"] == RunStatus.PENDING:
        set_run_status(ledger, row["run_id"], RunStatus.RUNNING)
        row = get_run(ledger, row["run_id"])
    return row


def history(ledger: Ledger, run_id: str, after: int = 0) -> list[dict[str, Any]]:
    """The run's observations in order; ``after``: only those past the first ``after``
    (observations are only ever appended, numbered 1, 2, ... per run)."""
    rows = ledger.all("SELECT data FROM observations WHERE run_id = ? AND seq > ? ORDER BY seq", run_id, after)
    return [json.loads(row["data"]) for row in rows]


def add_observation(ledger: Ledger, run_id: str, source: str, loop_index: int, data: dict[str, Any]) -> bool:
    """Append to the run's context once per source (an action id, a claim id...)."""
    with ledger.tx() as db:
        # One statement: the next number, and nothing when the source has one already.
        added = db.execute(
            "INSERT OR IGNORE INTO observations (run_id, seq, source, loop_index, data, created_at)"
            " SELECT ?, COALESCE(MAX(seq), 0) + 1, ?, ?, ?, ? FROM observations WHERE run_id = ?",
            (run_id, source, loop_index, _bounded(data), _now(), run_id),
        ).rowcount
    return bool(added)


# -- provider request lifecycles -------------------------------------------------------


def _requests_for(ledger: Ledger, run_id: str, loop_index: int) -> list[sqlite3.Row]:
    return ledger.all(
        "SELECT rowid, * FROM provider_requests WHERE run_id = ? AND loop_index = ? ORDER BY rowid",
        run_id,
        loop_index,
    )


def begin_provider_request(ledger: Ledger, run_id: str, loop_index: int) -> dict[str, Any]:
    requests = _requests_for(ledger, run_id, loop_index)
    latest = requests[-1] if requests else None
    if latest is not None and latest["status"] == "started":
        raise Conflict(f"request {latest['slot']} is already in flight")
    if latest is not None and latest["status"] == "failed" and latest["retry_at"] and latest["retry_at"] > _now():
        raise Refused(f"retry of {latest['slot']} is not due before {latest['retry_at']:.3f}")
    slot, attempt = _next_request_slot(requests, run_id, loop_index)
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO provider_requests (slot, run_id, loop_index, attempt, status, boot_id, started_at)"
            " VALUES (?, ?, ?, ?, 'started', ?, ?)",
            (slot, run_id, loop_index, attempt, ledger.boot_id, _now()),
        )
        ledger.event("provider-request-started", run_id, slot=slot, attempt=attempt)
    return {"slot": slot, "attempt": attempt}


def _next_request_slot(requests: list[sqlite3.Row], run_id: str, loop_index: int) -> tuple[str, int]:
    """``<run>:<loop>`` first; ``-transient-N`` after N transient failures; a repair
    (an invalid plan sent back to the model) starts a new base ``:repair-K``."""
    base = f"{run_id}:{loop_index}"
    transient = 0
    for request in requests:
        if request["status"] == "completed" and request["consumed"] == 2:
            base = f"{run_id}:{loop_index}:repair-{_repair_number(request['slot']) + 1}"
            transient = 0
        elif request["status"] == "failed":
            transient = int(request["attempt"]) + 1
    return (f"{base}-transient-{transient}" if transient else base), transient


def _repair_number(slot: str) -> int:
    marker = ":repair-"
    if marker not in slot:
        return 0
    tail = slot.split(marker, 1)[1]
    return int(tail.split("-", 1)[0])


def provider_handoff(ledger: Ledger, run_id: str, slot: str, text: str, raw_sha256: str | None = None) -> None:
    """Commit a successful response before anyone parses or acts on it. The ledger
    keeps it redacted; ``raw_sha256`` names the raw copy in the private spool."""
    with ledger.tx() as db:
        row = db.execute(
            "SELECT status FROM provider_requests WHERE slot = ? AND run_id = ?", (slot, run_id)
        ).fetchone()
        if row is None:
            raise NotFound(f"no provider request {slot!r}")
        if row["status"] != "started":
            raise Conflict(f"provider request {slot} is {row['status']}, not started")
        stored = redact_text(text[:MAX_RESPONSE_CHARS])
        db.execute(
            "UPDATE provider_requests SET status = 'completed', response = ?, raw_sha256 = ?, finished_at = ?"
            " WHERE slot = ?",
            (stored, raw_sha256, _now(), slot),
        )
        ledger.event("provider-response-committed", run_id, slot=slot, chars=len(stored))


def provider_failed(ledger: Ledger, run_id: str, slot: str, kind: str, error: str, limits: RunLimits) -> dict[str, Any]:
    """A failed lifecycle. Transient kinds schedule a durable retry; others fail the run."""
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
        db.execute(
            "UPDATE provider_requests SET status = 'failed', error_kind = ?, error = ?, retry_at = ?,"
            " finished_at = ? WHERE slot = ?",
            (kind, summarize(error, 300), retry_at, _now(), slot),
        )
        ledger.event(
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
                f"provider {kind} error; attempt {attempt} at {retry_at:.3f}",
            )
        else:
            set_run_status(ledger, run_id, RunStatus.FAILED, f"provider failed ({kind}): {summarize(error, 200)}")
    return {"retry": retry, "retry_at": retry_at, "attempt": attempt}


def interrupt_provider_request(ledger: Ledger, slot: str, run_id: str, idempotent: bool) -> bool:
    """A request whose outcome was lost with its process. An idempotent provider's
    request is failed and may be sent again (True); any other is parked as
    needs-reconciliation and never re-sent silently (False)."""
    with ledger.tx() as db:
        if idempotent:
            db.execute("UPDATE provider_requests SET status = 'failed', error_kind = 'interrupted',"
                       " error = 'interrupted by a crash', retry_at = NULL WHERE slot = ?", (slot,))
            ledger.event("provider-request-interrupted", run_id, slot=slot)
            return True
        db.execute("UPDATE provider_requests SET status = 'needs-reconciliation' WHERE slot = ?", (slot,))
        ledger.event("provider-request-needs-reconciliation", run_id, slot=slot)
        run = get_run(ledger, run_id)
        if run["status"] in (RunStatus.RUNNING, RunStatus.WAITING_FOR_PROVIDER_RETRY):
            set_run_status(ledger, run_id, RunStatus.NEEDS_RECONCILIATION,
                           f"provider request {slot} was in flight at a crash; not re-sent")
    return False


def retry_provider_now(ledger: Ledger, run_id: str) -> bool:
    """An explicit wake of a run parked for a provider retry (``corral resume``): its
    retry is due now rather than at the stored ``retry_at``. False (nothing changes)
    when the run does not wait for one. Attempts still count against
    ``max_provider_retries``."""
    with ledger.tx() as db:
        if RunStatus(get_run(ledger, run_id)["status"]) is not RunStatus.WAITING_FOR_PROVIDER_RETRY:
            return False
        now = _now()
        db.execute(
            "UPDATE provider_requests SET retry_at = ? WHERE run_id = ? AND status = 'failed' AND retry_at > ?",
            (now, run_id, now),
        )
        ledger.event("provider-retry-woken", run_id)
        set_run_status(ledger, run_id, RunStatus.RUNNING, "provider retry woken by resume")
    return True


def due_retries(ledger: Ledger) -> list[tuple[str, float]]:
    """Runs parked for a provider retry, with the retry_at that the ledger keeps."""
    rows = ledger.all(
        "SELECT r.run_id, MAX(p.retry_at) AS retry_at FROM runs r JOIN provider_requests p ON p.run_id = r.run_id"
        " WHERE r.status = 'waiting-for-provider-retry' AND p.status = 'failed' GROUP BY r.run_id"
    )
    return [(row["run_id"], float(row["retry_at"] or 0)) for row in rows]


# -- plans -------------------------------------------------------------------------


def commit_plan(
    ledger: Ledger,
    run_id: str,
    loop_index: int,
    slot: str,
    plan: dict[str, Any],
    *,
    withhold_response: str | None = None,
    raw_sha256: str | None = None,
) -> dict[str, Any]:
    """Commit the parsed plan of a loop step (once). Returns the plan as stored
    (redacted; ``raw_sha256`` names the raw copy in the private spool).
    ``withhold_response`` replaces the raw response in the same transaction (it
    carried input that the plan now holds sealed)."""
    with ledger.tx() as db:
        existing = db.execute(
            "SELECT plan FROM plans WHERE run_id = ? AND loop_index = ?", (run_id, loop_index)
        ).fetchone()
        if existing is not None:
            stored: dict[str, Any] = json.loads(existing["plan"])
            return stored
        text = dumps(redact(plan))
        db.execute(
            "INSERT INTO plans (run_id, loop_index, plan, raw_sha256, created_at) VALUES (?, ?, ?, ?, ?)",
            (run_id, loop_index, text, raw_sha256, _now()),
        )
        db.execute("UPDATE provider_requests SET consumed = 1 WHERE slot = ?", (slot,))
        if withhold_response is not None:
            db.execute("UPDATE provider_requests SET response = ? WHERE slot = ?", (withhold_response, slot))
        ledger.event(
            "plan-committed",
            run_id,
            loop=loop_index,
            actions=len(plan.get("actions", [])),
            final=plan.get("final") is not None,
        )
    ledger.failpoint("plan.after-commit")
    result: dict[str, Any] = json.loads(text)
    return result


def plan_invalid(
    ledger: Ledger, run_id: str, loop_index: int, slot: str, category: str, detail: str, limits: RunLimits
) -> dict[str, Any]:
    """A response that did not parse: a bounded repair, or the run fails clearly."""
    with ledger.tx() as db:
        run = get_run(ledger, run_id)
        repairs: dict[str, int] = json.loads(run["repairs"])
        total = sum(repairs.values())
        repairs[category] = repairs.get(category, 0) + 1
        db.execute("UPDATE runs SET repairs = ? WHERE run_id = ?", (dumps(repairs), run_id))
        db.execute("UPDATE provider_requests SET consumed = 2 WHERE slot = ?", (slot,))
        ledger.event("plan-invalid", run_id, slot=slot, category=category, detail=summarize(detail, 200))
        if total >= limits.max_repairs:
            set_run_status(
                ledger,
                run_id,
                RunStatus.FAILED,
                f"invalid plan from the provider ({category}): {summarize(detail, 200)}",
            )
            return {"repair": False}
        add_observation(
            ledger,
            run_id,
            f"repair:{slot}",
            loop_index,
            {"role": "repair", "category": category, "detail": summarize(detail, 300)},
        )
    return {"repair": True}


def final_blocked(ledger: Ledger, run_id: str, reasons: list[str], limits: RunLimits) -> dict[str, Any]:
    """A final reply the ledger cannot accept yet (an unclaimed receipt, a live
    session...). Retrying the same plan would spin, so the refusal goes back to the
    provider as a repair on the next loop; past the repair budget the run fails."""
    detail = summarize("; ".join(reasons), 300)
    with ledger.tx() as db:
        run = get_run(ledger, run_id)
        loop = int(run["loop_index"])
        repairs: dict[str, int] = json.loads(run["repairs"])
        total = sum(repairs.values())
        repairs["final-blocked"] = repairs.get("final-blocked", 0) + 1
        db.execute("UPDATE runs SET repairs = ? WHERE run_id = ?", (dumps(repairs), run_id))
        ledger.event("final-blocked", run_id, loop=loop, detail=detail)
        if total >= limits.max_repairs:
            set_run_status(ledger, run_id, RunStatus.FAILED, f"final reply blocked: {detail}")
            return {"status": "failed", "reasons": reasons}
        add_observation(
            ledger,
            run_id,
            f"final-blocked:{run_id}:{loop}",
            loop,
            {
                "role": "repair",
                "category": "final-blocked",
                "detail": f"your final reply was refused: {detail}. Resolve these first (claim deliveries with"
                " agent.run_status, finish or terminate processes), then reply.",
            },
        )
        db.execute(
            "UPDATE runs SET loop_index = loop_index + 1, updated_at = ? WHERE run_id = ? AND loop_index = ?",
            (_now(), run_id, loop),
        )
        ledger.event("loop-advanced", run_id, loop=loop + 1)
    return {"status": "blocked", "reasons": reasons}


def plan_raw_sha256(ledger: Ledger, run_id: str, loop_index: int) -> str | None:
    committed = ledger.committed_plan(run_id, loop_index)
    return None if committed is None else committed[1]


def get_plan(ledger: Ledger, run_id: str, loop_index: int) -> dict[str, Any] | None:
    committed = ledger.committed_plan(run_id, loop_index)
    return None if committed is None else dict(json.loads(committed[0]))


# -- actions -------------------------------------------------------------------------


def prepare_action(
    ledger: Ledger,
    run_id: str,
    loop_index: int,
    action_index: int,
    tool: str,
    tool_input: dict[str, Any],
    *,
    rerunnable: bool,
    policy: str,
    raw_sha256: str | None = None,
    run: Any = None,
    shown_input: Any = None,
) -> sqlite3.Row:
    """Create the action as prepared, or return it unchanged on an idempotent replay.
    ``tool_input`` is what the tool will act on: the fingerprint covers it, the row
    keeps it redacted, and ``raw_sha256`` names its raw copy when the two differ.
    ``run``: the run's row when the caller has it (its agent is all this reads);
    ``shown_input``: ``redact(tool_input)`` when the caller computed it already."""
    if run is None:
        run = get_run(ledger, run_id)
    the_id = action_id(run_id, loop_index, action_index)
    the_fingerprint = fingerprint(tool, tool_input)
    now = _now()
    with ledger.tx() as db:
        created = db.execute(
            "INSERT OR IGNORE INTO actions (action_id, run_id, agent_id, loop_index, action_index, tool, input,"
            " fingerprint, phase, rerunnable, policy, raw_sha256, boot_id, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'prepared', ?, ?, ?, ?, ?, ?)",
            (
                the_id,
                run_id,
                run["agent_id"],
                loop_index,
                action_index,
                tool,
                canonical_json(redact(tool_input) if shown_input is None else shown_input),
                the_fingerprint,
                int(rerunnable),
                policy,
                raw_sha256,
                ledger.boot_id,
                now,
                now,
            ),
        ).rowcount
        if created:
            ledger.event("action-prepared", the_id, run=run_id, tool=tool, policy=policy)
        row = ledger.one("SELECT * FROM actions WHERE action_id = ?", the_id)
    assert row is not None
    if not created:
        # An idempotent replay returns the action unchanged; a different call under
        # the same identity fails the run closed.
        if row["fingerprint"] != the_fingerprint:
            set_run_status(
                ledger,
                run_id,
                RunStatus.FAILED,
                f"action {the_id} replayed with a different fingerprint; failing closed",
            )
            raise Conflict(f"action {the_id} exists with a different fingerprint; failing closed")
        return row
    ledger.failpoint("action.after-prepared")
    return row


def deny_unstarted_actions(ledger: Ledger, run_id: str, reason: str) -> int:
    """A cancelled run's actions that never started (prepared, waiting for approval,
    approved) are denied with a receipt, so nothing waits on a person for them.
    Executing and unresolved ones keep their state: their outcome is not known."""
    rows = ledger.all(
        "SELECT action_id, phase FROM actions WHERE run_id = ?"
        " AND phase IN ('prepared', 'waiting-confirmation', 'approved')",
        run_id,
    )
    with ledger.tx():
        for row in rows:
            # An approved action may only fail (the table has no approved -> denied).
            ending = ActionPhase.FAILED if row["phase"] == ActionPhase.APPROVED else ActionPhase.DENIED
            move_action(ledger, row["action_id"], ending, reason=reason, error=reason)
            write_receipt(ledger, row["action_id"])
    return len(rows)


def get_action(ledger: Ledger, the_id: str) -> sqlite3.Row:
    row = ledger.one("SELECT * FROM actions WHERE action_id = ?", the_id)
    if row is None:
        raise NotFound(f"no action {the_id!r}")
    return row


def move_action(
    ledger: Ledger, the_id: str, phase: ActionPhase, *, current: Any = None, **fields: Any
) -> dict[str, Any]:
    """Move an action along its one transition table. ``current``: its row, read by
    the caller in the same synchronous step (no await since), so not read again.
    Returns the columns it set (``attempts`` aside)."""
    with ledger.tx() as db:
        row = current if current is not None else get_action(ledger, the_id)
        check_action_transition(ActionPhase(row["phase"]), phase)
        now = _now()
        written: dict[str, Any] = {"phase": phase.value, "updated_at": now}
        if phase is ActionPhase.EXECUTING:
            written["executing_at"] = now
        if phase in ACTION_TERMINAL or phase is ActionPhase.NEEDS_RECONCILIATION:
            written["finished_at"] = now
        written.update(fields)
        sets = [f"{key} = ?" for key in written]
        if phase is ActionPhase.EXECUTING:
            sets.append("attempts = attempts + 1")
        db.execute(f"UPDATE actions SET {', '.join(sets)} WHERE action_id = ?", (*written.values(), the_id))
        ledger.event(
            "action-" + phase.value,
            the_id,
            run=row["run_id"],
            tool=row["tool"],
            reason=fields.get("reason") or "",
        )
    return written


def begin_action(ledger: Ledger, the_id: str, *, current: Any = None) -> Begun:
    """Apply policy; commit ``executing`` before the agent may start the side effect.
    ``current``: the action's row, read by the caller with no await since."""
    row = current if current is not None else get_action(ledger, the_id)
    phase = ActionPhase(row["phase"])
    if phase is ActionPhase.PREPARED:
        if row["policy"] == "deny":
            run = get_run(ledger, row["run_id"])
            allowed = json.loads(run["options"]).get("allowed_tools")
            why = (
                f"{row['tool']} is not allowed in a {run['kind']} run"
                if allowed is not None and row["tool"] not in allowed
                else f"{row['tool']} is denied by policy"
            )
            move_action(ledger, the_id, ActionPhase.DENIED, reason=why, error=why)
            write_receipt(ledger, the_id)
            return {"begin": Begin.SKIP, "phase": "denied"}
        if row["policy"] == "confirm":
            with ledger.tx():
                move_action(ledger, the_id, ActionPhase.WAITING_CONFIRMATION)
                set_run_status(
                    ledger,
                    row["run_id"],
                    RunStatus.WAITING_CONFIRMATION,
                    f"action {the_id} ({row['tool']}) waits for approval",
                )
            return {"begin": Begin.PARK, "phase": "waiting-confirmation"}
    if phase in (ActionPhase.PREPARED, ActionPhase.APPROVED):
        move_action(ledger, the_id, ActionPhase.EXECUTING, current=row)
        ledger.failpoint("action.after-executing")
        return {"begin": Begin.EXECUTE, "phase": "executing"}
    if phase is ActionPhase.EXECUTING:
        if row["rerunnable"]:
            # Read-only tools, and ledger tools idempotent by action id, may run again.
            with ledger.tx() as db:
                db.execute(
                    "UPDATE actions SET attempts = attempts + 1, updated_at = ? WHERE action_id = ?",
                    (_now(), the_id),
                )
                ledger.event("action-rerun", the_id, run=row["run_id"], tool=row["tool"])
            return {"begin": Begin.EXECUTE, "phase": "executing"}
        mark_needs_reconciliation(ledger, the_id, "the agent lost track of an executing action; outcome unknown")
        return {"begin": Begin.PARK, "phase": "needs-reconciliation"}
    if phase is ActionPhase.WAITING_CONFIRMATION:
        return {"begin": Begin.PARK, "phase": phase.value}
    return {"begin": Begin.SKIP, "phase": phase.value}


def mark_needs_reconciliation(ledger: Ledger, the_id: str, reason: str) -> None:
    with ledger.tx():
        row = get_action(ledger, the_id)
        move_action(ledger, the_id, ActionPhase.NEEDS_RECONCILIATION, reason=reason)
        run = get_run(ledger, row["run_id"])
        if RunStatus(run["status"]) not in RUN_TERMINAL:
            set_run_status(
                ledger,
                row["run_id"],
                RunStatus.NEEDS_RECONCILIATION,
                f"action {the_id} ({row['tool']}): {reason}",
            )


def finish_action(
    ledger: Ledger,
    the_id: str,
    ok: bool,
    output: dict[str, Any],
    summary: str,
    error: str | None,
    *,
    current: Any = None,
) -> None:
    row = current if current is not None else get_action(ledger, the_id)
    phase = ActionPhase(row["phase"])
    if phase in ACTION_TERMINAL:
        return  # a repeated finish after a lost reply: the first one stands
    if phase is not ActionPhase.EXECUTING:
        raise Conflict(f"action {the_id} is {phase}, not executing")
    # The outcome and its receipt (with the observation) in one commit: a crash
    # cannot leave a terminal action without its receipt.
    with ledger.tx():
        written = move_action(
            ledger,
            the_id,
            ActionPhase.OK if ok else ActionPhase.FAILED,
            current=row,
            result=_bounded({"output": output, "summary": summarize(summary, 300)}),
            error=summarize(error, 300) if error else None,
        )
        write_receipt(ledger, the_id, current={**dict(row), **written})
    ledger.failpoint("action.after-terminal")
    ledger.failpoint("action.after-receipt")


def write_receipt(ledger: Ledger, the_id: str, note: str | None = None, *, current: Any = None) -> bool:
    """Exactly one receipt per terminal action, with the observation in the same commit.
    ``current``: the action as it now is, when the caller just wrote it."""
    with ledger.tx() as db:
        row = current if current is not None else get_action(ledger, the_id)
        phase = ActionPhase(row["phase"])
        if phase not in ACTION_TERMINAL:
            raise Conflict(f"action {the_id} is {phase}; receipts are for terminal actions")
        result = json.loads(row["result"]) if row["result"] else {}
        result_summary = result.get("summary") or row["error"] or row["reason"] or phase.value
        if not db.execute(
            "INSERT OR IGNORE INTO receipts (action_id, run_id, agent_id, fingerprint, tool, status, input_summary,"
            " result_summary, note, started_at, finished_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                the_id,
                row["run_id"],
                row["agent_id"],
                row["fingerprint"],
                row["tool"],
                phase.value,
                input_summary(row["tool"], json.loads(row["input"])),
                summarize(result_summary, 200),
                summarize(note, 200) if note else None,
                row["executing_at"],
                row["finished_at"],
                _now(),
            ),
        ).rowcount:
            return False  # it has its receipt already
        ledger.event("receipt-written", the_id, run=row["run_id"], status=phase.value)
        add_observation(
            ledger,
            row["run_id"],
            the_id,
            row["loop_index"],
            {
                "action_id": the_id,
                "tool": row["tool"],
                "status": phase.value,
                "output": result.get("output", {}),
                "error": row["error"] or "",
            },
        )
        for hook in ledger.hooks.on_receipt:
            hook(ledger, row)
    return True


def input_summary(tool: str, tool_input: dict[str, Any]) -> str:
    """Names and sizes, never contents: receipts must not carry file data or secrets."""
    parts = []
    for key, value in sorted(tool_input.items()):
        if key in ("path", "label", "agent_id", "program", "cwd", "process_id", "template"):
            parts.append(f"{key}={summarize(str(value), 80)}")
        elif isinstance(value, str):
            parts.append(f"{key}=<{len(value)} chars>")
        elif is_sealed(value):
            parts.append(f"{key}=<sealed, {value['bytes']} bytes>")
        elif isinstance(value, list):
            parts.append(f"{key}=<{len(value)} items>")
        else:
            parts.append(f"{key}=<{type(value).__name__}>")
    return summarize(f"{tool}(" + ", ".join(parts) + ")", 200)


def actions_of(ledger: Ledger, run_id: str, loop_index: int) -> list[sqlite3.Row]:
    return ledger.all(
        "SELECT * FROM actions WHERE run_id = ? AND loop_index = ? ORDER BY action_index", run_id, loop_index
    )


# -- the next step -----------------------------------------------------------------


def next_step(ledger: Ledger, run_id: str, *, boundary: bool = True) -> Step:
    """What the agent should do next, from committed state alone. ``boundary=False``:
    the same call again, just after it advanced the loop (nothing else ran since,
    so the finalization and the boundary hooks are not checked twice)."""
    run = get_run(ledger, run_id)
    status = RunStatus(run["status"])
    if status in RUN_TERMINAL:
        return {"do": Do.DONE, "status": status.value}
    if status is not RunStatus.RUNNING:
        return {"do": Do.PARK, "status": status.value}
    if boundary:
        final = ledger.one("SELECT phase, reply FROM finalizations WHERE run_id = ?", run_id)
        if final is not None:
            return {"do": Do.FINALIZE, "reply": final["reply"]}
        commits = ledger.commits
        for hook in ledger.hooks.boundary:
            hook(ledger, run_id)  # e.g. a user's steer, applied at this safe boundary
        if ledger.commits != commits:
            run = get_run(ledger, run_id)  # a hook moved the run (a steer opens a loop)
    loop = int(run["loop_index"])
    plan = get_plan(ledger, run_id, loop)
    if plan is None:
        requests = _requests_for(ledger, run_id, loop)
        latest = requests[-1] if requests else None
        if latest is not None and latest["status"] == "completed" and latest["consumed"] == 0:
            return {
                "do": Do.PARSE,
                "slot": latest["slot"],
                "response": latest["response"],
                "raw_sha256": latest["raw_sha256"],
                "loop": loop,
            }
        # The lane is serial: an agent asking for its next step while its own request
        # is in flight lost that request (it crashed and restarted).
        if (
            latest is not None
            and latest["status"] == "started"
            and not interrupt_provider_request(
                ledger, latest["slot"], run_id, ledger.hooks.idempotent_provider(run["provider"])
            )
        ):
            return {"do": Do.PARK, "status": RunStatus.NEEDS_RECONCILIATION.value}
        return {"do": Do.PROVIDER, "loop": loop}
    if plan.get("final") is not None:
        # Children or delegations still at work: wait for them (no provider call)
        # rather than have the final reply refused for what is only a matter of time.
        return _loop_blockers(ledger, run_id) or {"do": Do.FINALIZE, "reply": plan["final"]}
    rows = {
        row["action_index"]: row
        for row in ledger.all(
            "SELECT a.*, r.action_id IS NOT NULL AS has_receipt FROM actions a"
            " LEFT JOIN receipts r ON r.action_id = a.action_id"
            " WHERE a.run_id = ? AND a.loop_index = ? ORDER BY a.action_index",
            run_id,
            loop,
        )
    }
    for index, call in enumerate(plan.get("actions", [])):
        row = rows.get(index)
        if row is None:
            return {
                "do": Do.PREPARE,
                "loop": loop,
                "index": index,
                "tool": call["tool"],
                "input": call["input"],
                "plan_raw_sha256": plan_raw_sha256(ledger, run_id, loop),
            }
        phase = ActionPhase(row["phase"])
        if phase in (ActionPhase.PREPARED, ActionPhase.APPROVED, ActionPhase.EXECUTING):
            return {
                "do": Do.EXECUTE,
                "action_id": row["action_id"],
                "tool": row["tool"],
                "input": json.loads(row["input"]),
                "raw_sha256": row["raw_sha256"],
                "phase": phase.value,
            }
        if phase is ActionPhase.WAITING_CONFIRMATION:
            set_run_status(ledger, run_id, RunStatus.WAITING_CONFIRMATION, f"action {row['action_id']} waits")
            return {"do": Do.PARK, "status": RunStatus.WAITING_CONFIRMATION.value}
        if phase is ActionPhase.NEEDS_RECONCILIATION:
            set_run_status(ledger, run_id, RunStatus.NEEDS_RECONCILIATION, f"action {row['action_id']} unresolved")
            return {"do": Do.PARK, "status": RunStatus.NEEDS_RECONCILIATION.value}
        if not row["has_receipt"]:
            write_receipt(ledger, row["action_id"])  # repairs a crash between terminal and receipt
    blocked = _loop_blockers(ledger, run_id)
    if blocked:
        return blocked
    with ledger.tx() as db:
        db.execute(
            "UPDATE runs SET loop_index = loop_index + 1, updated_at = ? WHERE run_id = ? AND loop_index = ?",
            (_now(), run_id, loop),
        )
        ledger.event("loop-advanced", run_id, loop=loop + 1)
    return next_step(ledger, run_id, boundary=False)


def _loop_blockers(ledger: Ledger, run_id: str) -> ParkStep | None:
    """A join to wait for, say (supervisor/runs/run_hooks.py ``loop_blockers``)."""
    for check in ledger.hooks.loop_blockers:
        step = check(ledger, run_id)
        if step is not None:
            return step
    return None

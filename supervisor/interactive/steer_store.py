"""Steers in the ledger (seed 004 V1.13): a user's instruction added to a live run.

A steer is recorded (and acknowledged only after the commit), then applied once
at the next safe boundary of its run. Applying it discards what the agent
planned and has not started (an unparsed response, plain prepared actions that
needed no person, a draft final reply), adds the instruction to the run's
history and opens a new loop, so the agent plans again with it.

What a person decided, or what may already be acting, is never discarded: while
an action of the current loop waits for confirmation, is approved, executing or
unresolved, the steer waits; an approval executes the original action and the
steer applies after its receipt. A provider turn in flight is interrupted
instead (supervisor/interactive/provider_interrupts.py): the supervisor records
it ``interrupted`` and the steer applies at that boundary.

A caller may name its steer (``steer_id``): the same id with the same text
returns the first result and records nothing; with another text it is refused.
Only a root run is steered (children answer to their parent), with at most
:data:`MAX_STEERS_PER_RUN` steers of at most :data:`MAX_STEER_BYTES` each and
:data:`MAX_RUN_STEER_BYTES` in all; not a run that needs reconciliation.
Every function here is one transaction (or a read).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import Any

from corral.core.redact import redact_text
from corral.supervisor.errors import BadRequest, Conflict
from corral.supervisor.interactive import conversation_log
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import action_store, provider_store, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import TERMINAL, RunStatus

#: One steer's text, in UTF-8 bytes (the seed's 4 KiB).
MAX_STEER_BYTES = 4096
MAX_STEERS_PER_RUN = 16
#: All the steers of one run together, in UTF-8 bytes (the seed's 16 KiB).
MAX_RUN_STEER_BYTES = 16 * 1024
STEER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,79}$")
#: Control characters a steer may not carry (tab and newline are text).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
#: Phases of an action of the current loop that hold a steer back: a person's
#: decision waits or was taken, or the action may be acting (or may have acted).
HOLDING_PHASES = frozenset(
    {ActionPhase.WAITING_CONFIRMATION, ActionPhase.APPROVED, ActionPhase.EXECUTING, ActionPhase.NEEDS_RECONCILIATION}
)
SUPERSEDED = "superseded by the user's steer before it started"


def _now() -> float:
    return time.time()


def steer_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadRequest("the instruction must be a non-empty string")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_STEER_BYTES:
        raise BadRequest(f"the instruction is over {MAX_STEER_BYTES} bytes (UTF-8); send a shorter one")
    if _CONTROL.search(value):
        raise BadRequest("the instruction may not contain NUL or other control characters")
    return value


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _answer(row: Any, status: str) -> dict[str, Any]:
    return {"steer_id": row["steer_id"], "run_id": row["run_id"], "status": status}


def refusal(ledger: Ledger, run: Any) -> str | None:
    """Why ``run`` takes no steer now (None: it does)."""
    run_id = run["run_id"]
    if run["parent_run_id"] is not None or run["kind"] != "root":
        return (f"run {run_id} is a {run['kind']} run of {run['parent_run_id'] or 'another run'}; only a root run"
                f" is steered (steer {run['root_run_id']} instead)")
    status = RunStatus(run["status"])
    if status in TERMINAL:
        return (f"run {run_id} is {status.value}; a steer only reaches a live run."
                f" Start a new run instead: corral run --agent {run['agent_id']} --task TEXT")
    if status is RunStatus.NEEDS_RECONCILIATION:
        return f"run {run_id} needs reconciliation first (corral pending); steer it once it runs again"
    if ledger.one("SELECT 1 FROM finalizations WHERE run_id = ?", run_id) is not None:
        return f"run {run_id} is writing its final reply; start a new run instead"
    return None


def record_steer(
    ledger: Ledger, run_id: str, text: Any, features: RunFeatures, steer_id: Any = None
) -> dict[str, Any]:
    instruction = steer_text(text)
    if steer_id is not None and (not isinstance(steer_id, str) or not STEER_ID.match(steer_id)):
        raise BadRequest("steer_id must be 1 to 80 of A-Z a-z 0-9 . _ : - (starting with a letter or digit)")
    digest = _sha256(instruction)
    run = run_store.get_run(ledger, run_id)
    if steer_id is not None:
        existing = ledger.one("SELECT * FROM steers WHERE steer_id = ?", steer_id)
        if existing is not None:
            if existing["run_id"] != run_id or existing["text_sha256"] != digest:
                raise Conflict(f"steer-id-conflict: steer {steer_id} was recorded with another run or text")
            return {**_answer(existing, run["status"]), "existing": True}
    why = refusal(ledger, run)
    if why is not None:
        raise Conflict(why)
    taken = ledger.one("SELECT COUNT(*), COALESCE(SUM(text_bytes), 0) FROM steers WHERE run_id = ?", run_id)
    count, size = (int(taken[0]), int(taken[1])) if taken is not None else (0, 0)
    if count >= MAX_STEERS_PER_RUN:
        raise Conflict(f"run {run_id} already took {MAX_STEERS_PER_RUN} steers, the most a run takes;"
                       " start a new run with the whole instruction")
    if size + len(instruction.encode()) > MAX_RUN_STEER_BYTES:
        raise Conflict(f"run {run_id}'s steers would pass {MAX_RUN_STEER_BYTES} bytes in all;"
                       " start a new run with the whole instruction")
    steer_id = steer_id or f"str-{secrets.token_hex(8)}"
    status = RunStatus(run["status"])
    stored = redact_text(instruction)  # the one private copy: the steer's row and its conversation message
    with ledger.tx() as db:
        # The run's next sequence, taken in the recording transaction (the ledger's
        # one writer for the run): the order steers apply in, never the wall clock.
        db.execute(
            "INSERT INTO steers (steer_id, run_id, text, created_at, text_sha256, text_bytes, seq)"
            " SELECT ?, ?, ?, ?, ?, ?, COALESCE(MAX(seq), 0) + 1 FROM steers WHERE run_id = ?",
            (steer_id, run_id, stored, _now(), digest, len(instruction.encode()), run_id),
        )
        ledger.event("steer-recorded", run_id, steer=steer_id, sha256=digest, chars=len(instruction))
        conversation_log.append_steer(ledger, run, steer_id, stored)
        open_question = db.execute(
            "SELECT 1 FROM input_requests WHERE run_id = ? AND answer IS NULL", (run_id,)
        ).fetchone()
        if status is RunStatus.NEEDS_INPUT and open_question is None:
            # Parked for a person without a question (completion evidence missing):
            # the steer is that person's word, so the run moves again (a paused
            # goal parks it again at its next boundary, with no provider call).
            run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, features, "steered")
        if status is RunStatus.WAITING_FOR_PROVIDER_RETRY:
            # The retry was for a request the steer makes stale: dropped now, the run
            # plans again with the steer in a new loop (V1.39), not after the backoff.
            provider_store.drop_retry(ledger, run_id, "steer", features)
    ledger.failpoint("steer.after-record")
    return {"steer_id": steer_id, "run_id": run_id, "status": status.value}


def pending_steers(ledger: Ledger, run_id: str) -> list[Any]:
    return ledger.all(
        "SELECT steer_id, text FROM steers WHERE run_id = ? AND applied_at IS NULL ORDER BY seq",
        run_id,
    )


def apply_steers(ledger: Ledger, run_id: str, features: RunFeatures) -> int:
    """At a step boundary of a running run: apply its pending steers, once each,
    and open a new loop, so the agent's next step is a provider turn that sees them.

    Not while an action of the current loop waits for a person, was approved, is
    executing or unresolved (its outcome, or a person's decision, comes first),
    nor while a provider request of it is in flight or was lost with its process
    (the ordinary path settles that first): the steer waits for that boundary."""
    steers = pending_steers(ledger, run_id)
    if not steers:
        return 0
    run = run_store.get_run(ledger, run_id)
    loop = int(run["loop_index"])
    actions = action_store.actions_of(ledger, run_id, loop)
    if any(row["phase"] in HOLDING_PHASES for row in actions):
        return 0
    requests = ledger.all(
        "SELECT slot, status, consumed FROM provider_requests WHERE run_id = ? AND loop_index = ?", run_id, loop
    )
    if any(row["status"] == "started" for row in requests):
        return 0
    with ledger.tx() as db:
        for row in requests:
            if row["status"] == "completed" and not row["consumed"]:
                db.execute("UPDATE provider_requests SET consumed = 1 WHERE slot = ?", (row["slot"],))
        for row in actions:
            if row["phase"] == ActionPhase.PREPARED:
                # Planned before the steer, not started, no person involved: cancelled
                # with a receipt, so the model sees it was dropped (an approve of it fails).
                action_store.move_action(ledger, row["action_id"], ActionPhase.DENIED, reason=SUPERSEDED,
                                         error=SUPERSEDED)
                action_store.write_receipt(ledger, row["action_id"], features)
        for steer in steers:
            run_store.add_observation(
                ledger,
                run_id,
                f"steer:{steer['steer_id']}",
                loop,
                {"role": "user", "kind": "steer", "steer_id": steer["steer_id"], "text": steer["text"]},
            )
            db.execute(
                "UPDATE steers SET applied_loop = ?, applied_at = ? WHERE steer_id = ?",
                (loop + 1, _now(), steer["steer_id"]),
            )
            ledger.event("steer-applied", run_id, steer=steer["steer_id"], loop=loop + 1)
        db.execute(
            "UPDATE runs SET loop_index = loop_index + 1, updated_at = ? WHERE run_id = ? AND loop_index = ?",
            (_now(), run_id, loop),
        )
        ledger.event("loop-advanced", run_id, loop=loop + 1, reason="steer")
    ledger.failpoint("steer.after-apply")
    return len(steers)


def steer_blocks_final(ledger: Ledger, run_id: str) -> str | None:
    """A final reply drafted before a pending steer must not be written."""
    if pending_steers(ledger, run_id):
        return "a steer arrived after this final reply was planned; plan again with it"
    return None


def steer_holds_provider(ledger: Ledger, run_id: str) -> str | None:
    """A provider turn is not begun while a steer waits: it applies first."""
    if pending_steers(ledger, run_id):
        return "a steer waits to be applied; ask for the next step"
    return None


def steers_of(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    rows = ledger.all(
        "SELECT steer_id, text, text_sha256, created_at, applied_loop, applied_at FROM steers WHERE run_id = ?"
        " ORDER BY seq",
        run_id,
    )
    return [dict(row) for row in rows]

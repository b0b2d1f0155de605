"""Ledger operations of a run's actions and their receipts: an action prepared
(idempotently, by its fingerprint), begun under its policy, moved along its one
transition table, finished, and its one receipt written with the observation the
model sees, in the same commit.

Every function here is one transaction (or a read) on the ledger.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any, NamedTuple

from corral.actors.action_receipt import echo_input as echo_input
from corral.actors.action_receipt import input_summary as input_summary
from corral.core.path_scrub import scrub_paths
from corral.core.redact import bounded_traceback, redact, redact_text, summarize
from corral.mailbox.protocol import Receipt
from corral.mailbox.steps import Begin, Begun
from corral.supervisor.errors import Conflict, NotFound
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import tool_boundary
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
from corral.supervisor.runs.child_scope import child_scope_refusal, writes_files
from corral.supervisor.runs.receipt_check import receipt_text
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import TERMINAL as RUN_TERMINAL
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.runs.run_store import add_observation, bounded_json_cut, get_run, set_run_status


def _now() -> float:
    return time.time()


def prepare_action(
    ledger: Ledger,
    run_id: str,
    loop_index: int,
    action_index: int,
    tool: str,
    tool_input: dict[str, Any],
    features: RunFeatures,
    *,
    rerunnable: bool,
    policy: str,
    raw_sha256: str | None = None,
    run: Any = None,
    shown_input: Any = None,
    announce: bool = True,
) -> sqlite3.Row:
    """Create the action as prepared, or return it unchanged on an idempotent replay.
    ``tool_input`` is what the tool will act on: the fingerprint covers it, the row
    keeps it redacted, and ``raw_sha256`` names its raw copy when the two differ.
    ``run``: the run's row when the caller has it (its agent is all this reads);
    ``shown_input``: ``redact(tool_input)`` when the caller computed it already.
    ``announce=False``: no ``action-prepared`` event; the caller begins the action
    in the same transaction (nobody can see it prepared: its ``action-executing``
    event is the one)."""
    if run is None:
        run = get_run(ledger, run_id)
    the_id = action_id(run_id, loop_index, action_index)
    the_fingerprint = fingerprint(tool, tool_input)
    now = _now()
    with ledger.tx() as db:
        # The new row comes back from the insert itself (no read-back); none comes
        # back when the action exists already (a replay), which is then read.
        inserted = db.execute(
            # Bound to the run's goal as it is now (none: NULL), in the same statement:
            # a goal edit voids what was planned for an older revision (goal_store.edit).
            "INSERT OR IGNORE INTO actions (action_id, run_id, agent_id, loop_index, action_index, tool, input,"
            " fingerprint, phase, rerunnable, policy, raw_sha256, boot_id, created_at, updated_at, goal_id,"
            " goal_revision) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'prepared', ?, ?, ?, ?, ?, ?,"
            " (SELECT goal_id FROM goals WHERE run_id = ?), (SELECT revision FROM goals WHERE run_id = ?))"
            " RETURNING *",
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
                run_id,
                run_id,
            ),
        ).fetchall()
        created = bool(inserted)
        if created and announce:
            ledger.emit("action-prepared", the_id, run=run_id, tool=tool, policy=policy)
        row = inserted[0] if created else ledger.one("SELECT * FROM actions WHERE action_id = ?", the_id)
    assert row is not None
    if not created:
        # An idempotent replay returns the action unchanged; a different call under
        # the same identity fails the run closed.
        if row["fingerprint"] != the_fingerprint:
            set_run_status(
                ledger,
                run_id,
                RunStatus.FAILED,
                features,
                f"action {the_id} replayed with a different fingerprint; failing closed",
            )
            raise Conflict(f"action {the_id} exists with a different fingerprint; failing closed")
        return row
    ledger.failpoint("action.after-prepared")
    return row


def deny_unstarted_actions(ledger: Ledger, run_id: str, reason: str, features: RunFeatures) -> int:
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
            write_receipt(ledger, row["action_id"], features)
    return len(rows)


def get_action(ledger: Ledger, the_id: str) -> sqlite3.Row:
    row = ledger.one("SELECT * FROM actions WHERE action_id = ?", the_id)
    if row is None:
        raise NotFound(f"no action {the_id!r}")
    return row


def actions_by_id(ledger: Ledger, ids: list[str]) -> dict[str, sqlite3.Row]:
    """The actions among ``ids`` that exist, by id, in one read."""
    marks = ", ".join("?" * len(ids))
    return {row["action_id"]: row for row in ledger.all(f"SELECT * FROM actions WHERE action_id IN ({marks})", *ids)}


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
        ledger.emit(
            "action-" + phase.value,
            the_id,
            run=row["run_id"],
            tool=row["tool"],
            reason=fields.get("reason") or "",
        )
    return written


def begin_action(ledger: Ledger, the_id: str, features: RunFeatures, *, current: Any = None) -> Begun:
    """Apply policy; commit ``executing`` before the agent may start the side effect.
    ``current``: the action's row, read by the caller with no await since."""
    row = current if current is not None else get_action(ledger, the_id)
    phase = ActionPhase(row["phase"])
    # Only an action bound to a goal can be stale (the goal feature's check): the
    # others pay nothing for it.
    if phase in (ActionPhase.PREPARED, ActionPhase.APPROVED) and row["policy"] != "deny":
        # The run's tool bound again, at the boundary itself: an older build's pending
        # or approved action outside it (a child's MCP call) never begins (V1.34,
        # "approval 不能穿透"). The run's row is kept in memory (run_versions.py).
        outside = tool_boundary.refusal(get_run(ledger, row["run_id"]), row["tool"])
        if outside is not None:
            ending = ActionPhase.FAILED if phase is ActionPhase.APPROVED else ActionPhase.DENIED
            with ledger.tx():
                move_action(ledger, the_id, ending, current=row, reason=outside, error=outside)
                write_receipt(ledger, the_id, features)
            return {"begin": Begin.SKIP, "phase": ending.value}
    if phase in (ActionPhase.PREPARED, ActionPhase.APPROVED) and row["goal_id"] is not None:
        blocked = _block_if_stale(ledger, row, phase, features)
        if blocked is not None:
            return blocked
    if phase in (ActionPhase.PREPARED, ActionPhase.APPROVED) and row["policy"] != "deny" and writes_files(row["tool"]):
        refused = _child_scope(ledger, row, phase, features)
        if refused is not None:
            return refused
    if phase is ActionPhase.PREPARED:
        if row["policy"] == "deny":
            why = tool_boundary.refusal(get_run(ledger, row["run_id"]), row["tool"]) or (
                f"{row['tool']} is denied by policy")
            with ledger.tx():  # the terminal move and its receipt: one commit, one event
                move_action(ledger, the_id, ActionPhase.DENIED, reason=why, error=why)
                write_receipt(ledger, the_id, features)
            return {"begin": Begin.SKIP, "phase": "denied"}
        if row["policy"] == "confirm":
            with ledger.tx():
                move_action(ledger, the_id, ActionPhase.WAITING_CONFIRMATION)
                set_run_status(
                    ledger,
                    row["run_id"],
                    RunStatus.WAITING_CONFIRMATION,
                    features,
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
                ledger.emit("action-rerun", the_id, run=row["run_id"], tool=row["tool"])
            return {"begin": Begin.EXECUTE, "phase": "executing"}
        why = "the agent lost track of an executing action; outcome unknown"
        mark_needs_reconciliation(ledger, the_id, why, features)
        return {"begin": Begin.PARK, "phase": "needs-reconciliation"}
    if phase is ActionPhase.WAITING_CONFIRMATION:
        return {"begin": Begin.PARK, "phase": phase.value}
    return {"begin": Begin.SKIP, "phase": phase.value}


def _child_scope(ledger: Ledger, row: Any, phase: ActionPhase, features: RunFeatures) -> Begun | None:
    """A child's write outside its scopes, refused before its policy may ask a person
    and before it starts, approved or not (seed 004 V1.34). Its plan was checked as a
    whole when it was prepared (child_scope.plan_refusal); this is the check again at
    the boundary itself, so no approval passes it."""
    refusal = child_scope_refusal(row, get_run(ledger, row["run_id"]))
    if refusal is None:
        return None
    # An approved action may only fail (the action table has no approved -> denied).
    ending = ActionPhase.FAILED if phase is ActionPhase.APPROVED else ActionPhase.DENIED
    with ledger.tx():
        move_action(ledger, row["action_id"], ending, current=row, reason=refusal, error=refusal)
        write_receipt(ledger, row["action_id"], features)
    return {"begin": Begin.SKIP, "phase": ending.value}


def _block_if_stale(ledger: Ledger, row: Any, phase: ActionPhase, features: RunFeatures) -> Begun | None:
    """An action made for a state a feature moved on from (an older revision of its
    run's goal) never starts. A goal edit blocks those in its own transaction
    (supervisor/longtask/goal_store.py); this is the same check at the boundary
    itself, so no path can start one."""
    for check in features.stale_actions:
        stale = check(ledger, row)
        if stale is not None:
            why, note = stale
            # An approved action may only fail (the action table has no approved -> denied).
            ending = ActionPhase.FAILED if phase is ActionPhase.APPROVED else ActionPhase.DENIED
            with ledger.tx():
                written = move_action(ledger, row["action_id"], ending, current=row, reason=why, error=why)
                write_receipt(ledger, row["action_id"], features, note=note, current={**dict(row), **written})
            return {"begin": Begin.SKIP, "phase": ending.value}
    return None


def keep_partial_result(ledger: Ledger, row: Any, output: dict[str, Any], summary: str) -> None:
    """What an executing action's effect already came to (a commit made, not yet
    reported), kept in its result: a crash from here on leaves it to the person who
    reconciles the action, and the reconciled receipt shows it. The action's own
    finish replaces it."""
    if ActionPhase(row["phase"]) is not ActionPhase.EXECUTING:
        raise Conflict(f"action {row['action_id']} is {row['phase']}, not executing")
    stored, _cut = bounded_json_cut(redact({"output": output, "summary": summarize(summary, 300)}))
    with ledger.tx() as db:
        db.execute("UPDATE actions SET result = ? WHERE action_id = ?", (stored, row["action_id"]))


def park_unknown_outcome(
    ledger: Ledger, row: Any, output: dict[str, Any], summary: str, reason: str, features: RunFeatures
) -> None:
    """An executing action whose tool reported that it cannot tell what its effect
    came to: ``needs-reconciliation`` with the tool's safe output kept in its result
    (what a person checks against, e.g. a checkpoint id), never ok or failed. A
    repeated report after a lost reply changes nothing."""
    phase = ActionPhase(row["phase"])
    if phase in ACTION_TERMINAL or phase is ActionPhase.NEEDS_RECONCILIATION:
        return
    if phase is not ActionPhase.EXECUTING:
        raise Conflict(f"action {row['action_id']} is {phase}, not executing")
    why = f"outcome unknown: {summarize(reason, 300)}"
    stored, _cut = bounded_json_cut(redact({"output": output, "summary": summarize(summary, 300)}))
    with ledger.tx():
        move_action(ledger, row["action_id"], ActionPhase.NEEDS_RECONCILIATION, current=row, reason=why,
                    result=stored)
        run = get_run(ledger, row["run_id"])
        if RunStatus(run["status"]) not in RUN_TERMINAL:
            set_run_status(ledger, row["run_id"], RunStatus.NEEDS_RECONCILIATION, features,
                           f"action {row['action_id']} ({row['tool']}): {why}")


def mark_needs_reconciliation(ledger: Ledger, the_id: str, reason: str, features: RunFeatures) -> None:
    with ledger.tx():
        row = get_action(ledger, the_id)
        move_action(ledger, the_id, ActionPhase.NEEDS_RECONCILIATION, reason=reason)
        run = get_run(ledger, row["run_id"])
        if RunStatus(run["status"]) not in RUN_TERMINAL:
            set_run_status(
                ledger,
                row["run_id"],
                RunStatus.NEEDS_RECONCILIATION,
                features,
                f"action {the_id} ({row['tool']}): {reason}",
            )


def finish_action(
    ledger: Ledger,
    the_id: str,
    ok: bool,
    output: dict[str, Any],
    summary: str,
    error: str | None,
    features: RunFeatures,
    *,
    current: Any = None,
    traceback: str | None = None,
    receipt: Receipt | None = None,
) -> None:
    """``traceback``: the tool raised; its traceback (redacted and bounded here
    again) is kept beside the output, for people, in the action's ``result``.
    ``receipt``: the one the agent built, checked already against the action's
    record (supervisor/runs/receipt_check.py); None: built here from the record."""
    row = current if current is not None else get_action(ledger, the_id)
    phase = ActionPhase(row["phase"])
    if phase in ACTION_TERMINAL:
        return  # a repeated finish after a lost reply: the first one stands
    if phase is not ActionPhase.EXECUTING:
        raise Conflict(f"action {the_id} is {phase}, not executing")
    # The outcome and its receipt (with the observation) in one commit: a crash
    # cannot leave a terminal action without its receipt.
    # Redacted once: the action's result column and the observation's output are the
    # same value (never read back and parsed again).
    shown = redact(
        {"output": output, "summary": summarize(summary, 300)}
        | ({"traceback": bounded_traceback(traceback)} if traceback else {})
    )
    stored, cut = bounded_json_cut(shown)
    kept = json.loads(stored) if cut else shown  # a cut result: its preview, as stored
    with ledger.tx():
        written = move_action(
            ledger,
            the_id,
            ActionPhase.OK if ok else ActionPhase.FAILED,
            current=row,
            result=stored,
            error=summarize(error, 300) if error else None,
        )
        write_receipt(ledger, the_id, features, current={**dict(row), **written}, receipt=receipt, result=kept)
    ledger.failpoint("action.after-terminal")
    ledger.failpoint("action.after-receipt")


def write_receipt(
    ledger: Ledger,
    the_id: str,
    features: RunFeatures,
    note: str | None = None,
    *,
    current: Any = None,
    repair: bool = False,
    receipt: Receipt | None = None,
    result: dict[str, Any] | None = None,
) -> bool:
    """Exactly one receipt per terminal action, with the observation in the same commit.
    ``current``: the action as it now is, when the caller just wrote it.

    A receipt is written in the transaction of the terminal move it records, so
    that move's event (``action-ok``, ``-failed``, ``-denied``) is the receipt's
    event too: one event per state a client can see. ``repair``: the terminal move
    was committed earlier without its receipt (a ledger from before receipts were
    written in the same commit); the late receipt is a change of its own,
    announced as ``receipt-written``. ``receipt``: the agent's, checked (see
    ``finish_action``); ``result``: the action's result as just written, redacted
    (None: read from the row)."""
    with ledger.tx() as db:
        row = current if current is not None else get_action(ledger, the_id)
        phase = ActionPhase(row["phase"])
        if phase not in ACTION_TERMINAL:
            raise Conflict(f"action {the_id} is {phase}; receipts are for terminal actions")
        if result is None:
            result = json.loads(row["result"]) if row["result"] else {}
        result_summary = result.get("summary") or row["error"] or row["reason"] or phase.value
        text = receipt_text(row, receipt)
        call = text.call
        # The receipt names no absolute path (V1.6: "不得写入 ... 绝对路径"); the
        # observation below keeps the call as the model wrote it, for the model.
        stored = _StoredReceipt(
            row["run_id"],
            row["agent_id"],
            row["fingerprint"],
            row["tool"],
            phase.value,
            scrub_paths(summarize(result_summary, 200)),
        )
        if not db.execute(
            "INSERT OR IGNORE INTO receipts (action_id, run_id, agent_id, fingerprint, tool, status, input_summary,"
            " result_summary, note, started_at, finished_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                the_id,
                *stored[:5],
                scrub_paths(call),
                stored.result_summary,
                scrub_paths(summarize(note, 200)) if note else None,
                row["executing_at"],
                row["finished_at"],
                _now(),
            ),
        ).rowcount:
            _same_receipt(ledger, the_id, stored)
            return False  # it has its receipt already
        if repair:
            ledger.emit("receipt-written", the_id, run=row["run_id"], status=phase.value)
        # Redaction once per value: the input and the result were redacted when the
        # row was written, the call and the echo by ``receipt_text``, the tool name
        # and ids are checked names; only the error may come unredacted from a caller.
        add_observation(
            ledger,
            row["run_id"],
            the_id,
            row["loop_index"],
            {
                "action_id": the_id,
                "tool": row["tool"],
                # What was called (names and sizes, as the receipt has it): a model
                # that sees only results repeats a call it has already made.
                "call": call,
                "input": text.echo,
                "status": phase.value,
                "output": result.get("output", {}),
                "error": redact_text(row["error"]) if row["error"] else "",
            },
            redacted=True,
        )
        for hook in features.on_receipt:
            hook(ledger, row)
    return True


class _StoredReceipt(NamedTuple):
    """What a receipt written again must match in the one stored (V1.6: "命中旧记录后
    必须继续全等复核 ... actionFingerprint / tool / ... / status 和结果摘要")."""

    run_id: str
    agent_id: str
    fingerprint: str
    tool: str
    status: str
    result_summary: str


def _same_receipt(ledger: Ledger, the_id: str, wanted: _StoredReceipt) -> None:
    """Fail closed (``Conflict``, the transaction rolled back) when the receipt
    stored for ``the_id`` is not the one about to be written."""
    stored = ledger.one(f"SELECT {', '.join(_StoredReceipt._fields)} FROM receipts WHERE action_id = ?", the_id)
    differ = [
        name.replace("_", " ")
        for name in _StoredReceipt._fields
        if stored is None or stored[name] != getattr(wanted, name)
    ]
    if differ:
        raise Conflict(f"action {the_id}: its stored receipt differs in {', '.join(differ)}; nothing is written")


def actions_of(ledger: Ledger, run_id: str, loop_index: int) -> list[sqlite3.Row]:
    return ledger.all(
        "SELECT * FROM actions WHERE run_id = ? AND loop_index = ? ORDER BY action_index", run_id, loop_index
    )

"""Interactive runs in the ledger: steers, questions to the user, conversations.

Every operation here is one transaction, so a kill at any instant leaves either
nothing or all of it:

* A **steer** is recorded (and acknowledged only after the commit), then applied
  once at the next safe boundary of its run: between provider turns, never while
  an action of the current loop is executing. Applying it discards what the
  agent planned before it (an unparsed response, a plan whose actions have not
  started, a draft final reply), adds the instruction to the run's history and
  opens a new loop, so the agent plans again with it.
* A **question** (``user.input_request``) parks its run in ``needs-input`` with
  its action executing; the **answer** finishes that action with the answer as
  its output (the model sees it once, as the observation) and resumes the run.
  A second answer is refused.
* A **conversation** groups the runs of one chat: each new turn's run sees the
  earlier turns (task and final reply). A fork copies nothing: it points at its
  parent and the number of turns it inherits, so neither writes into the other.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from corral.core.redact import redact_text
from corral.supervisor.errors import BadRequest, NotFound, SupervisorError
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import action_store, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_state import TERMINAL, RunStatus

MAX_STEER_CHARS = 8000
MAX_QUESTION_CHARS = 4000
MAX_OPTIONS = 20
MAX_ANSWER_CHARS = 8000
#: How many earlier turns of a conversation a new turn's run sees.
MAX_CONVERSATION_TURNS = 20


def _now() -> float:
    return time.time()


def _text(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{what} must be a non-empty string")
    if len(value) > limit:
        raise BadRequest(f"{what} is over {limit} characters")
    return value


# -- steers ----------------------------------------------------------------------------


def record_steer(ledger: Ledger, run_id: str, text: Any) -> dict[str, Any]:
    instruction = _text(text, "the instruction", MAX_STEER_CHARS)
    run = run_store.get_run(ledger, run_id)
    status = RunStatus(run["status"])
    if status in TERMINAL:
        raise SupervisorError(
            f"run {run_id} is {status.value}; a steer only reaches a live run."
            f" Start a new run instead: corral run --agent {run['agent_id']} --task TEXT",
            code="conflict",
        )
    if ledger.one("SELECT 1 FROM finalizations WHERE run_id = ?", run_id) is not None:
        raise SupervisorError(
            f"run {run_id} is writing its final reply; start a new run instead", code="conflict"
        )
    steer_id = f"str-{secrets.token_hex(8)}"
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO steers (steer_id, run_id, text, created_at) VALUES (?, ?, ?, ?)",
            (steer_id, run_id, redact_text(instruction), _now()),
        )
        ledger.event("steer-recorded", run_id, steer=steer_id)
        if status is RunStatus.NEEDS_INPUT and open_question(ledger, run_id) is None:
            # Parked for a person without a question (completion evidence missing):
            # the steer is that person's word, so the run moves again.
            run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, "steered")
    ledger.failpoint("steer.after-record")
    return {"steer_id": steer_id, "run_id": run_id, "status": status.value}


def pending_steers(ledger: Ledger, run_id: str) -> list[Any]:
    return ledger.all(
        "SELECT steer_id, text FROM steers WHERE run_id = ? AND applied_at IS NULL ORDER BY created_at, steer_id",
        run_id,
    )


def apply_steers(ledger: Ledger, run_id: str) -> int:
    """At a step boundary of a running run: apply its pending steers, once each,
    and open a new loop, so the agent's next step is a provider turn that sees them.

    Not while an action of the current loop is executing (its outcome is not in
    yet), nor while a provider request of it is in flight or was lost with its
    process (the ordinary path settles that first): the steer waits for the next
    boundary. What was planned before it and has not started is discarded: an
    unparsed response, prepared actions, a draft final reply."""
    steers = pending_steers(ledger, run_id)
    if not steers:
        return 0
    run = run_store.get_run(ledger, run_id)
    loop = int(run["loop_index"])
    actions = action_store.actions_of(ledger, run_id, loop)
    if any(row["phase"] in (ActionPhase.EXECUTING, ActionPhase.NEEDS_RECONCILIATION) for row in actions):
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
            if row["phase"] in (ActionPhase.PREPARED, ActionPhase.APPROVED):
                ending = ActionPhase.FAILED if row["phase"] == ActionPhase.APPROVED else ActionPhase.DENIED
                why = "superseded by the user's steer before it started"
                action_store.move_action(ledger, row["action_id"], ending, reason=why, error=why)
                action_store.write_receipt(ledger, row["action_id"])
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


# -- questions to the user ---------------------------------------------------------------


def ask(ledger: Ledger, run: Any, action_id: str, question: Any, options: Any) -> dict[str, Any]:
    """From the tool, with its action executing: park the run until the answer. A
    replay (the agent or the supervisor restarted) finds the same question."""
    existing = ledger.one("SELECT * FROM input_requests WHERE action_id = ?", action_id)
    if existing is not None:
        return {"parked": existing["answer"] is None, "question": existing["question"]}
    action = action_store.get_action(ledger, action_id)
    if action["run_id"] != run["run_id"] or action["phase"] != ActionPhase.EXECUTING:
        raise SupervisorError(f"action {action_id} is not an executing action of run {run['run_id']}", code="conflict")
    text = _text(question, "question", MAX_QUESTION_CHARS)
    if options is None:
        options = []
    if not isinstance(options, list) or len(options) > MAX_OPTIONS or not all(
        isinstance(item, str) and 0 < len(item) <= 200 for item in options
    ):
        raise BadRequest(f"options must be a list of at most {MAX_OPTIONS} short strings")
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO input_requests (action_id, run_id, question, options, created_at) VALUES (?, ?, ?, ?, ?)",
            (action_id, run["run_id"], redact_text(text), json.dumps(options), _now()),
        )
        run_store.set_run_status(ledger, run["run_id"], RunStatus.NEEDS_INPUT, f"asks: {redact_text(text)[:200]}")
        ledger.event("input-requested", run["run_id"], action=action_id)
    ledger.failpoint("input.after-ask")
    return {"parked": True, "question": text}


def open_question(ledger: Ledger, run_id: str) -> Any:
    return ledger.one(
        "SELECT * FROM input_requests WHERE run_id = ? AND answer IS NULL ORDER BY created_at LIMIT 1", run_id
    )


def answer(ledger: Ledger, run_id: str, text: Any) -> dict[str, Any]:
    """Record the answer once, finish the question's action with it, resume the run."""
    reply = _text(text, "the answer", MAX_ANSWER_CHARS)
    run = run_store.get_run(ledger, run_id)
    question = open_question(ledger, run_id)
    if question is None:
        answered = ledger.one("SELECT 1 FROM input_requests WHERE run_id = ? AND answer IS NOT NULL", run_id)
        why = "its question was already answered" if answered else "it asked no question"
        raise SupervisorError(f"run {run_id} ({run['status']}) takes no answer: {why}", code="conflict")
    if RunStatus(run["status"]) in TERMINAL:
        raise SupervisorError(f"run {run_id} is {run['status']} and takes no answer; start a new run", code="conflict")
    options = json.loads(question["options"])
    if options and reply not in options:
        raise BadRequest(f"the answer must be one of: {', '.join(options)}")
    action_id = question["action_id"]
    with ledger.tx() as db:
        changed = db.execute(
            "UPDATE input_requests SET answer = ?, answered_at = ? WHERE action_id = ? AND answer IS NULL",
            (redact_text(reply), _now(), action_id),
        ).rowcount
        if changed != 1:
            raise SupervisorError(f"the question of run {run_id} was already answered", code="conflict")
        output = {"question": question["question"], "answer": redact_text(reply)}
        # Terminal with its receipt (and so the observation) in this transaction.
        action_store.finish_action(ledger, action_id, True, output, f"answered: {redact_text(reply)[:100]}", None)
        if RunStatus(run["status"]) is RunStatus.NEEDS_INPUT:
            run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, "answered")
        ledger.event("input-answered", run_id, action=action_id)
    ledger.failpoint("input.after-answer")
    return {"run_id": run_id, "action_id": action_id, "agent_id": run["agent_id"]}


def close_questions(ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
    """A run that ends (cancelled, failed) closes its open question: its action fails
    with the reason, and a late answer is refused."""
    if status not in TERMINAL:
        return
    for row in ledger.all("SELECT action_id FROM input_requests WHERE run_id = ? AND answer IS NULL", run_id):
        action = action_store.get_action(ledger, row["action_id"])
        if action["phase"] == ActionPhase.EXECUTING:
            why = f"the run ended ({status.value}) before the question was answered"
            action_store.move_action(ledger, row["action_id"], ActionPhase.FAILED, reason=why, error=why)
            action_store.write_receipt(ledger, row["action_id"])


def pending_questions(ledger: Ledger) -> list[dict[str, Any]]:
    rows = ledger.all(
        "SELECT q.action_id, q.run_id, q.question, q.options, q.created_at, r.agent_id FROM input_requests q"
        " JOIN runs r ON r.run_id = q.run_id WHERE q.answer IS NULL AND r.status = 'needs-input'"
        " ORDER BY q.created_at"
    )
    return [{**dict(row), "options": json.loads(row["options"])} for row in rows]


# -- conversations ------------------------------------------------------------------------


def new_conversation(ledger: Ledger, agent_id: str, forked_from: str | None = None, turns: int = 0) -> str:
    conversation_id = f"conv-{secrets.token_hex(8)}"
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO conversations (conversation_id, agent_id, forked_from, fork_turns, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (conversation_id, agent_id, forked_from, turns, _now()),
        )
        ledger.event("conversation-created", conversation_id, agent=agent_id, forked_from=forked_from or "")
    return conversation_id


def get_conversation(ledger: Ledger, conversation_id: Any) -> Any:
    if not isinstance(conversation_id, str):
        raise BadRequest("conversation_id must be a string")
    row = ledger.one("SELECT * FROM conversations WHERE conversation_id = ?", conversation_id)
    if row is None:
        raise NotFound(f"no conversation {conversation_id!r}; list them with: corral chat --list")
    return row


def turns(ledger: Ledger, conversation_id: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The conversation's turns, oldest first: its parent's inherited turns, then its own."""
    row = get_conversation(ledger, conversation_id)
    inherited: list[dict[str, Any]] = []
    if row["forked_from"]:
        inherited = turns(ledger, row["forked_from"], int(row["fork_turns"]))
    own = [
        {
            "run_id": run["run_id"],
            "task": run["task"],
            "status": run["status"],
            "reply": run["reply"],
            "created_at": run["created_at"],
        }
        for run in ledger.all(
            "SELECT r.run_id, r.task, r.status, r.created_at, p.text AS reply FROM runs r"
            " LEFT JOIN replies p ON p.run_id = r.run_id WHERE r.conversation_id = ? ORDER BY r.created_at",
            conversation_id,
        )
    ]
    everything = inherited + own
    return everything if limit is None else everything[:limit]


def fork(ledger: Ledger, conversation_id: str) -> dict[str, Any]:
    """A new conversation with the turns persisted now; later turns of either stay apart."""
    parent = get_conversation(ledger, conversation_id)
    inherited = turns(ledger, conversation_id)
    done = [turn for turn in inherited if turn["status"] in {status.value for status in TERMINAL}]
    child = new_conversation(ledger, parent["agent_id"], conversation_id, len(done))
    return {"conversation_id": child, "forked_from": conversation_id, "turns": len(done)}


def conversation_task(ledger: Ledger, conversation_id: str, text: str) -> str:
    """A new turn's task: the earlier turns, then the new message."""
    earlier = [t for t in turns(ledger, conversation_id) if t["reply"] is not None][-MAX_CONVERSATION_TURNS:]
    if not earlier:
        return text
    lines = ["Conversation so far:"]
    for turn in earlier:
        lines.append(f"User: {turn['task'].split('User: ')[-1][:2000]}")
        lines.append(f"You: {str(turn['reply'])[:2000]}")
    lines.append(f"User: {text}")
    return "\n".join(lines)

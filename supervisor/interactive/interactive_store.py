"""Interactive runs in the ledger: conversations (steers: steer_store.py).

Every operation here is one transaction, so a kill at any instant leaves either
nothing or all of it:

* **Questions** to the user (``user.input_request``) live in question_store.py.
* A **conversation** groups the runs of one chat: each new turn's run sees the
  earlier turns (task, the questions asked and answered in it, final reply). A fork copies nothing: it points at its
  parent and the number of turns it inherits, so neither writes into the other.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from corral.supervisor.errors import BadRequest, NotFound, SupervisorError
from corral.supervisor.interactive import conversation_log, question_store
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_state import TERMINAL, RunStatus

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
            # Its questions to the user and their answers (conversation_log.py).
            "messages": conversation_log.messages_of(ledger, run["run_id"]),
        }
        for run in ledger.all(
            "SELECT r.run_id, r.task, r.status, r.created_at, p.text AS reply FROM runs r"
            " LEFT JOIN replies p ON p.run_id = r.run_id WHERE r.conversation_id = ? ORDER BY r.created_at",
            conversation_id,
        )
    ]
    everything = inherited + own
    return everything if limit is None else everything[:limit]


def _live_reason(ledger: Ledger, run: Any) -> str:
    """What keeps a run of a conversation live, in words naming the action, request or child."""
    run_id, status = run["run_id"], RunStatus(run["status"])
    waiting = ledger.one(
        "SELECT action_id, phase FROM actions WHERE run_id = ? AND phase IN (?, ?) ORDER BY created_at LIMIT 1",
        run_id, ActionPhase.WAITING_CONFIRMATION.value, ActionPhase.NEEDS_RECONCILIATION.value,
    )
    if status is RunStatus.WAITING_CONFIRMATION and waiting is not None:
        return f"run {run_id} waits for confirmation of {waiting['action_id']}"
    if status is RunStatus.NEEDS_RECONCILIATION:
        what = waiting["action_id"] if waiting is not None else "a provider request"
        return f"run {run_id} needs reconciliation of {what}"
    if status is RunStatus.NEEDS_INPUT:
        asked = question_store.open_question(ledger, run_id)
        what = f" to request {asked['request_id']}" if asked is not None and asked["request_id"] else ""
        return f"run {run_id} waits for the user's answer{what}"
    return f"run {run_id} is {status.value}"


def fork_blockers(ledger: Ledger, conversation_id: str) -> list[str]:
    """Why the conversation cannot be forked now: each of its runs that is not
    terminal (pending, running, waiting on confirmation, reconciliation, an answer,
    a retry or a join), and each live child or delegated run under one of its runs."""
    ended = tuple(status.value for status in TERMINAL)
    blockers = []
    for run in ledger.all(
        "SELECT run_id, status FROM runs WHERE conversation_id = ? ORDER BY created_at", conversation_id
    ):
        if run["status"] not in ended:
            blockers.append(_live_reason(ledger, run))
        for child in ledger.all(
            "SELECT run_id, status, kind FROM runs WHERE root_run_id = ? AND run_id != ? AND status NOT IN (?, ?, ?)"
            " ORDER BY created_at",
            run["run_id"], run["run_id"], *ended,
        ):
            blockers.append(f"run {run['run_id']} has a live {child['kind']} run {child['run_id']}"
                            f" ({child['status']})")
    return blockers


def fork(ledger: Ledger, conversation_id: str) -> dict[str, Any]:
    """A new conversation with the turns persisted now; later turns of either stay apart.
    Refused while the conversation has a live run (V1.14): a fork copies no state of a
    task in flight, so it waits until that run (and what it started) has ended."""
    parent = get_conversation(ledger, conversation_id)
    blockers = fork_blockers(ledger, conversation_id)
    if blockers:
        raise SupervisorError(
            f"conversation {conversation_id} cannot be forked while it has a live run: {'; '.join(blockers[:5])}."
            " Answer, approve, reconcile or cancel it first, or wait for it to end.",
            code="conflict",
        )
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
        for message in turn.get("messages") or []:
            said = {"question": "You asked", "steer": "User added, mid-turn"}.get(message["kind"], "User answered")
            lines.append(f"{said}: {str(message['text'])[:2000]}")
        lines.append(f"You: {str(turn['reply'])[:2000]}")
    lines.append(f"User: {text}")
    return "\n".join(lines)

"""A structured question and its answer, and a person's steer, as messages of the owning conversation
(seed 004 V1.23: "问题消息使用稳定 messageId 幂等追加到 owning Agent Session", then the
answer "再幂等追加 user conversation").

Each message has a stable id derived from its request, so the transaction that
records the request (or the answer) appends it once however often it runs again;
the same id with another text is a conflict, never a second message. A run with
no conversation is its own session: its messages carry no conversation id. The
text is private like the conversation's turns: public records (events, receipts)
carry only the request's id, counts and digests (question_store.py).
Every function here joins the caller's transaction.
"""

from __future__ import annotations

import time
from typing import Any

from corral.supervisor.errors import SupervisorError
from corral.supervisor.ledger.port import Ledger


def message_id(request_id: str, kind: str) -> str:
    return f"msg-{request_id}-{kind}"


def question_text(questions: list[dict[str, Any]]) -> str:
    """The questions as the conversation shows them: each with its options."""
    lines: list[str] = []
    for question in questions:
        lines.append(f"[{question['header']}] {question['question']}")
        lines += [f"  {n}. {option['label']} - {option['description']}"
                  for n, option in enumerate(question.get("options") or [], start=1)]
    return "\n".join(lines)


def answer_text(questions: list[dict[str, Any]], answers: dict[str, str]) -> str:
    """The answers, each after its question's header, in the questions' order."""
    return "; ".join(f"{q['header']}: {answers[q['id']]}" for q in questions if q["id"] in answers)


def _append(ledger: Ledger, run: Any, request_id: str, kind: str, role: str, text: str) -> None:
    mid = message_id(request_id, kind)
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO conversation_messages (message_id, conversation_id, run_id, request_id, role, kind, text,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (mid, run["conversation_id"], run["run_id"], request_id, role, kind, text, time.time()),
        )
        kept = db.execute("SELECT text FROM conversation_messages WHERE message_id = ?", (mid,)).fetchone()
    if kept is None or kept["text"] != text:
        raise SupervisorError(f"message {mid} of run {run['run_id']} was recorded with another text", code="conflict")


def append_question(ledger: Ledger, run: Any, request_id: str, questions: list[dict[str, Any]]) -> None:
    _append(ledger, run, request_id, "question", "assistant", question_text(questions))


def append_answer(ledger: Ledger, run: Any, request_id: str, questions: list[dict[str, Any]],
                  answers: dict[str, str]) -> None:
    _append(ledger, run, request_id, "answer", "user", answer_text(questions, answers))


def append_steer(ledger: Ledger, run: Any, steer_id: str, text: str) -> None:
    """A person's steer of the running run, in the owning conversation once (seed 004
    V1.13: "conversation 使用由完整身份派生的确定性 messageId", exactly once), in the
    transaction that records the steer: later turns and forks see the correction."""
    _append(ledger, run, steer_id, "steer", "user", text)


def messages_of(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """The run's question and answer messages, in the order they were appended."""
    rows = ledger.all(
        "SELECT message_id, request_id, role, kind, text, created_at FROM conversation_messages WHERE run_id = ?"
        " ORDER BY created_at, kind DESC",
        run_id,
    )
    return [dict(row) for row in rows]

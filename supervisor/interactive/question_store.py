"""Structured questions to the user in the ledger (``user.input_request``, seed 004 V1.23).

* **Ask**: with its action executing, the tool records the request (its id derived
  from the action, the checked questions, whether free text is allowed), appends
  the question to the owning conversation and parks the run in ``needs-input`` in
  one transaction: no provider call until the answer.
  A replay (the agent or the supervisor restarted) finds the same request.
* **Answer**: names the request and a caller ``response_id`` (both required: an
  answer is never matched to whatever question is open now), and answers every
  question by id. One transaction records the answers, appends them to the owning
  conversation (conversation_log.py), finishes the question's action with them as
  its output (so the model sees them once, as the tool's observation) and resumes
  the run. Sending the same response again returns the
  same result and records nothing; another response after the answer is refused
  ("already answered").
* **Close**: a run that ends first fails the question's action; a late answer is refused.

Public records (events, the receipt, the run's reason) carry ids, counts and a
digest, never the questions' or answers' text; the text stays in this table and
in the run's private observation.
"""

from __future__ import annotations

import json
import time
from typing import Any

from corral.core import failpoints
from corral.core.redact import redact, redact_text
from corral.supervisor.errors import BadRequest, SupervisorError
from corral.supervisor.interactive import conversation_log
from corral.supervisor.interactive import question_shape as shape
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import action_store, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_feature import PlanRefusal, RunFeatures
from corral.supervisor.runs.run_state import TERMINAL, RunStatus

TOOL = "user.input_request"
#: Runs that may not ask: they report back to their parent instead (V1.23).
NON_ASKING_KINDS = ("child", "delegation")
CHILD_REFUSAL = (
    "user.input_request is for an agent talking to its user: an isolated child or a delegated specialist"
    " reports what it needs back to its parent (its result, or agent.message) instead"
)
SOLE_ACTION = "user.input_request must be the only action of its plan (and the plan has no final reply)"


def _now() -> float:
    return time.time()


def _questions_of(row: Any) -> tuple[list[dict[str, Any]], bool]:
    """The request's questions and whether free text is allowed. A request recorded
    before structured questions is read as one question."""
    if row["questions"]:
        stored = json.loads(row["questions"])
        return list(stored["questions"]), bool(stored["free_text"])
    labels = json.loads(row["options"])
    options = [{"label": label, "description": label} for label in labels]
    return [{"id": "answer", "header": "Question", "question": row["question"], "options": options}], not labels


def plan_guard(run: Any, loop: int, plan: dict[str, Any]) -> PlanRefusal | None:
    """A question is the plan's only action, with no final reply beside it."""
    actions = list(plan.get("actions") or [])
    asks = [a for a in actions if isinstance(a, dict) and a.get("tool") == TOOL]
    if asks and (len(actions) > 1 or plan.get("final") is not None):
        why = f"{SOLE_ACTION}: this plan has {len(actions)} action(s). Ask alone, then act on the answer."
        return PlanRefusal("batch-constraint", why, "question-not-alone")
    return None


def action_guard(run: Any, action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
    if tool == TOOL and run["kind"] in NON_ASKING_KINDS:
        return "block", CHILD_REFUSAL
    return "continue", ""


def ask(
    ledger: Ledger, run: Any, action_id: str, questions: Any, free_text: bool, features: RunFeatures
) -> dict[str, Any]:
    """From the tool, with its action executing: record the request and park the run."""
    existing = ledger.one("SELECT * FROM input_requests WHERE action_id = ?", action_id)
    if existing is not None:
        # A replay (the agent restarted): the create-once protocol again, which also
        # puts back the conversation's question message should it be missing.
        with ledger.tx():
            conversation_log.append_question(ledger, run, existing["request_id"], _questions_of(existing)[0])
        return {"parked": existing["answer"] is None, "request_id": existing["request_id"]}
    if run["kind"] in NON_ASKING_KINDS:
        raise BadRequest(CHILD_REFUSAL)
    action = action_store.get_action(ledger, action_id)
    if action["run_id"] != run["run_id"] or action["phase"] != ActionPhase.EXECUTING or action["tool"] != TOOL:
        raise SupervisorError(f"action {action_id} is not an executing question of run {run['run_id']}",
                              code="conflict")
    if len(action_store.actions_of(ledger, run["run_id"], int(action["loop_index"]))) != 1:
        raise BadRequest(SOLE_ACTION)
    checked = redact(shape.check_questions(questions))
    request_id = shape.request_id(run["run_id"], action_id, action["fingerprint"])
    headers = "; ".join(q["header"] for q in checked)
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO input_requests (action_id, run_id, question, options, created_at, request_id, questions)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (action_id, run["run_id"], headers, "[]", _now(), request_id,
             json.dumps({"questions": checked, "free_text": free_text})),
        )
        run_store.set_run_status(ledger, run["run_id"], RunStatus.NEEDS_INPUT, features,
                                 f"asks {len(checked)} question(s): request {request_id}")
        ledger.event("input-requested", run["run_id"], action=action_id, request=request_id,
                     questions=len(checked), options=sum(len(q["options"]) for q in checked))
        conversation_log.append_question(ledger, run, request_id, checked)
    ledger.failpoint("input.after-ask")
    return {"parked": True, "request_id": request_id}


def open_question(ledger: Ledger, run_id: str) -> Any:
    return ledger.one(
        "SELECT * FROM input_requests WHERE run_id = ? AND answer IS NULL ORDER BY created_at LIMIT 1", run_id
    )


def _request(ledger: Ledger, run_id: str, request_id: str) -> Any:
    """The request an answer names: never guessed from what is open now, so an
    answer sent again can only be a repeat of itself (seed 004 V1.23)."""
    row = ledger.one("SELECT * FROM input_requests WHERE request_id = ?", request_id)
    if row is None or row["run_id"] != run_id:
        raise SupervisorError(f"run {run_id} has no request {request_id!r}; see `corral pending`", code="not-found")
    return row


def answer(
    ledger: Ledger,
    run_id: str,
    features: RunFeatures,
    *,
    request_id: str,
    response_id: Any,
    answers: Any = None,
    text: Any = None,
) -> dict[str, Any]:
    """Record the answer once, finish the question's action with it, resume the run.
    ``text`` (no ``answers``) answers a one-question request. The caller's
    ``response_id`` makes it idempotent: the same response again returns the same
    result; another one after the answer is refused. In the same transaction the
    answer joins the owning conversation as its user message (once)."""
    run = run_store.get_run(ledger, run_id)
    row = _request(ledger, run_id, request_id)
    questions, free_text = _questions_of(row)
    given = shape.simple_answers(questions, text) if answers is None else answers
    checked = shape.check_answers(questions, given, free_text)
    digest = shape.answers_digest(checked)
    response_id = shape.check_response_id(response_id)
    result = {"run_id": run_id, "action_id": row["action_id"], "agent_id": run["agent_id"],
              "request_id": row["request_id"], "response_id": response_id}
    if row["answer"] is not None:
        if row["response_id"] == response_id:
            if row["answers"] is not None and shape.answers_digest(json.loads(row["answers"])) != digest:
                raise SupervisorError(f"response {response_id} was already sent with other answers", code="conflict")
            return {**result, "repeated": True}  # the same response again: nothing new
        raise SupervisorError(f"the question of run {run_id} was already answered", code="conflict")
    if RunStatus(run["status"]) in TERMINAL:
        raise SupervisorError(f"run {run_id} is {run['status']} and takes no answer; start a new run", code="conflict")
    stored = {qid: redact_text(value) for qid, value in checked.items()}
    with ledger.tx() as db:
        changed = db.execute(
            "UPDATE input_requests SET answer = ?, answers = ?, response_id = ?, answered_at = ?"
            " WHERE action_id = ? AND answer IS NULL",
            ("; ".join(f"{k}={v}" for k, v in stored.items()), json.dumps(stored), response_id, _now(),
             row["action_id"]),
        ).rowcount
        if changed != 1:
            raise SupervisorError(f"the question of run {run_id} was already answered", code="conflict")
        output = {
            "request_id": row["request_id"],
            "answers": [{"id": q["id"], "question": q["question"], "answer": stored[q["id"]]} for q in questions],
        }
        # Terminal with its receipt (and so the one observation) in this transaction.
        action_store.finish_action(ledger, row["action_id"], True, output,
                                   f"answered {len(stored)} question(s) of {row['request_id']}", None, features)
        if RunStatus(run["status"]) is RunStatus.NEEDS_INPUT:
            run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, features, "answered")
        conversation_log.append_answer(ledger, run, row["request_id"], questions, stored)
        ledger.event("input-answered", run_id, action=row["action_id"], request=row["request_id"],
                     response=response_id, answers=len(stored), sha256=digest)
        failpoints.hit("input.mid-answer")  # inside the transaction: a kill here commits none of it
    ledger.failpoint("input.after-answer")
    return result


def close_questions(
    ledger: Ledger, run_id: str, status: RunStatus, reason: str | None, features: RunFeatures
) -> None:
    """A run that ends (cancelled, failed) closes its open question: its action fails
    with the reason, and a late answer is refused."""
    if status not in TERMINAL:
        return
    for row in ledger.all("SELECT action_id FROM input_requests WHERE run_id = ? AND answer IS NULL", run_id):
        action = action_store.get_action(ledger, row["action_id"])
        if action["phase"] == ActionPhase.EXECUTING:
            why = f"the run ended ({status.value}) before the question was answered"
            action_store.move_action(ledger, row["action_id"], ActionPhase.FAILED, reason=why, error=why)
            action_store.write_receipt(ledger, row["action_id"], features)


def pending_questions(ledger: Ledger) -> list[dict[str, Any]]:
    """The open requests of runs waiting for input, as ``render_question`` shows them."""
    rows = ledger.all(
        "SELECT q.*, r.agent_id FROM input_requests q JOIN runs r ON r.run_id = q.run_id"
        " WHERE q.answer IS NULL AND r.status = 'needs-input' ORDER BY q.created_at"
    )
    pending = []
    for row in rows:
        questions, free_text = _questions_of(row)
        pending.append({
            "request_id": row["request_id"],
            "run_id": row["run_id"],
            "agent_id": row["agent_id"],
            "action_id": row["action_id"],
            "created_at": row["created_at"],
            "questions": questions,
            "free_text": free_text,
        })
    return pending

"""Structured questions on the supervisor: ``answer`` (control), ``input.request``
(the tool's actor method), the sole-action plan guard, the child denial, and the
``questions`` section of ``corral pending``. The ledger side is question_store.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.mailbox.protocol import Ack, InputRequest
from corral.supervisor.errors import BadRequest
from corral.supervisor.interactive import question_store as questions
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.params import param_text
from corral.supervisor.runs.run_feature import PlanRefusal, RunFeature, RunFeatures
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.tree.supervision_tree import ActorSlot

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor


class QuestionService:
    def __init__(self, ledger: Ledger, runs: RunService) -> None:
        self.ledger = ledger
        self.runs = runs

    async def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        """``corral answer RUN --request REQ [--response-id ID] (--answer QID=LABEL ... | TEXT)``:
        the request and the caller's stable response id are required (seed 004 V1.23:
        "回答必须带 requestId、全量 answers map 和客户端稳定 responseId"), so the same answer
        sent again is a repeat, never the answer to whatever question is open next."""
        run_id = param_text(params, "run_id", None, limit=300)
        request_id, response_id = required_ids(params)
        if params.get("answers") is None and params.get("text") is None:
            raise BadRequest("give the answers (a map of question id to answer) or, for one question, its text")
        reply = questions.answer(
            self.ledger,
            run_id,
            self.runs.features,
            request_id=request_id,
            response_id=response_id,
            answers=params.get("answers"),
            text=params.get("text"),
        )
        await self.runs.wake(reply["agent_id"])
        return reply

    async def ask(self, slot: ActorSlot, request: InputRequest) -> Ack:
        """From ``user.input_request``, its action executing."""
        run = self.runs.run_of(slot, request.run_id)
        # Seed 004 V1.23: free input is always allowed (a spec saying otherwise is refused at load).
        questions.ask(self.ledger, run, request.action_id, request.questions, True, self.runs.features)
        return Ack()


def required_ids(params: dict[str, Any]) -> tuple[str, Any]:
    """An answer's ``request_id`` and ``response_id``, both required."""
    if params.get("request_id") is None:
        raise BadRequest("an answer names its request: request_id (the req-... id `corral pending` shows);"
                         " it is never taken from whichever question is open now")
    if params.get("response_id") is None:
        raise BadRequest("an answer carries the caller's response_id, stable across retries (the same response"
                         " sent again is then a repeat)")
    return param_text(params, "request_id", None, limit=100), params["response_id"]


class QuestionFeature(RunFeature):
    """Structured questions in runs: a run's end closes its open ones, a plan or an
    action that waits on an answer is refused, ``pending`` lists the open ones."""

    def __init__(self, ledger: Ledger, features: RunFeatures) -> None:
        self.ledger = ledger
        #: The supervisor's features (this one among them): closing a question writes
        #: its action's receipt, which each of them sees.
        self.features = features

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        questions.close_questions(ledger, run_id, status, reason, self.features)

    def plan_guard(self, run: Any, loop: int, plan: dict[str, Any]) -> str | PlanRefusal | None:
        return questions.plan_guard(run, loop, plan)

    def action_guard(self, run: Any, action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        return questions.action_guard(run, action_id, tool, tool_input)

    def pending(self) -> Mapping[str, Any]:
        return {"questions": questions.pending_questions(self.ledger)}


def install(sup: Supervisor) -> QuestionService:
    service = QuestionService(sup.ledger, sup.runs)
    sup.control_methods["answer"] = service.answer
    sup.methods.questions = service
    return service

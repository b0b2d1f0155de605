"""Interactive runs on the supervisor: steer, answer, conversations (chat) and forks.

The ledger side is supervisor/interactive/interactive_store.py; this layer adds the control and
actor methods, wakes the agents, and hooks steers into the step boundary and
the final reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.supervisor.errors import BadRequest, NotFound, SupervisorError
from corral.supervisor.interactive import interactive_store as interactive
from corral.supervisor.interactive import question_service, question_store, steer_store, turn_report
from corral.supervisor.interactive.steer_control import SteerControl
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.params import param_text
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import RunStatus

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor


#: A chat line (a steer made of it is capped again, at 4 KiB of UTF-8).
MAX_LINE_CHARS = 8000


def _run_id(params: dict[str, Any]) -> str:
    return param_text(params, "run_id", None, limit=300)


class InteractiveService:
    def __init__(self, ledger: Ledger, runs: RunService) -> None:
        self.ledger = ledger
        #: Wakes the agents a steer or an answer concerns; starts a chat's next turn.
        self.runs = runs
        #: Records steers, interrupts the provider turn they make stale.
        self.steers = SteerControl(ledger, runs)

    async def steer(self, params: dict[str, Any]) -> dict[str, Any]:
        """``corral steer RUN --stdin [--steer-id ID]``: recorded (committed) before the
        answer; a provider turn in flight is interrupted (steer_control.py). Refused
        while the run waits for the answer to its question (seed 004 V1.23: the
        answer goes only through the request); a goal's edit is not a user steer."""
        run_id = _run_id(params)
        steer_id = params.get("steer_id")
        retried = isinstance(steer_id, str) and self.ledger.one(
            "SELECT 1 FROM steers WHERE steer_id = ?", steer_id) is not None
        question = None if retried else question_store.open_question(self.ledger, run_id)
        if question is not None:
            raise SupervisorError(
                f"run {run_id} waits for the answer to request {question['request_id']}; a steer is refused"
                f" until it is answered: corral answer {run_id} TEXT --request {question['request_id']} (or"
                " --answer QID=ANSWER per question)", code="conflict")
        return await self.steers.steer(run_id, params.get("text"), steer_id)

    async def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        """A chat line that answers the one-question request the chat showed: it names
        that request and carries the chat's stable response id (question_store.py;
        ``corral answer`` names each question)."""
        request_id, response_id = question_service.required_ids(params)
        reply = question_store.answer(self.ledger, _run_id(params), self.runs.features, request_id=request_id,
                                      response_id=response_id, text=params.get("text"))
        await self.runs.wake(reply["agent_id"])
        return reply

    # -- conversations ---------------------------------------------------------------

    async def conversation_new(self, params: dict[str, Any]) -> dict[str, Any]:
        # No agent named (`corral chat`): the spec's root agent, if it has just one.
        named = None if params.get("agent_id") is None else param_text(params, "agent_id", None, limit=64)
        agent = self.runs.agent_spec(named)
        return {"conversation_id": interactive.new_conversation(self.ledger, agent.id), "agent_id": agent.id}

    def live_run(self, conversation_id: str) -> Any:
        return self.ledger.one(
            "SELECT run_id, status, agent_id FROM runs WHERE conversation_id = ? AND status NOT IN"
            " ('completed', 'failed', 'cancelled') ORDER BY created_at DESC LIMIT 1",
            conversation_id,
        )

    async def conversation_send(self, params: dict[str, Any]) -> dict[str, Any]:
        """One line of a chat: the answer to an open question, a steer of the live
        run, or else the next turn (a new run that sees the earlier turns)."""
        conversation = interactive.get_conversation(self.ledger, params.get("conversation_id"))
        text = param_text(params, "text", None, limit=MAX_LINE_CHARS)
        live = self.live_run(conversation["conversation_id"])
        # A run waiting for a person waits for an answer only if it asked a question:
        # a paused goal or missing completion evidence takes the line as a steer.
        question = (question_store.open_question(self.ledger, live["run_id"])
                    if live is not None and live["status"] == RunStatus.NEEDS_INPUT else None)
        as_goal = params.get("goal", False)
        if not isinstance(as_goal, bool):
            raise BadRequest("goal must be true or false")
        if as_goal and live is not None:
            raise SupervisorError(
                f"run {live['run_id']} of this conversation is live ({live['status']}): a goal starts the next"
                " turn; steer the live run, or /goal edit its goal", code="conflict")
        if params.get("request_id") is not None:
            # The answer to the request the chat showed, sent again after it applied
            # too (a repeat): never a steer, never the answer to a later question.
            request_id = param_text(params, "request_id", None, limit=100)
            asked = self.ledger.one(
                "SELECT q.run_id FROM input_requests q JOIN runs r ON r.run_id = q.run_id"
                " WHERE q.request_id = ? AND r.conversation_id = ?", request_id, conversation["conversation_id"])
            if asked is None:
                raise NotFound(f"conversation {conversation['conversation_id']} has no request {request_id!r}")
            return {"as": "answer", **await self.answer({**params, "run_id": asked["run_id"], "text": text})}
        if live is not None and question is not None:
            raise SupervisorError(
                f"run {live['run_id']} waits for the answer to request {question['request_id']}: send the line"
                " naming that request (request_id) and a response_id, as the chat does once it has shown the"
                f" question, or: corral answer {live['run_id']} --request {question['request_id']} TEXT",
                code="conflict")
        if live is not None:
            return {"as": "steer", **await self.steer({"run_id": live["run_id"], "text": text})}
        task = interactive.conversation_task(self.ledger, conversation["conversation_id"], text)
        created = await self.runs.create(
            {
                "agent_id": conversation["agent_id"],
                "task": task,
                "conversation_id": conversation["conversation_id"],
                **({"script": params["script"]} if "script" in params else {}),
                **({"goal": text} if as_goal else {}),
            }
        )
        return {"as": "run", **created}

    async def conversation_show(self, params: dict[str, Any]) -> dict[str, Any]:
        conversation = interactive.get_conversation(self.ledger, params.get("conversation_id"))
        live = self.live_run(conversation["conversation_id"])
        return {
            "conversation": dict(conversation),
            "turns": interactive.turns(self.ledger, conversation["conversation_id"]),
            "live_run": dict(live) if live is not None else None,
            # Every run under the conversation's own turns (its delegations and
            # isolated children): the chat shows their events and their approvals
            # too (seed 004 V1.15: "按 Agent / run / event…委派来源、父 Agent、delegationId、动态 child").
            "tree": [dict(row) for row in self.ledger.all(
                "SELECT run_id, agent_id, parent_run_id, kind, status FROM runs WHERE root_run_id IN"
                " (SELECT run_id FROM runs WHERE conversation_id = ?) ORDER BY created_at",
                conversation["conversation_id"])],
        }

    async def conversation_list(self, params: dict[str, Any]) -> dict[str, Any]:
        rows = self.ledger.all("SELECT * FROM conversations ORDER BY created_at DESC LIMIT 100")
        return {"conversations": [dict(row) for row in rows]}

    async def fork(self, params: dict[str, Any]) -> dict[str, Any]:
        return interactive.fork(self.ledger, str(params.get("conversation_id")))

    # -- views -----------------------------------------------------------------------

    def show_section(self, run_id: str) -> dict[str, Any]:
        steers = steer_store.steers_of(self.ledger, run_id)
        questions = self.ledger.all(
            "SELECT action_id, question, options, answer, created_at, answered_at FROM input_requests"
            " WHERE run_id = ? ORDER BY created_at",
            run_id,
        )
        run = self.ledger.one("SELECT conversation_id FROM runs WHERE run_id = ?", run_id)
        return {
            "conversation_id": run["conversation_id"] if run is not None else None,
            "steers": steers,
            "questions": [dict(row) for row in questions],
        }


class SteerFeature(RunFeature):
    """A person's steers in runs: applied at the step boundary, and held before a
    final reply or a provider turn while one waits; ``show`` lists them."""

    def __init__(self, service: InteractiveService) -> None:
        self.service = service

    def at_boundary(self, ledger: Ledger, run_id: str) -> None:
        steer_store.apply_steers(ledger, run_id, self.service.runs.features)

    def final_guard(self, ledger: Ledger, run_id: str) -> str | None:
        return steer_store.steer_blocks_final(ledger, run_id)

    def provider_guard(self, ledger: Ledger, run_id: str) -> str | None:
        return steer_store.steer_holds_provider(ledger, run_id)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"interactive": self.service.show_section(run_id)}


def install(sup: Supervisor) -> InteractiveService:
    service = InteractiveService(sup.ledger, sup.runs)
    sup.control_methods.update(
        {
            "steer": service.steer,
            "conversation.new": service.conversation_new,
            "conversation.send": service.conversation_send,
            "conversation.show": service.conversation_show,
            "conversation.list": service.conversation_list,
            "conversation.fork": service.fork,
            "conversation.turn_report": turn_report.TurnReports(sup.ledger).turn_report,
        }
    )
    sup.methods.steers = service.steers
    return service

"""Interactive runs on the supervisor: steer, answer, conversations (chat) and forks.

The ledger side is supervisor/interactive/interactive_store.py; this layer adds the control and
actor methods, wakes the agents, and hooks steers into the step boundary and
the final reply.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from corral.core.redact import redact_text
from corral.supervisor.errors import BadRequest
from corral.supervisor.interactive import interactive_store as interactive
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.params import param_text
from corral.supervisor.runs import run_store
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.tree.supervision_tree import ActorSlot

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor


def _run_id(params: dict[str, Any]) -> str:
    return param_text(params, "run_id", None, limit=300)


#: Templates that may put a run's final-reply text on the event stream.
STREAMING_TEMPLATES = ("agent", "child", "model")
MAX_DELTA_CHARS = 8000
#: Progress reports kept (the newest per run, in memory): the oldest run's goes first.
MAX_PROGRESS_RUNS = 256
MAX_PROGRESS_QUERY = 100


class InteractiveService:
    def __init__(self, ledger: Ledger, runs: RunService) -> None:
        self.ledger = ledger
        #: Wakes the agents a steer or an answer concerns; starts a chat's next turn.
        self.runs = runs
        #: run -> the provider slot whose reply text was streamed last.
        self.streaming: dict[str, str] = {}
        #: run -> the newest progress report of its provider (tokens so far while a
        #: model generates). A view of now: never written to the ledger, so a long
        #: generation adds no row, and a restarted supervisor simply has none.
        self.progress: dict[str, dict[str, Any]] = {}

    async def steer(self, params: dict[str, Any]) -> dict[str, Any]:
        """``corral steer RUN TEXT``: recorded (committed) before the answer."""
        reply = interactive.record_steer(self.ledger, _run_id(params), params.get("text"))
        await self.runs.wake_run(reply["run_id"])
        return reply

    async def answer(self, params: dict[str, Any]) -> dict[str, Any]:
        """``corral answer RUN TEXT``: the run's open question, answered once."""
        reply = interactive.answer(self.ledger, _run_id(params), params.get("text"))
        await self.runs.wake(reply["agent_id"])
        return reply

    async def ask(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        """From ``user.input_request``, its action executing."""
        run = self.runs.owned_run(slot, params)
        action_id = params.get("action_id")
        if not isinstance(action_id, str):
            raise BadRequest("action_id must be a string")
        return interactive.ask(self.ledger, run, action_id, params.get("question"), params.get("options"))

    async def reply_delta(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        """Final-reply text as it is generated, onto the event stream. A lifecycle
        that starts over (a retry after a cut or a kill) is marked, so a reader
        drops what it showed instead of seeing the text twice."""
        if slot.spec.template not in STREAMING_TEMPLATES:
            raise BadRequest(f"actor {slot.id} does not stream replies")
        run_id = _run_id(params)
        run = run_store.get_run(self.ledger, run_id)
        if slot.spec.template != "model" and run["agent_id"] != slot.spec.params.get("agent_id", slot.id):
            raise BadRequest(f"run {run_id} is not driven by {slot.id}")
        provider_slot = param_text(params, "slot", None, limit=300)
        if "tokens" in params:
            return self._progress_report(run_id, provider_slot, params)
        text = params.get("text")
        seq = params.get("seq")
        if not isinstance(text, str) or len(text) > MAX_DELTA_CHARS or not isinstance(seq, int):
            raise BadRequest(f"text must be a string of at most {MAX_DELTA_CHARS} characters, seq an integer")
        previous = self.streaming.get(run_id)
        if previous is None:
            last = self.ledger.one(
                "SELECT data FROM events WHERE kind = 'reply-delta' AND subject = ? ORDER BY cursor DESC LIMIT 1",
                run_id,
            )
            previous = json.loads(last["data"]).get("slot") if last is not None else None
        with self.ledger.tx(fsync=False):
            if previous is not None and previous != provider_slot:
                self.ledger.event("reply-stream-restart", run_id, previous=previous, slot=provider_slot)
            self.ledger.event("reply-delta", run_id, slot=provider_slot, seq=seq, text=redact_text(text))
        self.streaming[run_id] = provider_slot
        return {}

    def _progress_report(self, run_id: str, provider_slot: str, params: dict[str, Any]) -> dict[str, Any]:
        tokens = params.get("tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 <= tokens <= 10**9:
            raise BadRequest("tokens must be an integer in [0, 10**9]")
        now = time.time()
        previous = self.progress.pop(run_id, None)
        first = previous if previous is not None and previous["slot"] == provider_slot else None
        self.progress[run_id] = {
            "slot": provider_slot,
            "tokens": tokens,
            "at": now,
            # The first report of this lifecycle: tokens/s is measured from it.
            "first_at": first["first_at"] if first is not None else now,
            "first_tokens": first["first_tokens"] if first is not None else tokens,
        }
        while len(self.progress) > MAX_PROGRESS_RUNS:
            self.progress.pop(next(iter(self.progress)))
        return {}

    async def progress_view(self, params: dict[str, Any]) -> dict[str, Any]:
        """``progress``: the newest provider progress report of each of ``run_ids``
        that has one (runs that generate nothing, or ended long ago, have none)."""
        run_ids = params.get("run_ids")
        if (
            not isinstance(run_ids, list)
            or len(run_ids) > MAX_PROGRESS_QUERY
            or not all(isinstance(run_id, str) for run_id in run_ids)
        ):
            raise BadRequest(f"run_ids must be a list of at most {MAX_PROGRESS_QUERY} run ids")
        return {"progress": {run_id: self.progress[run_id] for run_id in run_ids if run_id in self.progress}}

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
        text = param_text(params, "text", None, limit=interactive.MAX_STEER_CHARS)
        live = self.live_run(conversation["conversation_id"])
        if live is not None and live["status"] == RunStatus.NEEDS_INPUT:
            return {"as": "answer", **await self.answer({"run_id": live["run_id"], "text": text})}
        if live is not None:
            return {"as": "steer", **await self.steer({"run_id": live["run_id"], "text": text})}
        task = interactive.conversation_task(self.ledger, conversation["conversation_id"], text)
        created = await self.runs.create(
            {
                "agent_id": conversation["agent_id"],
                "task": task,
                "conversation_id": conversation["conversation_id"],
                **({"script": params["script"]} if "script" in params else {}),
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
        }

    async def conversation_list(self, params: dict[str, Any]) -> dict[str, Any]:
        rows = self.ledger.all("SELECT * FROM conversations ORDER BY created_at DESC LIMIT 100")
        return {"conversations": [dict(row) for row in rows]}

    async def fork(self, params: dict[str, Any]) -> dict[str, Any]:
        return interactive.fork(self.ledger, str(params.get("conversation_id")))

    # -- views -----------------------------------------------------------------------

    def show_section(self, run_id: str) -> dict[str, Any]:
        steers = self.ledger.all(
            "SELECT steer_id, text, created_at, applied_loop, applied_at FROM steers WHERE run_id = ?"
            " ORDER BY created_at",
            run_id,
        )
        questions = self.ledger.all(
            "SELECT action_id, question, options, answer, created_at, answered_at FROM input_requests"
            " WHERE run_id = ? ORDER BY created_at",
            run_id,
        )
        run = self.ledger.one("SELECT conversation_id FROM runs WHERE run_id = ?", run_id)
        return {
            "conversation_id": run["conversation_id"] if run is not None else None,
            "steers": [dict(row) for row in steers],
            "questions": [dict(row) for row in questions],
        }


def _close_questions(ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
    if status in TERMINAL:
        interactive.close_questions(ledger, run_id, status, reason)


def install(sup: Supervisor) -> InteractiveService:
    service = InteractiveService(sup.ledger, sup.runs)
    sup.control_methods.update(
        {
            "steer": service.steer,
            "answer": service.answer,
            "conversation.new": service.conversation_new,
            "conversation.send": service.conversation_send,
            "conversation.show": service.conversation_show,
            "conversation.list": service.conversation_list,
            "conversation.fork": service.fork,
            "progress": service.progress_view,
        }
    )
    sup.actor_methods["input.request"] = service.ask
    sup.actor_methods["reply.delta"] = service.reply_delta
    hooks = sup.hooks
    hooks.boundary.append(interactive.apply_steers)
    hooks.on_status.append(_close_questions)
    hooks.final_guards.append(interactive.steer_blocks_final)
    hooks.show_sections["interactive"] = service.show_section
    ledger = sup.ledger
    hooks.pending_sections["questions"] = lambda: interactive.pending_questions(ledger)
    return service

"""Local models on the supervisor: model actors' readiness, and the generation relay.

Each model of the spec (supervisor/models/model_spec.py) is a ``model`` actor of its own
group, supervised like any other: it restarts per its policy and dies with the
supervisor. Once loaded it reports ``model.ready``. An agent's ``local`` provider
asks for a generation with ``model.generate``; this service waits until the
model's current incarnation is ready (a restart is waited out, up to the model's
startup timeout) and relays the request. A generation has no effect outside
corral, so every failure here is an answer the provider can retry durably.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from corral.core.redact import summarize
from corral.mailbox.errors import ChannelClosed, DeadlineExceeded, MailboxFull, RemoteError
from corral.mailbox.protocol import Ack, Code, Generation, ModelFailed, ModelGenerate, ModelReady
from corral.supervisor.errors import BadRequest, NotFound, SupervisorError
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.models.model_spec import LocalModelSpec
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.service_part import ServicePart
from corral.supervisor.tree.actor_state import ActorState
from corral.supervisor.tree.readiness import ReportedReadiness
from corral.supervisor.tree.supervision_tree import ActorSlot, SupervisionTree

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

log = logging.getLogger("corral.model")

#: Bounds on what an agent may ask for: a request is JSON of messages and a schema
#: (the record's own bounds, on messages and tokens: mailbox/protocol/models.py).
MAX_REQUEST_CHARS = 1_000_000
#: The actor's own deadline is the request's; this is time for its answer to arrive.
RELAY_SLACK_S = 5.0
#: Templates whose actors run providers.
AGENT_TEMPLATES = ("agent", "child")


@dataclass
class ModelState(ReportedReadiness):
    spec: LocalModelSpec
    incarnation: int = -1
    load_s: float = 0.0
    error: str = ""
    readies: int = 0
    requests: int = 0
    failures: int = 0
    #: Token-count requests (context compaction) answered by the model's tokenizer.
    token_counts: int = 0
    changed: trio.Event = field(default_factory=trio.Event)


class ModelService:
    def __init__(self, ledger: Ledger, tree: SupervisionTree, models: Iterable[LocalModelSpec]) -> None:
        self.ledger = ledger
        #: The model actors: their slots, and the relay of a request to one.
        self.tree = tree
        self.models: dict[str, ModelState] = {spec.id: ModelState(spec) for spec in models}

    def _slot(self, model: str) -> ActorSlot | None:
        return self.tree.slots.get(self.models[model].spec.actor_id)

    def is_ready(self, model: str) -> bool:
        return self.models[model].ready_in(self._slot(model))

    def status_of(self, model: str) -> str:
        slot = self._slot(model)
        if self.is_ready(model):
            return "ready"
        if slot is None or slot.state in (ActorState.ESCALATED, ActorState.STOPPED):
            return "failed" if self.models[model].error else "stopped"
        return "loading" if slot.restarts == 0 else "restarting"

    def _own_model(self, slot: ActorSlot, model: str) -> ModelState:
        state = self.models.get(model)
        if state is None or state.spec.actor_id != slot.id:
            raise BadRequest(f"actor {slot.id} does not serve model {model!r}")
        return state

    async def ready(self, slot: ActorSlot, request: ModelReady) -> Ack:
        state = self._own_model(slot, request.model)
        state.load_s = request.load_s
        state.incarnation, state.error = slot.incarnation, ""
        state.readies += 1
        with self.ledger.tx(fsync=False):
            self.ledger.event("model-ready", state.spec.id, load_s=state.load_s, incarnation=slot.incarnation)
        log.info("model %s ready (loaded in %.2f s)", state.spec.id, state.load_s)
        state.notify()
        return Ack()

    async def failed(self, slot: ActorSlot, request: ModelFailed) -> Ack:
        state = self._own_model(slot, request.model)
        state.error = summarize(request.error, 500)
        state.failures += 1
        with self.ledger.tx(fsync=False):
            self.ledger.event("model-failed", state.spec.id, error=state.error)
        state.notify()
        return Ack()

    def _checked_request(self, request: ModelGenerate) -> tuple[ModelState, dict[str, Any], float]:
        """The relay's body; the record checked each field's shape and range already."""
        if request.model not in self.models:
            known = ", ".join(sorted(self.models)) or "none is declared"
            raise NotFound(f"no local model {request.model!r} (models: {known})")
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        if len(json.dumps(messages)) + len(json.dumps(request.schema)) > MAX_REQUEST_CHARS:
            raise BadRequest(f"the request is over {MAX_REQUEST_CHARS} characters")
        body: dict[str, Any] = {
            "op": "generate",
            "messages": messages,
            "schema": request.schema,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "repeat_penalty": request.repeat_penalty,
            "seed": request.seed,
        }
        if request.stream is not None:
            body["stream"] = {"run_id": request.stream.run_id[:200], "slot": request.stream.slot[:300]}
        return self.models[request.model], body, request.timeout_s

    async def generate(self, slot: ActorSlot, request: ModelGenerate) -> Generation:
        """From an agent's ``local`` provider: one generation, relayed to the model,
        its answer checked into the reply record here, once."""
        if slot.spec.template not in AGENT_TEMPLATES:
            raise BadRequest(f"actor {slot.id} ({slot.spec.template}) does not run a provider")
        state, body, timeout = self._checked_request(request)
        model = state.spec.id
        if not await state.wait_ready(lambda: self._slot(model), trio.current_time() + state.spec.startup_timeout_s):
            why = state.error or f"not ready within {state.spec.startup_timeout_s:g} s"
            raise SupervisorError(f"model {model} is {self.status_of(model)}: {why}", code=Code.MODEL_UNAVAILABLE)
        state.requests += 1
        try:
            answer = await self.tree.request(state.spec.actor_id, body, timeout + RELAY_SLACK_S)
            return msgspec.convert(answer, Generation)
        except msgspec.ValidationError as exc:
            # The model actor is this code too: a bug, named, and no generation to keep.
            raise SupervisorError(f"the model's answer is malformed: {exc}", code=Code.MODEL_FAILED) from None
        except RemoteError as exc:
            if exc.code == "context-full":
                raise SupervisorError(exc.message, code="context-full") from None
            raise SupervisorError(f"{exc.code}: {exc.message}", code=Code.MODEL_FAILED) from None
        except DeadlineExceeded:
            raise SupervisorError(f"no answer within {timeout:g} s", code=Code.MODEL_TIMEOUT) from None
        except (ChannelClosed, MailboxFull, KeyError) as exc:
            # The actor died mid-generation (or is restarting): nothing happened that
            # a new request would repeat.
            state.failures += 1
            raise SupervisorError(
                f"the model's actor went away mid-generation ({type(exc).__name__})", code=Code.MODEL_UNAVAILABLE
            ) from None

    async def count_tokens(self, model: str, texts: list[str]) -> list[int] | None:
        """Counts by the model's own tokenizer, or None when its actor is not ready
        (the caller falls back to the documented estimate)."""
        state = self.models.get(model)
        if state is None or not self.is_ready(model) or len(texts) > MAX_COUNT_TEXTS:
            return None
        try:
            reply = await self.tree.request(state.spec.actor_id, {"op": "count_tokens", "texts": texts}, 30.0)
        except (RemoteError, DeadlineExceeded, ChannelClosed, MailboxFull, KeyError):
            return None
        counts = reply.get("counts")
        if not isinstance(counts, list) or len(counts) != len(texts):
            return None
        state.token_counts += 1
        return [int(n) for n in counts]

    async def count_tokens_control(self, params: dict[str, Any]) -> dict[str, Any]:
        """``model.count_tokens``: what compaction counts with, for a person to check."""
        model, texts = params.get("model"), params.get("texts")
        if not isinstance(model, str) or model not in self.models:
            raise NotFound(f"no local model {model!r}")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts) or len(texts) > MAX_COUNT_TEXTS:
            raise BadRequest(f"texts must be a list of at most {MAX_COUNT_TEXTS} strings")
        counts = await self.count_tokens(model, texts)
        if counts is None:
            raise SupervisorError(f"model {model} is {self.status_of(model)}", code=Code.MODEL_UNAVAILABLE)
        return {"counts": counts}

    # -- views ----------------------------------------------------------------------

    def status_section(self) -> list[dict[str, Any]]:
        out = []
        for model, state in self.models.items():
            slot = self._slot(model)
            out.append(
                {
                    "id": model,
                    "status": self.status_of(model),
                    "actor": state.spec.actor_id,
                    "file": state.spec.path,
                    "load_s": state.load_s,
                    "requests": state.requests,
                    "token_counts": state.token_counts,
                    "restarts": slot.restarts if slot is not None else 0,
                    "error": state.error,
                }
            )
        return out


def usage_of_run(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """Tokens and model time of a run's answered provider requests, from the
    committed responses (any Chat Completions body with ``usage`` counts), and its
    format repairs (answers that did not parse into a plan)."""
    from corral.actors.providers.base import RepairCategory

    usage: dict[str, Any] = {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "model_ms": 0.0}
    for row in ledger.all(
        "SELECT response FROM provider_requests WHERE run_id = ? AND response IS NOT NULL", run_id
    ):
        usage["requests"] += 1
        try:
            body = json.loads(row["response"])
        except ValueError:
            continue
        counts = body.get("usage") if isinstance(body, dict) else None
        if isinstance(counts, dict):
            for key in ("prompt_tokens", "completion_tokens"):
                value = counts.get(key)
                usage[key] += value if isinstance(value, int) else 0
        timings = body.get("timings") if isinstance(body, dict) else None
        if isinstance(timings, dict) and isinstance(timings.get("model_ms"), int | float):
            usage["model_ms"] = round(usage["model_ms"] + timings["model_ms"], 3)
    run = ledger.one("SELECT repairs FROM runs WHERE run_id = ?", run_id)
    repairs: dict[str, int] = json.loads(run["repairs"]) if run is not None else {}
    formats = {category.value for category in RepairCategory}
    usage["format_repairs"] = sum(n for category, n in repairs.items() if category in formats)
    return usage


#: At most this many texts per count request.
MAX_COUNT_TEXTS = 2000


class UsageFeature(RunFeature):
    """``show`` of a run: what its provider calls used (tokens, by model)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"usage": usage_of_run(self.ledger, run_id)}


class ModelPart(ServicePart):
    """Local models' section of ``corral status``."""

    status_name = "models"

    def __init__(self, service: ModelService) -> None:
        self.service = service

    def status(self) -> Any:
        return self.service.status_section()


def service_part(service: ModelService) -> ModelPart | None:
    return ModelPart(service) if service.models else None


def install(sup: Supervisor) -> ModelService:
    service = ModelService(sup.ledger, sup.tree, sup.spec.models)
    if service.models:
        sup.methods.models = service
        sup.control_methods["model.count_tokens"] = service.count_tokens_control
    return service

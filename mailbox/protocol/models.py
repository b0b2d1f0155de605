"""Local models (supervisor/models/model_service.py): a model actor's readiness,
and an agent's ``local`` provider asking for one generation.

Bounds are the ones the handler checked by hand before these records.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from corral.mailbox.protocol.base import Ack, Method, Request

ModelId = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
MAX_MESSAGES = 400
MAX_TOKENS = 32_768


class TokenUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int


class GenerationTimings(msgspec.Struct, kw_only=True):
    """What the generation took (llama.cpp server's ``timings``), in the provider's meta."""

    model_ms: float
    ttft_ms: float
    tokens_per_s: float


class Generation(msgspec.Struct, kw_only=True):
    """``model.generate``'s reply: a Chat Completions body (actors/model_actor.py
    ``generate``), committed whole as the provider's response. ``choices`` are
    llama.cpp's own, relayed as it made them."""

    id: str
    object: str
    model: str
    choices: list[dict[str, Any]]
    usage: TokenUsage
    timings: GenerationTimings


class ModelReady(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``model.ready``: the model actor's model is loaded (this incarnation)."""

    METHOD: ClassVar[Method] = Method.MODEL_READY
    model: ModelId
    load_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    n_ctx: Annotated[int, msgspec.Meta(ge=0)] | None = None


class ModelFailed(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``model.failed``: the model could not load (summarized to 500 characters there)."""

    METHOD: ClassVar[Method] = Method.MODEL_FAILED
    model: ModelId
    error: Annotated[str, msgspec.Meta(max_length=100_000)] = "failed"


class ChatMessage(msgspec.Struct, frozen=True):
    """One chat message; other keys a provider's history carries are left out."""

    content: str
    role: Annotated[str, msgspec.Meta(max_length=40)] = "user"


class ReplyStream(msgspec.Struct, frozen=True):
    """Where the final reply's text streams as it is generated (``reply.delta``)."""

    run_id: str
    slot: str


class ModelGenerate(Request[Generation], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``model.generate``: one generation by a local model, relayed to its actor."""

    METHOD: ClassVar[Method] = Method.MODEL_GENERATE
    model: ModelId
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    #: The JSON Schema the reply is constrained to (a grammar).
    schema: dict[str, Any]
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS)]
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] = 0.0
    repeat_penalty: Annotated[float, msgspec.Meta(ge=0.5, le=2)] = 1.0
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] = 0
    timeout_s: Annotated[float, msgspec.Meta(ge=0.1, le=86_400)] = 300.0
    stream: ReplyStream | None = None


#: Local models' requests (the package's ``TypedRequest`` includes them).
ModelRequest = ModelReady | ModelFailed | ModelGenerate

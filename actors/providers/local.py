"""The ``local`` provider: plans from a GGUF model served by a ``model`` actor.

The model itself lives in one supervised process per model (actors/model_actor.py),
shared by every agent that names it: it is loaded once, and requests queue there.
This provider builds the request (messages, and a JSON Schema made from the
agent's tool catalog that llama.cpp turns into a grammar, so every answer parses
into a valid plan), and sends it through the supervisor, which relays it to the
model's actor and waits for that actor to be ready after a restart.

A local request has no effect outside corral, so an interrupted one is simply sent
again (``idempotent_requests``): a model actor killed mid-generation costs one
durable, transient retry of the lifecycle, never an action.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import msgspec

from corral.actors.providers.base import (
    ErrorKind,
    Plan,
    ProviderError,
    ProviderRequest,
    ProviderResponse,
    ToolSchema,
    server_note,
)
from corral.actors.providers.chat_history import history_messages
from corral.actors.providers.local_schema import DEFAULT_MAX_STRING, max_tokens_for, turn_schema
from corral.actors.providers.plan_parse import parse_chat_completion
from corral.core.redact import redact_text
from corral.mailbox.errors import ChannelClosed, DeadlineExceeded, MailboxFull, RemoteError
from corral.mailbox.protocol import ChatMessage, Code, ModelGenerate, ReplyStream

#: Answers of the supervisor that a later attempt may not get (the model actor is
#: restarting, busy past its deadline, or died mid-generation).
TRANSIENT_CODES = frozenset({Code.MODEL_UNAVAILABLE, Code.MODEL_TIMEOUT, Code.MODEL_FAILED, Code.DISK_FULL})
TOOL_CHOICES = ("auto", "required")
#: A small context fills fast: each observation is cut to this many characters.
OBSERVATION_CHARS = 1500
DESCRIPTION_CHARS = 160
#: The agent's own instructions in the local prompt: about 400 tokens of a 2048-token context.
INSTRUCTIONS_CHARS = 1500


class LocalConfigError(ProviderError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.FATAL, message)


def _int_in(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise LocalConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


@dataclass(frozen=True)
class LocalConfig:
    """``[agents.local]``: which model, and how to ask it."""

    #: A ``[[models]]`` id, a packaged model name or a .gguf path; the spec binds it
    #: to the id of the model actor that serves it.
    model: str = "smollm2"
    temperature: float = 0.0
    #: Above 1 discourages repetition, but also penalises copying the task (a path, say).
    repeat_penalty: float = 1.0
    seed: int = 0
    #: Bound on every string the model writes inside a tool input.
    max_string: int = DEFAULT_MAX_STRING
    #: Bound on the final reply.
    max_reply: int = 200
    #: After this many tool results the grammar only allows the final reply, so a
    #: run always ends.
    max_tool_calls: int = 8
    #: ``required``: the grammar allows only tool calls until ``max_tool_calls``.
    tool_choice: str = "auto"
    #: Offer a tool's optional input fields too (a small model tends to fill them
    #: with noise, so only the required ones are offered by default).
    optional_fields: bool = False
    #: Seconds for one generation, queueing included.
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise LocalConfigError(f"model must be a name or a path, got {self.model!r}")
        _int_in("seed", self.seed, 0, 2**31 - 1)
        _int_in("max_string", self.max_string, 1, 10_000)
        _int_in("max_reply", self.max_reply, 1, 20_000)
        _int_in("max_tool_calls", self.max_tool_calls, 0, 1000)
        if not isinstance(self.optional_fields, bool):
            raise LocalConfigError(f"optional_fields must be true or false, got {self.optional_fields!r}")
        if self.tool_choice not in TOOL_CHOICES:
            raise LocalConfigError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, got {self.tool_choice!r}")
        for name, value, low, high in (
            ("temperature", self.temperature, 0.0, 2.0),
            ("repeat_penalty", self.repeat_penalty, 0.5, 2.0),
            ("timeout_s", self.timeout_s, 0.1, 86_400.0),
        ):
            ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
            if not ok or not low <= value <= high:
                raise LocalConfigError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LocalConfig:
        if not isinstance(data, Mapping):
            raise LocalConfigError("the local provider's settings must be a table ([agents.local])")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LocalConfigError(
                f"unknown setting(s) {', '.join(map(str, unknown))}; known: {', '.join(sorted(known))}"
            )
        return cls(**dict(data))


def answer_schema(config: LocalConfig, request: ProviderRequest) -> dict[str, Any]:
    """The grammar of this turn: the catalog's calls and/or the final reply."""
    return turn_schema(
        request,
        max_tool_calls=config.max_tool_calls,
        tools_required=config.tool_choice == "required",
        max_string=config.max_string,
        max_reply=config.max_reply,
        optional=config.optional_fields,
    )


def _shape(tool: ToolSchema) -> str:
    """The required fields of a tool's input, as a small model reads them best:
    ``{"path": string, "content": string}``."""
    properties = tool.input_schema.get("properties") or {}
    required = [name for name in tool.input_schema.get("required") or [] if name in properties]
    fields = ", ".join(f'"{name}": {properties[name].get("type", "value")}' for name in required)
    return "{" + fields + "}"


def _cut(text: str, limit: int, marker: str) -> str:
    return text if len(text) <= limit else f"{text[:limit]}\n{marker}"


def system_prompt(request: ProviderRequest, schema: dict[str, Any]) -> str:
    lines = [f"You are corral agent {request.agent_id}. Reply with one JSON object."]
    if request.instructions:
        # The agent's own instructions lead, bounded first of all: a small model's
        # context (n_ctx 2048 by default) holds them beside the task and its history.
        lines.insert(0, _cut(redact_text(request.instructions).strip(), INSTRUCTIONS_CHARS,
                             "[... the agent's instructions were cut at the local model's budget]"))
    for server, notes in request.tool_notes:
        lines.append(server_note(server, redact_text(notes)[:600]))
    if request.project_context:
        # A small model's context is small: the project's block, bounded harder.
        lines.append(redact_text(request.project_context)[:2000])
    offered = "actions" in json.dumps(schema)
    if offered:
        lines.append('To use a tool: {"actions": [{"tool": "<name>", "input": {...}}]}. Tools:')
        lines += [f"- {tool.name} {_shape(tool)}: {tool.description[:DESCRIPTION_CHARS]}" for tool in request.tools]
    if '"final"' in json.dumps(schema) and request.output_schema is not None:
        # The grammar holds it to the schema; the field names tell the model what goes where.
        fields = ", ".join(f'"{name}": ...' for name in (request.output_schema.get("properties") or {}))
        lines.append(f'When the task is done, give your output: {{"final": {{{fields}}}}}.')
    elif '"final"' in json.dumps(schema):
        # A small model otherwise writes the file's contents again, or a document.
        lines.append('When the task is done: {"final": "<one or two sentences telling the user what you did>"}.')
    return "\n".join(lines)


def _live_history(history: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    """The history without repairs that a later tool result has answered: a small
    model copies the last instruction it saw into its reply, and a refusal it has
    since acted on ("claim the deliveries first") is no longer true."""
    last_result = max((i for i, entry in enumerate(history) if entry.get("role") is None), default=-1)
    return tuple(entry for i, entry in enumerate(history) if entry.get("role") != "repair" or i > last_result)


def chat_messages(request: ProviderRequest, schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": system_prompt(request, schema)},
        {"role": "user", "content": f"Task: {request.task}"},
        *history_messages(_live_history(request.history), OBSERVATION_CHARS, echo_calls=True),
    ]


class LocalProvider:
    name = "local"
    #: Generation has no effect outside corral: an interrupted request is re-sent.
    idempotent_requests = True
    #: The repository's instructions, references and skills, but not its summary
    #: (tree, manifests, git): Qwen2.5-Coder-0.5B, shown "top level: research/",
    #: wrote the reviewer's notes into research/ instead of review/. The tree is
    #: one fs.list or project.index away.
    repository_layout = False

    def __init__(self, config: LocalConfig) -> None:
        self.config = config

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        from corral.actors.runtime import current_actor

        schema = answer_schema(self.config, request)
        try:
            generate = ModelGenerate(
                model=self.config.model,
                messages=[ChatMessage(m["content"], m.get("role", "user")) for m in chat_messages(request, schema)],
                schema=schema,
                max_tokens=max_tokens_for(schema),
                temperature=float(self.config.temperature),
                repeat_penalty=float(self.config.repeat_penalty),
                seed=self.config.seed,
                timeout_s=float(self.config.timeout_s),
                # The model actor streams the final reply's text (only that) to the
                # event stream as it is generated.
                stream=ReplyStream(run_id=request.run_id, slot=request.slot),
            )
            answer = await current_actor().ask(generate, timeout=self.config.timeout_s + 30.0)
        except RemoteError as exc:
            kind = ErrorKind.TRANSIENT if exc.code in TRANSIENT_CODES else ErrorKind.FATAL
            raise ProviderError(kind, f"local model {self.config.model}: {exc.code}: {exc.message}") from None
        except (ChannelClosed, DeadlineExceeded, MailboxFull) as exc:
            raise ProviderError(ErrorKind.TRANSIENT, f"local model {self.config.model}: {type(exc).__name__}") from None
        # Not redacted here: the supervisor's handoff decides (as the OpenAI provider's).
        text = json.dumps(msgspec.to_builtins(answer), ensure_ascii=False)
        return ProviderResponse(text=text, meta=msgspec.to_builtins(answer.timings))

    def prompt_text(self, request: ProviderRequest) -> str:
        """The system prompt ``complete`` sends for ``request`` (the run's transcript)."""
        return system_prompt(request, answer_schema(self.config, request))

    def parse(self, response: ProviderResponse, tools: tuple[ToolSchema, ...]) -> Plan:
        # The grammar makes this text-JSON always; the shared parser (and its repair
        # path) still judges it, so a model or build that ignores grammars is caught.
        return parse_chat_completion(response.text, tools, text_json=True)

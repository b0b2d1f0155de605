"""How the ``openai`` provider asks a server for a well-formed plan.

The ``structured`` setting picks one way; each sends the shared plan schema
(actors/providers/local_schema.py, the one the local grammar is built from) in
the form a server understands:

* ``json_schema``: ``response_format = {"type": "json_schema", "json_schema":
  {"name", "strict": true, "schema"}}`` (OpenAI's form; llama.cpp's llama-server,
  vLLM, Ollama's /v1, LM Studio). The server samples only answers the schema admits.
* ``json_object``: ``response_format = {"type": "json_object", "schema": ...}``,
  the older form that llama-cpp-python's ``llama_cpp.server`` understands (it
  refuses ``json_schema``); llama-server accepts it too.
* ``tools``: native function calling, one function per tool, ``tool_choice``
  (``auto``; ``none`` once ``max_tool_calls`` results are in).
* ``none``: the plan asked for as JSON in the text, nothing enforced.

The answer of the two ``response_format`` ways is text-JSON, read by the shared
parser (plan_parse.py) exactly like ``none``'s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from . import plan_update
from .base import MAX_ACTIONS_PER_PLAN, ProviderRequest
from .local_schema import tool_results, turn_schema


class Structured(enum.StrEnum):
    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    TOOLS = "tools"
    NONE = "none"


CHOICES = tuple(choice.value for choice in Structured)
#: The name the schema goes by in ``json_schema`` (OpenAI requires one).
SCHEMA_NAME = "corral_plan"
#: Bound on an array inside a tool input, as in the local grammar.
MAX_ITEMS = 8


@dataclass(frozen=True)
class SchemaBounds:
    """The bounds of the schema (the ``[agents.openai]`` keys of the same names).
    Unset, strings and the reply are open: a server's model usually has the budget
    a 135M model lacks. A small model needs them, as in the local grammar, or it
    rambles inside a string until ``max_tokens`` cuts the JSON."""

    max_string: int | None = None
    max_reply: int | None = None
    max_actions: int = MAX_ACTIONS_PER_PLAN
    max_tool_calls: int | None = None
    #: Offer the plan update (seed 004 V1.17: in the schema, required but nullable;
    #: with native tools, ``update_agent_plan``). Off only for a model too small to
    #: finish a plan it wrote: SmolLM2-135M through llama_cpp.server wrote four steps
    #: on its first turn and its run failed with its final reply blocked on them.
    plan_update: bool = True

    def check(self) -> None:
        """Raises ValueError naming the bad bound."""
        if not isinstance(self.plan_update, bool):
            raise ValueError(f"plan_update must be true or false, got {self.plan_update!r}")
        for name, value, low, high in (
            ("max_string", self.max_string, 1, 100_000),
            ("max_reply", self.max_reply, 1, 100_000),
            ("max_actions", self.max_actions, 1, MAX_ACTIONS_PER_PLAN),
            ("max_tool_calls", self.max_tool_calls, 0, 1000),
        ):
            if value is None and name != "max_actions":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")

#: What each setting records as the response's ``mode`` (how to read it later).
MODES = {
    Structured.JSON_SCHEMA: "json-schema",
    Structured.JSON_OBJECT: "json-object",
    Structured.TOOLS: "native",
    Structured.NONE: "text-json",
}


def resolve(structured: Any, native_tools: Any) -> Structured:
    """The setting from ``structured`` and the older ``native_tools`` key (``true``
    meant ``tools``, ``false`` meant ``none``); raises ValueError with the message
    to show. Neither set: ``json_schema``, the way every self-hosted server
    (llama.cpp, vLLM, Ollama, LM Studio) enforces as a grammar."""
    if native_tools is not None and not isinstance(native_tools, bool):
        raise ValueError(f"native_tools must be true or false, got {native_tools!r} (it is now structured = ...)")
    if structured is None:
        if native_tools is None:
            return Structured.JSON_SCHEMA
        return Structured.TOOLS if native_tools else Structured.NONE
    if native_tools is not None:
        raise ValueError(
            "native_tools is replaced by structured; set only structured "
            '(native_tools = true is structured = "tools", false is "none")'
        )
    try:
        return Structured(structured)
    except ValueError:
        raise ValueError(f"structured must be one of {', '.join(CHOICES)}, got {structured!r}") from None


def answer_schema(request: ProviderRequest, bounds: SchemaBounds | None = None) -> dict[str, Any]:
    """This turn's plan schema for a server's model: every tool with its optional
    fields, within ``bounds``, or the final reply; ``planUpdate`` beside either."""
    bounds = bounds or SchemaBounds()
    return turn_schema(
        request,
        max_tool_calls=bounds.max_tool_calls,
        max_string=bounds.max_string,
        max_reply=bounds.max_reply,
        max_actions=bounds.max_actions,
        optional=True,
        max_items=MAX_ITEMS,
        # Required but nullable (seed 004 V1.17): a server that enforces the schema
        # lets the model keep its plan beside its actions or its reply.
        plan_update=plan_update.SCHEMA if bounds.plan_update else None,
    )


def response_format(
    structured: Structured, request: ProviderRequest, bounds: SchemaBounds | None = None
) -> dict[str, Any] | None:
    """The ``response_format`` member of the request body, or None."""
    if structured is Structured.JSON_SCHEMA:
        schema = answer_schema(request, bounds)
        return {"type": "json_schema", "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": schema}}
    if structured is Structured.JSON_OBJECT:
        return {"type": "json_object", "schema": answer_schema(request, bounds)}
    return None


def tool_choice(bounds: SchemaBounds, request: ProviderRequest) -> str:
    """``tool_choice`` with native tools: ``none`` once ``max_tool_calls`` results
    are in (the same bound the schema applies), so the model must reply."""
    spent = bounds.max_tool_calls is not None and tool_results(request) >= bounds.max_tool_calls
    return "none" if spent else "auto"


def refusal_hint(structured: Structured, body_text: str) -> str:
    """For an error answer to a request with a ``response_format``: what to set
    instead, when the server's message says it is the format it refused."""
    if structured not in (Structured.JSON_SCHEMA, Structured.JSON_OBJECT):
        return ""
    lowered = body_text.lower()
    if "response_format" not in lowered and "json_schema" not in lowered:
        return ""
    others = [c for c in ("json_object", "tools", "none") if c != structured.value]
    return (
        f" (the server refused structured = \"{structured.value}\"; set structured = "
        + " or ".join(f'"{c}"' for c in others)
        + " in [agents.openai])"
    )

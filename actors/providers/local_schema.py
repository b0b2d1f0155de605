"""The JSON Schema that constrains a model's answer to a valid plan.

One builder for both routes to a model: the ``local`` provider hands it to
llama.cpp as a grammar, the ``openai`` provider sends it as structured output
(``response_format``) to a server that enforces it. llama.cpp turns a JSON
Schema into a GBNF grammar and samples only tokens the grammar allows, so a
schema built from the agent's tool catalogue makes every answer parse:
``{"actions": [{"tool": <one of the names>, "input": <that tool's input
schema>}]}`` or ``{"final": "<reply>"}``. Strings get a ``maxLength`` (a small
model otherwise rambles inside a path until ``max_tokens`` cuts the JSON), and
``max_tokens`` is sized from the same bounds, so the grammar can always close.

Pure functions only: the providers and the tests use them without llama.cpp.
"""

from __future__ import annotations

import copy
from typing import Any

from corral.actors.providers.base import MAX_ACTIONS_PER_PLAN, ProviderRequest, ToolSchema

#: Default bound on a string the model writes inside a tool input.
DEFAULT_MAX_STRING = 120
#: Bound on the final reply.
DEFAULT_MAX_REPLY = 400
#: Allowance per bounded value for quotes, keys and punctuation, in tokens.
_TOKENS_PER_FIELD = 12
#: A token holds at least one character of a bounded string (worst case).
_TOKENS_PER_CHAR = 1.0


#: Default bound on an array inside a tool input.
DEFAULT_MAX_ITEMS = 8


def _bounded(
    schema: Any, max_string: int | None, optional: bool = False, max_items: int | None = DEFAULT_MAX_ITEMS
) -> Any:
    """A copy of ``schema`` in which every string has a maxLength and every array
    a maxItems (``None``: no bound), so the grammar (and the answer) is finite.
    Unless ``optional``, optional properties are left out: a small model fills
    them with noise."""
    if not isinstance(schema, dict):
        return schema
    out = {
        key: _bounded(value, max_string, optional, max_items) if isinstance(value, dict) else value
        for key, value in schema.items()
    }
    if "properties" in out and isinstance(out["properties"], dict):
        required = set(out.get("required") or ())
        out["properties"] = {
            name: _bounded(sub, max_string, optional, max_items)
            for name, sub in out["properties"].items()
            if optional or name in required
        }
    if isinstance(out.get("items"), dict):
        out["items"] = _bounded(out["items"], max_string, optional, max_items)
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            out[key] = [_bounded(sub, max_string, optional, max_items) for sub in out[key]]
    kind = out.get("type")
    if kind == "string" and "enum" not in out and "const" not in out:
        if max_string is not None:
            out["maxLength"] = min(int(out.get("maxLength", max_string)), max_string)
        # An empty name or path is never what a tool wants, and a small model's
        # favourite way to fill a field it does not understand.
        out["minLength"] = max(int(out.get("minLength", 1)), 1)
    if kind == "array" and max_items is not None:
        out["maxItems"] = min(int(out.get("maxItems", max_items)), max_items)
    if kind == "object" and "additionalProperties" not in out:
        # Free-form keys would let the model invent fields the tool rejects.
        out["additionalProperties"] = False
    return out


def inline_refs(schema: dict[str, Any], depth: int = 8) -> dict[str, Any]:
    """A copy with local ``$ref``s (``#/$defs/X``, ``#/definitions/X``) replaced by
    their targets: a tool's schema is embedded in a larger one, where its refs would
    point nowhere. Past ``depth`` (a recursive type) a ref becomes any value."""
    defs = {**(schema.get("definitions") or {}), **(schema.get("$defs") or {})}

    def walk(node: Any, level: int) -> Any:
        if isinstance(node, list):
            return [walk(item, level) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
            target = defs.get(ref.rsplit("/", 1)[1])
            return walk(copy.deepcopy(target), level + 1) if target is not None and level < depth else {}
        return {key: walk(value, level) for key, value in node.items() if key not in ("$defs", "definitions")}

    result: dict[str, Any] = walk(copy.deepcopy(schema), 0)
    return result


def action_schema(
    tool: ToolSchema,
    max_string: int | None = DEFAULT_MAX_STRING,
    optional: bool = False,
    max_items: int | None = DEFAULT_MAX_ITEMS,
) -> dict[str, Any]:
    """One call of ``tool``: its name as a constant, its input by its own schema."""
    input_schema = _bounded(inline_refs(tool.input_schema), max_string, optional, max_items)
    if not input_schema:
        input_schema = {"type": "object", "properties": {}, "additionalProperties": False}
    return {
        "type": "object",
        "properties": {"tool": {"const": tool.name}, "input": input_schema},
        "required": ["tool", "input"],
        "additionalProperties": False,
    }


def plan_schema(
    tools: tuple[ToolSchema, ...],
    *,
    max_string: int | None = DEFAULT_MAX_STRING,
    max_reply: int | None = DEFAULT_MAX_REPLY,
    max_actions: int = 1,
    allow_final: bool = True,
    optional: bool = False,
    max_items: int | None = DEFAULT_MAX_ITEMS,
    output: dict[str, Any] | None = None,
    plan_update: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The schema of one answer: some tool calls (from ``tools``) and/or the final
    reply. With no tools the final reply is the only answer. A ``None`` bound
    leaves that length open (a server's model with a large budget). ``output``: the
    agent's typed output, which the final reply is instead of text (every field
    offered, strings bounded, so the grammar can close). ``plan_update``: the
    schema of the answer's ``planUpdate``, then required beside the actions or the
    reply but null when the plan has not changed (seed 004 V1.17: "planUpdate 是必填
    但可为 null 的字段")."""
    reply: dict[str, Any] = {"type": "string", "minLength": 1}
    if max_reply is not None:
        reply["maxLength"] = max_reply
    if output is not None:
        reply = _bounded(inline_refs(output), max_string, True, max_items)
    final = {
        "type": "object",
        "properties": {"final": reply},
        "required": ["final"],
        "additionalProperties": False,
    }
    if not tools:
        return _with_plan_update(final, plan_update)
    actions = {
        "type": "object",
        "properties": {
            "actions": {
                "type": "array",
                "items": {"anyOf": [action_schema(tool, max_string, optional, max_items) for tool in tools]},
                "minItems": 1,
                "maxItems": min(max_actions, MAX_ACTIONS_PER_PLAN),
            }
        },
        "required": ["actions"],
        "additionalProperties": False,
    }
    actions = _with_plan_update(actions, plan_update)
    final = _with_plan_update(final, plan_update)
    return {"anyOf": [actions, final]} if allow_final else actions


def _with_plan_update(branch: dict[str, Any], plan_update: dict[str, Any] | None) -> dict[str, Any]:
    """``branch`` with ``planUpdate`` required and nullable, when there is one."""
    if plan_update is None:
        return branch
    return {
        **branch,
        "properties": {**branch["properties"], "planUpdate": {"anyOf": [{"type": "null"}, plan_update]}},
        "required": [*branch["required"], "planUpdate"],
    }


def tool_results(request: ProviderRequest) -> int:
    """How many tool results the run has seen so far."""
    return sum(1 for entry in request.history if entry.get("role") not in ("repair", "user", "summary", "plan"))


def _blocked_final_tools(request: ProviderRequest) -> tuple[ToolSchema, ...]:
    """After the supervisor refused a final reply, the tools its refusal names
    (``agent.run_status`` to claim deliveries, say): the next answer must use one."""
    last = request.history[-1] if request.history else {}
    if last.get("role") != "repair" or last.get("category") != "final-blocked":
        return ()
    detail = str(last.get("detail", ""))
    return tuple(tool for tool in request.tools if tool.name in detail)


def turn_schema(
    request: ProviderRequest,
    *,
    max_tool_calls: int | None = None,
    tools_required: bool = False,
    max_string: int | None = DEFAULT_MAX_STRING,
    max_reply: int | None = DEFAULT_MAX_REPLY,
    max_actions: int = 1,
    optional: bool = False,
    max_items: int | None = DEFAULT_MAX_ITEMS,
    plan_update: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The schema of this turn's answer: the catalog's calls and/or the final reply.
    After ``max_tool_calls`` results only the final reply is left (so a run always
    ends); ``tools_required`` withholds the final reply until then; a refused final
    reply leaves only the tools its refusal names."""
    tools = _blocked_final_tools(request)
    final = not tools
    if not tools:
        budget_left = max_tool_calls is None or tool_results(request) < max_tool_calls
        tools = request.tools if budget_left else ()
        final = not tools or not tools_required
    return plan_schema(
        tools,
        max_string=max_string,
        max_reply=max_reply,
        max_actions=max_actions,
        allow_final=final,
        optional=optional,
        max_items=max_items,
        output=request.output_schema,
        plan_update=plan_update,
    )


def _count_budget(schema: Any) -> tuple[int, int]:
    """(characters of bounded strings, number of fields) in the largest answer."""
    if not isinstance(schema, dict):
        return 0, 0
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            options = [_count_budget(sub) for sub in schema[key]]
            return max(options, default=(0, 0), key=lambda pair: pair[0] * 2 + pair[1] * _TOKENS_PER_FIELD)
    kind = schema.get("type")
    if kind == "string":
        return int(schema.get("maxLength", DEFAULT_MAX_STRING)), 1
    if kind == "array":
        chars, fields = _count_budget(schema.get("items", {}))
        n = int(schema.get("maxItems", 1))
        return chars * n, fields * n + 1
    if kind == "object" or "properties" in schema:
        chars, fields = 0, 1
        for sub in (schema.get("properties") or {}).values():
            sub_chars, sub_fields = _count_budget(sub)
            chars, fields = chars + sub_chars, fields + sub_fields
        return chars, fields
    return 0, 1


def max_tokens_for(schema: dict[str, Any]) -> int:
    """Enough tokens for the largest answer the schema allows, so the grammar can
    always reach its closing brace before the budget runs out."""
    chars, fields = _count_budget(schema)
    return int(chars * _TOKENS_PER_CHAR) + fields * _TOKENS_PER_FIELD + 16

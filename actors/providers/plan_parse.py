"""Turning an OpenAI-compatible Chat Completions body into a corral plan.

Everything here is pure: the agent parses the *committed* (redacted, bounded)
response text, possibly after a restart, so parsing must depend on nothing but that
text and the tool schemas.

Two answer shapes are understood:

* native function calling: ``choices[0].message.tool_calls[*].function`` with a
  ``name`` and JSON ``arguments``, which are seed 004's envelope ``{"reason": ...,
  "input": {...}}`` (V1.33); a plain text message is the final reply;
* the text-JSON fallback for servers without tool calls: the message content is
  ``{"actions": [{"tool": ..., "input": {...}}]}`` or ``{"final": "..."}``,
  possibly inside a ```json fence.

Every failure is a ``PlanError`` with a fixed ``RepairCategory`` so the agent can
count repairs per category and send a bounded repair message.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from corral.core.redact import redact_text

# Relative: mypy cannot map the corral.actors package onto the actors/ folder.
from . import plan_update, thinking
from .base import (
    MAX_ACTIONS_PER_PLAN,
    Normalization,
    NormalizationKind,
    Plan,
    PlanError,
    RepairCategory,
    ToolCall,
    ToolSchema,
)
from .json_check import json_type_name, short, validate

_MAX_DETAIL_CHARS = 300


class _DuplicateKey(ValueError):
    """An object that names one key twice: the seed refuses it (V1.33), since which
    value the model meant is unknowable and "the last one wins" would hide it."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(f"duplicate key {short(key)!r}")
        seen[key] = value
    return seen


#: A raw newline or tab inside a JSON string is not valid JSON, but it is what a
#: model means: llama.cpp's json_object grammar lets them through, and the text is
#: the model's own reply. Refusing it cost a repair turn for nothing.
_LENIENT = json.JSONDecoder(strict=False, object_pairs_hook=_unique_keys)
#: Last-one-wins decoding, used only to tell whether a fenced block that repeats a
#: key is shaped as a plan (then it is refused, never delivered as a reply).
_SHAPE_ONLY = json.JSONDecoder(strict=False)
_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n?(.*?)```", re.S)

# OpenAI restricts function names; corral tool names may use other characters.
_WIRE_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]")


def _fail(category: RepairCategory, detail: str) -> PlanError:
    detail = redact_text(detail)
    if len(detail) > _MAX_DETAIL_CHARS:
        detail = detail[: _MAX_DETAIL_CHARS - 1] + "…"
    return PlanError(category, detail)





# --- what parsing drops ----------------------------------------------------------


def _audit(kind: NormalizationKind, pieces: list[str]) -> tuple[Normalization, ...]:
    """The audit of ``pieces`` dropped: their count, characters and SHA-256, no text."""
    if not pieces:
        return ()
    joined = "".join(pieces)
    return (Normalization(kind, len(pieces), len(joined), hashlib.sha256(joined.encode()).hexdigest()),)


# --- tool names -------------------------------------------------------------------


def wire_tool_name(name: str) -> str:
    """The function name sent to the server for a corral tool."""
    return _WIRE_NAME_BAD.sub("_", name)[:64]


#: Seed 004's names for corral's tools: a plan that uses one calls corral's tool (the
#: action records corral's name). V1.3 calls the atomic multi-file change
#: ``project.patchset``.
SEED_TOOL_NAMES = {"project.patchset": "project.changeset"}


def tool_index(tools: Iterable[ToolSchema]) -> dict[str, ToolSchema]:
    """Tools by corral name and by wire name (and by seed 004's name, where it has
    one); raises ValueError when two tools would be indistinguishable on the wire,
    since the model could not tell them apart."""
    index: dict[str, ToolSchema] = {}
    wire_owner: dict[str, str] = {}
    for tool in tools:
        wire = wire_tool_name(tool.name)
        if wire in wire_owner and wire_owner[wire] != tool.name:
            raise ValueError(
                f"tools {wire_owner[wire]!r} and {tool.name!r} share wire name {wire!r}"
            )
        wire_owner[wire] = tool.name
        index[tool.name] = tool
        index.setdefault(wire, tool)
    for alias, name in SEED_TOOL_NAMES.items():
        if name in index:
            index.setdefault(alias, index[name])
            index.setdefault(wire_tool_name(alias), index[name])
    return index


# --- the function-argument envelope --------------------------------------------------

#: Bound on the reason a native call gives (the model's own words for one action).
MAX_REASON_CHARS = 1000


def envelope_schema(input_schema: Mapping[str, Any]) -> dict[str, Any]:
    """A native function's parameters (seed 004 V1.33: "所有动作函数参数统一为
    {"reason":"...","input":{...}}"): a non-empty reason and the tool's input, which
    its own schema describes; nothing flattened to the top."""
    return {
        "type": "object",
        "properties": {
            "reason": {"type": "string", "minLength": 1, "maxLength": MAX_REASON_CHARS,
                       "description": "why this call, in one sentence"},
            "input": dict(input_schema),
        },
        "required": ["reason", "input"],
        "additionalProperties": False,
    }


def _unwrapped(tool: ToolSchema, arguments: Any) -> tuple[str, Any]:
    """The reason and the input of a native call's arguments; anything but the
    envelope is ``arguments-schema`` (the seed forbids flattening the input)."""
    shape = f'{tool.name}: arguments are {{"reason": "...", "input": {{...}}}}'
    if not isinstance(arguments, dict) or set(arguments) != {"reason", "input"}:
        raise _fail(RepairCategory.ARGUMENTS_SCHEMA, f"{shape}, the input never flattened to the top")
    reason = arguments["reason"]
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON_CHARS:
        raise _fail(RepairCategory.ARGUMENTS_SCHEMA, f"{shape}: reason is 1 to {MAX_REASON_CHARS} characters")
    return reason.strip(), arguments["input"]


# --- the plan update -------------------------------------------------------------------


def checked_plan_update(value: Any) -> dict[str, Any] | None:
    """An answer's ``planUpdate`` (None: none), its shape checked; its rules against
    the plan as it stands are the supervisor's (``plan-semantics``)."""
    if value is None:
        return None
    problem = validate(value, plan_update.SCHEMA, f"${plan_update.ANSWER_KEY}")
    if problem is None and not 1 <= len(value["steps"]) <= plan_update.MAX_STEPS:
        problem = f"a plan update has 1 to {plan_update.MAX_STEPS} steps, not {len(value['steps'])}"
    if problem is None and not value["explanation"].strip():
        problem = "a plan update needs a non-empty explanation"
    if problem is not None:
        raise _fail(RepairCategory.ARGUMENTS_SCHEMA, f"{plan_update.FUNCTION}: {problem}")
    return dict(value)


# --- building tool calls ----------------------------------------------------------


def _resolve_tool(name: Any, index: Mapping[str, ToolSchema]) -> ToolSchema:
    if not isinstance(name, str) or not name:
        raise _fail(RepairCategory.CALL_IDENTITY, "tool name must be a non-empty string")
    tool = index.get(name)
    if tool is None:
        known = ", ".join(sorted({t.name for t in index.values()})) or "none"
        raise _fail(RepairCategory.UNKNOWN_FUNCTION, f"no tool {short(name)!r}; known: {known}")
    return tool


def _tool_call(tool: ToolSchema, arguments: Any, reason: str = "") -> ToolCall:
    if not isinstance(arguments, dict):
        raise _fail(
            RepairCategory.ARGUMENTS_SCHEMA,
            f"input for {tool.name!r} must be a JSON object, got {json_type_name(arguments)}",
        )
    problem = validate(arguments, tool.input_schema)
    if problem:
        raise _fail(RepairCategory.ARGUMENTS_SCHEMA, f"{tool.name}: {problem}")
    return ToolCall(tool=tool.name, input=arguments, reason=reason)


def _check_count(n: int) -> None:
    if n > MAX_ACTIONS_PER_PLAN:
        raise _fail(
            RepairCategory.BATCH_CONSTRAINT, f"{n} actions, at most {MAX_ACTIONS_PER_PLAN} per plan"
        )


def _decode_arguments(raw: Any, tool_name: str) -> Any:
    # Some servers (Ollama) send arguments already decoded; others send "" for a
    # tool without parameters.
    if not isinstance(raw, str):
        return {} if raw is None else raw
    if not raw.strip():
        return {}
    try:
        return _LENIENT.decode(raw)
    except (json.JSONDecodeError, _DuplicateKey) as exc:
        raise _fail(
            RepairCategory.ARGUMENTS_JSON, f"arguments for {short(tool_name)!r}: {exc}"
        ) from None


def _native_call(entry: Any, index: Mapping[str, ToolSchema]) -> ToolCall:
    function = entry.get("function") if isinstance(entry, dict) else None
    if not isinstance(function, dict):
        raise _fail(RepairCategory.CALL_IDENTITY, "tool call without a function object")
    tool = _resolve_tool(function.get("name"), index)
    reason, tool_input = _unwrapped(tool, _decode_arguments(function.get("arguments"), tool.name))
    return _tool_call(tool, tool_input, reason)


def _plan_from_tool_calls(calls: list[Any], index: Mapping[str, ToolSchema], content: str) -> Plan:
    """The calls are the plan; text beside them is reasoning or commentary, dropped
    and audited. A thinking tag left open, orphaned or mismatched is no plan (seed 004
    V1.33: "未闭合 / 错配 thinking 标签仍按 response-shape 失败关闭")."""
    found = _thought_through(content)
    updates = [entry for entry in calls if _function_name(entry) == plan_update.FUNCTION]
    if len(updates) > 1:
        raise _fail(RepairCategory.BATCH_CONSTRAINT, f"{len(updates)} calls of {plan_update.FUNCTION}, at most one")
    update = None
    if updates:
        raw = updates[0]["function"].get("arguments")
        update = checked_plan_update(_decode_arguments(raw, plan_update.FUNCTION))
        calls = [entry for entry in calls if entry is not updates[0]]
    _check_count(len(calls))
    actions = tuple(_native_call(entry, index) for entry in calls)
    commentary = found.answer
    normalized = _audit(NormalizationKind.COMPLETE_THINK_BLOCK, list(found.blocks))
    normalized += _audit(NormalizationKind.PLANNER_COMMENTARY, [commentary] if commentary else [])
    return Plan(actions=actions, normalized=normalized, plan_update=update)


def _thought_through(content: str) -> thinking.Thinking:
    """``content`` without its complete thinking blocks; a malformed tag is a
    ``response-shape`` repair, whatever else the answer holds (V1.43: "未闭合或孤立
    thinking wrapper … 不能被清洗成可执行计划")."""
    found = thinking.split(content)
    if found.malformed:
        raise _fail(RepairCategory.RESPONSE_SHAPE, "a thinking tag is not closed, not opened, or closed by another"
                    " name: close every <think> you open, or leave thinking out of the answer")
    return found


def _function_name(entry: Any) -> Any:
    function = entry.get("function") if isinstance(entry, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def _plan_action(entry: Any, index: Mapping[str, ToolSchema]) -> ToolCall:
    if not isinstance(entry, dict):
        raise _fail(
            RepairCategory.RESPONSE_SHAPE, 'each action must be {"tool": ..., "input": {}}'
        )
    tool = _resolve_tool(entry.get("tool"), index)
    return _tool_call(tool, entry.get("input", {}))


def _plan_from_object(obj: dict[str, Any], index: Mapping[str, ToolSchema], update_required: bool = False) -> Plan:
    """``{"actions": [...]}`` or ``{"final": ...}``, with ``planUpdate`` beside either
    or alone (then ``actions`` may be empty): seed 004 V1.17's answer, whose text-JSON
    form may leave the update out."""
    if "actions" in obj and "final" in obj:
        raise _fail(RepairCategory.RESPONSE_SHAPE, 'give either "actions" or "final", not both')
    if update_required and plan_update.ANSWER_KEY not in obj:
        # Seed 004 V1.17: "省略字段属于协议错误"; only plain text JSON may leave it out.
        raise _fail(RepairCategory.RESPONSE_SHAPE, f'"{plan_update.ANSWER_KEY}" is required: null when the plan'
                    " has not changed")
    update = checked_plan_update(obj.get(plan_update.ANSWER_KEY))
    if "final" in obj:
        final = obj["final"]
        if isinstance(final, dict):
            # An object: an agent's typed output (its grammar or response_format asked
            # for one), kept as its JSON; the lane checks it against the schema.
            return Plan(final_reply=json.dumps(final, ensure_ascii=False), plan_update=update)
        if not isinstance(final, str):
            raise _fail(RepairCategory.RESPONSE_SHAPE, '"final" must be a string')
        if not final.strip():
            raise _fail(RepairCategory.RESPONSE_SHAPE, '"final" is empty')
        return Plan(final_reply=final, plan_update=update)
    actions = obj.get("actions", [] if update is not None else None)
    if not isinstance(actions, list):
        raise _fail(RepairCategory.RESPONSE_SHAPE, '"actions" must be a list')
    if not actions and update is None:
        raise _fail(RepairCategory.RESPONSE_SHAPE, '"actions" is empty')
    _check_count(len(actions))
    return Plan(actions=tuple(_plan_action(entry, index) for entry in actions), plan_update=update)


# --- message content --------------------------------------------------------------


#: The content parts that are visible text (seed 004 V1.33: "普通 text / output_text 继续进入
#: 可见正文"); reasoning parts (reasoning, reasoning_content, analysis, thinking) never are.
VISIBLE_PARTS = ("text", "output_text")


def visible_text(content: Any) -> str:
    """A message's visible text; raises ``PlanError`` (response-shape) on anything
    but text or a list of parts."""
    # Content may be a list of parts ({"type": "text", "text": ...}) on some servers.
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") in VISIBLE_PARTS and isinstance(part.get("text"), str)
        )
    raise _fail(RepairCategory.RESPONSE_SHAPE, "message content is neither text nor a list of parts")


def _json_candidate(text: str) -> str | None:
    """The part of a text-JSON answer meant as the plan, or None when it is prose."""
    fence = _FENCE.search(text)
    if fence:
        return fence.group(1).strip()
    if "{" in text:
        return text[text.index("{") :]
    return None


def _decode_object(candidate: str) -> Any:
    # raw_decode tolerates prose after the object, which models often add.
    try:
        value, _end = _LENIENT.raw_decode(candidate)
    except (json.JSONDecodeError, _DuplicateKey) as exc:
        raise _fail(RepairCategory.ARGUMENTS_JSON, f"plan is not valid JSON: {exc}") from None
    return value


def _is_leaked_call(value: Any) -> bool:
    # Servers without a tool-call parser for the model pass the model's own
    # {"name": ..., "arguments": ...} through as text.
    return (
        isinstance(value, dict)
        and isinstance(value.get("name"), str)
        and ("arguments" in value or "parameters" in value)
    )


def _shape_of(candidate: str) -> Any:
    """The value of a block that repeats a key, last one winning; None if it is no JSON."""
    try:
        return _SHAPE_ONLY.decode(candidate)
    except json.JSONDecodeError:
        return None


def _plan_object(value: Any) -> bool:
    return isinstance(value, dict) and ("actions" in value or "final" in value or plan_update.ANSWER_KEY in value)


def _plan_shaped(value: Any) -> bool:
    """Whether a decoded value is what ``_plan_from_value`` reads as a plan."""
    return _plan_object(value) or _is_leaked_call(value)


def _plan_from_value(value: Any, index: Mapping[str, ToolSchema], update_required: bool = False) -> Plan | None:
    if _plan_object(value):
        return _plan_from_object(value, index, update_required)
    if _is_leaked_call(value):
        tool = _resolve_tool(value["name"], index)
        raw = value["arguments"] if "arguments" in value else value["parameters"]
        arguments = _decode_arguments(raw, tool.name)
        reason = ""
        if isinstance(arguments, dict) and set(arguments) == {"reason", "input"}:
            # The envelope the functions were offered in, passed through as text.
            reason, arguments = _unwrapped(tool, arguments)
        return Plan(actions=(_tool_call(tool, arguments, reason),))
    return None


def _plan_from_json_text(text: str, index: Mapping[str, ToolSchema], update_required: bool = False) -> Plan:
    candidate = _json_candidate(text)
    if candidate is None:
        raise _fail(RepairCategory.RESPONSE_SHAPE, "expected a JSON object, got prose")
    plan = _plan_from_value(_decode_object(candidate), index, update_required)
    if plan is None:
        raise _fail(RepairCategory.RESPONSE_SHAPE, 'the JSON object needs "actions" or "final"')
    return plan


def _plan_from_reply_text(text: str, index: Mapping[str, ToolSchema]) -> Plan:
    """With native tool calls, text is the final reply unless it is unmistakably a
    JSON plan: a whole-text object (malformed means a failed attempt, so arguments-json)
    or a fenced block that decodes to one (anything else fenced is just content)."""
    if text.startswith("{") and text.endswith("}"):
        plan = _plan_from_value(_decode_object(text), index)
        return plan or Plan(final_reply=text)
    fence = _FENCE.search(text)
    if fence:
        try:
            value = _LENIENT.decode(fence.group(1))
        except json.JSONDecodeError:
            value = None
        except _DuplicateKey as exc:
            # Seed 004 V1.33 "拒绝…重复字段": a fenced plan that repeats a key is a plan
            # the model meant but whose values are unknowable: refused as the whole-text
            # one is. A fenced block shaped as no plan is reply content (an answer may show JSON).
            if _plan_shaped(_shape_of(fence.group(1))):
                raise _fail(RepairCategory.ARGUMENTS_JSON, f"plan is not valid JSON: {exc}") from None
            value = None
        plan = _plan_from_value(value, index)
        if plan is not None:
            return plan
    return Plan(final_reply=text)


def _plan_from_content(
    content: str, index: Mapping[str, ToolSchema], *, text_json: bool, update_required: bool = False
) -> Plan:
    found = _thought_through(content)
    text = found.answer
    if not text:
        raise _fail(RepairCategory.RESPONSE_SHAPE, "no tool call and no reply text")
    plan = _plan_from_json_text(text, index, update_required) if text_json else _plan_from_reply_text(text, index)
    normalized = _audit(NormalizationKind.COMPLETE_THINK_BLOCK, list(found.blocks))
    return Plan(plan.actions, plan.final_reply, normalized, plan.plan_update) if normalized else plan


# --- the response envelope --------------------------------------------------------


def _first_message(body_text: str) -> dict[str, Any]:
    if not body_text.strip():
        raise _fail(RepairCategory.RESPONSE_SHAPE, "empty response body")
    try:
        body = json.loads(body_text)
    except json.JSONDecodeError as exc:
        raise _fail(RepairCategory.RESPONSE_SHAPE, f"response body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _fail(RepairCategory.RESPONSE_SHAPE, "response body is not a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        error = body.get("error")
        hint = f" (server error: {short(str(error), 160)})" if error else ""
        raise _fail(RepairCategory.RESPONSE_SHAPE, f"response has no choices{hint}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise _fail(RepairCategory.RESPONSE_SHAPE, "first choice has no message object")
    return message


def _tool_calls_of(message: Mapping[str, Any]) -> list[Any]:
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        return calls
    # The pre-tools "function_call" shape, still emitted by some local servers.
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        return [{"type": "function", "function": legacy}]
    return []


def parse_chat_completion(
    body_text: str, tools: Iterable[ToolSchema], *, text_json: bool = False, update_required: bool = False
) -> Plan:
    """Parse a Chat Completions response body into a plan; raises PlanError.

    ``text_json`` is True when the request asked for the text-JSON fallback: then
    the content must hold a JSON plan, whereas with native tool calls plain text is
    the final reply. Tool calls, when present, win over any content.
    ``update_required``: a text-JSON answer must carry ``planUpdate`` (null or an
    update), as the schema it was asked with requires (seed 004 V1.17).
    """
    try:
        index = tool_index(tools)
    except ValueError as exc:  # the run fails: asking the model again cannot fix it
        raise _fail(RepairCategory.CATALOG_BINDING, str(exc)) from None
    message = _first_message(body_text)
    calls = _tool_calls_of(message)
    if calls:
        return _plan_from_tool_calls(calls, index, visible_text(message.get("content")))
    return _plan_from_content(visible_text(message.get("content")), index, text_json=text_json,
                              update_required=update_required)

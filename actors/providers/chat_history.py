"""A run's history as chat messages: what every chat-completions provider sends
after the system prompt and the task (``openai`` over HTTP, ``local`` to the
model actor). Every text is redacted and bounded here, once: a tool's output by
its tool's budget (observation_budget.py: a diff, a poll page or an output page
is cut inside its text, never on its cursor or line fields), anything else at
``MAX_OBSERVATION_CHARS``.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any

from corral.core.redact import redact_text

from .base import ImagePart, RepairCategory
from .observation_budget import (
    CONTEXT_BUNDLE_CHARS,
    DEFAULT_CHARS,
    budget_of,
    fit,
    newest_of_slots,
    render,
    whole_text_chars,
)
from .repair import repair_message

#: Characters of one observation without a budget of its own (the ``local`` provider
#: sends fewer).
MAX_OBSERVATION_CHARS = DEFAULT_CHARS


#: How a steer reaches the model (seed 004 V1.13: a later instruction corrects the
#: task, "但不能覆盖" the system rules, the policy, approvals or the sandbox).
STEER_LEAD = ("New instruction from the user (it takes priority over the task and earlier instructions,"
              " never over corral's rules, the policy, approvals or the sandbox): ")
STEER_REVIEW = " Review the unfinished steps of your plan against it before you go on."


def bounded(text: str, limit: int) -> str:
    """``text`` redacted and cut to ``limit`` characters, saying how much was cut."""
    text = redact_text(text)
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[… {len(text) - limit} more characters cut]"


def _source(entry: Mapping[str, Any]) -> str:
    """A command's ``sourceActionId``, first in its detail whatever its end (seed 004
    V1.9: success, a non-zero exit and a timeout alike), so the model passes it to
    ``command.output_read`` without looking it up."""
    output = entry.get("output")
    source = output.get("sourceActionId") if isinstance(output, dict) else None
    return f"sourceActionId {source}; " if isinstance(source, str) else ""


def output_text(entry: Mapping[str, Any], cap: int | None = None, *, newest: bool = True) -> str:
    """What the model reads of an observation's output, redacted: within its tool's
    budget (``newest``: it is the newest of its protected slot), cut inside its
    bulk text only; any other output cut at ``cap`` (else ``MAX_OBSERVATION_CHARS``).
    ``cap`` bounds the bulk text of every tool too (a small model's context)."""
    output = entry.get("output")
    budget = budget_of(entry)
    if budget is None or not isinstance(output, dict):
        whole = whole_text_chars(entry)
        return bounded(render(output), min(cap, whole) if cap else whole)
    chars = budget.chars if newest or not budget.newest_only else MAX_OBSERVATION_CHARS
    if cap is not None:
        chars = min(chars, cap)
    # The bundle's bound is the last resort: each budget is far inside it.
    return bounded(render(fit(output, budget, chars)), CONTEXT_BUNDLE_CHARS)


def _observation_message(entry: Mapping[str, Any], cap: int | None = None, newest: bool = True) -> dict[str, str]:
    call = entry.get("call") or f"tool {entry.get('tool', '?')}"
    head = f"Observation for action {entry.get('action_id', '?')} ({call}, status {entry.get('status', '?')}):"
    return {"role": "user", "content": f"{head}\n{_source(entry)}{output_text(entry, cap, newest=newest)}"}


def _repair_entry_message(entry: Mapping[str, Any]) -> dict[str, str]:
    detail = str(entry.get("detail", ""))
    try:
        category = RepairCategory(str(entry.get("category")))
    except ValueError:
        return {"role": "user", "content": bounded(f"Fix your previous output: {detail}", 500)}
    return repair_message(category, detail)


def plan_text(entry: Mapping[str, Any]) -> str:
    """The run's plan as it now stands (seed 004 V1.17), after the model's update:
    its revision, explanation and steps, and what is left before the final reply."""
    given = entry.get("steps")
    steps: list[Any] = given if isinstance(given, list) else []
    listed = "; ".join(f"{n}. [{step.get('status')}] {step.get('step')}" for n, step in enumerate(steps, 1)
                       if isinstance(step, dict))
    left = entry.get("unfinished") or []
    tail = f" Not completed yet: steps {', '.join(map(str, left))}." if left else " Every step is completed."
    text = f"Your plan, revision {entry.get('revision')} ({entry.get('explanation', '')}): {listed}.{tail}"
    return bounded(text, 2000)


def _call_message(entry: Mapping[str, Any]) -> dict[str, str] | None:
    """The call an observation answers, as the model wrote it (a JSON plan)."""
    tool_input = entry.get("input")
    if not isinstance(tool_input, dict):
        return None
    plan = {"actions": [{"tool": entry.get("tool"), "input": tool_input}]}
    return {"role": "assistant", "content": json.dumps(plan, ensure_ascii=False)}


def _tool_message(entry: Mapping[str, Any], cap: int | None, newest: bool) -> dict[str, str]:
    """A result in the ``tool`` role, right after the call it answers."""
    text = output_text(entry, cap, newest=newest)
    if entry.get("status") != "ok":
        text = f"{entry.get('status', 'failed')}: {_source(entry)}{entry.get('error') or text}"
    else:
        text = _source(entry) + text
    return {"role": "tool", "content": text}


_DATA_URL = re.compile(r"data:image/[a-z0-9.+-]+;base64,[A-Za-z0-9+/=]*")


def omit_data_urls(text: str) -> str:
    """``text`` with every image data URL replaced by a marker: a server that echoes
    the request (in an error, say) must not carry an image into the ledger."""
    return _DATA_URL.sub("[image data omitted]", text) if "data:image/" in text else text


def _with_images(message: dict[str, Any], images: tuple[ImagePart, ...]) -> dict[str, Any]:
    """An observation message with its images after its text, as ``image_url`` parts
    (data URLs: made here, in memory, for this one request)."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": message["content"]}]
    for image in images:
        url = f"data:{image.mime};base64,{base64.b64encode(image.data).decode('ascii')}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return {"role": message["role"], "content": parts}


def history_messages(
    history: tuple[dict[str, Any], ...],
    observation_chars: int | None = None,
    *,
    echo_calls: bool = False,
    images: tuple[ImagePart, ...] = (),
) -> list[dict[str, Any]]:
    """The history as chat messages. ``echo_calls``: each result follows the call it
    answers (an assistant message, the plan as the model wrote it) and is itself a
    ``tool`` message, for a model driven in-process that writes its plans as JSON
    text. Measured on Qwen2.5-Coder-0.5B: given results as user messages, with or
    without its own calls before them, it made the call it had just made again;
    given its call and a ``tool`` result, it went on to the next step.
    ``observation_chars``: a cap on every observation (a small context), else each
    tool's own budget (observation_budget.py)."""
    # Observations go in as user messages rather than role "tool": strict servers
    # reject tool messages without the assistant tool_calls message (and its ids)
    # before them, which the history does not keep.
    messages: list[dict[str, Any]] = []
    newest = newest_of_slots(history)
    for index, entry in enumerate(history):
        if entry.get("role") == "repair":
            messages.append(_repair_entry_message(entry))
        elif entry.get("role") == "summary":
            # Older turns, folded into a summary the model wrote (compaction).
            text = bounded(str(entry.get("text", "")), MAX_OBSERVATION_CHARS)
            messages.append({"role": "user", "content": f"Summary of the earlier part of this task: {text}"})
        elif entry.get("role") == "plan":
            messages.append({"role": "user", "content": plan_text(entry)})
        elif entry.get("role") == "user":
            # A steer: the user's own words, mid-run; the plan made before it is gone.
            text = bounded(str(entry.get("text", "")), MAX_OBSERVATION_CHARS)
            messages.append({"role": "user", "content": STEER_LEAD + text + STEER_REVIEW})
        else:
            call = _call_message(entry) if echo_calls else None
            if call is not None:
                messages += [call, _tool_message(entry, observation_chars, index in newest)]
            else:
                message: dict[str, Any] = _observation_message(entry, observation_chars, index in newest)
                mine = tuple(image for image in images if image.action_id == entry.get("action_id"))
                messages.append(_with_images(message, mine) if mine else message)
    return messages

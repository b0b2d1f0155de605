"""What of a searching turn's answer may be stored (seed 004 V1.20: "公共 Agent DB 不保存
Provider 生成的 query、搜索结果、网页 URL、引用正文或网页指令，conversation 只保存模型最终可见回复").

A provider that searched annotates its answer with what it found: ``url_citation``
annotations (a page's URL and title) on the message, and some gateways add their own
fields (``citations``, ``search_results``). The committed response is the ledger's
truth, shown by ``corral transcript``; so a searching turn's response is committed as
the envelope the plan is read from and nothing else: per choice its index, finish
reason and message (role, content, tool calls, refusal, and the thinking the handoff
removes itself), and the response's id, model and usage. Kept by name, not dropped by
name: a field a gateway invents next is left out too. A body that is no chat
completion is kept as it is; the handoff refuses or repairs it as any other.
"""

from __future__ import annotations

import json
from typing import Any

_TOP = ("id", "object", "created", "model", "system_fingerprint", "choices", "usage")
_CHOICE = ("index", "finish_reason", "message")
_MESSAGE = ("role", "content", "tool_calls", "refusal", "reasoning_content")


def without_search_trace(raw: str) -> str:
    """``raw`` (a chat completion's JSON text) without what the search left in it."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        return raw
    kept: dict[str, Any] = {key: body[key] for key in _TOP if key in body}
    kept["choices"] = [_choice(choice) for choice in body["choices"]]
    return json.dumps(kept, ensure_ascii=False)


def _choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    kept = {key: choice[key] for key in _CHOICE if key in choice}
    message = kept.get("message")
    if isinstance(message, dict):
        kept["message"] = {key: message[key] for key in _MESSAGE if key in message}
    return kept

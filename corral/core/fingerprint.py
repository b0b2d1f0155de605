"""An action's fingerprint: what the supervisor records when it prepares the action
and what the agent computes over the input it ran, so the two can be compared
(the receipt the agent builds names it: actors/action_receipt.py)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(tool: str, tool_input: dict[str, Any]) -> str:
    return sha256_hex(canonical_json({"tool": tool, "input": tool_input}))

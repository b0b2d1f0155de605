"""An executed action's receipt and observation, built where the action ran: by the
agent, from the input it ran (issue 50 §4). The supervisor only checks what it is
sent against the action's record, redacts it and stores it
(supervisor/runs/receipt_check.py); it builds them itself, with these same
functions, only for actions it ends without an agent (a denial, a refusal) and for
an input the ledger keeps redacted (its raw copy held a secret).

Names and sizes, never contents: receipts must not carry file data or secrets.
"""

from __future__ import annotations

from typing import Any

import msgspec

from corral.actors.tools.base import ToolOutcome, is_sealed
from corral.core.fingerprint import fingerprint
from corral.core.redact import summarize
from corral.mailbox.protocol import ActionResult, Receipt

#: Characters of each string of a call kept in its observation.
ECHO_CHARS = 200
#: Characters of a call's summary (``input_summary``).
CALL_CHARS = 200


def build_receipt(tool: str, tool_input: dict[str, Any]) -> Receipt:
    """What the agent reports with an action's result: the tool and fingerprint of
    what it ran (the supervisor compares them with the action's record), the call's
    summary and its input as the model's next turn shows it."""
    return Receipt(tool, fingerprint(tool, tool_input), input_summary(tool, tool_input), echo_input(tool_input))


def with_receipt(outcome: ToolOutcome, action_id: str, tool: str, tool_input: dict[str, Any]) -> ActionResult:
    """The outcome of ``tool`` run on ``tool_input`` as the agent reports it: with its receipt."""
    return msgspec.structs.replace(outcome.result(action_id), receipt=build_receipt(tool, tool_input))


def echo_input(value: Any, limit: int = ECHO_CHARS) -> Any:
    """The call's input, each string cut to ``limit``: the model's next turn shows it
    its own call, so it does not make the same one again."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + "…"
    if isinstance(value, dict):
        return {key: echo_input(item, limit) for key, item in value.items()}
    if isinstance(value, list):
        return [echo_input(item, limit) for item in value[:16]]
    return value


def input_summary(tool: str, tool_input: dict[str, Any]) -> str:
    """Names and sizes, never contents: receipts must not carry file data or secrets."""
    parts = []
    for key, value in sorted(tool_input.items()):
        if key in ("path", "label", "agent_id", "program", "cwd", "process_id", "template"):
            parts.append(f"{key}={summarize(str(value), 80)}")
        elif isinstance(value, str):
            parts.append(f"{key}=<{len(value)} chars>")
        elif is_sealed(value):
            parts.append(f"{key}=<sealed, {value['bytes']} bytes>")
        elif isinstance(value, list):
            parts.append(f"{key}=<{len(value)} items>")
        else:
            parts.append(f"{key}=<{type(value).__name__}>")
    return summarize(f"{tool}(" + ", ".join(parts) + ")", CALL_CHARS)

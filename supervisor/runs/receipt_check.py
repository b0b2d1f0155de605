"""The supervisor's side of an agent-built receipt (issue 50 §4): check it against
the action's record, then make it what the ledger may keep.

The agent builds an executed action's receipt and observation from the input it
ran (actors/action_receipt.py). Before anything is written, the supervisor checks
that it names the action's recorded tool and fingerprint (the input prepared is
the input run) and that it is within bounds; a receipt that fails any check is
refused whole (``BadRequest``), with nothing written. What passes is redacted
through the one redaction path before it is stored: an agent's text is never
trusted to be free of secrets.

When the ledger keeps the action's input redacted (its raw copy held something
redaction changed), the agent built its receipt from that raw input, where a cut
string could hide half a secret from redaction: the supervisor then builds the
call and the echo itself, from the redacted record, as it does for the actions it
ends without an agent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from corral.actors.action_receipt import CALL_CHARS, echo_input, input_summary
from corral.core.redact import redact, redact_text
from corral.mailbox.protocol import Receipt
from corral.supervisor.errors import BadRequest

#: Slack over the recorded input's size that an honest echo never exceeds (each cut
#: string gains a 3-byte ellipsis).
ECHO_SLACK_BYTES = 1024


@dataclass(frozen=True, slots=True)
class ReceiptText:
    """A receipt's call summary and input echo, as the ledger may keep them."""

    call: str
    echo: Any


def check_receipt(action: Any, receipt: Receipt) -> None:
    """Refuse (``BadRequest``) a receipt that does not match the action's record or
    its bounds; ``action``: the action's row. Writes nothing."""
    the_id = action["action_id"]
    if receipt.tool != action["tool"]:
        raise BadRequest(f"action {the_id}: the receipt names tool {receipt.tool!r}, the action is {action['tool']!r}")
    if receipt.fingerprint != action["fingerprint"]:
        raise BadRequest(
            f"action {the_id}: the receipt's fingerprint is not the action's (the input run is not the input prepared)"
        )
    if len(receipt.call) > CALL_CHARS:
        raise BadRequest(f"action {the_id}: the receipt's call is {len(receipt.call)} chars, more than {CALL_CHARS}")
    size, bound = len(msgspec.json.encode(receipt.echo)), 2 * len(action["input"]) + ECHO_SLACK_BYTES
    if size > bound:
        raise BadRequest(f"action {the_id}: the receipt's input echo is {size} bytes, more than its input allows")


def receipt_text(action: Any, receipt: Receipt | None) -> ReceiptText:
    """The call and echo to store for ``action`` (its row): the agent's, redacted,
    when it sent a checked one the record allows; else built from the record."""
    if receipt is None or action["raw_sha256"]:
        recorded = json.loads(action["input"])  # redacted when it was written
        return ReceiptText(input_summary(action["tool"], recorded), echo_input(recorded))
    return ReceiptText(redact_text(receipt.call), redact(receipt.echo))

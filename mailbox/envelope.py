"""The versioned envelope every corral message travels in."""

from __future__ import annotations

import enum
import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any

from corral import PROTOCOL_VERSION


class Kind(enum.StrEnum):
    HELLO = "hello"  # actor -> supervisor: first frame, carries the token
    WELCOME = "welcome"  # supervisor -> actor: hello accepted
    REQUEST = "request"  # expects exactly one REPLY or ERROR with corr_id = msg_id
    REPLY = "reply"
    ERROR = "error"
    TELL = "tell"  # one-way


_PREFIX = os.urandom(6).hex()
_COUNTER = itertools.count(1)


def new_msg_id() -> str:
    """Unique per process life (random prefix) and cheap (no syscall per message)."""
    return f"{_PREFIX}{next(_COUNTER):x}"


def reseed_msg_ids() -> None:
    """After fork, a child must not share its parent's id space."""
    global _PREFIX, _COUNTER
    _PREFIX = os.urandom(6).hex()
    _COUNTER = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Envelope:
    kind: Kind
    sender: str
    recipient: str
    body: dict[str, Any]
    msg_id: str = field(default_factory=new_msg_id)
    corr_id: str | None = None
    sent_at: float = field(default_factory=time.time)
    token: str | None = None
    version: int = PROTOCOL_VERSION

    def reply(self, body: dict[str, Any], sender: str | None = None) -> Envelope:
        return Envelope(Kind.REPLY, sender or self.recipient, self.sender, body, corr_id=self.msg_id)

    def error(self, code: str, message: str, sender: str | None = None) -> Envelope:
        return Envelope(
            Kind.ERROR,
            sender or self.recipient,
            self.sender,
            {"code": code, "message": message},
            corr_id=self.msg_id,
        )


#: The body op of an actor's heartbeat tell: proof of life for the supervisor's
#: stall watchdog, consumed by the tree and never dispatched.
HEARTBEAT = "heartbeat"

"""msgpack codec with strict validation.

Decoding never trusts the peer: size is checked before unpacking, msgpack's own
limits bound nested containers, and every field is type-checked, so a hostile frame
becomes a typed ``FrameError`` and never an exception from deep inside a handler.
"""

from __future__ import annotations

from typing import Any

import msgpack

from corral import PROTOCOL_VERSION
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.errors import FrameTooLarge, MalformedFrame, UnknownKind, VersionMismatch

DEFAULT_MAX_FRAME = 1024 * 1024

_FIELDS = ("v", "k", "id", "c", "s", "r", "t", "b", "a")


def encode(envelope: Envelope, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    frame: bytes = msgpack.packb(
        [
            envelope.version,
            envelope.kind.value,
            envelope.msg_id,
            envelope.corr_id,
            envelope.sender,
            envelope.recipient,
            envelope.sent_at,
            envelope.body,
            envelope.token,
        ],
        use_bin_type=True,
    )
    if len(frame) > max_frame:
        raise FrameTooLarge(f"frame of {len(frame)} bytes exceeds the {max_frame}-byte limit")
    return frame


def _expect(value: Any, types: type | tuple[type, ...], name: str) -> None:
    # bool is an int subclass; a True where a number belongs is still a wrong type.
    if isinstance(value, bool) or not isinstance(value, types):
        raise MalformedFrame(f"field {name!r} has type {type(value).__name__}")


def decode(frame: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> Envelope:
    if len(frame) > max_frame:
        raise FrameTooLarge(f"frame of {len(frame)} bytes exceeds the {max_frame}-byte limit")
    try:
        raw = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
        )
    except Exception as exc:  # msgpack raises a zoo of types for garbage
        raise MalformedFrame(f"not a msgpack frame: {type(exc).__name__}") from None
    if not isinstance(raw, list) or len(raw) != len(_FIELDS):
        raise MalformedFrame("frame is not a 9-field envelope")
    version, kind, msg_id, corr_id, sender, recipient, sent_at, body, token = raw
    _expect(version, int, "v")
    if version != PROTOCOL_VERSION:
        raise VersionMismatch(f"protocol version {version}, this side speaks {PROTOCOL_VERSION}")
    _expect(kind, str, "kind")
    try:
        kind_value = Kind(kind)
    except ValueError:
        raise UnknownKind(f"unknown kind {kind[:40]!r}") from None
    _expect(msg_id, str, "msg_id")
    if not 1 <= len(msg_id) <= 64:
        raise MalformedFrame("msg_id must be 1..64 characters")
    if corr_id is not None:
        _expect(corr_id, str, "corr_id")
    _expect(sender, str, "sender")
    _expect(recipient, str, "recipient")
    if len(sender) > 128 or len(recipient) > 128:
        raise MalformedFrame("sender/recipient longer than 128 characters")
    _expect(sent_at, (int, float), "sent_at")
    _expect(body, dict, "body")
    if not all(isinstance(key, str) for key in body):
        raise MalformedFrame("body keys must be strings")
    if token is not None:
        _expect(token, str, "token")
    return Envelope(
        kind=kind_value,
        sender=sender,
        recipient=recipient,
        body=body,
        msg_id=msg_id,
        corr_id=corr_id,
        sent_at=float(sent_at),
        token=token,
        version=version,
    )

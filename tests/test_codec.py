"""The envelope codec rejects every malformed frame with a typed error."""

from __future__ import annotations

import msgpack
import pytest

from corral import PROTOCOL_VERSION
from corral.mailbox import DEFAULT_MAX_FRAME, Envelope, Kind, decode, encode
from corral.mailbox.errors import FrameTooLarge, MalformedFrame, UnknownKind, VersionMismatch


def _raw(**overrides: object) -> bytes:
    fields = {
        "v": PROTOCOL_VERSION,
        "k": "request",
        "id": "abc",
        "c": None,
        "s": "a",
        "r": "b",
        "t": 1.0,
        "b": {"x": 1},
        "a": None,
    }
    fields.update(overrides)
    return msgpack.packb(list(fields.values()), use_bin_type=True)


def test_roundtrip_keeps_every_field() -> None:
    env = Envelope(Kind.REQUEST, "alice", "bob", {"n": [1, 2], "s": "x"}, corr_id="c1", token="t")
    back = decode(encode(env))
    assert back == env


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (b"\xc1garbage", MalformedFrame),
        (b"", MalformedFrame),
        (msgpack.packb({"not": "a list"}), MalformedFrame),
        (msgpack.packb([1, 2, 3]), MalformedFrame),
        (_raw(k="teleport"), UnknownKind),
        (_raw(v=PROTOCOL_VERSION + 1), VersionMismatch),
        (_raw(v=True), MalformedFrame),
        (_raw(id=7), MalformedFrame),
        (_raw(id=""), MalformedFrame),
        (_raw(b=[1, 2]), MalformedFrame),
        (_raw(t="yesterday"), MalformedFrame),
        (_raw(s="x" * 200), MalformedFrame),
        (_raw(a=123), MalformedFrame),
    ],
)
def test_malformed_frames_are_rejected_with_a_typed_error(frame: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        decode(frame)


def test_non_string_body_keys_are_rejected() -> None:
    frame = msgpack.packb([PROTOCOL_VERSION, "tell", "i", None, "a", "b", 1.0, {1: 2}, None])
    with pytest.raises(MalformedFrame):
        decode(frame)


def test_oversized_frames_are_rejected_both_ways() -> None:
    big = Envelope(Kind.TELL, "a", "b", {"blob": "x" * (DEFAULT_MAX_FRAME + 1)})
    with pytest.raises(FrameTooLarge):
        encode(big)
    with pytest.raises(FrameTooLarge):
        decode(b"\x00" * (DEFAULT_MAX_FRAME + 1))
    small_limit = 2048
    with pytest.raises(FrameTooLarge):
        decode(encode(Envelope(Kind.TELL, "a", "b", {"blob": "y" * 3000})), max_frame=small_limit)


def test_error_codes_are_stable() -> None:
    assert MalformedFrame.code == "malformed-frame"
    assert FrameTooLarge.code == "frame-too-large"
    assert UnknownKind.code == "unknown-kind"
    assert VersionMismatch.code == "protocol-version"

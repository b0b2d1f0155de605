"""Envelopes, the msgpack codec, actor links (nng by default, or raw Unix stream
sockets), the nng control protocol and request/reply."""

from corral.mailbox.codec import DEFAULT_MAX_FRAME, decode, encode
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.errors import (
    DeadlineExceeded,
    FrameError,
    FrameTooLarge,
    MailboxFull,
    MalformedFrame,
    RemoteError,
)

__all__ = [
    "DEFAULT_MAX_FRAME",
    "DeadlineExceeded",
    "Envelope",
    "FrameError",
    "FrameTooLarge",
    "Kind",
    "MailboxFull",
    "MalformedFrame",
    "RemoteError",
    "decode",
    "encode",
]

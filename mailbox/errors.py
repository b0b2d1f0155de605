"""Typed errors of the mailbox layer."""

from __future__ import annotations

from corral.core.errors import CorralError


class FrameError(ValueError):
    """A frame that cannot be accepted. ``code`` is stable and machine-readable."""

    code = "bad-frame"


class MalformedFrame(FrameError):
    code = "malformed-frame"


class FrameTooLarge(FrameError):
    code = "frame-too-large"


class UnknownKind(MalformedFrame):
    code = "unknown-kind"


class VersionMismatch(FrameError):
    code = "protocol-version"


class DeadlineExceeded(CorralError, TimeoutError):
    """A request got no reply before its deadline."""


class MailboxFull(RuntimeError):
    """A bounded mailbox stayed full past the send deadline."""


class ChannelClosed(ConnectionError):
    """The peer went away."""


class RemoteError(CorralError, RuntimeError):
    """The peer answered with an error envelope."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

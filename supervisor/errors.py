"""Errors the supervisor answers with; ``code`` travels to the caller unchanged."""

from __future__ import annotations

from corral.mailbox.protocol import Code


class SupervisorError(RuntimeError):
    """What the supervisor answers a caller with: a message, and a ``code`` named by
    keyword (the wire's error envelope, ``RemoteError``, is built ``(code, message)``;
    a keyword keeps the two orders from being confused)."""

    code: str = Code.ERROR

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class BadRequest(SupervisorError):
    code = Code.BAD_REQUEST


class NotFound(SupervisorError):
    code = Code.NOT_FOUND


class Conflict(SupervisorError):
    code = Code.CONFLICT


class Refused(SupervisorError):
    code = Code.REFUSED


class StorageFull(SupervisorError):
    """The ledger's disk is full (or failing): nothing was committed, no step was
    taken. The supervisor keeps running read-only and resumes by itself."""

    code = Code.DISK_FULL

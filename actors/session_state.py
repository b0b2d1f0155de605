"""A process session's vocabulary: its states and their one transition table, its
errors, and the cursors that name a byte offset in its transcript.

Both sides use it: the engine (:mod:`corral.actors.pty_session`, inside the session
actor) and the supervisor's durable session records (``supervisor/sessions/``),
which follow the same table one ledger event per change and check the same
cursors. It imports no trio and no sandbox, so the supervisor reads the table
without loading the engine. An illegal move raises the one
:class:`~corral.core.transitions.IllegalTransition` every state machine raises.
"""

from __future__ import annotations

import base64
import binascii
import enum
import secrets
import signal
from collections.abc import Mapping

from corral.core.transitions import IllegalTransition

CURSOR_VERSION = 1
#: The largest stdin write a session takes, its newline included (seed 004 V1.10:
#: 8 KiB); the supervisor refuses larger ones first.
MAX_STDIN_BYTES = 8 * 1024


class SessionState(enum.StrEnum):
    PREPARED = "prepared"
    LAUNCHING = "launching"
    RUNNING = "running"
    TERMINATING = "terminating"
    EXITED = "exited"
    TERMINATED = "terminated"
    TIMED_OUT = "timed-out"
    OUTPUT_LIMIT_EXCEEDED = "output-limit-exceeded"
    FAILED = "failed"
    NEEDS_RECONCILIATION = "needs-reconciliation"


S = SessionState

TERMINAL_STATES: frozenset[SessionState] = frozenset(
    {S.EXITED, S.TERMINATED, S.TIMED_OUT, S.OUTPUT_LIMIT_EXCEEDED, S.FAILED, S.NEEDS_RECONCILIATION}
)

#: The one transition table (the ledger can reuse it). Terminal states have none.
TRANSITIONS: Mapping[SessionState, frozenset[SessionState]] = {
    # Terminated straight from prepared: stopped before anything was launched. A
    # prepared session an older boot left is checked by a person, not failed on the
    # theory that it never spawned (seed 004 V1.10: "对旧 boot 的 prepared 也采取保守核对").
    S.PREPARED: frozenset({S.LAUNCHING, S.TERMINATED, S.FAILED, S.NEEDS_RECONCILIATION}),
    S.LAUNCHING: frozenset({S.RUNNING, S.FAILED, S.NEEDS_RECONCILIATION}),
    S.RUNNING: frozenset(
        {S.TERMINATING, S.EXITED, S.OUTPUT_LIMIT_EXCEEDED, S.FAILED, S.NEEDS_RECONCILIATION}
    ),
    S.TERMINATING: frozenset(
        {S.TERMINATED, S.TIMED_OUT, S.OUTPUT_LIMIT_EXCEEDED, S.FAILED, S.NEEDS_RECONCILIATION}
    ),
    **{state: frozenset() for state in TERMINAL_STATES},
}


class SessionError(RuntimeError):
    """Base class; ``code`` is stable and machine-readable.

    An illegal move is not one of these: it is the shared ``IllegalTransition``,
    which carries a ``code`` too, so whoever answers a session request with a
    code catches both."""

    code = "session-error"


class InvalidCursor(SessionError, ValueError):
    code = "invalid-cursor"


class SessionNotRunning(SessionError):
    code = "process-not-running"


class BadSessionInput(SessionError, ValueError):
    code = "bad-input"


def is_terminal(state: SessionState) -> bool:
    return state in TERMINAL_STATES


def signal_of(state: SessionState, exit_code: int | None) -> str | None:
    """The signal that ended a process, by name, else None (seed 004 V1.10: "未终态时
    exitCode / signal 为空"). The exit code follows the shell's convention, the one
    bwrap reports a signalled target by: 128+N for signal N (so a program that
    itself exits 130 reads as SIGINT, as a shell would say)."""
    if not is_terminal(state) or exit_code is None or not 128 < exit_code <= 128 + 64:
        return None
    try:
        return signal.Signals(exit_code - 128).name
    except ValueError:
        return None


def check_transition(old: SessionState, new: SessionState) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"illegal session transition {old} -> {new}")


def new_process_id() -> str:
    """An opaque, unguessable process id (one per start action)."""
    return "proc-" + secrets.token_urlsafe(12)


def encode_cursor(process_id: str, offset: int) -> str:
    raw = f"{CURSOR_VERSION}|{offset}|{process_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, process_id: str) -> int:
    """The byte offset a cursor names; refuses cursors of other sessions or versions."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        version, offset, owner = (
            base64.urlsafe_b64decode(padded.encode()).decode().split("|", 2)
        )
        number = int(offset)
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidCursor("malformed cursor") from None
    if version != str(CURSOR_VERSION):
        raise InvalidCursor(f"cursor version {version!r} is not supported")
    if owner != process_id:
        raise InvalidCursor("cursor belongs to another process")
    if number < 0:
        raise InvalidCursor("negative cursor offset")
    return number

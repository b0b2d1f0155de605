"""Process sessions and one-shot commands (supervisor/sessions/session_service.py).

The agent's tools (actors/tools/process.py, preview.py) start, poll, write to and
stop the process sessions of their run, and record a ``command.exec`` launch; a
session actor (actors/session.py) commits its own launch and state changes.
Bounds are the ones the handlers checked by hand before these records: a process
id is at most 64 characters, a poll at most 32 KiB of text and 30 s of waiting.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from corral.mailbox.protocol.base import Ack, Id, Method, Request

#: Every process id is derived from its start action (``proc-`` and a digest).
ProcessId = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
#: SQLite's integers are signed 64-bit.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
#: How one launch ran: a corral.sandbox.bwrap.LaunchMode (checked by the supervisor).
LaunchModeName = Annotated[str, msgspec.Meta(min_length=1, max_length=40)]

MAX_ARGS = 256
MAX_TIMEOUT_S = 24 * 3600.0
#: A model's poll (seed 004 V1.10): 8,000 characters by default, at most 16,000; a
#: wait of at most 30,000 ms. The tool's schema (actors/tools/process.py) holds to them too.
DEFAULT_POLL_CHARS = 8000
MAX_POLL_CHARS = 16_000
MAX_POLL_WAIT_MS = 30_000
MAX_CURSOR_CHARS = 200


class SessionView(msgspec.Struct, kw_only=True):
    """``session.start``'s and ``session.terminate``'s reply: the session as the
    ledger holds it (supervisor/sessions/session_store.py ``session_view``); the
    tools hand it to the model as their output."""

    process_id: str
    #: Its state (a corral.supervisor.sessions.session_state.SessionState value).
    status: str
    #: How it was launched (a LaunchMode value); None before the launch.
    launch_mode: str | None
    exit_code: int | None
    #: The cursor of its output's start (``process.poll`` reads on from it).
    cursor: str
    #: Why it failed or needs reconciliation, and the code of that; None otherwise.
    error: str | None
    code: str | None


class SessionOutput(msgspec.Struct, kw_only=True):
    """``session.poll``'s reply: the output from the cursor on, from the live
    session actor (``live``) or, once it is gone, from its private transcript."""

    process_id: str
    chunk: str
    next_cursor: str
    status: str
    exit_code: int | None
    #: More output past ``next_cursor`` already.
    more: bool
    live: bool
    #: The seed's status facts (V1.10: "stdinOpen / exitCode / signal / outputBytes /
    #: outputSha256 / … / needsReconciliation"): whether stdin still reaches the
    #: process; the signal that ended it (None before its end); the size and digest of
    #: its sanitized output so far; whether its end needs a person.
    stdin_open: bool = False
    signal: str | None = None
    output_bytes: int = 0
    output_sha256: str = ""
    needs_reconciliation: bool = False
    #: Whether the project's sources changed since the launch (None: not known, once
    #: the session's actor is gone).
    source_changed: bool | None = None
    #: The loopback ports the live session's processes listen on where the host
    #: reaches them (``preview.validate`` checks only these: seed 004 V1.1 §3).
    listening: list[int] = msgspec.field(default_factory=list)


class StdinWritten(msgspec.Struct, kw_only=True):
    """``session.stdin``'s reply: what reached the terminal, as a count and a digest
    only (the text itself goes no further than the PTY)."""

    process_id: str
    bytes_written: int
    sha256: str
    eof: bool
    #: False when the process stopped reading before all of it was written.
    complete: bool
    status: str


class SealedValue(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A sealed input field as the plan holds it (supervisor/runs/sealed_input.py):
    its digest and size; the value itself waits in the supervisor's spool."""

    sealed: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    bytes: Annotated[int, msgspec.Meta(ge=0)]

    def marker(self) -> dict[str, Any]:
        return {"sealed": self.sealed, "bytes": self.bytes}


class SessionStart(Request[SessionView], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``session.start``: the executing ``process.start`` action's program on a terminal."""

    METHOD: ClassVar[Method] = Method.SESSION_START
    run_id: Id
    action_id: Id
    program: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    args: Annotated[list[str], msgspec.Meta(max_length=MAX_ARGS)] = msgspec.field(default_factory=list)
    cwd: Annotated[str, msgspec.Meta(max_length=4096)] = "."
    timeout_s: Annotated[float, msgspec.Meta(ge=0.001, le=MAX_TIMEOUT_S)] | None = None


class SessionPoll(Request[SessionOutput], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``session.poll``: the run's process's output from ``cursor`` on."""

    METHOD: ClassVar[Method] = Method.SESSION_POLL
    run_id: Id
    process_id: ProcessId
    cursor: Annotated[str, msgspec.Meta(max_length=MAX_CURSOR_CHARS)] | None = None
    max_chars: Annotated[int, msgspec.Meta(ge=1, le=MAX_POLL_CHARS)] = DEFAULT_POLL_CHARS
    wait_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_POLL_WAIT_MS)] = 0


class SessionStdin(Request[StdinWritten], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``session.stdin``: text (or a sealed value of ``action_id``) to the run's process."""

    METHOD: ClassVar[Method] = Method.SESSION_STDIN
    run_id: Id
    process_id: ProcessId
    action_id: Id | None = None
    data: str | SealedValue = ""
    append_newline: bool = False
    eof: bool = False


class SessionTerminate(Request[SessionView], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``session.terminate``: the run's process to its end (two-phase)."""

    METHOD: ClassVar[Method] = Method.SESSION_TERMINATE
    run_id: Id
    process_id: ProcessId


class SessionLaunched(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``session.launched``: a session actor's launch record, before COMMIT_EXEC."""

    METHOD: ClassVar[Method] = Method.SESSION_LAUNCHED
    process_id: ProcessId
    launch_mode: LaunchModeName


class SessionStateReport(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``session.state``: a session actor's state change (corral.actors.session_state)."""

    METHOD: ClassVar[Method] = Method.SESSION_STATE
    process_id: ProcessId
    state: Annotated[str, msgspec.Meta(min_length=1, max_length=40)]
    exit_code: Int64 | None = None
    output_bytes: Int64 | None = None
    launch_mode: LaunchModeName | None = None
    #: Kept to 1000 and 60 characters by the supervisor.
    reason: Annotated[str, msgspec.Meta(max_length=100_000)] | None = None
    code: Annotated[str, msgspec.Meta(max_length=10_000)] | None = None


class SandboxGrant(msgspec.Struct, kw_only=True):
    """``command.sandbox``'s reply: the sandbox a command runs in (its project root
    and the run's scoped sandbox settings, sandbox/profile.py reads them)."""

    project_root: str
    sandbox: dict[str, Any]


class CommandSandbox(Request[SandboxGrant], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``command.sandbox``: the sandbox the executing ``command.exec`` action runs in."""

    METHOD: ClassVar[Method] = Method.COMMAND_SANDBOX
    run_id: Id
    action_id: Id


class CommandLaunched(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``command.launched``: a command's durable launch record, before COMMIT_EXEC."""

    METHOD: ClassVar[Method] = Method.COMMAND_LAUNCHED
    run_id: Id
    action_id: Id
    launch_mode: LaunchModeName


#: Sessions' and commands' requests (the package's ``TypedRequest`` includes them).
SessionRequest = (
    SessionStart
    | SessionPoll
    | SessionStdin
    | SessionTerminate
    | SessionLaunched
    | SessionStateReport
    | CommandSandbox
    | CommandLaunched
)

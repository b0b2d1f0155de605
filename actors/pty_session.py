"""Process sessions: one PTY, its output pump and its child, owned by one object.

:class:`PtySession` is the engine a session actor wraps; it knows nothing about the
ledger. Durable commits hook in through two callbacks:

* ``on_ready(ReadyInfo)`` runs inside the launch handshake, after the sandboxed
  trampoline reported SANDBOX_READY and before the target is executed. Commit the
  launch record there; if it raises, the tree is killed and reaped, the target runs
  zero times and :meth:`PtySession.start` re-raises.
* ``on_state(StateChange)`` runs after every state transition, serialized and in
  order. The terminal transition happens only after the tree is confirmed dead
  and the PTY is drained, so a terminal record written there is final. Anything
  that could not be confirmed ends as ``needs-reconciliation``.

Output is sanitized incrementally (whole lines, or a quiet partial line such as a
prompt) into an append-only private transcript; cursors are byte offsets into it,
so polling never moves hidden state and a cursor always names the same bytes.

:func:`run_command` is the one-shot counterpart (pipes, no PTY) with bounded
head/tail capture and a full sanitized transcript file for paging.
"""

from __future__ import annotations

import base64
import binascii
import collections
import enum
import errno
import fcntl
import hashlib
import math
import os
import re
import secrets
import signal
import struct
import termios
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import trio

from corral.sandbox.bwrap import SANDBOX_HOME, LaunchMode, SandboxProfile, resolve_launch_mode
from corral.sandbox.exec_handshake import OnReady, ReadyInfo, default_env, launch_with_handshake
from corral.sandbox.launched_process import LaunchedProcess, LaunchError
from corral.sandbox.tree_guard import GuardReport

from .sanitize import Roots, default_roots, sanitize_output

#: Per-session output cap (raw bytes read from the PTY).
OUTPUT_LIMIT_BYTES = 256 * 1024
#: Default cap for one-shot commands, whose transcript is paged rather than polled.
COMMAND_OUTPUT_LIMIT_BYTES = 4 * 1024 * 1024
TERM_COLS = 120
TERM_ROWS = 30
GRACE_S = 0.8
CURSOR_VERSION = 1
MAX_STDIN_BYTES = 64 * 1024
MAX_POLL_CHARS = 256 * 1024
MAX_WAIT_MS = 60_000
MAX_TRANSCRIPT_PAGE = 10_000

#: A partial line (a prompt) is published after this much output silence.
_QUIET_S = 0.05
#: Output held back waiting for a newline before it is committed anyway.
_MAX_PENDING = 64 * 1024
_REAP_TIMEOUT_S = 5.0
_DRAIN_TIMEOUT_S = 2.0
_STDIN_TIMEOUT_S = 5.0


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
    # Terminated straight from prepared: stopped before anything was launched.
    S.PREPARED: frozenset({S.LAUNCHING, S.TERMINATED, S.FAILED}),
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
    """Base class; ``code`` is stable and machine-readable."""

    code = "session-error"


class IllegalTransition(SessionError):
    code = "illegal-transition"


class InvalidCursor(SessionError, ValueError):
    code = "invalid-cursor"


class SessionNotRunning(SessionError):
    code = "process-not-running"


class BadSessionInput(SessionError, ValueError):
    code = "bad-input"


def is_terminal(state: SessionState) -> bool:
    return state in TERMINAL_STATES


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


# --------------------------------------------------------------------------------------
# Incremental sanitizing
# --------------------------------------------------------------------------------------

_COMPLETE_ESCAPE = re.compile(
    rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)"
    rb"|[ -/]+[0-~]|[0-OQ-WYZ\\`-~])"
)


def _safe_cut(buf: bytes | bytearray, *, pem: bool = True) -> int:
    """How much of ``buf`` can be sanitized now without splitting a UTF-8 character,
    an escape sequence, a ``\\r\\n`` pair or (``pem``) a key block still arriving."""
    cut = len(buf)
    if cut and buf[cut - 1] == 0x0D:
        cut -= 1
    for back in range(1, min(4, cut) + 1):
        byte = buf[cut - back]
        if byte & 0xC0 == 0x80:
            continue
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            if need > back:
                cut -= back
        break
    esc = buf.rfind(b"\x1b", max(0, cut - 512), cut)
    if esc >= 0:
        match = _COMPLETE_ESCAPE.match(bytes(buf[esc:cut]))
        if match is None:
            cut = esc
    if pem:
        cut = _before_open_pem(buf, cut)
    return cut


def _before_open_pem(buf: bytes | bytearray, cut: int) -> int:
    # The redactor matches a private key only as a whole block; committing its first
    # half would publish it.
    begin = buf.rfind(b"-----BEGIN ", 0, cut)
    if begin >= 0 and buf.find(b"-----END ", begin, cut) < 0:
        return begin
    return cut


class IncrementalSanitizer:
    """Raw output in, sanitized text out, committed at boundaries that do not change
    what :func:`sanitize_output` would make of the whole."""

    def __init__(self, roots: Roots | None, max_pending: int = _MAX_PENDING) -> None:
        self._roots = roots
        self._pending = bytearray()
        self._max_pending = max_pending

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def _commit(self, cut: int) -> str:
        if cut <= 0:
            return ""
        raw = bytes(self._pending[:cut])
        del self._pending[:cut]
        return sanitize_output(raw.decode("utf-8", errors="replace"), self._roots)

    def feed(self, data: bytes) -> str:
        """Sanitized text of the complete lines now available."""
        self._pending += data
        cut = _before_open_pem(self._pending, self._pending.rfind(b"\n") + 1)
        if len(self._pending) - cut > self._max_pending:
            # Bounded memory beats perfect redaction of a "key" that never ends.
            cut = _safe_cut(self._pending, pem=False) or len(self._pending)
        return self._commit(cut)

    def flush(self) -> str:
        """Commit a partial line (a prompt) except an unfinished sequence at its end."""
        return self._commit(_safe_cut(self._pending, pem=len(self._pending) <= self._max_pending))

    def finish(self) -> str:
        return self._commit(len(self._pending))


# --------------------------------------------------------------------------------------
# Shared supervision of a launched tree
# --------------------------------------------------------------------------------------


class _Stop(enum.Enum):
    EXIT = "exit"
    TERMINATE = "terminate"
    KILL = "kill"
    CAP = "cap"
    TIMEOUT = "timeout"


async def _watch_exit(proc: LaunchedProcess, stops: trio.MemorySendChannel[_Stop]) -> None:
    await proc.wait_exit()
    stops.send_nowait(_Stop.EXIT)


async def _run_to_end(
    proc: LaunchedProcess,
    stops: trio.MemoryReceiveChannel[_Stop],
    deadline: float,
    grace_s: float,
    on_terminating: Callable[[], Awaitable[None]],
) -> tuple[SessionState, bool]:
    """Wait for the first stop reason, end the tree accordingly, confirm it is dead.

    Returns the outcome and whether the whole tree was confirmed dead.
    """
    reason = _Stop.TIMEOUT
    with trio.move_on_at(deadline):
        reason = await stops.receive()
    if reason is _Stop.EXIT:
        outcome = S.EXITED
        # The leader is gone; what is left of its group (unsandboxed: background
        # jobs) has no session to belong to any more.
        proc.kill_tree()
    else:
        await on_terminating()
        if reason is _Stop.CAP or reason is _Stop.KILL:
            outcome = S.OUTPUT_LIMIT_EXCEEDED if reason is _Stop.CAP else S.TERMINATED
            proc.kill_tree()
        else:
            outcome = S.TIMED_OUT if reason is _Stop.TIMEOUT else S.TERMINATED
            proc.signal_group(signal.SIGTERM)
            # The full grace even if the leader exits first: its children may still be
            # flushing or cleaning up, and they are why the group gets the signal.
            with trio.move_on_after(grace_s):
                while True:
                    late = await stops.receive()
                    if late is _Stop.CAP:
                        outcome = S.OUTPUT_LIMIT_EXCEEDED
                        break
                    if late is _Stop.KILL:
                        break
            proc.kill_tree()
    confirmed = await proc.wait_tree_dead(_REAP_TIMEOUT_S)
    return outcome, confirmed


# --------------------------------------------------------------------------------------
# PtySession
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateChange:
    """What ``on_state`` gets after each transition."""

    process_id: str
    old: SessionState
    new: SessionState
    exit_code: int | None
    launch_mode: LaunchMode | None
    output_bytes: int


class PollResult(NamedTuple):
    chunk: str
    next_cursor: str
    state: SessionState
    exit_code: int | None


@dataclass(frozen=True)
class StdinReceipt:
    """All that is kept of a stdin write: never the content itself."""

    bytes_written: int
    sha256: str
    eof: bool
    complete: bool


OnState = Callable[[StateChange], Awaitable[None]]


def _open_private(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)


def _session_roots(profile: SandboxProfile, roots: Roots | None) -> Roots:
    if roots is not None:
        return roots
    pairs = list(default_roots(profile.project_root).items())
    pairs.append(("<home>", SANDBOX_HOME))
    return pairs


class PtySession:
    """One process session. Use as ``async with PtySession(...) as session:``.

    The session's nursery (the output pump, the exit watcher, the lifecycle) lives
    inside the ``async with``; leaving it terminates a still-running process (two
    phases on a normal exit, SIGKILL when leaving by exception or cancellation).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        profile: SandboxProfile,
        process_id: str | None = None,
        timeout_s: float | None = None,
        on_ready: OnReady | None = None,
        on_state: OnState | None = None,
        env: Mapping[str, str] | None = None,
        launch_mode: LaunchMode | None = None,
        output_limit_bytes: int = OUTPUT_LIMIT_BYTES,
        grace_s: float = GRACE_S,
        transcript_path: Path | None = None,
        roots: Roots | None = None,
        echo: bool = True,
    ) -> None:
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise BadSessionInput("argv must be a non-empty list of strings without NUL")
        if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise BadSessionInput("timeout_s must be a positive number")
        if output_limit_bytes <= 0:
            raise BadSessionInput("output_limit_bytes must be positive")
        self.argv = tuple(argv)
        self.cwd = Path(cwd)
        self.profile = profile
        self.process_id = process_id or new_process_id()
        self.timeout_s = timeout_s
        self._on_ready = on_ready
        self._on_state = on_state
        self._env = env
        self._requested_mode = launch_mode
        self._limit = output_limit_bytes
        self._grace_s = grace_s
        self._transcript_path = transcript_path
        self._echo = echo
        self._sanitizer = IncrementalSanitizer(_session_roots(profile, roots))

        self._state = S.PREPARED
        self.exit_code: int | None = None
        self.launch_mode: LaunchMode | None = None
        self.ready_info: ReadyInfo | None = None
        self._transcript = bytearray()
        self._transcript_fd: int | None = None
        self._raw_total = 0
        self._cap_hit = False
        self._master: int | None = None
        self._proc: LaunchedProcess | None = None
        self._nursery: trio.Nursery | None = None
        self._state_lock = trio.Lock()
        self._stdin_lock = trio.Lock()
        self._line_dirty = False
        self._changed = trio.Event()
        self._terminal = trio.Event()
        self._stops_send, self._stops_recv = trio.open_memory_channel[_Stop](math.inf)
        self._pump_scope = trio.CancelScope()
        self._pump_done = trio.Event()
        self._pump_eof = False
        self._lifecycle_done = trio.Event()
        self._running = trio.Event()
        self._ctx: AbstractAsyncContextManager[PtySession] | None = None

    # -- context ----------------------------------------------------------------------

    @asynccontextmanager
    async def _context(self) -> AsyncIterator[PtySession]:
        body_error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                yield self
            except BaseException as exc:
                # Re-raised below, outside the nursery, so the caller gets its own
                # exception back rather than wrapped in an ExceptionGroup.
                body_error = exc
            finally:
                with trio.CancelScope(shield=True):
                    await self._shutdown(graceful=body_error is None)
                nursery.cancel_scope.cancel()
        if body_error is not None:
            raise body_error

    async def __aenter__(self) -> PtySession:
        if self._ctx is not None:
            raise SessionError("a PtySession is entered once")
        ctx = self._context()
        self._ctx = ctx
        return await ctx.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._ctx is not None
        return await self._ctx.__aexit__(exc_type, exc, tb)

    async def _shutdown(self, graceful: bool) -> None:
        if self._state is S.PREPARED:
            await self._set_state(S.TERMINATED)
            return
        if self._proc is None or self._lifecycle_done.is_set():
            return
        self._stops_send.send_nowait(_Stop.TERMINATE if graceful else _Stop.KILL)
        await self._lifecycle_done.wait()

    # -- state ------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def output_bytes(self) -> int:
        return len(self._transcript)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _set_state(self, new: SessionState) -> None:
        async with self._state_lock:
            old = self._state
            check_transition(old, new)
            self._state = new
            if is_terminal(new):
                self._terminal.set()
            self._notify()
            if self._on_state is not None:
                await self._on_state(
                    StateChange(
                        self.process_id, old, new, self.exit_code, self.launch_mode,
                        len(self._transcript),
                    )
                )

    def _force_unreconciled(self) -> None:
        # Last resort when the lifecycle itself died: no hook (it may be what failed).
        if not is_terminal(self._state):
            self._state = S.NEEDS_RECONCILIATION
            self._terminal.set()
            self._notify()

    # -- launch -----------------------------------------------------------------------

    async def _ready(self, info: ReadyInfo) -> None:
        self.ready_info = info
        if self._on_ready is not None:
            await self._on_ready(info)

    def _open_pty(self) -> tuple[int, int]:
        master, slave = os.openpty()
        try:
            attrs = termios.tcgetattr(slave)
            if not self._echo:
                attrs[3] &= ~(termios.ECHO | termios.ECHONL)
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
            winsize = struct.pack("HHHH", TERM_ROWS, TERM_COLS, 0, 0)
            fcntl.ioctl(master, termios.TIOCSWINSZ, winsize)
            os.set_blocking(master, False)
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
        return master, slave

    async def start(self) -> None:
        """Launch through the handshake; returns once the target runs (RUNNING).

        Raises ``SandboxUnavailable``, ``HandshakeError``, ``TargetExecFailed`` or
        whatever ``on_ready`` raised; the state is then ``failed`` (or
        ``needs-reconciliation`` if the tree could not be confirmed dead).
        """
        if self._nursery is None:
            raise SessionError("start() needs `async with PtySession(...)` first")
        check_transition(self._state, S.LAUNCHING)
        master = slave = -1
        try:
            await self._set_state(S.LAUNCHING)
            mode = self._requested_mode or resolve_launch_mode(
                self.profile.mode, executable=self.profile.bwrap
            )
            self.launch_mode = mode
            if self._transcript_path is not None:
                self._transcript_fd = _open_private(self._transcript_path)
            master, slave = self._open_pty()
            env = dict(self._env) if self._env is not None else default_env(
                {"TERM": "dumb"}, home=mode is LaunchMode.UNSANDBOXED
            )
            try:
                proc = await launch_with_handshake(
                    self.argv,
                    cwd=self.cwd,
                    profile=self.profile,
                    on_ready=self._ready,
                    launch_mode=mode,
                    env=env,
                    stdin=slave,
                    stdout=slave,
                    stderr=slave,
                    controlling_tty=True,
                )
            finally:
                # The child holds the slave now; ours would keep EOF from ever coming.
                os.close(slave)
        except BaseException as exc:
            if master >= 0:
                os.close(master)
            self._close_transcript()
            reaped = exc.tree_reaped if isinstance(exc, LaunchError) else True
            if not is_terminal(self._state):
                with trio.CancelScope(shield=True):
                    await self._set_state(S.FAILED if reaped else S.NEEDS_RECONCILIATION)
            raise
        self._proc = proc
        self._master = master
        self._nursery.start_soon(self._pump)
        self._nursery.start_soon(_watch_exit, proc, self._stops_send.clone())
        self._nursery.start_soon(self._lifecycle, proc)
        try:
            await self._set_state(S.RUNNING)
        finally:
            # Only now may the lifecycle act (and its transitions follow RUNNING); if
            # committing RUNNING failed, leaving the `async with` kills the process.
            self._running.set()

    # -- output -----------------------------------------------------------------------

    def _append(self, text: str) -> None:
        if not text:
            return
        data = text.encode()
        room = self._limit - len(self._transcript)
        if len(data) > room:
            # Redaction placeholders can outgrow what they replace; the transcript
            # stays within the cap, cut on a character boundary.
            data = data[: max(room, 0)].decode("utf-8", errors="ignore").encode()
        if not data:
            return
        self._transcript += data
        if self._transcript_fd is not None:
            os.write(self._transcript_fd, data)
        self._notify()

    def _ingest(self, data: bytes) -> None:
        if self._cap_hit:
            return  # draining after the cap: read and discard
        room = self._limit - self._raw_total
        if len(data) > room:
            data = data[:room]
            self._cap_hit = True
        self._raw_total += len(data)
        self._append(self._sanitizer.feed(data))
        if self._cap_hit:
            self._append(self._sanitizer.finish())
            if self._proc is not None:
                self._proc.kill_tree()
            self._stops_send.send_nowait(_Stop.CAP)

    async def _pump(self) -> None:
        with self._pump_scope:
            try:
                await self._pump_loop()
                self._pump_eof = True
            finally:
                self._append(self._sanitizer.finish())
                self._pump_done.set()

    async def _pump_loop(self) -> None:
        master = self._master
        assert master is not None
        flushed = True
        while True:
            if not flushed and self._sanitizer.has_pending:
                with trio.move_on_after(_QUIET_S) as quiet:
                    await trio.lowlevel.wait_readable(master)
                if quiet.cancelled_caught:
                    self._append(self._sanitizer.flush())
                    flushed = True
                    continue
            else:
                await trio.lowlevel.wait_readable(master)
            try:
                data = os.read(master, 65536)
            except BlockingIOError:
                continue
            except OSError as exc:
                # EIO: every holder of the slave side has closed it.
                if exc.errno == errno.EIO:
                    return
                raise
            if not data:
                return
            flushed = False
            self._ingest(data)

    async def _drain(self) -> bool:
        with trio.move_on_after(_DRAIN_TIMEOUT_S):
            await self._pump_done.wait()
        if not self._pump_done.is_set():
            # Someone outside the tree we could reach still holds the terminal.
            self._pump_scope.cancel()
            await self._pump_done.wait()
        return self._pump_eof

    def _master_fd(self) -> int | None:
        return self._master

    def _close_master(self) -> None:
        if self._master is not None:
            fd, self._master = self._master, None
            trio.lowlevel.notify_closing(fd)
            os.close(fd)

    def _close_transcript(self) -> None:
        if self._transcript_fd is not None:
            fd, self._transcript_fd = self._transcript_fd, None
            os.close(fd)

    # -- lifecycle --------------------------------------------------------------------

    async def _lifecycle(self, proc: LaunchedProcess) -> None:
        try:
            await self._running.wait()
            deadline = math.inf if self.timeout_s is None else trio.current_time() + self.timeout_s
            outcome, confirmed = await _run_to_end(
                proc, self._stops_recv, deadline, self._grace_s, self._enter_terminating
            )
            drained = await self._drain()
            if proc.guard_report is not None and not proc.guard_report.clean:
                self._append(f"\r\n[corral] {proc.guard_report.notice()}\r\n")
            self.exit_code = proc.returncode
            if self._cap_hit:
                outcome = S.OUTPUT_LIMIT_EXCEEDED
            if not (confirmed and drained):
                outcome = S.NEEDS_RECONCILIATION
            self._close_master()
            self._close_transcript()
            if confirmed:
                proc.close()
            await self._set_state(outcome)
        finally:
            if not is_terminal(self._state):
                with trio.CancelScope(shield=True):
                    proc.kill_tree()
                    if await proc.wait_tree_dead(_REAP_TIMEOUT_S):
                        proc.close()
                    self._pump_scope.cancel()
                    await self._pump_done.wait()
                    self.exit_code = proc.returncode
                    self._close_master()
                    self._close_transcript()
                    self._force_unreconciled()
            self._lifecycle_done.set()

    async def _enter_terminating(self) -> None:
        await self._set_state(S.TERMINATING)

    # -- public API -------------------------------------------------------------------

    def initial_cursor(self) -> str:
        return encode_cursor(self.process_id, 0)

    async def poll(
        self, cursor: str | None = None, max_chars: int = 8192, wait_ms: int = 0
    ) -> PollResult:
        """Output from ``cursor`` on (None: the beginning), at most ``max_chars``.

        With ``wait_ms`` and nothing new yet, waits that long for output or the
        end of the session. A cursor names a fixed byte offset in the append-only
        transcript: the same cursor always yields the same text (extended, if the
        first answer was short because the output had not arrived yet).
        """
        if not 1 <= max_chars <= MAX_POLL_CHARS:
            raise BadSessionInput(f"max_chars must be within 1..{MAX_POLL_CHARS}")
        if not 0 <= wait_ms <= MAX_WAIT_MS:
            raise BadSessionInput(f"wait_ms must be within 0..{MAX_WAIT_MS}")
        offset = 0 if cursor is None else decode_cursor(cursor, self.process_id)
        # Always a checkpoint, so a caller polling in a loop lets the pump run.
        await trio.lowlevel.checkpoint()
        if offset > len(self._transcript):
            raise InvalidCursor("cursor is beyond the output")
        if offset < len(self._transcript) and self._transcript[offset] & 0xC0 == 0x80:
            raise InvalidCursor("cursor is not on a character boundary")
        if wait_ms and offset == len(self._transcript) and not is_terminal(self._state):
            with trio.move_on_after(wait_ms / 1000):
                while offset == len(self._transcript) and not is_terminal(self._state):
                    await self._changed.wait()
        window = bytes(self._transcript[offset : offset + 4 * max_chars])
        text = window.decode("utf-8", errors="ignore")[:max_chars]
        end = offset + len(text.encode())
        state = self._state
        return PollResult(
            text, encode_cursor(self.process_id, end), state,
            self.exit_code if is_terminal(state) else None,
        )

    async def write_stdin(
        self, data: str | bytes = b"", append_newline: bool = False, eof: bool = False
    ) -> StdinReceipt:
        """Write to the terminal; returns the byte count and sha256 of what was written.

        ``eof`` sends the terminal's EOF character (twice after an unfinished line,
        as a line discipline needs). It reaches a program that reads in canonical
        mode; a program in raw mode just receives the byte.
        """
        if self._state is not S.RUNNING or self._master is None:
            raise SessionNotRunning(f"process {self.process_id} is {self._state}")
        payload = data.encode() if isinstance(data, str) else bytes(data)
        if append_newline:
            payload += b"\n"
        if len(payload) > MAX_STDIN_BYTES:
            raise BadSessionInput(f"stdin write larger than {MAX_STDIN_BYTES} bytes")
        async with self._stdin_lock:  # also a checkpoint
            if eof:
                veof = termios.tcgetattr(self._master)[6][termios.VEOF]
                eof_char = veof if isinstance(veof, bytes) else bytes([veof])
                dirty = payload[-1:] != b"\n" if payload else self._line_dirty
                payload += eof_char * (2 if dirty else 1)
            written = 0
            with trio.move_on_after(_STDIN_TIMEOUT_S):
                while written < len(payload):
                    # Re-read each round: the session may have closed it while we waited.
                    master = self._master_fd()
                    if master is None:
                        break
                    try:
                        written += os.write(master, payload[written:])
                    except BlockingIOError:
                        try:
                            await trio.lowlevel.wait_writable(master)
                        except trio.ClosedResourceError:
                            break
                    except OSError as exc:
                        if exc.errno == errno.EIO:
                            break
                        raise
            sent = payload[:written]
            if sent:
                self._line_dirty = not (sent.endswith(b"\n") or (eof and written == len(payload)))
            return StdinReceipt(
                bytes_written=written,
                sha256=hashlib.sha256(sent).hexdigest(),
                eof=eof and written == len(payload),
                complete=written == len(payload),
            )

    async def terminate(self) -> SessionState:
        """Two-phase stop: SIGTERM to the group, the full grace, SIGKILL, reap, drain.

        Returns the terminal state (``terminated``, or whatever the process reached
        first). Idempotent.
        """
        if self._state is S.PREPARED:
            await self._set_state(S.TERMINATED)
            return self._state
        if not is_terminal(self._state):
            self._stops_send.send_nowait(_Stop.TERMINATE)
            await self._terminal.wait()
        return self._state

    async def kill(self) -> SessionState:
        """Immediate SIGKILL of the whole tree, then reap and drain."""
        if self._state is S.PREPARED:
            await self._set_state(S.TERMINATED)
            return self._state
        if not is_terminal(self._state):
            self._stops_send.send_nowait(_Stop.KILL)
            await self._terminal.wait()
        return self._state

    async def wait(self) -> SessionState:
        """Wait for a terminal state."""
        await self._terminal.wait()
        return self._state


# --------------------------------------------------------------------------------------
# One-shot commands
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamCapture:
    """Bounded view of one stream: the first and last lines, and how many in all."""

    head: tuple[str, ...]
    tail: tuple[str, ...]
    total_lines: int
    total_bytes: int

    @property
    def omitted_lines(self) -> int:
        return self.total_lines - len(self.head) - len(self.tail)


@dataclass(frozen=True)
class CommandResult:
    state: SessionState
    exit_code: int | None
    launch_mode: LaunchMode
    stdout: StreamCapture
    stderr: StreamCapture
    #: The full sanitized transcript, stdout and stderr lines merged in arrival order.
    transcript_path: Path
    transcript_lines: int
    ready_info: ReadyInfo | None
    #: Git control entries the command left and the sandbox's check removed (tree_guard).
    guard: GuardReport | None = None


class _LineCapture:
    def __init__(self, head: int, tail: int, max_line_chars: int, sink: Callable[[str], None]):
        self._head_n = head
        self._head: list[str] = []
        self._tail: collections.deque[str] = collections.deque(maxlen=max(tail, 0))
        self._tail_n = tail
        self._max_chars = max_line_chars
        self._partial = ""
        self._sink = sink
        self.lines = 0
        self.raw_bytes = 0

    def _short(self, line: str) -> str:
        if len(line) <= self._max_chars:
            return line
        return line[: self._max_chars] + f"… [{len(line) - self._max_chars} more chars]"

    def _line(self, line: str) -> None:
        self.lines += 1
        self._sink(line)
        if len(self._head) < self._head_n:
            self._head.append(self._short(line))
        elif self._tail_n > 0:
            self._tail.append(self._short(line))

    def add(self, text: str) -> None:
        if not text:
            return
        parts = (self._partial + text).split("\n")
        self._partial = parts.pop()
        for line in parts:
            self._line(line)
        if len(self._partial) > _MAX_PENDING:
            # A line without end: page it in pieces rather than hold it all.
            self._line(self._partial)
            self._partial = ""

    def finish(self) -> None:
        if self._partial:
            self._line(self._partial)
            self._partial = ""

    def result(self) -> StreamCapture:
        return StreamCapture(tuple(self._head), tuple(self._tail), self.lines, self.raw_bytes)


async def run_command(
    argv: Sequence[str],
    cwd: Path,
    timeout_s: float | None,
    profile: SandboxProfile,
    head_lines: int = 20,
    tail_lines: int = 20,
    *,
    transcript_path: Path | None = None,
    on_ready: OnReady | None = None,
    env: Mapping[str, str] | None = None,
    launch_mode: LaunchMode | None = None,
    output_limit_bytes: int = COMMAND_OUTPUT_LIMIT_BYTES,
    grace_s: float = GRACE_S,
    roots: Roots | None = None,
    max_line_chars: int = 2000,
) -> CommandResult:
    """Run one command to its end (stdin is /dev/null, output through pipes).

    ``transcript_path`` (created 0600, must not exist; default: a new private temp
    file) receives the full sanitized transcript. Launch failures raise like
    :meth:`PtySession.start`; a started command always returns a result, whose
    ``state`` is ``exited``, ``timed-out``, ``output-limit-exceeded`` or
    ``needs-reconciliation``.
    """
    if not argv:
        raise BadSessionInput("empty argv")
    if timeout_s is not None and not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise BadSessionInput("timeout_s must be a positive number")
    if head_lines < 0 or tail_lines < 0 or max_line_chars < 1:
        raise BadSessionInput("head_lines/tail_lines must be >= 0, max_line_chars >= 1")
    mode = launch_mode or resolve_launch_mode(profile.mode, executable=profile.bwrap)
    if transcript_path is None:
        import tempfile

        handle, name = tempfile.mkstemp(prefix="corral-cmd-", suffix=".log")
        os.close(handle)
        transcript_path = Path(name)
        transcript_fd = os.open(transcript_path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    else:
        transcript_fd = _open_private(transcript_path)
    pipes = [os.pipe(), os.pipe()]
    ready: list[ReadyInfo] = []

    async def _ready(info: ReadyInfo) -> None:
        ready.append(info)
        if on_ready is not None:
            await on_ready(info)

    try:
        try:
            proc = await launch_with_handshake(
                argv,
                cwd=cwd,
                profile=profile,
                on_ready=_ready,
                launch_mode=mode,
                env=env,
                stdout=pipes[0][1],
                stderr=pipes[1][1],
            )
        finally:
            for _r, w in pipes:
                os.close(w)
    except BaseException:
        for r, _w in pipes:
            os.close(r)
        os.close(transcript_fd)
        raise

    transcript_lines = 0

    def sink(line: str) -> None:
        nonlocal transcript_lines
        transcript_lines += 1
        os.write(transcript_fd, (line + "\n").encode())

    session_roots = _session_roots(profile, roots)
    captures = [_LineCapture(head_lines, tail_lines, max_line_chars, sink) for _ in pipes]
    total = 0
    cap_hit = False
    send, recv = trio.open_memory_channel[_Stop](math.inf)
    eofs = [False, False]

    async def pump(index: int, fd: int, done: trio.Event) -> None:
        nonlocal total, cap_hit
        capture = captures[index]
        sanitizer = IncrementalSanitizer(session_roots)
        os.set_blocking(fd, False)
        try:
            while True:
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(fd)
                    continue
                if not data:
                    eofs[index] = True
                    return
                if cap_hit:
                    continue
                room = output_limit_bytes - total
                if len(data) > room:
                    data = data[:room]
                    cap_hit = True
                total += len(data)
                capture.raw_bytes += len(data)
                capture.add(sanitizer.feed(data))
                if cap_hit:
                    proc.kill_tree()
                    send.send_nowait(_Stop.CAP)
        finally:
            capture.add(sanitizer.finish())
            capture.finish()
            done.set()

    async def noop() -> None:
        return None

    outcome, confirmed = S.NEEDS_RECONCILIATION, False
    done = [trio.Event(), trio.Event()]
    try:
        async with trio.open_nursery() as nursery:
            for index, (r, _w) in enumerate(pipes):
                nursery.start_soon(pump, index, r, done[index])
            nursery.start_soon(_watch_exit, proc, send.clone())
            deadline = math.inf if timeout_s is None else trio.current_time() + timeout_s
            outcome, confirmed = await _run_to_end(proc, recv, deadline, grace_s, noop)
            with trio.move_on_after(_DRAIN_TIMEOUT_S):
                for event in done:
                    await event.wait()
            # Undrained pipes mean a holder outside the reachable tree: stop reading.
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if not confirmed:
                proc.kill_tree()
                if await proc.wait_tree_dead(_REAP_TIMEOUT_S):
                    proc.close()
            for r, _w in pipes:
                trio.lowlevel.notify_closing(r)
                os.close(r)
            os.close(transcript_fd)
    if cap_hit:
        outcome = S.OUTPUT_LIMIT_EXCEEDED
    if not (confirmed and all(eofs)):
        outcome = S.NEEDS_RECONCILIATION
    if confirmed:
        proc.close()
    return CommandResult(
        state=outcome,
        exit_code=proc.returncode,
        launch_mode=mode,
        stdout=captures[0].result(),
        stderr=captures[1].result(),
        transcript_path=transcript_path,
        transcript_lines=transcript_lines,
        ready_info=ready[0] if ready else None,
        guard=proc.guard_report,
    )


@dataclass(frozen=True)
class TranscriptPage:
    lines: tuple[str, ...]
    start_line: int
    #: The start_line of the next page, None at the end.
    next_line: int | None
    total_lines: int


def read_transcript_lines(path: Path, start_line: int, max_lines: int) -> TranscriptPage:
    """Lines ``start_line`` (1-based) onwards of a transcript, at most ``max_lines``."""
    if start_line < 1:
        raise BadSessionInput("start_line is 1-based")
    if not 1 <= max_lines <= MAX_TRANSCRIPT_PAGE:
        raise BadSessionInput(f"max_lines must be within 1..{MAX_TRANSCRIPT_PAGE}")
    lines: list[str] = []
    total = 0
    with open(path, encoding="utf-8", errors="replace", newline="\n") as handle:
        for number, line in enumerate(handle, start=1):
            total = number
            if start_line <= number < start_line + max_lines:
                lines.append(line.rstrip("\n"))
    following = start_line + len(lines)
    return TranscriptPage(
        tuple(lines), start_line, following if following <= total else None, total
    )

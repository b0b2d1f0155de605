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

The session's states, transition table, errors and cursors are in
:mod:`corral.actors.session_state`; the incremental sanitizer in
:mod:`corral.actors.incremental_sanitize`; running the launched tree to its
confirmed end in :mod:`corral.actors.tree_end`. The one-shot counterpart (pipes,
no PTY) is :func:`corral.actors.one_shot_command.run_command`.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import math
import os
import struct
import termios
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import trio

from corral.sandbox.bwrap import LaunchMode, SandboxProfile, resolve_launch_mode
from corral.sandbox.exec_handshake import OnReady, ReadyInfo, default_env, launch_with_handshake
from corral.sandbox.launched_process import LaunchedProcess, LaunchError

from .incremental_sanitize import IncrementalSanitizer, session_roots
from .sanitize import Roots
from .session_state import (
    MAX_STDIN_BYTES,
    BadSessionInput,
    InvalidCursor,
    SessionError,
    SessionNotRunning,
    SessionState,
    check_transition,
    decode_cursor,
    encode_cursor,
    is_terminal,
    new_process_id,
)
from .tree_end import DRAIN_TIMEOUT_S, GRACE_S, REAP_TIMEOUT_S, Stop, open_private, run_to_end, watch_exit

S = SessionState

#: Per-session output cap (raw bytes read from the PTY).
OUTPUT_LIMIT_BYTES = 256 * 1024
TERM_COLS = 120
TERM_ROWS = 30
MAX_POLL_CHARS = 256 * 1024
MAX_WAIT_MS = 60_000

#: A partial line (a prompt) is published after this much output silence.
_QUIET_S = 0.05
_STDIN_TIMEOUT_S = 5.0


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
        self._sanitizer = IncrementalSanitizer(session_roots(profile, roots))

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
        #: The terminal's end-of-file was sent: stdin is closed for good.
        self._stdin_eof = False
        self._changed = trio.Event()
        self._terminal = trio.Event()
        self._stops_send, self._stops_recv = trio.open_memory_channel[Stop](math.inf)
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
        self._stops_send.send_nowait(Stop.TERMINATE if graceful else Stop.KILL)
        await self._lifecycle_done.wait()

    # -- state ------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def output_bytes(self) -> int:
        return len(self._transcript)

    @property
    def output_sha256(self) -> str:
        """The digest of the sanitized output so far (at most 256 KiB)."""
        return hashlib.sha256(self._transcript).hexdigest()

    @property
    def stdin_open(self) -> bool:
        """Whether a write to stdin can still reach the process."""
        return self._state is S.RUNNING and self._master is not None and not self._stdin_eof

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
                self._transcript_fd = open_private(self._transcript_path)
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
        self._nursery.start_soon(watch_exit, proc, self._stops_send.clone())
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
            self._stops_send.send_nowait(Stop.CAP)

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
        with trio.move_on_after(DRAIN_TIMEOUT_S):
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
            outcome, confirmed = await run_to_end(
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
                    if await proc.wait_tree_dead(REAP_TIMEOUT_S):
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

    async def listening_ports(self) -> list[int]:
        """The loopback ports the running session's processes listen on, where the
        host's browser reaches them (``preview.validate``'s registry); none once it
        is no longer running."""
        proc = self._proc
        if proc is None or self._state is not S.RUNNING:
            return []
        return await trio.to_thread.run_sync(proc.loopback_ports)

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
            if eof and written == len(payload):
                self._stdin_eof = True
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
            self._stops_send.send_nowait(Stop.TERMINATE)
            await self._terminal.wait()
        return self._state

    async def kill(self) -> SessionState:
        """Immediate SIGKILL of the whole tree, then reap and drain."""
        if self._state is S.PREPARED:
            await self._set_state(S.TERMINATED)
            return self._state
        if not is_terminal(self._state):
            self._stops_send.send_nowait(Stop.KILL)
            await self._terminal.wait()
        return self._state

    async def wait(self) -> SessionState:
        """Wait for a terminal state."""
        await self._terminal.wait()
        return self._state

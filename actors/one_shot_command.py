"""One-shot commands: :func:`run_command` runs one command to its end through pipes
(no PTY, stdin is /dev/null) with bounded head/tail capture of each stream, and
writes the full sanitized transcript to a private file that
:func:`read_transcript_lines` pages through.

It is the counterpart of :class:`~corral.actors.pty_session.PtySession` for a
command that needs no terminal and no conversation: the same handshake launch, the
same sanitizing and the same run to a confirmed end (:mod:`corral.actors.tree_end`).
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from corral.sandbox.bwrap import LaunchMode, SandboxProfile, resolve_launch_mode
from corral.sandbox.exec_handshake import OnReady, ReadyInfo, launch_with_handshake
from corral.sandbox.tree_guard import GuardReport

from .incremental_sanitize import MAX_PENDING, IncrementalSanitizer, session_roots
from .sanitize import Roots
from .session_state import BadSessionInput, SessionState
from .tree_end import DRAIN_TIMEOUT_S, GRACE_S, REAP_TIMEOUT_S, Stop, open_private, run_to_end, watch_exit

S = SessionState

#: Default output cap of a command, whose transcript is paged rather than polled.
COMMAND_OUTPUT_LIMIT_BYTES = 4 * 1024 * 1024
MAX_TRANSCRIPT_PAGE = 10_000


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
        if len(self._partial) > MAX_PENDING:
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
    :meth:`~corral.actors.pty_session.PtySession.start`; a started command always
    returns a result, whose ``state`` is ``exited``, ``timed-out``,
    ``output-limit-exceeded`` or ``needs-reconciliation``.
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
        transcript_fd = open_private(transcript_path)
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

    output_roots = session_roots(profile, roots)
    captures = [_LineCapture(head_lines, tail_lines, max_line_chars, sink) for _ in pipes]
    total = 0
    cap_hit = False
    send, recv = trio.open_memory_channel[Stop](math.inf)
    eofs = [False, False]

    async def pump(index: int, fd: int, done: trio.Event) -> None:
        nonlocal total, cap_hit
        capture = captures[index]
        sanitizer = IncrementalSanitizer(output_roots)
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
                    send.send_nowait(Stop.CAP)
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
            nursery.start_soon(watch_exit, proc, send.clone())
            deadline = math.inf if timeout_s is None else trio.current_time() + timeout_s
            outcome, confirmed = await run_to_end(proc, recv, deadline, grace_s, noop)
            with trio.move_on_after(DRAIN_TIMEOUT_S):
                for event in done:
                    await event.wait()
            # Undrained pipes mean a holder outside the reachable tree: stop reading.
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if not confirmed:
                proc.kill_tree()
                if await proc.wait_tree_dead(REAP_TIMEOUT_S):
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

"""PtySession and run_command against real processes on real PTYs.

Tests synchronize on what they can observe (output appearing, states changing)
and use trio deadlines only as safety nets.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from trio.testing import MockClock

from corral.actors.one_shot_command import read_transcript_lines, run_command
from corral.actors.pty_session import OUTPUT_LIMIT_BYTES, PtySession, StateChange
from corral.actors.session_state import (
    TRANSITIONS,
    BadSessionInput,
    InvalidCursor,
    SessionNotRunning,
    SessionState,
    check_transition,
    decode_cursor,
    encode_cursor,
    is_terminal,
)
from corral.core.transitions import IllegalTransition
from corral.sandbox.bwrap import LaunchMode, SandboxProfile
from corral.sandbox.exec_handshake import ReadyInfo
from corral.sandbox.launched_process import TargetExecFailed
from tests.launch_modes import BOTH_MODES

S = SessionState

pytestmark = pytest.mark.usefixtures("private_tempdir")


@pytest.fixture
def project(short_tmp: Path) -> Iterator[Path]:
    root = short_tmp / "proj"
    (root / ".git").mkdir(parents=True)
    yield root


def session(project: Path, argv: list[str], mode: LaunchMode = LaunchMode.UNSANDBOXED,
            **kwargs: Any) -> PtySession:
    return PtySession(argv, cwd=project, profile=SandboxProfile(project), launch_mode=mode,
                      **kwargs)


async def read_until(s: PtySession, needle: str, cursor: str | None = None,
                     timeout: float = 10) -> tuple[str, str]:
    """Poll from ``cursor`` until ``needle`` shows up; returns (text, next cursor)."""
    text = ""
    cursor = cursor or s.initial_cursor()
    with trio.fail_after(timeout):
        while needle not in text:
            result = await s.poll(cursor, wait_ms=500)
            text += result.chunk
            cursor = result.next_cursor
            if result.state not in (S.RUNNING, S.LAUNCHING) and not result.chunk:
                break
    assert needle in text, text
    return text, cursor


async def read_all(s: PtySession) -> str:
    """Everything, following cursors, after the session ended."""
    assert s.state in (S.EXITED, S.TERMINATED, S.TIMED_OUT, S.OUTPUT_LIMIT_EXCEEDED)
    out, cursor = "", None
    while True:
        result = await s.poll(cursor, max_chars=1000)
        if not result.chunk:
            return out
        out += result.chunk
        cursor = result.next_cursor


async def find_descendant(name: str) -> psutil.Process:
    """Wait for a descendant to show up under ``name`` (an exec is not instant)."""
    with trio.fail_after(10):
        while True:
            for proc in psutil.Process().children(recursive=True):
                try:
                    if proc.name() == name:
                        return proc
                except psutil.NoSuchProcess:
                    continue
            await trio.sleep(0.01)


# -- start, poll, cursors ---------------------------------------------------------------


@BOTH_MODES
async def test_start_and_incremental_poll(project: Path, mode: LaunchMode) -> None:
    script = "echo first; read go; echo second:$go"
    async with session(project, ["sh", "-c", script], mode) as s:
        await s.start()
        assert s.state is S.RUNNING
        assert s.launch_mode is mode
        text, cursor = await read_until(s, "first")
        assert "second" not in text
        await s.write_stdin("now", append_newline=True)
        later, _ = await read_until(s, "second:now", cursor)
        assert "first" not in later  # the cursor picked up where the last poll ended
        assert await s.wait() is S.EXITED
        assert s.exit_code == 0


async def test_same_cursor_same_chunk(project: Path) -> None:
    async with session(project, ["sh", "-c", "for i in 1 2 3 4 5 6; do echo line$i; done"]) as s:
        await s.start()
        await s.wait()
        first = await s.poll(None, max_chars=10)
        again = await s.poll(None, max_chars=10)
        assert first == again
        assert first.chunk == "line1\nline"
        middle = await s.poll(first.next_cursor, max_chars=7)
        assert middle == await s.poll(first.next_cursor, max_chars=7)
        assert middle.chunk == "2\nline3"
        # Polling did not move anything: the start is still the start.
        assert (await s.poll(None, max_chars=10)) == first
        assert await read_all(s) == "".join(f"line{i}\n" for i in range(1, 7))
        end = await s.poll(encode_cursor(s.process_id, s.output_bytes), wait_ms=1000)
        assert end.chunk == "" and end.state is S.EXITED and end.exit_code == 0


async def test_poll_waits_for_output(project: Path) -> None:
    async with session(project, ["sh", "-c", "read x; echo got-$x"]) as s:
        await s.start()
        cursor = s.initial_cursor()
        assert (await s.poll(cursor)).chunk == ""

        async def answer() -> None:
            await s.write_stdin("it", append_newline=True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer)
            text, _ = await read_until(s, "got-it", cursor)
        assert "got-it" in text
        assert await s.wait() is S.EXITED


async def test_cursors_are_checked(project: Path) -> None:
    async with session(project, ["echo", "ünïcode"]) as s:
        await s.start()
        await s.wait()
        with pytest.raises(InvalidCursor):
            await s.poll("not-a-cursor")
        with pytest.raises(InvalidCursor, match="another process"):
            await s.poll(encode_cursor("proc-someone-else", 0))
        with pytest.raises(InvalidCursor, match="beyond"):
            await s.poll(encode_cursor(s.process_id, 10_000))
        with pytest.raises(InvalidCursor, match="boundary"):
            await s.poll(encode_cursor(s.process_id, 1))
        with pytest.raises(BadSessionInput):
            await s.poll(None, max_chars=0)
        assert decode_cursor(encode_cursor(s.process_id, 5), s.process_id) == 5


async def test_terminal_is_120x30_and_output_is_sanitized(project: Path) -> None:
    script = (
        "stty size; [ -t 0 ] && echo tty-in; "
        f"printf '\\033[31mred\\033[0m \\033]0;title\\007{project}/src/x.py\\r\\n'"
    )
    async with session(project, ["sh", "-c", script]) as s:
        await s.start()
        await s.wait()
        text = await read_all(s)
    assert text == "30 120\ntty-in\nred <project>/src/x.py\n"


# -- stdin ------------------------------------------------------------------------------


@BOTH_MODES
async def test_stdin_echo_and_receipt(project: Path, mode: LaunchMode) -> None:
    async with session(project, ["cat"], mode) as s:
        await s.start()
        receipt = await s.write_stdin("hello", append_newline=True)
        assert receipt.bytes_written == 6
        assert receipt.sha256 == hashlib.sha256(b"hello\n").hexdigest()
        assert receipt.complete and not receipt.eof
        # Once from the terminal's echo, once from cat.
        with trio.fail_after(10):
            while (await s.poll(None, wait_ms=200)).chunk.count("hello") < 2:
                pass
        assert (await s.poll(None)).chunk == "hello\nhello\n"
        await s.write_stdin(eof=True)
        assert await s.wait() is S.EXITED


async def test_stdin_without_echo(project: Path) -> None:
    async with session(project, ["cat"], echo=False) as s:
        await s.start()
        await s.write_stdin(b"once\n")
        await read_until(s, "once")
        receipt = await s.write_stdin(eof=True)
        assert receipt.eof
        assert await s.wait() is S.EXITED
        assert await read_all(s) == "once\n"


@BOTH_MODES
async def test_eof_ends_cat(project: Path, mode: LaunchMode) -> None:
    async with session(project, ["cat"], mode) as s:
        await s.start()
        receipt = await s.write_stdin("partial line", eof=True)
        assert receipt.eof and receipt.complete
        assert await s.wait() is S.EXITED
        assert s.exit_code == 0
        assert (await read_all(s)).count("partial line") == 2
        with pytest.raises(SessionNotRunning):
            await s.write_stdin("late")


async def test_oversized_stdin_is_refused(project: Path) -> None:
    async with session(project, ["cat"]) as s:
        await s.start()
        with pytest.raises(BadSessionInput):
            await s.write_stdin(b"x" * (64 * 1024 + 1))
        await s.write_stdin(eof=True)
        assert await s.wait() is S.EXITED
        assert await read_all(s) == ""  # nothing of the refused write reached it


# -- exits and terminations -------------------------------------------------------------


@BOTH_MODES
async def test_natural_exit_with_exit_code(project: Path, mode: LaunchMode) -> None:
    changes: list[StateChange] = []
    ready: list[ReadyInfo] = []

    async def on_state(change: StateChange) -> None:
        changes.append(change)

    async def on_ready(info: ReadyInfo) -> None:
        assert not changes or changes[-1].new is S.LAUNCHING
        ready.append(info)

    async with session(project, ["sh", "-c", "echo bye; exit 7"], mode,
                       on_state=on_state, on_ready=on_ready) as s:
        await s.start()
        assert await s.wait() is S.EXITED
        result = await s.poll(None)
    assert result.chunk == "bye\n"
    assert result.state is S.EXITED and result.exit_code == 7
    assert [(c.old, c.new) for c in changes] == [
        (S.PREPARED, S.LAUNCHING), (S.LAUNCHING, S.RUNNING), (S.RUNNING, S.EXITED)]
    assert changes[-1].exit_code == 7 and changes[-1].launch_mode is mode
    assert changes[-1].output_bytes == len(b"bye\n")
    assert len(ready) == 1 and ready[0].launch_mode is mode


@BOTH_MODES
async def test_graceful_terminate(project: Path, mode: LaunchMode) -> None:
    script = "trap 'echo got-term; exit 0' TERM; echo ready; while :; do sleep 0.05; done"
    changes: list[SessionState] = []

    async def on_state(change: StateChange) -> None:
        changes.append(change.new)

    async with session(project, ["sh", "-c", script], mode, on_state=on_state) as s:
        await s.start()
        await read_until(s, "ready")
        assert await s.terminate() is S.TERMINATED
        assert "got-term" in await read_all(s)
        assert s.exit_code == 0
    assert changes[-2:] == [S.TERMINATING, S.TERMINATED]


@BOTH_MODES
async def test_force_path_for_a_process_ignoring_sigterm(project: Path, mode: LaunchMode) -> None:
    script = "trap 'echo ignored-term' TERM; echo ready; while :; do sleep 0.05; done"
    async with session(project, ["sh", "-c", script], mode) as s:
        await s.start()
        await read_until(s, "ready")
        assert await s.terminate() is S.TERMINATED
        # SIGTERM arrived (and was shrugged off), then SIGKILL ended it.
        assert "ignored-term" in await read_all(s)
        assert s.exit_code == 128 + 9


async def test_trap_empty_term_is_killed(project: Path) -> None:
    async with session(project, ["sh", "-c", "trap '' TERM; echo ready; sleep 60"]) as s:
        await s.start()
        await read_until(s, "ready")
        assert await s.terminate() is S.TERMINATED
        assert s.exit_code == 128 + 9


async def test_grace_outlasts_the_leader(project: Path) -> None:
    # The leader leaves at once on SIGTERM; its child in the same group ignores it.
    # The grace must not end with the leader: the child is killed after it.
    script = "(trap '' TERM; echo child-up; exec sleep 60) & trap 'exit 0' TERM; wait"
    async with session(project, ["sh", "-c", script]) as s:
        await s.start()
        await read_until(s, "child-up")
        sleeper = await find_descendant("sleep")
        assert await s.terminate() is S.TERMINATED
        assert s.exit_code == 0  # the leader's own, graceful exit
    assert not sleeper.is_running() or sleeper.status() == psutil.STATUS_ZOMBIE


async def test_background_job_does_not_outlive_the_leader(project: Path) -> None:
    async with session(project, ["sh", "-c", "sleep 60 & echo started; exit 3"]) as s:
        await s.start()
        assert await s.wait() is S.EXITED
        assert s.exit_code == 3
    assert [p for p in psutil.Process().children(recursive=True)
            if p.name() == "sleep" and p.status() != psutil.STATUS_ZOMBIE] == []


@BOTH_MODES
async def test_output_cap(project: Path, mode: LaunchMode) -> None:
    async with session(project, ["yes"], mode) as s:
        await s.start()
        assert await s.wait() is S.OUTPUT_LIMIT_EXCEEDED
        assert 0 < s.output_bytes <= OUTPUT_LIMIT_BYTES
        result = await s.poll(None, max_chars=10)
        assert result.chunk == "y\ny\ny\ny\ny\n"
        assert result.state is S.OUTPUT_LIMIT_EXCEEDED


async def test_small_output_cap_is_exact(project: Path) -> None:
    async with session(project, ["sh", "-c", "printf '%s' $(seq 1 5000); sleep 60"],
                       output_limit_bytes=1000) as s:
        await s.start()
        assert await s.wait() is S.OUTPUT_LIMIT_EXCEEDED
        assert s.output_bytes == 1000


@BOTH_MODES
async def test_timeout(project: Path, mode: LaunchMode, deadline_clock: MockClock) -> None:
    # The session's deadline is on the test's clock: it passes only once the output is
    # there, however slow the machine. Then the clock runs on by itself, in steps of
    # the stop path's polls, and the grace is long, so SIGTERM always has its time.
    async with session(project, ["sh", "-c", "echo waiting; sleep 60"], mode, timeout_s=0.3,
                       grace_s=60) as s:
        await s.start()
        while "waiting" not in (await s.poll(None, wait_ms=30_000)).chunk:
            assert not is_terminal(s.state), "the session ended before its output"
        deadline_clock.jump(0.3)
        deadline_clock.autojump_threshold = 0.01
        assert await s.wait() is S.TIMED_OUT
        assert "waiting" in await read_all(s)
        assert s.exit_code == 128 + 15


async def test_leaving_the_block_terminates(project: Path) -> None:
    async with session(project, ["sleep", "60"], grace_s=0.2) as s:
        await s.start()
    assert s.state is S.TERMINATED


async def test_leaving_by_exception_kills(project: Path) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with session(project, ["sh", "-c", "trap '' TERM; sleep 60"]) as s:
            await s.start()
            raise Boom
    assert s.state is S.TERMINATED


async def test_on_ready_failure_means_zero_executions(project: Path) -> None:
    counter = project / "count"

    async def on_ready(info: ReadyInfo) -> None:
        raise RuntimeError("ledger unavailable")

    async with session(project, ["sh", "-c", f"echo x >> {counter}"], on_ready=on_ready) as s:
        with pytest.raises(RuntimeError, match="ledger unavailable"):
            await s.start()
        assert s.state is S.FAILED
    assert not counter.exists()


@BOTH_MODES
async def test_missing_program_fails_the_session(project: Path, mode: LaunchMode) -> None:
    async with session(project, ["definitely-not-a-program"], mode) as s:
        with pytest.raises(TargetExecFailed) as info:
            await s.start()
        assert info.value.errno == 2
        assert s.state is S.FAILED


async def test_transcript_file_matches_polls(project: Path, short_tmp: Path) -> None:
    path = short_tmp / "session.log"
    async with session(project, ["sh", "-c", "echo one; echo two"], transcript_path=path) as s:
        await s.start()
        await s.wait()
        text = await read_all(s)
    assert path.read_text() == text == "one\ntwo\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# -- the state machine ------------------------------------------------------------------


def test_transition_table() -> None:
    assert set(TRANSITIONS) == set(SessionState)
    check_transition(S.RUNNING, S.TERMINATING)
    with pytest.raises(IllegalTransition):
        check_transition(S.EXITED, S.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(S.PREPARED, S.RUNNING)
    for terminal in (S.EXITED, S.TERMINATED, S.TIMED_OUT, S.OUTPUT_LIMIT_EXCEEDED, S.FAILED,
                     S.NEEDS_RECONCILIATION):
        assert TRANSITIONS[terminal] == frozenset()


async def test_start_twice_is_illegal(project: Path) -> None:
    async with session(project, ["true"]) as s:
        await s.start()
        with pytest.raises(IllegalTransition):
            await s.start()
        await s.wait()


async def test_terminate_before_start(project: Path) -> None:
    async with session(project, ["true"]) as s:
        assert await s.terminate() is S.TERMINATED
        with pytest.raises(IllegalTransition):
            await s.start()


def test_bad_arguments_are_refused(project: Path) -> None:
    with pytest.raises(BadSessionInput):
        session(project, [])
    with pytest.raises(BadSessionInput):
        session(project, ["sleep", "1"], timeout_s=0)


# -- one-shot commands ------------------------------------------------------------------


@BOTH_MODES
async def test_run_command_head_tail_and_paging(project: Path, mode: LaunchMode) -> None:
    script = "for i in $(seq 1 50); do echo out$i; done; echo err-one >&2; exit 5"
    result = await run_command(["sh", "-c", script], project, 20, SandboxProfile(project),
                               head_lines=3, tail_lines=2, launch_mode=mode)
    try:
        assert result.state is S.EXITED and result.exit_code == 5
        assert result.launch_mode is mode
        assert result.stdout.head == ("out1", "out2", "out3")
        assert result.stdout.tail == ("out49", "out50")
        assert result.stdout.total_lines == 50 and result.stdout.omitted_lines == 45
        assert result.stderr.head == ("err-one",) and result.stderr.tail == ()
        assert result.transcript_lines == 51
        # Paging covers every line once; stdout and stderr interleave as they arrived.
        lines: list[str] = []
        start: int | None = 1
        while start is not None:
            page = read_transcript_lines(result.transcript_path, start, 20)
            assert page.start_line == start and page.total_lines == 51
            lines += page.lines
            start = page.next_line
        assert sorted(lines) == sorted([f"out{i}" for i in range(1, 51)] + ["err-one"])
        assert [line for line in lines if line.startswith("out")] == [
            f"out{i}" for i in range(1, 51)]
        assert read_transcript_lines(result.transcript_path, 52, 5).lines == ()
        with pytest.raises(BadSessionInput):
            read_transcript_lines(result.transcript_path, 0, 5)
    finally:
        result.transcript_path.unlink()


async def test_run_command_sanitizes(project: Path) -> None:
    script = f"printf '\\033[1mbold\\033[0m sk-abcdefghijklmnopqrstuvwx {project}/a\\n'"
    result = await run_command(["sh", "-c", script], project, 10, SandboxProfile(project),
                               launch_mode=LaunchMode.UNSANDBOXED)
    assert result.stdout.head == ("bold [redacted] <project>/a",)
    assert result.transcript_path.read_text() == "bold [redacted] <project>/a\n"
    result.transcript_path.unlink()


async def test_run_command_timeout(project: Path) -> None:
    result = await run_command(["sh", "-c", "echo started; sleep 60"], project, 0.3,
                               SandboxProfile(project), launch_mode=LaunchMode.UNSANDBOXED,
                               grace_s=0.2)
    assert result.state is S.TIMED_OUT
    assert result.stdout.head == ("started",)
    assert result.exit_code == 128 + 15
    result.transcript_path.unlink()


async def test_run_command_output_cap(project: Path) -> None:
    result = await run_command(["yes"], project, 20, SandboxProfile(project), 2, 2,
                               launch_mode=LaunchMode.UNSANDBOXED, output_limit_bytes=10_000)
    assert result.state is S.OUTPUT_LIMIT_EXCEEDED
    assert result.stdout.total_bytes == 10_000
    assert result.stdout.head == ("y", "y")
    result.transcript_path.unlink()


async def test_run_command_long_lines_are_bounded(project: Path) -> None:
    result = await run_command(["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a; echo"],
                               project, 10, SandboxProfile(project), 1, 0,
                               launch_mode=LaunchMode.UNSANDBOXED, max_line_chars=100)
    assert result.stdout.head[0].startswith("a" * 100 + "…")
    assert read_transcript_lines(result.transcript_path, 1, 1).lines[0] == "a" * 5000
    result.transcript_path.unlink()


async def test_run_command_missing_program(project: Path) -> None:
    with pytest.raises(TargetExecFailed):
        await run_command(["no-such-program-xyz"], project, 5, SandboxProfile(project),
                          launch_mode=LaunchMode.UNSANDBOXED,
                          transcript_path=project / "t.log")
    assert not os.path.exists(project / "t.log") or (project / "t.log").read_text() == ""

"""The launch-mode decision and the launch handshake.

Real processes throughout: the handshake tests prove "zero executions" with a
target that would append to a counter file. The bubblewrap profile and the
isolation it gives are in test_sandbox.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import trio

from corral.actors.one_shot_command import run_command
from corral.actors.pty_session import PtySession
from corral.actors.session_state import SessionState
from corral.sandbox.bwrap import (
    LaunchMode,
    SandboxMode,
    SandboxProfile,
    SandboxProfileError,
    SandboxUnavailable,
    bwrap_available,
    resolve_launch_mode,
)
from corral.sandbox.exec_handshake import ReadyInfo, build_trampoline_argv, launch_with_handshake
from corral.sandbox.launched_process import HandshakeError, TargetExecFailed
from corral.sandbox.trampoline import EXIT_NO_COMMIT
from tests.launch_modes import BOTH_MODES

# A fixture, imported so that pytest finds it in this module (see sandbox_project).
from tests.sandbox_project import project as project

pytestmark = pytest.mark.usefixtures("private_tempdir")


def counter_target(root: Path) -> tuple[list[str], Path]:
    """A target whose every execution leaves a line in a file."""
    counter = root / "launch-count"
    return ["sh", "-c", f"echo ran >> {counter}"], counter


async def _noop(_info: ReadyInfo) -> None:
    return None


# -- the launch-mode decision -----------------------------------------------------------


def test_required_sandbox_fails_closed_without_bwrap() -> None:
    with pytest.raises(SandboxUnavailable) as info:
        resolve_launch_mode(SandboxMode.REQUIRED, available=False)
    assert info.value.code == "sandbox-unavailable"
    assert "bubblewrap" in str(info.value)


def test_allow_unsandboxed_is_explicit() -> None:
    assert resolve_launch_mode("allow-unsandboxed", available=False) is LaunchMode.UNSANDBOXED
    assert resolve_launch_mode("allow-unsandboxed", available=True) is LaunchMode.SANDBOXED
    assert resolve_launch_mode(SandboxMode.REQUIRED, available=True) is LaunchMode.SANDBOXED
    with pytest.raises(SandboxProfileError):
        resolve_launch_mode("sometimes", available=False)


def test_missing_binary_is_unavailable() -> None:
    assert bwrap_available("/nonexistent/bwrap") is False
    with pytest.raises(SandboxUnavailable):
        resolve_launch_mode(SandboxMode.REQUIRED, executable="/nonexistent/bwrap")


async def test_command_and_session_fail_closed_when_bwrap_is_missing(project: Path) -> None:
    profile = SandboxProfile(project, bwrap="/nonexistent/bwrap")
    argv, counter = counter_target(project)
    with pytest.raises(SandboxUnavailable):
        await run_command(argv, project, 5, profile)
    async with PtySession(argv, cwd=project, profile=profile) as session:
        with pytest.raises(SandboxUnavailable):
            await session.start()
        assert session.state is SessionState.FAILED
    assert not counter.exists()


async def test_allowed_unsandboxed_mode_is_recorded(project: Path) -> None:
    profile = SandboxProfile(project, bwrap="/nonexistent/bwrap", mode=SandboxMode.ALLOW_UNSANDBOXED)
    result = await run_command(["true"], project, 5, profile)
    assert result.state is SessionState.EXITED
    assert result.launch_mode is LaunchMode.UNSANDBOXED
    assert result.ready_info is not None
    assert result.ready_info.launch_mode is LaunchMode.UNSANDBOXED
    result.transcript_path.unlink()


# -- the handshake ----------------------------------------------------------------------

FAKE_TRAMPOLINE = r"""
import os, sys
mode, args = sys.argv[1], sys.argv[2:]
ctl = int(args[args.index("--ctl") + 1])
rep = int(args[args.index("--rep") + 1])
target = args[args.index("--") + 1:]
def readline():
    buf = b""
    while not buf.endswith(b"\n"):
        byte = os.read(ctl, 1)
        if not byte:
            return None
        buf += byte
    return buf.decode().strip()
nonce = readline().split()[1]
if mode == "eof-before-ready":
    os._exit(0)
if mode == "silent":
    readline()
    os._exit(0)
if mode == "wrong-nonce":
    os.write(rep, b"SANDBOX_READY " + b"0" * len(nonce) + b"\n")
else:
    os.write(rep, ("SANDBOX_READY " + nonce + "\n").encode())
if mode == "ready-then-exit":
    os._exit(0)
# Unlike the real trampoline this one executes on ANY commit line, so the target
# running zero times proves the parent never sent one.
line = readline()
if line is not None and line.startswith("COMMIT_EXEC"):
    os.set_inheritable(rep, False)
    os.write(rep, b"EXEC_ATTEMPT\n")
    os.execvp(target[0], target)
os._exit(3)
"""


def fake(project: Path, mode: str) -> list[str]:
    path = project / "fake_trampoline.py"
    path.write_text(FAKE_TRAMPOLINE)
    return [sys.executable, "-I", str(path), mode]


@BOTH_MODES
async def test_wrong_nonce_never_executes_the_target(project: Path, mode: LaunchMode) -> None:
    argv, counter = counter_target(project)
    calls: list[ReadyInfo] = []

    async def on_ready(info: ReadyInfo) -> None:
        calls.append(info)

    with pytest.raises(HandshakeError, match="wrong nonce") as info:
        await launch_with_handshake(argv, cwd=project, profile=SandboxProfile(project),
                                    on_ready=on_ready, launch_mode=mode,
                                    trampoline=fake(project, "wrong-nonce"))
    assert info.value.tree_reaped
    assert calls == []
    assert not counter.exists()


@BOTH_MODES
async def test_eof_before_ready_never_executes_the_target(project: Path, mode: LaunchMode) -> None:
    argv, counter = counter_target(project)
    with pytest.raises(HandshakeError, match="before SANDBOX_READY"):
        await launch_with_handshake(argv, cwd=project, profile=SandboxProfile(project),
                                    on_ready=_noop, launch_mode=mode,
                                    trampoline=fake(project, "eof-before-ready"))
    assert not counter.exists()


@BOTH_MODES
async def test_eof_after_ready_before_commit_never_executes(project: Path, mode: LaunchMode) -> None:
    argv, counter = counter_target(project)

    async def on_ready(info: ReadyInfo) -> None:
        # The real trampoline dies while the commit is in progress; its report
        # channel's EOF is then certain to be there when the parent looks.
        pidfd = os.pidfd_open(info.pid)
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            with trio.fail_after(10):
                await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)

    with pytest.raises(HandshakeError, match="before COMMIT_EXEC") as info:
        await launch_with_handshake(argv, cwd=project, profile=SandboxProfile(project),
                                    on_ready=on_ready, launch_mode=mode)
    assert info.value.tree_reaped
    assert not counter.exists()


@BOTH_MODES
async def test_fake_ready_then_exit_never_executes(project: Path, mode: LaunchMode) -> None:
    argv, counter = counter_target(project)
    with pytest.raises(HandshakeError):
        await launch_with_handshake(argv, cwd=project, profile=SandboxProfile(project),
                                    on_ready=_noop, launch_mode=mode,
                                    trampoline=fake(project, "ready-then-exit"))
    assert not counter.exists()


@BOTH_MODES
async def test_commit_failure_never_executes_the_target(project: Path, mode: LaunchMode) -> None:
    argv, counter = counter_target(project)
    seen: list[ReadyInfo] = []

    class LedgerDown(Exception):
        pass

    async def on_ready(info: ReadyInfo) -> None:
        seen.append(info)
        raise LedgerDown("disk full")

    with pytest.raises(LedgerDown):
        await launch_with_handshake(argv, cwd=project, profile=SandboxProfile(project),
                                    on_ready=on_ready, launch_mode=mode)
    assert len(seen) == 1 and seen[0].launch_mode is mode
    assert not counter.exists()


@BOTH_MODES
async def test_handshake_timeout_kills_the_tree(project: Path, mode: LaunchMode) -> None:
    argv, counter = counter_target(project)
    with pytest.raises(HandshakeError, match="timed out") as info:
        await launch_with_handshake(argv, cwd=project, profile=SandboxProfile(project),
                                    on_ready=_noop, launch_mode=mode, handshake_timeout_s=0.5,
                                    trampoline=fake(project, "silent"))
    assert info.value.tree_reaped
    assert not counter.exists()


@BOTH_MODES
async def test_successful_launch_executes_exactly_once(project: Path, mode: LaunchMode) -> None:
    argv, counter = counter_target(project)
    order: list[str] = []

    async def on_ready(info: ReadyInfo) -> None:
        order.append("committed")
        assert not counter.exists()  # nothing ran before the durable commit

    proc = await launch_with_handshake(argv, cwd=project, profile=SandboxProfile(project),
                                       on_ready=on_ready, launch_mode=mode)
    assert proc.exec_established
    assert await proc.wait_tree_dead()
    proc.close()
    assert proc.returncode == 0
    assert order == ["committed"]
    assert counter.read_text() == "ran\n"


@BOTH_MODES
async def test_missing_target_reports_exec_failure(project: Path, mode: LaunchMode) -> None:
    with pytest.raises(TargetExecFailed) as info:
        await launch_with_handshake(["no-such-program-xyz"], cwd=project,
                                    profile=SandboxProfile(project), on_ready=_noop,
                                    launch_mode=mode)
    assert info.value.errno == 2
    assert info.value.code == "target-exec-failed"
    assert "TARGET_EXEC_FAILED 2" in str(info.value)
    assert info.value.tree_reaped


def _spawn_real_trampoline(project: Path, target: list[str]) -> tuple[subprocess.Popen[bytes], int, int]:
    ctl_r, ctl_w = os.pipe()
    rep_r, rep_w = os.pipe()
    argv = build_trampoline_argv(target, ctl_fd=ctl_r, rep_fd=rep_w, expect_ppid=os.getpid())
    proc = subprocess.Popen(argv, pass_fds=[ctl_r, rep_w], cwd=project, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    os.close(ctl_r)
    os.close(rep_w)
    return proc, ctl_w, rep_r


def _readline(fd: int) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        buf += byte
    return buf


@pytest.mark.parametrize("commit", [b"COMMIT_EXEC wrong-nonce\n", b"", b"GARBAGE\n"])
def test_real_trampoline_executes_only_on_the_right_commit(project: Path, commit: bytes) -> None:
    argv, counter = counter_target(project)
    proc, ctl_w, rep_r = _spawn_real_trampoline(project, argv)
    try:
        os.write(ctl_w, b"NONCE abc123\n")
        assert _readline(rep_r) == b"SANDBOX_READY abc123\n"
        os.write(ctl_w, commit)
        os.close(ctl_w)  # for b"": the parent died before committing
        assert proc.wait(timeout=10) == EXIT_NO_COMMIT
        assert os.read(rep_r, 100) == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(rep_r)
    assert not counter.exists()


def _dies(pid: int, timeout_s: float = 10) -> bool:
    """Whether a process that is not our child ends (zombie counts: its reaper is
    init, which may take its time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.01)
    return False


HELPER = r"""
import os, signal, subprocess, sys
from corral.sandbox.exec_handshake import build_trampoline_argv
ctl_r, ctl_w = os.pipe()
rep_r, rep_w = os.pipe()
argv = build_trampoline_argv(sys.argv[1:], ctl_fd=ctl_r, rep_fd=rep_w, expect_ppid=os.getpid())
proc = subprocess.Popen(argv, pass_fds=[ctl_r, rep_w], start_new_session=True)
os.write(ctl_w, b"NONCE n1\n")
print(proc.pid, os.read(rep_r, 100).decode().strip(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the parent dies between READY and COMMIT
"""


def test_real_trampoline_dies_with_its_parent_unexecuted(project: Path) -> None:
    argv, counter = counter_target(project)
    out = subprocess.run([sys.executable, "-c", HELPER, *argv], cwd=project,
                         capture_output=True, timeout=20, check=False)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pid_text, ready = out.stdout.decode().split(" ", 1)
    assert ready.strip() == "SANDBOX_READY n1"
    assert _dies(int(pid_text))
    assert not counter.exists()


SESSION_ACTOR = r"""
import os, signal, sys
from pathlib import Path
import trio
from corral.sandbox.bwrap import LaunchMode, SandboxProfile
from corral.sandbox.exec_handshake import launch_with_handshake

async def main() -> None:
    async def on_ready(info) -> None:
        return None
    root = Path.cwd()
    proc = await launch_with_handshake(["sleep", "60"], cwd=root, profile=SandboxProfile(root),
                                       on_ready=on_ready, launch_mode=LaunchMode(sys.argv[1]))
    print(proc.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the session actor dies without cleaning up

trio.run(main)
"""


@BOTH_MODES
def test_targets_die_with_the_session_actor(project: Path, mode: LaunchMode) -> None:
    out = subprocess.run([sys.executable, "-c", SESSION_ACTOR, mode.value], cwd=project,
                         capture_output=True, timeout=20, check=False)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert _dies(int(out.stdout))



"""The bubblewrap profile, the launch-mode decision and the launch handshake.

Real processes throughout: the isolation tests run a grandchild that calls setsid()
inside bubblewrap and check what it can reach; the handshake tests prove "zero
executions" with a target that would append to a counter file.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import trio

from corral.actors.one_shot_command import run_command
from corral.actors.pty_session import PtySession
from corral.actors.session_state import SessionState
from corral.sandbox.bwrap import (
    LaunchMode,
    Rlimits,
    SandboxMode,
    SandboxProfile,
    SandboxProfileError,
    SandboxUnavailable,
    build_bwrap_argv,
    bwrap_available,
    resolve_launch_mode,
)
from corral.sandbox.exec_handshake import ReadyInfo, build_trampoline_argv, launch_with_handshake
from corral.sandbox.launched_process import HandshakeError, TargetExecFailed
from corral.sandbox.trampoline import EXIT_NO_COMMIT
from tests.launch_modes import BOTH_MODES, needs_bwrap

pytestmark = pytest.mark.usefixtures("private_tempdir")


@pytest.fixture
def project(short_tmp: Path) -> Iterator[Path]:
    root = short_tmp / "proj"
    (root / ".git").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".corral").mkdir()
    (root / ".corral" / "ledger.db").write_text("control data\n")
    (root / "src").mkdir()
    yield root


@pytest.fixture
def outside(short_tmp: Path) -> Path:
    """A secret next to the project, in a directory the sandbox must not show."""
    directory = short_tmp / "outside"
    directory.mkdir()
    secret = directory / "secret.txt"
    secret.write_text("outside-secret-content\n")
    return secret


def counter_target(root: Path) -> tuple[list[str], Path]:
    """A target whose every execution leaves a line in a file."""
    counter = root / "launch-count"
    return ["sh", "-c", f"echo ran >> {counter}"], counter


async def _noop(_info: ReadyInfo) -> None:
    return None


# -- the profile ----------------------------------------------------------------------


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_profile_argv_isolates_everything(project: Path) -> None:
    argv = build_bwrap_argv(SandboxProfile(project), ["true"], project / "src")
    sep = argv.index("--")
    options, target = argv[:sep], argv[sep + 1 :]
    assert target == ["true"]
    for flag in ("--unshare-all", "--die-with-parent", "--new-session"):
        assert flag in options
    assert "--share-net" not in options
    assert options[options.index("--cap-drop") + 1] == "ALL"
    assert (str(project), str(project)) in _pairs(options, "--bind")
    ro = _pairs(options, "--ro-bind")
    assert (str(project / ".git"), str(project / ".git")) in ro
    assert ("/usr", "/usr") in ro
    # /etc is an allow list of entries, never the whole directory.
    assert ("/etc/passwd", "/etc/passwd") in ro
    assert not any(dest in ("/etc", "/etc/shadow", "/etc/shadow-") for _src, dest in ro)
    tmpfs = [options[i + 1] for i, a in enumerate(options) if a == "--tmpfs"]
    assert str(project / ".corral") in tmpfs
    assert "/tmp" in tmpfs and "/home/sandbox" in tmpfs
    assert options[options.index("--remount-ro") + 1] == str(project / ".corral")
    assert options[options.index("--proc") + 1] == "/proc"
    assert options[options.index("--dev") + 1] == "/dev"
    assert options[options.index("--chdir") + 1] == str(project / "src")
    # The project bind comes after the tmpfs /tmp, or a project under /tmp would vanish.
    assert options.index("--bind") > tmpfs_index(options, "/tmp")


def tmpfs_index(options: list[str], dest: str) -> int:
    return next(i for i, a in enumerate(options) if a == "--tmpfs" and options[i + 1] == dest)


def test_profile_network_and_readonly_root(project: Path) -> None:
    argv = build_bwrap_argv(SandboxProfile(project, network=True, rw=False), ["true"], project)
    assert "--share-net" in argv
    assert "--bind" not in argv[: argv.index("--")]
    assert (str(project), str(project)) in _pairs(argv, "--ro-bind")


def test_profile_skips_missing_entries_instead_of_creating_them(short_tmp: Path) -> None:
    root = short_tmp / "bare"
    root.mkdir()
    argv = build_bwrap_argv(SandboxProfile(root), ["true"], root)
    assert str(root / ".corral") not in argv
    assert str(root / ".git") not in argv


def test_profile_refuses_symlinked_protected_entries(project: Path, short_tmp: Path) -> None:
    other = short_tmp / "elsewhere"
    other.mkdir()
    (project / ".corral" / "ledger.db").unlink()
    (project / ".corral").rmdir()
    (project / ".corral").symlink_to(other)
    with pytest.raises(SandboxProfileError):
        build_bwrap_argv(SandboxProfile(project), ["true"], project)


def test_profile_rejects_bad_input(project: Path, short_tmp: Path) -> None:
    with pytest.raises(SandboxProfileError):
        SandboxProfile(Path("relative/path"))
    with pytest.raises(SandboxProfileError):
        SandboxProfile(project / "missing")
    with pytest.raises(SandboxProfileError):
        SandboxProfile(project, hide=("../escape",))
    with pytest.raises(SandboxProfileError):
        Rlimits(cpu_s=0)
    with pytest.raises(SandboxProfileError, match="outside the project root"):
        build_bwrap_argv(SandboxProfile(project), ["true"], short_tmp)


def test_profile_resolves_a_symlinked_root(project: Path, short_tmp: Path) -> None:
    link = short_tmp / "link"
    link.symlink_to(project)
    assert SandboxProfile(link).project_root == project.resolve()


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


# -- isolation, from a grandchild that left the session ---------------------------------

PROBE = r"""
import os, socket, sys
def attempt(name, fn):
    try:
        fn()
        print(name, "ALLOWED")
    except OSError as exc:
        print(name, "DENIED", type(exc).__name__)
def write(path):
    with open(path, "w") as handle:
        handle.write("x")
def connect():
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect(("127.0.0.1", int(sys.argv[2])))
    finally:
        s.close()
print("pidns", os.readlink("/proc/self/ns/pid"))
print("sid-is-self", os.getsid(0) == os.getpid())
attempt("read-outside", lambda: open(sys.argv[1]).read())
try:
    print("shadow", "empty" if open("/etc/shadow").read() == "" else "LEAKED")
except OSError as exc:
    print("shadow", "DENIED", type(exc).__name__)
attempt("write-git", lambda: write(".git/HEAD"))
attempt("create-git", lambda: write(".git/new"))
attempt("write-corral", lambda: write(".corral/ledger.db"))
print("corral-listing", sorted(os.listdir(".corral")))
attempt("write-project", lambda: write("src/made-inside.txt"))
attempt("connect", connect)
print("home", os.environ.get("HOME"), sorted(os.listdir(os.environ["HOME"])))
"""


@needs_bwrap
async def test_setsid_grandchild_stays_inside_the_sandbox(project: Path, outside: Path) -> None:
    (project / "probe.py").write_text(PROBE)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    # The same probe from outside the sandbox reaches the listener: the denial below
    # is the sandbox, not a port nobody listens on.
    with socket.create_connection(("127.0.0.1", port), timeout=3):
        pass
    probe = f"{sys.executable} -I probe.py {outside} {port}"
    argv = ["sh", "-c", f"setsid {probe}; echo leader-done"]
    try:
        result = await run_command(argv, project, 20, SandboxProfile(project), 100, 0)
    finally:
        listener.close()
    out = dict(line.split(" ", 1) for line in result.stdout.head if " " in line)
    assert result.state is SessionState.EXITED, result
    assert result.ready_info is not None and result.ready_info.pid_namespace is not None
    assert out["pidns"] == f"pid:[{result.ready_info.pid_namespace}]"
    assert out["sid-is-self"] == "True"  # it really left the target's session
    assert out["read-outside"].startswith("DENIED")
    assert out["shadow"] == "DENIED FileNotFoundError"  # /etc is an allow list: no shadow at all
    assert out["write-git"].startswith("DENIED")
    assert out["create-git"].startswith("DENIED")
    assert out["write-corral"].startswith("DENIED")
    assert out["corral-listing"] == "[]"
    assert out["write-project"] == "ALLOWED"
    assert out["connect"].startswith("DENIED")
    assert out["home"] == "<home> []"  # the private HOME, path-redacted
    assert "outside-secret-content" not in "\n".join(result.stdout.head)
    # What the sandbox wrote to the project is real; what it could not, is untouched.
    assert (project / "src" / "made-inside.txt").read_text() == "x"
    assert (project / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert not (project / ".git" / "new").exists()
    assert (project / ".corral" / "ledger.db").read_text() == "control data\n"
    result.transcript_path.unlink()


@needs_bwrap
async def test_terminate_reaches_a_setsid_grandchild_that_ignores_sigterm(project: Path) -> None:
    script = "setsid sh -c 'trap \"\" TERM; echo grandchild-up; exec sleep 60' & wait"
    async with PtySession(["sh", "-c", script], cwd=project, profile=SandboxProfile(project)) as s:
        await s.start()
        with trio.fail_after(10):
            while "grandchild-up" not in (await s.poll(None, wait_ms=200)).chunk:
                pass
        with trio.fail_after(10):
            # "grandchild-up" comes just before its exec; wait for the exec itself.
            while not (sleepers := [p for p in psutil.Process().children(recursive=True)
                                    if _name(p) == "sleep"]):
                await trio.sleep(0.01)
        assert len(sleepers) == 1
        sleeper = sleepers[0]
        assert s.ready_info is not None
        # It left the target's session (and so the process group SIGTERM goes to).
        assert os.getsid(sleeper.pid) == sleeper.pid != s.ready_info.pid
        assert await s.terminate() is SessionState.TERMINATED
    assert not sleeper.is_running()


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.NoSuchProcess:
        return ""


@BOTH_MODES
async def test_capabilities_dropped_and_no_new_privs(project: Path, mode: LaunchMode) -> None:
    argv = ["grep", "-E", "^(Cap(Inh|Prm|Eff|Amb|Bnd)|NoNewPrivs):", "/proc/self/status"]
    result = await run_command(argv, project, 10, SandboxProfile(project), 10, 0, launch_mode=mode)
    fields = dict(line.split(":\t") for line in result.stdout.head)
    assert fields["NoNewPrivs"] == "1"
    for name in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(fields[name], 16) == 0, name
    if os.geteuid() == 0:
        assert int(fields["CapBnd"], 16) == 0
    result.transcript_path.unlink()


@BOTH_MODES
async def test_rlimits_are_applied(project: Path, mode: LaunchMode) -> None:
    limits = Rlimits(cpu_s=30, address_space_bytes=4 << 30, open_files=64, processes=512)
    profile = SandboxProfile(project, rlimits=limits)
    result = await run_command(["cat", "/proc/self/limits"], project, 10, profile, 50, 0,
                               launch_mode=mode)
    rows = {line[:26].strip(): line[26:].split() for line in result.stdout.head[1:]}
    assert rows["Max cpu time"][:2] == ["30", "30"]
    assert rows["Max address space"][:2] == [str(4 << 30)] * 2
    assert rows["Max open files"][:2] == ["64", "64"]
    assert rows["Max processes"][:2] == ["512", "512"]
    result.transcript_path.unlink()


@BOTH_MODES
async def test_environment_is_scrubbed(
    project: Path, mode: LaunchMode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_API_KEY", "do-not-leak-this-value")
    result = await run_command(["env"], project, 10, SandboxProfile(project), 100, 0,
                               launch_mode=mode)
    names = {line.split("=", 1)[0] for line in result.stdout.head}
    assert "CORRAL_TEST_API_KEY" not in names
    assert "PATH" in names
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


async def test_transcript_files_are_private(project: Path) -> None:
    result = await run_command(["echo", "x"], project, 5, SandboxProfile(project),
                               launch_mode=LaunchMode.UNSANDBOXED,
                               transcript_path=project / "t.log")
    assert stat.S_IMODE(result.transcript_path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        await run_command(["echo", "x"], project, 5, SandboxProfile(project),
                          launch_mode=LaunchMode.UNSANDBOXED, transcript_path=project / "t.log")

"""The bubblewrap profile and the isolation it gives.

Real processes throughout: the isolation tests run a grandchild that calls setsid()
inside bubblewrap and check what it can reach. The launch-mode decision and the
launch handshake are in test_sandbox_handshake.py.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from pathlib import Path

import psutil
import pytest
import trio

from corral.actors.one_shot_command import run_command
from corral.actors.pty_session import PtySession
from corral.actors.session_state import SessionState
from corral.sandbox.bwrap import (
    BWRAP_CANDIDATES,
    LaunchMode,
    Rlimits,
    SandboxProfile,
    SandboxProfileError,
    SandboxUnavailable,
    build_bwrap_argv,
    find_bwrap,
    untrusted_reason,
)
from tests.launch_modes import BOTH_MODES, needs_bwrap

# A fixture, imported so that pytest finds it in this module (see sandbox_project).
from tests.sandbox_project import project as project

pytestmark = pytest.mark.usefixtures("private_tempdir")


@pytest.fixture
def outside(short_tmp: Path) -> Path:
    """A secret next to the project, in a directory the sandbox must not show."""
    directory = short_tmp / "outside"
    directory.mkdir()
    secret = directory / "secret.txt"
    secret.write_text("outside-secret-content\n")
    return secret


# -- the profile ----------------------------------------------------------------------


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_profile_argv_isolates_everything(project: Path) -> None:
    argv = build_bwrap_argv(SandboxProfile(project), ["true"], project / "src")
    sep = argv.index("--")
    options, target = argv[:sep], argv[sep + 1 :]
    assert target == ["true"]
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in options
    assert argv[0] in BWRAP_CANDIDATES
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


def test_bubblewrap_comes_only_from_fixed_trusted_system_paths(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch, project: Path
) -> None:
    """Seed 004 V1.11: "bubblewrap 只允许从固定系统候选路径解析，文件必须是普通可执行文件且不能被
    当前普通用户写入": a `bwrap` first on PATH is never run, and a file that is not a
    regular executable owned by root and writable by no one else is refused."""
    planted = short_tmp / "bin"
    planted.mkdir()
    fake = planted / "bwrap"
    fake.write_text('#!/bin/sh\ntouch /tmp/corral-planted-bwrap-ran\nexec /usr/bin/env "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{planted}:{os.environ.get('PATH', '')}")
    found = find_bwrap()
    assert found is None or found in BWRAP_CANDIDATES
    assert found != str(fake)
    if found is not None:
        assert build_bwrap_argv(SandboxProfile(project), ["true"], project)[0] == found

    assert untrusted_reason(str(planted)) is not None  # a directory
    fake.chmod(0o644)
    assert "not executable" in str(untrusted_reason(str(fake)))
    fake.chmod(0o775)
    reason = untrusted_reason(str(fake))
    assert reason is not None and ("writable" in reason or "not owned by root" in reason)
    if os.geteuid() == 0:
        fake.chmod(0o755)
        os.chown(fake, 65534, 65534)
        assert "not owned by root" in str(untrusted_reason(str(fake)))
        os.chown(fake, 0, 0)
        assert untrusted_reason(str(fake)) is None  # root's own, 0755: trusted by these rules
    assert untrusted_reason(str(short_tmp / "missing")) is not None
    link = short_tmp / "bwrap-link"
    link.symlink_to(fake)
    fake.chmod(0o777)
    assert untrusted_reason(str(link)) is not None  # judged at its target
    # A profile that names an untrusted file fails closed: no argv to run.
    with pytest.raises(SandboxUnavailable):
        build_bwrap_argv(SandboxProfile(project, bwrap=str(fake)), ["true"], project)
    with pytest.raises(SandboxUnavailable):
        build_bwrap_argv(SandboxProfile(project, bwrap="bwrap"), ["true"], project)  # a bare name: no PATH lookup


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


# -- the transcript -----------------------------------------------------------------


async def test_transcript_files_are_private(project: Path) -> None:
    result = await run_command(["echo", "x"], project, 5, SandboxProfile(project),
                               launch_mode=LaunchMode.UNSANDBOXED,
                               transcript_path=project / "t.log")
    assert stat.S_IMODE(result.transcript_path.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        await run_command(["echo", "x"], project, 5, SandboxProfile(project),
                          launch_mode=LaunchMode.UNSANDBOXED, transcript_path=project / "t.log")

"""Issue 32, cases 4 and 5, when the process that launched a sandboxed command dies
with it: the check after the command must still run (at the next launch), and one
walk of the project per launch serves the snapshot and the sandbox's deny list.

Real bubblewrap, real git, real processes killed with SIGKILL; the marker file is
what the repository's fsmonitor would create if it ran on the host."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import trio

from corral.actors.one_shot_command import run_command
from corral.actors.pty_session import PtySession
from corral.sandbox.bwrap import LaunchMode, SandboxProfile, SandboxProfileError, build_bwrap_argv
from corral.sandbox.control_paths import sandbox_entries, scan_controls
from corral.sandbox.guard_record import GUARD_DIR
from corral.sandbox.guard_removal import QUARANTINE_DIR
from corral.sandbox.tree_guard import snapshot
from tests.harness import Daemon, ledger_rows, wait_run
from tests.launch_modes import needs_bwrap

pytestmark = pytest.mark.usefixtures("private_tempdir")

CLEAN_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}

#: A launcher of its own: the process the test SIGKILLs while its command runs.
LAUNCHER = """
import functools
import sys
from pathlib import Path

import trio

from corral.actors.one_shot_command import run_command
from corral.sandbox.bwrap import LaunchMode, SandboxProfile

root, home, script = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
profile = SandboxProfile(project_root=root, masked=(home,))
trio.run(functools.partial(run_command, ["sh", "-c", script], root, 600, profile, launch_mode=LaunchMode.SANDBOXED))
"""


def _user_git_status(cwd: Path, home: Path) -> None:
    """git status as the user runs it on the host (their own HOME, no corral settings)."""
    env = {**CLEAN_ENV, "HOME": str(home), "GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    subprocess.run(["git", "status"], cwd=cwd, env=env, capture_output=True, timeout=60, check=False)


def _plant(marker: Path, then: str) -> str:
    # git runs core.fsmonitor through the shell with two arguments: comment them out.
    # The marker's path is spelled so that no absolute path shows in the command (as an
    # attacker would spell it): the handoff refuses a host path it sees (seed 004 V1.43),
    # and what these tests try is the sandbox and the guard behind it.
    hidden = "$(printf %s /)" + str(marker).lstrip("/")
    return f"git init -q . && git config core.fsmonitor 'touch {hidden} #' && {then}"


def _wait_for(check: Callable[[], bool], what: str, alive: Callable[[], bool], timeout: float = 60,
              explain: Callable[[], str] = lambda: "") -> None:
    """Wait until ``check`` holds (observable state on disk), as long as ``alive``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert alive(), f"gave up before {what}: {explain()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _planted(root: Path) -> bool:
    config = root / ".git" / "config"
    return config.is_file() and "fsmonitor" in config.read_text()


def _records(home: Path) -> list[Path]:
    directory = home / GUARD_DIR
    return sorted(directory.glob("*.snapshot.json")) if directory.is_dir() else []


@pytest.fixture
def world(short_tmp: Path) -> dict[str, Path]:
    root = short_tmp / "proj"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\n")
    home = short_tmp / "corral-home"
    home.mkdir(mode=0o700)
    user_home = short_tmp / "user-home"
    user_home.mkdir()
    return {"root": root, "home": home, "user": user_home, "marker": short_tmp / "PWNED"}


def _kill_launcher_mid_command(root: Path, home: Path, script: str, ready: Callable[[], bool]) -> None:
    """Launch ``script`` sandboxed from a launcher of its own, SIGKILL that launcher
    once ``ready`` holds (the command blocked in ``sleep 600``), reap what it leaves."""
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(root), str(home), script],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        _wait_for(ready, "the command to be under way", lambda: launcher.poll() is None,
                  explain=lambda: launcher.stderr.read().decode() if launcher.stderr else "")
        # Still running (blocked in sleep) when its launcher is killed.
        assert _launcher_of(["sleep", "600"]).pid == launcher.pid
        tree = psutil.Process(launcher.pid).children(recursive=True)
        # Durable before the command started, outside the sandbox's view.
        [record] = _records(home)
        assert json.loads(record.read_text())["root"] == str(root.resolve())
        launcher.send_signal(signal.SIGKILL)
        assert launcher.wait(timeout=10) == -signal.SIGKILL
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        assert launcher.stderr is not None
        launcher.stderr.close()
    # The sandbox dies with its launcher (PDEATHSIG); this test process is the
    # subreaper of what it leaves, and reaps it here.
    assert psutil.wait_procs(tree, timeout=15)[1] == []


def _quarantined(home: Path, rel: str) -> list[Path]:
    """Where the check moved ``rel`` of the project (sandbox/guard_removal.py)."""
    return sorted((home / QUARANTINE_DIR).glob(f"*/{rel}"))


@needs_bwrap
async def test_a_command_whose_launcher_is_killed_is_checked_at_the_next_launch(world: dict[str, Path]) -> None:
    root, home, marker = world["root"], world["home"], world["marker"]
    _kill_launcher_mid_command(root, home, _plant(marker, "exec sleep 600"), lambda: _planted(root))
    assert (root / ".git" / "config").is_file(), "nobody ran the check after the command"
    planted = (root / ".git" / "config").read_bytes()

    profile = SandboxProfile(project_root=root, masked=(home,))
    result = await run_command(["true"], root, 60, profile, launch_mode=LaunchMode.SANDBOXED)
    assert result.exit_code == 0
    assert not os.path.lexists(root / ".git"), "the next launch ran the check the dead launcher could not"
    assert result.guard is not None and result.guard.clean  # what it removed was not this command's doing
    # Moved, not deleted: into the home's quarantine, private, out of the project.
    [kept] = _quarantined(home, ".git")
    assert (kept / "config").read_bytes() == planted
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    assert _records(home) == []
    assert (root / "src" / "main.py").read_text() == "print('hi')\n"
    _user_git_status(root, world["user"])
    assert not marker.exists()


@needs_bwrap
async def test_a_repository_the_user_makes_while_no_command_runs_is_never_deleted(world: dict[str, Path]) -> None:
    """The user runs ``git init`` and commits between a launcher's death and the next
    launch: the check that catches the dead launcher up cannot tell that repository
    from the command's, but its history survives, where a person can find it."""
    root, home, user = world["root"], world["home"], world["user"]
    _kill_launcher_mid_command(root, home, "exec sleep 600", lambda: bool(_records(home)))
    env = {**CLEAN_ENV, "HOME": str(user), "GIT_CEILING_DIRECTORIES": str(root.parent),
           "GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@x"}
    for args in (["init", "-q", "-b", "main"], ["add", "src/main.py"], ["commit", "-q", "-m", "my work"]):
        subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True, timeout=60)
    head = (root / ".git" / "refs" / "heads" / "main").read_bytes()

    profile = SandboxProfile(project_root=root, masked=(home,))
    result = await run_command(["true"], root, 60, profile, launch_mode=LaunchMode.SANDBOXED)
    assert result.exit_code == 0 and not os.path.lexists(root / ".git")
    [kept] = _quarantined(home, ".git")
    assert (kept / "refs" / "heads" / "main").read_bytes() == head
    log = subprocess.run(["git", "--git-dir", str(kept), "log", "--format=%s"], env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    assert log.stdout == "my work\n", "the user's history is intact in the quarantine"


@needs_bwrap
async def test_the_record_of_a_live_launch_is_left_to_it(world: dict[str, Path]) -> None:
    """Another launch on the same project and home, while a session runs, must not
    take the session's record for a leftover: the session's own check runs at its end."""
    root, home = world["root"], world["home"]
    profile = SandboxProfile(project_root=root, masked=(home,))
    async with PtySession(["sh", "-c", _plant(world["marker"], "exec sleep 600")], cwd=root, profile=profile,
                          launch_mode=LaunchMode.SANDBOXED) as session:
        await session.start()
        with trio.fail_after(60):
            while not _planted(root):  # the session's own tasks run meanwhile
                await trio.sleep(0.02)
        [record] = _records(home)
        other = await run_command(["true"], root, 60, profile, launch_mode=LaunchMode.SANDBOXED)
        assert other.exit_code == 0 and other.guard is not None and other.guard.clean
        assert (root / ".git" / "config").is_file() and _records(home) == [record]
        await session.kill()
        await session.wait()
    assert not os.path.lexists(root / ".git")
    [kept] = _quarantined(home, ".git")
    assert "fsmonitor" in (kept / "config").read_text()
    assert _records(home) == []


@needs_bwrap
async def test_unusable_records_change_nothing_and_a_visible_state_dir_is_refused(world: dict[str, Path]) -> None:
    root, home = world["root"], world["home"]
    records = home / GUARD_DIR
    records.mkdir(mode=0o700)
    (records / "garbage.snapshot.json").write_text('{"version": 1, "root": 5}')
    (records / "cut.snapshot.json").write_bytes(b"\xff" * 10)
    (records / "early.snapshot.json.partial").write_text("{")  # its launcher died before COMMIT_EXEC
    (root / "sub").mkdir()
    (root / "sub" / ".git").mkdir()  # the user's own: no record names this tree
    profile = SandboxProfile(project_root=root, masked=(home,))
    result = await run_command(["true"], root, 60, profile, launch_mode=LaunchMode.SANDBOXED)
    assert result.exit_code == 0 and result.guard is not None and result.guard.clean
    assert sorted(p.name for p in records.iterdir()) == ["recover.lock"]
    assert (root / "sub" / ".git").is_dir()
    with pytest.raises(SandboxProfileError, match="visible inside the sandbox"):
        await run_command(["true"], root, 60, dataclasses.replace(profile, state_dir=root / "sub"),
                          launch_mode=LaunchMode.SANDBOXED)
    assert sorted(p.name for p in (root / "sub").iterdir()) == [".git"]


SPEC = """
[project]
root = "ws"
[[agents]]
id = "writer"
[[agents.steps]]
actions = [{{ tool = "process.start", input = {{ program = "sh", args = ["-c", {script}] }} }}]
[[agents.steps]]
actions = [{{ tool = "process.poll", input = {{ process_id = "${{running.process_id}}", wait_ms = 30000 }} }}]
[[agents.steps]]
final = "done"
[[agents]]
id = "other"
[[agents.steps]]
actions = [{{ tool = "command.exec", input = {{ program = "true" }} }}]
[[agents.steps]]
final = "done"
"""


def _launcher_of(command: list[str]) -> psutil.Process:
    """The process that launched the sandboxed ``command``, once it runs."""
    deadline = time.monotonic() + 60
    while (found := _find_launcher(command)) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {command} to run"
        time.sleep(0.02)
    return found


def _find_launcher(command: list[str]) -> psutil.Process | None:
    """The first ancestor above the bwrap processes of a running ``command`` (the
    sandbox's pid 1 is a bwrap too), or nothing."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.cmdline() != command:
                continue
            seen_bwrap = False
            for ancestor in proc.parents():
                if os.path.basename(ancestor.cmdline()[0]) == "bwrap":
                    seen_bwrap = True
                elif seen_bwrap:
                    return ancestor
        except (psutil.Error, IndexError):
            continue
    return None


@needs_bwrap
@pytest.mark.parametrize("killed", ["session-actor", "supervisor"])
def test_a_launcher_killed_mid_command_is_caught_up_by_the_next_command(short_tmp: Path, killed: str) -> None:
    """The real corral: the session actor that launched a process session is SIGKILLed
    while it runs (alone, or with the supervisor above it, which takes it down by
    PDEATHSIG); the next command another agent runs removes what it planted."""
    marker = short_tmp / "PWNED"
    ws = short_tmp / "ws"
    ws.mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(SPEC.format(script=json.dumps(_plant(marker, "exec sleep 120"))))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="plant")["run_id"]
        _wait_for(lambda: _planted(ws), "the planted .git/config", lambda: True)
        actor = _launcher_of(["sleep", "120"])
        sessions = [a for a in daemon.status()["actors"] if a["id"].startswith("proc-")]
        assert [a["pid"] for a in sessions] == [actor.pid], "the launcher is the session actor"
        doomed = [actor, *actor.children(recursive=True)]
        if killed == "supervisor":
            daemon.kill_supervisor()
        else:
            actor.send_signal(signal.SIGKILL)
        assert psutil.wait_procs(doomed, timeout=15)[1] == []
        if killed == "supervisor":
            daemon.up()
            # The supervisor's boot caught the dead launcher up, before any actor ran.
            assert not os.path.lexists(ws / ".git"), "the boot ran the check the dead launcher could not"
        else:
            wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
            assert (ws / ".git" / "config").is_file(), "nobody ran the check after the command"

        other = daemon.call("run", agent_id="other", task="anything")["run_id"]
        assert wait_run(daemon, other, {"completed", "failed"})["run"]["status"] == "completed"
        assert not os.path.lexists(ws / ".git")
        [kept] = _quarantined(daemon.home, ".git")
        assert "fsmonitor" in (kept / "config").read_text(), "moved to the home's quarantine, not deleted"
        rows = ledger_rows(daemon.home, "SELECT result FROM actions WHERE run_id = ? AND tool = 'command.exec'", other)
        assert [json.loads(row["result"])["output"]["exit_code"] for row in rows] == [0]
        assert list((daemon.home / GUARD_DIR).glob("*.json")) == []
    finally:
        daemon.shutdown()
    _user_git_status(ws, short_tmp)
    assert not marker.exists()


# -- one walk per launch ---------------------------------------------------------------------


def _busy_tree(root: Path) -> Path:
    """Every kind of entry both walks care about; returns a home inside the project."""
    (root / "src").mkdir(parents=True)
    for index in range(30):
        (root / "src" / f"m{index}.py").write_text("x = 1\n")
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_text("[core]\n")
    os.link(root / ".git" / "config", root / "src" / "cfg.txt")
    (root / "wt").mkdir()
    (root / "wt" / ".git").write_text("gitdir: ../wtdata\n")
    (root / "wtdata" / "hooks").mkdir(parents=True)
    for name in ("HEAD", "config"):
        (root / "tools" / "evil" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "tools" / "evil" / name).write_text("x\n")
    (root / "tools" / "evil" / "objects").mkdir()
    (root / "tools" / "evil" / "refs").mkdir()
    (root / "lib" / ".gitattributes").parent.mkdir()
    (root / "lib" / ".gitattributes").write_text("* binary\n")
    (root / ".env").write_text("KEY=v\n")
    os.link(root / ".env", root / "innocent.txt")
    (root / "credentials" / "sub" / ".git").mkdir(parents=True)  # a secret directory: masked whole
    (root / ".docker").mkdir()
    (root / ".docker" / "config.json").write_text("{}\n")
    (root / ".corral" / "x").mkdir(parents=True)
    (root / "link.env").symlink_to(".env")
    (root / "data").mkdir()
    (root / "data" / ".git").symlink_to("../lib")
    os.mkfifo(root / "src" / "pipe")
    home = root / "state"  # a home inside the project under another name: masked
    (home / "deep").mkdir(parents=True)
    (home / "deep" / ".env").write_text("TOKEN=t\n")
    (home / "deep" / ".git").mkdir()
    home.chmod(0o700)
    return home


def test_one_walk_gives_the_same_snapshot_deny_list_and_sandbox_as_two(short_tmp: Path) -> None:
    root = short_tmp / "proj"
    home = _busy_tree(root)
    alone = snapshot(root, (home,))
    shared = snapshot(root, (home,), scan=True)
    assert shared.scan is not None
    assert dataclasses.asdict(alone.tree) == dataclasses.asdict(shared.tree)
    assert (alone.frozen, alone.protect) == (shared.frozen, shared.protect)
    own = scan_controls(root)
    for name in ("control_entries", "hidden", "gitdir_targets", "shapes", "drivers", "secrets", "secret_inodes",
                 "others"):
        assert getattr(own, name) == getattr(shared.scan, name), name  # the same order too
    entries = sandbox_entries(root, shared.scan)
    assert entries == sandbox_entries(root)
    assert str(home / "deep" / ".env") in map(str, entries[2])  # the deny list still walks such a home
    profile = SandboxProfile(project_root=root, masked=(home,))
    assert build_bwrap_argv(profile.with_entries(entries), ["true"], root) == build_bwrap_argv(profile, ["true"], root)

"""Issue 32, cases 3, 4, 5, 7 and 11: host code from the workspace through git.

A sandboxed command must leave no git control entry behind (a ``.git`` in any case,
a gitdir file and the directory it names, a bare-repository shape, ``.gitattributes``),
must not reach ``.git`` through another name of one of its files, and corral's own
host-side git must never run a program a repository names, nor show a secret file.
Real bubblewrap, real git, real files; the marker files are what the repository's
programs would create if they ran on the host."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.actors.one_shot_command import CommandResult, run_command
from corral.actors.pty_session import PtySession
from corral.actors.session_state import SessionState
from corral.actors.tools.base import ToolContext, ToolError, ToolResult
from corral.actors.tools.process import CommandExec
from corral.actors.tools.project import GitCommit, GitDiff, GitSnapshot, GitStatus
from corral.actors.tools.source_fingerprint import fingerprint
from corral.mailbox.protocol import CommandSandbox, ProjectCommitMoved, ProjectVerification, Request, reply
from corral.sandbox.bwrap import LaunchMode, SandboxProfile
from tests.launch_modes import needs_bwrap

pytestmark = pytest.mark.usefixtures("private_tempdir")

CLEAN_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}


def _git(cwd: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """git as the user runs it on the host (their own HOME, no corral settings)."""
    env = {**CLEAN_ENV, "HOME": str(home), "GIT_CEILING_DIRECTORIES": str(cwd.parent)}
    return subprocess.run(
        ["git", "-c", "user.name=u", "-c", "user.email=u@example.invalid", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def _fsmonitor(marker: Path) -> str:
    # git runs core.fsmonitor through the shell with two arguments: comment them out.
    return f"touch {marker} #"


@pytest.fixture
def world(short_tmp: Path) -> dict[str, Path]:
    root = short_tmp / "proj"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\n")
    user_home = short_tmp / "user-home"
    user_home.mkdir()
    return {"root": root, "home": user_home, "marker": short_tmp / "PWNED"}


async def _sandboxed(root: Path, script: str, cwd: Path | None = None) -> CommandResult:
    return await run_command(
        ["sh", "-c", script], cwd or root, 60, SandboxProfile(project_root=root), launch_mode=LaunchMode.SANDBOXED
    )


def _transcript(result: CommandResult) -> str:
    return result.transcript_path.read_text()


# -- case 3: another name of a file inside .git -------------------------------------------


@needs_bwrap
async def test_a_hard_link_to_git_config_is_read_only_inside_the_sandbox(world: dict[str, Path]) -> None:
    root, marker = world["root"], world["marker"]
    assert _git(root, "init", "-q", home=world["home"]).returncode == 0
    before = (root / ".git" / "config").read_bytes()
    head = (root / ".git" / "HEAD").read_bytes()
    os.link(root / ".git" / "config", root / "src" / "cfg.txt")
    os.link(root / ".git" / "HEAD", root / "head-copy")
    script = (
        f"printf '[core]\\n\\tfsmonitor = {_fsmonitor(marker)}\\n' >> src/cfg.txt; echo cfg=$?;"
        " echo 'ref: refs/heads/evil' > head-copy; echo head=$?; cat src/main.py"
    )
    result = await _sandboxed(root, script)
    out = _transcript(result)
    assert "print('hi')" in out  # the project is there
    assert "cfg=0" not in out and "head=0" not in out and "Read-only file system" in out, out
    assert (root / ".git" / "config").read_bytes() == before
    assert (root / ".git" / "HEAD").read_bytes() == head
    _git(root, "status", home=world["home"])
    assert not marker.exists()


# -- cases 4 and 5: new repositories at any depth -----------------------------------------


@needs_bwrap
async def test_a_nested_gitdir_file_and_the_repository_it_names_are_removed(world: dict[str, Path]) -> None:
    root, marker = world["root"], world["marker"]
    script = (
        "mkdir sub && cd sub && git init -q --separate-git-dir ../evil"
        f" && git config core.fsmonitor '{_fsmonitor(marker)}' && printf 'gitdir: ../evil\\n' > .git && echo made"
    )
    result = await _sandboxed(root, script)
    assert "made" in _transcript(result)
    assert not (root / "sub" / ".git").exists() and not (root / "evil").exists()
    assert (root / "sub").is_dir() and (root / "src" / "main.py").read_text() == "print('hi')\n"
    assert result.guard is not None and set(result.guard.removed) == {"sub/.git", "evil"}
    _git(root / "sub", "status", home=world["home"])
    assert not marker.exists()


@needs_bwrap
async def test_git_init_in_a_project_that_is_no_repository_is_undone(world: dict[str, Path]) -> None:
    root, marker = world["root"], world["marker"]
    script = f"git init -q . && git config core.fsmonitor '{_fsmonitor(marker)}' && echo made"
    result = await _sandboxed(root, script)
    assert "made" in _transcript(result)
    assert not (root / ".git").exists()
    assert result.guard is not None and result.guard.removed == (".git",)
    assert "corral refused git control entries" in result.guard.notice()
    _git(root, "status", home=world["home"])
    assert not marker.exists()


@needs_bwrap
async def test_every_spelling_and_shape_of_a_repository_is_removed(world: dict[str, Path]) -> None:
    root, marker = world["root"], world["marker"]
    (root / "lib").mkdir()
    (root / "lib" / "util.py").write_text("x = 1\n")
    (root / "data").mkdir()
    script = (
        "mkdir -p a/b && git init -q a/b && mkdir c && mv a/b/.git c/.GIT;"
        f" git init -q --bare tools/evil && git --git-dir=tools/evil config core.fsmonitor '{_fsmonitor(marker)}';"
        " git init -q --bare lib;"  # a directory that was there: only what makes it a repository goes
        " ln -s ../lib data/.git;"
        " printf '* filter=x\\n' > src/.gitattributes; printf '[submodule \"s\"]\\n' > .gitmodules;"
        " mkdir -p deep/er && git init -q deep/er && chmod 000 deep; echo made"
    )
    result = await _sandboxed(root, script)
    assert "made" in _transcript(result)
    assert result.guard is not None
    removed = set(result.guard.removed)
    assert {"c/.GIT", "tools/evil", "data/.git", "src/.gitattributes", ".gitmodules", "deep/er/.git"} <= removed
    assert {"lib/HEAD", "lib/objects", "lib/refs", "lib/config"} <= removed
    assert result.guard.failed == ()
    assert (root / "lib" / "util.py").read_text() == "x = 1\n"
    for gone in ("c/.GIT", "tools/evil", "data/.git", "src/.gitattributes", ".gitmodules", "deep/er/.git",
                 "lib/HEAD", "lib/config"):
        assert not os.path.lexists(root / gone), gone
    for where in (root / "lib", root / "tools", root / "c", root / "deep" / "er"):
        _git(where, "status", home=world["home"])
    assert not marker.exists()


@needs_bwrap
async def test_the_project_root_made_a_bare_repository_loses_only_what_makes_it_one(world: dict[str, Path]) -> None:
    root, marker = world["root"], world["marker"]
    (root / "hooks").mkdir()  # the project's own, with the name of a repository's directory
    (root / "hooks" / "useful.sh").write_text("echo project hook\n")
    script = f"git init -q --bare . && git config core.fsmonitor '{_fsmonitor(marker)}' && echo made"
    result = await _sandboxed(root, script)
    assert "made" in _transcript(result)
    assert result.guard is not None and {"HEAD", "config", "objects", "refs"} <= set(result.guard.removed)
    assert "hooks" not in result.guard.removed and (root / "hooks" / "useful.sh").is_file()
    assert (root / "src" / "main.py").read_text() == "print('hi')\n"
    _git(root, "status", home=world["home"])
    assert not marker.exists()


@needs_bwrap
async def test_existing_control_entries_stay_and_cannot_be_changed(world: dict[str, Path]) -> None:
    root = world["root"]
    for repo in (root, root / "vendor" / "lib"):
        repo.mkdir(parents=True, exist_ok=True)
        assert _git(repo, "init", "-q", home=world["home"]).returncode == 0
    (root / ".gitattributes").write_text("*.png binary\n")
    config = (root / ".git" / "config").read_bytes()
    script = (
        "echo '* filter=x' >> .gitattributes; echo attr=$?; echo x >> .git/config; echo cfg=$?;"
        " mv vendor moved; echo mv=$?; echo ok > src/new.txt"
    )
    result = await _sandboxed(root, script)
    out = _transcript(result)
    assert "attr=0" not in out and "cfg=0" not in out, out
    assert (root / ".gitattributes").read_text() == "*.png binary\n"
    assert (root / ".git" / "config").read_bytes() == config
    nested = root / ("moved" if "mv=0" in out else "vendor") / "lib" / ".git"
    assert (nested / "HEAD").is_file(), "an existing repository is never removed, even under a renamed parent"
    assert (root / "src" / "new.txt").read_text() == "ok\n"
    assert result.guard is not None and result.guard.clean, result.guard


@needs_bwrap
async def test_command_exec_reports_what_it_refused(world: dict[str, Path], short_tmp: Path) -> None:
    root = world["root"]

    async def ask(request: Request[Any], timeout: float = 30.0) -> Any:
        if isinstance(request, CommandSandbox):
            # As the supervisor answers: its home masked first (supervisor/sessions/session_service.py).
            return reply(request, {"project_root": str(root), "sandbox": {"mode": "required", "masked": [str(home)]}})
        return reply(request, {})

    home = short_tmp / "corral-home"
    home.mkdir(mode=0o700)
    ctx = ToolContext(agent_id="a", run_id="run-1", action_id="act-" + "0" * 24, workspace=root,
                      write_scopes=(".",), home=home, ask=ask)
    result = await CommandExec().run(ctx, {"program": "git", "args": ["init", "-q", "."]})
    assert not result.ok
    assert result.output["exit_code"] == 0 and result.output["control_entries"]["removed"] == [".git"]
    assert "corral refused git control entries" in result.summary and ".git" in result.summary
    assert not (root / ".git").exists()
    # Moved into the home's quarantine, not deleted; the observation says where.
    kept = Path(result.output["control_entries"]["moved_to"][".git"])
    assert kept.parent.parent == home / "quarantine" and (kept / "HEAD").read_bytes().startswith(b"ref: ")
    assert str(kept) in result.summary


@needs_bwrap
async def test_a_process_session_that_makes_a_repository_is_undone_when_it_ends(world: dict[str, Path]) -> None:
    root = world["root"]
    script = "git init -q sub && echo made"
    async with PtySession(["sh", "-c", script], cwd=root, profile=SandboxProfile(root),
                          launch_mode=LaunchMode.SANDBOXED) as session:
        await session.start()
        assert await session.wait() is SessionState.EXITED
        text = await _read_all(session)
    assert "made" in text and "corral refused git control entries" in text and "sub/.git" in text
    assert not (root / "sub" / ".git").exists()


async def _read_all(session: PtySession) -> str:
    text, cursor = "", None
    while True:
        polled = await session.poll(cursor, max_chars=100_000)
        if not polled.chunk:
            return text
        text += polled.chunk
        cursor = polled.next_cursor


# -- case 7: corral's own git never runs what a repository names --------------------------


def _tool_ctx(ws: Path) -> ToolContext:
    async def ask(request: Request[Any], timeout: float = 30.0) -> Any:
        # What a git tool asks the supervisor: project.git_commit's verification, and
        # (once its branch moved) that the commit be kept in the action's record.
        # As the answers come off the wire: typed records (mailbox/protocol).
        if isinstance(request, ProjectCommitMoved):
            return reply(request, {})
        assert isinstance(request, ProjectVerification), request
        now = fingerprint(ws, ws.parent / "corral-home").digest  # verified on the tree as it is now
        last = {"action_id": "act-0", "run_id": "run-t", "revision": 1, "fingerprint": now, "status": "passed",
                "commands": 1, "output": [], "created_at": 0.0}
        return reply(request, {"revision": 1, "verification": last, "passed_on_current": True, "passed_by_run": True})

    return ToolContext(agent_id="writer", run_id="run-t", action_id="act-1", workspace=ws, write_scopes=(".",),
                       home=ws.parent / "corral-home", ask=ask)


async def _commit(ctx: ToolContext, paths: list[str]) -> ToolResult:
    """project.git_commit of ``paths`` as they are, after its read-only snapshot."""
    snap = (await GitSnapshot().run(ctx, {"paths": paths})).output
    return await GitCommit().run(ctx, {"message": "more", "paths": paths, "expected_head": snap["head"],
                                       "expected_snapshot_fingerprint": snap["fingerprint"]})


def _hostile_repo(ws: Path, markers: Path, home: Path) -> None:
    """A repository whose config names a program for every hook git has: what a
    sandboxed command (or a process session still running) can leave, or a cloned
    repository that came with it."""
    ws.mkdir()
    assert _git(ws, "init", "-q", "-b", "main", home=home).returncode == 0
    (ws / "notes.txt").write_text("one\n")
    (ws / "data.bin").write_text("two\n")
    assert _git(ws, "add", "notes.txt", "data.bin", home=home).returncode == 0
    assert _git(ws, "commit", "-q", "-m", "start", home=home).returncode == 0
    config = {
        'diff "x"': {"textconv": f"touch {markers}/textconv; cat", "command": f"touch {markers}/diff-command #"},
        'filter "y.z-1"': {"clean": f"touch {markers}/clean; cat", "smudge": f"touch {markers}/smudge; cat",
                           "required": "true"},
        'filter "proc"': {"process": f"touch {markers}/process"},
        "core": {"fsmonitor": f"touch {markers}/fsmonitor #", "pager": f"touch {markers}/pager; cat",
                 "sshCommand": f"touch {markers}/ssh", "editor": f"touch {markers}/editor",
                 "hooksPath": str(ws / ".git" / "hooks")},
        "diff": {"external": f"touch {markers}/external #"},
        "credential": {"helper": f"!touch {markers}/credential"},
        "pager": {"status": f"touch {markers}/pager-status; cat", "diff": f"touch {markers}/pager-diff; cat"},
        'merge "m"': {"driver": f"touch {markers}/merge"},
        "gpg": {"program": f"{markers}/gpg"},
        "commit": {"gpgSign": "true"},
        "user": {"name": "u", "email": "u@example.invalid"},
    }
    with (ws / ".git" / "config").open("a") as handle:
        for section, values in config.items():
            handle.write(f"[{section}]\n" + "".join(f"\t{key} = {value}\n" for key, value in values.items()))
    (ws / ".gitattributes").write_text("notes.txt diff=x filter=y.z-1 merge=m\n*.bin filter=proc\n")
    for hook in ("pre-commit", "post-commit", "commit-msg", "prepare-commit-msg", "post-index-change"):
        path = ws / ".git" / "hooks" / hook
        path.write_text(f"#!/bin/sh\ntouch {markers}/hook-{hook}\n")
        path.chmod(0o755)


def test_the_hostile_repository_is_hostile_to_plain_git(short_tmp: Path) -> None:
    """The control: the same repository runs its programs under a plain ``git``."""
    markers = short_tmp / "markers"
    markers.mkdir()
    ws = short_tmp / "ws"
    _hostile_repo(ws, markers, short_tmp)
    (ws / "notes.txt").write_text("one\nmore\n")
    _git(ws, "diff", home=short_tmp)
    assert {"textconv", "fsmonitor"} & {p.name for p in markers.iterdir()}


async def test_project_git_tools_run_no_program_the_repository_names(short_tmp: Path) -> None:
    markers = short_tmp / "markers"
    markers.mkdir()
    ws = short_tmp / "ws"
    _hostile_repo(ws, markers, short_tmp)
    (ws / "notes.txt").write_text("one\nmore\n")
    (ws / "data.bin").write_text("two\nmore\n")
    ctx = _tool_ctx(ws)
    status = await GitStatus().run(ctx, {})
    assert "notes.txt" in status.output["status"]
    for staged in (False, True):
        diff = await GitDiff().run(ctx, {"staged": staged})
        if not staged:
            assert "+more" in diff.output["diff"]
    done = await _commit(ctx, ["notes.txt", "data.bin"])
    assert done.ok
    # The commit has the bytes of the work tree: no clean filter changed them.
    shown = _git(ws, "cat-file", "-p", "HEAD:notes.txt", home=short_tmp).stdout
    assert shown == "one\nmore\n"
    assert sorted(p.name for p in markers.iterdir()) == []


@needs_bwrap
async def test_the_chain_a_sandboxed_git_init_then_corral_git_tools(world: dict[str, Path]) -> None:
    """The chain of the issue, with a hostile model alone: a sandboxed command writes a
    repository with a textconv driver and a clean filter, and while it still runs (a
    process session: the sandbox's check comes when it ends) the auto-approved
    project.git_diff and the approved project.git_commit run git on the host."""
    root, marker = world["root"], world["marker"]
    script = (
        "git init -q -b main . && git config user.name m && git config user.email m@x && git add src/main.py"
        " && git commit -q -m start"
        f" && git config diff.x.textconv 'touch {marker}; cat' && git config filter.y.clean 'touch {marker}; cat'"
        " && printf '*.py diff=x filter=y\\n' > .gitattributes && echo 'print(2)' >> src/main.py"
        " && echo made && read wait"
    )
    async with PtySession(["sh", "-c", script], cwd=root, profile=SandboxProfile(root),
                          launch_mode=LaunchMode.SANDBOXED) as session:
        await session.start()
        with trio.fail_after(30):
            text = ""
            cursor = None
            while "made" not in text:
                polled = await session.poll(cursor, wait_ms=500)
                text += polled.chunk
                cursor = polled.next_cursor
                assert polled.state is SessionState.RUNNING, text
        ctx = _tool_ctx(root)
        diff = await GitDiff().run(ctx, {})
        assert "+print(2)" in diff.output["diff"]
        done = await _commit(ctx, ["src/main.py"])
        assert done.ok
        assert not marker.exists(), "a driver of the repository ran on the host"
        await session.write_stdin("", append_newline=True)
        assert await session.wait() is SessionState.EXITED
        text += await _read_all(session)
    # When it ended, the sandbox's check removed the repository it made.
    assert not (root / ".git").exists() and not (root / ".gitattributes").exists()
    assert not marker.exists()


async def test_git_tools_never_look_above_the_workspace(short_tmp: Path) -> None:
    """A repository in a parent directory (planted, or the user's own) is not the
    workspace's: discovery stops at the workspace (GIT_CEILING_DIRECTORIES), and a
    bare-repository shape is never picked up implicitly (safe.bareRepository)."""
    markers = short_tmp / "markers"
    markers.mkdir()
    parent = short_tmp / "ws"
    _hostile_repo(parent, markers, short_tmp)
    inner = parent / "inner"
    inner.mkdir()
    # A changed time makes git status read notes.txt again, through its clean filter.
    later = (parent / "notes.txt").stat().st_mtime + 10
    os.utime(parent / "notes.txt", (later, later))
    with pytest.raises(ToolError, match="not a git repository"):
        await GitStatus().run(_tool_ctx(inner), {})
    bare = short_tmp / "bare"
    assert _git(short_tmp, "init", "-q", "--bare", str(bare), home=short_tmp).returncode == 0
    with (bare / "config").open("a") as handle:
        handle.write(f"[core]\n\tfsmonitor = touch {markers}/bare-fsmonitor #\n")
    with pytest.raises(ToolError):
        await GitStatus().run(_tool_ctx(bare), {})
    assert sorted(p.name for p in markers.iterdir()) == []


# -- case 11: status and diff never show sensitive paths -----------------------------------


async def test_git_status_and_diff_never_show_secret_files(short_tmp: Path) -> None:
    ws = short_tmp / "ws"
    ws.mkdir()
    home = short_tmp
    assert _git(ws, "init", "-q", "-b", "main", home=home).returncode == 0
    pem_header = "-----BEGIN OPENSSH PRIVATE KEY-----"
    unpatterned = "zebra-correct-horse-unpatterned-7731"
    files = {
        ".env": "PLAIN=one\n",
        "keys/id.pem": f"{pem_header}\nAAAA\n",
        "config/.env.production": "X=1\n",
        "data/app.db": "sqlite\n",
        "deploy/credentials.json": "{}\n",
        "README.md": "hello\n",
    }
    for name, text in files.items():
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(text)
    assert _git(ws, "add", "-f", *files, home=home).returncode == 0
    assert _git(ws, "commit", "-q", "-m", "start", home=home).returncode == 0
    for name in files:
        (ws / name).write_text(files[name] + f"{unpatterned}\n")
    (ws / ".env.local").write_text(f"{unpatterned}\n")  # untracked
    (ws / "server.key").write_text(f"{unpatterned}\n")
    (ws / "notes.txt").write_text("new\n")
    (ws / "corral-home").mkdir()
    (ws / "corral-home" / "endpoint.json").write_text('{"token": "t"}')
    ctx = ToolContext(agent_id="w", run_id="run-t", action_id="act-1", workspace=ws, write_scopes=(".",),
                      home=ws / "corral-home")
    status = (await GitStatus().run(ctx, {})).output["status"]
    assert "README.md" in status and "notes.txt" in status
    diff = (await GitDiff().run(ctx, {})).output["diff"]
    assert "README.md" in diff and diff.count(unpatterned) == 1  # README's line only
    _git(ws, "add", "-A", home=home)
    staged = (await GitDiff().run(ctx, {"staged": True})).output["diff"]
    assert "README.md" in staged and "notes.txt" in staged
    for shown in (status, diff, staged):
        for secret in (".env", "id.pem", "app.db", "credentials", "server.key", "endpoint.json", "corral-home",
                       pem_header):
            assert secret not in shown, (secret, shown)
    assert unpatterned not in status and unpatterned not in staged.replace("+" + unpatterned, "", 1)


async def test_git_tools_refuse_a_work_tree_outside_the_workspace(short_tmp: Path) -> None:
    """``core.worktree`` in the repository's config would point git at any directory."""
    ws = short_tmp / "ws"
    ws.mkdir()
    assert _git(ws, "init", "-q", home=short_tmp).returncode == 0
    outside = short_tmp / "outside"
    outside.mkdir()
    (outside / "private-notes.txt").write_text("not the workspace\n")
    assert _git(ws, "config", "core.worktree", str(outside), home=short_tmp).returncode == 0
    with pytest.raises(ToolError, match="work tree"):
        await GitStatus().run(_tool_ctx(ws), {})
    with pytest.raises(ToolError, match="work tree"):
        await GitDiff().run(_tool_ctx(ws), {})

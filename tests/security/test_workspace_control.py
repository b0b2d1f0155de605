"""Issue 32, the file tools' side of "host code from the workspace through git" and
secrets through a side door (cases 1, 2, 6, 8, 12): no write through a planted name,
no write into or making a repository git would find, no secret under another name.
Real files and hard links on disk, the real tools, real git, a real supervisor."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.fs import FsList, FsPatch, FsRead, FsWrite
from corral.actors.tools.project import Changeset
from corral.sandbox.bwrap import SandboxProfile, build_bwrap_argv
from corral.sandbox.control_paths import control_entry_reason, sandbox_entries, scan_controls
from tests.harness import agent_spec, ledger_rows, running, wait_run
from tests.launch_modes import needs_bwrap

HOOK = b"#!/bin/sh\necho the user's own hook\n"
GIT_CONFIG = b"[core]\n\trepositoryformatversion = 0\n"
PAYLOAD = "#!/bin/sh\ntouch /tmp/corral-pwned\n"


async def _revision_one(request: Any, timeout: float = 30.0, *, root: Path) -> Any:
    """The supervisor's answers: a changeset's revision (project.revision.advance) and
    a passed verification (project.verification)."""
    from corral.actors.tools.base import ToolError
    from corral.actors.tools.source_fingerprint import fingerprint
    from corral.mailbox.protocol import ProjectRevisionAdvance, ProjectVerification, reply

    # The answers as they come off the wire: checked into the method's reply record.
    if isinstance(request, ProjectVerification):
        # A passed verification of this run on the current revision, of the tree as it
        # is now: the commit's path checks are what these tests are about (seed 004
        # V1.12 asks first).
        now = fingerprint(root, root.parent / "home").digest
        last = {"action_id": "act-0", "run_id": "r", "revision": 1, "fingerprint": now, "status": "passed",
                "commands": 1, "output": [], "created_at": 0.0}
        return reply(request, {"revision": 1, "verification": last, "passed_on_current": True,
                               "passed_by_run": True})
    if not isinstance(request, ProjectRevisionAdvance):
        raise ToolError(f"this tool context asks nothing else of the supervisor ({request.METHOD.value})")
    return reply(request, {"revision": 1})


def _ctx(root: Path) -> ToolContext:
    return ToolContext(agent_id="a", run_id="r", action_id="act-1", workspace=root, write_scopes=(".",),
                       home=root.parent / "home", ask=functools.partial(_revision_one, root=root))


def _tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under root with its bytes and mode, and every directory."""
    found: dict[str, tuple[bytes, int]] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(info.st_mode) else b"<dir>" if path.is_dir() else b"<other>"
        found[str(path.relative_to(root))] = (content, stat.S_IMODE(info.st_mode))
    return found


async def _refused(tool: Any, root: Path, tool_input: dict[str, Any], match: str | None = None) -> ToolError:
    # The context's supervisor answers a passed verification (``_revision_one``):
    # project.git_commit's path checks are what is refused here.
    ctx = _ctx(root)
    with pytest.raises(ToolError, match=match) as caught:
        await tool.run(ctx, tool_input)
    assert caught.value.code == "path-refused", caught.value
    return caught.value


@pytest.fixture
def ws(short_tmp: Path) -> Path:
    """A project with a repository, an executable hook and a secret."""
    root = short_tmp / "ws"
    (root / ".git" / "hooks").mkdir(parents=True)
    (root / ".git" / "config").write_bytes(GIT_CONFIG)
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.write_bytes(HOOK)
    hook.chmod(0o755)
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("print('hi')\n")
    return root


# -- case 1: no write through a predictable temporary name, or into another name ------------


async def test_a_hard_link_planted_at_the_old_temp_name_never_receives_the_write(ws: Path) -> None:
    """The attack of the issue: `.notes.md.corral-tmp` is a hard link to the hook; the
    write used to open it with O_TRUNC and write the payload into the hook."""
    hook = ws / ".git" / "hooks" / "pre-commit"
    os.link(hook, ws / "src" / ".notes.md.corral-tmp")
    await FsWrite().run(_ctx(ws), {"path": "src/notes.md", "content": PAYLOAD})
    assert hook.read_bytes() == HOOK and stat.S_IMODE(hook.stat().st_mode) == 0o755
    notes = ws / "src" / "notes.md"
    assert notes.read_text() == PAYLOAD
    assert notes.stat().st_ino != hook.stat().st_ino and notes.stat().st_nlink == 1
    assert not notes.stat().st_mode & 0o111, "no exec bit is carried into a written file"
    assert (ws / "src" / ".notes.md.corral-tmp").read_bytes() == HOOK, "the planted name was never opened"
    assert not [p for p in ws.rglob("*.corral-tmp") if p.name != ".notes.md.corral-tmp"], "no temp file is left"


async def test_a_write_to_a_file_with_another_name_is_refused_and_changes_nothing(ws: Path) -> None:
    os.link(ws / ".git" / "config", ws / "src" / "cfg.txt")
    os.link(ws / ".git" / "hooks" / "pre-commit", ws / "src" / "build.sh")
    before = _tree(ws)
    config_sha = hashlib.sha256(GIT_CONFIG).hexdigest()
    await _refused(FsWrite(), ws, {"path": "src/cfg.txt", "content": "[core]\n\tfsmonitor = id\n"}, "hard link")
    await _refused(FsPatch(), ws, {"path": "src/build.sh", "old_text": "own", "new_text": "evil",
                                   "expected_sha256": "0" * 64}, "hard link")
    await _refused(FsPatch(), ws, {"path": "src/cfg.txt", "old_text": "0", "new_text": "1",
                                   "expected_sha256": config_sha}, "hard link")
    # A changeset is all or nothing: the plain file beside the linked one is not written either.
    with pytest.raises(ToolError, match="hard link"):
        await Changeset().run(_ctx(ws), {"changes": [{"path": "src/ok.md", "content": "fine\n"},
                                                     {"path": "src/cfg.txt", "content": "[core]\n"}]})
    assert _tree(ws) == before


# -- case 2: a gitdir a `.git` file names -----------------------------------------------------


async def test_the_gitdir_a_dot_git_file_names_is_refused_by_path_and_by_inode(ws: Path) -> None:
    (ws / "wt").mkdir()
    (ws / "wt" / ".git").write_text("gitdir: ../wtdata\n")
    (ws / "wtdata" / "hooks").mkdir(parents=True)
    (ws / "wtdata" / "config").write_bytes(GIT_CONFIG)
    (ws / "mod").mkdir()
    (ws / "mod" / ".Git").write_text("gitdir: ../later\n")  # any spelling; a target not made yet
    (ws / "alias").symlink_to("wtdata")  # the same directory under another name
    before = _tree(ws)
    for path in ("wtdata/config", "wtdata/hooks/post-checkout", "alias/hooks/post-checkout", "later/config",
                 "later/hooks/pre-commit"):
        await _refused(FsWrite(), ws, {"path": path, "content": PAYLOAD}, r"git directory a \.git file names")
    with pytest.raises(ToolError, match=r"git directory a \.git file names"):
        await Changeset().run(_ctx(ws), {"changes": [{"path": "wtdata/hooks/post-checkout", "content": PAYLOAD}]})
    assert _tree(ws) == before
    # Plain files elsewhere are still written, also beside a pointer at the workspace
    # root, which is no repository (git refuses such a pointer).
    (ws / "other").mkdir()
    (ws / "other" / ".git").write_text("gitdir: ..\n")
    await FsWrite().run(_ctx(ws), {"path": "wt/notes.md", "content": "fine\n"})
    assert (ws / "wt" / "notes.md").read_text() == "fine\n"


# -- case 6: a bare repository shape ----------------------------------------------------------

EVIL_CONFIG = (
    "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = ..\n"
    '\tfsmonitor = "echo pwned > {marker}; false"\n'
)


def _git_status(directory: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """`git status` as the user's IDE would run it there (with no config of the user's)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CEILING_DIRECTORIES": str(directory.parent), "LC_ALL": "C"}
    return subprocess.run(["git", "status"], cwd=directory, env=env, capture_output=True, text=True, timeout=30,
                          check=False)


async def test_the_file_tools_cannot_plant_a_bare_repository(short_tmp: Path) -> None:
    """The attack of the issue, step by step through the tools; then real git in the
    directory: it is no repository, and the fsmonitor command never runs."""
    root = short_tmp / "ws"
    root.mkdir()
    marker = short_tmp / "pwned"
    evil = root / "tools" / "evil"
    await FsWrite().run(_ctx(root), {"path": "tools/evil/config", "content": EVIL_CONFIG.format(marker=marker)})
    await FsWrite().run(_ctx(root), {"path": "tools/evil/objects/info/x", "content": ""})
    await FsWrite().run(_ctx(root), {"path": "tools/evil/refs/heads/x", "content": ""})
    before = _tree(root)
    await _refused(FsWrite(), root, {"path": "tools/evil/HEAD", "content": "ref: refs/heads/main\n"}, "shape")
    await _refused(FsWrite(), root, {"path": "tools/evil/head", "content": "ref: refs/heads/main\n"}, "shape")
    assert _tree(root) == before
    status = _git_status(evil, short_tmp)
    assert status.returncode != 0 and "not a git repository" in status.stderr
    assert not marker.exists()


async def test_a_shape_made_elsewhere_is_never_written_into_or_completed(short_tmp: Path) -> None:
    root = short_tmp / "ws"
    for name in ("objects", "refs"):
        (root / "a" / name).mkdir(parents=True)
    (root / "b" / "objects").mkdir(parents=True)
    (root / "b" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "c" / "objects").mkdir(parents=True)
    (root / "c" / "refs").mkdir()
    (root / "c" / "HEAD").write_text("ref: refs/heads/main\n")
    before = _tree(root)
    await _refused(FsWrite(), root, {"path": "a/HEAD", "content": "ref: refs/heads/main\n"}, "shape")
    await _refused(FsWrite(), root, {"path": "b/refs/heads/main", "content": "0" * 40}, "shape")  # makes refs/
    await _refused(FsWrite(), root, {"path": "c/config", "content": "[core]\n\tfsmonitor = id\n"}, "shape")
    await _refused(FsWrite(), root, {"path": "c/hooks/post-checkout", "content": PAYLOAD}, "shape")
    # Reading a shape is harmless, and allowed.
    assert (await FsRead().run(_ctx(root), {"path": "c/HEAD"})).output["content"] == "ref: refs/heads/main\n"
    # One changeset that would make the whole shape at once is refused whole, and
    # leaves no directory behind.
    with pytest.raises(ToolError, match="shape of a git repository"):
        await Changeset().run(_ctx(root), {"changes": [
            {"path": "d/HEAD", "content": "ref: refs/heads/main\n"},
            {"path": "d/objects/info/x", "content": ""},
            {"path": "d/refs/heads/x", "content": ""},
            {"path": "d/hooks/post-checkout", "content": PAYLOAD}]})
    assert _tree(root) == before


@pytest.mark.parametrize("path", [".gitattributes", "src/.gitattributes", ".gitmodules", "vendor/.GitModules"])
async def test_driver_files_are_never_written_by_the_tools(ws: Path, path: str) -> None:
    (ws / ".gitattributes").write_text("*.md text\n")
    before = _tree(ws)
    await _refused(FsWrite(), ws, {"path": path, "content": "* diff=x filter=x\n"}, "names git drivers")
    with pytest.raises(ToolError, match="names git drivers"):
        await Changeset().run(_ctx(ws), {"changes": [{"path": path, "content": "* filter=x\n"}]})
    assert _tree(ws) == before
    assert (await FsRead().run(_ctx(ws), {"path": ".gitattributes"})).output["content"] == "*.md text\n"


def test_control_entries_are_named_for_the_sandbox_check(ws: Path) -> None:
    """The detector a check after a sandboxed command uses: every kind of control
    entry, by lstat, with a reason; a plain file none."""
    (ws / "wt").mkdir()
    (ws / "wt" / ".git").write_text("gitdir: ../wtdata\n")
    (ws / "wtdata").mkdir()
    (ws / "bare" / "objects").mkdir(parents=True)
    (ws / "bare" / "refs").mkdir()
    (ws / "bare" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "wtree").mkdir()
    (ws / "wtree" / "HEAD").write_text("ref: refs/heads/x\n")
    (ws / "wtree" / "commondir").write_text("../.git\n")
    os.link(ws / ".git" / "config", ws / "src" / "cfg.txt")
    (ws / "sub").mkdir()
    (ws / "sub" / ".gitattributes").write_text("* diff=x\n")
    scan = scan_controls(ws)
    expected = {
        ".git/config": "lies in .git", "sub/.GIT": "is a .git entry", "wt/.git": "is a .git entry",
        "wtdata": "a git directory a .git file names", "wtdata/config": "a git directory a .git file names",
        "bare": "shape of a git repository", "bare/config": "shape of a git repository",
        "wtree/config": "shape of a git repository", "src/cfg.txt": "hard link",
        "sub/.gitattributes": "names git drivers",
    }
    for relative, why in expected.items():
        reason = control_entry_reason(ws, PurePosixPath(relative), scan)
        assert reason is not None and why in reason, (relative, reason)
    for plain in ("src/main.py", "src", "notes/new.md"):
        assert control_entry_reason(ws, PurePosixPath(plain), scan) is None
    read_only, _, _ = sandbox_entries(ws)
    assert {str(p.relative_to(ws)) for p in read_only} == {".git", "wt/.git", "wtdata", "bare", "wtree",
                                                           "sub/.gitattributes"}


@needs_bwrap
def test_inside_bubblewrap_gitdir_targets_and_shapes_are_read_only(ws: Path) -> None:
    (ws / "wt").mkdir()
    (ws / "wt" / ".git").write_text("gitdir: ../wtdata\n")
    (ws / "wtdata").mkdir()
    (ws / "wtdata" / "config").write_bytes(GIT_CONFIG)
    for name in ("objects", "refs"):
        (ws / "bare" / name).mkdir(parents=True)
    (ws / "bare" / "HEAD").write_text("ref: refs/heads/main\n")
    before = _tree(ws)
    argv = build_bwrap_argv(SandboxProfile(project_root=ws), ["sh", "-c", "echo x >> wtdata/config;"
                            " echo x > bare/config; mkdir bare/hooks; echo ok > src/out.txt"], ws)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert "Read-only file system" in result.stderr
    assert (ws / "src" / "out.txt").read_text() == "ok\n"
    (ws / "src" / "out.txt").unlink()
    assert _tree(ws) == before


# -- case 8: a secret under another name -------------------------------------------------------

SECRET = "sk-live-hardlinked-9f8e7d6c5b4a3"


async def test_a_hard_link_to_a_secret_is_not_read_under_its_harmless_name(ws: Path) -> None:
    (ws / ".env").write_text(f"OPENAI_API_KEY={SECRET}\n")
    os.link(ws / ".env", ws / "src" / "innocent.txt")
    (ws / "credentials").mkdir()
    (ws / "credentials" / "aws").write_text(f"key={SECRET}\n")
    os.link(ws / "credentials" / "aws", ws / "notes.txt")
    listed = (await FsList().run(_ctx(ws), {"path": "src"})).output["entries"]
    assert "innocent.txt" in listed  # listing hides no plain name
    for path in ("src/innocent.txt", "notes.txt"):
        error = await _refused(FsRead(), ws, {"path": path}, "hard link.*secrets")
        assert SECRET not in str(error)
        await _refused(FsPatch(), ws, {"path": path, "old_text": "sk", "new_text": "x", "expected_sha256": "0" * 64})
    # A hard link between two plain files is read as usual.
    os.link(ws / "src" / "main.py", ws / "src" / "copy.py")
    assert (await FsRead().run(_ctx(ws), {"path": "src/copy.py"})).output["content"] == "print('hi')\n"



async def test_a_changeset_or_a_commit_never_answers_a_guess_about_a_linked_secret(ws: Path) -> None:
    """project.changeset compared the old content's sha256 with expected_sha256 and
    named it in its stale-content error; project.git_commit named it in not-reviewed
    (now it compares a snapshot fingerprint, read the same way).
    Through a hard link to `.env` that confirmed a guess of the secret (or told it
    outright). Now the old content is read like fs.read reads it: refused, whatever
    the guess, with nothing about the bytes."""
    from corral.actors.tools.project import GitCommit

    (ws / ".env").write_text(f"OPENAI_API_KEY={SECRET}\n")
    os.link(ws / ".env", ws / "src" / "innocent.txt")
    right = hashlib.sha256(f"OPENAI_API_KEY={SECRET}\n".encode()).hexdigest()
    wrong = hashlib.sha256(b"OPENAI_API_KEY=a-wrong-guess\n").hexdigest()
    before = _tree(ws)
    answers = []
    for guess in (right, wrong):
        change = {"path": "src/innocent.txt", "content": "x\n", "expected_sha256": guess}
        error = await _refused(Changeset(), ws, {"changes": [change]}, "hard link.*secrets")
        commit = await _refused(GitCommit(), ws, {"message": "m", "paths": ["src/innocent.txt"],
                                                  "expected_head": "0" * 40, "expected_snapshot_fingerprint": guess},
                                "hard link.*secrets")
        for message in (str(error), str(commit)):
            assert right not in message and SECRET not in message
        answers.append((str(error), str(commit)))
    assert answers[0] == answers[1], "the answer must not depend on the guess"
    assert _tree(ws) == before
    # A plain file is still checked against the expected content, as before.
    stale = {"path": "src/main.py", "content": "x\n", "expected_sha256": wrong}
    with pytest.raises(ToolError) as caught:
        await Changeset().run(_ctx(ws), {"changes": [stale]})
    assert caught.value.code == "stale-content"

# -- case 12: more secret files --------------------------------------------------------------

NEW_SECRETS = [".envrc", "svc/.envrc", ".git-credentials", "gcp/my-service-account.json",
               "deploy-service-account-prod.json", ".docker/config.json", "home/u/.DOCKER/config.json",
               ".npmrc", "pkg/.pypirc"]


@pytest.mark.parametrize("path", NEW_SECRETS)
async def test_new_secret_files_are_refused_and_masked(ws: Path, path: str) -> None:
    target = ws / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"token={SECRET}\n")
    before = _tree(ws)
    error = await _refused(FsRead(), ws, {"path": path}, "secrets")
    assert SECRET not in str(error)
    await _refused(FsWrite(), ws, {"path": path, "content": "x"}, "secrets")
    (ws / "link.txt").symlink_to(path)
    await _refused(FsRead(), ws, {"path": "link.txt"}, "secrets")
    (ws / "link.txt").unlink()
    assert _tree(ws) == before
    _, _, secrets = sandbox_entries(ws)
    assert target in secrets


async def test_a_docker_config_is_a_secret_by_its_path_not_by_its_name(short_tmp: Path) -> None:
    root = short_tmp / "ws"
    (root / "docker").mkdir(parents=True)
    (root / "docker" / "config.json").write_text('{"ok": true}\n')
    (root / ".docker").mkdir()
    (root / ".docker" / "daemon.json").write_text('{"ok": true}\n')
    for plain in ("docker/config.json", ".docker/daemon.json"):
        assert (await FsRead().run(_ctx(root), {"path": plain})).output["content"] == '{"ok": true}\n'
    # A workspace that is itself a .docker directory: the pattern reaches above the root.
    docker = short_tmp / ".docker"
    docker.mkdir()
    (docker / "config.json").write_text(f'{{"auths": {{"x": "{SECRET}"}}}}\n')
    await _refused(FsRead(), docker, {"path": "config.json"}, "secrets")


@needs_bwrap
def test_inside_bubblewrap_the_new_secret_files_read_empty(ws: Path) -> None:
    for path in (".envrc", ".docker/config.json", "ci/build-service-account.json", ".git-credentials"):
        (ws / path).parent.mkdir(parents=True, exist_ok=True)
        (ws / path).write_text(f"token={SECRET}\n")
    script = "cat .envrc .docker/config.json ci/build-service-account.json .git-credentials; cat src/main.py"
    argv = build_bwrap_argv(SandboxProfile(project_root=ws), ["sh", "-c", script], ws)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert "print('hi')" in result.stdout
    assert SECRET not in result.stdout + result.stderr


# -- end to end: a scripted agent against a running supervisor -------------------------------


def test_a_live_agent_cannot_reach_a_hook_a_gitdir_a_shape_or_a_linked_secret(short_tmp: Path) -> None:
    ws = short_tmp / "ws"
    (ws / ".git" / "hooks").mkdir(parents=True)
    hook = ws / ".git" / "hooks" / "pre-commit"
    hook.write_bytes(HOOK)
    hook.chmod(0o755)
    (ws / "src").mkdir()
    os.link(hook, ws / "src" / ".notes.md.corral-tmp")
    (ws / "wt").mkdir()
    (ws / "wt" / ".git").write_text("gitdir: ../wtdata\n")
    (ws / "wtdata").mkdir()
    for name in ("objects", "refs"):
        (ws / "tools" / "evil" / name).mkdir(parents=True)
    (ws / ".env").write_text(f"OPENAI_API_KEY={SECRET}\n")
    os.link(ws / ".env", ws / "src" / "innocent.txt")
    attempts = [
        ("fs.write", {"path": "src/notes.md", "content": PAYLOAD}),
        ("fs.write", {"path": "wtdata/hooks/post-checkout", "content": PAYLOAD}),
        ("fs.write", {"path": "tools/evil/HEAD", "content": "ref: refs/heads/main\n"}),
        ("fs.read", {"path": "src/innocent.txt"}),
        ("fs.write", {"path": ".envrc", "content": "export X=1\n"}),
    ]
    steps = "".join(
        f"[[agents.steps]]\nactions = [{{ tool = {json.dumps(tool)}, input = {_toml(args)} }}]\n"
        for tool, args in attempts
    ) + '[[agents.steps]]\nfinal = "tried"\n'
    with running(short_tmp / "h", agent_spec(steps=steps)) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="plant host code")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        phases = [(a["tool"], a["phase"]) for a in shown["actions"]]
        assert phases == [("fs.write", "ok")] + [(tool, "failed") for tool, _ in attempts[1:]], phases
        errors = [a["error"] for a in shown["actions"][1:]]
        assert "git directory a .git file names" in errors[0]
        assert "shape of a git repository" in errors[1]
        assert "hard link" in errors[2] and "secrets" in errors[2]
        assert "secrets" in errors[3]
        stored = json.dumps(ledger_rows(daemon.home, "SELECT * FROM actions"))
        assert SECRET not in stored
        daemon.shutdown()
    assert hook.read_bytes() == HOOK and stat.S_IMODE(hook.stat().st_mode) == 0o755
    assert (ws / "src" / "notes.md").read_text() == PAYLOAD
    assert not (ws / "wtdata" / "hooks").exists() and not (ws / "tools" / "evil" / "HEAD").exists()
    assert not (ws / ".envrc").exists()


def _toml(args: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{key} = {json.dumps(value)}" for key, value in args.items()) + " }"

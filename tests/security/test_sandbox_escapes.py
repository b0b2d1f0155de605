"""Issue 14, sandbox escapes: one deny list of control paths for the file tools and
the sandbox; the home never visible inside; secret files bound empty; /etc an allow
list. Real files, real bubblewrap, a real supervisor where the escape was end to end."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.fs import FsList, FsPatch, FsRead, FsWrite, _open_parent
from corral.sandbox.bwrap import SandboxProfile, build_bwrap_argv
from corral.sandbox.control_paths import CONTROL_NAMES, sandbox_entries
from tests.harness import ledger_rows, running, wait_run
from tests.launch_modes import needs_bwrap

GIT_CONFIG = "[core]\n\trepositoryformatversion = 0\n"


@pytest.fixture
def repo(short_tmp: Path) -> Path:
    root = short_tmp / "proj"
    for git_dir in (root / ".git", root / "vendor" / "lib" / ".git"):
        (git_dir / "hooks").mkdir(parents=True)
        (git_dir / "config").write_text(GIT_CONFIG)
    (root / "wt").mkdir()
    (root / "wt" / ".git").write_text("gitdir: ../.git/worktrees/wt\n")  # a worktree's .git is a file
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("print('hi')\n")
    return root


def _ctx(root: Path, home: Path | None = None) -> ToolContext:
    return ToolContext(
        agent_id="a",
        run_id="r",
        action_id="act-1",
        workspace=root,
        write_scopes=(".",),
        home=home or root.parent / "home",
    )


def _run_tool(tool: Any, ctx: ToolContext, tool_input: dict[str, Any]) -> Any:
    async def go() -> Any:
        return await tool.run(ctx, tool_input)

    return trio.run(go)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "path",
    [
        ".git/config",
        ".git/hooks/pre-commit",
        "vendor/lib/.git/config",
        "wt/.git",
        "src/../.git/config",
        ".git",
    ],
)
def test_file_tools_refuse_git_at_any_depth(repo: Path, path: str) -> None:
    before = _tree(repo)
    ctx = _ctx(repo)
    for tool, tool_input in (
        (FsWrite(), {"path": path, "content": "[core]\n\tfsmonitor = touch /tmp/pwned\n"}),
        (FsRead(), {"path": path}),
        (FsPatch(), {"path": path, "old_text": "a", "new_text": "b", "expected_sha256": "0" * 64}),
    ):
        with pytest.raises(ToolError) as caught:
            _run_tool(tool, ctx, tool_input)
        assert caught.value.code == "path-refused", (tool, path)
    assert _tree(repo) == before


def test_file_tools_refuse_git_through_symlinks(repo: Path) -> None:
    (repo / "innocent").symlink_to(".git")
    (repo / "hook.sh").symlink_to(".git/hooks/pre-commit")
    (repo / "src" / "deep").symlink_to("../vendor/lib/.git")
    before = _tree(repo)
    ctx = _ctx(repo)
    for path in ("innocent/config", "hook.sh", "src/deep/config", "innocent/hooks/post-checkout"):
        with pytest.raises(ToolError, match=r"control directory \.git"):
            _run_tool(FsWrite(), ctx, {"path": path, "content": "#!/bin/sh\ntouch /tmp/pwned\n"})
    assert _tree(repo) == before
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()


def test_a_write_never_follows_a_symlink_planted_in_its_parents(repo: Path) -> None:
    """The path check and the write are separate moments: the write walks the parent
    directories with O_NOFOLLOW, so a directory swapped for a symlink is refused."""
    (repo / "docs").symlink_to(".git")
    with pytest.raises(ToolError, match="not a plain directory"):
        os.close(_open_parent(repo, Path("docs"), "docs/config"))  # type: ignore[arg-type]
    assert (repo / ".git" / "config").read_text() == GIT_CONFIG


def test_an_ordinary_write_still_works_and_list_hides_control_entries(repo: Path) -> None:
    ctx = _ctx(repo)
    _run_tool(FsWrite(), ctx, {"path": "new/dir/file.txt", "content": "fine\n"})
    assert (repo / "new" / "dir" / "file.txt").read_text() == "fine\n"
    listed = _run_tool(FsList(), ctx, {"path": "."}).output["entries"]
    assert ".git/" not in listed and "src/" in listed and "new/" in listed
    assert not any(name.rstrip("/") in CONTROL_NAMES for name in listed)


def test_the_home_inside_the_workspace_is_a_control_path_for_file_tools(repo: Path) -> None:
    home = repo / "state"
    home.mkdir()
    (home / "endpoint.json").write_text('{"token": "secret-token"}')
    ctx = _ctx(repo, home=home)
    for tool, tool_input in (
        (FsRead(), {"path": "state/endpoint.json"}),
        (FsWrite(), {"path": "state/endpoint.json", "content": "{}"}),
        (FsList(), {"path": "state"}),
    ):
        with pytest.raises(ToolError, match="home directory"):
            _run_tool(tool, ctx, tool_input)
    assert "state/" not in _run_tool(FsList(), ctx, {"path": "."}).output["entries"]


def test_the_sandbox_walk_finds_control_entries_and_secrets_at_any_depth(repo: Path) -> None:
    (repo / ".env").write_text("API_TOKEN=x\n")
    (repo / "svc" / "conf").mkdir(parents=True)
    (repo / "svc" / "conf" / ".env.production").write_text("DB_PASSWORD=y\n")
    (repo / "svc" / "id_rsa").write_text("key\n")
    (repo / "svc" / "nested").mkdir()
    (repo / "svc" / "nested" / ".corral").mkdir()
    (repo / "alias.env").write_text("not a secret name\n")
    (repo / "svc" / ".env.local").symlink_to("../alias.env")  # masked at its target
    read_only, hidden, secrets = sandbox_entries(repo)
    rel = lambda paths: {str(p.relative_to(repo)) for p in paths}  # noqa: E731
    assert rel(read_only) == {".git", "vendor/lib/.git", "wt/.git"}
    assert rel(hidden) == {"svc/nested/.corral"}
    assert rel(secrets) == {".env", "svc/conf/.env.production", "svc/id_rsa", "alias.env"}


def _sandboxed(profile: SandboxProfile, script: str) -> subprocess.CompletedProcess[str]:
    argv = build_bwrap_argv(profile, ["sh", "-c", script], profile.project_root)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@needs_bwrap
def test_inside_bubblewrap_git_is_read_only_secrets_are_empty_and_the_home_is_gone(repo: Path) -> None:
    secret = "sk-live-DO-NOT-LEAK-4f9a8b7c6d5e"
    (repo / ".env").write_text(f"OPENAI_API_KEY={secret}\n")
    (repo / "vendor" / ".env.local").write_text(f"TOKEN={secret}\n")
    home = repo / "state"
    home.mkdir()
    (home / "endpoint.json").write_text(json.dumps({"token": secret}))
    profile = SandboxProfile(project_root=repo, masked=(home,))
    result = _sandboxed(
        profile,
        "cat .env | base64; rev .env; cat vendor/.env.local; ls state; cat state/endpoint.json;"
        " echo x >> vendor/lib/.git/config; echo x >> .git/config; echo x >> wt/.git;"
        " echo ok > src/written.txt; cat src/main.py",
    )
    everything = result.stdout + result.stderr
    for form in (secret, base64.b64encode(secret.encode()).decode()[:20], secret[::-1]):
        assert form not in everything
    assert "print('hi')" in result.stdout  # the project itself is there
    assert (repo / "src" / "written.txt").read_text() == "ok\n"  # and writable
    assert (repo / ".git" / "config").read_text() == GIT_CONFIG
    assert (repo / "vendor" / "lib" / ".git" / "config").read_text() == GIT_CONFIG
    assert (repo / "wt" / ".git").read_text() == "gitdir: ../.git/worktrees/wt\n"
    assert (home / "endpoint.json").read_text() == json.dumps({"token": secret})  # untouched on the host


@needs_bwrap
def test_inside_bubblewrap_the_agent_context_directories_are_read_only(repo: Path) -> None:
    """Seed 004 V1.11: ".git / .agents / .codex / .hermes 存在时按原路径只读挂载" and the gate
    ".git / .agent / .agents / .codex / .hermes 写入失败": corral reads project skills from
    .codex/skills and .agents/skills as start-up context (actors/repo_skills.py), so a
    command that could write there would plant instructions for the next run. A
    root-level link (.hermes -> tools/hermes) is protected at its target."""
    skill = "---\nname: build\ndescription: Build it\n---\nRun make.\n"
    for name in (".codex", ".agents"):
        (repo / name / "skills" / "build").mkdir(parents=True)
        (repo / name / "skills" / "build" / "SKILL.md").write_text(skill)
    (repo / "tools" / "hermes").mkdir(parents=True)
    (repo / "tools" / "hermes" / "config.yaml").write_text("model: x\n")
    (repo / ".hermes").symlink_to("tools/hermes")
    before = _tree(repo)
    result = _sandboxed(
        SandboxProfile(project_root=repo),
        "mkdir -p .codex/skills/evil && echo planted > .codex/skills/evil/SKILL.md;"
        " echo planted >> .codex/skills/build/SKILL.md; echo planted > .agents/skills/x;"
        " rm -f .agents/skills/build/SKILL.md; echo planted >> .hermes/config.yaml;"
        " echo planted > tools/hermes/new.txt; echo ok > src/written.txt; echo finished",
    )
    assert "finished" in result.stdout, result.stderr  # the script ran to its end, sandboxed
    assert (repo / "src" / "written.txt").read_text() == "ok\n"  # the project itself is writable
    after = _tree(repo)
    after.pop("src/written.txt")
    assert after == before, "nothing under .codex, .agents or .hermes changed"


@needs_bwrap
def test_inside_bubblewrap_no_user_namespace_can_be_made(repo: Path) -> None:
    """Seed 004 V1.11: "禁用嵌套 user namespace": inside, a user namespace of its own
    would hand the command every capability again (mounts over the read-only binds)."""
    unshare = subprocess.run(["sh", "-c", "command -v unshare"], capture_output=True, text=True, check=False)
    if unshare.returncode != 0:
        pytest.skip("no unshare(1) on this host to try with")
    result = _sandboxed(
        SandboxProfile(project_root=repo),
        "unshare -U true; echo user=$?; unshare -Un true; echo usernet=$?; echo alive",
    )
    assert "alive" in result.stdout, result.stderr
    assert "user=0" not in result.stdout and "usernet=0" not in result.stdout, result.stdout
    assert "user=" in result.stdout and "usernet=" in result.stdout


@needs_bwrap
def test_etc_is_an_allow_list(repo: Path) -> None:
    profile = SandboxProfile(project_root=repo)
    probes = ["/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/ssh"]
    result = _sandboxed(profile, "; ".join(f"test -e {p} && echo PRESENT {p}" for p in probes) + "; cat /etc/passwd")
    assert "PRESENT" not in result.stdout, result.stdout
    assert "root:" in result.stdout  # what programs need is still there
    resolv = _sandboxed(profile, "test -e /etc/hosts && echo hosts-ok")
    assert "hosts-ok" in resolv.stdout


SPEC = """
[project]
root = "."
[sandbox]
mode = "required"
[[agents]]
id = "writer"
[[agents.steps]]
actions = [{{ tool = "command.exec", input = {{ program = "sh", args = ["-c", {script}] }} }}]
[[agents.steps]]
final = "done"
"""


@needs_bwrap
def test_a_sandboxed_command_cannot_take_the_token_from_a_home_inside_the_project(short_tmp: Path) -> None:
    """The escape of the issue, end to end: the home in the project (now only as its
    control directory <project>/.corral: `corral up` refuses any other place in it,
    issue 32); the command reads endpoint.json, .env in disguise, and tries .git/config."""
    ws = short_tmp / "ws"
    ws.mkdir()
    secret = "ghp_" + "S3cr3tT0k3nV4lu3" * 3
    (ws / ".env").write_text(f"GITHUB_TOKEN={secret}\n")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    config_before = (ws / ".git" / "config").read_text()
    # The redactor would hide the token in output; what matters is that the script
    # itself cannot read it (the attack used it inside the sandbox).
    script = (
        "test -e .corral/endpoint.json && echo ENDPOINT-VISIBLE; test -s .env && echo ENV-HAS-DATA;"
        " cat .env | base64; rev .env;"
        # The path spelled so that the handoff sees none (an attacker's way): the sandbox is what is tried.
        " printf '[core]\\n\\tfsmonitor = touch '$(printf %s /)'tmp/corral-pwned\\n' >> .git/config; echo done"
    )
    home = ws / ".corral"
    with running(home, SPEC.format(script=json.dumps(script))) as daemon:
        token = daemon.endpoint.token
        run_id = daemon.call("run", agent_id="writer", task="try to escape")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        rows = ledger_rows(daemon.home, "SELECT result FROM actions WHERE tool = 'command.exec'")
        output = json.dumps(rows)
        assert "done" in output  # the command ran, sandboxed
        assert "ENDPOINT-VISIBLE" not in output and "ENV-HAS-DATA" not in output
        assert token not in output
        daemon.shutdown()
    assert (ws / ".git" / "config").read_text() == config_before
    persisted = b"".join(p.read_bytes() for p in home.rglob("*") if p.is_file())
    for form in (secret, base64.b64encode(f"GITHUB_TOKEN={secret}\n".encode()).decode()[:24], secret[::-1]):
        assert form.encode() not in persisted


# -- closed after the first pass: case, hard links, TLS private keys ---------------------


@pytest.mark.parametrize("path", [".GIT/config", "vendor/lib/.Git/hooks/pre-commit", ".Corral/x", ".ENV"])
def test_control_and_secret_names_are_refused_in_any_case(repo: Path, path: str) -> None:
    # On a case-insensitive file system `.GIT/config` is `.git/config`.
    before = _tree(repo)
    with pytest.raises(ToolError) as err:
        _run_tool(FsWrite(), _ctx(repo), {"path": path, "content": "[core]\n\tfsmonitor = touch /tmp/x\n"})
    assert err.value.code == "path-refused"
    assert _tree(repo) == before


def test_a_hard_link_to_a_secret_is_masked_under_its_other_name(repo: Path) -> None:
    (repo / ".env").write_text("GREETING=plain\n")
    os.link(repo / ".env", repo / "src" / "innocent.txt")
    (repo / "src" / "other.txt").write_text("GREETING=plain\n")  # same bytes, not the same file
    _, _, secrets = sandbox_entries(repo)
    assert {str(p.relative_to(repo)) for p in secrets} == {".env", "src/innocent.txt"}


@needs_bwrap
def test_inside_bubblewrap_a_hard_linked_secret_reads_empty(repo: Path) -> None:
    value = "zq8Vx7731hardlinkmarker"
    (repo / ".env").write_text(f"GREETING={value}\n")
    os.link(repo / ".env", repo / "src" / "innocent.txt")
    script = "xxd -p src/innocent.txt; od -c src/innocent.txt; cat src/main.py"
    result = _sandboxed(SandboxProfile(project_root=repo), script)
    assert "print('hi')" in result.stdout
    everything = result.stdout + result.stderr
    assert value not in everything and value.encode().hex() not in everything.replace("\n", "")
    assert (repo / "src" / "innocent.txt").read_text() == f"GREETING={value}\n"  # the host file is untouched


def test_tls_private_keys_stay_out_of_the_etc_allow_list(repo: Path) -> None:
    argv = build_bwrap_argv(SandboxProfile(project_root=repo), ["true"], repo)
    assert "/etc/environment" not in argv  # may hold proxy credentials
    if Path("/etc/ssl/private").is_dir():
        ssl = argv.index("/etc/ssl")
        emptied = next(i for i, a in enumerate(argv) if a == "--tmpfs" and argv[i + 1] == "/etc/ssl/private")
        assert emptied > ssl  # after the bind of /etc/ssl, or it would be covered by it


@needs_bwrap
def test_a_git_directory_behind_a_symlink_is_read_only_too(repo: Path) -> None:
    (repo / "gitdata").mkdir()
    (repo / "gitdata" / "config").write_text(GIT_CONFIG)
    (repo / "sub").mkdir()
    (repo / "sub" / ".git").symlink_to("../gitdata")
    result = _sandboxed(SandboxProfile(project_root=repo), "echo x >> sub/.git/config; echo x >> gitdata/config")
    assert "Read-only file system" in result.stderr
    assert (repo / "gitdata" / "config").read_text() == GIT_CONFIG

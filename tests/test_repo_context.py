"""The repository context and its fingerprint (seed 004 V1.1 §1, V1.24, V1.25):
a bounded, deterministic summary; skills from two roots; AGENTS.md scoped to the
path an action touches; and an action planned on an older context is blocked
before anything runs, while the next plan is made with the new text."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from corral.actors.project_context import ContextCache, LiveContext, build, changes, load
from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.project_index import ProjectIndex
from tests.harness import agent_spec, ledger_rows, running, wait_run


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _skill(ws: Path, root: str, directory: str, name: str, description: str = "Cut a release") -> None:
    (ws / root / directory).mkdir(parents=True, exist_ok=True)
    text = f"---\nname: {name}\ndescription: {description}\n---\nBODY-{root}\n"
    (ws / root / directory / "SKILL.md").write_text(text)


def _repository(root: Path) -> Path:
    ws = root / "ws"
    (ws / "game" / "alpha").mkdir(parents=True)
    (ws / "game" / "beta").mkdir(parents=True)
    (ws / "AGENTS.md").write_text("ROOT-RULE\n")
    (ws / "game" / "AGENTS.md").write_text("GAME-RULE\n")
    (ws / "game" / "alpha" / "AGENTS.md").write_text("ALPHA-RULE\n")
    (ws / "game" / "beta" / "AGENTS.md").write_text("BETA-RULE\n")
    (ws / "README.md").write_text("x" * 50_000)  # past the per-document budget: cut, marked
    (ws / "pyproject.toml").write_text('[project]\nname = "demo"\n[project.scripts]\nserve = "demo:serve"\n'
                                       'check = "demo:check"\n')
    (ws / "package.json").write_text(json.dumps({"name": "web", "scripts": {"build": "vite build", "test": "x"}}))
    (ws / "main.py").write_text("print('hi')\n")
    (ws / ".env").write_text("TOKEN=1\n")
    (ws / "id_rsa").write_text("KEY\n")
    (ws / ".git").mkdir()
    (ws / ".git" / "AGENTS.md").write_text("PLANTED\n")
    (ws / "home").mkdir()
    (ws / "home" / "AGENTS.md").write_text("HOME-FILE\n")
    _skill(ws, ".codex/skills", "release", "release", "From codex")
    _skill(ws, ".agents/skills", "release", "release", "From agents")
    _skill(ws, ".agents/skills", "lint", "lint", "Run the linters")
    _skill(ws, ".agents/skills", "deploy", "shipit")  # the front matter names another skill
    _skill(ws, ".agents/skills", "Bad_Name", "Bad_Name")
    _skill(ws, ".agents/skills", "huge", "huge", "x" * (130 * 1024))
    (ws / ".agents" / "skills" / "linked").symlink_to(ws / ".codex" / "skills" / "release")
    return ws


def test_the_summary_is_deterministic_bounded_and_skips_secrets_git_and_home(tmp_path: Path) -> None:
    ws = _repository(tmp_path)
    first, again = load(ws, ws / "home"), load(ws, ws / "home")
    assert first.summary() == again.summary() and first.fingerprint == again.fingerprint
    summary = first.summary()
    layout = summary["layout"]
    assert ".env" not in layout["top"] and "id_rsa" not in layout["top"] and ".git/" not in layout["top"]
    assert "home/" not in layout["top"], "corral's home is never walked"
    assert [d["path"] for d in summary["documents"]] == [
        "AGENTS.md", "game/AGENTS.md", "game/alpha/AGENTS.md", "game/beta/AGENTS.md", "README.md"]
    readme = summary["documents"][-1]
    assert readme["kind"] == "reference" and readme["truncated"] and readme["sha256"] == _sha("x" * 50_000)
    assert len(summary["texts"]["README.md"]) == 24 * 1024
    scripts = {m["path"]: m["scripts"] for m in layout["manifests"]}
    assert scripts == {"package.json": ["build", "test"], "pyproject.toml": ["check", "serve"]}
    assert layout["entry_candidates"] == ["main.py"] and layout["git"] == {"repository": False}
    # Skills: .codex wins; a name that is not its directory's, or breaks the rule, is skipped with its reason.
    assert [(s["name"], s["root"], s["description"]) for s in summary["skills"]] == [
        ("lint", ".agents/skills", "Run the linters"), ("release", ".codex/skills", "From codex")]
    reasons = {s["path"]: s["reason"] for s in summary["skills_skipped"]}
    assert "shadowed by .codex/skills/release/SKILL.md" in reasons[".agents/skills/release/SKILL.md"]
    assert "is not the directory's 'deploy'" in reasons[".agents/skills/deploy/SKILL.md"]
    assert "lower-case" in reasons[".agents/skills/Bad_Name/SKILL.md"]
    assert "larger than 128 KiB" in reasons[".agents/skills/huge/SKILL.md"]
    assert "symlink" in reasons[".agents/skills/linked/SKILL.md"]
    prompt = first.prompt()
    assert "SCOPED REPOSITORY INSTRUCTIONS" in prompt and "UNTRUSTED REPOSITORY REFERENCE" in prompt
    assert "never grant a permission" in prompt and "scope 'game/alpha'" in prompt
    assert "BODY-" not in prompt and "PLANTED" not in prompt and "HOME-FILE" not in prompt and "TOKEN" not in prompt
    assert len(prompt) <= 20 * 1024 + 100 and "[... cut]" in prompt


def test_only_the_ancestor_chain_applies_and_any_change_moves_the_fingerprint(tmp_path: Path) -> None:
    ws = _repository(tmp_path)
    context = build(ws, ws / "home", with_layout=False)[0]
    assert [d.scope for d in context.applicable("game/alpha/level.txt")] == [".", "game", "game/alpha"]
    assert [d.scope for d in context.applicable("docs/x.md")] == ["."]
    cache = ContextCache(ws, ws / "home")
    before = cache.current()
    assert cache.current() is before, "nothing changed: no rebuild"
    (ws / "game" / "beta" / "AGENTS.md").write_text("BETA-RULE, now longer\n")
    after = cache.current()
    assert after.fingerprint != before.fingerprint
    assert changes(before.sources(), after.sources()) == [
        f"AGENTS.md at game/beta/AGENTS.md changed sha256 {_sha('BETA-RULE' + chr(10))[:12]}→"
        f"{_sha('BETA-RULE, now longer' + chr(10))[:12]}"]
    (ws / "src").mkdir()
    (ws / "src" / "new.py").write_text("x = 1\n")  # a write of the agent's own: no drift
    assert cache.current().fingerprint == after.fingerprint
    _skill(ws, ".codex/skills", "lint", "lint", "Overrides")
    assert cache.current().fingerprint != after.fingerprint, "a skill's priority moves it too"


async def test_project_index_refreshes_with_a_safe_git_summary_and_the_rules_of_a_path(tmp_path: Path) -> None:
    ws = _repository(tmp_path)
    (ws / ".git" / "AGENTS.md").unlink()
    (ws / ".git").rmdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "trunk"], cwd=ws, check=True)
    subprocess.run([*git, "add", "AGENTS.md", "main.py"], cwd=ws, check=True)
    subprocess.run([*git, "commit", "-qm", "m"], cwd=ws, check=True)
    (ws / "main.py").write_text("print('changed')\n")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ws, check=True, capture_output=True, text=True).stdout
    ctx = ToolContext(agent_id="a", run_id="run-1", action_id="act-1", workspace=ws, write_scopes=(".",),
                      home=ws / "home")
    result = await ProjectIndex().run(ctx, {"path": "game/beta/x.txt"})
    git_summary = result.output["summary"]["layout"]["git"]
    assert git_summary["branch"] == "trunk" and git_summary["head"] == head[:12] and git_summary["changed"] == 1
    assert result.output["fingerprint"] == load(ws, ws / "home").fingerprint
    assert [(d["scope"], d["text"]) for d in result.output["applicable"]] == [
        (".", "ROOT-RULE\n"), ("game", "GAME-RULE\n"), ("game/beta", "BETA-RULE\n")], "no sibling's rule"
    with pytest.raises(ToolError, match="relative path"):
        await ProjectIndex().run(ctx, {"path": "../outside"})


def test_a_provider_may_leave_the_layout_out_and_an_empty_workspace_says_nothing(tmp_path: Path) -> None:
    """The local provider's small model followed the tree instead of the task: it
    gets the instructions without the summary. An empty workspace has no block."""
    (tmp_path / "empty").mkdir()
    assert LiveContext(tmp_path / "empty").prompt() == ""
    work = tmp_path / "work"
    (work / "research").mkdir(parents=True)
    (work / "research" / "survey.md").write_text("x")
    (work / "AGENTS.md").write_text("Keep notes short.\n")
    full, brief = LiveContext(work).prompt(), LiveContext(work, with_layout=False).prompt()
    assert "REPOSITORY SUMMARY" in full and "research/" in full
    assert "Keep notes short." in brief and "REPOSITORY SUMMARY" not in brief and "research/" not in brief


def test_an_agents_md_edited_between_plan_and_execution_blocks_the_action(short_tmp: Path) -> None:
    ws = short_tmp / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("OLD RULE\n")
    new_rule = "NEW RULE: every file ends with a newline\n"
    fresh = "planned under NEW RULE"
    patch = f'{{ path = "fresh.txt", old_text = "NEW", new_text = "STALE", expected_sha256 = "{_sha(fresh)}" }}'
    # Run 1: the plan's first action edits the instructions (as a person or another
    # agent could, between plan and execution); its second was planned under the old
    # ones. Run 2: an action waiting for approval while the instructions change.
    steps = f"""
[[agents.steps]]
when_task = "write"
actions = [{{ tool = "fs.write", input = {{ path = "AGENTS.md", content = "{new_rule.strip()}\\n" }} }},
           {{ tool = "fs.write", input = {{ path = "stale.txt", content = "planned under OLD RULE" }} }}]
[[agents.steps]]
when_task = "write"
actions = [{{ tool = "fs.write", input = {{ path = "fresh.txt", content = "{fresh}" }} }}]
[[agents.steps]]
when_task = "write"
final = "done"
[[agents.steps]]
when_task = "patch"
actions = [{{ tool = "fs.patch", input = {patch} }}]
[[agents.steps]]
when_task = "patch"
final = "not patched"
"""
    policy = '[agents.policy]\n"fs.patch" = "confirm"'
    spec = agent_spec(workspace=str(ws), steps=steps, extra='[policy]\n"fs.*" = "auto"', policy=policy)
    with running(short_tmp / "h", spec) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="write")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        rows = ledger_rows(daemon.home, "SELECT loop_index, plan FROM plans WHERE run_id = ? ORDER BY loop_index",
                           run_id)
        waiting_id = daemon.call("run", agent_id="writer", task="patch")["run_id"]
        waiting = wait_run(daemon, waiting_id, {"waiting-confirmation", "completed", "failed"})
        assert waiting["run"]["status"] == "waiting-confirmation"
        (ws / "AGENTS.md").write_text("NEWER RULE, written while a person decides\n")
        daemon.call("continue_action", action_id=waiting["actions"][0]["action_id"], decision="approve")
        waiting = wait_run(daemon, waiting_id, {"completed", "failed"})
    assert not (ws / "stale.txt").exists(), "the stale action never ran"
    assert (ws / "fresh.txt").read_text() == fresh, "the approved but stale patch never ran"
    phases = [(a["loop_index"], a["action_index"], a["phase"], a["attempts"]) for a in shown["actions"]]
    assert phases == [(0, 0, "ok", 1), (0, 1, "denied", 0), (1, 0, "ok", 1)], "the stale write never executed"
    reason = shown["actions"][1]["reason"]
    assert f"AGENTS.md at AGENTS.md changed sha256 {_sha('OLD RULE' + chr(10))[:12]}→{_sha(new_rule)[:12]}" in reason
    stamps = [json.loads(row["plan"])["context"]["sources"]["AGENTS.md at AGENTS.md"] for row in rows[:2]]
    assert stamps == [_sha("OLD RULE\n")[:16], _sha(new_rule)[:16]], "the next plan was made with the new text"
    patched = waiting["actions"][0]
    assert (patched["phase"], patched["attempts"]) == ("failed", 0) and "stale:" in patched["reason"]


def test_every_document_shows_its_whole_sha256_and_both_boundaries_repeat_its_path_and_scope(tmp_path: Path) -> None:
    """"列出每份文档的 scope、SHA-256 和截断状态，并在正文边界重复 path/scope": the whole
    SHA-256 (not a prefix), and the end line of a reference as of an instruction."""
    work = tmp_path / "work"
    (work / "game").mkdir(parents=True)
    texts = {"AGENTS.md": "Keep notes short.\n", "game/AGENTS.md": "Game rule.\n", "README.md": "About.\n"}
    for path, text in texts.items():
        (work / path).write_text(text)
    prompt = LiveContext(work, with_layout=False).prompt()
    for path, scope in (("AGENTS.md", "."), ("game/AGENTS.md", "game"), ("README.md", ".")):
        assert f"=== begin {path} (scope {scope!r}, sha256 {_sha(texts[path])}, complete) ===" in prompt, prompt
        assert f"=== end {path} (scope {scope!r}) ===" in prompt, prompt


def test_a_documents_body_reaches_the_prompt_with_no_absolute_path_of_this_machine(tmp_path: Path) -> None:
    """"正文继续执行凭据和绝对路径清洗": not only the workspace's own root and the home
    (the strict re-audit saw ``/etc/app/secret.conf`` reach the prompt as written)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "AGENTS.md").write_text(
        "Read /home/alice/.config/app.toml and /etc/app/secret.conf, then C:\\Users\\bob\\notes;\n"
        f"edit {work}/src/x.py and docs/guide.md; see https://example.com/a/b.\n"
    )
    (work / "README.md").write_text("Logs go to /var/log/app/run.log.\n")
    prompt = LiveContext(work, with_layout=False).prompt()
    for leaked in ("/home/alice", "/etc/app", "C:\\Users", str(work), "/var/log"):
        assert leaked not in prompt, prompt
    assert "<absolute-path>" in prompt and "src/x.py" in prompt and "docs/guide.md" in prompt, prompt
    assert "https://example.com/a/b" in prompt, prompt

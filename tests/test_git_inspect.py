"""``project.git_inspect`` (seed 004 V1.4 ``git.inspect``): one read-only review of the
working tree, its status and a bounded diff, with the seed's inputs and defaults
(``includeDiff``/``maxFiles``/``maxChars`` as corral's snake_case ``include_diff``/
``max_files``/``max_chars``), an explicit ``truncated``, and no result from a tree that
moved while it was read. Real git, real files."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.git_inspect import FAILPOINT as INSPECT_FAILPOINT
from corral.actors.tools.project import GitInspect
from corral.core import failpoints
from corral.supervisor.intent.intent_classify import CORRAL_TAGS, READ
from corral.supervisor.longtask import compaction

pytestmark = pytest.mark.usefixtures("private_tempdir")


async def _no_supervisor(request: Any, timeout: float = 30.0) -> Any:
    raise AssertionError(f"a read-only git review asks the supervisor nothing ({request!r})")


def _ctx(ws: Path) -> ToolContext:
    return ToolContext(
        agent_id="writer",
        run_id="run-test00",
        action_id="act-1",
        workspace=ws,
        write_scopes=(".",),
        home=ws.parent / "home",
        ask=_no_supervisor,
    )


def _git(ws: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=ws, check=True, capture_output=True, text=True
    ).stdout


def _repo(tmp: Path, tracked: int = 1) -> Path:
    ws = tmp / "ws"
    (ws / "game").mkdir(parents=True)
    for n in range(tracked):
        (ws / "game" / f"f{n:02}.txt").write_text(f"line {n}\n")
    (ws / "game" / "index.html").write_text("<p>old</p>\n")
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "add", ".")
    _git(ws, "commit", "-q", "-m", "start")
    return ws


async def test_one_review_lists_the_safe_changes_and_diffs_tracked_ones_never_secrets(tmp_path: Path) -> None:
    """The seed: "status 使用 NUL 分隔格式解析，返回 HEAD / branch、staged / unstaged / untracked 的安全相对
    路径 … .env* … 数据库 … 不得出现在返回值或 diff 中", "includeDiff=true 分别对安全 staged 和
    unstaged tracked 路径生成内容 diff；untracked 只列路径，不读正文"."""
    ws = _repo(tmp_path, tracked=2)
    (ws / "game" / "index.html").write_text("<p>new</p>\n")
    (ws / "game" / "f00.txt").write_text("staged change\n")
    _git(ws, "add", "game/f00.txt")
    (ws / "game" / "e2e-patchset.txt").write_text("UNTRACKED-BODY\n")
    (ws / ".env").write_text("TOKEN=SECRET-ENV-VALUE\n")
    (ws / "data.sqlite").write_text("SECRET-DB\n")
    (ws / ".corral").mkdir()
    (ws / ".corral" / "private.json").write_text("SECRET-CONTROL\n")
    # "依赖、构建和缓存目录不得出现在返回值或 diff 中" (a strict re-audit found them listed).
    for generated in ("node_modules/x/i.js", ".venv/lib/a", "__pycache__/m.pyc", "build/o.o", "dist/o.js",
                      "game/.pytest_cache/v"):
        (ws / generated).parent.mkdir(parents=True, exist_ok=True)
        (ws / generated).write_text("GENERATED\n")
    out = (await GitInspect().run(_ctx(ws), {})).output
    assert out["head"] == _git(ws, "rev-parse", "HEAD").strip() and out["branch"] == "main"
    assert out["staged"] == ["game/f00.txt"] and out["unstaged"] == ["game/index.html"]
    assert out["untracked"] == ["game/e2e-patchset.txt"]
    assert "+staged change" in out["diff"]["staged"] and "+<p>new</p>" in out["diff"]["unstaged"]
    assert out["diff_files"] == ["game/f00.txt", "game/index.html"] and out["truncated"] is False
    assert (out["max_files"], out["max_chars"]) == (20, 24_000), "the seed's defaults"
    shown = repr(out)
    for secret in ("UNTRACKED-BODY", ".env", "SECRET", "sqlite", ".corral"):
        assert secret not in shown
    plain = (await GitInspect().run(_ctx(ws), {"include_diff": False})).output
    assert "diff" not in plain and plain["unstaged"] == ["game/index.html"]
    assert CORRAL_TAGS["project.git_inspect"] == READ and GitInspect.schema.read_only is True


async def test_secret_named_files_other_vcs_dirs_and_non_regular_paths_are_never_listed_nor_diffed(
    tmp_path: Path,
) -> None:
    """The seed: "所有路径必须通过可移植路径、项目边界、普通文件和敏感路径校验；.agent、VCS 控制面、.env*、密钥、
    凭据、数据库、dump … 不得出现在返回值或 diff 中". A strict re-audit found ``secrets.yaml`` listed, and no
    regular-file check: a symlink (to a host path) or a fifo is no file of the project to review."""
    ws = _repo(tmp_path)
    (ws / "game" / "index.html").write_text("<p>new</p>\n")
    for name in ("secrets.yaml", "config/client_secret.json", "config/api_key.txt", "passwords.txt",
                 "deploy/credentials.yml", "secrets/prod.txt", "backups/db-dump.sql", "keys/release.jks",
                 ".hg/store/data", ".svn/entries"):
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text("SECRET-VALUE\n")
    (ws / "game" / "tokenizer.py").write_text("# a module, not a secret\n")
    for unportable in ("game/tab\tname.txt", "game/aux.txt", "game/trailing.", "game/a:b.txt", "game/back\\slash"):
        (ws / unportable).write_text("NOT-PORTABLE\n")
    outside = tmp_path / "host-file.txt"
    outside.write_text("HOST-BYTES\n")
    (ws / "game" / "link.txt").symlink_to(outside)
    (ws / "linked-dir").symlink_to(ws / "game")
    os.mkfifo(ws / "game" / "pipe")
    # A tracked file turned into a symlink: its diff would print the host path it names.
    (ws / "game" / "tracked-link.txt").write_text("plain\n")
    _git(ws, "add", "game/tracked-link.txt")
    _git(ws, "commit", "-q", "-m", "more")
    (ws / "game" / "tracked-link.txt").unlink()
    (ws / "game" / "tracked-link.txt").symlink_to(outside)
    out = (await GitInspect().run(_ctx(ws), {})).output
    assert out["unstaged"] == ["game/index.html"], out
    assert out["untracked"] == ["game/tokenizer.py"], out
    assert out["diff_files"] == ["game/index.html"], out
    shown = repr(out)
    for hidden in ("secret", "SECRET", "api_key", "password", "credential", "dump", ".jks", ".hg", ".svn", "link",
                   "pipe", "HOST", "PORTABLE", "aux", "trailing", "a:b", "slash", str(tmp_path)):
        assert hidden not in shown, hidden


async def test_past_max_files_or_max_chars_the_review_says_truncated(tmp_path: Path) -> None:
    """The seed: "默认 20 个文件、24,000 字符，公开上限固定为 50 个文件和 24,000 字符；超出上限必须显式返回
    truncated=true"."""
    ws = _repo(tmp_path, tracked=25)
    for n in range(25):
        (ws / "game" / f"f{n:02}.txt").write_text(f"changed {n}\n")
    out = (await GitInspect().run(_ctx(ws), {})).output
    assert len(out["diff_files"]) == 20 and out["truncated"] is True, "20 files by default"
    assert len(out["unstaged"]) == 25, "the status still lists every safe change"
    assert "changed 19" in out["diff"]["unstaged"] and "changed 20" not in out["diff"]["unstaged"]
    three = (await GitInspect().run(_ctx(ws), {"max_files": 3})).output
    assert three["diff_files"] == ["game/f00.txt", "game/f01.txt", "game/f02.txt"] and three["truncated"]
    short = (await GitInspect().run(_ctx(ws), {"max_files": 50, "max_chars": 100})).output
    assert len(short["diff"]["staged"]) + len(short["diff"]["unstaged"]) <= 100 and short["truncated"] is True
    whole = (await GitInspect().run(_ctx(ws), {"max_files": 50})).output
    assert len(whole["diff_files"]) == 25 and whole["truncated"] is False
    for bad in (
        {"max_files": 51},
        {"max_files": 0},
        {"max_chars": 24_001},
        {"max_chars": 0},
        {"max_files": True},
        {"include_diff": "yes"},
    ):
        with pytest.raises(ToolError, match="must be") as refused:
            await GitInspect().run(_ctx(ws), bad)
        assert refused.value.code == "bad-input"


async def _review_held_while(ws: Path, marks: Path, monkeypatch: pytest.MonkeyPatch,
                             meanwhile: Callable[[], None]) -> ToolError:
    """Run a review held after its status and diff (failpoint ``INSPECT_FAILPOINT``),
    do ``meanwhile`` to the tree while it waits, release it, and return how it failed."""
    marks.mkdir()
    monkeypatch.setenv(failpoints.MARKER_DIR_ENV, str(marks))
    failpoints.configure(f"{INSPECT_FAILPOINT}=block@once")
    failed: list[ToolError] = []
    try:

        async def review() -> None:
            with pytest.raises(ToolError) as refused:
                await GitInspect().run(_ctx(ws), {})
            failed.append(refused.value)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(review)
            with trio.fail_after(60):
                while not (marks / f"{INSPECT_FAILPOINT}.fired").exists():
                    await trio.sleep(0.01)  # a wake-up on the marker the failpoint writes
            meanwhile()
            failpoints.release_path(INSPECT_FAILPOINT, marks).touch()
    finally:
        failpoints.configure("")
    assert failed, "the held review gave a review"
    return failed[0]


async def test_a_tree_that_moves_between_the_reads_fails_the_whole_review(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed: "status 和 diff 前后的安全快照不一致时整次失败，不得把并发混合状态作为完整审阅结果": the review
    is held after its status and diff (failpoint), a file appears, and no review is given."""
    ws = _repo(tmp_path)
    (ws / "game" / "index.html").write_text("<p>new</p>\n")
    refused = await _review_held_while(ws, tmp_path / "marks", monkeypatch, lambda: (
        ws / "game" / "late.txt").write_text("a file that appears mid-review\n"))
    assert refused.code == "snapshot-drift" and "changed while" in str(refused)
    again = (await GitInspect().run(_ctx(ws), {})).output
    assert again["untracked"] == ["game/late.txt"], "a quiet tree gives its review"


@pytest.mark.parametrize("change", ["rewrite", "restage"])
async def test_a_listed_file_whose_content_moves_mid_review_fails_it_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """The same sentence, where the status text stays the same: an already modified file
    rewritten (or its staged content replaced) between the diff and the second read.
    A strict re-audit saw the review returned with a diff the file no longer held."""
    import subprocess

    ws = _repo(tmp_path)

    def edit(text: str) -> None:
        (ws / "game" / "index.html").write_text(text)
        if change == "restage":
            subprocess.run(["git", "-C", str(ws), "add", "game/index.html"], check=True, capture_output=True)

    edit("<p>new</p>\n")
    refused = await _review_held_while(ws, tmp_path / "marks", monkeypatch, lambda: edit("NEWER CONTENT\n"))
    assert refused.code == "snapshot-drift", refused


def test_a_contract_that_excludes_paths_blocks_the_review_as_it_blocks_a_git_diff(tmp_path: Path) -> None:
    """The review's diff could show an excluded file, as ``project.git_diff``'s could: under
    a scope with an exclude rule neither can be judged, so both are blocked (docs/intent.md)."""
    from pathlib import PurePosixPath

    from corral.supervisor.intent.intent_scope import PathRule, Scope, judge_action

    hidden = Scope(exclude=(PathRule("scope.exclude", "path:secret", PurePosixPath("secret")),))
    for tool in ("project.git_diff", "project.git_inspect"):
        assert judge_action(hidden, tmp_path, tmp_path / "home", tool, {}) is None, tool
        assert judge_action(Scope(), tmp_path, tmp_path / "home", tool, {}) == [], tool


def test_an_agent_reviews_its_tree_without_asking_and_without_a_revision(short_tmp: Path) -> None:
    """The seed: "共享 command id 为 project.git_inspect，默认权限为 auto … 该工具只读，不推进 project
    revision，不改变 verification gate", end to end: a scripted agent's review runs without a
    person, its observation holds the safe changes and no secret, and no revision is made."""
    import json

    from tests.harness import Daemon, agent_spec, ledger_rows, wait_run

    ws = _repo(short_tmp)
    (ws / "game" / "index.html").write_text("<p>new</p>\n")
    (ws / ".env").write_text("TOKEN=SECRET-ENV-VALUE\n")
    steps = """
[[agents.steps]]
actions = [{ tool = "project.git_inspect", input = { max_files = 5 } }]
[[agents.steps]]
final = "reviewed"
"""
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(workspace=str(ws), steps=steps))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="review")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "waiting-confirmation"})
        assert shown["run"]["status"] == "completed"
        assert [(a["tool"], a["policy"], a["phase"]) for a in shown["actions"]] == [
            ("project.git_inspect", "auto", "ok")
        ]
        rows = ledger_rows(daemon.home, "SELECT data FROM observations WHERE run_id = ?", run_id)
        seen = [json.loads(row["data"]) for row in rows if "project.git_inspect" in row["data"]]
        assert seen and seen[-1]["output"]["unstaged"] == ["game/index.html"]
        assert "+<p>new</p>" in seen[-1]["output"]["diff"]["unstaged"] and seen[-1]["output"]["max_files"] == 5
        assert not any("SECRET-ENV-VALUE" in row["data"] or ".env" in row["data"] for row in rows)
        assert compaction.slot_of(seen[-1]) == compaction.GIT_DIFF_SLOT, "the real observation is the one kept whole"
        revisions = ledger_rows(daemon.home, "SELECT * FROM project_revisions")
        assert revisions == [], "a review advances no project revision"
    finally:
        daemon.shutdown()


async def test_a_review_writes_nothing_not_even_the_index_git_refreshes_by_itself(tmp_path: Path) -> None:
    """The seed fixes "optional locks" off: ``git status`` would otherwise take the index lock
    and rewrite the index to refresh a file's stat data, a write from a read-only review
    that can collide with the user's own git."""
    ws = _repo(tmp_path)
    index = ws / ".git" / "index"
    before = index.read_bytes()
    page = ws / "game" / "index.html"
    stat = page.stat()
    page.write_text(page.read_text())  # the same bytes, a new mtime: stat-dirty
    os.utime(page, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    out = (await GitInspect().run(_ctx(ws), {})).output
    assert out["unstaged"] == [] and out["truncated"] is False
    assert index.read_bytes() == before, "the review left the index as it was"


async def test_the_review_runs_no_git_from_the_project_and_finds_no_repository_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed: "Git 进程使用项目外受信可执行文件" and "项目目录必须精确等于 Git top-level；不向父目录探测
    仓库": a ``git`` the project holds, first on PATH, is refused, never run; a workspace inside
    another repository is no repository of its own."""
    ws = _repo(tmp_path)
    fake = ws / "bin" / "git"
    fake.parent.mkdir()
    marker = tmp_path / "PROJECT-GIT-RAN"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    with pytest.raises(ToolError, match="inside the project") as refused:
        await GitInspect().run(_ctx(ws), {})
    assert refused.value.code == "git-failed" and not marker.exists()
    monkeypatch.undo()
    nested = ws / "game"
    with pytest.raises(ToolError) as outside:
        await GitInspect().run(_ctx(nested), {})
    assert outside.value.code == "git-failed"

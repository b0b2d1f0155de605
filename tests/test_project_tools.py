"""Changesets and git (seed 004 V1.3, V1.4, V1.12): atomic multi-file changes with
a review, git reads, and a commit of exactly the reviewed content after approval."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.project import Changeset, GitCommit, GitDiff, GitSnapshot, GitStatus
from corral.actors.tools.source_fingerprint import fingerprint
from corral.mailbox.protocol import ProjectCommitMoved, ProjectVerification, Request, reply
from tests.harness import Daemon, agent_spec, wait_run


async def _revision_one(request: Any, timeout: float = 30.0) -> Any:
    """The supervisor's answer to a changeset's revision (project.revision.advance)."""
    from corral.actors.tools.base import ToolError
    from corral.mailbox.protocol import ProjectRevisionAdvance

    if not isinstance(request, ProjectRevisionAdvance):
        raise ToolError(f"this tool context asks nothing else of the supervisor ({request.METHOD.value})")
    return reply(request, {"revision": 1})  # as it comes off the wire


def _ctx(ws: Path, scopes: tuple[str, ...] = (".",)) -> ToolContext:
    return ToolContext(agent_id="writer", run_id="run-test00", action_id="act-1", workspace=ws, write_scopes=scopes,
                       home=ws.parent / "home", ask=_revision_one)


def _verified(ws: Path) -> ToolContext:
    """A context whose run has a passed verification on its current revision."""
    async def ask(request: Request[Any], timeout: float = 30.0) -> Any:
        if isinstance(request, ProjectCommitMoved):
            return reply(request, {})
        assert isinstance(request, ProjectVerification), request
        now = fingerprint(ws, ws.parent / "home").digest  # verified on the tree as it is now
        last = {"action_id": "act-0", "run_id": "run-test00", "revision": 1, "fingerprint": now, "status": "passed",
                "commands": 1, "output": [], "created_at": 0.0}
        return reply(request, {"revision": 1, "verification": last, "passed_on_current": True, "passed_by_run": True})

    return ToolContext(agent_id="writer", run_id="run-test00", action_id="act-1", workspace=ws, write_scopes=(".",),
                       home=ws.parent / "home", ask=ask)


def _git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=ws, check=True,
                          capture_output=True, text=True).stdout


def _repo(tmp: Path) -> Path:
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("old\n")
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "config", "user.name", "t")  # the repository's own identity: the commit's
    _git(ws, "config", "user.email", "t@t")
    _git(ws, "add", "README.md")
    _git(ws, "commit", "-q", "-m", "start")
    return ws


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def test_a_changeset_is_all_or_nothing_and_returns_its_review(tmp_path: Path) -> None:
    ws = _repo(tmp_path)
    changes = [{"path": "README.md", "content": "new\n", "expected_sha256": sha("old\n")},
               {"path": "docs/guide.md", "content": "guide\n"}]
    refused = [*changes, {"path": "src/app.py", "content": "x"}]
    with pytest.raises(ToolError, match="write scope"):
        await Changeset().run(_ctx(ws, ("README.md", "docs")), {"changes": refused})
    assert (ws / "README.md").read_text() == "old\n" and not (ws / "docs").exists(), "nothing was written"
    with pytest.raises(ToolError, match="changed since you read it"):
        await Changeset().run(_ctx(ws), {"changes": [{**changes[0], "expected_sha256": sha("other")}]})
    result = await Changeset().run(_ctx(ws, ("README.md", "docs")), {"changes": changes})
    review = result.output["files"]
    assert [(f["path"], f["sha256_before"], f["sha256_after"]) for f in review] == [
        ("README.md", sha("old\n"), sha("new\n")), ("docs/guide.md", None, sha("guide\n"))]
    assert "-old\n+new" in review[0]["diff"]
    again = await Changeset().run(_ctx(ws), {"changes": changes})  # idempotent: the same state
    assert again.ok and (ws / "README.md").read_text() == "new\n"
    for bad in ("../x", "/etc/passwd", ".git/config"):
        with pytest.raises(ToolError):
            await Changeset().run(_ctx(ws), {"changes": [{"path": bad, "content": "x"}]})


async def test_git_reads_and_a_commit_of_exactly_the_reviewed_content(tmp_path: Path) -> None:
    ws = _repo(tmp_path)
    hook = ws / ".git" / "hooks" / "pre-commit"
    hook.write_text(f"#!/bin/sh\ntouch {tmp_path}/hook-ran\n")
    hook.chmod(0o755)
    await Changeset().run(_ctx(ws), {"changes": [{"path": "README.md", "content": "new\n"}]})
    status = await GitStatus().run(_ctx(ws), {})
    assert " M README.md" in status.output["status"]
    diff = await GitDiff().run(_ctx(ws), {})
    assert "+new" in diff.output["diff"]
    snap = (await GitSnapshot().run(_ctx(ws), {"paths": ["README.md"]})).output
    assert snap["files"] == [{"path": "README.md", "sha256": sha("new\n")}]
    commit = {"message": "Update the readme", "paths": ["README.md"], "expected_head": snap["head"],
              "expected_snapshot_fingerprint": snap["fingerprint"]}
    with pytest.raises(ToolError, match="not the snapshot's"):
        await GitCommit().run(_verified(ws), {**commit, "expected_snapshot_fingerprint": sha("other")})
    assert _git(ws, "rev-list", "--count", "HEAD").strip() == "1", "no commit"
    done = await GitCommit().run(_verified(ws), commit)
    assert _git(ws, "log", "-1", "--format=%s %ae").strip() == "Update the readme t@t"
    assert done.output["commit"] == _git(ws, "rev-parse", "HEAD").strip()
    assert not (tmp_path / "hook-ran").exists(), "the repository's hooks never run"


def test_a_commit_waits_for_approval_even_under_a_glob_that_says_auto(short_tmp: Path) -> None:
    """And once approved, it still needs a passed verification: none, nothing committed."""
    ws = _repo(short_tmp)
    commit = f'message = "m", paths = ["README.md"], expected_head = "{"0" * 40}", expected_snapshot_fingerprint = "x"'
    steps = f"""
[[agents.steps]]
actions = [{{ tool = "project.git_commit", input = {{ {commit} }} }}]
[[agents.steps]]
final = "committed"
"""
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(workspace=str(ws), steps=steps, extra='[policy]\n"project.*" = "auto"'))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="commit")["run_id"]
        shown = wait_run(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        assert shown["run"]["status"] == "waiting-confirmation"
        assert [a["policy"] for a in shown["actions"]] == ["confirm"]
        assert _git(ws, "rev-list", "--count", "HEAD").strip() == "1", "nothing committed before approval"
        daemon.call("continue_action", action_id=shown["actions"][0]["action_id"], decision="approve")
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["actions"][0]["phase"] == "failed"
        assert "the project is at revision 0" in json.dumps(shown["actions"][0])  # no verified change of its own
        assert _git(ws, "rev-list", "--count", "HEAD").strip() == "1", "nothing committed unverified"
    finally:
        daemon.shutdown()

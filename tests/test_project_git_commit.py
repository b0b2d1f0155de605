"""The gated git commit (seed 004 V1.12, issue 40): exactly the given paths, built in
an index of corral's own, on the expected HEAD and the snapshot's content, as the
repository's own identity, after a passed verification; never from a child or a
delegated specialist, never without a person's approval. Real git, real files."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from corral.actors.tools import host_git
from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.project import GitCommit, GitSnapshot, GitStatus
from corral.actors.tools.source_fingerprint import fingerprint
from corral.mailbox.protocol import (
    Ack,
    ProjectCommitMoved,
    ProjectVerification,
    Request,
    Verification,
    VerificationState,
)
from corral.supervisor.runs.run_core import RunCore
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.spec.swarm_spec import SpecError, parse_spec

#: Every git verb the commit may run; anything else (push, fetch, branch, add,
#: commit, reset, checkout...) is a failure of this test.
COMMIT_VERBS = {"config", "rev-parse", "symbolic-ref", "diff-index", "read-tree", "hash-object", "update-index",
                "write-tree", "commit-tree", "update-ref", "status"}


#: What the commits of these tests kept in their action's record (project.commit.moved).
moved: list[ProjectCommitMoved] = []


def _ctx(ws: Path, *, verified: bool = True, child: bool = False) -> ToolContext:
    async def ask(request: Request[Any], timeout: float = 30.0) -> Any:
        if isinstance(request, ProjectCommitMoved):
            moved.append(request)
            return Ack()
        assert isinstance(request, ProjectVerification), request
        # Verified on the tree as it is now (a write after the verification is tested
        # end to end: tests/test_verified_commit.py).
        now = fingerprint(ws, ws.parent / "home").digest
        last = Verification(action_id="act-0", run_id="run-test00", revision=2, fingerprint=now,
                            status="passed" if verified else "failed", commands=1, output=[], created_at=0.0)
        return VerificationState(revision=2, verification=last, passed_on_current=verified, passed_by_run=verified)

    return ToolContext(agent_id="writer", run_id="run-test00", action_id="act-1", workspace=ws, write_scopes=(".",),
                       home=ws.parent / "home", ask=ask, is_child=child)


def _git(ws: Path, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(ws.parent), "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
    return subprocess.run(["git", *args], cwd=ws, env=env, check=True, capture_output=True, text=True).stdout


def _repo(tmp: Path, *, identity: bool = True) -> Path:
    ws = tmp / "ws"
    ws.mkdir()
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "config", "user.name", "Repo Owner")
    _git(ws, "config", "user.email", "owner@example.invalid")
    for name in ("a.py", "b.py", "gone.txt", "staged.txt"):
        (ws / name).write_text(f"{name} v1\n")
    _git(ws, "add", ".")
    _git(ws, "commit", "-q", "-m", "start")
    if not identity:
        _git(ws, "config", "--unset", "user.name")
        _git(ws, "config", "--unset", "user.email")
    return ws


def _head(ws: Path) -> str:
    return _git(ws, "rev-parse", "HEAD").strip()


async def _snapshot(ws: Path, paths: list[str]) -> dict[str, Any]:
    return (await GitSnapshot().run(_ctx(ws), {"paths": paths})).output


async def test_a_commit_holds_exactly_the_paths_on_the_expected_head(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ws = _repo(tmp_path)
    start = _head(ws)
    (ws / "a.py").write_text("a.py v2\n")
    (ws / "new.py").write_text("new\n")
    (ws / "new.py").chmod(0o755)
    (ws / "gone.txt").unlink()
    (ws / "b.py").write_text("b.py v2, not chosen\n")
    index_before = _git(ws, "ls-files", "-s", "--", "b.py", "staged.txt")
    paths = ["a.py", "new.py", "gone.txt"]
    snap = await _snapshot(ws, paths)
    assert snap["head"] == start and snap["branch"] == "refs/heads/main"
    assert {f["path"]: f["sha256"] for f in snap["files"]} == {
        "a.py": hashlib.sha256(b"a.py v2\n").hexdigest(), "new.py": hashlib.sha256(b"new\n").hexdigest(),
        "gone.txt": None}
    assert (await GitStatus().run(_ctx(ws), {})).output["head"] == start

    argvs: list[list[str]] = []
    real_run = subprocess.run

    def recording(argv: list[str], **kwargs: Any) -> Any:
        argvs.append(list(argv))
        return real_run(argv, **kwargs)

    monkeypatch.setattr(host_git.subprocess, "run", recording)
    done = await GitCommit().run(_ctx(ws), {"message": "Change a, add new, drop gone", "paths": paths,
                                            "expected_head": snap["head"],
                                            "expected_snapshot_fingerprint": snap["fingerprint"]})
    monkeypatch.undo()
    verbs = {argv[2] if argv[2] != "--literal-pathspecs" else argv[3] for argv in argvs}
    assert {"read-tree", "commit-tree", "update-ref"} <= verbs <= COMMIT_VERBS, verbs

    head = _head(ws)
    assert done.output["commit"] == head and done.output["parent"] == start and done.output["branch"] == "main"
    assert (moved[-1].commit, moved[-1].parent, moved[-1].branch) == (head, start, "refs/heads/main")
    assert _git(ws, "rev-parse", "HEAD^").strip() == start
    changed = _git(ws, "diff-tree", "--no-commit-id", "--name-status", "-r", start, head).split("\n")
    assert sorted(line for line in changed if line) == ["A\tnew.py", "D\tgone.txt", "M\ta.py"]
    assert _git(ws, "show", "HEAD:a.py") == "a.py v2\n"
    assert "100755 " in _git(ws, "ls-tree", "HEAD", "new.py")
    assert _git(ws, "log", "-1", "--format=%an <%ae>|%cn <%ce>|%s").strip() == (
        "Repo Owner <owner@example.invalid>|Repo Owner <owner@example.invalid>|Change a, add new, drop gone")
    assert "corral project.git_commit" in _git(ws, "reflog", "-1", "--format=%gs", "refs/heads/main")
    # The user's index: the other entries as they were; the committed paths match
    # the new HEAD (no stale entry a later commit would revert), nothing staged.
    assert _git(ws, "ls-files", "-s", "--", "b.py", "staged.txt") == index_before
    assert _git(ws, "diff", "--cached", "--name-only").split() == []
    assert _git(ws, "diff", "--name-only").split() == ["b.py"]
    assert done.output["index_refreshed"] is True
    # "成功 observation … 只保存 … 提交信息 SHA-256 和剩余变更计数": b.py is left, uncommitted.
    assert done.output["remaining_changes"] == 1


async def _commit_refused(ws: Path, tool_input: dict[str, Any], code: str, ctx: ToolContext | None = None) -> str:
    head, index = _head(ws), (ws / ".git" / "index").read_bytes()
    with pytest.raises(ToolError) as caught:
        await GitCommit().run(ctx or _ctx(ws), tool_input)
    assert caught.value.code == code, caught.value
    assert _head(ws) == head, "nothing was committed"
    assert (ws / ".git" / "index").read_bytes() == index, "the user's index is untouched"
    return str(caught.value)


async def test_a_moved_head_a_changed_file_or_staged_paths_commit_nothing(tmp_path: Path) -> None:
    ws = _repo(tmp_path)
    (ws / "a.py").write_text("a.py v2\n")
    snap = await _snapshot(ws, ["a.py"])
    good = {"message": "m", "paths": ["a.py"], "expected_head": snap["head"],
            "expected_snapshot_fingerprint": snap["fingerprint"]}
    await _commit_refused(ws, {**good, "expected_head": "0" * 40}, "head-changed")
    await _commit_refused(ws, {**good, "paths": ["a.py", "b.py"]}, "path-unchanged")
    (ws / "a.py").write_text("a.py v3, after the review\n")
    await _commit_refused(ws, good, "snapshot-changed")
    (ws / "a.py").write_text("a.py v2\n")
    _git(ws, "add", "a.py")
    await _commit_refused(ws, good, "snapshot-changed")  # staged since: the status is not the snapshot's
    _git(ws, "reset", "-q", "--", "a.py")
    # A commit made meanwhile moves HEAD: the snapshot's head is no longer it.
    (ws / "b.py").write_text("b.py v2\n")
    _git(ws, "commit", "-q", "-m", "meanwhile", "--", "b.py")
    await _commit_refused(ws, {**good, "expected_head": _head(ws)}, "snapshot-changed")
    await _commit_refused(ws, {**good, "paths": ["a.py", "a.py"]}, "bad-input")
    for bad in ("  ", "\ud800 a lone surrogate"):
        await _commit_refused(ws, {**good, "message": bad}, "bad-message")
    (ws / "link.py").symlink_to("a.py")
    await _commit_refused(ws, {**good, "paths": ["link.py"]}, "path-refused")


async def test_any_staged_content_refuses_the_commit(tmp_path: Path) -> None:
    """Seed 004 V1.12: "工具执行时真实 index 必须为空，已有 staged 内容一律拒绝": a path the
    user staged, even one the commit does not name, refuses it; so does a staged secret
    file, which the refusal does not name."""
    ws = _repo(tmp_path)
    (ws / "a.py").write_text("a.py v2\n")
    (ws / "staged.txt").write_text("staged by the user\n")
    _git(ws, "add", "staged.txt")
    snap = await _snapshot(ws, ["a.py"])
    assert snap["staged"] == 1
    good = {"message": "m", "paths": ["a.py"], "expected_head": snap["head"],
            "expected_snapshot_fingerprint": snap["fingerprint"]}
    message = await _commit_refused(ws, good, "staged-changes")
    assert "staged.txt" in message and "index" in message
    _git(ws, "reset", "-q", "--", "staged.txt")
    (ws / ".env").write_text("TOKEN=shh\n")
    _git(ws, "add", "-f", ".env")
    snap = await _snapshot(ws, ["a.py"])
    assert ".env" not in str(snap)
    good = {**good, "expected_snapshot_fingerprint": snap["fingerprint"]}
    message = await _commit_refused(ws, good, "staged-changes")
    assert ".env" not in message and "1 staged path" in message
    _git(ws, "rm", "-q", "--cached", ".env")
    snap = await _snapshot(ws, ["a.py"])
    done = await GitCommit().run(_ctx(ws), {**good, "expected_snapshot_fingerprint": snap["fingerprint"]})
    assert done.ok and _git(ws, "show", "HEAD:a.py") == "a.py v2\n"


async def test_the_snapshot_binds_head_the_branch_and_every_safe_change(tmp_path: Path) -> None:
    """Seed 004 V1.12: commitSnapshotFingerprint "绑定当前 HEAD、附着分支、规范化后的安全
    staged / unstaged / untracked 状态以及所有安全变更路径": a change to a path the commit
    does not name moves it, a secret file's change does not; only a changed path commits."""
    ws = _repo(tmp_path)
    (ws / "a.py").write_text("a.py v2\n")
    first = await _snapshot(ws, ["a.py"])
    assert [f["path"] for f in first["changes"]] == ["a.py"]
    good = {"message": "m", "paths": ["a.py"], "expected_head": first["head"],
            "expected_snapshot_fingerprint": first["fingerprint"]}
    (ws / "b.py").write_text("b.py v2, not chosen\n")  # another tracked path changes
    await _commit_refused(ws, good, "snapshot-changed")
    (ws / "b.py").write_text("b.py v1\n")
    assert (await _snapshot(ws, ["a.py"]))["fingerprint"] == first["fingerprint"]
    (ws / "untracked.txt").write_text("new\n")  # an untracked path appears
    await _commit_refused(ws, good, "snapshot-changed")
    (ws / "untracked.txt").unlink()
    (ws / ".env").write_text("SECRET=1\n")  # a secret file is never part of it
    assert (await _snapshot(ws, [])) ["fingerprint"] == first["fingerprint"]
    # The same HEAD on another branch: another snapshot.
    _git(ws, "branch", "other")
    _git(ws, "symbolic-ref", "HEAD", "refs/heads/other")
    other = await _snapshot(ws, ["a.py"])
    assert other["head"] == first["head"] and other["branch"] == "refs/heads/other"
    assert other["fingerprint"] != first["fingerprint"]
    _git(ws, "symbolic-ref", "HEAD", "refs/heads/main")
    # A path with no change is not one git.inspect's snapshot names: refused.
    unchanged = {**good, "paths": ["a.py", "b.py"]}
    assert "b.py" in await _commit_refused(ws, unchanged, "path-unchanged")


async def test_no_repository_identity_no_verification_or_a_child_commit_nothing(tmp_path: Path) -> None:
    ws = _repo(tmp_path, identity=False)
    (ws / "a.py").write_text("a.py v2\n")
    snap = await _snapshot(ws, ["a.py"])
    good = {"message": "m", "paths": ["a.py"], "expected_head": snap["head"],
            "expected_snapshot_fingerprint": snap["fingerprint"]}
    message = await _commit_refused(ws, good, "no-identity")
    assert "user.name" in message and "git config user.name" in message
    assert "run project.verify" in await _commit_refused(ws, good, "verification-required", _ctx(ws, verified=False))
    assert "parent agent" in await _commit_refused(ws, good, "not-allowed", _ctx(ws, child=True))


def test_its_approval_is_mandatory_and_children_and_specialists_never_commit(tmp_path: Path) -> None:
    for data in ({"policy": {"project.git_commit": "auto"}},
                 {"agents": [{"id": "a", "steps": [{"final": "ok"}], "policy": {"project.git_commit": "auto"}}]}):
        with pytest.raises(SpecError, match=r"policy\.project\.git_commit: .*always needs a person's approval"):
            parse_spec(data)
    spec = parse_spec({"policy": {"*": "auto"}})
    core = RunCore(cast(Any, None), RunFeatures(), spec=spec, home=tmp_path, tree=cast(Any, None), boot_id="b")
    assert core.policy_for({"kind": "root", "options": "{}"}, "project.git_commit") == "confirm"
    assert core.policy_for({"kind": "root", "options": "{}"}, "fs.read") == "auto"
    denied = {"kind": "root", "options": '{"policy": {"project.git_commit": "deny"}}'}
    assert core.policy_for(denied, "project.git_commit") == "deny"
    for kind in ("child", "delegation"):
        assert core.policy_for({"kind": kind, "options": "{}"}, "project.git_commit") == "deny"


async def test_the_real_index_lock_guards_the_commit_and_an_uncertain_ref_move_waits_for_a_person(
    tmp_path: Path,
) -> None:
    """V1.12: "再以真实 .git/index.lock 阻止并发 index 写…最后安装与新 HEAD 对齐的 index…同目录原子
    rename": another git holding the index's lock refuses the commit before git is
    written. And "update-ref 失败后…ref 仍为 expected、等于候选或无法读取时都视为不确定并进入
    reconciliation": a ref that did not move is an unknown outcome, never a plain
    failure; the index lock corral took is released either way."""
    from corral.actors.tools.base import OUTCOME_UNKNOWN

    ws = _repo(tmp_path)
    (ws / "a.py").write_text("a.py v2\n")
    snap = await _snapshot(ws, ["a.py"])
    good = {"message": "m", "paths": ["a.py"], "expected_head": snap["head"],
            "expected_snapshot_fingerprint": snap["fingerprint"]}
    lock = ws / ".git" / "index.lock"
    lock.write_bytes(b"another git writes the index")
    message = await _commit_refused(ws, good, "index-locked")
    assert "index.lock" in message and lock.read_bytes() == b"another git writes the index", "its lock is kept"
    lock.unlink()

    ref_lock = ws / ".git" / "refs" / "heads" / "main.lock"
    ref_lock.write_text("another git moves the branch\n")
    with pytest.raises(ToolError) as caught:
        await GitCommit().run(_ctx(ws), good)
    assert caught.value.code == OUTCOME_UNKNOWN, caught.value
    assert _head(ws) == snap["head"] and not lock.exists(), "the ref did not move; corral's index lock is gone"
    ref_lock.unlink()
    done = await GitCommit().run(_ctx(ws), good)
    assert done.output["commit"] == _head(ws) and not lock.exists()
    assert _git(ws, "diff", "--cached", "--name-only").split() == [], "the installed index matches the new HEAD"

"""Checkpoints, content diffs and changeset operations (seed 004 V1.3): a changeset
is checked whole before anything is written, checkpointed, applied whole or
rolled back; project.diff is bounded and shows no secret; project.restore puts a
checkpoint back after approval; a SIGKILL between the checkpoint and the write
loses nothing and does nothing twice."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from corral.actors.tools import project_apply, project_checkpoints
from corral.actors.tools.base import ToolContext, ToolError
from corral.actors.tools.project import Changeset, ProjectDiff, ProjectRestore
from corral.supervisor.runs.action_state import action_id
from tests.harness import Daemon, agent_spec, ledger_rows, wait_run


async def _revision_one(request: Any, timeout: float = 30.0) -> Any:
    """The supervisor's answer to a changeset's revision (project.revision.advance)."""
    from corral.actors.tools.base import ToolError
    from corral.mailbox.protocol import ProjectRevisionAdvance, Revision

    if not isinstance(request, ProjectRevisionAdvance):
        raise ToolError(f"this tool context asks nothing else of the supervisor ({request.METHOD.value})")
    return Revision(revision=1)


def _ctx(ws: Path, action: str = "act-1", run: str = "run-test00") -> ToolContext:
    return ToolContext(agent_id="writer", run_id=run, action_id=action, workspace=ws, write_scopes=(".",),
                       home=ws.parent / "home", ask=_revision_one)


def sha(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _manifests(home: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((home / "checkpoints").glob("runs/*/cp-*.json"))]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "a.py").write_text("x = 1\ny = 1\n")
    (root / "src" / "b.py").write_text("b\n")
    return root


async def test_a_changeset_is_checked_whole_before_anything_is_written(ws: Path) -> None:
    changes = [{"operation": "update", "path": "src/a.py", "content": "x = 2\n",
                "expected_sha256": sha("x = 1\ny = 1\n")},
               {"operation": "delete", "path": "src/b.py", "expected_sha256": sha("not b\n")}]
    with pytest.raises(ToolError, match="changed since you read it") as stale:
        await Changeset().run(_ctx(ws), {"changes": changes})
    assert stale.value.code == "stale-content"
    refusals = {
        "exists already": [{"operation": "create", "path": "src/b.py", "content": "new"}],
        "occurs 2 times, expected_replacements is 1": [
            {"operation": "update", "path": "src/a.py", "old_text": "= 1", "new_text": "= 3"}],
        "no such file to delete": [{"operation": "delete", "path": "src/none.py", "expected_sha256": sha("")}],
        "either content or old_text": [{"operation": "update", "path": "src/a.py", "content": "c",
                                        "old_text": "x", "new_text": "y", "expected_sha256": sha("x = 1\ny = 1\n")}],
        "names each file once": [{"path": "src/new.py", "content": "1"}, {"path": "src/NEW.py", "content": "2"}],
        "1 to 12 files": [{"path": f"f{i}.txt", "content": "x"} for i in range(13)],
        "at most 262144 bytes": [{"path": "big1.txt", "content": "x" * 200_000},
                                 {"path": "big2.txt", "content": "x" * 70_000}],
    }
    for message, bad in refusals.items():
        with pytest.raises(ToolError, match=message):
            await Changeset().run(_ctx(ws), {"changes": [{"path": "src/c.py", "content": "c\n"}, *bad]})
    assert (ws / "src" / "a.py").read_text() == "x = 1\ny = 1\n" and (ws / "src" / "b.py").read_text() == "b\n"
    assert sorted(p.name for p in ws.rglob("*")) == ["a.py", "b.py", "src"], "nothing was written, nothing staged"
    assert _manifests(ws.parent / "home") == [], "a refused changeset takes no checkpoint"


async def test_operations_apply_together_after_one_checkpoint(ws: Path) -> None:
    home = ws.parent / "home"
    changes = [
        {"operation": "update", "path": "src/a.py", "old_text": "= 1", "new_text": "= 2", "expected_replacements": 2,
         "expected_sha256": sha("x = 1\ny = 1\n")},
        {"operation": "delete", "path": "src/b.py", "expected_sha256": sha("b\n")},
        {"operation": "create", "path": "src/c.py", "content": "c\n"},
    ]
    result = await Changeset().run(_ctx(ws), {"changes": changes})
    assert (ws / "src" / "a.py").read_text() == "x = 2\ny = 2\n"
    assert not (ws / "src" / "b.py").exists() and (ws / "src" / "c.py").read_text() == "c\n"
    files = result.output["files"]
    assert [(f["path"], f["operation"], f["sha256_before"], f["sha256_after"]) for f in files] == [
        ("src/a.py", "update", sha("x = 1\ny = 1\n"), sha("x = 2\ny = 2\n")),
        ("src/b.py", "delete", sha("b\n"), None),
        ("src/c.py", "create", None, sha("c\n"))]
    assert "+x = 2" in files[0]["diff"] and result.output["sources_changed"] is True
    # The receipt's line: counts, the checkpoint; no content.
    checkpoint = result.output["checkpoint"]
    assert result.summary == f"changeset of 3 files applied (1 create, 1 delete, 1 update); checkpoint {checkpoint}"
    [manifest] = _manifests(home)
    assert manifest["id"] == result.output["checkpoint"] and manifest["action_id"] == "act-1"
    assert manifest["files"] == {"src/a.py": sha("x = 1\ny = 1\n"), "src/b.py": sha("b\n"), "src/c.py": None}
    again = await Changeset().run(_ctx(ws), {"changes": changes})  # the same action again: nothing twice
    assert again.output["checkpoint"] == manifest["id"] and len(_manifests(home)) == 1
    assert (ws / "src" / "a.py").read_text() == "x = 2\ny = 2\n"
    # Content-addressed: another checkpoint of the same bytes stores no second blob.
    (ws / "src" / "d.py").write_text("x = 2\ny = 2\n")
    await Changeset().run(_ctx(ws, "act-2"), {"changes": [{"path": "src/d.py", "content": "d\n"}]})
    assert len(_manifests(home)) == 2
    assert sorted(p.name for p in (home / "checkpoints" / "blobs").iterdir()) == sorted(
        [sha("x = 1\ny = 1\n"), sha("b\n"), sha("x = 2\ny = 2\n")])


async def test_a_failure_after_a_write_rolls_the_whole_change_back(ws: Path) -> None:
    # The engine's last step fails: the delete of a file that has gained a second
    # name (the plan did not check it; project.changeset's planning would refuse it).
    os.link(ws / "src" / "b.py", ws / "src" / "b2.py")
    plan = [project_apply.Planned("src/a.py", "update", b"x = 1\ny = 1\n", b"changed\n"),
            project_apply.Planned("src/b.py", "delete", b"b\n", None)]
    with pytest.raises(ToolError, match="2 names") as failed:
        project_apply.apply_plan(_ctx(ws), plan, "cp-" + "0" * 20, "project.changeset")
    assert "nothing was changed" in str(failed.value)
    assert (ws / "src" / "a.py").read_text() == "x = 1\ny = 1\n", "the write was rolled back"
    assert (ws / "src" / "b.py").read_text() == "b\n"
    with pytest.raises(ToolError, match="2 names"):  # planned by the tool: refused before any write
        await Changeset().run(_ctx(ws), {"changes": [
            {"path": "src/a.py", "content": "changed\n"},
            {"operation": "delete", "path": "src/b.py", "expected_sha256": sha("b\n")}]})
    assert (ws / "src" / "a.py").read_text() == "x = 1\ny = 1\n"
    assert [m["id"] for m in _manifests(ws.parent / "home")] == ["cp-" + "0" * 20], "only the engine's checkpoint"


async def test_diff_is_bounded_and_shows_no_secret(ws: Path) -> None:
    (ws / "data.bin").write_bytes(b"\x00\x01")
    (ws / ".env").write_text("API_KEY=sk-live-0123456789abcdef0123\n")
    (ws / "src" / "long.py").write_text("".join(f"line {i}\n" for i in range(2000)))
    ctx = _ctx(ws)
    with pytest.raises(ToolError, match="no checkpoint yet"):
        await ProjectDiff().run(ctx, {})
    changes = [{"path": "src/a.py", "content": "x = 9\ny = 1\n"}, {"path": "data.bin", "content": "text now"},
               {"path": "src/long.py", "content": "".join(f"line {i * 2}\n" for i in range(2000))},
               {"path": "src/b.py", "content": "b\n"}]
    await Changeset().run(ctx, {"changes": changes})
    (ws / "src" / "b.py").unlink()
    os.link(ws / ".env", ws / "src" / "b.py")  # after the checkpoint: another name of the secret
    diff = (await ProjectDiff().run(ctx, {"include_content": True, "max_chars": 2000})).output
    by_path = {f["path"]: f for f in diff["files"]}
    assert sorted(by_path) == ["data.bin", "src/a.py", "src/b.py", "src/long.py"] and diff["files_changed"] == 4
    assert by_path["data.bin"]["binary"] and "diff" not in by_path["data.bin"] and diff["binary"]
    assert "-x = 1\n+x = 9\n" in by_path["src/a.py"]["diff"] and not by_path["src/a.py"]["truncated"]
    assert by_path["src/long.py"]["truncated"] and "diff" not in by_path["src/long.py"] and diff["truncated"]
    assert by_path["src/b.py"]["status"] == "hidden" and by_path["src/b.py"]["sha256_after"] is None
    assert "sk-live" not in json.dumps(diff)
    paths_only = (await ProjectDiff().run(ctx, {"max_files": 1})).output
    assert len(paths_only["files"]) == 1 and paths_only["truncated"] and "diff" not in paths_only["files"][0]
    for bad in ({"max_chars": 24_001}, {"max_files": 0}, {"since_checkpoint": "cp-" + "f" * 20}):
        with pytest.raises(ToolError):
            await ProjectDiff().run(ctx, bad)


async def test_restore_puts_the_checkpoint_back_and_can_be_undone(ws: Path) -> None:
    changes = [{"path": "src/a.py", "content": "changed\n"}, {"path": "src/new.py", "content": "new\n"},
               {"operation": "delete", "path": "src/b.py", "expected_sha256": sha("b\n")}]
    done = await Changeset().run(_ctx(ws), {"changes": changes})
    restored = await ProjectRestore().run(_ctx(ws, "act-2"), {"checkpoint": done.output["checkpoint"]})
    assert (ws / "src" / "a.py").read_text() == "x = 1\ny = 1\n" and (ws / "src" / "b.py").read_text() == "b\n"
    assert not (ws / "src" / "new.py").exists()
    assert sorted((f["path"], f["operation"]) for f in restored.output["files"]) == [
        ("src/a.py", "update"), ("src/b.py", "create"), ("src/new.py", "delete")]
    assert ProjectRestore.default_policy == "confirm"
    await ProjectRestore().run(_ctx(ws, "act-3"), {"checkpoint": restored.output["undo_checkpoint"]})
    assert (ws / "src" / "a.py").read_text() == "changed\n" and not (ws / "src" / "b.py").exists()
    other = ws.parent / "other"
    other.mkdir()
    with pytest.raises(ToolError, match="another workspace"):
        await ProjectRestore().run(_ctx(other, "act-4"), {"checkpoint": done.output["checkpoint"]})


RUN = "run-changes-crash"
CHANGES: list[dict[str, Any]] = [{"operation": "update", "path": "src/a.py", "old_text": "x = 1", "new_text": "x = 2",
            "expected_replacements": 1},
           {"operation": "create", "path": "src/c.py", "content": "c = 3\n"}]


def test_a_kill_between_checkpoint_and_write_is_never_replayed_and_a_restore_waits_for_approval(
    short_tmp: Path,
) -> None:
    """V1.3: "Runner 在 executing 阶段退出仍不得自动重放，checkpoint 是人工核对和恢复依据": a
    changeset whose agent dies between its checkpoint and its first write is not run
    again; it waits for a person with its checkpoint kept, and nothing is half-written."""
    ws = short_tmp / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("x = 1\n")
    changeset_input = {"changes": CHANGES}
    cp = project_checkpoints.checkpoint_id(RUN, action_id(RUN, 0, 0), "project.changeset", changeset_input)
    changes = ", ".join("{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in c.items()) + " }" for c in CHANGES)
    steps = f"""
[[agents.steps]]
actions = [{{ tool = "project.changeset", input = {{ changes = [{changes}] }} }}]
[[agents.steps]]
actions = [{{ tool = "project.restore", input = {{ checkpoint = "{cp}" }} }}]
[[agents.steps]]
final = "restored"
"""
    policy = '[agents.policy]\n"project.changeset" = "auto"'
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(workspace=str(ws), steps=steps, policy=policy))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up(env={"CORRAL_FAILPOINTS": "changeset.after-checkpoint=kill@once"})
        daemon.call("run", agent_id="writer", task="change, then restore", run_id=RUN)
        shown = wait_run(daemon, RUN, {"needs-reconciliation", "waiting-confirmation", "completed", "failed"})
        assert (daemon.home / "failpoints" / "changeset.after-checkpoint.fired").exists()
        assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
        (row,) = ledger_rows(daemon.home, "SELECT action_id, phase, attempts FROM actions WHERE run_id = ?", RUN)
        assert row["phase"] == "needs-reconciliation" and int(row["attempts"]) == 1, "never run again"
        assert (ws / "src" / "a.py").read_text() == "x = 1\n" and not (ws / "src" / "c.py").exists()
        assert [m["id"] for m in _manifests(daemon.home)] == [cp], "the checkpoint is kept for the person"
        assert not [p for p in ws.rglob("*") if p.name.endswith(".corral-tmp")]
        # The person checks the checkpoint and the files: nothing was written.
        daemon.call("reconcile", action_id=row["action_id"], outcome="failed", note="checkpoint taken, no write")
        shown = wait_run(daemon, RUN, {"waiting-confirmation", "completed", "failed"})
        assert shown["actions"][-1]["tool"] == "project.restore", shown["actions"]
        assert (ws / "src" / "a.py").read_text() == "x = 1\n", "nothing restored before approval"
        daemon.call("continue_action", action_id=action_id(RUN, 1, 0), decision="approve")
        shown = wait_run(daemon, RUN, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "restored"
        assert (ws / "src" / "a.py").read_text() == "x = 1\n" and not (ws / "src" / "c.py").exists()
    finally:
        daemon.shutdown()


async def test_a_file_may_hold_up_to_2_mib_once_changed(ws: Path) -> None:
    """V1.3: "单文件修改后仍受 2 MiB 文本上限约束" (a file is bounded at 2 MiB once changed)."""
    body = "".join(f"line {i:07d}\n" for i in range(150_000))  # 1.95 MB, under 2 MiB
    (ws / "src" / "big.txt").write_text(body)
    grow = [{"operation": "update", "path": "src/big.txt", "old_text": "line 0000000\n",
             "new_text": "line zero\n" + "x" * 40_000 + "\n"}]
    await Changeset().run(_ctx(ws), {"changes": grow})
    assert (ws / "src" / "big.txt").stat().st_size > 1 << 20
    over = [{"operation": "update", "path": "src/big.txt", "old_text": "line zero\n",
             "new_text": "y" * 200_000 + "\n"}]
    with pytest.raises(ToolError, match=f"over {2 << 20} bytes once changed"):
        await Changeset().run(_ctx(ws, "act-2"), {"changes": over})


def test_the_seeds_name_project_patchset_calls_the_changeset() -> None:
    """V1.3 names the tool ``project.patchset``: a plan that calls it by that name is
    the same ``project.changeset`` call (one action, one tool)."""
    from corral.actors.providers.plan_parse import tool_index
    from corral.actors.tools.registry import builtin_tools

    index = tool_index(tool.schema for tool in builtin_tools().values())
    assert index["project.patchset"] is index["project.changeset"]


def test_the_revision_moves_once_before_the_apply_and_stays_after_a_full_rollback(short_tmp: Path) -> None:
    """V1.3: "prepared 成功后只推进一次 project revision，再按计划应用全部变更。中途失败时用内存中的
    原始内容回滚已应用项；回滚完整则返回失败但保留已推进 revision". A changeset that fails after
    its checkpoint leaves every file as it was, fails, and keeps the one revision it
    made; a changeset that succeeds makes exactly one revision."""
    ws = short_tmp / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("x = 1\n")
    changes = ", ".join("{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in c.items()) + " }" for c in CHANGES)
    steps = f"""
[[agents.steps]]
actions = [{{ tool = "project.changeset", input = {{ changes = [{changes}] }} }}]
[[agents.steps]]
actions = [{{ tool = "project.changeset", input = {{ changes = [{changes}] }} }}]
[[agents.steps]]
final = "changed"
"""
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(workspace=str(ws), steps=steps, policy='[agents.policy]\n"project.changeset" = "auto"'))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up(env={"CORRAL_FAILPOINTS": "changeset.after-checkpoint=raise@once"})
        run_id: str = daemon.call("run", agent_id="writer", task="change twice")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "completed", shown["run"]
        first, second = (a["action_id"] for a in shown["actions"])
        assert [a["phase"] for a in shown["actions"]] == ["failed", "ok"]
        revisions = ledger_rows(daemon.home, "SELECT revision, action_id FROM project_revisions ORDER BY revision")
        assert [(r["revision"], r["action_id"]) for r in revisions] == [(1, first), (2, second)]
        assert (ws / "src" / "a.py").read_text() == "x = 2\n" and (ws / "src" / "c.py").read_text() == "c = 3\n"
        events = ledger_rows(daemon.home, "SELECT kind, subject FROM events WHERE kind IN"
                             " ('project-revision', 'action-ok', 'action-failed') ORDER BY cursor")
        kinds = [(e["kind"], e["subject"]) for e in events]
        assert kinds.index(("project-revision", second)) < kinds.index(("action-ok", second)), kinds
    finally:
        daemon.shutdown()


def test_a_rollback_that_could_not_complete_waits_for_a_person(short_tmp: Path) -> None:
    """V1.3: "回滚不完整…都进入 needs-reconciliation": a changeset that fails after a write
    and cannot put every file back is neither failed nor ok: it waits for a person,
    naming the files and the checkpoint that holds their prior content."""
    ws = short_tmp / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("x = 1\n")
    (ws / "src" / "old.py").write_text("old\n")
    change = [{"operation": "update", "path": "src/a.py", "old_text": "x = 1", "new_text": "x = 2"},
              {"operation": "delete", "path": "src/old.py", "expected_sha256": sha("old\n")}]
    changes = ", ".join("{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in c.items()) + " }" for c in change)
    steps = f"""
[[agents.steps]]
actions = [{{ tool = "project.changeset", input = {{ changes = [{changes}] }} }}]
[[agents.steps]]
final = "never: the run waits for a person"
"""
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(workspace=str(ws), steps=steps, policy='[agents.policy]\n"project.changeset" = "auto"'))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        # The write lands, the delete fails, and putting a.py back fails too.
        daemon.up(env={"CORRAL_FAILPOINTS": "changeset.before-deletes=raise@once,changeset.rollback=raise@once"})
        run_id: str = daemon.call("run", agent_id="writer", task="change and fail")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
        (action,) = ledger_rows(daemon.home, "SELECT phase, reason, result FROM actions WHERE run_id = ?", run_id)
        assert action["phase"] == "needs-reconciliation", action
        assert "outcome unknown" in action["reason"] and "src/a.py" in action["reason"]
        [manifest] = _manifests(daemon.home)
        assert manifest["id"] in action["reason"], "the checkpoint a person restores from is named"
        assert (ws / "src" / "a.py").read_text() == "x = 2\n" and (ws / "src" / "old.py").exists()
        assert ledger_rows(daemon.home, "SELECT * FROM receipts WHERE run_id = ?", run_id) == []
    finally:
        daemon.shutdown()

"""``project.diff`` reads the whole path-level state again after its hunks (seed 004
V1.3: "内容 diff …在生成 hunks 后重新计算路径级差异；前后快照不一致时整个结果失败，不得把并发混合状态
标成 truncated=false"). A strict re-audit (aud1, 2026-12-07) found the second read
covered only the files already found changed, so a checkpointed file that was
unchanged at the first read and changed before the second went unnoticed. Here the
diff is held after its hunks (failpoint), such a file changes, and no diff is given.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from corral.actors.tools.base import ToolError
from corral.actors.tools.project import Changeset, ProjectDiff
from corral.actors.tools.project_diff import FAILPOINT
from corral.core import failpoints
from tests.test_project_changes import _ctx


async def test_a_checkpointed_file_that_moves_during_the_diff_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("x = 1\n")
    (ws / "src" / "b.py").write_text("b\n")
    ctx = _ctx(ws)
    await Changeset().run(
        ctx, {"changes": [{"path": "src/a.py", "content": "x = 2\n"}, {"path": "src/b.py", "content": "b changed\n"}]}
    )
    (ws / "src" / "b.py").write_text("b\n")  # back as the checkpoint has it: not in the diff
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv(failpoints.MARKER_DIR_ENV, str(marks))
    failpoints.configure(f"{FAILPOINT}=block@once")
    failed: list[ToolError] = []
    try:

        async def diff() -> None:
            with pytest.raises(ToolError) as refused:
                await ProjectDiff().run(ctx, {"include_content": True})
            failed.append(refused.value)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(diff)
            with trio.fail_after(60):
                while not (marks / f"{FAILPOINT}.fired").exists():
                    await trio.sleep(0.01)  # a wake-up on the marker the failpoint writes
            (ws / "src" / "b.py").write_text("b moved mid-diff\n")
            failpoints.release_path(FAILPOINT, marks).touch()
    finally:
        failpoints.configure("")
    assert failed and failed[0].code == "concurrent-change" and "src/b.py" in str(failed[0])
    quiet = (await ProjectDiff().run(ctx, {"include_content": True})).output
    assert sorted(f["path"] for f in quiet["files"]) == ["src/a.py", "src/b.py"] and quiet["truncated"] is False

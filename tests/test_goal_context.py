"""The current goal reaches every planning turn of its run (seed 004 V1.18), with
real processes: a supervisor, its agent, and a provider that records what each
turn was sent.

* "Goal 内容进入每轮 planning/final reply 的显式'持久目标'上下文": every provider turn
  of a goal run carries an explicit durable-goal context read from the goal store
  (goal id, revision, objective, constraints, verification), never folded by
  compaction, so the model sees the current revision even once the edit's steer
  was folded into a summary.
* "编辑失败不得回退已提交 revision" / "edit 已提交新 revision 但 steer 尚未落盘时也不得轮询旧
  Provider": an edit and its steer (the run's re-planning signal) commit in one
  transaction, or the edit is refused whole; a committed edit wakes the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import cli, ledger_rows, running, wait_run

#: A scripted provider that first writes down what each turn was sent (its task and
#: its history), as a user's provider package: the agent process imports it.
RECORDING = """
import json
from pathlib import Path

from corral.actors.providers.scripted import ScriptedProvider


class Recording(ScriptedProvider):
    def __init__(self, config):
        super().__init__(json.loads(Path(config["script_file"]).read_text()))
        self.record = Path(config["record"])

    async def complete(self, request):
        with self.record.open("a") as out:
            out.write(json.dumps({"loop": request.loop_index, "task": request.task,
                                  "history": json.dumps(list(request.history))}) + "\\n")
        return await super().complete(request)
"""
#: Only the tools it uses offered: every request carries their schemas, and they count toward the limit.
LIMITS = 'tools = ["fs.write", "fs.list", "goal.verdict"]\nauto_compact_token_limit = 900\ntool_output_token_limit = 60'


def _write(path: str) -> dict[str, Any]:
    return {"actions": [{"tool": "fs.write", "input": {"path": path, "content": "a draft"}}]}


_LIST = {"actions": [{"tool": "fs.list", "input": {"path": "."}}]}
_VERDICT = {"actions": [{"tool": "goal.verdict", "input": {"met": True, "evidence": "done for the current goal"}}]}
_FINAL = {"final": "done"}


@pytest.fixture
def recorded(short_tmp: Path) -> Iterator[tuple[Path, Path]]:
    """(the directory the spec and provider live in, the record file)."""
    (short_tmp / "ws").mkdir()
    (short_tmp / "goalrec.py").write_text(RECORDING)
    yield short_tmp, short_tmp / "turns.jsonl"


def _spec(top: Path, script: list[dict[str, Any]], limits: str = "") -> str:
    (top / "script.json").write_text(json.dumps({"steps": script}))
    return f"""
[project]
root = "ws"
[[agents]]
id = "drafter"
provider = "goalrec:Recording"
provider_config = {{ script_file = "{top / "script.json"}", record = "{top / "turns.jsonl"}" }}
{limits}
[agents.policy]
"fs.write" = "confirm"
"""


def _turns(record: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def _objective(n: int) -> str:
    return f"draft the page, edition {n}: " + f"section {n} " * 360


def test_every_turn_carries_the_current_goal_even_after_compaction_folded_the_edit(recorded: tuple[Path, Path]) -> None:
    top, record = recorded
    script = [_write("page.md"), *[_LIST] * 24, _VERDICT, _FINAL]
    with running(top / "h", _spec(top, script, LIMITS)) as daemon:
        run_id: str = daemon.call(
            "run",
            agent_id="drafter",
            goal={"text": "draft the page", "constraints": ["plain words"], "verification": ["page.md exists"]},
        )["run_id"]
        wait_run(daemon, run_id, {"waiting-confirmation"})
        goal_id = daemon.call("goal.status", run_id=run_id)["lifecycle"]["goal_id"]
        edited = cli(
            daemon.home, "goal", "edit", run_id, "draft the page in French", "--expected-revision", "1", "--json"
        )
        assert edited.returncode == 0, edited.stderr
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input", "needs-reconciliation"}, timeout=120)
        assert shown["run"]["status"] == "completed", (shown["run"]["reason"], shown["actions"][-3:])
        steer_seq = ledger_rows(
            daemon.home,
            "SELECT MIN(seq) AS seq FROM observations WHERE run_id = ? AND data"
            " LIKE '%The goal was edited (revision 2)%'",
            run_id,
        )[0]["seq"]
        folded = ledger_rows(daemon.home, "SELECT MAX(to_seq) AS to_seq FROM compactions WHERE run_id = ?", run_id)
    turns = _turns(record)
    first, later = turns[0], turns[1:]
    assert f"goal {goal_id}, revision 1" in first["task"] and "draft the page" in first["task"]
    assert "plain words" in first["task"] and "page.md exists" in first["task"]
    assert len(later) >= 26, "every planning turn after the edit, the final reply's too"
    for turn in later:
        context = turn["task"]
        assert f"goal {goal_id}, revision 2" in context, context[:400]
        assert "Objective: draft the page in French" in context, context[:400]
        assert "plain words" in context and "page.md exists" in context
    assert steer_seq is not None and folded[0]["to_seq"] is not None and folded[0]["to_seq"] >= steer_seq, (
        "compaction folded the edit's steer"
    )
    history = json.loads(later[-1]["history"])
    # The summary covers the turns around the edit; the edit's steer itself is never
    # folded (seed 004 V1.13 and V1.21: steers are "永远不交给摘要模型改写"): it stays after
    # the summary, and the durable context names the goal's current revision anyway.
    assert history[0].get("role") == "summary", history[:1]
    assert [entry.get("kind") for entry in history].count("steer") == 1


def test_an_edit_and_its_steer_commit_together_or_the_edit_is_refused_whole(recorded: tuple[Path, Path]) -> None:
    """Six edits of about 3.7 KB each: the run's steers hold 16 KiB, so the fifth and
    sixth are refused whole (no revision committed, nothing blocked); every committed
    revision has its steer; the run woken by each edit plans for the last revision."""
    top, record = recorded
    script = [_write(f"page{n}.md") for n in range(5)] + [_VERDICT, _FINAL]
    with running(top / "h", _spec(top, script)) as daemon:
        run_id: str = daemon.call("run", agent_id="drafter", goal="draft the page")["run_id"]
        results = []
        for n in range(1, 7):
            waiting = wait_run(daemon, run_id, {"waiting-confirmation"})
            results.append(cli(daemon.home, "goal", "edit", run_id, _objective(n), "--json"))
            if results[-1].returncode != 0:
                continue
            blocked = json.loads(results[-1].stdout)["blocked"]
            assert blocked == [a["action_id"] for a in waiting["actions"] if a["phase"] == "waiting-confirmation"]
        assert [r.returncode == 0 for r in results] == [True] * 4 + [False] * 2, [r.stderr for r in results]
        assert all("16384 bytes" in r.stderr and "nothing was changed" in r.stderr for r in results[4:])
        status = daemon.call("goal.status", run_id=run_id)["lifecycle"]
        assert status["revision"] == 5 and status["text"] == _objective(4).strip(), "the refused edits left nothing"
        edits = ledger_rows(daemon.home, "SELECT data FROM events WHERE kind = 'goal-edited' AND subject = ?", run_id)
        steers = ledger_rows(daemon.home, "SELECT steer_id FROM steers WHERE run_id = ? ORDER BY seq", run_id)
        assert [json.loads(e["data"])["revision"] for e in edits] == [2, 3, 4, 5]
        assert [s["steer_id"].rsplit("-r", 1)[1] for s in steers] == ["2", "3", "4", "5"], "one steer per revision"
        waiting = wait_run(daemon, run_id, {"waiting-confirmation"})
        assert [a["phase"] for a in waiting["actions"]].count("waiting-confirmation") == 1, "not blocked by a refusal"
        approved = cli(daemon.home, "approve", waiting["actions"][-1]["action_id"])
        assert approved.returncode == 0, approved.stderr
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input", "needs-reconciliation"})
        assert shown["run"]["status"] == "completed", shown["run"]
    last = _turns(record)[-1]["task"]
    assert "revision 5" in last and _objective(4).strip()[:60] in last
    assert _objective(5)[:40] not in last and _objective(6)[:40] not in last

"""Token-aware compaction (seed 004 V1.21): a long run folds its older turns into
summaries under a small token limit and still finishes with its plan complete;
the ledger keeps every raw observation; kills mid-compaction lose and duplicate
nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.supervisor.longtask import compaction
from tests.harness import Daemon, agent_spec, ledger_rows, wait_run, wait_supervisor_gone

LOOPS = 52
#: Its one tool offered: every request carries the tool schemas, and they count toward the limit.
LIMITS = 'tools = ["fs.list"]\nauto_compact_token_limit = 700\ntool_output_token_limit = 60'
#: A two-step plan under the seed's rules (V1.17): one step in progress, then both completed.
_PLAN = ('explanation = "list, then report", steps = [{ step = "list the workspace", status = "in_progress" },'
         ' { step = "report", status = "pending" }]')
_DONE = ('explanation = "listed and reported", steps = [{ step = "list the workspace", status = "completed" },'
         ' { step = "report", status = "completed" }]')
STEPS = (
    f'[[agents.steps]]\nplanUpdate = {{ {_PLAN} }}\n'
    + '[[agents.steps]]\nactions = [{ tool = "fs.list", input = { path = "." } }]\n' * LOOPS
    + f'[[agents.steps]]\nplanUpdate = {{ {_DONE} }}\nfinal = "long task done"\n'
)


#: What a cut says, whether it cut a whole text or inside a diff's hunks (its fields whole).
CUT = "the full output stays in the ledger"


def test_the_view_keeps_recent_turns_cuts_big_outputs_and_plans_a_summary() -> None:
    observations = [(n, {"action_id": f"act-{n}", "tool": "fs.read", "status": "ok", "output": "x" * 400})
                    for n in range(1, 7)]
    cut = compaction.view(observations, None, 20)
    assert all(len(entry["output"]) < 200 and "[cut: 101 tokens" in entry["output"] for entry in cut)
    assert observations[0][1]["output"] == "x" * 400, "the ledger's copy is untouched"
    assert compaction.plan(observations, None, {"auto_compact": 10_000}) is None
    todo = compaction.plan(observations, None, {"auto_compact": 100, "tool_output": 20})
    assert todo is not None and todo["to_seq"] == 2 and len(todo["entries"]) == 2, "the newest 4 stay as they are"
    folded = {"from_seq": 1, "to_seq": todo["to_seq"], "summary": "earlier: six reads"}
    after = compaction.view(observations, folded, 20)
    assert after[0] == {"role": "summary", "text": "earlier: six reads", "covers": [1, 2]} and len(after) == 5
    assert compaction.plan(observations, folded, {"auto_compact": 10}) is None, "four recent observations are kept"
    assert compaction.plan(observations, None, {}, requested=True) is not None


def test_the_latest_content_diff_is_kept_whole_and_never_folded_into_a_summary() -> None:
    """V1.3: "最新内容 diff 不走普通 observation detail 的…压缩，而是…最多保留 24,256 字符并作为窗口
    压缩保护项": the newest successful ``project.diff`` is not cut at the tool-output
    limit, stays in view (up to 24,256 characters) when older turns are summarised,
    and is not folded into the summary; an older diff is an ordinary observation."""
    def diff(n: int, text: str) -> tuple[int, dict[str, Any]]:
        return n, {"action_id": f"act-{n}", "tool": "project.diff", "status": "ok",
                   "output": {"files": [{"path": "a.py", "diff": text}], "truncated": False}}

    reads = [(n, {"action_id": f"act-{n}", "tool": "fs.read", "status": "ok", "output": "x" * 400})
             for n in range(3, 9)]
    observations = [diff(1, "-old\n+older\n" * 300), diff(2, "-a\n+b\n" * 1000), *reads]
    seen = compaction.view(observations, None, 20)
    assert CUT in json.dumps(seen[0]["output"]) and seen[1] == observations[1][1], "the latest diff stays whole"
    todo = compaction.plan(observations, None, {"auto_compact": 100, "tool_output": 20})
    assert todo is not None and todo["to_seq"] == 4
    assert [entry["action_id"] for entry in todo["entries"]] == ["act-1", "act-3", "act-4"], "not in the summary"
    folded = {"from_seq": 1, "to_seq": todo["to_seq"], "summary": "earlier: a diff and reads"}
    after = compaction.view(observations, folded, 20)
    assert after[0]["role"] == "summary" and after[1] == observations[1][1], "still in view after the summary"
    assert [entry.get("action_id") for entry in after[2:]] == ["act-5", "act-6", "act-7", "act-8"]
    huge = [diff(1, "+" + "y" * 40_000)]
    kept = compaction.view(huge, None, 20)[0]
    assert 24_000 < len(json.dumps(kept["output"])) <= compaction.PROTECTED_DIFF_CHARS + 300
    assert CUT in json.dumps(kept["output"])


def test_the_latest_action_history_is_kept_whole_beside_the_latest_diff() -> None:
    """V1.9: "context compaction 额外保护最新成功的 agent.action_history 原始
    observation，不能让后续状态轮询或普通只读观察把动作回查证据挤出最终 bundle": the
    newest successful ``agent.action_history`` is not cut at the tool-output limit,
    is not folded into a summary, and stays in view after it, together with the
    newest diff; an older or failed history is an ordinary observation."""
    def history(n: int, status: str = "ok") -> tuple[int, dict[str, Any]]:
        receipts = [{"action_id": f"act-{n}-{i}", "run_id": "run-1", "tool": "fs.read", "status": "ok",
                     "fingerprint": "f" * 64, "result_summary": "read a file " * 8} for i in range(5)]
        return n, {"action_id": f"act-{n}", "tool": "agent.action_history", "status": status,
                   "output": {"agent_id": "a", "receipts": receipts, "more": False}}

    diff = (3, {"action_id": "act-3", "tool": "project.diff", "status": "ok",
                "output": {"files": [{"path": "a.py", "diff": "-a\n+b\n" * 200}], "truncated": False}})
    polls = [(n, {"action_id": f"act-{n}", "tool": "agent.run_status", "status": "ok", "output": "x" * 400})
             for n in range(5, 11)]
    observations = [history(1), history(2), diff, history(4, "failed"), *polls]
    seen = compaction.view(observations, None, 20)
    assert seen[1] == observations[1][1], "the latest successful history stays whole"
    assert CUT in json.dumps(seen[0]["output"]) and CUT in json.dumps(seen[3]["output"])
    todo = compaction.plan(observations, None, {"auto_compact": 100, "tool_output": 20})
    assert todo is not None and todo["to_seq"] == 6
    folded_ids = [entry["action_id"] for entry in todo["entries"]]
    assert folded_ids == ["act-1", "act-4", "act-5", "act-6"], "neither protected one is in the summary"
    folded = {"from_seq": 1, "to_seq": todo["to_seq"], "summary": "earlier: histories, a diff, polls"}
    after = compaction.view(observations, folded, 20)
    assert after[0]["role"] == "summary"
    assert after[1:3] == [observations[1][1], diff[1]], "both still in view after the summary, oldest first"
    assert [entry.get("action_id") for entry in after[3:]] == ["act-7", "act-8", "act-9", "act-10"]


def _daemon(tmp: Path) -> Daemon:
    (tmp / "ws").mkdir()
    spec = tmp / "spec.toml"
    spec.write_text(agent_spec(steps=STEPS, policy=LIMITS))
    return Daemon(tmp / "h", spec)


def _check(daemon: Daemon, run_id: str) -> None:
    shown = wait_run(daemon, run_id, {"completed", "failed"}, timeout=120)
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "long task done"
    assert [s["status"] for s in shown["plan"]["steps"]] == ["completed", "completed"]
    events = [json.loads(e["data"]) for e in ledger_rows(
        daemon.home, "SELECT data FROM events WHERE kind = 'context-compacted' AND subject = ? ORDER BY cursor",
        run_id)]
    rows = ledger_rows(daemon.home, "SELECT to_seq FROM compactions WHERE run_id = ? ORDER BY to_seq", run_id)
    assert len(events) >= 3, "a 50-step task under a 400-token limit compacts several times"
    assert [e["to_seq"] for e in events] == [r["to_seq"] for r in rows], "each range once, none twice"
    assert all(e["tokens_after"] < e["tokens_before"] for e in events)
    assert [e["to_seq"] for e in events] == sorted({e["to_seq"] for e in events})
    observations = ledger_rows(daemon.home, "SELECT source FROM observations WHERE run_id = ?", run_id)
    assert len(observations) >= LOOPS + 2, "the raw conversation stays in the ledger"
    assert shown["context"]["compactions"][-1]["to_seq"] == rows[-1]["to_seq"]


def test_a_fifty_step_task_compacts_several_times_and_finishes_its_plan(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a long task")["run_id"]
        _check(daemon, run_id)
    finally:
        daemon.shutdown()


@pytest.mark.parametrize(("failpoint", "action"), [("context.after-compact", "kill"),
                                                   ("context.mid-compaction", "kill")])
def test_a_kill_during_a_compaction_loses_and_duplicates_nothing(short_tmp: Path, failpoint: str,
                                                                 action: str) -> None:
    daemon = _daemon(short_tmp)
    try:
        first = daemon.up(env={"CORRAL_FAILPOINTS": f"{failpoint}={action}@once"})
        run_id = daemon.call("run", agent_id="writer", task="a long task")["run_id"]
        if failpoint.startswith("context.after"):
            wait_supervisor_gone(daemon, first.pid)
            daemon.up()
        _check(daemon, run_id)
        assert (daemon.home / "failpoints" / f"{failpoint}.fired").exists()
    finally:
        daemon.shutdown()


def test_corral_compact_asks_for_a_compaction_now(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    steps = '[[agents.steps]]\nactions = [{ tool = "fs.list", input = { path = "." } }]\n' * 4
    spec.write_text(agent_spec(steps=steps + '[[agents.steps]]\nfinal = "ok"\n'))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        with pytest.raises(Exception, match="no run"):
            daemon.call("compact", run_id="run-nosuchrun00")
        script = {"steps": [{"actions": [{"tool": "fs.list", "input": {"path": "."}}]}] * 4 + [
            {"actions": [{"tool": "user.input_request", "input": {"questions": [
                {"id": "go_on", "header": "Continue", "question": "go on?",
                 "options": [{"label": "yes", "description": "carry on"}, {"label": "no", "description": "stop"}]}]}}]},
            {"final": "ok"}]}
        run_id = daemon.call("run", agent_id="writer", task="short", script=json.dumps(script))["run_id"]
        wait_run(daemon, run_id, {"needs-input"})
        from tests.harness import cli

        asked = cli(daemon.home, "compact", run_id, "--json")
        assert asked.returncode == 0 and json.loads(asked.stdout)["requested"] is True, asked.stderr
        (request,) = [q for q in daemon.call("pending")["questions"] if q["run_id"] == run_id]
        daemon.call("answer", run_id=run_id, request_id=request["request_id"], response_id="resp-yes", text="yes")
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        assert len(shown["context"]["compactions"]) == 1, "the default limits are far: only the asked-for compaction"
        assert ledger_rows(daemon.home, "SELECT * FROM compaction_requests") == []
    finally:
        daemon.shutdown()


def test_the_limits_default_to_the_seeds_and_the_auto_limit_stays_below_the_window(short_tmp: Path) -> None:
    """The seed (V1.21): "发布默认值分别为 128000 / 64000 / 12000"; "三项都必须大于 0，自动阈值必须小于
    context window，并为当前请求的 maxOutputTokens 与固定安全余量留下空间"; "至少保留…最近 4 条 observation
    原文"."""
    from corral.supervisor.spec.swarm_spec import SpecError, parse_spec

    assert compaction.KEEP_RECENT == 4
    agent: dict[str, Any] = {"id": "writer", "steps": [{"final": "ok"}]}
    for bad, why in [
        ({"context_window": 8192, "auto_compact_token_limit": 8192}, "below context_window"),
        ({"auto_compact_token_limit": 200_000}, "below context_window"),
        ({"context_window": 0}, "between 256"),
        ({"context_window": 8192, "auto_compact_token_limit": 7000, "provider": "openai",
          "openai": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_tokens": 1024}}, "no room"),
    ]:
        with pytest.raises(SpecError, match=why):
            parse_spec({"project": {"root": str(short_tmp)}, "agents": [{**agent, **bad}]})
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    small = '[[agents]]\nid = "small"\ncontext_window = 8192\n[[agents.steps]]\nfinal = "ok"\n'
    spec.write_text(agent_spec(steps='[[agents.steps]]\nfinal = "ok"\n', extra="") + small)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        for agent_id, limits in [("writer", {"window": 128_000, "auto_compact": 64_000, "tool_output": 12_000}),
                                 ("small", {"window": 8192, "auto_compact": 6144, "tool_output": 6144})]:
            run_id = daemon.call("run", agent_id=agent_id, task="short")["run_id"]
            assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"
            [row] = ledger_rows(daemon.home, "SELECT options FROM runs WHERE run_id = ?", run_id)
            assert json.loads(row["options"])["context"] == limits
    finally:
        daemon.shutdown()


def _git_review(n: int, text: str, tool: str = "project.git_inspect", status: str = "ok") -> tuple[int, dict[str, Any]]:
    output: dict[str, Any] = ({"diff": text} if tool == "project.git_diff" else
                              {"head": "a" * 40, "branch": "main", "staged": [], "unstaged": ["a.py"],
                               "untracked": [], "diff": {"staged": "", "unstaged": text}, "diff_files": ["a.py"],
                               "truncated": False})
    return n, {"action_id": f"act-{n}", "tool": tool, "status": status, "output": output}


def test_the_latest_git_diff_is_kept_whole_in_its_own_slot_beside_the_latest_content_diff() -> None:
    """V1.4: "最新成功 Git diff 在 context bundle 中按内容 diff 保护项最多保留 24,256 字符", and
    V1.5: "checkpoint 内容 diff 与 Git 工作树 diff 使用两个独立保护槽。后续 git.inspect 不得再挤掉已完成
    project.diff 的 checkpointId/hunk，反之亦然": the newest successful git diff (a
    ``project.git_inspect`` with its diff, or a ``project.git_diff``) is not cut, not folded
    into a summary, and a later review without a diff, or a failed one, does not displace it."""
    content = (2, {"action_id": "act-2", "tool": "project.diff", "status": "ok",
                   "output": {"files": [{"path": "a.py", "diff": "-a\n+b\n" * 200}], "truncated": False}})
    status_only = (4, {"action_id": "act-4", "tool": "project.git_inspect", "status": "ok",
                       "output": {"head": None, "branch": "main", "staged": [], "unstaged": ["a.py"], "untracked": [],
                                  "truncated": False}})
    reads = [(n, {"action_id": f"act-{n}", "tool": "fs.read", "status": "ok", "output": "x" * 400})
             for n in range(6, 12)]
    observations = [_git_review(1, "-o\n+p\n" * 300), content, _git_review(3, "-c\n+d\n" * 300), status_only,
                    _git_review(5, "-e\n+f\n" * 300, status="failed"), *reads]
    seen = compaction.view(observations, None, 20)
    assert seen[1] == content[1] and seen[2] == observations[2][1], "both diffs stay whole, each in its slot"
    older = json.dumps(seen[0]["output"])
    assert CUT in older, "an older git diff is an ordinary observation"
    todo = compaction.plan(observations, None, {"auto_compact": 100, "tool_output": 20})
    assert todo is not None and todo["to_seq"] == 7
    folded_ids = [entry["action_id"] for entry in todo["entries"]]
    assert folded_ids == ["act-1", "act-4", "act-5", "act-6", "act-7"], "neither protected diff is in the summary"
    folded = {"from_seq": 1, "to_seq": todo["to_seq"], "summary": "earlier: reviews and reads"}
    after = compaction.view(observations, folded, 20)
    assert after[1:3] == [content[1], observations[2][1]], "both still in view after the summary, oldest first"
    plain = [_git_review(1, "-a\n+b\n" * 300), _git_review(2, "-g\n+h\n" * 300, tool="project.git_diff")]
    assert compaction.view(plain, None, 20)[1] == plain[1][1], "a project.git_diff is the newest git diff too"
    huge = [_git_review(1, "+" + "y" * 40_000)]
    kept = compaction.view(huge, None, 20)[0]
    # Its 24,256 characters of diff, and its fields whole beside them.
    assert 24_000 < len(json.dumps(kept["output"])) <= compaction.PROTECTED_GIT_DIFF_CHARS + 400


def test_the_memo_keeps_the_same_git_diff_slot_as_the_view() -> None:
    """compaction_memo.py keeps the protected observations by the same slots: its view of
    the same observations is ``compaction.view``'s."""
    from corral.supervisor.longtask import compaction_memo

    content = (2, {"action_id": "act-2", "tool": "project.diff", "status": "ok",
                   "output": {"files": [{"path": "a.py", "diff": "-a\n+b\n" * 200}], "truncated": False}})
    observations = [_git_review(1, "-o\n+p\n" * 300), content, _git_review(3, "-c\n+d\n" * 300),
                    _git_review(4, "-e\n+f\n" * 300, tool="project.git_diff"),
                    *[(n, {"action_id": f"act-{n}", "tool": "fs.read", "status": "ok", "output": "x" * 400})
                      for n in range(5, 9)]]
    limits = {"auto_compact": 100, "tool_output": 20}
    memo = compaction_memo.RunMemo(compaction_memo.key_of(limits, None, None), None)
    memo.add_rows([{"seq": seq, "data": json.dumps(entry)} for seq, entry in observations])
    memo.extend_shown(False)
    assert memo.view() == compaction.view(observations, None, 20)
    assert memo.view()[3] == observations[3][1] and CUT in json.dumps(memo.view()[2]["output"])
    assert memo.tokens(compaction.estimate_tokens) == sum(
        compaction.estimate_tokens(entry) for entry in compaction.view(observations, None, 20))


def test_a_steer_is_never_folded_and_stays_in_its_order_after_a_summary() -> None:
    """Seed 004 V1.13: the provider prompt renders the run's ordered steers ("单独渲染有序
    '运行中用户追加指令'"), and V1.21: they are "永远不交给摘要模型改写". A summary covers the
    turns around a steer, never the steer: it is not in what the summary model reads, and
    the view shows it after the summary, in its order, in the memo as in the view."""
    from corral.supervisor.longtask import compaction_memo

    def steer(n: int, text: str) -> tuple[int, dict[str, Any]]:
        return n, {"role": "user", "kind": "steer", "steer_id": f"str-{n}", "text": text}

    reads = [(n, {"action_id": f"act-{n}", "tool": "fs.read", "status": "ok", "output": "x" * 400})
             for n in (1, 2, 4, 5, 7, 8, 9, 10, 11, 12)]
    observations = sorted([*reads, steer(3, "use tabs"), steer(6, "and name it v2")], key=lambda o: o[0])
    limits = {"auto_compact": 100, "tool_output": 20}
    todo = compaction.plan(observations, None, limits)
    assert todo is not None and todo["to_seq"] >= 6  # the fold reaches past both steers
    assert not any(entry.get("kind") == "steer" for entry in todo["entries"]), "no steer goes to the summary model"
    folded = {"from_seq": 1, "to_seq": todo["to_seq"], "summary": "read files"}
    after = compaction.view(observations, folded, 20)
    assert after[0]["role"] == "summary"
    assert [entry["text"] for entry in after if entry.get("kind") == "steer"] == ["use tabs", "and name it v2"]
    memo = compaction_memo.RunMemo(compaction_memo.key_of(limits, folded, None), folded)
    memo.add_rows([{"seq": seq, "data": json.dumps(entry)} for seq, entry in observations])
    memo.extend_shown(False)
    assert memo.view() == after
    assert memo.tokens(compaction.estimate_tokens) == sum(compaction.estimate_tokens(entry) for entry in after)


def test_a_steer_reaches_the_model_as_the_users_word_never_above_the_rules() -> None:
    """Seed 004 V1.13: a later instruction corrects the task, "但不能覆盖" the system rules,
    the policy, approvals or the sandbox: the steer says so where the model reads it."""
    from corral.actors.providers.chat_history import history_messages

    (message,) = history_messages(({"role": "user", "kind": "steer", "steer_id": "str-1", "text": "use tabs"},))
    assert message["role"] == "user" and message["content"].endswith(
        "use tabs Review the unfinished steps of your plan against it before you go on.")
    assert "never over corral's rules, the policy, approvals or the sandbox" in message["content"]

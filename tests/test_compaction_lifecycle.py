"""Seed 004 V1.21, V1.39 and V1.40 on the compaction request, as a strict re-audit
read them: "compaction 请求…复用 V1.18 Provider lifecycle/orphan barrier；未知 started…进入
needs-reconciliation，绝不重发", and its transient failure waits durably as a planning
turn's does ("该请求前自动触发的 context-compaction…持久等待态"; attempt and retry_at
kept across a kill). Real processes: the supervisor, the agent and an
OpenAI-compatible fake server that reads what it is sent."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fake_openai import FakeOpenAIServer, Reply, completion, tool_call
from loopback_http import serve_in_thread
from tests.harness import Daemon, ledger_rows, retry_due_while_down, wait_run

#: What the agent asks a model for a summary with (actors/agent.py SUMMARY_TASK).
SUMMARY_ASK = b"Summarise the conversation so far"
#: The summary the fake model writes; a planning turn that shows it comes after the compaction.
SUMMARY = "EARLIER-SUMMARY: the workspace was listed many times"
#: Planning turns after which the fake model stops anyway (a broken build must not loop forever).
MAX_TURNS = 60
KEY = "sk-fakeKEY0123456789abcdefghijklmn"


def _spec(tmp: Path, url: str) -> Path:
    (tmp / "ws").mkdir()
    for n in range(60):
        (tmp / "ws" / f"a-file-with-a-rather-long-name-number-{n:03}.txt").write_text("x")
    spec = tmp / "spec.toml"
    spec.write_text(f"""
[project]
root = "ws"
[[agents]]
id = "llm"
provider = "openai"
tools = ["fs.list"]
retry_base_s = 3600
retry_cap_s = 86400
auto_compact_token_limit = 6000
tool_output_token_limit = 400
[agents.openai]
base_url = "{url}"
model = "fake-model"
timeout_s = 3
structured = "tools"
""")
    return spec


class Model:
    """The fake model: lists the workspace until it sees its summary, then replies;
    the summary requests are answered by ``summaries`` in turn."""

    def __init__(self, summaries: list[Reply]) -> None:
        self.summaries = summaries
        self.asked_to_summarise = 0
        self.turns = 0

    def __call__(self, body: bytes) -> Reply:
        if SUMMARY_ASK in body:
            self.asked_to_summarise += 1
            return self.summaries.pop(0) if self.summaries else Reply(body=completion(SUMMARY))
        self.turns += 1
        if SUMMARY.encode() in body or self.turns >= MAX_TURNS:
            return Reply(body=completion("all done" if SUMMARY.encode() in body else "never compacted"))
        return Reply(body=completion(tool_calls=[tool_call("fs.list", {"path": "."})]))


def _server(model: Model) -> FakeOpenAIServer:
    script: list[Callable[[bytes], Reply]] = [model] * (3 * MAX_TURNS)
    return FakeOpenAIServer(script, keep_bodies=True)


def _compaction_rows(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    rows = ledger_rows(daemon.home, "SELECT slot, attempt, status, request_kind FROM provider_requests"
                       " WHERE run_id = ? AND slot LIKE ? ORDER BY rowid", run_id, f"{run_id}:compact-%")
    return [dict(row) for row in rows]


def test_a_compaction_request_lost_with_its_process_is_never_sent_again(short_tmp: Path) -> None:
    model = Model([Reply(body=completion(SUMMARY), delay_ms=60_000)])
    server = _server(model)
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="list the workspace until told")["run_id"]
            server.log.wait_until_blocking(lambda records: any(SUMMARY_ASK in (r.body or b"") for r in records), 60)
            daemon.kill_supervisor()
            daemon.up()
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "needs-reconciliation", "a lost compaction is not asked again"
            assert model.asked_to_summarise == 1
            [row] = _compaction_rows(daemon, run_id)
            assert row["status"] == "needs-reconciliation" and row["request_kind"] == "context-compaction"
            assert row["slot"] in [r["slot"] for r in daemon.call("pending")["provider_requests"]]
            assert ledger_rows(daemon.home, "SELECT * FROM compactions WHERE run_id = ?", run_id) == []
        finally:
            daemon.shutdown()


def test_a_transient_compaction_failure_waits_durably_across_a_kill(short_tmp: Path) -> None:
    # The first summary request is never answered: the agent's 3 s timeout, a transient failure.
    model = Model([Reply(hang=True)])
    server = _server(model)
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="list the workspace until told")["run_id"]
            shown = wait_run(daemon, run_id, {"waiting-for-provider-retry", "completed", "failed"}, timeout=120)
            assert shown["run"]["status"] == "waiting-for-provider-retry", "no digest stands in for a failed ask"
            before = daemon.call("pending")["provider_retries"]
            [waiting] = before
            assert waiting["slot"].startswith(f"{run_id}:compact-") and waiting["retry_at"] > time.time() + 3000
            daemon.kill_supervisor()
            daemon.up()
            assert daemon.call("pending")["provider_retries"] == before, "a kill keeps attempt and retry_at"
            assert model.asked_to_summarise == 1, "never asked again before retry_at"
            retry_due_while_down(daemon, run_id)  # the clock passes retry_at while it is down
            daemon.up()
            shown = wait_run(daemon, run_id, {"completed", "failed"}, timeout=120)
            assert shown["run"]["status"] == "completed" and shown["final_reply"] == "all done"
            assert model.asked_to_summarise == 2
            slot = waiting["slot"]
            assert [(r["slot"], r["attempt"], r["status"]) for r in _compaction_rows(daemon, run_id)] == [
                (slot, 0, "failed"), (f"{slot}-transient-1", 1, "completed")]
            [compacted] = ledger_rows(daemon.home, "SELECT summary FROM compactions WHERE run_id = ?", run_id)
            assert compacted["summary"] == SUMMARY
            # The run's view shows the context's numbers, never the summary ("/status…展示
            # estimatedInputTokens / autoCompactTokenLimit / lastPromptTokens / lastCompletionTokens /
            # compactionRevision / lastCompactedAt"); the fake model reports 1 and 1 token.
            context = shown["context"]
            assert context["auto_compact_token_limit"] == 6000 and context["compaction_revision"] == 1
            assert 0 < context["estimated_input_tokens"] <= 6000
            assert context["last_prompt_tokens"] == 1 and context["last_completion_tokens"] == 1
            assert context["last_compacted_at"] == context["compactions"][-1]["created_at"]
            assert SUMMARY not in json.dumps(context)
        finally:
            daemon.shutdown()

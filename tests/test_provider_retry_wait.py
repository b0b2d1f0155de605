"""A run waiting for its provider retry (seed 004 V1.39, V1.40), live: real
supervisors, agents and an OpenAI-compatible server behind a fault proxy.

- It holds its own agent's queue (FIFO per agent) and no other agent's.
- A steer drops the pending retry at once: the run plans again with the steer.
- ``corral resume`` never sends a retry before its ``retry_at``.

A retry_at is an hour away in each of these tests, so no timer fires by itself
while they run; where the retry must fall due, the clock passes ``retry_at`` while
the supervisor is down (``retry_due_while_down``), never a sleep.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from fake_openai import FakeOpenAIServer, Reply, completion
from fault_proxy import Fault, FaultProxy
from loopback_http import serve_in_thread
from tests.harness import Daemon, ledger_rows, retry_due_while_down, show, wait_run

KEY = "sk-decoyKEY0123456789abcdefghijkl"


def _spec(tmp: Path, url: str, agents: tuple[str, ...] = ("llm",)) -> Path:
    (tmp / "ws").mkdir(exist_ok=True)
    blocks = "".join(
        f"""
[[agents]]
id = "{agent}"
provider = "openai"
retry_base_s = 3600
retry_cap_s = 86400
[agents.openai]
base_url = "{url}"
model = "fake-model"
timeout_s = 5
structured = "tools"
"""
        for agent in agents
    )
    spec = tmp / "spec.toml"
    spec.write_text(f'[project]\nroot = "ws"\n{blocks}')
    return spec


def _answer(body: bytes) -> Reply:
    """A model that names the task it was given (its request says which run it is)."""
    for task in ("first task", "second task", "other task"):
        if task.encode() in body:
            return Reply(body=completion(f"done: {task}"))
    return Reply(body=completion("done: ?"))


def _tasks(server: FakeOpenAIServer) -> list[str]:
    """Which run each request the server got was for, in arrival order."""
    named = []
    for record in server.requests:
        assert record.body is not None
        named.append(next((t for t in ("first", "second", "other") if f"{t} task".encode() in record.body), "?"))
    return named


def test_a_run_waiting_for_its_retry_holds_its_agents_queue_and_no_other(short_tmp: Path) -> None:
    # "waiting-for-provider-retry 释放当前执行 lane，因此其它 Agent 可继续并行；同 Agent 后续
    # pending task 仍被该 running task 阻挡，保持 FIFO"
    server = FakeOpenAIServer(default=None, keep_bodies=True)
    server.add(*[_answer] * 3)
    with serve_in_thread(server) as upstream:
        proxy = FaultProxy(upstream, {1: Fault.drop()})
        with serve_in_thread(proxy) as url:
            daemon = Daemon(short_tmp / "h", _spec(short_tmp, url, ("llm", "other")), env={"OPENAI_API_KEY": KEY})
            try:
                daemon.up()
                first = daemon.call("run", agent_id="llm", task="first task")["run_id"]
                wait_run(daemon, first, {"waiting-for-provider-retry"})
                second = daemon.call("run", agent_id="llm", task="second task")["run_id"]
                other = daemon.call("run", agent_id="other", task="other task")["run_id"]
                # Another agent runs while the first run waits: its lane was given up.
                assert wait_run(daemon, other, {"completed", "failed"})["run"]["status"] == "completed"
                assert show(daemon, first)["run"]["status"] == "waiting-for-provider-retry"
                # The same agent's later run waits behind it, whatever the agent was told.
                daemon.call("wake_pending")
                assert show(daemon, second)["run"]["status"] == "pending"
                assert _tasks(server) == ["other"]

                retry_due_while_down(daemon, first)
                daemon.up()
                done = wait_run(daemon, second, {"completed", "failed"})
                assert done["run"]["status"] == "completed"
                assert done["final_reply"] == "done: second task"
                shown = show(daemon, first)
                assert shown["final_reply"] == "done: first task"
                assert [(r["slot"], r["status"]) for r in shown["provider_requests"]] == [
                    (f"{first}:0", "failed"),
                    (f"{first}:0-transient-1", "completed"),
                ]
                # FIFO: the first run's retry and its end came before the second run's request.
                assert _tasks(server) == ["other", "first", "second"]
                (ended,) = ledger_rows(daemon.home, "SELECT ended_at FROM runs WHERE run_id = ?", first)
                (began,) = ledger_rows(
                    daemon.home, "SELECT MIN(started_at) AS at FROM provider_requests WHERE run_id = ?", second
                )
                assert began["at"] >= ended["ended_at"]
            finally:
                daemon.shutdown()


def test_a_steer_drops_the_pending_retry_and_the_run_plans_again_at_once(short_tmp: Path) -> None:
    # "cancel、终态、重试耗尽和有效 steer 会删除旧 sidecar；steer 使用同一 run 的新 cursor 重新规划，
    # 不复用旧 attempt"
    server = FakeOpenAIServer(
        [lambda body: Reply(body=completion("steered" if b"answer in French" in body else "not steered"))],
        keep_bodies=True,
    )
    with serve_in_thread(server) as upstream:
        proxy = FaultProxy(upstream, {1: Fault.drop()})
        with serve_in_thread(proxy) as url:
            daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": KEY})
            try:
                daemon.up()
                run_id = daemon.call("run", agent_id="llm", task="first task")["run_id"]
                wait_run(daemon, run_id, {"waiting-for-provider-retry"})
                assert daemon.call("pending")["provider_retries"][0]["retry_at"] > time.time() + 3000
                daemon.call("steer", run_id=run_id, text="answer in French")
                # Not an hour later: at once, in a new loop, a new request (attempt 0).
                shown = wait_run(daemon, run_id, {"completed", "failed"})
                assert shown["run"]["status"] == "completed"
                assert shown["final_reply"] == "steered"
                assert [(r["slot"], r["attempt"], r["status"]) for r in shown["provider_requests"]] == [
                    (f"{run_id}:0", 0, "failed"),
                    (f"{run_id}:1", 0, "completed"),
                ]
                assert daemon.call("pending")["provider_retries"] == []
                superseded = [e for e in daemon.events() if e["kind"] == "retry-superseded"]
                assert [(e["subject"], e["data"]["slot"], e["data"]["changed"]) for e in superseded] == [
                    (run_id, f"{run_id}:0", ["steer"])
                ]
                assert len(proxy.requests) == 2 and len(server.requests) == 1
            finally:
                daemon.shutdown()


def test_resume_never_sends_a_retry_before_its_retry_at(short_tmp: Path) -> None:
    # "重启不得清零 attempt，也不得因进程启动提前发送 ... 重复 resume 或到期通知不能制造第二个物理请求"
    server = FakeOpenAIServer([Reply(body=completion("all done"))])
    with serve_in_thread(server) as upstream:
        proxy = FaultProxy(upstream, {1: Fault.drop()})
        with serve_in_thread(proxy) as url:
            daemon = Daemon(short_tmp / "h", _spec(short_tmp, url), env={"OPENAI_API_KEY": KEY})
            try:
                daemon.up()
                run_id = daemon.call("run", agent_id="llm", task="first task")["run_id"]
                wait_run(daemon, run_id, {"waiting-for-provider-retry"})
                before = daemon.call("pending")["provider_retries"]
                for _ in range(2):
                    assert daemon.call("resume", run_id=run_id)["status"] == "waiting-for-provider-retry"
                assert daemon.call("pending")["provider_retries"] == before
                assert show(daemon, run_id)["run"]["status"] == "waiting-for-provider-retry"
                kinds = [e["kind"] for e in daemon.events()]
                assert "provider-request-started" in kinds and kinds.count("provider-request-started") == 1
                assert len(proxy.requests) == 1
            finally:
                daemon.shutdown()


def test_a_retry_whose_request_changed_is_superseded_and_a_new_request_is_sent(short_tmp: Path) -> None:
    # V1.39 "到期后先重新校验…Provider 配置和重建请求指纹"; V1.40 "请求…任一稳定身份变化时，旧
    # sidecar 删除并记录仅含字段名的 retry_superseded 审计，随后同一 run 回到新 planning；不得…继续旧
    # attempt". AGENTS.md is edited during the wait: the old attempt never goes out with a new body.
    server = FakeOpenAIServer(
        [lambda body: Reply(body=completion("verbose" if b"Be verbose." in body else "brief"))], keep_bodies=True
    )
    with serve_in_thread(server) as upstream:
        proxy = FaultProxy(upstream, {1: Fault.drop()})
        with serve_in_thread(proxy) as url:
            spec = _spec(short_tmp, url)
            (short_tmp / "ws" / "AGENTS.md").write_text("# Rules\n\nBe brief.\n")
            daemon = Daemon(short_tmp / "h", spec, env={"OPENAI_API_KEY": KEY})
            try:
                daemon.up()
                run_id = daemon.call("run", agent_id="llm", task="first task")["run_id"]
                wait_run(daemon, run_id, {"waiting-for-provider-retry"})
                (kept,) = ledger_rows(
                    daemon.home, "SELECT request_identity FROM provider_requests WHERE slot = ?", f"{run_id}:0"
                )
                assert "Be brief" not in kept["request_identity"], "digests only"
                (short_tmp / "ws" / "AGENTS.md").write_text("# Rules\n\nBe verbose.\n")
                retry_due_while_down(daemon, run_id)
                daemon.up()
                shown = wait_run(daemon, run_id, {"completed", "failed"})
                assert shown["run"]["status"] == "completed"
                assert shown["final_reply"] == "verbose"
                # No -transient-1 lifecycle at all: a new loop, a new request, attempt 0.
                assert [(r["slot"], r["attempt"], r["status"]) for r in shown["provider_requests"]] == [
                    (f"{run_id}:0", 0, "failed"),
                    (f"{run_id}:1", 0, "completed"),
                ]
                superseded = [e for e in daemon.events() if e["kind"] == "retry-superseded"]
                assert [(e["subject"], e["data"]["slot"], e["data"]["changed"]) for e in superseded] == [
                    (run_id, f"{run_id}:0", ["project_context"])
                ]
                assert len(proxy.requests) == 2 and len(server.requests) == 1
            finally:
                daemon.shutdown()


def test_an_unchanged_request_is_retried_as_the_same_attempt_with_the_same_body(short_tmp: Path) -> None:
    # "再沿原 Session/run/loop/attempt 发出一个物理请求" ... "失败与恢复两次 HTTP body 必须逐字节相同"
    server = FakeOpenAIServer([Reply(body=completion("lost")), Reply(body=completion("all done"))], keep_bodies=True)
    with serve_in_thread(server) as upstream:
        proxy = FaultProxy(upstream, {1: Fault.drop("response")})  # the server sees both bodies
        with serve_in_thread(proxy) as url:
            spec = _spec(short_tmp, url)
            (short_tmp / "ws" / "AGENTS.md").write_text("# Rules\n\nBe brief.\n")
            daemon = Daemon(short_tmp / "h", spec, env={"OPENAI_API_KEY": KEY})
            try:
                daemon.up()
                run_id = daemon.call("run", agent_id="llm", task="first task")["run_id"]
                wait_run(daemon, run_id, {"waiting-for-provider-retry"})
                retry_due_while_down(daemon, run_id)
                daemon.up()  # a new supervisor and a new agent process rebuild the request
                shown = wait_run(daemon, run_id, {"completed", "failed"})
                assert shown["run"]["status"] == "completed"
                assert [(r["slot"], r["attempt"], r["status"]) for r in shown["provider_requests"]] == [
                    (f"{run_id}:0", 0, "failed"),
                    (f"{run_id}:0-transient-1", 1, "completed"),
                ]
                assert [e for e in daemon.events() if e["kind"] == "retry-superseded"] == []
                first, retry = (record.body for record in server.requests)
                assert first is not None and first == retry, "the same request, byte for byte"
            finally:
                daemon.shutdown()


def test_a_goal_paused_and_resumed_during_the_wait_keeps_the_same_request_and_attempt(short_tmp: Path) -> None:
    # "Goal pause 保留 sidecar且零请求，resume 校验完整身份后恢复原等待态；即使暂停跨越秒级时间边界，也必须
    # 保留相同 request fingerprint 和 -transient-N slot"
    verdict = {"actions": [{"tool": "goal.verdict", "input": {"met": True, "evidence": "notes"}}], "planUpdate": None}
    server = FakeOpenAIServer(
        [
            Reply(body=completion("lost")),
            Reply(body=completion(json.dumps(verdict))),
            Reply(body=completion('{"final": "done", "planUpdate": null}')),
        ],
        keep_bodies=True,
    )
    with serve_in_thread(server) as upstream:
        proxy = FaultProxy(upstream, {1: Fault.drop("response")})  # the server sees both bodies
        with serve_in_thread(proxy) as url:
            spec = _spec(short_tmp, url)
            spec.write_text(spec.read_text().replace('structured = "tools"\n', ""))
            daemon = Daemon(short_tmp / "h", spec, env={"OPENAI_API_KEY": KEY})
            try:
                daemon.up()
                run_id = daemon.call("run", agent_id="llm", goal="write the notes")["run_id"]
                wait_run(daemon, run_id, {"waiting-for-provider-retry"})
                before = daemon.call("pending")["provider_retries"]
                daemon.call("goal.pause", run_id=run_id)
                assert daemon.call("goal.resume", run_id=run_id)["status"] == "active"
                assert daemon.call("pending")["provider_retries"] == before, "zero requests, the same wait"
                assert len(proxy.requests) == 1
                retry_due_while_down(daemon, run_id)
                daemon.up()
                shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input"})
                assert shown["run"]["status"] == "completed", shown["run"]
                slots = [(r["slot"], r["attempt"], r["status"]) for r in shown["provider_requests"]]
                assert slots[:2] == [(f"{run_id}:0", 0, "failed"), (f"{run_id}:0-transient-1", 1, "completed")]
                assert [e for e in daemon.events() if e["kind"] == "retry-superseded"] == []
                first, retry = (record.body for record in server.requests[:2])
                assert first is not None and first == retry, "the same request, byte for byte"
            finally:
                daemon.shutdown()

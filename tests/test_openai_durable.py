"""The OpenAI-compatible provider inside real swarms: durable retries and response
handoff across SIGKILL, no key anywhere it must not be, and bad servers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from fake_openai import FakeOpenAIServer, Reply, completion
from fault_proxy import Fault, FaultProxy
from loopback_http import serve_in_thread
from tests.harness import Daemon, ledger_rows, retry_due_while_down, wait_run, wait_supervisor_gone

DECOY_KEY = "sk-decoyKEY0123456789abcdefghijkl"


def openai_spec(
    tmp: Path, url: str, *, retry_base_s: float = 3.0, retry_cap_s: float = 30.0, max_repairs: int = 1
) -> Path:
    (tmp / "ws").mkdir(exist_ok=True)
    spec = tmp / "spec.toml"
    spec.write_text(f"""
[project]
root = "ws"
[[agents]]
id = "llm"
provider = "openai"
retry_base_s = {retry_base_s}
retry_cap_s = {retry_cap_s}
max_repairs = {max_repairs}
[agents.openai]
base_url = "{url}"
model = "fake-model"
timeout_s = 5
structured = "tools"
""")
    return spec


def _no_key_anywhere(daemon: Daemon) -> None:
    for path in [daemon.home / "ledger.db", daemon.home / "ledger.db-wal", *(daemon.home / "logs").glob("*")]:
        if path.exists():
            assert DECOY_KEY.encode() not in path.read_bytes(), f"key leaked into {path}"


def _no_key_in_argv(daemon: Daemon) -> None:
    for pid in daemon.tree_pids():
        try:
            assert DECOY_KEY not in " ".join(psutil.Process(pid).cmdline())
        except psutil.NoSuchProcess:
            continue


def test_supervisor_killed_during_backoff_keeps_attempt_and_retry_at(short_tmp: Path) -> None:
    server = FakeOpenAIServer([Reply(body=completion("all done"))])
    with serve_in_thread(server) as upstream:
        proxy = FaultProxy(upstream, {1: Fault.drop()})
        with serve_in_thread(proxy) as url:
            # retry_at is an hour away: it never fires by itself during the test, so the
            # SIGKILL and the restart race no timer; the clock then passes it while the
            # supervisor is down (`resume` never sends a retry early).
            spec = openai_spec(short_tmp, url, retry_base_s=3600, retry_cap_s=86_400)
            daemon = Daemon(short_tmp / "h", spec, env={"OPENAI_API_KEY": DECOY_KEY})
            try:
                daemon.up()
                run_id = daemon.call("run", agent_id="llm", task="say done")["run_id"]
                wait_run(daemon, run_id, {"waiting-for-provider-retry"})
                before = daemon.call("pending")["provider_retries"]
                assert [r["slot"] for r in before] == [f"{run_id}:0"]
                assert before[0]["retry_at"] > time.time() + 3000
                _no_key_in_argv(daemon)
                daemon.kill_supervisor()
                daemon.up()
                after = daemon.call("pending")["provider_retries"]
                assert after == before, "a restart never resets attempt or retry_at"
                assert len(proxy.requests) == 1, "never sent before retry_at, across the restart"
                assert daemon.call("resume", run_id=run_id)["status"] == "waiting-for-provider-retry"
                assert len(proxy.requests) == 1, "resume never sends a retry before its retry_at"
                retry_due_while_down(daemon, run_id)
                (due,) = ledger_rows(daemon.home, "SELECT retry_at FROM provider_requests WHERE slot = ?",
                                     f"{run_id}:0")
                daemon.up()
                shown = wait_run(daemon, run_id, {"completed", "failed"})
                assert shown["run"]["status"] == "completed"
                assert shown["final_reply"] == "all done"
                records = proxy.requests
                assert len(records) == 2
                assert records[1].arrived_wall >= due["retry_at"], "sent once due, not before"
                assert len(server.requests) == 1, "the dropped request never reached the server"
                assert [(r["slot"], r["attempt"], r["status"]) for r in shown["provider_requests"]] == [
                    (f"{run_id}:0", 0, "failed"),
                    (f"{run_id}:0-transient-1", 1, "completed"),
                ]
                assert all(r.has_authorization for r in records)
                _no_key_anywhere(daemon)
            finally:
                daemon.shutdown()


def test_kill_after_the_handoff_commit_replays_the_stored_response(short_tmp: Path) -> None:
    server = FakeOpenAIServer([Reply(body=completion("from the ledger"))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", openai_spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            first = daemon.up(env={"CORRAL_FAILPOINTS": "provider.after-handoff=kill-supervisor@once"})
            run_id = daemon.call("run", agent_id="llm", task="answer once")["run_id"]
            wait_supervisor_gone(daemon, first.pid)
            assert len(server.requests) == 1
            daemon.up()
            shown = wait_run(daemon, run_id, {"completed", "failed"})
            assert shown["run"]["status"] == "completed"
            assert shown["final_reply"] == "from the ledger"
            assert len(server.requests) == 1, "recovery consumed the stored response; no new request"
            assert len(ledger_rows(daemon.home, "SELECT * FROM replies")) == 1
            _no_key_anywhere(daemon)
        finally:
            daemon.shutdown()


def test_a_crash_before_the_handoff_is_never_silently_resent(short_tmp: Path) -> None:
    server = FakeOpenAIServer([Reply(body=completion("late"), delay_ms=60_000)])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", openai_spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="slow")["run_id"]
            server.log.wait_until_blocking(lambda records: len(records) == 1, 20)
            daemon.kill_supervisor()
            daemon.up()
            shown = wait_run(daemon, run_id, {"needs-reconciliation"})
            assert [r["status"] for r in shown["provider_requests"]] == ["needs-reconciliation"]
            assert any(r["slot"] == f"{run_id}:0" for r in daemon.call("pending")["provider_requests"])
            assert len(server.requests) == 1
        finally:
            daemon.shutdown()


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(500, {"error": {"message": "boom"}}), "provider failed (http)"),
        (Reply(body=b"<html>not json</html>", content_type="text/html"), "response-shape"),
        (Reply(body=b""), "response-shape"),
        (Reply(body=b"x" * 65536, repeat=16), "provider failed (http)"),
    ],
    ids=["http-500", "garbage", "empty", "huge"],
)
def test_bad_servers_fail_the_run_clearly_and_the_supervisor_is_unaffected(
        short_tmp: Path, reply: Reply, reason: str) -> None:
    server = FakeOpenAIServer([], default=reply)
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", openai_spec(short_tmp, url, max_repairs=1), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            boot = daemon.up().boot_id
            run_id = daemon.call("run", agent_id="llm", task="anything")["run_id"]
            shown = wait_run(daemon, run_id, {"completed", "failed"})
            assert shown["run"]["status"] == "failed"
            assert reason in shown["run"]["reason"]
            assert len(server.requests) <= 2, "bounded: one request, at most one repair"
            assert daemon.call("ping")["boot_id"] == boot
            _no_key_anywhere(daemon)
        finally:
            daemon.shutdown()


def test_the_demo_runs_against_an_openai_compatible_server(short_tmp: Path) -> None:
    import subprocess
    import sys

    # The default way (structured = "json_schema"): the plan as JSON content.
    write = {"tool": "fs.write", "input": {"path": "summary/plan.md", "content": "plan"}}
    server = FakeOpenAIServer([
        Reply(body=completion(json.dumps({"actions": [write], "planUpdate": None}))),  # required, null: V1.17
        Reply(body=completion(json.dumps({"final": "The plan is in summary/plan.md.", "planUpdate": None}))),
    ])
    with serve_in_thread(server) as url:
        result = subprocess.run(
            [sys.executable, "-m", "corral", "demo", "--provider", "openai", "--base-url", url, "--model", "fake-model",
             "--dir", str(short_tmp / "demo"), "--quiet"],
            capture_output=True, text=True, timeout=120, check=False, env={**__import__("os").environ,
                                                                           "OPENAI_API_KEY": DECOY_KEY},
        )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "final reply: The plan is in summary/plan.md." in result.stdout
    assert (short_tmp / "demo" / "project" / "summary" / "plan.md").read_text() == "plan"
    assert len(server.requests) == 2
    assert DECOY_KEY.encode() not in (short_tmp / "demo" / ".corral" / "ledger.db").read_bytes()


def test_an_agent_killed_between_response_and_handoff_never_resends(short_tmp: Path) -> None:
    server = FakeOpenAIServer([Reply(body=completion("once"))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", openai_spec(short_tmp, url), env={"OPENAI_API_KEY": DECOY_KEY})
        try:
            daemon.up(env={"CORRAL_FAILPOINTS": "provider.before-handoff=kill@once"})
            run_id = daemon.call("run", agent_id="llm", task="answer")["run_id"]
            shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
            assert shown["run"]["status"] == "needs-reconciliation"
            assert [r["status"] for r in shown["provider_requests"]] == ["needs-reconciliation"]
            assert len(server.requests) == 1, "the lost response was not silently re-requested"
        finally:
            daemon.shutdown()

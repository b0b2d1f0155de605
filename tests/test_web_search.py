"""Provider-native web search (seed 004 V1.20).

In a supervisor's closing stage: once every
delegation's receipt is claimed and nothing of its swarm is still open, the parent's turns
do not search ("final reply 只汇总已持久化任务、观察和 planning 证据，不能在收束阶段再次引入新的网页事实或
额外搜索计费"). An openai root with search on, a scripted specialist, a fake server that
keeps the bodies it receives. And a gateway that refuses the search: a clear failure
that names the switch to turn off."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import trio

from corral.actors.providers.base import ErrorKind, ProviderError
from corral.actors.providers.openai import OpenAIConfig, OpenAIProvider
from fake_openai import FakeOpenAIServer, Reply, completion, tool_call
from loopback_http import serve_in_thread
from tests.harness import ledger_rows, running, wait_run
from tests.openai_provider_support import NO_KEY_ENV, make_request

# Fixtures, imported so that pytest finds them in this module (see openai_provider_support).
from tests.openai_provider_support import no_ambient_key as no_ambient_key


def _spec(url: str) -> str:
    return f"""
[project]
root = "ws"

[[agents]]
id = "boss"
role = "root"
provider = "openai"
web_search = true
[agents.openai]
base_url = "{url}"
model = "fake-model"
timeout_s = 10
structured = "tools"

[[agents]]
id = "checker"
role = "specialist"
[[agents.steps]]
final = "the intro reads well"
"""


def test_a_parent_past_its_claims_does_not_search(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    server = FakeOpenAIServer(keep_bodies=True)
    server.add(
        Reply(body=completion(tool_calls=[tool_call("agent_delegate", {"agent_id": "checker", "task": "check"})])),
        Reply(body=completion(tool_calls=[tool_call("agent_run_status", {})])),
        Reply(body=completion("the intro is checked")),
    )
    with serve_in_thread(server) as url, running(short_tmp / "h", _spec(url)) as daemon:
        run_id = daemon.call("run", agent_id="boss", task="review the intro")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        assert shown["final_reply"] == "the intro is checked"
        bodies = [json.loads(record.body or b"{}") for record in server.requests]
        assert ["web_search_options" in body for body in bodies] == [True, True, False], (
            "planning searches until the receipts are claimed; the closing turn never does"
        )
        turns = ledger_rows(
            daemon.home, "SELECT web_search FROM provider_requests WHERE run_id = ? ORDER BY rowid", run_id
        )
        assert [row["web_search"] for row in turns] == [1, 1, 0]


async def test_a_gateway_that_refuses_the_search_fails_the_turn_naming_the_switch(nursery: trio.Nursery) -> None:
    """The seed: "真实 smoke 若返回 tool-not-open、4xx 或协议错误，必须保留为明确失败并允许用户关闭该 Agent 的
    搜索开关". The failure is not retried and says which setting turns the search off; the same
    refusal of a turn that did not search says nothing of it."""
    refusal = {"error": {"message": "tool web_search is not open for this key"}}
    server = FakeOpenAIServer([Reply(status=400, body=refusal), Reply(status=400, body=refusal)])
    url: str = await nursery.start(server.serve)
    config = OpenAIConfig(base_url=url, model="m", api_key_env=NO_KEY_ENV, web_search=True)
    provider = OpenAIProvider(config)
    with pytest.raises(ProviderError) as refused:
        await provider.complete(dataclasses.replace(make_request(), web_search=True))
    assert refused.value.kind is ErrorKind.HTTP, "a definite refusal fails the run, never a retry"
    assert "HTTP 400" in str(refused.value) and "set web_search = false" in str(refused.value)
    with pytest.raises(ProviderError) as quiet:
        await provider.complete(make_request())
    assert "set web_search = false" not in str(quiet.value)

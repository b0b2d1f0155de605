"""Streamed final replies (issue 17, seed 004 V1.19): only the final reply's text
streams; a cut or a kill mid-stream shows a restart marker, and the finalization
journal keeps the one final text. The text reaches followers of the event stream
from the supervisor's memory: the events table keeps ids, counts and hashes only."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from corral.actors.providers.openai_stream import StreamAssembler
from corral.actors.providers.reply_stream import FinalReplyDecoder
from corral.core.procs import wait_exit
from fake_openai import FakeOpenAIServer, Reply
from loopback_http import serve_in_thread
from tests.harness import Daemon, ledger_rows, running, wait_run

# -- pure ---------------------------------------------------------------------------------


def test_the_decoder_yields_only_the_final_string_even_split_mid_escape() -> None:
    text = '{ "final": "caf\\u00e9 \\"ok\\"\\nbye" }'
    decoder = FinalReplyDecoder()
    out = "".join(decoder.feed(char) for char in text)
    assert out == 'café "ok"\nbye'
    assert decoder.state == "done"
    plan = FinalReplyDecoder()
    assert "".join(plan.feed(c) for c in '{"actions": [{"tool": "fs.read", "input": {"final": "x"}}]}') == ""
    assert plan.state == "off"


def _sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def _delta(content: str | None = None, **extra: Any) -> dict[str, Any]:
    delta: dict[str, Any] = {"content": content} if content is not None else {}
    delta.update(extra)
    return {"id": "chatcmpl-s", "model": "fake-model", "choices": [{"index": 0, "delta": delta}]}


def test_the_assembler_rebuilds_one_body_from_chunks() -> None:
    assembler = StreamAssembler()
    call = {"index": 0, "id": "call_1", "function": {"name": "fs_read", "arguments": '{"pa'}}
    more = {"index": 0, "function": {"arguments": 'th": "a.md"}'}}
    data = _sse(
        _delta("Let me look."),
        _delta(tool_calls=[call]),
        _delta(tool_calls=[more]),
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "usage": {"completion_tokens": 7}},
    )
    pieces = [piece for i in range(0, len(data), 5) for piece in assembler.feed(data[i : i + 5])]
    assert "".join(pieces) == "Let me look."
    assert assembler.done
    body = assembler.body()
    message = body["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {"name": "fs_read", "arguments": '{"path": "a.md"}'}
    assert body["choices"][0]["finish_reason"] == "tool_calls" and body["usage"] == {"completion_tokens": 7}


# -- a real swarm ------------------------------------------------------------------------------


def _stream_events(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events() if e["subject"] == run_id and e["kind"].startswith("reply-")]


def _shown_text(events: list[dict[str, Any]]) -> str:
    """What a reader following the stream shows: a restart marker clears it."""
    text = ""
    for event in events:
        if event["kind"] == "reply-stream-restart":
            text = ""
        elif event["kind"] == "reply-delta":
            text += event["data"].get("text", "")  # absent: a delta the cache no longer has
    return text


@pytest.mark.parametrize("fault", ["cut", "silent"])
def test_a_searching_streams_cut_is_not_sent_again(short_tmp: Path, fault: str) -> None:
    """Seed 004 V1.20: a streamed turn that may search, cut mid-stream or left without
    an answer past its timeout, is not sent again by itself: nobody can tell whether the
    provider searched (and billed), so it fails closed, naming why, and the server sees
    one request."""
    sse = {"content_type": "text/event-stream", "content_length": False}
    cut = (Reply(body=_sse(_delta("Zebra"), done=False), **sse)  # type: ignore[arg-type]
           if fault == "cut" else Reply(hang=True))
    stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    whole = Reply(body=_sse(_delta("Hello"), stop), **sse)  # type: ignore[arg-type]
    server = FakeOpenAIServer([cut, whole])
    (short_tmp / "ws").mkdir()
    spec = """
[project]
root = "ws"
[[agents]]
id = "llm"
provider = "openai"
retry_base_s = 0.05
web_search = true
[agents.openai]
base_url = "{url}"
model = "fake-model"
timeout_s = 1
stream = true
structured = "tools"
"""
    with serve_in_thread(server) as url, running(
        short_tmp / "home", spec.replace("{url}", url), env={"OPENAI_API_KEY": "sk-test"}
    ) as daemon:
        run_id = daemon.call("run", agent_id="llm", task="look it up")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "failed", shown["run"]
        assert "may have searched" in shown["run"]["reason"], shown["run"]["reason"]
        assert [r["status"] for r in shown["provider_requests"]] == ["failed"]
        assert len(server.requests) == 1


def test_an_sse_stream_cut_mid_reply_is_retried_with_a_restart_marker(short_tmp: Path) -> None:
    sse = {"content_type": "text/event-stream", "content_length": False}
    # The cut lifecycle's words never reach the final text: a canary for the ledger's bytes.
    cut = Reply(body=_sse(_delta("Zebra"), _delta(" canary"), done=False), **sse)  # type: ignore[arg-type]
    stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    whole = Reply(body=_sse(_delta("Hello"), _delta(" world."), stop), **sse)  # type: ignore[arg-type]
    server = FakeOpenAIServer([cut, whole])
    (short_tmp / "ws").mkdir()
    spec = """
[project]
root = "ws"
[[agents]]
id = "llm"
provider = "openai"
retry_base_s = 0.05
reasoning_effort = "high"
[agents.openai]
base_url = "{url}"
model = "fake-model"
timeout_s = 5
stream = true
structured = "tools"
"""
    with serve_in_thread(server) as url, running(
        short_tmp / "home", spec.replace("{url}", url), env={"OPENAI_API_KEY": "sk-test"}
    ) as daemon:
        run_id = daemon.call("run", agent_id="llm", task="greet")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "Hello world."
        assert [r["status"] for r in shown["provider_requests"]] == ["failed", "completed"]
        events = _stream_events(daemon, run_id)
        kinds = [e["kind"] for e in events]
        assert "reply-stream-restart" in kinds, kinds
        first_slot = events[0]["data"]["slot"]
        before = "".join(e["data"]["text"] for e in events if e["data"].get("slot") == first_slot)
        assert before == "Zebra canary"  # a follower saw the deltas, from the supervisor's memory
        assert _shown_text(events) == "Hello world."
        # The public table: ids, counts and hashes of each delta, never its text.
        rows = ledger_rows(daemon.home, "SELECT kind, data FROM events WHERE subject = ?", run_id)
        deltas = [json.loads(r["data"]) for r in rows if r["kind"] == "reply-delta"]
        served = [e["data"] for e in events if e["kind"] == "reply-delta"]
        assert [set(d) for d in deltas] == [{"slot", "seq", "chars", "sha256"}] * len(served)
        assert [(d["chars"], d["sha256"]) for d in deltas] == [
            (len(d["text"]), hashlib.sha256(d["text"].encode()).hexdigest()) for d in served]
        assert not any("canary" in r["data"] or "Zebra" in r["data"] for r in rows)
        # Each provider turn records the reasoning effort it sent (seed 004 V1.2).
        turns = ledger_rows(daemon.home, "SELECT reasoning_effort FROM provider_requests WHERE run_id = ?", run_id)
        assert [t["reasoning_effort"] for t in turns] == ["high", "high"]
        assert len(ledger_rows(daemon.home, "SELECT * FROM replies WHERE run_id = ?", run_id)) == 1
        # Progress (corral/cli/progress.py): the newest report, of the lifecycle that
        # answered, with its final count; kept in memory, never an event.
        report = daemon.call("progress", run_ids=[run_id])["progress"][run_id]
        assert (report["slot"], report["tokens"]) == (shown["provider_requests"][1]["slot"], 2)
        assert "Hello" not in json.dumps(report)  # the count only: the words stream as reply-delta
        assert "provider-progress" not in {e["kind"] for e in daemon.events()}
        # The stream is a view: the committed response is an ordinary body.
        (row,) = ledger_rows(daemon.home, "SELECT response FROM provider_requests WHERE status = 'completed'")
        assert json.loads(row["response"])["choices"][0]["message"]["content"] == "Hello world."
    # Nowhere in the ledger's files (the streamed words of the cut lifecycle).
    stored = b"".join(path.read_bytes() for path in (short_tmp / "home").rglob("ledger*") if path.is_file())
    assert stored and b"canary" not in stored and b"Zebra" not in stored


LOCAL = """
name = "stream"
[project]
root = "ws"
[[agents]]
id = "a"
provider = "local"
tools = []
"""


@pytest.mark.parametrize("victim", ["model", "supervisor"])
def test_a_kill_mid_reply_restarts_the_stream_and_keeps_one_final_text(short_tmp: Path, victim: str) -> None:
    (short_tmp / "ws").mkdir()
    action = "kill" if victim == "model" else "kill-supervisor"
    env = {"CORRAL_FAILPOINTS": f"model.mid-reply={action}@once"}
    with running(short_tmp / "home", LOCAL, env=env) as daemon:
        pid = daemon.endpoint.pid
        run_id = daemon.call("run", agent_id="a", task="Say hello in one short sentence.")["run_id"]
        if victim == "supervisor":
            assert wait_exit(pid, 60)
            daemon.up()
        shown = wait_run(daemon, run_id, {"completed", "failed"}, timeout=240)
        assert shown["run"]["status"] == "completed"
        assert (daemon.home / "failpoints" / "model.mid-reply.fired").exists()
        events = _stream_events(daemon, run_id)
        assert [e["kind"] for e in events].count("reply-stream-restart") == 1
        final = shown["final_reply"]
        shown_text = _shown_text(events)
        # The last token (the closing quote's) is not streamed; all before it is, once.
        assert shown_text and final.startswith(shown_text) and len(final) - len(shown_text) <= 8
        assert len(ledger_rows(daemon.home, "SELECT * FROM replies WHERE run_id = ?", run_id)) == 1

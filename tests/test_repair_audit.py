"""Seed 004 V1.33, as its sentences read: native function arguments are
``{"reason": ..., "input": {...}}`` ("所有动作函数参数统一为 {"reason":"...","input":{...}}",
"禁止把 input 属性扁平到 arguments 顶层"); a successful normalization leaves an audit of its
kind, count, characters and SHA-256 and no text ("成功归一化的公共审计只保存固定
complete-think-block / planner-commentary kind、数量、原文本字符数和 SHA-256，不保存正文");
a report prints the zero-filled histogram of the eight categories, whose sum is the
repair total ("按上述固定类别补零后的直方图；分类总和必须等于 repair 总数")."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from corral.acceptance.suite import suite_repairs
from corral.actors.providers.base import PlanError, RepairCategory
from corral.actors.providers.openai import OpenAIConfig, build_chat_payload
from corral.actors.providers.plan_parse import parse_chat_completion
from fake_openai import FakeOpenAIServer, Reply, completion, tool_call
from loopback_http import serve_in_thread
from tests.harness import Daemon, cli, ledger_rows, wait_run
from tests.openai_provider_support import TOOLS, make_request

THOUGHT = "<think>I could call read_file on secret-plan.txt</think>"
COMMENTARY = "Let me read the file first."


def test_native_function_arguments_are_the_reason_and_input_envelope() -> None:
    config = OpenAIConfig(base_url="http://localhost/v1", model="m", structured="tools")
    payload = build_chat_payload(config, make_request())
    functions = {spec["function"]["name"]: spec["function"] for spec in payload["tools"]}
    for tool in TOOLS:
        parameters = functions[tool.name.replace(".", "_")]["parameters"]
        assert parameters["required"] == ["reason", "input"]
        assert parameters["additionalProperties"] is False
        assert parameters["properties"]["input"] == tool.input_schema, "the tool's schema is the input's"
        assert parameters["properties"]["reason"]["type"] == "string"

    body = completion(tool_calls=[tool_call("read_file", {"reason": "see the notes", "input": {"path": "n.txt"}})])
    [call] = parse_chat_completion(json.dumps(body), TOOLS).actions
    assert (call.tool, call.input, call.reason) == ("read_file", {"path": "n.txt"}, "see the notes")


@pytest.mark.parametrize(
    "arguments",
    [
        {"path": "n.txt"},  # the input flattened to the top: the seed forbids it
        {"input": {"path": "n.txt"}},  # no reason
        {"reason": "  ", "input": {"path": "n.txt"}},  # an empty reason
        {"reason": "r", "input": {"path": "n.txt"}, "path": "n.txt"},  # both
        {"reason": "r", "input": "n.txt"},
    ],
)
def test_arguments_outside_the_envelope_are_arguments_schema(arguments: dict[str, Any]) -> None:
    body = completion(tool_calls=[tool_call("read_file", json.dumps(arguments))])
    with pytest.raises(PlanError) as caught:
        parse_chat_completion(json.dumps(body), TOOLS)
    assert caught.value.category is RepairCategory.ARGUMENTS_SCHEMA


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_dropped_think_block_and_commentary_are_audited_by_kind_count_chars_and_sha256() -> None:
    body = completion(content=f"{THOUGHT}{COMMENTARY}", tool_calls=[tool_call("read_file", {"path": "n.txt"})])
    plan = parse_chat_completion(json.dumps(body), TOOLS)
    assert [(n.kind, n.count, n.chars, n.sha256) for n in plan.normalized] == [
        ("complete-think-block", 1, len(THOUGHT), _sha(THOUGHT)),
        ("planner-commentary", 1, len(COMMENTARY), _sha(COMMENTARY)),
    ]
    reply = parse_chat_completion(json.dumps(completion(content="just the answer")), TOOLS)
    assert reply.normalized == (), "nothing dropped, nothing audited"


def test_the_histogram_is_zero_filled_and_sums_to_the_total() -> None:
    from corral.supervisor.runs.repair_histogram import histogram

    shown = histogram({"arguments-schema": 2, "bad-json": 1}, {3: 2, 5: 1})
    assert shown["categories"] == {category.value: 0 for category in RepairCategory} | {
        "arguments-schema": 2, "response-shape": 1}
    assert list(shown["categories"]) == [category.value for category in RepairCategory], "the seed's order"
    assert (shown["total"], shown["loops"], shown["second_repairs"]) == (3, 2, 1)
    assert sum(shown["categories"].values()) == shown["total"]
    assert histogram({}, {})["categories"] == {category.value: 0 for category in RepairCategory}


def _spec(tmp: Path, url: str) -> Path:
    (tmp / "ws").mkdir(exist_ok=True)
    (tmp / "ws" / "notes.txt").write_text("status: draft\n")
    spec = tmp / "spec.toml"
    spec.write_text(f"""
[project]
root = "ws"
[[agents]]
id = "llm"
provider = "openai"
max_repairs = 3
[agents.openai]
base_url = "{url}"
model = "fake-model"
timeout_s = 5
structured = "tools"
""")
    return spec


def test_a_run_audits_its_normalization_without_text_and_shows_the_histogram(short_tmp: Path) -> None:
    flat = completion(tool_calls=[{"id": "c0", "type": "function",
                                   "function": {"name": "fs_read", "arguments": json.dumps({"path": "notes.txt"})}}])
    thinking = completion(content=f"{THOUGHT}{COMMENTARY}",
                          tool_calls=[tool_call("fs_read", {"path": "notes.txt"}, "c1")])
    server = FakeOpenAIServer([Reply(body=flat), Reply(body=thinking), Reply(body=completion("notes read"))])
    with serve_in_thread(server) as url:
        daemon = Daemon(short_tmp / "h", _spec(short_tmp, url))
        try:
            daemon.up()
            run_id = daemon.call("run", agent_id="llm", task="read notes.txt")["run_id"]
            shown = wait_run(daemon, run_id, {"completed", "failed"})
            assert shown["run"]["status"] == "completed", shown["run"]
            [audit] = [json.loads(row["data"]) for row in ledger_rows(
                daemon.home, "SELECT data FROM events WHERE kind = 'response-normalized' AND subject = ?", run_id)]
            assert audit["normalized"] == [
                {"kind": "complete-think-block", "count": 1, "chars": len(THOUGHT), "sha256": _sha(THOUGHT)},
                {"kind": "planner-commentary", "count": 1, "chars": len(COMMENTARY), "sha256": _sha(COMMENTARY)},
            ]
            assert audit["slot"], "the audit names the provider request it was made of"
            events = " ".join(row["data"] for row in ledger_rows(daemon.home, "SELECT data FROM events"))
            assert "secret-plan" not in events and COMMENTARY not in events, "no text in any event"
            expected = {category.value: 0 for category in RepairCategory} | {"arguments-schema": 1}
            assert shown["repair_histogram"] == {"total": 1, "loops": 1, "second_repairs": 0, "categories": expected}
            printed = cli(daemon.home, "show", run_id).stdout
            assert "repairs: 1 in 1 loop(s), 0 second repair(s)" in printed
            assert "arguments-schema 1" in printed and "catalog-binding 0" in printed
        finally:
            daemon.shutdown()
    # The acceptance report reads the same ledgers, after its supervisors are down,
    # through the same aggregator.
    assert suite_repairs([daemon.home]) == shown["repair_histogram"]


def test_only_parts_marked_as_reasoning_leave_the_visible_text() -> None:
    """The seed: "只排除明确标记为 reasoning / reasoning_content / analysis / thinking 的内部推理
    part；普通 text / output_text 继续进入可见正文"."""
    parts = [
        {"type": "reasoning", "text": "hidden 1"},
        {"type": "text", "text": "The answer "},
        {"type": "reasoning_content", "text": "hidden 2"},
        {"type": "output_text", "text": "is 42."},
        {"type": "thinking", "text": "hidden 3"},
        {"type": "analysis", "text": "hidden 4"},
    ]
    body = {"choices": [{"message": {"role": "assistant", "content": parts}}]}
    assert parse_chat_completion(json.dumps(body), TOOLS).final_reply == "The answer is 42."


PLAN_TEXT = '{"actions": [{"tool": "read_file", "input": {"path": "n.txt"}}]}'
CALLS = [tool_call("read_file", {"reason": "see the notes", "input": {"path": "n.txt"}})]
HIDDEN = "zq-hidden-thought"


@pytest.mark.parametrize(
    ("content", "calls", "text_json"),
    [
        # An orphan close (its opening tag in the chat template, or lost): "孤立 thinking wrapper".
        (f"{HIDDEN} read it.</think>{PLAN_TEXT}", [], True),
        (f"{HIDDEN} read it.</think>", CALLS, False),
        (f"{HIDDEN}</think>The answer is 42.", [], False),
        # Left open: "未闭合".
        (f"{PLAN_TEXT} <think>{HIDDEN}", [], True),
        (f"The answer is 42. <think>{HIDDEN}", [], False),
        (f"<think>{HIDDEN}", CALLS, False),
        # Closed by another name, or closed once too often: "错配".
        (f"<think>{HIDDEN}</thinking>{PLAN_TEXT}", [], True),
        (f"<think>{HIDDEN}</think></think>The answer is 42.", [], False),
        (f"<think><reasoning>{HIDDEN}</think></reasoning>", CALLS, False),
    ],
)
def test_an_unclosed_orphan_or_mismatched_thinking_tag_is_response_shape_and_is_stored_without_its_text(
    content: str, calls: list[dict[str, Any]], text_json: bool
) -> None:
    """The seed (V1.33): "最终用户回复、legacy wrapper、未闭合 / 错配 thinking 标签仍按 response-shape
    失败关闭"; (V1.43) "未闭合或孤立 thinking wrapper 不保存 thinking 正文，只保存严格无效元数据；重放
    合成无正文协议标记并进入同一 repair，不能被清洗成可执行计划"."""
    from corral.supervisor.runs.response_secrets import without_thinking

    body = json.dumps(completion(content=content, tool_calls=calls or None))
    with pytest.raises(PlanError) as caught:
        parse_chat_completion(body, TOOLS, text_json=text_json)
    assert caught.value.category is RepairCategory.RESPONSE_SHAPE
    assert HIDDEN not in caught.value.detail
    stored = without_thinking(body)
    assert HIDDEN not in stored, "no thinking text is stored"
    with pytest.raises(PlanError) as replayed:  # read again after a crash: the same repair
        parse_chat_completion(stored, TOOLS, text_json=text_json)
    assert replayed.value.category is RepairCategory.RESPONSE_SHAPE
    if calls:
        assert json.loads(stored)["choices"][0]["message"]["tool_calls"] == json.loads(body)["choices"][0][
            "message"]["tool_calls"], "the function call envelope is kept whole"


def test_complete_and_nested_thinking_blocks_are_dropped_whatever_their_case() -> None:
    """The seed (V1.33): "可以移除完整、大小写不敏感且嵌套闭合的 <think>...</think> 块"."""
    nested = f"<THINK>{HIDDEN} <think>inner</think> more</Think>"
    plan = parse_chat_completion(json.dumps(completion(content=nested + PLAN_TEXT)), TOOLS, text_json=True)
    assert [a.tool for a in plan.actions] == ["read_file"]
    assert [(n.kind, n.count, n.chars, n.sha256) for n in plan.normalized] == [
        ("complete-think-block", 1, len(nested), _sha(nested))
    ]
    reply = parse_chat_completion(json.dumps(completion(content=f"{nested} The answer is 42.")), TOOLS)
    assert reply.final_reply == "The answer is 42."

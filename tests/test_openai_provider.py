"""The OpenAI-compatible provider on the wire: replies from the fake server turned
into plans (native tool calls, text-JSON, reasoning blocks, each repair category),
the request body it builds, and the parsing and repair pieces on their own.

HTTP failures and the fault proxy are in test_openai_provider_faults.py; the API
key and the config mapping in test_openai_provider_config.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from corral.actors.providers.base import MAX_ACTIONS_PER_PLAN, PlanError, RepairCategory, ToolSchema
from corral.actors.providers.json_check import validate
from corral.actors.providers.openai import TEXT_JSON_INSTRUCTION, OpenAIConfig, OpenAIProvider, build_chat_payload
from corral.actors.providers.plan_parse import parse_chat_completion
from corral.actors.providers.repair import MAX_REPAIR_CHARS, RepairCounter, repair_message
from corral.actors.providers.thinking import MALFORMED, stored
from fake_openai import FakeOpenAIServer, Reply, completion, tool_call
from tests.openai_provider_support import TOOLS, complete_once, make_provider, make_request, start

# Fixtures, imported so that pytest finds them in this module (see openai_provider_support).
from tests.openai_provider_support import decoy as decoy
from tests.openai_provider_support import no_ambient_key as no_ambient_key

pytestmark = pytest.mark.usefixtures("no_ambient_key")


# --- plans over HTTP --------------------------------------------------------------


async def test_native_tool_calls_become_a_plan(nursery: trio.Nursery) -> None:
    body = completion(
        tool_calls=[
            tool_call("read_file", {"path": "notes.txt"}),
            tool_call("fs_stat", {"paths": ["a", "b"]}),  # the wire name of fs.stat
        ]
    )
    server = FakeOpenAIServer([Reply(body=body)])
    provider = make_provider(await start(nursery, server))

    response = await provider.complete(make_request())
    plan = provider.parse(response, TOOLS)

    assert [(a.tool, a.input) for a in plan.actions] == [
        ("read_file", {"path": "notes.txt"}),
        ("fs.stat", {"paths": ["a", "b"]}),
    ]
    assert plan.final_reply is None
    assert json.loads(response.text) == body
    assert response.meta["status"] == 200
    assert response.meta["seq"] == 1
    assert response.meta["mode"] == "native"
    [record] = server.requests
    assert (record.method, record.path, record.seq) == ("POST", "/v1/chat/completions", 1)


async def test_plain_text_is_the_final_reply_with_native_tools(nursery: trio.Nursery) -> None:
    content = "Here is the summary:\n```python\nprint('not a plan')\n```"
    response = await complete_once(nursery, Reply(body=completion(content)))
    plan = make_provider("http://127.0.0.1:1").parse(response, TOOLS)
    assert plan.final_reply == content


async def test_tool_call_leaked_into_content_is_still_a_call(nursery: trio.Nursery) -> None:
    content = json.dumps({"name": "read_file", "arguments": {"path": "a.txt"}})
    response = await complete_once(nursery, Reply(body=completion(content)))
    plan = make_provider("http://127.0.0.1:1").parse(response, TOOLS)
    assert [(a.tool, a.input) for a in plan.actions] == [("read_file", {"path": "a.txt"})]


@pytest.mark.parametrize(
    ("content", "expected_actions", "expected_final"),
    [
        (
            'Sure.\n```json\n{"actions": [{"tool": "read_file", "input": {"path": "n"}}]}\n```',
            [("read_file", {"path": "n"})],
            None,
        ),
        ('{"final": "All done."} (that is my answer)', [], "All done."),
        ('I will now answer: {"final": "ok"}', [], "ok"),
    ],
)
async def test_text_json_fallback(
    nursery: trio.Nursery,
    content: str,
    expected_actions: list[tuple[str, dict[str, Any]]],
    expected_final: str | None,
) -> None:
    server = FakeOpenAIServer([Reply(body=completion(content))])
    provider = make_provider(await start(nursery, server), native_tools=False)

    response = await provider.complete(make_request())
    plan = provider.parse(response, TOOLS)

    assert response.meta["mode"] == "text-json"
    assert [(a.tool, a.input) for a in plan.actions] == expected_actions
    assert plan.final_reply == expected_final


async def test_text_json_mode_rejects_prose(nursery: trio.Nursery) -> None:
    server = FakeOpenAIServer([Reply(body=completion("I think we are done here."))])
    provider = make_provider(await start(nursery, server), native_tools=False)
    response = await provider.complete(make_request())
    with pytest.raises(PlanError) as caught:
        provider.parse(response, TOOLS)
    assert caught.value.category is RepairCategory.RESPONSE_SHAPE


async def test_recorded_mode_wins_over_a_changed_config(nursery: trio.Nursery) -> None:
    # A response committed under text-JSON is re-read the same way after a restart
    # with native tools configured.
    server = FakeOpenAIServer([Reply(body=completion('{"final": "from json"}'))])
    url = await start(nursery, server)
    response = await make_provider(url, native_tools=False).complete(make_request())
    plan = make_provider(url, native_tools=True).parse(response, TOOLS)
    assert plan.final_reply == "from json"


@pytest.mark.parametrize(
    ("native", "content", "final"),
    [
        (True, '<think>call read_file {"path": </think>The answer is 42.', "The answer is 42."),
        (False, '<thinking>{"final": "wrong"}</thinking>\n{"final": "right"}', "right"),
        (False, '<think>outer <think>inner</think></think>{"final": "after a nested block"}', "after a nested block"),
    ],
)
async def test_reasoning_blocks_are_stripped(
    nursery: trio.Nursery, native: bool, content: str, final: str
) -> None:
    server = FakeOpenAIServer([Reply(body=completion(content))])
    provider = make_provider(await start(nursery, server), native_tools=native)
    plan = provider.parse(await provider.complete(make_request()), TOOLS)
    assert plan.final_reply == final


def _too_many_calls() -> list[dict[str, Any]]:
    n = MAX_ACTIONS_PER_PLAN + 1
    return [tool_call("read_file", {"path": f"f{i}"}, f"c{i}") for i in range(n)]


@pytest.mark.parametrize(
    ("body", "category"),
    [
        (completion(tool_calls=[tool_call("rm_rf", {})]), RepairCategory.UNKNOWN_FUNCTION),
        (completion(tool_calls=[{"id": "c1", "type": "function"}]), RepairCategory.CALL_IDENTITY),
        (completion(tool_calls=[tool_call("", {})]), RepairCategory.CALL_IDENTITY),
        (completion(tool_calls=[tool_call("read_file", '{"path": ')]), RepairCategory.ARGUMENTS_JSON),
        (completion(tool_calls=[tool_call("read_file", {"path": 3})]), RepairCategory.ARGUMENTS_SCHEMA),
        (completion(tool_calls=[tool_call("read_file", {})]), RepairCategory.ARGUMENTS_SCHEMA),
        (
            completion(tool_calls=[tool_call("read_file", {"path": "a", "extra": 1})]),
            RepairCategory.ARGUMENTS_SCHEMA,
        ),
        (
            completion(tool_calls=[tool_call("write_file", {"path": "a", "content": "", "mode": "x"})]),
            RepairCategory.ARGUMENTS_SCHEMA,
        ),
        (completion(tool_calls=_too_many_calls()), RepairCategory.BATCH_CONSTRAINT),
        (completion(content=""), RepairCategory.RESPONSE_SHAPE),
        (completion(content="<think>only thoughts, then out of tokens"), RepairCategory.RESPONSE_SHAPE),
        (completion(content='{"actions": []}'), RepairCategory.RESPONSE_SHAPE),
    ],
)
async def test_each_repair_category(
    nursery: trio.Nursery, body: dict[str, Any], category: RepairCategory
) -> None:
    response = await complete_once(nursery, Reply(body=body))
    with pytest.raises(PlanError) as caught:
        make_provider("http://127.0.0.1:1").parse(response, TOOLS)
    assert caught.value.category is category

    message = repair_message(caught.value.category, caught.value.detail)
    assert message["role"] == "user"
    assert category.value in message["content"]
    assert len(message["content"]) <= MAX_REPAIR_CHARS


@pytest.mark.parametrize(
    ("body", "native"),
    [
        # Seed 004 V1.33: a repeated key, top-level or nested in an input, is refused
        # before the schema is read (never "the last one wins").
        (completion(tool_calls=[tool_call("read_file", '{"path": "a", "path": "b"}')]), True),
        (completion(tool_calls=[tool_call("read_file", '{"path": "a", "extra": {"k": 1, "k": 2}}')]), True),
        (completion(content='{"actions": [{"tool": "read_file", "input": {"path": "a", "path": "b"}}]}'), False),
        (completion(content='{"final": "one", "final": "two"}'), False),
        # In native-tools mode too, a fenced JSON plan is a plan (never the final reply),
        # so its repeated key is refused, top-level or nested (the strict re-audit saw
        # such a plan delivered as the final reply).
        (completion(content='Plan:\n```json\n{"actions": [{"tool": "read_file",'
                            ' "input": {"path": "a", "path": "b"}}]}\n```'), True),
        (completion(content='```json\n{"final": "one", "final": "two"}\n```'), True),
        (completion(content='```\n{"name": "read_file", "arguments": {"path": "a", "path": "b"}}\n```'), True),
    ],
)
async def test_a_duplicate_key_anywhere_in_a_plan_is_refused(
    nursery: trio.Nursery, body: dict[str, Any], native: bool
) -> None:
    response = await complete_once(nursery, Reply(body=body), native_tools=native)
    with pytest.raises(PlanError) as caught:
        make_provider("http://127.0.0.1:1", native_tools=native).parse(response, TOOLS)
    assert caught.value.category is RepairCategory.ARGUMENTS_JSON
    assert "duplicate key" in caught.value.detail


async def test_a_fenced_json_example_that_is_no_plan_stays_the_final_reply(nursery: trio.Nursery) -> None:
    """The boundary of the refusal above: a fenced block that is no plan is reply content
    (an answer may show JSON), whatever keys it repeats."""
    for text in (
        'The config:\n```json\n{"port": 1, "port": 2}\n```',
        # Repeats a key, then is no JSON at all: still reply content, and no traceback.
        'Broken:\n```json\n{"final": 1, "final": 2} trailing\n```',
    ):
        response = await complete_once(nursery, Reply(body=completion(content=text)), native_tools=True)
        plan = make_provider("http://127.0.0.1:1", native_tools=True).parse(response, TOOLS)
        assert plan.final_reply == text and plan.actions == ()


@pytest.mark.parametrize(
    "body",
    [b"<html>502 Bad Gateway</html>", b"", b"   ", b'{"choices": []}', b"[1, 2]", b'{"id": "x"'],
)
async def test_garbage_or_empty_body_is_response_shape_at_parse(nursery: trio.Nursery, body: bytes) -> None:
    response = await complete_once(nursery, Reply(body=body))
    with pytest.raises(PlanError) as caught:
        make_provider("http://127.0.0.1:1").parse(response, TOOLS)
    assert caught.value.category is RepairCategory.RESPONSE_SHAPE


# --- the request body -------------------------------------------------------------


HISTORY: tuple[dict[str, Any], ...] = (
    {"action_id": "a1", "tool": "read_file", "status": "ok", "output": "x" * 20_000},
    {"role": "repair", "category": "unknown-tool", "detail": "no tool 'rm'"},
)


def test_native_payload_has_one_schema_per_tool() -> None:
    config = OpenAIConfig(base_url="http://localhost/v1", model="m", temperature=0, structured="tools")
    payload = build_chat_payload(config, make_request(HISTORY))

    assert payload["model"] == "m"
    assert payload["temperature"] == 0
    assert payload["stream"] is False
    *functions, update = [spec["function"] for spec in payload["tools"]]
    assert [f["name"] for f in functions] == ["read_file", "write_file", "fs_stat"]
    assert update["name"] == "update_agent_plan", "the plan update, beside the tools (seed 004 V1.17, V1.26)"
    # Seed 004 V1.33: each function's arguments are {"reason", "input"}, the input by the tool's schema.
    assert [f["parameters"]["properties"]["input"] for f in functions] == [t.input_schema for t in TOOLS]
    assert {tuple(f["parameters"]["required"]) for f in functions} == {("reason", "input")}
    system, task, observation, repair = payload["messages"]
    assert system["role"] == "system"
    assert task == {"role": "user", "content": "Task: Summarise notes.txt"}
    assert observation["content"].startswith("Observation for action a1 (tool read_file")
    assert len(observation["content"]) < 9000  # bounded
    assert "unknown-function" in repair["content"]  # an older ledger's name, read as the seed's


def test_text_json_payload_describes_tools_in_the_prompt() -> None:
    config = OpenAIConfig(base_url="http://localhost/v1", model="m", native_tools=False)
    payload = build_chat_payload(config, make_request())
    assert "tools" not in payload
    system = payload["messages"][0]["content"]
    assert TEXT_JSON_INSTRUCTION in system
    for tool in TOOLS:
        assert tool.name in system


def test_payload_redacts_secrets_in_observations(decoy: str) -> None:
    history = ({"action_id": "a1", "tool": "read_file", "status": "ok", "output": decoy},)
    provider = OpenAIProvider(
        OpenAIConfig(base_url="http://localhost/v1", model="m", api_key_env="CORRAL_DECOY")
    )
    payload = build_chat_payload(provider.config, make_request(history))
    assert decoy not in json.dumps(payload)


# --- pure parsing -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "stripped"),
    [
        ("<think>a</think>answer", "answer"),
        ("<THINK>a</THINK> <reasoning>b</reasoning> answer", "answer"),
        # Not closed, not opened: which text was thought cannot be told, none is kept (V1.43).
        ("<think>never closed, out of tokens", MALFORMED),
        ("thinking without the opening tag</think>answer", MALFORMED),
        ('<think type="x">a</think>{"final": "x"}', '{"final": "x"}'),
        ("no reasoning at all", "no reasoning at all"),
    ],
)
def test_strip_reasoning(text: str, stripped: str) -> None:
    assert stored(text) == stripped


@pytest.mark.parametrize(
    ("value", "schema", "ok"),
    [
        (1, {"type": "integer"}, True),
        (True, {"type": "integer"}, False),
        (1.5, {"type": "integer"}, False),
        (1.5, {"type": "number"}, True),
        (None, {"type": ["string", "null"]}, True),
        ("b", {"enum": ["a", "b"]}, True),
        ("c", {"enum": ["a", "b"]}, False),
        (["a", 1], {"type": "array", "items": {"type": "string"}}, False),
        ({"a": {"b": 1}}, {"properties": {"a": {"properties": {"b": {"type": "string"}}}}}, False),
        ({"x": 1}, {"type": "object", "additionalProperties": {"type": "integer"}}, True),
        ({"x": "1"}, {"type": "object", "additionalProperties": {"type": "integer"}}, False),
        ({}, {"type": "object", "required": ["a"]}, False),
        ("s", {"type": "string", "minLength": 5}, True),  # unknown keywords ignored
    ],
)
def test_validate(value: Any, schema: dict[str, Any], ok: bool) -> None:
    assert (validate(value, schema) is None) is ok


def test_validation_detail_names_the_path() -> None:
    body = json.dumps(completion(tool_calls=[tool_call("fs.stat", {"paths": ["a", 2]})]))
    with pytest.raises(PlanError) as caught:
        parse_chat_completion(body, TOOLS)
    assert "$.paths[1]" in caught.value.detail


def test_plan_with_both_actions_and_final_is_a_mismatch() -> None:
    body = json.dumps(completion('{"actions": [], "final": "x"}'))
    with pytest.raises(PlanError) as caught:
        parse_chat_completion(body, TOOLS, text_json=True)
    assert caught.value.category is RepairCategory.RESPONSE_SHAPE


def test_a_raw_newline_inside_a_json_string_is_what_the_model_meant() -> None:
    """llama.cpp's json_object grammar lets a raw newline into a string: a plan, not a
    repair turn (it cost one on the demo's researcher)."""
    body = json.dumps(completion('{"final": "Wrote it.\nAll done."}'))
    assert parse_chat_completion(body, TOOLS, text_json=True).final_reply == "Wrote it.\nAll done."
    arguments = '{"reason": "r", "input": {"path": "a.md", "content": "line 1\nline 2"}}'
    call = json.dumps(completion(tool_calls=[{"id": "c1", "type": "function", "function": {
        "name": "write_file", "arguments": arguments}}]))
    assert parse_chat_completion(call, TOOLS).actions[0].input["content"] == "line 1\nline 2"


def test_repair_message_is_bounded_and_redacted(decoy: str) -> None:
    make_provider("http://127.0.0.1:1/v1", api_key_env="CORRAL_DECOY")  # loads the key
    message = repair_message(RepairCategory.ARGUMENTS_JSON, f"{decoy} " + "y" * 5000)
    assert len(message["content"]) <= MAX_REPAIR_CHARS
    assert decoy not in message["content"]


def test_repair_counter_counts_per_category() -> None:
    counter = RepairCounter()
    assert not counter.exhausted(2)
    counter.record(RepairCategory.ARGUMENTS_JSON)
    counter.record(RepairCategory.ARGUMENTS_JSON)
    counter.record(RepairCategory.UNKNOWN_FUNCTION)
    assert counter.count(RepairCategory.ARGUMENTS_JSON) == 2
    assert counter.total == 3
    assert counter.exhausted(2, RepairCategory.ARGUMENTS_JSON)
    assert not counter.exhausted(2, RepairCategory.UNKNOWN_FUNCTION)
    assert counter.exhausted(2)
    assert counter.as_dict() == {"arguments-json": 2, "unknown-function": 1}
    assert RepairCounter(counter.as_dict()).as_dict() == counter.as_dict()


def test_repair_counter_rebuilds_from_history() -> None:
    counter = RepairCounter.from_history(HISTORY + HISTORY)
    # HISTORY holds corral's older name (unknown-tool): counted under the seed's.
    assert counter.as_dict() == {"unknown-function": 2}


def test_the_repair_categories_are_the_seeds_eight() -> None:
    """Seed 004 V1.33: "工具计划错误使用固定类别 response-shape / call-identity /
    unknown-function / arguments-json / arguments-schema / batch-constraint /
    plan-semantics / catalog-binding", and no other."""
    assert [c.value for c in RepairCategory] == [
        "response-shape", "call-identity", "unknown-function", "arguments-json",
        "arguments-schema", "batch-constraint", "plan-semantics", "catalog-binding",
    ]
    for category in RepairCategory:
        assert category.value in repair_message(category, "detail")["content"]


def test_a_catalog_in_conflict_is_catalog_binding() -> None:
    """Two tools the model could not tell apart (one wire name): the local catalogue
    is in conflict, which no repair of the model's answer can fix."""
    clash = (ToolSchema("a.b_c", "x", {"type": "object"}, True), ToolSchema("a_b.c", "y", {"type": "object"}, True))
    with pytest.raises(PlanError) as caught:
        parse_chat_completion(json.dumps(completion("done")), clash)
    assert caught.value.category is RepairCategory.CATALOG_BINDING


def test_a_json_plan_beside_an_unclosed_thinking_block_is_repaired_not_acted_on() -> None:
    """Seed 004 V1.43: "未闭合或孤立 thinking wrapper…进入同一 repair，不能被清洗成可执行计划":
    a text-JSON plan followed by a thinking block left open is a response-shape repair
    (found by a strict re-audit: it became an action waiting for approval)."""
    plan = '{"actions": [{"tool": "fs.stat", "input": {"paths": ["a"]}}]}'
    body = json.dumps(completion(plan + " <think>and then I will"))
    with pytest.raises(PlanError) as caught:
        parse_chat_completion(body, TOOLS, text_json=True)
    assert caught.value.category is RepairCategory.RESPONSE_SHAPE
    assert parse_chat_completion(json.dumps(completion(plan)), TOOLS, text_json=True).actions

"""Structured output for the ``openai`` provider (issue 38): the plan schema the local
grammar is built from, sent as ``response_format`` or as native tools, chosen by
``structured``; then a real ``llama_cpp.server`` on the packaged SmolLM2 GGUF,
started here, serving two agents of one swarm over the HTTP path a user's vLLM or
Ollama would take: one asks with the schema, one with plain text-JSON.

The model's wording is never asserted, and the text-JSON agent's repairs are only
recorded (printed), since they depend on the model; the schema agent's are 0."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from bench import llama_server as served
from corral.actors.providers.base import MAX_ACTIONS_PER_PLAN, ErrorKind, ProviderError, ProviderRequest
from corral.actors.providers.local_schema import plan_schema
from corral.actors.providers.openai import OpenAIConfig, OpenAIConfigError, OpenAIProvider, build_chat_payload
from corral.actors.providers.openai_structured import CHOICES, answer_schema
from fake_openai import FakeOpenAIServer, Reply
from tests.harness import cli, running, wait_run
from tests.openai_provider_support import NO_KEY_ENV, TOOLS, make_request

# Fixtures, imported so that pytest finds them in this module (see openai_provider_support).
from tests.openai_provider_support import no_ambient_key as no_ambient_key

pytestmark = pytest.mark.usefixtures("no_ambient_key")


def _config(**settings: Any) -> OpenAIConfig:
    return OpenAIConfig.from_mapping({"base_url": "http://127.0.0.1:1/v1", "model": "m", **settings})


def _valid(schema: dict[str, Any], answer: dict[str, Any]) -> bool:
    """Whether ``answer`` fits, with ``"planUpdate": null`` (required, nullable: seed 004
    V1.17) when it gives none: the plan update's own rules are tests/test_plan.py's."""
    return jsonschema.Draft202012Validator(schema).is_valid({"planUpdate": None, **answer})


# -- the request each setting sends (no server) ----------------------------------------


def test_json_schema_is_the_default_and_sends_the_plan_schema_strictly() -> None:
    payload = build_chat_payload(_config(), make_request())
    assert "tools" not in payload and "tool_choice" not in payload
    fmt = payload["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["strict"] is True and fmt["json_schema"]["name"]
    schema = fmt["json_schema"]["schema"]
    assert schema == answer_schema(make_request())
    # The text still describes the tools: the schema constrains, the prompt explains.
    assert all(tool.name in payload["messages"][0]["content"] for tool in TOOLS)


def test_json_object_sends_the_schema_in_llama_cpp_pythons_form() -> None:
    payload = build_chat_payload(_config(structured="json_object"), make_request())
    assert payload["response_format"] == {"type": "json_object", "schema": answer_schema(make_request())}
    assert "tools" not in payload


def test_tools_sends_native_tools_and_none_sends_neither() -> None:
    tools = build_chat_payload(_config(structured="tools"), make_request())
    # The tools, then the plan update beside them (seed 004 V1.17, V1.26: update_agent_plan).
    assert [spec["function"]["name"] for spec in tools["tools"]] == ["read_file", "write_file", "fs_stat",
                                                                      "update_agent_plan"]
    assert tools["tool_choice"] == "auto" and "response_format" not in tools
    # The schema's tool-call budget applies to native tools too: then the reply is due.
    observed = ({"action_id": "a1", "tool": "read_file", "status": "ok", "output": "text"},)
    spent = build_chat_payload(_config(structured="tools", max_tool_calls=1), make_request(observed))
    assert spent["tool_choice"] == "none"
    plain = build_chat_payload(_config(structured="none"), make_request())
    assert not {"tools", "tool_choice", "response_format"} & set(plain)


def test_the_shared_schema_admits_the_catalog_within_its_bounds() -> None:
    schema = answer_schema(make_request())
    call = {"tool": "read_file", "input": {"path": "notes.txt"}}
    assert _valid(schema, {"actions": [call]})
    assert _valid(schema, {"actions": [call] * MAX_ACTIONS_PER_PLAN})
    assert not _valid(schema, {"actions": [call] * (MAX_ACTIONS_PER_PLAN + 1)})
    assert not _valid(schema, {"actions": []})
    assert _valid(schema, {"final": "done"}) and not _valid(schema, {"final": ""})
    assert not _valid(schema, {"final": "done", "actions": [call]})
    # Each action's input by its tool's own schema, optional fields included.
    full = {"path": "a", "content": "b", "mode": "append"}
    assert _valid(schema, {"actions": [{"tool": "write_file", "input": full}]})
    assert not _valid(schema, {"actions": [{"tool": "write_file", "input": {"path": "a"}}]})
    assert not _valid(schema, {"actions": [{"tool": "read_file", "input": {"path": "a", "extra": 1}}]})
    assert not _valid(schema, {"actions": [{"tool": "rm", "input": {}}]})
    assert not _valid(schema, {"actions": [{"tool": "fs.stat", "input": {"paths": ["p"] * 9}}]})
    # Strings are left open for a server's model; the local grammar bounds them.
    long_path = {"actions": [{"tool": "read_file", "input": {"path": "p" * 5000}}]}
    assert _valid(schema, long_path) and not _valid(plan_schema(TOOLS), long_path)


def test_the_bounds_settings_bound_the_schema_as_in_the_local_grammar() -> None:
    config = _config(max_string=10, max_reply=20, max_actions=1, max_tool_calls=1)
    first = build_chat_payload(config, make_request())["response_format"]["json_schema"]["schema"]
    call = {"tool": "read_file", "input": {"path": "notes.txt"}}
    assert _valid(first, {"actions": [call]}) and not _valid(first, {"actions": [call, call]})
    assert not _valid(first, {"actions": [{"tool": "read_file", "input": {"path": "p" * 11}}]})
    assert not _valid(first, {"final": "r" * 21})
    # After max_tool_calls results only the final reply is left, so a run ends.
    observed = ({"action_id": "a1", "tool": "read_file", "status": "ok", "output": "text"},)
    after = build_chat_payload(config, make_request(observed))["response_format"]["json_schema"]["schema"]
    assert _valid(after, {"final": "done"}) and not _valid(after, {"actions": [call]})


def test_a_refused_final_reply_leaves_only_the_tools_it_names() -> None:
    history = ({"role": "repair", "category": "final-blocked", "detail": "first read_file the notes"},)
    schema = answer_schema(make_request(history))
    assert _valid(schema, {"actions": [{"tool": "read_file", "input": {"path": "n"}}]})
    assert not _valid(schema, {"final": "done"})
    assert not _valid(schema, {"actions": [{"tool": "fs.stat", "input": {"paths": ["n"]}}]})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"structured": "grammar"}, "structured must be one of json_schema, json_object, tools, none, got 'grammar'"),
        ({"structured": True}, "structured must be one of"),
        ({"structured": "tools", "native_tools": True}, "native_tools is replaced by structured"),
        ({"native_tools": "no"}, "native_tools must be true or false"),
        ({"max_actions": 0}, "max_actions must be an integer in [1, 3], got 0"),
        ({"max_string": "long"}, "max_string must be an integer in"),
        ({"plan_update": "no"}, "plan_update must be true or false"),
    ],
)
def test_a_bad_structured_setting_is_a_config_error_listing_the_choices(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(OpenAIConfigError, match=re.escape(message)):
        _config(**settings)


def test_the_old_native_tools_key_still_works() -> None:
    assert _config(native_tools=True).structured == "tools"
    assert _config(native_tools=False).structured == "none"
    assert set(CHOICES) == {"json_schema", "json_object", "tools", "none"}


async def test_a_server_refusing_the_format_gets_json_object_next_and_names_the_setting(
        nursery: trio.Nursery) -> None:
    refusal = {"error": {"message": "response_format: Input should be 'text' or 'json_object'"}}
    server = FakeOpenAIServer([Reply(status=400, body=refusal), Reply(status=400, body={"error": "bad model"})],
                              keep_bodies=True)
    url: str = await nursery.start(server.serve)
    provider = OpenAIProvider(_config(base_url=url, api_key_env=NO_KEY_ENV))
    with pytest.raises(ProviderError) as refused:
        await provider.complete(make_request())
    # A durable retry, not a failed run: the next attempt asks in the older form (issue 49).
    assert refused.value.kind is ErrorKind.TRANSIENT and "next attempt asks for json_object" in str(refused.value)
    assert 'refused structured = "json_schema"' in str(refused.value)
    assert '"tools"' in str(refused.value) and '"none"' in str(refused.value)
    # Any other error says nothing about the setting; the retry asked for json_object.
    with pytest.raises(ProviderError) as other:
        await provider.complete(make_request())
    assert "structured" not in str(other.value)
    formats = [json.loads(record.body or b"{}")["response_format"]["type"] for record in server.requests]
    assert formats == ["json_schema", "json_object"]


# -- a real llama_cpp.server -----------------------------------------------------------


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` on the packaged SmolLM2 GGUF, loaded once for
    the module; its base URL."""
    import importlib.util

    if importlib.util.find_spec("fastapi") is None:
        pytest.fail("llama_cpp.server needs the local-server extra: scripts/bootstrap.sh dev,local installs it")
    from corral.supervisor.models.model_spec import packaged_model_file

    model = packaged_model_file("smollm2")
    try:
        with served.llama_server(model, tmp_path_factory.mktemp("llama") / "server.log") as base_url:
            yield base_url
    except served.ServerFailed as exc:
        pytest.fail(str(exc))


def _agent(agent_id: str, url: str, structured: str, bounds: str = "") -> str:
    return f"""
[[agents]]
id = "{agent_id}"
provider = "openai"
tools = ["effect.record"]
max_repairs = 3
  [agents.openai]
  base_url = "{url}"
  model = "smollm2"
  api_key_env = "{NO_KEY_ENV}"
  temperature = 0.0
  max_tokens = 100
  timeout_s = 120
  structured = "{structured}"
{bounds}"""


#: A 135M model cannot finish a plan it writes (it wrote four steps and its final reply
#: stayed blocked on them): it is offered none.
SMALL_MODEL_BOUNDS = (
    "  max_string = 40\n  max_reply = 80\n  max_actions = 1\n  max_tool_calls = 1\n  plan_update = false\n"
)
TASK = "Record the side effect labelled hello, then reply done."


@pytest.mark.xdist_group("llama-server")  # the module's one server: see tests/conftest.py
def test_llama_cpp_server_refuses_json_schema_with_the_setting_named(llama_server: str) -> None:
    provider = OpenAIProvider(_config(base_url=llama_server, api_key_env=NO_KEY_ENV, max_tokens=8))
    request = ProviderRequest("run-1", "a", TASK, 0, (), TOOLS)
    with pytest.raises(ProviderError) as refused:
        trio.run(provider.complete, request)
    assert refused.value.kind is ErrorKind.TRANSIENT and 'set structured = "json_object"' in str(refused.value)
    # The same provider (the lane's) asks again in the form llama_cpp.server takes.
    answer = trio.run(provider.complete, request)
    assert answer.meta["status"] == 200 and json.loads(answer.text)


def _server_run(llama_server: str, workdir: Path, agent_id: str, agent: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One run of ``agent`` (its spec block, id ``agent_id``) on the server: what
    ``show`` says, and its usage as ``corral show --json`` reads it."""
    (workdir / "ws").mkdir()
    spec = 'name = "srv"\n[project]\nroot = "ws"\n[chaos]\neffects_file = "effects.log"\n' + agent
    with running(workdir / "home", spec) as daemon:
        run_id = daemon.call("run", agent_id=agent_id, task=TASK)["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"}, timeout=240)
        read = cli(daemon.home, "show", run_id, "--json")
        assert read.returncode == 0, read.stderr
    return shown, json.loads(read.stdout)["usage"]


@pytest.mark.xdist_group("llama-server")  # the module's one server: see tests/conftest.py
def test_a_schema_run_through_llama_cpp_server_needs_no_format_repair(llama_server: str, short_tmp: Path) -> None:
    # A 135M model needs the bounds the local grammar has: one call, then the reply.
    agent = _agent("schema", llama_server, "json_object", SMALL_MODEL_BOUNDS)
    shown, usage = _server_run(llama_server, short_tmp, "schema", agent)
    assert shown["run"]["status"] == "completed", shown["run"]
    assert usage["format_repairs"] == 0
    assert any(action["tool"] == "effect.record" and action["phase"] == "ok" for action in shown["actions"])
    assert isinstance(shown["final_reply"], str) and shown["final_reply"]


@pytest.mark.slow
@pytest.mark.xdist_group("llama-server")  # the module's one server: see tests/conftest.py
def test_what_the_schema_saves_the_same_run_as_text_json(llama_server: str, short_tmp: Path) -> None:
    """The same task and model asked for text-JSON (``structured = "none"``): its
    format repairs are printed for the record, not asserted (they depend on the
    model's sampling). A run of up to four generations that may end in a failed
    run: ``make chaos`` runs it, with the other long checks."""
    shown, usage = _server_run(llama_server, short_tmp, "plain", _agent("plain", llama_server, "none"))
    assert shown["run"]["status"] in ("completed", "failed"), shown["run"]
    print(f"\nllama_cpp.server, SmolLM2-135M, structured=none: {usage['format_repairs']} format repairs"
          f" ({shown['run']['status']}); structured=json_object needs 0 (the test above)")

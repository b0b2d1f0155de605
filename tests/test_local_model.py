"""The local model (issue 16): grammar from the tool catalog, model spec checks, and
SmolLM2-135M really run by a supervised model actor (one run, and a SIGKILL of the
model mid-generation). Structure is asserted, never the model's wording."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from corral.actors.agent import with_known_ids
from corral.actors.providers.base import ProviderRequest, ToolSchema
from corral.actors.providers.local import LocalConfig, LocalConfigError, answer_schema, chat_messages
from corral.actors.providers.local_schema import inline_refs, max_tokens_for, plan_schema
from corral.actors.tools.registry import builtin_tools
from corral.supervisor.models.model_spec import packaged_model_file
from corral.supervisor.spec.swarm_spec import SpecError, SwarmSpec, load_spec
from tests.harness import Daemon, cli, ledger_rows, running, wait_run

WRITE = builtin_tools()["fs.write"].schema
RECORD = builtin_tools()["effect.record"].schema
DELEGATE = builtin_tools()["agent.delegate"].schema
RUN_STATUS = builtin_tools()["agent.run_status"].schema


def _request(tools: tuple[ToolSchema, ...], history: tuple[dict[str, Any], ...] = ()) -> ProviderRequest:
    return ProviderRequest("run-1", "a", "write a file", len(history), history, tools)


def _valid(schema: dict[str, Any], answer: dict[str, Any]) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(answer)


# -- the grammar's schema (pure) --------------------------------------------------------


def test_the_schema_admits_exactly_the_catalog_calls_and_the_final_reply() -> None:
    schema = plan_schema((WRITE, RECORD))
    assert _valid(schema, {"actions": [{"tool": "fs.write", "input": {"path": "a.md", "content": "x"}}]})
    assert _valid(schema, {"final": "done"})
    assert not _valid(schema, {"actions": [{"tool": "fs.delete", "input": {"path": "a.md"}}]})
    assert not _valid(schema, {"actions": [{"tool": "fs.write", "input": {"path": "a.md"}}]})
    assert not _valid(schema, {"final": "done", "actions": []})
    assert not _valid(schema, {"final": ""})
    long_path = "p" * 121
    assert not _valid(schema, {"actions": [{"tool": "fs.write", "input": {"path": long_path, "content": "x"}}]})
    # Bounded strings bound the answer: the token budget covers the largest one.
    assert max_tokens_for(schema) > 2 * 120


def test_optional_fields_are_left_out_unless_asked_for() -> None:
    lean = plan_schema((DELEGATE,))
    full = plan_schema((DELEGATE,), optional=True)
    call = {"tool": "agent.delegate", "input": {"agent_id": "r", "task": "t", "repair_of": "x"}}
    assert not _valid(lean, {"actions": [call]})
    assert _valid(full, {"actions": [call]})


def test_tool_choice_budget_and_a_blocked_final_shape_each_turn() -> None:
    required = LocalConfig(tool_choice="required", max_tool_calls=1)
    first = answer_schema(required, _request((WRITE,)))
    assert not _valid(first, {"final": "too early"})
    observed = ({"action_id": "act-1", "tool": "fs.write", "status": "ok", "output": {}},)
    second = answer_schema(required, _request((WRITE,), observed))
    assert _valid(second, {"final": "done"})
    assert not _valid(second, {"actions": [{"tool": "fs.write", "input": {"path": "a", "content": "b"}}]})
    blocked = (
        *observed,
        {"role": "repair", "category": "final-blocked", "detail": "claim deliveries with agent.run_status"},
    )
    after = answer_schema(required, _request((WRITE, RUN_STATUS), blocked))
    assert _valid(after, {"actions": [{"tool": "agent.run_status", "input": {}}]})
    assert not _valid(after, {"final": "done"})
    assert not _valid(after, {"actions": [{"tool": "fs.write", "input": {"path": "a", "content": "b"}}]})


def test_spec_ids_become_enums_in_what_is_offered_only() -> None:
    offered = with_known_ids(DELEGATE, {"agent.delegate/agent_id": ["researcher", "reviewer"]})
    assert offered.input_schema["properties"]["agent_id"]["enum"] == ["researcher", "reviewer"]
    assert "enum" not in DELEGATE.input_schema["properties"]["agent_id"]
    assert with_known_ids(WRITE, {"agent.delegate/agent_id": ["r"]}) is WRITE


def test_refs_are_inlined_so_an_embedded_schema_stays_closed() -> None:
    schema = {
        "type": "object",
        "properties": {"item": {"$ref": "#/$defs/Item"}},
        "required": ["item"],
        "$defs": {"Item": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    }
    inlined = inline_refs(schema)
    assert "$defs" not in json.dumps(inlined)
    assert inlined["properties"]["item"]["properties"]["name"] == {"type": "string"}


def test_prompt_names_the_required_fields_and_bounds_observations() -> None:
    history = ({"action_id": "act-1", "tool": "fs.read", "status": "ok", "output": "x" * 5000},)
    request = _request((WRITE,), history)
    messages = chat_messages(request, answer_schema(LocalConfig(), request))
    assert '"path": string' in messages[0]["content"]
    assert len(messages[-1]["content"]) < 1800


def test_history_shows_the_model_its_own_call_then_the_result_as_a_tool_message() -> None:
    """Qwen2.5-Coder-0.5B made the same call again when results came as user
    messages; its own call then a ``tool`` result took it to the next step."""
    done = {"action_id": "act-1", "tool": "fs.write", "call": "fs.write(content=<2 chars>, path=a.md)",
            "input": {"path": "a.md", "content": "hi"}, "status": "ok", "output": {"bytes": 2}}
    failed = {**done, "action_id": "act-2", "status": "failed", "error": "denied: outside write_scopes"}
    answered = {"role": "repair", "category": "final-blocked", "detail": "claim first with agent.run_status"}
    request = _request((WRITE,), (answered, done, failed))
    messages = chat_messages(request, answer_schema(LocalConfig(), request))
    roles = [m["role"] for m in messages]
    # The repair came before a later result: it was acted on, and a small model copies
    # the last instruction it saw into its reply, so it is left out.
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert json.loads(messages[2]["content"]) == {"actions": [{"tool": "fs.write", "input": done["input"]}]}
    assert json.loads(messages[3]["content"]) == {"bytes": 2}
    assert messages[5]["content"] == "failed: denied: outside write_scopes"
    pending = _request((WRITE,), (done, answered))
    assert chat_messages(pending, answer_schema(LocalConfig(), pending))[-1]["role"] == "user", "still to act on"


@pytest.mark.parametrize(
    ("setting", "value"),
    [("tool_choice", "always"), ("max_tool_calls", -1), ("temperature", 3), ("timeout_s", 0), ("colour", 1)],
)
def test_bad_local_settings_are_named(setting: str, value: Any) -> None:
    with pytest.raises(LocalConfigError, match=setting):
        LocalConfig.from_mapping({setting: value})


# -- the spec: models found at `corral up` ------------------------------------------------

AGENT = """
[[agents]]
id = "{id}"
provider = "local"
tools = ["effect.record"]
  [agents.local]
  model = "{model}"
  tool_choice = "required"
  max_tool_calls = 1
"""


def _local_spec(tmp: Path, agents: str, extra: str = "") -> str:
    (tmp / "ws").mkdir(exist_ok=True)
    return f'name = "lm"\n[project]\nroot = "ws"\n[chaos]\neffects_file = "effects.log"\n{extra}\n{agents}'


def load_spec_text(text: str, path: str) -> SwarmSpec:
    Path(path).write_text(text)
    return load_spec(Path(path))


def test_agents_naming_one_model_share_one_model_actor(tmp_path: Path) -> None:
    text = _local_spec(tmp_path, AGENT.format(id="a", model="smollm2") + AGENT.format(id="b", model="smollm2"))
    spec = load_spec_text(text, str(tmp_path / "swarm.toml"))
    (model,) = spec.models
    assert Path(model.path) == packaged_model_file("smollm2")
    assert [a.id for a in spec.actors if a.template == "model"] == ["model-smollm2"]
    assert {a.provider_config["model"] for a in spec.agents} == {"smollm2"}


@pytest.mark.parametrize(
    ("model", "written", "message"),
    [
        ("missing.gguf", None, "does not exist"),
        ("notes.gguf", b"not a model", "is not a GGUF file"),
        ("dir.gguf", "dir", "is not a regular file"),
    ],
)
def test_a_bad_model_file_stops_corral_up_with_its_place(
    tmp_path: Path, model: str, written: bytes | str | None, message: str
) -> None:
    if written == "dir":
        (tmp_path / model).mkdir()
    elif isinstance(written, bytes):
        (tmp_path / model).write_bytes(written)
    text = _local_spec(tmp_path, AGENT.format(id="a", model=model))
    with pytest.raises(SpecError, match=rf"agents\[0\]\.local\.model: .*{message}"):
        load_spec_text(text, str(tmp_path / "swarm.toml"))


def test_models_tables_are_checked(tmp_path: Path) -> None:
    for extra, message in (
        ('[[models]]\nid = "m"\nthreads = 2', "unknown key 'threads'; did you mean 'n_threads'"),
        ('[[models]]\nid = "m"\nn_ctx = 10', r"models\[0\]\.n_ctx: must be a finite number between"),
        ('[[models]]\nid = "m"\npath = "nope.gguf"', r"models\[0\]\.path: model file .* does not exist"),
    ):
        with pytest.raises(SpecError, match=message):
            load_spec_text(_local_spec(tmp_path, "", extra), str(tmp_path / "swarm.toml"))


# -- the real model -------------------------------------------------------------------------


def _effects(home_dir: Path) -> list[dict[str, Any]]:
    path = home_dir / "ws" / "effects.log"
    if not path.exists():
        path = home_dir / "effects.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _model_status(daemon: Daemon) -> dict[str, Any]:
    (model,) = daemon.call("status")["models"]
    return dict(model)


def _one_tool_run(daemon: Daemon) -> dict[str, Any]:
    run_id = daemon.call("run", agent_id="a", task="Record the side effect labelled hello, then reply done.")["run_id"]
    return wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"}, timeout=240)


def _assert_one_call_one_reply(daemon: Daemon, shown: dict[str, Any], tmp: Path) -> None:
    assert shown["run"]["status"] == "completed", shown["run"]
    (action,) = shown["actions"]
    assert action["tool"] == "effect.record" and action["phase"] == "ok"
    effects = _effects(tmp)
    assert [line["action_id"] for line in effects] == [action["action_id"]]
    assert isinstance(shown["final_reply"], str) and shown["final_reply"]
    assert len(ledger_rows(daemon.home, "SELECT * FROM replies WHERE run_id = ?", shown["run"]["run_id"])) == 1
    usage = shown["usage"]
    assert usage["format_repairs"] == 0
    assert usage["completion_tokens"] > 0 and usage["model_ms"] > 0
    # Every committed answer was a grammar-shaped plan.
    for row in ledger_rows(
        daemon.home, "SELECT response FROM provider_requests WHERE run_id = ? AND response IS NOT NULL",
        shown["run"]["run_id"],
    ):
        content = json.loads(row["response"])["choices"][0]["message"]["content"]
        assert set(json.loads(content)) in ({"actions"}, {"final"})


AWS_KEY = "AKIAQ3EGZXKP7RT2LMNB"


def _assert_transcript_shows_each_turn(daemon: Daemon, run_id: str) -> None:
    """`corral transcript` (issue 34): each prompt and completion, the secret masked
    there and absent from the ledger file's bytes."""
    read = cli(daemon.home, "transcript", run_id, "--json")
    assert read.returncode == 0, read.stderr
    turns = json.loads(read.stdout)["turns"]
    assert [t["status"] for t in turns] == ["completed", "completed"]
    responses = [row["response"] for row in ledger_rows(
        daemon.home, "SELECT response FROM provider_requests WHERE run_id = ? ORDER BY rowid", run_id)]
    assert [t["response"] for t in turns] == responses
    first = turns[0]["system"]["text"]
    assert first.startswith("You are corral agent a.") and "Deploy key: [redacted]" in first
    # After its one tool call the grammar allows only the final reply: a new prompt.
    assert turns[1]["system"]["unchanged"] is False and turns[1]["system"]["text"] != first
    assert turns[0]["plan"]["actions"][0]["tool"] == "effect.record" and turns[1]["plan"]["final"]
    # What the model wrote, out of the completion envelope the response keeps.
    said = json.loads(str(turns[0]["said"]))
    assert said["actions"][0]["tool"] == "effect.record" and '"choices"' not in turns[0]["said"]
    text = cli(daemon.home, "transcript", run_id)
    assert text.returncode == 0 and text.stdout.count("model said:") == 2 and "effect.record(" in text.stdout
    assert AWS_KEY not in read.stdout + text.stdout
    ledger = daemon.home / "ledger.db"
    stored = b"".join(p.read_bytes() for p in (ledger, ledger.with_name("ledger.db-wal")) if p.exists())
    assert b"Deploy key: [redacted]" in stored and AWS_KEY.encode() not in stored


def test_a_real_model_plans_one_tool_call_and_one_final_reply(short_tmp: Path) -> None:
    # A token budget too, low enough that no bound from the characters alone settles it:
    # the second turn's view is counted by the model's tokenizer (one observation
    # never compacts: the newest 4 stay as they are; the output is not cut). It leaves
    # room for what the turn carries besides (its prompt and tool schemas: about 300
    # tokens), else the turn fails closed.
    budget = 'provider = "local"\nauto_compact_token_limit = 600\ntool_output_token_limit = 4000\n'
    agent = AGENT.format(id="a", model="smollm2").replace('provider = "local"\n', budget)
    spec = _local_spec(short_tmp, agent)
    # A secret in a file the agent reads (the project's instructions, in its prompt).
    (short_tmp / "ws" / "AGENTS.md").write_text(f"Be brief. Deploy key: {AWS_KEY}\n")
    with running(short_tmp / "home", spec) as daemon:
        shown = _one_tool_run(daemon)
        _assert_one_call_one_reply(daemon, shown, short_tmp)
        _assert_transcript_shows_each_turn(daemon, shown["run"]["run_id"])
        model = _model_status(daemon)
        assert model["status"] == "ready" and model["restarts"] == 0 and model["requests"] == 2
        assert model["token_counts"] >= 1, "the second turn's view was counted by the tokenizer"
        shown_text = cli(daemon.home, "show", shown["run"]["run_id"])
        assert shown_text.returncode == 0
        assert "provider: 2 answers, 0 format repairs" in shown_text.stdout
        # Compaction counts a local model's tokens with its own tokenizer.
        from corral.supervisor.longtask.compaction import estimate_tokens

        texts = ["hello world", "x" * 400, json.dumps({"tool": "fs.list", "output": {"entries": ["a", "b"]}})]
        counts = daemon.call("model.count_tokens", model=model["id"], texts=texts)["counts"]
        assert len(counts) == 3 and all(n > 0 for n in counts) and counts[0] <= 3
        assert counts != [estimate_tokens(text) for text in texts], "the tokenizer, not the estimate"


def test_sigkill_of_the_model_mid_generation_is_a_durable_retry(short_tmp: Path) -> None:
    spec = _local_spec(short_tmp, AGENT.format(id="a", model="smollm2"))
    env = {"CORRAL_FAILPOINTS": "model.mid-generation=kill@once"}
    with running(short_tmp / "home", spec, env=env) as daemon:
        shown = _one_tool_run(daemon)
        _assert_one_call_one_reply(daemon, shown, short_tmp)
        # The killed generation is a failed, transient lifecycle; its retry answered.
        requests = shown["provider_requests"]
        assert [r["status"] for r in requests].count("failed") == 1, requests
        assert next(r for r in requests if r["status"] == "failed")["error_kind"] == "transient"
        model = _model_status(daemon)
        assert model["restarts"] == 1 and model["status"] == "ready"
        assert (daemon.home / "failpoints" / "model.mid-generation.fired").exists()

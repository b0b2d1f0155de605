"""An agent's typed output (issue 49 §2): ``output`` as a JSON Schema table or a
pydantic model (``"module:Class"``, or the class itself from Python). The model is
constrained where its provider allows (the local grammar, an OpenAI-compatible
``response_format``, a scripted ``final`` table); an invalid output gets the
bounded repair naming the field, and past it the run fails naming the field;
``RunResult.output``, ``corral show --json`` and delegation results carry the
validated value, and the final reply is its JSON."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.actors.providers.base import ProviderRequest
from corral.actors.providers.local import LocalConfig, answer_schema
from corral.actors.providers.openai import OpenAIConfig, build_chat_payload
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.spec.swarm_spec import SpecError, parse_spec
from tests.harness import cli, ledger_rows, running, wait_run

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

FORECAST = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temperature_c": {"type": "number"}},
    "required": ["city", "temperature_c"],
    "additionalProperties": False,
}
MODELS = '''
import pydantic


class Forecast(pydantic.BaseModel):
    city: str
    temperature_c: float

    @pydantic.field_validator("city")
    @classmethod
    def capitalised(cls, value: str) -> str:
        if not value[:1].isupper():
            raise ValueError("a city name starts with a capital letter")
        return value


class NotAModel:
    pass
'''


def _models(base: Path) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    (base / "forecast_models.py").write_text(textwrap.dedent(MODELS))
    return base


def _agent(output: Any, finals: list[Any], **more: Any) -> dict[str, Any]:
    return {"id": "forecaster", "output": output, "steps": [{"final": final} for final in finals], **more}


# -- the spec ---------------------------------------------------------------------------


def test_the_spec_takes_a_schema_table_or_a_model_and_refuses_what_is_neither(tmp_path: Path) -> None:
    _models(tmp_path)
    source = str(tmp_path / "swarm.toml")

    def parsed(output: Any) -> Any:
        return parse_spec({"project": {"root": str(tmp_path)}, "agents": [_agent(output, ["x"])]}, source).agents[0]

    assert parsed(FORECAST).output == {"schema": FORECAST, "model": None}
    by_model = parsed("forecast_models:Forecast").output
    assert by_model["model"] == "forecast_models:Forecast"
    assert set(by_model["schema"]["properties"]) == {"city", "temperature_c"}
    for bad, says in [({"type": "object", "properties": 5}, "not a valid JSON Schema"),
                      ({"type": "string"}, "JSON object"),
                      ("forecast_models:NotAModel", "not a pydantic model"),
                      ("forecast_models:Missing", "no attribute"),
                      (5, "JSON Schema")]:
        with pytest.raises(SpecError, match=r"agents\[0\]\.output") as caught:
            parsed(bad)
        assert says in str(caught.value), caught.value


# -- the providers ----------------------------------------------------------------------


def _request(output: dict[str, Any] | None) -> ProviderRequest:
    return ProviderRequest(run_id="r", agent_id="a", task="t", loop_index=0, history=(), tools=(), slot="s",
                           output_schema=output)


def test_the_local_grammar_and_the_openai_response_format_carry_the_output_schema() -> None:
    local = answer_schema(LocalConfig(), _request(FORECAST))
    final = local["properties"]["final"]
    assert final["required"] == ["city", "temperature_c"] and final["properties"]["temperature_c"]["type"] == "number"
    assert answer_schema(LocalConfig(), _request(None))["properties"]["final"]["type"] == "string"
    payload = build_chat_payload(OpenAIConfig(model="m", base_url="http://127.0.0.1:9/v1"), _request(FORECAST))
    sent = payload["response_format"]["json_schema"]["schema"]
    assert sent["properties"]["final"]["properties"]["city"]["type"] == "string"


def test_an_openai_server_that_refuses_json_schema_gets_json_object_next() -> None:
    from corral.actors.providers.openai import OpenAIProvider

    provider = OpenAIProvider(OpenAIConfig(model="m", base_url="http://127.0.0.1:9/v1"))
    request = _request(FORECAST)
    assert provider.payload(request)["response_format"]["type"] == "json_schema"
    provider.refused_format('{"error": "response_format json_schema is not supported"}')
    fallback = provider.payload(request)["response_format"]
    assert fallback["type"] == "json_object" and fallback["schema"]["properties"]["final"]["required"]


# -- real runs --------------------------------------------------------------------------


def test_a_scripted_table_final_is_the_validated_output_everywhere(short_tmp: Path) -> None:
    value = {"city": "Oslo", "temperature_c": -2.0}
    spec = {"project": {"root": str(short_tmp)}, "agents": [_agent(FORECAST, [value])]}
    with corral.Client.start(spec=spec, home=short_tmp / "h") as client:
        result = client.run("forecaster", "Oslo?", timeout=60).check()
    assert result.output == value
    assert json.loads(result.final_reply or "") == value, "the final reply is the output's JSON"
    shown = cli(short_tmp / "h", "show", result.run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["output"] == value


def test_the_python_api_takes_the_pydantic_class_and_returns_an_instance(short_tmp: Path) -> None:
    _models(short_tmp / "site")
    sys.path.insert(0, str(short_tmp / "site"))
    try:
        from forecast_models import Forecast  # type: ignore[import-not-found]

        spec = {"project": {"root": str(short_tmp)},
                "agents": [_agent(Forecast, [{"city": "Oslo", "temperature_c": -2}])]}
        with corral.Client.start(spec=spec, home=short_tmp / "h") as client:
            result = client.run("forecaster", "Oslo?", timeout=60).check()
    finally:
        sys.path.remove(str(short_tmp / "site"))
        sys.modules.pop("forecast_models", None)
    assert isinstance(result.output, Forecast) and result.output.temperature_c == -2.0
    assert json.loads(result.final_reply or "") == {"city": "Oslo", "temperature_c": -2.0}


def test_an_invalid_output_is_repaired_with_the_field_then_fails_naming_its_category(short_tmp: Path) -> None:
    _models(short_tmp)
    (short_tmp / "ws").mkdir()
    spec = f"""
[project]
root = "ws"
[[agents]]
id = "forecaster"
output = "forecast_models:Forecast"
max_repairs = 1
  [[agents.steps]]
  when_task = "repaired"
  unless_observed = "output.city"
  final = {{ city = "oslo", temperature_c = -2 }}
  [[agents.steps]]
  when_task = "repaired"
  when_observed = "output.city"
  final = {{ city = "Oslo", temperature_c = -2 }}
  [[agents.steps]]
  when_task = "hopeless"
  unless_observed = "as JSON"
  final = "It is cold in Oslo."
  [[agents.steps]]
  when_task = "hopeless"
  when_observed = "as JSON"
  final = {{ city = "Oslo", temperature_c = "cold" }}
[[agents]]
id = "schematic"
max_repairs = 0
output = {json.dumps(FORECAST).replace('":', '" =')}
steps = [{{ final = {{ city = "Oslo" }} }}]
"""
    with running(short_tmp / "h", spec) as daemon:
        repaired = daemon.call("run", agent_id="forecaster", task="repaired")["run_id"]
        hopeless = daemon.call("run", agent_id="forecaster", task="hopeless")["run_id"]
        schematic = daemon.call("run", agent_id="schematic", task="x")["run_id"]
        shown = {run: wait_run(daemon, run, {"completed", "failed"}) for run in (repaired, hopeless, schematic)}
        repairs = ledger_rows(daemon.home, "SELECT data FROM observations WHERE run_id = ?", repaired)
    assert shown[repaired]["run"]["status"] == "completed", shown[repaired]["run"]["reason"]
    assert shown[repaired]["output"] == {"city": "Oslo", "temperature_c": -2.0}
    assert any("output.city" in row["data"] and "capital letter" in row["data"] for row in repairs), repairs
    # A failed run's reason names the category and the counts, never the parse error or the
    # model's text (seed 004 V1.17, V1.33): the field went to the model in its repair.
    failed = shown[hopeless]["run"]
    assert failed["status"] == "failed" and "invalid plan from the provider (" in failed["reason"], failed
    assert "cold" not in failed["reason"] and "temperature_c" not in failed["reason"], failed
    assert shown[hopeless]["output"] is None and shown[hopeless]["final_reply"] is None
    reason = shown[schematic]["run"]["reason"]
    assert shown[schematic]["run"]["status"] == "failed" and "max_repairs is 0" in reason, reason
    assert "Oslo" not in reason and "temperature_c" not in reason, reason


def test_a_delegation_result_carries_the_specialists_output(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spec = f"""
[project]
root = "ws"
[policy]
default = "auto"
[[agents]]
id = "lead"
  [[agents.steps]]
  actions = [{{ tool = "agent.delegate", input = {{ agent_id = "forecaster", task = "Forecast Oslo" }} }}]
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  final = "forecast in"
[[agents]]
id = "forecaster"
role = "specialist"
output = {json.dumps(FORECAST).replace('":', '" =')}
  [[agents.steps]]
  actions = [{{ tool = "fs.list", input = {{ path = "." }} }}]
  [[agents.steps]]
  final = {{ city = "Oslo", temperature_c = -2 }}
"""
    with running(short_tmp / "h", spec) as daemon:
        run_id = daemon.call("run", agent_id="lead", task="forecast")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        observations = ledger_rows(daemon.home, "SELECT data FROM observations WHERE run_id = ?", run_id)
    assert shown["run"]["status"] == "completed", shown["run"]
    result = shown["swarm"]["delegations"][0]["result"]
    assert result["output"] == {"city": "Oslo", "temperature_c": -2}
    assert any('"output":{"city":"Oslo","temperature_c":-2}' in row["data"] for row in observations), observations


def test_a_childs_result_carries_its_templates_output(open_ledger: Any) -> None:
    from corral.supervisor.runs import action_store, run_store
    from corral.supervisor.runs.action_state import ActionPhase
    from corral.supervisor.swarm import children_store

    spec = parse_spec({"templates": [{"id": "helper", "output": FORECAST, "steps": [{"final": {"city": "Oslo"}}]}],
                       "agents": [{"id": "boss", "steps": [{"final": "x"}]}]})
    ledger = open_ledger()
    ledger.begin_boot("b", 1, 1)
    run_id = run_store.create_run(ledger, NO_FEATURES,
                                  agent_id="boss", task="t", provider="scripted", provider_config={},
                                  options={"workspace": "/tmp"})
    row = action_store.prepare_action(ledger, run_id, 0, 0, "agent.spawn_isolated", {}, NO_FEATURES, rerunnable=True,
                                      policy="auto")
    run_store.set_run_status(ledger, run_id, run_store.RunStatus.RUNNING, NO_FEATURES)
    action_store.move_action(ledger, row["action_id"], ActionPhase.EXECUTING)
    view = children_store.spawn_group(ledger, spec, run_store.get_run(ledger, run_id), row["action_id"],
                                      [{"template": "helper", "task": "forecast", "write_scopes": ["a"]}], "all",
                                      NO_FEATURES)
    child_run = view["children"][0]["run_id"]
    assert json.loads(run_store.get_run(ledger, child_run)["options"])["output"] == {"schema": FORECAST,
                                                                                       "model": None}
    run_store.set_run_status(ledger, child_run, run_store.RunStatus.RUNNING, NO_FEATURES)
    children_store.finish_child(ledger, child_run, '{"city": "Oslo", "temperature_c": -2.0}', None, NO_FEATURES)
    result = json.loads(ledger.one("SELECT result FROM children WHERE run_id = ?", child_run)["result"])
    assert result["output"] == {"city": "Oslo", "temperature_c": -2.0}

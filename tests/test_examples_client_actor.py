"""Every example runs for real: python_api.py, custom_actor/, custom_tools/, multi_agent/
and local_model.py (on the packaged Qwen2.5-Coder-0.5B)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _example(script: str, base: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), "--dir", str(base)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=base.parent,  # not the repository: the example must not rely on it
    )


def test_python_api_example_runs_and_prints_the_reply(short_tmp: Path) -> None:
    result = _example("python_api.py", short_tmp / "api")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("run run-") and lines[0].endswith(": completed")
    assert "final reply: Wrote notes/hello.md" in lines
    assert (short_tmp / "api" / "project" / "notes" / "hello.md").read_text() == "# Hello from corral\n"
    assert not (short_tmp / "api" / ".corral" / "endpoint.json").exists(), "the supervisor was stopped"


def test_custom_actor_example_survives_a_sigkill(short_tmp: Path) -> None:
    result = _example("custom_actor/drive.py", short_tmp / "actor")
    assert result.returncode == 0, result.stderr
    assert "(incarnation 1)" in result.stdout and "total 6 from pid" in result.stdout
    assert "restarts: 1" in result.stdout
    assert (short_tmp / "actor" / "total.txt").read_text() == "6"


def test_custom_tools_example_validates_and_orders_once(short_tmp: Path) -> None:
    result = _example("custom_tools/run.py", short_tmp / "tools")
    assert result.returncode == 0, result.stderr
    assert ": completed" in result.stdout.splitlines()[0]
    assert "invalid argument quantity" in result.stdout
    orders = (short_tmp / "tools" / "project" / "orders.jsonl").read_text().splitlines()
    assert len(orders) == 1 and '"quantity": 12' in orders[0]


def test_multi_agent_example_delegates_spawns_claims_and_replies(short_tmp: Path) -> None:
    result = _example("multi_agent/run.py", short_tmp / "swarm")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.splitlines()[0].endswith(": completed")
    assert "changelog  evidence-ready  changes/list.md" in out
    assert "checker    evidence-ready  checks/upgrade.md" in out
    assert "group joined" in out and out.count(" translator  ok ") == 2
    assert "deliveries claimed: 3 in 1 claim(s), observed" in out
    assert "final reply: Release 2.0 is ready" in out
    project = short_tmp / "swarm" / "project"
    for artifact in ("changes/list.md", "checks/upgrade.md", "i18n/de/summary.md", "i18n/fr/summary.md",
                     "release/2.0.md"):
        assert (project / artifact).is_file(), artifact
    assert not (short_tmp / "swarm" / ".corral" / "endpoint.json").exists(), "the supervisor was stopped"


def test_quickstart_example_runs_a_typed_tool_from_a_spec_dict(short_tmp: Path) -> None:
    result = _example("quickstart.py", short_tmp / "quick")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["weather: ok", "output: Forecast(city='Oslo', temperature_c=-2.0)"]
    assert not (short_tmp / "quick" / ".corral" / "endpoint.json").exists(), "the supervisor was stopped"


def test_local_model_example_calls_both_tools_and_replies(short_tmp: Path) -> None:
    """The quickstart's task on a real model: weather, then the post the host reads back."""
    base = short_tmp / "local"
    result = _example("local_model.py", base)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["weather: ok", "post: ok"], result.stdout
    posted = [json.loads(line) for line in (base / "posted.jsonl").read_text().splitlines()]
    assert len(posted) == 1 and posted[0]["channel"] == "#ops" and "-2" in posted[0]["text"]
    reply = lines[-1].removeprefix("reply: ")
    assert lines[-1].startswith("reply: ") and reply.strip(), result.stdout


def test_typed_output_example_returns_a_schema_valid_forecast_on_the_local_model(short_tmp: Path) -> None:
    """An agent with instructions and a typed output, on the demo's Qwen2.5-Coder-0.5B:
    the output is an instance of the caller's pydantic class, and the reply its JSON."""
    result = _example("typed_output/forecast.py", short_tmp / "typed")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "weather: ok", result.stdout
    kind, _, shown = lines[1].removeprefix("output: ").partition(" ")
    assert lines[1].startswith("output: ") and kind == "Forecast", result.stdout
    output = json.loads(shown)
    assert set(output) == {"city", "temperature_c"} and isinstance(output["temperature_c"], float)
    assert json.loads(lines[2].removeprefix("reply: ")) == output, "the final reply is the output's JSON"


def test_async_approve_example_waits_follows_and_approves_on_one_client(short_tmp: Path) -> None:
    """The asyncio example: one AsyncClient waits, follows and approves at once."""
    result = _example("async_approve.py", short_tmp / "async")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "approved fs.write" in result.stdout
    assert "completed" in result.stdout and "run-completed" in result.stdout
    assert (short_tmp / "async" / "project" / "notes.md").read_text() == "approved from asyncio\n"

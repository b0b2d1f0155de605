"""User tools (issue 15): typed functions from a package outside the repository,
loaded from a spec and called by a scripted agent, with the guarantees of the
built-ins: validation before anything runs, effect classes deciding recovery, real
SIGKILLs at named failpoints, and the chaos invariants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.core import failpoints
from tests.harness import cli, ledger_rows, running, wait_run

TOOLS = '''
import json
import os
import time

import corral


def _count(ctx, tool, **fields):
    # The swarm's effects file (an actor's environment is scrubbed): chaos counts it.
    with open(ctx.effects_file, "a") as handle:
        handle.write(json.dumps({"tool": tool, "action_id": ctx.action_id, "key": ctx.idempotency_key,
                                 "label": tool, "at": time.time(), **fields}) + "\\n")
        handle.flush()
        os.fsync(handle.fileno())


@corral.tool(effect="external", name="mail.send", timeout_s=30)
def send_mail(ctx: corral.ToolContext, to: str, subject: str, body: str = "") -> dict:
    """Send one e-mail."""
    _count(ctx, "mail.send", to=to)
    return {"sent": True, "to": to}


@corral.tool(effect="read", name="weather.lookup")
async def lookup(ctx: corral.ToolContext, city: str, days: int = 1) -> dict:
    """Look up the weather."""
    _count(ctx, "weather.lookup", city=city)
    return {"city": city, "days": days, "sky": "clear"}


@corral.tool(effect="idempotent", name="crm.upsert")
def upsert(ctx: corral.ToolContext, customer: str) -> str:
    """Create or update a customer record."""
    _count(ctx, "crm.upsert", customer=customer)
    return f"upserted {customer}"


@corral.tool(effect="read", name="report.big")
def big(ctx: corral.ToolContext, kilobytes: int) -> str:
    """A large result."""
    return "z" * (kilobytes * 1024)


@corral.tool(effect="read", name="slow.sleep", timeout_s=0.5)
def slow(ctx: corral.ToolContext, seconds: float) -> str:
    """Sleeps too long."""
    time.sleep(seconds)
    return "woke"


@corral.tool(name="always.fails")
def fails(ctx: corral.ToolContext) -> None:
    """Raises."""
    raise RuntimeError("the api said 503 token=hunter2hunter2")
'''


def write_package(base: Path) -> Path:
    package = base / "userpkg_tools"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text(TOOLS)
    return package


def _spec_with(steps: str, *, modules: str = '"userpkg_tools.tools"') -> str:
    return f"""
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
[tools]
modules = [{modules}]
[[agents]]
id = "writer"
tools = ["mail.*", "weather.lookup", "crm.*", "report.*", "slow.*", "always.*", "fs.read"]
{steps}
"""


def _inline(value: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + " }"


@pytest.fixture
def project(short_tmp: Path) -> Path:
    (short_tmp / "ws").mkdir()
    write_package(short_tmp / "site")
    return short_tmp


def _env(project: Path, **more: str) -> dict[str, str]:
    return {"PYTHONPATH": str(project / "site"), **more}


def _calls(project: Path) -> list[dict[str, Any]]:
    path = project / "effects.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


ALL_STEPS = """
[[agents.steps]]
actions = [
  { tool = "mail.send", input = { to = "ann@example.com", subject = "hi" } },
  { tool = "weather.lookup", input = { city = "Oslo" } },
]
[[agents.steps]]
actions = [
  { tool = "mail.send", input = { to = 5, subject = "bad" } },
  { tool = "mail.send", input = { to = "x", subject = "s", cc = "extra" } },
]
[[agents.steps]]
actions = [
  { tool = "report.big", input = { kilobytes = 100 } },
  { tool = "slow.sleep", input = { seconds = 3 } },
  { tool = "always.fails", input = {} },
]
[[agents.steps]]
final = "done"
"""


def test_user_tools_run_with_validation_effects_timeouts_and_sidecars(project: Path) -> None:
    with running(project / "home", _spec_with(ALL_STEPS), env=_env(project)) as daemon:
        shown = wait_run(daemon, daemon.call("run", agent_id="writer", task="use my tools")["run_id"],
                         {"completed", "failed"})
        assert shown["run"]["status"] == "completed", (shown["run"]["reason"], shown["actions"])
        phases = [(a["tool"], a["phase"]) for a in shown["actions"]]
        assert phases == [
            ("mail.send", "ok"), ("weather.lookup", "ok"),
            ("mail.send", "failed"), ("mail.send", "failed"),
            ("report.big", "ok"), ("slow.sleep", "failed"), ("always.fails", "failed"),
        ]
        rows = {a["action_id"]: a for a in ledger_rows(daemon.home, "SELECT * FROM actions")}
        bad_type, bad_extra = (rows[a["action_id"]] for a in shown["actions"][2:4])
        for row, field in ((bad_type, "to"), (bad_extra, "cc")):
            assert row["executing_at"] is None and field in row["error"]  # never executing, never called
        # Bad arguments never called the function: two sends went through, not four.
        assert [c["tool"] for c in _calls(project)] == ["mail.send", "weather.lookup"]
        big = json.loads(rows[shown["actions"][4]["action_id"]]["result"])["output"]
        assert big["truncated"] and Path(big["sidecar"]).is_file() and big["bytes"] > 100 * 1024
        assert "within 0.5 s" in rows[shown["actions"][5]["action_id"]]["error"]
        failed = rows[shown["actions"][6]["action_id"]]["error"]
        assert "RuntimeError" in failed and "hunter2hunter2" not in failed  # redacted message
        assert daemon.actor("writer")["incarnation"] == 1  # no tool crashed the agent
        schema = ledger_rows(daemon.home, "SELECT rerunnable, tool FROM actions WHERE tool = 'weather.lookup'")
        assert schema[0]["rerunnable"] == 1


@pytest.mark.parametrize(
    ("tool", "args", "phase", "runs"),
    [
        ("mail.send", {"to": "bob", "subject": "s"}, "needs-reconciliation", 1),  # external: never twice
        ("weather.lookup", {"city": "Rome"}, "ok", 2),  # read: runs again
        ("crm.upsert", {"customer": "acme"}, "ok", 2),  # idempotent: again, same key
    ],
)
def test_sigkill_after_the_effect_keeps_each_effect_class_contract(
    project: Path, tool: str, args: dict[str, Any], phase: str, runs: int
) -> None:
    steps = f'[[agents.steps]]\nactions = [{{ tool = "{tool}", input = {_inline(args)} }}]\n'
    steps += '[[agents.steps]]\nfinal = "ok"\n'
    env = _env(project, CORRAL_FAILPOINTS="agent.after-effect=kill@once")
    with running(project / "home", _spec_with(steps), env=env) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="once")["run_id"]
        shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
        (action,) = shown["actions"]
        assert action["phase"] == phase
        calls = _calls(project)
        assert len(calls) == runs and {c["action_id"] for c in calls} == {action["action_id"]}
        assert {c["key"] for c in calls} == {action["action_id"]}  # the idempotency key is stable
        assert daemon.actor("writer")["incarnation"] == 2


def test_a_broken_tools_module_stops_corral_up_with_a_clear_error(project: Path) -> None:
    (project / "site" / "userpkg_tools" / "broken.py").write_text("import corral\nraise ImportError('no such sdk')\n")
    spec = project / "swarm.toml"
    spec.write_text(_spec_with('[[agents.steps]]\nfinal = "x"\n', modules='"userpkg_tools.broken"'))
    result = cli(project / "home", "up", "--spec", str(spec), env=_env(project))
    assert result.returncode == 2, result.stdout
    assert "userpkg_tools.broken" in result.stderr and "no such sdk" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (project / "home" / "endpoint.json").exists()
    bad_signature = project / "local_tools.py"
    bad_signature.write_text("import corral\n@corral.tool\ndef oops(ctx, untyped):\n    pass\n")
    spec.write_text(_spec_with('[[agents.steps]]\nfinal = "x"\n', modules='"./local_tools.py"'))
    result = cli(project / "home", "up", "--spec", str(spec), env=_env(project))
    assert result.returncode == 2 and "needs a type annotation" in result.stderr


def test_a_tools_module_by_file_path_next_to_the_spec(project: Path) -> None:
    (project / "local_tools.py").write_text(
        "import corral\n\n@corral.tool(effect='read', name='local.echo')\n"
        "def echo(ctx: corral.ToolContext, text: str) -> dict:\n    '''Echo.'''\n    return {'echo': text}\n"
    )
    steps = '[[agents.steps]]\nactions = [{ tool = "local.echo", input = { text = "hello" } }]\n'
    steps += '[[agents.steps]]\nfinal = "ok"\n'
    # Beside the package's tools, which the agent's `tools` globs name (a glob matching nothing is an error).
    modules = '"./local_tools.py", "userpkg_tools.tools"'
    spec = _spec_with(steps, modules=modules).replace('tools = ["mail.*"', 'tools = ["local.*", "mail.*"')
    with running(project / "home", spec, env=_env(project)) as daemon:
        shown = wait_run(daemon, daemon.call("run", agent_id="writer", task="echo")["run_id"], {"completed", "failed"})
        assert shown["actions"][0]["phase"] == "ok" and "hello" in json.dumps(shown)


def test_chaos_accepts_a_spec_with_user_tools_and_its_invariants_hold(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.chaos.runner import Runner, file_scenario

    # The user tools write their effects to the chaos effects file, like effect.record.
    monkeypatch.syspath_prepend(str(project / "site"))
    monkeypatch.setenv("PYTHONPATH", str(project / "site"))
    scenario = project / "scenario.toml"
    steps = (
        '[[agents.steps]]\nactions = [{ tool = "mail.send", input = { to = "ops", subject = "s" } }]\n'
        '[[agents.steps]]\nactions = [{ tool = "crm.upsert", input = { customer = "c" } }]\n'
        '[[agents.steps]]\nfinal = "ok"\n'
    )
    text = _spec_with(steps).replace('root = "ws"', 'root = "project"')
    scenario.write_text(text.replace('[[agents]]\nid = "writer"', '[[agents]]\nid = "writer"\nrole = "root"'))
    runner = Runner(
        file_scenario(scenario), seed=3, targets=("supervisor", "agents"), workdir=project / "w", verbose=False
    )
    for name in ("agent.before-effect", "agent.after-effect", "action.after-executing"):
        runner.failpoint_episode(name, "agents" if name in failpoints.ACTOR_SIDE else "supervisor")
    report = runner.report(0.0)
    failed = {n: e["failures"] for n, e in report["invariants"].items() if not e["passed"]}
    assert failed == {}
    assert report["invariants"]["side effect at most once, never before executing"]["count"] >= 3


def test_a_parameter_named_title_is_a_parameter_not_schema_metadata() -> None:
    """pydantic's schemas carry ``title`` as metadata, which the normal form drops;
    a tool argument called ``title`` is a property name and must stay."""
    from pydantic import BaseModel

    from corral.actors.tools.typed_schema import normal_form
    from corral.actors.tools.validation import validation_error

    class Ticket(BaseModel):
        title: str
        priority: int = 1

    schema = normal_form(Ticket.model_json_schema())
    assert set(schema["properties"]) == {"title", "priority"} and schema["required"] == ["title"]
    assert "title" not in schema["properties"]["title"]  # the metadata inside is still dropped
    assert validation_error("ticket.open", schema, {"title": "printer on fire"}) is None
    assert "title" in (validation_error("ticket.open", schema, {"priority": 2}) or "")

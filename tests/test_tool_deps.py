"""Dependencies for tools (issue 49, section 5): a ``deps`` factory per agent or for
all, called once in each agent's process at start, before any tool runs; its value
reaches tools as ``ctx.deps`` (typed ``ToolContext[Deps]``); an async context
manager is entered at start and exited when the actor stops; a factory that fails
stops ``corral up`` with its traceback. All on real processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness import cli, ledger_rows, running, wait_run

DEPS = '''
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

LOG = Path(__file__).parent.parent / "deps.log"


def _record(what, label):
    with open(LOG, "a") as handle:
        handle.write(json.dumps({"what": what, "label": label, "pid": os.getpid()}) + "\\n")


@dataclass
class Deps:
    label: str
    pid: int


@contextlib.asynccontextmanager
async def make():
    _record("enter", "all")
    try:
        yield Deps("all", os.getpid())
    finally:
        _record("exit", "all")  # the connection closes when the actor stops


def make_a():
    _record("enter", "a")
    return Deps("a", os.getpid())


def _connect(host):
    raise ConnectionRefusedError(f"no database at {host}")


def broken():
    return _connect("db.internal")
'''

TOOLS = '''
import os

import corral
from .deps import Deps


@corral.tool(effect="read", name="deps.who")
def who(ctx: corral.ToolContext[Deps]) -> dict:
    """Who built my dependencies."""
    return {"label": ctx.deps.label, "built_in": ctx.deps.pid, "runs_in": os.getpid()}
'''


def _spec(global_deps: str = "app.deps:make", agent_a_deps: str = 'deps = "app.deps:make_a"') -> str:
    steps = """
  [[agents.steps]]
  actions = [{ tool = "deps.who", input = {} }]
  [[agents.steps]]
  actions = [{ tool = "deps.who", input = {} }]
  [[agents.steps]]
  final = "done"
"""
    return f"""
[project]
root = "ws"
[tools]
modules = ["app.tools"]
deps = "{global_deps}"
[[agents]]
id = "a"
{agent_a_deps}
{steps}
[[agents]]
id = "b"
{steps}
"""


@pytest.fixture
def project(short_tmp: Path) -> Path:
    (short_tmp / "ws").mkdir()
    package = short_tmp / "app"  # one package: the tools import the Deps type from beside them
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "deps.py").write_text(DEPS)
    (package / "tools.py").write_text(TOOLS)
    return short_tmp


def _log(project: Path) -> list[dict[str, Any]]:
    path = project / "deps.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_deps_are_built_once_per_agent_process_reach_tools_and_close_at_stop(project: Path) -> None:
    with running(project / "home", _spec()) as daemon:
        seen = {}
        for agent in ("a", "b"):
            for _ in range(2):  # two runs, two calls each: still one factory call per process
                run_id = daemon.call("run", agent_id=agent, task="who")["run_id"]
                shown = wait_run(daemon, run_id, {"completed", "failed"})
                assert shown["run"]["status"] == "completed", shown["run"]
                assert [a["phase"] for a in shown["actions"]] == ["ok", "ok"], shown["actions"]
            rows = [json.loads(r["result"])["output"] for r in
                    ledger_rows(daemon.home, "SELECT result FROM actions a JOIN runs r ON a.run_id = r.run_id"
                          " WHERE r.agent_id = ?", agent)]
            assert len(rows) == 4 and len({(r["label"], r["built_in"], r["runs_in"]) for r in rows}) == 1, rows
            seen[agent] = rows[0]
        assert seen["a"]["label"] == "a" and seen["b"]["label"] == "all"  # its own, else the spec's for all
        assert seen["a"]["built_in"] == seen["a"]["runs_in"]  # built in the agent's own process
        entered = [(e["label"], e["pid"]) for e in _log(project) if e["what"] == "enter"]
        assert sorted(entered) == sorted([("a", seen["a"]["runs_in"]), ("all", seen["b"]["runs_in"])]), entered
    # Stopped: the async context manager was exited in b's process (a's factory returned a plain value).
    exits = [(e["label"], e["pid"]) for e in _log(project) if e["what"] == "exit"]
    assert exits == [("all", seen["b"]["runs_in"])], exits


def test_a_failing_deps_factory_stops_corral_up_with_its_traceback(project: Path) -> None:
    spec = project / "swarm.toml"
    spec.write_text(_spec(global_deps="app.deps:broken"))
    result = cli(project / "home", "up", "--spec", str(spec))
    assert result.returncode == 2, (result.stdout, result.stderr)
    err = result.stderr
    assert "app.deps:broken" in err and "Traceback" in err and "in _connect" in err, err
    assert "ConnectionRefusedError: no database at db.internal" in err, err
    assert not (project / "home" / "endpoint.json").exists()
    # A reference that does not resolve is a spec error at once, naming it.
    spec.write_text(_spec(agent_a_deps='deps = "app.deps:nothing_here"'))
    result = cli(project / "home", "up", "--spec", str(spec))
    assert result.returncode == 2 and "agents[0].deps" in result.stderr and "nothing_here" in result.stderr, (
        result.stderr)

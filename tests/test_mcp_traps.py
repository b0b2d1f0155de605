"""MCP without traps (issue 38): paths in a spec follow one rule, a server that
fails shows why (its stderr's last lines and its log file), and the server
snippet of docs/mcp.md runs as written.

One swarm covers the end-to-end part: its spec lives in a subdirectory with the
project root elsewhere; the docs' server runs from a path relative to the spec,
and a server started through a relative program path starts once, then fails
to start again with a distinctive line (and a secret) on its stderr.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.supervisor.spec.swarm_spec import SpecError, parse_spec
from tests.harness import Daemon, cli, ledger_rows, wait_run
from tests.mcp_servers.start_once import FAILURE_LINE, SECRET

DOCS = Path(__file__).resolve().parents[1] / "docs" / "mcp.md"
START_ONCE = Path(__file__).parent / "mcp_servers" / "start_once.py"
LOG_NAME = "mcp-flaky.server.log"


def _snippet(name: str) -> str:
    """The code block between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``."""
    text = DOCS.read_text()
    found = re.search(rf"<!-- {name}:begin -->\s*```\w*\n(.*?)```\s*<!-- {name}:end -->", text, re.S)
    assert found, f"docs/mcp.md lost its {name} markers"
    return found.group(1)


def _server(daemon: Daemon, server_id: str) -> dict[str, Any]:
    servers = {server["id"]: server for server in daemon.call("mcp.list")["servers"]}
    return dict(servers[server_id])


def _wait_server(daemon: Daemon, server_id: str, status: str) -> dict[str, Any]:
    daemon.wait_until(lambda _: _server(daemon, server_id)["status"] == status, timeout=60,
                      what=f"mcp server {server_id} {status}")
    return _server(daemon, server_id)


def _swarm(tmp: Path) -> Path:
    """The spec in conf/, the project root in project/: the docs' server and the
    start-once server are both named by paths relative to conf/."""
    conf, project = tmp / "conf", tmp / "project"
    (conf / "bin").mkdir(parents=True)
    project.mkdir()
    (conf / "weather_server.py").write_text(_snippet("mcp-server-snippet"))
    wrapper = conf / "bin" / "start-once"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {START_ONCE} \"$@\"\n")
    wrapper.chmod(0o755)
    spec = conf / "swarm.toml"
    spec.write_text(f"""
[project]
root = "../project"

{_snippet("mcp-spec-snippet")}

[[mcp_servers]]
id = "flaky"
command = ["bin/start-once"]
env = {{ START_ONCE_MARKER = "{tmp / 'started'}", LAB_EFFECTS = "{tmp / 'lab.log'}" }}
approval = "confirm"
max_restarts = 1
period_s = 600

[[agents]]
id = "writer"
[[agents.steps]]
unless_task = "later"
actions = [{{ tool = "mcp.weather.temperature", input = {{ city = "Oslo" }} }}]
[[agents.steps]]
unless_task = "later"
actions = [{{ tool = "mcp.flaky.peek", input = {{ item = "sky" }} }}]
[[agents.steps]]
unless_task = "later"
final = "done"
[[agents.steps]]
when_task = "later"
final = "without flaky"
""")
    return spec


def test_paths_resolve_from_the_spec_and_a_failed_server_says_why(short_tmp: Path) -> None:
    daemon = Daemon(short_tmp / "home", _swarm(short_tmp))
    try:
        daemon.up()
        _wait_server(daemon, "weather", "ready")
        _wait_server(daemon, "flaky", "ready")  # started once, through bin/start-once
        run_id = daemon.call("run", agent_id="writer", task="the weather")["run_id"]
        shown = wait_run(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        assert shown["run"]["status"] == "waiting-confirmation", shown
        # The docs' server answered one call end to end.
        weather = ledger_rows(daemon.home, "SELECT phase, result FROM actions WHERE run_id = ? AND tool = ?",
                              run_id, "mcp.weather.temperature")
        assert weather[0]["phase"] == "ok" and "Oslo: -2.0 C" in weather[0]["result"], weather

        # The server dies; its restart fails and the group gives up on it.
        daemon.call("kill_actor", actor_id="mcp-flaky")
        failed = _wait_server(daemon, "flaky", "failed")
        assert failed["stderr_tail"][-1] == FAILURE_LINE and failed["log"].endswith(LOG_NAME), failed
        flaky_action = next(a for a in shown["actions"] if a["tool"] == "mcp.flaky.peek")
        daemon.call("continue_action", action_id=flaky_action["action_id"], decision="approve")
        wait_run(daemon, run_id, {"completed", "failed"})

        # The error the run's call got, `corral mcp list`, `corral status` and
        # `corral mcp call` all show the line and name the log; none shows the secret.
        (row,) = ledger_rows(daemon.home, "SELECT phase, error FROM actions WHERE action_id = ?",
                             flaky_action["action_id"])
        listing = cli(daemon.home, "mcp", "list")
        status = cli(daemon.home, "status")
        call = cli(daemon.home, "mcp", "call", "flaky", "peek", "--args", '{"item": "sky"}', "--approve")
        assert row["phase"] == "failed" and call.returncode != 0
        for shown_text in (row["error"], listing.stdout, status.stdout, call.stderr):
            assert FAILURE_LINE in shown_text and LOG_NAME in shown_text, shown_text
            assert SECRET not in shown_text and "[redacted]" in shown_text, shown_text
        listed = json.loads(cli(daemon.home, "mcp", "list", "--json").stdout)
        assert SECRET not in json.dumps(listed)
        # A run that starts while the server is down is told which one and why.
        later = daemon.call("run", agent_id="writer", task="later")["run_id"]
        assert wait_run(daemon, later, {"completed", "failed"})["run"]["status"] == "completed"
        (event,) = [e for e in daemon.events() if e["kind"] == "mcp-server-unavailable" and e["subject"] == later]
        assert event["data"]["server"] == "flaky" and event["data"]["log"].endswith(LOG_NAME), event
    finally:
        daemon.shutdown()
    for path in daemon.home.rglob("*.db*"):  # the ledger never held it either
        assert SECRET.encode() not in path.read_bytes(), path


def test_a_relative_program_and_cwd_are_the_specs_and_a_bad_one_stops_corral_up(short_tmp: Path) -> None:
    conf, project = short_tmp / "conf", short_tmp / "project"
    (conf / "bin").mkdir(parents=True)
    (conf / "data").mkdir()
    project.mkdir()
    program = conf / "bin" / "server"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    (conf / "bin" / "plain").write_text("")
    source = str(conf / "swarm.toml")
    spec = parse_spec({"project": {"root": "../project"}, "mcp_servers": [
        {"id": "a", "command": ["bin/server", "--flag"]},
        {"id": "b", "command": ["uvx", "some-server"], "cwd": "data"},
    ]}, source)
    first, second = spec.mcp_servers
    assert first.command == (str(program), "--flag") and first.cwd == str(conf)
    assert second.command == ("uvx", "some-server") and second.cwd == str(conf / "data")  # PATH decides uvx
    cases = [
        ({"command": ["bin/missing"]}, rf"mcp_servers\[0\]\.command: no program 'bin/missing' at {conf}/bin/missing"
                                       rf" \(relative to the spec's directory {conf}\)"),
        ({"command": ["bin/plain"]}, "is not executable; `chmod \\+x` it"),
        ({"command": ["x"], "cwd": "nowhere"}, rf"mcp_servers\[0\]\.cwd: {conf}/nowhere is not a directory"),
    ]
    for table, message in cases:
        with pytest.raises(SpecError, match=message):
            parse_spec({"project": {"root": "../project"}, "mcp_servers": [{"id": "s", **table}]}, source)

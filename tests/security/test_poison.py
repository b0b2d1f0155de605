"""Issue 32, case 13: a tool result that cannot be encoded, and a read tool that
kills its agent, end as failed actions; they never crash-loop an agent, never take
its group down, and never start again at the next boot. The same shape in user
actors' replies and in provider responses. Real supervisors, real agent processes,
real os._exit, a real `corral down`/`up`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import corral
from corral.core.procs import wait_exit
from corral.mailbox.control import ControlError
from tests.harness import Daemon, actor_running, running, show, wait_run

TOOLS = '''
import datetime
import json
import os
import time
from pathlib import Path

import corral


@corral.tool(effect="read", name="bad.set")
def returns_a_set(ctx: corral.ToolContext) -> dict:
    """Returns what msgpack cannot encode."""
    return {"tags": {"a", "b"}}


@corral.tool(effect="read", name="bad.cycle")
def returns_a_cycle(ctx: corral.ToolContext) -> dict:
    """Returns a value that contains itself."""
    value: dict = {"when": "now"}
    value["self"] = value
    return value


@corral.tool(effect="read", name="bad.when")
def returns_a_datetime(ctx: corral.ToolContext) -> object:
    """Returns a datetime."""
    return datetime.datetime(2024, 1, 1)


@corral.tool(effect="read", name="bad.exit")
def kills_its_agent(ctx: corral.ToolContext) -> str:
    """Ends the agent's process: each call is logged first. The second call waits
    for the test (it stops corral meanwhile); every other one exits at once."""
    log = Path(ctx.workspace) / "calls.log"
    with open(log, "a") as handle:
        handle.write(ctx.action_id + "\\n")
        handle.flush()
        os.fsync(handle.fileno())
    if len(log.read_text().splitlines()) == 2:
        release = Path(ctx.workspace) / "release"
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    os._exit(1)
'''

SPEC = """
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
[tools]
modules = ["./poison_tools.py"]

[[agents]]
id = "tooler"
tools = ["bad.*"]
[[agents.steps]]
actions = [{ tool = "bad.set", input = {} }]
[[agents.steps]]
actions = [{ tool = "bad.cycle", input = {} }]
[[agents.steps]]
actions = [{ tool = "bad.when", input = {} }]
[[agents.steps]]
actions = [{ tool = "bad.exit", input = {} }]
[[agents.steps]]
final = "done"

[[agents]]
id = "bystander"
[[agents.steps]]
actions = [{ tool = "fs.list", input = { path = "." } }]
[[agents.steps]]
final = "fine"
"""


def _wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    """Until ``condition()`` holds (it reads files the agent writes), with a deadline
    only as a safety net."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _calls(base: Path) -> list[str]:
    log = base / "ws" / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _events(daemon: Daemon, kind: str) -> list[dict[str, Any]]:
    return [event for event in daemon.events() if event["kind"] == kind]


def _bystander_runs(daemon: Daemon) -> None:
    run_id = daemon.call("run", agent_id="bystander", task="list")["run_id"]
    assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"


def test_unencodable_results_fail_and_a_crashing_read_is_stopped_as_poison_across_boots(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    (short_tmp / "poison_tools.py").write_text(TOOLS)
    with running(short_tmp / "home", SPEC) as daemon:
        run_id = daemon.call("run", agent_id="tooler", task="call the bad tools")["run_id"]
        # The first call of bad.exit killed the agent; its second (the restart's
        # re-run of the read) waits for the test.
        _wait_for(lambda: len(_calls(short_tmp)) == 2, "the crashing read to run twice")
        shown = show(daemon, run_id)
        by_tool = {action["tool"]: action for action in shown["actions"]}
        # A value msgpack cannot encode is the tool's failure, with a clear error.
        assert by_tool["bad.set"]["phase"] == "failed"
        assert "cannot be recorded" in by_tool["bad.set"]["error"] and "set" in by_tool["bad.set"]["error"]
        assert by_tool["bad.cycle"]["phase"] == "failed" and "cycle" in by_tool["bad.cycle"]["error"]
        assert by_tool["bad.when"]["phase"] == "failed" and "datetime" in by_tool["bad.when"]["error"]
        crashing = by_tool["bad.exit"]
        assert crashing["phase"] == "executing"
        assert [(c["action_id"], c["exit_code"]) for c in shown["crashes"]] == [(crashing["action_id"], 1)]
        status = daemon.status()
        assert {g["id"]: g["status"] for g in status["groups"]} == {"root": "running"}
        assert daemon.actor("bystander")["incarnation"] == 1  # untouched by its neighbour's crash
        assert daemon.actor("tooler")["incarnation"] == 2  # one crash (the bad results crashed nothing)

        # Down while the read runs a second time: being stopped is no crash of it.
        pid = daemon.endpoint.pid
        assert daemon.call("down")["status"] == "stopping"
        assert wait_exit(pid, 30)

        # At boot, recovery re-runs the read (one crash so far); it crashes again,
        # which is its second: it fails as poison, the run goes on and completes.
        (short_tmp / "ws" / "release").write_text("")
        daemon.up()
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "completed", shown["run"]
        poisoned = next(a for a in shown["actions"] if a["tool"] == "bad.exit")
        assert poisoned["phase"] == "failed"
        assert "poison" in poisoned["error"] and "2 times" in poisoned["error"], poisoned["error"]
        assert [c["exit_code"] for c in shown["crashes"]] == [1, 1]
        receipt = next(r for r in shown["receipts"] if r["action_id"] == poisoned["action_id"])
        assert receipt["status"] == "failed" and "poison" in receipt["result_summary"]
        assert len(_calls(short_tmp)) == 3
        _bystander_runs(daemon)
        status = daemon.status()
        assert {g["id"]: g["status"] for g in status["groups"]} == {"root": "running"}
        assert len(_events(daemon, "action-poisoned")) == 1
        assert not _events(daemon, "group-escalated")

        # Another down and up: nothing is re-run, nothing crashes.
        pid = daemon.endpoint.pid
        daemon.call("down")
        assert wait_exit(pid, 30)
        boot = daemon.up().boot_id
        _bystander_runs(daemon)
        assert len(_calls(short_tmp)) == 3
        this_boot = [e for e in daemon.events() if e["boot_id"] == boot]
        assert not [e for e in this_boot if e["kind"] in ("action-rerun", "action-crashed", "actor-exited")]
        assert daemon.actor("tooler")["incarnation"] == 1
        assert show(daemon, run_id)["run"]["status"] == "completed"


ACTOR = '''
import datetime

import corral


class Replies(corral.Actor):
    async def handle_ask(self, message: dict) -> dict:
        kind = message.get("kind")
        if kind == "set":
            return {"tags": {1, 2}}
        if kind == "when":
            return {"at": datetime.datetime(2024, 1, 1)}
        if kind == "big":
            return {"n": 2 ** 70}
        return {"ok": True, "incarnation": self.ctx.incarnation}
'''

PROVIDER = '''
from corral.actors.providers.base import Plan, ProviderResponse


class Surrogates:
    """A provider whose answer holds a lone surrogate (no UTF-8 can carry it)."""

    name = "surrogates"

    def __init__(self, config: dict) -> None:
        pass

    async def complete(self, request) -> ProviderResponse:
        return ProviderResponse("broken \\ud800 answer")

    def parse(self, response, tools) -> Plan:
        return Plan(final_reply=response.text)
'''


def test_a_user_actors_reply_that_cannot_be_sent_is_an_error_not_a_crash(short_tmp: Path) -> None:
    (short_tmp / "poison_actor.py").write_text(ACTOR)
    spec = '[[actors]]\nid = "replies"\ntemplate = "poison_actor:Replies"\n'
    with running(short_tmp / "home", spec) as daemon:
        daemon.wait_until(actor_running("replies"), what="the user actor running")
        with corral.Client.connect(daemon.home) as client:
            for kind, words in (("set", "set"), ("when", "datetime"), ("big", "64")):
                try:
                    client.ask("replies", {"kind": kind})
                except ControlError as exc:
                    assert "cannot be sent" in exc.message and words in exc.message, exc.message
                else:
                    raise AssertionError(f"a {kind} reply was sent")
            assert client.ask("replies", {"kind": "fine"}) == {"ok": True, "incarnation": 1}
        assert daemon.actor("replies")["incarnation"] == 1 and daemon.actor("replies")["restarts"] == 0


def test_a_provider_response_that_cannot_be_recorded_fails_the_run_not_the_agent(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    (short_tmp / "poison_provider.py").write_text(PROVIDER)
    spec = '[project]\nroot = "ws"\n[[agents]]\nid = "talker"\nprovider = "poison_provider:Surrogates"\n'
    with running(short_tmp / "home", spec) as daemon:
        run_id = daemon.call("run", agent_id="talker", task="answer")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "failed", shown["run"]
        assert "cannot be recorded" in json.dumps(shown["provider_requests"]) + str(shown["run"]["reason"])
        assert daemon.actor("talker")["incarnation"] == 1  # the agent never crashed


MCP_SERVER = """
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, ToolAnnotations

server = MCPServer("huge")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def huge() -> CallToolResult:
    \"\"\"Structured content with an integer no 64 bits hold (valid JSON all the same).\"\"\"
    return CallToolResult(content=[TextContent(type="text", text="big")], structured_content={"n": 10**30})


if __name__ == "__main__":
    server.run("stdio")
"""


def test_an_mcp_result_that_cannot_be_relayed_fails_the_call_not_the_mcp_actor(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    (short_tmp / "huge_server.py").write_text(MCP_SERVER)
    spec = f"""
[project]
root = "ws"
[[mcp_servers]]
id = "huge"
command = ["python", "{short_tmp / 'huge_server.py'}"]
approval = "auto"
[[agents]]
id = "caller"
[[agents.steps]]
actions = [{{ tool = "mcp.huge.huge", input = {{}} }}]
[[agents.steps]]
final = "done"
"""
    with running(short_tmp / "home", spec) as daemon:
        run_id = daemon.call("run", agent_id="caller", task="call it")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "completed", shown["run"]
        action = shown["actions"][0]
        assert action["phase"] == "failed" and "64" in action["error"], action
        mcp_actor = next(a for a in daemon.status()["actors"] if a["template"] == "mcp")
        assert (mcp_actor["incarnation"], mcp_actor["restarts"]) == (1, 0)  # its session never broke

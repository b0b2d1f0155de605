"""An isolated child may not use a tool outside its run's set, MCP tools included,
whatever its template, the project's policy, the server's approval rule or a
person says (seed 004 V1.34: "mcp.call 显示为 denied。动态 MCP function 最终归一为
mcp.call 后同样拒绝。模板 Agent、项目 policy、legacy 空策略和用户 approval 都不能放宽
这组边界").

Live: a real stdio MCP server (tests/mcp_servers/lab_server.py) records every call
it executes. The parent's own call shows the server does record; the child's never
reaches it, is denied when prepared (never waiting for a person), and an approval
given to an older build's pending call is refused again at execution."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.mailbox.steps import Begin
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.runs import action_store, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import RunStatus
from tests.harness import Daemon, cli, ledger_rows, wait_for, wait_run

LAB = Path(__file__).parent / "mcp_servers" / "lab_server.py"
NO_FEATURES = RunFeatures()


SEND = '{ tool = "mcp.lab.send", input = { to = "child-was-here" } }'
WRITE = '{ tool = "fs.write", input = { path = "s/out.md", content = "x" } }'


def _spec(effects: Path, approval: str, child_actions: str = SEND) -> str:
    # Every knob that could widen the child's tools is set wide: the template's tool
    # list and policy, the project's policy, the server's approval rule.
    return f"""
[project]
root = "ws"
[policy]
"mcp.*" = "auto"
"mcp.lab.send" = "auto"

[[mcp_servers]]
id = "lab"
command = ["python", "{LAB}"]
env = {{ LAB_EFFECTS = "{effects}" }}
approval = "{approval}"
call_timeout_s = 20

[[templates]]
id = "sneaky"
tools = ["mcp.*", "fs.*"]
  [templates.policy]
  "mcp.lab.send" = "auto"
  default = "auto"
  [[templates.steps]]
  actions = [{child_actions}]
  [[templates.steps]]
  final = "tried"

[[agents]]
id = "parent"
  [agents.policy]
  "mcp.lab.send" = "auto"
  [[agents.steps]]
  actions = [{{ tool = "mcp.lab.send", input = {{ to = "parent-was-here" }} }}]
  [[agents.steps]]
  actions = [{{ tool = "agent.spawn_isolated", input = {{ children = [
      {{ template = "sneaky", task = "sneak", write_scopes = ["s"], expected_artifacts = ["s/out.md"] }} ] }} }}]
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  final = "joined"
"""


def _effects(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [json.loads(line)["to"] for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("approval", ["auto", "confirm"])
def test_an_isolated_childs_mcp_call_is_denied_before_any_person_or_effect(short_tmp: Path, approval: str) -> None:
    (short_tmp / "ws").mkdir()
    effects = short_tmp / "lab.log"
    spec = short_tmp / "spec.toml"
    spec.write_text(_spec(effects, approval))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        if approval == "confirm":  # the parent's own call waits for its person: approve it
            (parked,) = wait_for(
                "the parent's call parked",
                lambda: ledger_rows(
                    daemon.home,
                    "SELECT action_id FROM actions WHERE run_id = ? AND phase = 'waiting-confirmation'",
                    run_id,
                ),
            )
            daemon.call("continue_action", action_id=parked["action_id"], decision="approve")
        (found,) = wait_for(
            "the child run", lambda: ledger_rows(daemon.home, "SELECT run_id FROM runs WHERE parent_run_id = ?", run_id)
        )
        child = str(found["run_id"])
        wait_run(daemon, child, {"waiting-confirmation", "completed", "failed"})
        actions = ledger_rows(
            daemon.home,
            "SELECT action_id, tool, phase, error FROM actions WHERE run_id = ? ORDER BY loop_index, action_index",
            child,
        )
        assert [(a["tool"], a["phase"]) for a in actions] == [("mcp.lab.send", "denied")], actions
        assert "not allowed in a child run" in str(actions[0]["error"]), actions
        # Never parked for a person, never executing.
        for kind in ("action-waiting-confirmation", "action-executing"):
            assert (
                ledger_rows(
                    daemon.home, "SELECT 1 FROM events WHERE kind = ? AND subject = ?", kind, actions[0]["action_id"]
                )
                == []
            ), kind
        wait_run(daemon, run_id, {"completed", "failed"})
        # The server does record calls (the parent's), and never saw the child's.
        assert _effects(effects) == ["parent-was-here"]
    finally:
        daemon.shutdown()


@pytest.mark.parametrize("order", [[WRITE, SEND], [SEND, WRITE]], ids=["write-first", "send-first"])
def test_a_child_plan_carrying_an_mcp_call_runs_none_of_its_actions(short_tmp: Path, order: list[str]) -> None:
    """ "任一成员被拒绝时 ... 不创建 confirmation，也不执行同批其它成员": the in-scope
    write planned with the child's MCP call is refused too, before or after it."""
    (short_tmp / "ws").mkdir()
    effects = short_tmp / "lab.log"
    spec = short_tmp / "spec.toml"
    spec.write_text(_spec(effects, "auto", ", ".join(order)))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        (found,) = wait_for(
            "the child run", lambda: ledger_rows(daemon.home, "SELECT run_id FROM runs WHERE parent_run_id = ?", run_id)
        )
        wait_run(daemon, str(found["run_id"]), {"waiting-confirmation", "completed", "failed"})
        actions = ledger_rows(
            daemon.home,
            "SELECT action_id, tool, phase, error FROM actions WHERE run_id = ? ORDER BY loop_index, action_index",
            found["run_id"],
        )
        assert [a["phase"] for a in actions] == ["denied", "denied"], actions
        write = next(a for a in actions if a["tool"] == "fs.write")
        assert "mcp.lab.send is not allowed in a child run" in str(write["error"]), write
        assert not (short_tmp / "ws" / "s" / "out.md").exists()
        wait_run(daemon, run_id, {"completed", "failed"})
        assert _effects(effects) == ["parent-was-here"]
    finally:
        daemon.shutdown()


@pytest.mark.parametrize(
    "options",
    [
        {"workspace": "/nowhere", "write_scopes": ["s"], "allowed_tools": ["fs.read", "mcp.lab.send"]},
        {"workspace": "/nowhere", "write_scopes": ["s"]},
    ],
    ids=["widened-list", "legacy-no-list"],
)
def test_an_approved_child_mcp_call_of_an_older_build_is_refused_at_execution(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """ "旧 pending / approved 动作 ... 真正进入执行器时仍会重新调用当前 ... 校验，approval
    不能穿透": a child's MCP call an older build let wait for a person (its run's
    stored list widened, or no list at all: a legacy run) and a person approved, fails
    when it would begin; and a prepared one of such a run is denied, never executing."""
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.begin_boot("b1", 1, 1)
    child = run_store.create_run(
        ledger,
        NO_FEATURES,
        agent_id="c",
        task="t",
        provider="scripted",
        provider_config={"script": {"steps": []}},
        kind="child",
        depth=1,
        options=options,
    )
    run_store.set_run_status(ledger, child, RunStatus.RUNNING, NO_FEATURES, "claimed")
    waiting = action_store.prepare_action(
        ledger, child, 0, 0, "mcp.lab.send", {"to": "x"}, NO_FEATURES, rerunnable=False, policy="confirm"
    )
    # As an older build left it: waiting for a person (this build denies it at begin).
    action_store.move_action(ledger, waiting["action_id"], ActionPhase.WAITING_CONFIRMATION)
    action_store.move_action(ledger, waiting["action_id"], ActionPhase.APPROVED)
    begun = action_store.begin_action(ledger, waiting["action_id"], NO_FEATURES)
    assert begun["begin"] is Begin.SKIP and begun["phase"] == "failed", begun
    row = action_store.get_action(ledger, waiting["action_id"])
    assert row["phase"] == "failed" and "not allowed in a child run" in str(row["error"]), dict(row)

    prepared = action_store.prepare_action(
        ledger, child, 0, 1, "mcp.lab.send", {"to": "y"}, NO_FEATURES, rerunnable=False, policy="auto"
    )
    begun = action_store.begin_action(ledger, prepared["action_id"], NO_FEATURES)
    assert begun["begin"] is Begin.SKIP and begun["phase"] == "denied", begun
    assert ledger_rows_of(ledger, "SELECT 1 FROM events WHERE kind = 'action-executing'") == []


def ledger_rows_of(ledger: SqliteLedger, sql: str) -> list[Any]:
    return list(ledger.all(sql))


def test_a_root_runs_mcp_call_is_not_touched_by_the_child_boundary(tmp_path: Path) -> None:
    """The boundary is the child's: a root run's approved MCP call begins."""
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.begin_boot("b1", 1, 1)
    root = run_store.create_run(
        ledger, NO_FEATURES, agent_id="r", task="t", provider="scripted", provider_config={"script": {"steps": []}}
    )
    run_store.set_run_status(ledger, root, RunStatus.RUNNING, NO_FEATURES, "claimed")
    row = action_store.prepare_action(
        ledger, root, 0, 0, "mcp.lab.send", {"to": "x"}, NO_FEATURES, rerunnable=False, policy="auto"
    )
    assert action_store.begin_action(ledger, row["action_id"], NO_FEATURES)["begin"] is Begin.EXECUTE


#: The seed's denied set for a child, in corral's names (its command.start and
#: command.stdin are process.start and process.stdin; mcp.call is every MCP tool).
SEED_DENIED = (
    "project.verify",
    "project.git_commit",
    "command.exec",
    "process.start",
    "process.stdin",
    "agent.delegate",
    "agent.spawn_isolated",
    "project.restore",
    "mcp.*",
)


def test_a_childs_effective_policy_shows_the_denied_set(short_tmp: Path) -> None:
    """ "有效策略快照把 project.verify ... 和 mcp.call 显示为 denied": ``corral show`` of
    the child lists its effective policy, the template's and project's wide tables
    notwithstanding; the parent's shows its own."""
    (short_tmp / "ws").mkdir()
    effects = short_tmp / "lab.log"
    spec = short_tmp / "spec.toml"
    spec.write_text(_spec(effects, "auto"))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        (found,) = wait_for(
            "the child run", lambda: ledger_rows(daemon.home, "SELECT run_id FROM runs WHERE parent_run_id = ?", run_id)
        )
        wait_run(daemon, str(found["run_id"]), {"completed", "failed"})
        policy = daemon.call("show", run_id=found["run_id"])["policy"]
        assert {tool: policy[tool] for tool in SEED_DENIED} == dict.fromkeys(SEED_DENIED, "deny"), policy
        assert policy["fs.write"] == "auto" and policy["fs.read"] == "auto", policy  # the template's own table
        shown = cli(daemon.home, "show", str(found["run_id"]))
        assert shown.returncode == 0, shown.stderr
        (line,) = [line for line in shown.stdout.splitlines() if line.strip().startswith("denied tools:")]
        assert all(tool in line.split(": ", 1)[1].split(", ") for tool in SEED_DENIED), line
        wait_run(daemon, run_id, {"completed", "failed"})
        parents = daemon.call("show", run_id=run_id)["policy"]
        assert parents["agent.spawn_isolated"] != "deny" and "mcp.*" not in parents, parents
    finally:
        daemon.shutdown()


def test_a_child_may_check_the_projects_existing_preview(short_tmp: Path) -> None:
    """ "preview.validate 继续只验证当前授权项目的精确既有 loopback 预览，不负责启动预览服务": a
    child's check of the spec's preview page (served here by a real dev server it did
    not start) runs, never refused by the child's bound; whether Chromium passes it or
    is blocked for want of its sandbox (as root) is the tool's own verdict."""
    (short_tmp / "ws" / "site").mkdir(parents=True)
    (short_tmp / "ws" / "site" / "index.html").write_text("<html><body><p>hello</p></body></html>")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    spec = short_tmp / "spec.toml"
    spec.write_text(
        _spec(short_tmp / "lab.log", "auto", '{ tool = "preview.validate", input = {} }')
        .replace('root = "ws"\n', f'root = "ws"\npreview_url = "http://127.0.0.1:{port}/index.html"\n', 1)
        .replace('tools = ["mcp.*", "fs.*"]', 'tools = ["mcp.*", "fs.*", "preview.*"]', 1)
    )
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            "127.0.0.1",
            "--directory",
            str(short_tmp / "ws" / "site"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
        (found,) = wait_for(
            "the child run", lambda: ledger_rows(daemon.home, "SELECT run_id FROM runs WHERE parent_run_id = ?", run_id)
        )
        wait_run(daemon, str(found["run_id"]), {"waiting-confirmation", "completed", "failed"})
        (action,) = ledger_rows(
            daemon.home, "SELECT action_id, phase, error FROM actions WHERE run_id = ?", found["run_id"]
        )
        assert "not allowed" not in str(action["error"]), dict(action)
        assert action["phase"] == "ok" or "sandbox" in str(action["error"]).lower(), dict(action)
        assert ledger_rows(
            daemon.home, "SELECT 1 FROM events WHERE kind = 'action-executing' AND subject = ?", action["action_id"]
        ), "the check ran"
    finally:
        daemon.shutdown()
        server.terminate()
        server.wait()

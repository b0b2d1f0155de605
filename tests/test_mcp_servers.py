"""MCP servers as durable, policy-checked tools, against real servers (no mocks).

``mcp-server-time`` and ``mcp-server-git`` from PyPI, and the lab server in
tests/mcp_servers/ (the official SDK's MCPServer) over stdio and Streamable HTTP.
Crash tests SIGKILL the real processes at named failpoints.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral.actors.mcp_stdio import MAX_MESSAGE_BYTES
from corral.actors.tools.sidecar import MAX_RESULT_BYTES
from tests.harness import Daemon, cli, drive_to_end, ledger_rows, running, wait_for, wait_run

LAB = Path(__file__).parent / "mcp_servers" / "lab_server.py"


def _lab(server_id: str = "lab", *, effects: Path, extra: str = "", env: str = "") -> str:
    return f"""
[[mcp_servers]]
id = "{server_id}"
command = ["python", "{LAB}"]
env = {{ LAB_EFFECTS = "{effects}"{env} }}
approval = "auto"
call_timeout_s = 20
{extra}
"""


def _spec(servers: str, steps: list[dict[str, Any]], policy: str = "") -> str:
    body = "\n".join(f"[[agents.steps]]\n{_step(step)}" for step in steps)
    return f"""
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
{servers}
[[agents]]
id = "writer"
{policy}
{body}
"""


def _step(step: dict[str, Any]) -> str:
    if "final" in step:
        return f"final = {json.dumps(step['final'])}"
    calls = ", ".join(
        f"{{ tool = {json.dumps(tool)}, input = {_toml_inline(args)} }}" for tool, args in step["actions"]
    )
    return f"actions = [{calls}]"


def _toml_inline(value: dict[str, Any]) -> str:
    return "{ " + ", ".join(f"{key} = {json.dumps(item)}" for key, item in value.items()) + " }"


def _run(daemon: Daemon, task: str = "use the tools") -> str:
    run_id: str = daemon.call("run", agent_id="writer", task=task)["run_id"]
    return run_id


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _server(daemon: Daemon, server_id: str) -> dict[str, Any]:
    for server in daemon.call("mcp.list")["servers"]:
        if server["id"] == server_id:
            return dict(server)
    raise KeyError(server_id)


def _wait_server(daemon: Daemon, server_id: str, status: str, *, restarts: int = 0) -> dict[str, Any]:
    def ready(_: dict[str, Any]) -> bool:
        server = _server(daemon, server_id)
        return bool(server["status"] == status and server["restarts"] >= restarts)

    daemon.wait_until(ready, timeout=60, what=f"mcp server {server_id} {status}")
    return _server(daemon, server_id)


@pytest.fixture
def project(short_tmp: Path) -> Path:
    (short_tmp / "ws").mkdir()
    return short_tmp


# -- real PyPI servers -------------------------------------------------------------


def test_time_and_git_servers_are_tools_with_allow_deny_and_effects(project: Path) -> None:
    repo = project / "ws"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("hello\n")
    subprocess.run(["git", "-C", str(repo), "add", "a.txt"], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], check=True
    )
    servers = f"""
[[mcp_servers]]
id = "time"
command = ["python", "-m", "mcp_server_time"]
approval = "writes"
[[mcp_servers]]
id = "git"
command = ["python", "-m", "mcp_server_git", "--repository", "{repo}"]
env = {{ GIT_PAGER = "cat" }}
allow = ["git_status", "git_log", "git_diff*", "git_reset"]
deny = ["git_reset"]
effect = "external"
approval = "writes"
[mcp_servers.tools.git_status]
effect = "read"
"""
    steps = [
        {
            "actions": [
                ("mcp.time.get_current_time", {"timezone": "UTC"}),
                ("mcp.git.git_status", {"repo_path": str(repo)}),
            ]
        },
        {"final": "looked"},
    ]
    with running(project / "home", _spec(servers, steps)) as daemon:
        git = _wait_server(daemon, "git", "ready")
        names = {tool["name"]: tool for tool in git["tools"]}
        # allow globs, then deny: git_reset is allowed by name and denied after.
        assert set(names) == {"git_status", "git_log", "git_diff", "git_diff_staged", "git_diff_unstaged"}
        assert names["git_status"]["effect"] == "read" and names["git_status"]["policy"] == "auto"
        # The server-level effect beats the read-only annotation; "writes" then asks.
        assert names["git_log"]["effect"] == "external" and names["git_log"]["policy"] == "confirm"
        time_server = _wait_server(daemon, "time", "ready")
        assert {tool["effect"] for tool in time_server["tools"]} == {"read"}  # from annotations
        shown = wait_run(daemon, _run(daemon), {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown
        receipts = {receipt["tool"]: receipt for receipt in shown["receipts"]}
        assert receipts["mcp.time.get_current_time"]["status"] == "ok"
        assert receipts["mcp.git.git_status"]["status"] == "ok"
        assert "working tree clean" in json.dumps(shown)
        listing = cli(daemon.home, "mcp", "list")
        assert listing.returncode == 0 and "mcp.git.git_status" in listing.stdout and "git_reset" not in listing.stdout


def test_invalid_arguments_fail_the_action_and_never_reach_the_server(project: Path) -> None:
    effects = project / "lab.log"
    steps = [
        {"actions": [("mcp.lab.send", {"to": 5})]},
        {"actions": [("mcp.lab.send", {"to": "bob"})]},
        {"final": "ok"},
    ]
    with running(project / "home", _spec(_lab(effects=effects), steps)) as daemon:
        shown = wait_run(daemon, _run(daemon), {"completed", "failed"})
        first, second = shown["actions"]
        assert first["phase"] == "failed" and second["phase"] == "ok"
        action = ledger_rows(daemon.home, "SELECT * FROM actions WHERE action_id = ?", first["action_id"])[0]
        assert action["executing_at"] is None  # never executing, so never sent
        assert "to" in action["error"] and "string" in action["error"]
        assert [line["to"] for line in _lines(effects)] == ["bob"]


def test_a_streamable_http_server_behind_a_bearer_token(project: Path) -> None:
    effects = project / "lab.log"
    token = "lab-bearer-9f3c2d1e0b8a7"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, str(LAB), "--http", str(port), "--token", token],
        env={**os.environ, "LAB_EFFECTS": str(effects)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port)
        servers = f"""
[[mcp_servers]]
id = "web"
url = "http://127.0.0.1:{port}/mcp"
allow_insecure_localhost = true
headers = {{ Authorization = "Bearer ${{LAB_TOKEN}}" }}
approval = "auto"
[[mcp_servers]]
id = "badauth"
url = "http://127.0.0.1:{port}/mcp"
allow_insecure_localhost = true
headers = {{ Authorization = "Bearer wrong-token" }}
startup_timeout_s = 5
max_restarts = 0
[[mcp_servers]]
id = "hostenv"
url = "http://127.0.0.1:{port}/mcp"
allow_insecure_localhost = true
headers = {{ Authorization = "Bearer ${{LAB_HOST_ONLY}}" }}
startup_timeout_s = 5
max_restarts = 0
"""
        # The token sits in the user's private credentials file (seed 004 V1.22);
        # LAB_HOST_ONLY is only in the environment of `corral up`, never a credential.
        config = project / "config"
        credentials = config / "corral" / "mcp-credentials.toml"
        credentials.parent.mkdir(parents=True)
        credentials.write_text(f'LAB_TOKEN = "{token}"\n')
        credentials.chmod(0o600)
        env = {"XDG_CONFIG_HOME": str(config), "LAB_HOST_ONLY": token, "LAB_TOKEN": "not-the-token-0000"}
        steps = [{"actions": [("mcp.web.peek", {"item": "color"})]}, {"final": "done"}]
        with running(project / "home", _spec(servers, steps), env=env) as daemon:
            _wait_server(daemon, "web", "ready")
            hostenv = _server(daemon, "hostenv")
            deadline = time.monotonic() + 60
            while not hostenv["error"] and time.monotonic() < deadline:
                daemon.call("events", since=daemon.status()["cursor"], wait_ms=1000)
                hostenv = _server(daemon, "hostenv")
            assert hostenv["status"] != "ready", hostenv
            assert "LAB_HOST_ONLY" in hostenv["error"] and str(credentials) in hostenv["error"], hostenv
            shown = wait_run(daemon, _run(daemon), {"completed", "failed"})
            assert shown["run"]["status"] == "completed", shown
            assert shown["receipts"][0]["status"] == "ok"
            assert "value of color" in json.dumps(shown)
            bad = _server(daemon, "badauth")
            deadline = time.monotonic() + 60
            while not bad["error"] and time.monotonic() < deadline:
                daemon.call("events", since=daemon.status()["cursor"], wait_ms=1000)
                bad = _server(daemon, "badauth")
            assert bad["status"] != "ready" and bad["error"], bad
            # V1.22: "OAuth 缺失时必须明确报'当前切片未支持'，不能静默降级成匿名连接".
            assert "401" in bad["error"] and "OAuth is not supported" in bad["error"], bad
            daemon.shutdown()
            # The token reaches the server, never a persisted surface.
            for path in daemon.home.rglob("*"):
                if path.is_file():
                    assert token.encode() not in path.read_bytes(), path
    finally:
        server.kill()
        server.wait()


def _wait_port(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as conn:
            if conn.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


# -- bad servers -----------------------------------------------------------------------


def test_a_server_that_dies_mid_call_leaves_an_external_action_to_reconcile(project: Path) -> None:
    effects = project / "lab.log"
    steps = [{"actions": [("mcp.lab.crash_after_effect", {"to": "ann"})]}, {"final": "done"}]
    with running(project / "home", _spec(_lab(effects=effects), steps)) as daemon:
        _wait_server(daemon, "lab", "ready")
        shown = wait_run(daemon, _run(daemon), {"needs-reconciliation", "completed", "failed"})
        assert shown["run"]["status"] == "needs-reconciliation", shown
        (action,) = shown["actions"]
        assert action["phase"] == "needs-reconciliation"
        assert len(_lines(effects)) == 1  # it ran once and is never sent again
        server = _wait_server(daemon, "lab", "ready", restarts=1)  # restarted per policy
        assert server["restarts"] >= 1
        final, reconciled = drive_to_end(daemon, shown["run"]["run_id"], effects)
        assert final["run"]["status"] == "completed" and reconciled == 1
        assert len(_lines(effects)) == 1


def test_a_hanging_call_times_out_and_its_outcome_is_unknown(project: Path) -> None:
    effects = project / "lab.log"
    servers = _lab(effects=effects).replace("call_timeout_s = 20", "call_timeout_s = 1")
    steps = [{"actions": [("mcp.lab.hang", {"seconds": 30})]}, {"final": "done"}]
    with running(project / "home", _spec(servers, steps)) as daemon:
        _wait_server(daemon, "lab", "ready")
        shown = wait_run(daemon, _run(daemon), {"needs-reconciliation", "completed", "failed"})
        (action,) = shown["actions"]
        assert action["phase"] == "needs-reconciliation"
        row = ledger_rows(daemon.home, "SELECT reason FROM actions WHERE action_id = ?", action["action_id"])[0]
        assert "no result within 1 s" in row["reason"]


def _trio_threads(pid: int) -> list[str]:
    """trio's worker threads in process ``pid`` (it names them)."""
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(Path(f"/proc/{pid}/task/{task}/comm").read_text().strip())
        except OSError:
            continue  # the thread ended meanwhile
    return [name for name in names if name.startswith("Trio thread")]


def test_large_results_go_to_a_sidecar_and_floods_are_refused(project: Path) -> None:
    effects = project / "lab.log"
    steps = [
        {"actions": [("mcp.lab.big", {"kilobytes": 100}), ("mcp.lab.flood", {"megabytes": 9})]},
        {"actions": [("mcp.lab.fail_politely", {})]},
        {"final": "done"},
    ]
    with running(project / "home", _spec(_lab(effects=effects), steps)) as daemon:
        _wait_server(daemon, "lab", "ready")
        actor = psutil.Process(daemon.actor("mcp-lab")["pid"])
        (server,) = actor.children()
        # trio starts a process from a worker thread, which ends after 10 s idle. On a
        # loaded machine the calls came later than that, and a parent-death signal
        # tied to that thread had killed the server: "Connection closed", not the limit.
        wait_for("the thread that started the server to end", lambda: not _trio_threads(actor.pid), timeout=90)
        shown = wait_run(daemon, _run(daemon), {"completed", "failed"}, timeout=120)
        phases = {action["tool"]: action["phase"] for action in shown["actions"]}
        assert phases == {"mcp.lab.big": "ok", "mcp.lab.flood": "failed", "mcp.lab.fail_politely": "failed"}
        rows = {
            row["tool"]: row
            for row in ledger_rows(daemon.home, "SELECT tool, result, error FROM actions WHERE run_id = ?",
                                   shown["run"]["run_id"])
        }
        assert f"the limit is {MAX_RESULT_BYTES}" in rows["mcp.lab.flood"]["error"], rows["mcp.lab.flood"]
        assert "Error executing tool fail_politely" in rows["mcp.lab.fail_politely"]["result"]
        output = json.loads(rows["mcp.lab.big"]["result"])["output"]
        sidecar = Path(output["sidecar"])
        assert output["truncated"] and output["bytes"] > 100 * 1024
        assert sidecar.is_file() and stat.S_IMODE(sidecar.stat().st_mode) == 0o600
        assert json.loads(sidecar.read_text())["text"] == "y" * 100 * 1024
        assert _server(daemon, "lab")["status"] == "ready"  # the swarm goes on
        assert _server(daemon, "lab")["restarts"] == 0 and server.is_running()  # the same server all along


def test_a_message_past_the_transports_bound_ends_the_session_and_names_the_limit(project: Path) -> None:
    effects = project / "lab.log"
    with running(project / "home", _spec(_lab(effects=effects), [{"final": "x"}])) as daemon:
        _wait_server(daemon, "lab", "ready")
        # 20 MiB of text is twice that on the wire (content and structured content):
        # past the bound, so the actor never holds it, and says why it ended the session.
        call = cli(daemon.home, "mcp", "call", "lab", "flood", "--args", '{"megabytes": 20}')
        assert call.returncode != 0
        assert f"the limit is {MAX_MESSAGE_BYTES}" in call.stdout + call.stderr, (call.stdout, call.stderr)
        _wait_server(daemon, "lab", "ready", restarts=1)  # restarted per policy; the swarm goes on
        peek = cli(daemon.home, "mcp", "call", "lab", "peek", "--args", '{"item": "after"}')
        assert peek.returncode == 0, peek.stdout + peek.stderr


def test_a_server_writing_garbage_does_not_take_the_swarm_down(project: Path) -> None:
    effects = project / "lab.log"
    steps = [{"actions": [("mcp.lab.garble", {})]}, {"actions": [("mcp.lab.peek", {"item": "x"})]}, {"final": "done"}]
    with running(project / "home", _spec(_lab(effects=effects), steps)) as daemon:
        shown = wait_run(daemon, _run(daemon), {"completed", "failed"}, timeout=120)
        assert shown["run"]["status"] == "completed", shown
        assert [action["phase"] for action in shown["actions"]][-1] == "ok"


def test_a_server_that_cannot_start_is_reported_and_the_swarm_goes_on(project: Path) -> None:
    servers = """
[[mcp_servers]]
id = "broken"
command = ["python", "-c", "import sys; sys.exit(3)"]
startup_timeout_s = 5
max_restarts = 1
period_s = 60
"""
    with running(project / "home", _spec(servers, [{"final": "fine without it"}])) as daemon:
        shown = wait_run(daemon, _run(daemon), {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        deadline = time.monotonic() + 60
        broken = _server(daemon, "broken")
        while not broken["error"] and time.monotonic() < deadline:
            daemon.call("events", since=daemon.status()["cursor"], wait_ms=1000)
            broken = _server(daemon, "broken")
        assert broken["status"] != "ready" and "start" in broken["error"], broken
        status = daemon.status()
        assert status["mcp"][0]["error"]


def test_a_required_server_that_fails_stops_the_run_before_it_plans_and_an_optional_one_is_left_out(
    project: Path,
) -> None:
    """V1.22: "required server 初始化或列目录失败时阻止 planning，optional server 只从当前目录移除并在
    MCP 状态中报告安全错误摘要" (a strict re-audit found no required/optional setting). The optional
    server's catalog is refused (a description past the limit: "目录超限失败关闭")."""
    servers = _lab(effects=project / "lab.log", env=', LAB_LONG_DESCRIPTION = "1"') + """
[[mcp_servers]]
id = "must.have"
command = ["python", "-c", "import sys; sys.exit(3)"]
required = true
startup_timeout_s = 5
max_restarts = 0
period_s = 60
"""
    with running(project / "home", _spec(servers, [{"final": "planned anyway"}])) as daemon:
        lab = _wait_server(daemon, "lab", "failed")
        assert "catalog is refused" in lab["error"] and "description" in lab["error"] and lab["tools"] == [], lab
        assert lab["required"] is False and _server(daemon, "must.have")["required"] is True
        run_id = _run(daemon)
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "failed", shown
        assert "cannot plan: the required MCP server 'must.have' is not usable" in shown["run"]["reason"], shown
        # No provider turn was begun: the run never planned.
        assert ledger_rows(daemon.home, "SELECT slot FROM provider_requests WHERE run_id = ?", run_id) == []
        unavailable = {e["data"]["server"]: e["data"] for e in daemon.events()
                       if e["kind"] == "mcp-server-unavailable" and e["subject"] == run_id}
        assert unavailable["lab"]["required"] is False and "refused" in unavailable["lab"]["error"], unavailable
        assert unavailable["must.have"]["required"] is True, unavailable
        assert daemon.status()["mcp"][0]["error"]


def test_a_stdio_server_gets_only_a_trusted_path_and_its_specs_env(project: Path) -> None:
    """V1.22: "清空继承环境，只注入安全 PATH、配置中的 env" (a strict re-audit found HOME, SHELL, TERM
    and USER kept from the SDK's default environment)."""
    servers = _lab(effects=project / "lab.log", env=', LAB_GREETING = "hi"')
    steps = [{"actions": [("mcp.lab.environ", {})]}, {"final": "done"}]
    # What the SDK's default environment would pass on, were it there to take, and a
    # PATH with a directory of the project and a relative entry first.
    (project / "ws" / "bin").mkdir()
    host = {"HOME": str(project), "SHELL": "/bin/sh", "TERM": "xterm", "USER": "someone", "LOGNAME": "someone",
            "PATH": os.pathsep.join([str(project / "ws" / "bin"), ".", os.environ.get("PATH", os.defpath)])}
    with running(project / "home", _spec(servers, steps), env=host) as daemon:
        shown = wait_run(daemon, _run(daemon), {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown
        (row,) = ledger_rows(daemon.home, "SELECT result FROM actions WHERE tool = 'mcp.lab.environ'")
        environ = json.loads(json.loads(row["result"])["output"]["text"])
    # LC_CTYPE=C.UTF-8 is the interpreter's own (PEP 538 locale coercion, in the
    # launcher and the server), never corral's: nothing else of its environment is there.
    assert environ.pop("LC_CTYPE", "C.UTF-8") == "C.UTF-8"
    assert set(environ) == {"PATH", "LAB_EFFECTS", "LAB_GREETING", "CORRAL_MCP_TREE"}, sorted(environ)
    assert environ["LAB_GREETING"] == "hi"
    entries = environ["PATH"].split(os.pathsep)
    assert entries and all(Path(entry).is_absolute() for entry in entries), entries
    assert not any(Path(entry).resolve().is_relative_to((project / "ws").resolve()) for entry in entries)


def test_calls_to_one_server_are_serial_and_to_two_servers_may_overlap(project: Path) -> None:
    """V1.22: "同一 server 的 catalog/call 串行，不同 server 可并行". The lab's ``nap``
    sleeps without blocking the server, so only corral can keep two calls apart."""
    import threading

    effects = project / "lab.log"
    servers = _lab(effects=effects) + _lab("other", effects=effects)
    with running(project / "home", _spec(servers, [{"final": "done"}])) as daemon:
        for server in ("lab", "other"):
            _wait_server(daemon, server, "ready")

        def call(server: str) -> None:
            answer = daemon.call("mcp.call", server=server, tool="nap", arguments={"seconds": 0.5}, approve=True)
            assert answer["ok"], answer

        threads = [threading.Thread(target=call, args=(server,)) for server in ("lab", "lab", "lab", "other")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    naps = [line for line in _lines(effects) if line["label"] == "nap"]
    assert len(naps) == 4, naps
    by_pid: dict[int, list[tuple[float, float]]] = {}
    for line in naps:
        by_pid.setdefault(line["pid"], []).append((line["start"], line["end"]))
    one = sorted(max(by_pid.values(), key=len))
    assert len(one) == 3 and all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(one)), one


def test_an_image_in_a_result_reaches_the_model_as_its_type_mime_size_and_sha256(project: Path) -> None:
    """V1.22: "模型 observation 只读取…text/structured content；image/audio/embedded resource 只给类型、
    MIME、大小和 SHA-256 元数据，本切片不把任意 MCP 二进制转发给 Provider" (only the type was kept)."""
    import base64
    import hashlib

    from tests.mcp_servers.lab_server import PICTURE

    steps = [{"actions": [("mcp.lab.picture", {})]}, {"final": "done"}]
    with running(project / "home", _spec(_lab(effects=project / "lab.log"), steps)) as daemon:
        shown = wait_run(daemon, _run(daemon), {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown
        (row,) = ledger_rows(daemon.home, "SELECT result FROM actions WHERE tool = 'mcp.lab.picture'")
    output = json.loads(row["result"])["output"]
    assert output["text"] == "here it is"
    assert output["other_content"] == [{"type": "image", "mime_type": "image/png", "bytes": len(PICTURE),
                                        "sha256": hashlib.sha256(PICTURE).hexdigest()}], output
    assert base64.b64encode(PICTURE).decode()[:40] not in row["result"]


# -- SIGKILL at named failpoints -------------------------------------------------------


@pytest.mark.parametrize(
    ("failpoint", "tool", "args", "phase", "executions"),
    [
        # Killed before the request left: corral cannot know that, so it asks a person.
        ("mcp.before-call=kill@once", "mcp.lab.send", {"to": "a"}, "needs-reconciliation", 0),
        # Killed after the server did it: never sent again.
        ("mcp.after-call=kill@once", "mcp.lab.send", {"to": "a"}, "needs-reconciliation", 1),
        # A read tool may run again once the server is back.
        ("mcp.after-call=kill@once", "mcp.lab.peek", {"item": "k1"}, "ok", 2),
        # An idempotent one too, with the same key.
        ("mcp.after-call=kill@once", "mcp.lab.put", {"item": "k2", "value": "v"}, "ok", 2),
    ],
)
def test_sigkill_of_the_mcp_actor_mid_call(
    project: Path, failpoint: str, tool: str, args: dict[str, Any], phase: str, executions: int
) -> None:
    effects = project / "lab.log"
    steps = [{"actions": [(tool, args)]}, {"final": "done"}]
    env = {"CORRAL_FAILPOINTS": failpoint}
    with running(project / "home", _spec(_lab(effects=effects), steps), env=env) as daemon:
        _wait_server(daemon, "lab", "ready")
        shown = wait_run(daemon, _run(daemon), {"needs-reconciliation", "completed", "failed"})
        (action,) = shown["actions"]
        assert action["phase"] == phase, shown
        lines = _lines(effects)
        assert len(lines) == executions
        assert all(line["action_id"] == action["action_id"] for line in lines)
        if tool.endswith(".put"):
            assert {line["idempotency_key"] for line in lines} == {action["action_id"]}
        assert _wait_server(daemon, "lab", "ready", restarts=1)["restarts"] >= 1


def test_sigkill_of_the_supervisor_after_executing_never_resends(project: Path) -> None:
    effects = project / "lab.log"
    steps = [{"actions": [("mcp.lab.send", {"to": "z"})]}, {"final": "done"}]
    env = {"CORRAL_FAILPOINTS": "mcp.after-call=kill-supervisor@once"}
    spec = _spec(_lab(effects=effects), steps)
    with running(project / "home", spec, env=env) as daemon:
        _wait_server(daemon, "lab", "ready")
        pid = daemon.endpoint.pid  # before the run: the failpoint may kill it at once
        run_id = _run(daemon)
        from corral.core.procs import wait_exit

        assert wait_exit(pid, 60)
        daemon.up()
        shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
        (action,) = shown["actions"]
        assert action["phase"] == "needs-reconciliation"
        assert len(_lines(effects)) == 1


def test_a_catalog_that_changes_mid_run_fails_closed(project: Path) -> None:
    effects = project / "lab.log"
    schema_file = project / "schema.txt"
    schema_file.write_text("v1")
    servers = _lab(effects=effects, env=f', LAB_SCHEMA_FILE = "{schema_file}"').replace(
        'approval = "auto"', 'approval = "confirm"'
    )
    steps = [{"actions": [("mcp.lab.versioned", {"name": "a"})]}, {"final": "done"}]
    with running(project / "home", _spec(servers, steps)) as daemon:
        first = _wait_server(daemon, "lab", "ready")
        shown = wait_run(daemon, _run(daemon), {"waiting-confirmation"})
        (action,) = shown["actions"]
        schema_file.write_text("v2")
        daemon.call("kill_actor", actor_id="mcp-lab")
        second = _wait_server(daemon, "lab", "ready", restarts=1)
        assert second["fingerprint"] != first["fingerprint"]
        daemon.call("continue_action", action_id=action["action_id"], decision="approve")
        shown = wait_run(daemon, shown["run"]["run_id"], {"completed", "failed"})
        row = ledger_rows(daemon.home, "SELECT phase, error FROM actions WHERE action_id = ?", action["action_id"])[0]
        assert row["phase"] == "failed" and "changed since this run pinned" in row["error"]
        assert _lines(effects) == []


def test_corral_mcp_call_goes_through_policy_and_the_ledger(project: Path) -> None:
    effects = project / "lab.log"
    servers = _lab(effects=effects).replace('approval = "auto"', 'approval = "writes"')
    with running(project / "home", _spec(servers, [{"final": "x"}])) as daemon:
        _wait_server(daemon, "lab", "ready")
        read = cli(daemon.home, "mcp", "call", "lab", "peek", "--args", '{"item": "q"}', "--json")
        assert read.returncode == 0, read.stderr
        assert json.loads(read.stdout)["result"]["text"] == "value of q"
        refused = cli(daemon.home, "mcp", "call", "lab", "send", "--args", '{"to": "x"}')
        assert refused.returncode != 0 and "--approve" in refused.stderr
        assert len(_lines(effects)) == 1
        bad = cli(daemon.home, "mcp", "call", "lab", "send", "--args", '{"to": 1}')
        assert bad.returncode != 0 and "to" in bad.stderr
        done = cli(daemon.home, "mcp", "call", "lab", "send", "--args", '{"to": "x"}', "--approve", "--json")
        assert done.returncode == 0, done.stderr
        action_id = json.loads(done.stdout)["action_id"]
        row = ledger_rows(daemon.home, "SELECT phase, reason FROM actions WHERE action_id = ?", action_id)[0]
        assert row["phase"] == "ok"
        receipts = ledger_rows(daemon.home, "SELECT status FROM receipts WHERE action_id = ?", action_id)
        assert receipts == [{"status": "ok"}]
        assert len(_lines(effects)) == 2
        usage = cli(daemon.home, "mcp", "call", "lab", "send", "--args", "[1]")
        assert usage.returncode == 2 and "JSON object" in usage.stderr

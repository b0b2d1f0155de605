"""MCP without traps (issue 38, seed 004 V1.22): a server's program is a bare name
from a trusted PATH and its cwd an absolute directory outside the project, a server
that fails shows why (its stderr's last lines and its log file), and the server
snippet of docs/mcp.md runs as written.

One swarm covers the end-to-end part: its spec lives in a subdirectory with the
project root elsewhere; the docs' server runs as `python` with its script named by
absolute path, and a server found on PATH starts once, then fails to start again
with a distinctive line (and a secret) on its stderr.
"""

from __future__ import annotations

import json
import os
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
    """The spec in conf/, the project root in project/: the docs' server is
    conf/weather_server.py by absolute path, start-once is in conf/bin (on PATH)."""
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

{_snippet("mcp-spec-snippet").replace("/srv/mcp", str(conf))}

[[mcp_servers]]
id = "flaky"
command = ["start-once"]
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


def test_the_docs_server_runs_and_a_failed_server_says_why(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # start-once is found on PATH, in a directory outside the project.
    path = f"{short_tmp / 'conf' / 'bin'}:{os.environ.get('PATH', '')}"
    monkeypatch.setenv("PATH", path)
    daemon = Daemon(short_tmp / "home", _swarm(short_tmp), {"PATH": path})
    try:
        daemon.up()
        _wait_server(daemon, "weather", "ready")
        _wait_server(daemon, "flaky", "ready")  # started once, through start-once on PATH
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


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_program_is_a_bare_name_on_a_trusted_path_and_cwd_an_absolute_directory_outside_the_project(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 004 V1.22: "transport=stdio 必须配置裸可执行名 command…Runtime 从项目外受信任 PATH
    解析可执行文件…显式 cwd 必须是已存在的项目外绝对目录；省略时固定使用已解析可执行文件所在目录"."""
    tools, project, data = short_tmp / "tools", short_tmp / "project", short_tmp / "data"
    server = _executable(tools / "bin" / "server")
    _executable(project / "bin" / "server")  # a project's own program of the same name
    _executable(project / "bin" / "only-here")
    (tools / "bin" / "into-project").symlink_to(project / "bin" / "only-here")
    data.mkdir()
    (project / "sub").mkdir()
    (short_tmp / "link-to-project").symlink_to(project)
    # The project's bin comes first on PATH: it is not trusted, so it is skipped.
    monkeypatch.setenv("PATH", f"{project / 'bin'}:relative/bin:{tools / 'bin'}")
    source = str(short_tmp / "swarm.toml")

    def servers(*tables: dict[str, Any]) -> Any:
        return parse_spec({"project": {"root": "project"},
                           "mcp_servers": [{"id": f"s{i}", **t} for i, t in enumerate(tables)]}, source).mcp_servers

    found, python, placed = servers(
        {"command": ["server", "--flag"]},
        {"command": ["python", "-m", "x"]},
        {"command": ["server"], "cwd": str(data)},
    )
    assert found.command == (str(server), "--flag") and found.cwd == str(tools / "bin")
    assert python.command == ("python", "-m", "x")  # the interpreter corral runs on
    assert python.cwd == str(Path(sys.executable).resolve().parent)
    assert placed.cwd == str(data)
    cases = [
        ({"command": ["bin/server"]}, r"mcp_servers\[0\]\.command: 'bin/server' is a path; give a bare program"
                                      r" name"),
        ({"command": ["/usr/bin/env"]}, r"'/usr/bin/env' is a path"),
        ({"command": ["only-here"]}, r"mcp_servers\[0\]\.command: no program 'only-here' on a trusted PATH"),
        ({"command": ["into-project"]}, r"resolves to .*only-here, inside the project"),
        ({"command": ["server"], "cwd": "data"}, r"mcp_servers\[0\]\.cwd: 'data' is not an absolute path"),
        ({"command": ["server"], "cwd": str(short_tmp / "nowhere")}, r"mcp_servers\[0\]\.cwd: .*nowhere is not an"
                                                                    r" existing directory"),
        ({"command": ["server"], "cwd": str(project / "sub")}, r"mcp_servers\[0\]\.cwd: .*sub is inside the"
                                                              r" project"),
        ({"command": ["server"], "cwd": str(short_tmp / "link-to-project")}, r"is inside the project"),
    ]
    for table, message in cases:
        with pytest.raises(SpecError, match=message):
            servers(table)


def test_a_path_entry_this_user_cannot_look_into_is_skipped_not_a_crash(tmp_path: Path) -> None:
    """A PATH directory the user may not search (another user's home: /root/.cargo/bin
    for an unprivileged user) is left out of the servers' PATH; it never fails
    ``corral up`` (a strict re-audit saw a PermissionError there). As root, the check
    runs without root's capabilities, where a directory's mode 0 holds for root too."""
    import shutil
    import subprocess

    locked = tmp_path / "locked"
    (locked / "bin").mkdir(parents=True)
    locked.chmod(0)
    probe = ("import sys; from pathlib import Path; from corral.supervisor.mcp.mcp_spec import trusted_path;"
             " print(trusted_path(sys.argv[1], Path(sys.argv[2])))")
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("no setpriv(1): root's capabilities cannot be dropped here")
        prefix = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--"]
    try:
        done = subprocess.run([*prefix, sys.executable, "-c", probe, f"{locked / 'bin'}{os.pathsep}/usr/bin",
                               str(tmp_path / "project")], capture_output=True, text=True, timeout=60, check=False)
    finally:
        locked.chmod(0o700)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "/usr/bin"

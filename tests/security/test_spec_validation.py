"""Issue 14, items 5 and 12-15: every spec value validated at load with an error
naming the field; workspaces inside a sane project root; policy keys that name real
tools; bounded, regular, UTF-8 spec files; control parameters in range; quiet pipes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.supervisor.spec import SpecError, load_spec, parse_spec
from tests.harness import cli, running

CORRAL = [sys.executable, "-m", "corral"]


def _agent(**fields: Any) -> dict[str, Any]:
    return {"id": "a", "steps": [{"final": "ok"}], **fields}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"supervisor": {"heartbeat_s": 0}}, "supervisor.heartbeat_s"),
        ({"supervisor": {"heartbeat_s": -1}}, "supervisor.heartbeat_s"),
        ({"supervisor": {"heartbeat_s": float("nan")}}, "spec.supervisor.heartbeat_s"),
        ({"supervisor": {"inbox_size": 0}}, "supervisor.inbox_size"),
        ({"supervisor": {"max_frame": 10**20}}, "supervisor.max_frame"),
        ({"groups": [{"id": "g", "period_s": float("inf")}]}, "spec.groups[0].period_s"),
        ({"groups": [{"id": "g", "max_restarts": -1}]}, "groups[0].max_restarts"),
        ({"actors": [{"id": "e", "template": "echo", "count": 0}]}, "actors[0].count"),
        ({"actors": [{"id": "e", "template": "echo", "backoff_jitter": 2.0}]}, "actors[0].backoff_jitter"),
        ({"actors": [{"id": "e", "template": "echo", "shutdown_timeout_ms": 10**20}]}, "actors[0].shutdown_timeout_ms"),
        ({"agents": [_agent(max_repairs=-5)]}, "agents[0].max_repairs"),
        ({"agents": [_agent(retry_cap_s=float("nan"))]}, "spec.agents[0].retry_cap_s"),
        ({"agents": [_agent(retry_base_s=0)]}, "agents[0].retry_base_s"),
        ({"limits": {"child_timeout_s": -1}}, "limits.child_timeout_s"),
        ({"limits": {"max_depth": 10**20}}, "limits.max_depth"),
        ({"sandbox": {"cpu_s": -1}}, "sandbox.cpu_s"),
        ({"sandbox": {"processes": 0}}, "sandbox.processes"),
        ({"sandbox": {"address_space_bytes": 10**20}}, "sandbox.address_space_bytes"),
        ({"agents": [_agent(openai={"timeout_s": float("inf")})]}, "spec.agents[0].openai.timeout_s"),
        ({"name": "x" * 1000}, "spec.name"),
        ({"name": "x" * (300 * 1024)}, "spec.name"),
        ({"agents": [_agent(steps=[{"final": "y" * (300 * 1024)}])]}, "spec.agents[0].steps[0].final"),
    ],
)
def test_bad_numbers_and_strings_are_refused_naming_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    assert str(caught.value).startswith(field), str(caught.value)


def test_a_good_spec_with_every_number_at_a_bound_still_loads(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    spec = parse_spec(
        {
            "project": {"root": "ws"},
            "supervisor": {"heartbeat_s": 0.05, "inbox_size": 1, "max_frame": 1024},
            "groups": [{"id": "g", "max_restarts": 0, "period_s": 86400}],
            "actors": [{"id": "e", "template": "echo", "group": "g", "backoff_jitter": 1.0}],
            "agents": [_agent(max_repairs=0, retry_cap_s=86400)],
            "sandbox": {"cpu_s": 1, "processes": 1},
        },
        str(tmp_path / "swarm.toml"),
    )
    assert spec.supervisor.heartbeat_s == 0.05 and spec.agent("a").max_repairs == 0


@pytest.mark.parametrize(
    ("root", "workspace", "message"),
    [
        ("ws", "../../../../", "outside the project root"),
        ("ws", "/etc", "outside the project root"),
        ("/", ".", "a system directory"),
        ("/etc", ".", "system directory"),
        ("/usr/lib", ".", "lies in the system directory"),
        ("~", ".", "your home directory"),
    ],
)
def test_a_workspace_lies_inside_a_sane_project_root(tmp_path: Path, root: str, workspace: str, message: str) -> None:
    (tmp_path / "ws").mkdir()
    root = str(Path.home()) if root == "~" else root
    with pytest.raises(SpecError, match=message):
        parse_spec({"project": {"root": root}, "agents": [_agent(workspace=workspace)]}, str(tmp_path / "s.toml"))


def test_a_symlinked_workspace_is_judged_where_it_points(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "escape").symlink_to("/etc")
    with pytest.raises(SpecError, match="outside the project root"):
        parse_spec({"project": {"root": "ws"}, "agents": [_agent(workspace="escape")]}, str(tmp_path / "s.toml"))


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"comand.exec": "deny"}, "did you mean 'command.exec'"),
        ({"fs.wirte": "confirm"}, "did you mean 'fs.write'"),
        ({"nothing.*": "deny"}, "no tool 'nothing.*'"),
        ({"mcp.undeclared.tool": "deny"}, "no tool 'mcp.undeclared.tool'"),
    ],
)
def test_a_misspelled_policy_key_is_a_spec_error(policy: dict[str, str], message: str) -> None:
    for data in ({"policy": policy}, {"agents": [_agent(policy=policy)]}):
        with pytest.raises(SpecError, match=message):
            parse_spec(data)


def test_policy_keys_may_be_globs_and_tools_of_declared_mcp_servers() -> None:
    spec = parse_spec(
        {
            "policy": {"fs.*": "confirm", "command.exec": "deny"},
            "mcp_servers": [{"id": "git", "command": ["x"]}],
            "agents": [_agent(policy={"mcp.git.git_commit": "deny", "mcp.git.*": "confirm"})],
        }
    )
    assert spec.policy["command.exec"] == "deny"


def test_spec_files_must_be_bounded_regular_utf8(tmp_path: Path) -> None:
    binary = tmp_path / "latin1.toml"
    binary.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(binary)
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 * 1024 * 1024))
    with pytest.raises(SpecError, match="the limit is"):
        load_spec(big)
    with pytest.raises(SpecError, match="not a regular file"):
        load_spec(Path("/dev/zero"))
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):  # and it does not block
        load_spec(fifo)
    script_spec = tmp_path / "swarm.toml"
    script_spec.write_text('[[agents]]\nid = "a"\nscript = "/dev/zero"\n')
    with pytest.raises(SpecError, match="not a regular file"):
        load_spec(script_spec)


def test_bad_specs_at_corral_up_are_clear_errors_not_tracebacks(short_tmp: Path) -> None:
    spec = short_tmp / "swarm.toml"
    spec.write_bytes(b'name = "\xff\xfe"\n')
    result = cli(short_tmp / "home", "up", "--spec", str(spec))
    assert result.returncode == 2 and "not UTF-8" in result.stderr and "Traceback" not in result.stderr
    spec.write_text("[supervisor]\nheartbeat_s = nan\n")
    result = cli(short_tmp / "home", "up", "--spec", str(spec))
    assert result.returncode == 2 and "heartbeat_s" in result.stderr and "Traceback" not in result.stderr
    assert not (short_tmp / "home" / "endpoint.json").exists()


def test_control_parameters_out_of_range_are_bad_requests(short_tmp: Path) -> None:
    with running(short_tmp / "home", '[[actors]]\nid = "echo"\ntemplate = "echo"\n') as daemon:
        from corral.mailbox.control import ControlError

        for method, params in (
            ("events", {"since": 2**64 - 1}),
            ("events", {"wait_ms": -1}),
            ("events", {"limit": 2**63}),
            ("request_actor", {"actor_id": "echo", "body": {}, "timeout_s": float("nan")}),
            ("request_actor", {"actor_id": "echo", "body": {}, "timeout_s": float("inf")}),
            ("show", {"run_id": "x" * 5000}),
        ):
            with pytest.raises(ControlError) as caught:
                daemon.call(method, **params)
            assert caught.value.code in ("bad-request", "not-found"), (method, caught.value)
        assert daemon.call("ping")["pong"] is True  # and the supervisor is fine


def test_a_closed_pipe_is_not_a_traceback(short_tmp: Path) -> None:
    with running(short_tmp / "home", '[[actors]]\nid = "echo"\ntemplate = "echo"\ncount = 300\n') as daemon:
        pipeline = subprocess.run(
            f"{' '.join(CORRAL)} --home {daemon.home} status | head -1",
            shell=True,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert pipeline.stdout.strip()
        assert "BrokenPipe" not in pipeline.stderr and "Traceback" not in pipeline.stderr

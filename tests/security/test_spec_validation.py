"""Issue 14, items 5 and 12-15: every spec value validated at load with an error
naming the field; workspaces inside a sane project root; policy keys that name real
tools; bounded, regular, UTF-8 spec files; control parameters in range; quiet pipes."""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest

from corral.mailbox.control import ControlError
from corral.supervisor.runs.run_store import MAX_TASK_CHARS
from corral.supervisor.spec.spec_base import bare, bounds
from corral.supervisor.spec.spec_models import SpecFile
from corral.supervisor.spec.swarm_spec import SpecError, load_spec, parse_spec
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


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"agents": [_agent(), _agent(id="b", max_repairs=-5)]},
         "agents[1].max_repairs: must be a finite number between 0 and 100, got -5"),
        ({"actors": [{"id": "e", "template": "echo", "restrat": "permanent"}]},
         "actors[0]: unknown key 'restrat'; did you mean 'restart'?"),
        ({"supervisor": {"heartbeat_s": float("nan")}},
         "spec.supervisor.heartbeat_s: NaN and infinity are not accepted"),
        ({"groups": [{"id": "g", "max_restarts": "3"}]}, "groups[0].max_restarts: expected int, got str"),
        ({"groups": [{"id": "g", "strategy": "one_for_some"}]},
         "groups[0].strategy: 'one_for_some' is not one of one_for_one, one_for_all, rest_for_one"),
        ({"groups": [{"strategy": "one_for_all"}]}, "groups[0]: missing id"),
        ({"mcp_servers": [{"id": "x", "command": ["a"], "comand": ["a"]}]},
         "mcp_servers[0]: unknown key 'comand'; did you mean 'command'?"),
        ({"mcp_servers": [{"id": "x", "command": ["a"], "period_s": 0}]},
         "mcp_servers[0].period_s: must be a finite number between 0.1 and 86400, got 0"),
        ({"models": [{"id": "m", "n_treads": 2}]}, "models[0]: unknown key 'n_treads'; did you mean 'n_threads'?"),
        ({"models": [{"id": "m", "n_ctx": 10}]},
         "models[0].n_ctx: must be a finite number between 256 and 1048576, got 10"),
        ({"ledger": {"lease": 3}}, "ledger: unknown key 'lease'; did you mean 'lease_s'?"),
        ({"ledger": {"lease_s": 0}}, "ledger.lease_s: must be a finite number between 0.5 and 3600, got 0"),
        ({"bridge": {"url": "http://127.0.0.1:9", "agent": "a", "poll": 1}},
         "bridge: unknown key 'poll'; did you mean 'poll_s'?"),
        ({"bridge": {"url": "http://127.0.0.1:9", "agent": "a", "lease_ms": 5}},
         "bridge.lease_ms: must be a finite number between 1000 and 86400000, got 5"),
    ],
)
def test_every_section_words_its_errors_the_same_way(data: dict[str, Any], message: str) -> None:
    """One formatter for every section (issue 33): MCP servers, models, the ledger and
    the bridge said "must be between", "unknown keys [...]" or nothing close before."""
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    assert str(caught.value) == message


def test_the_collaboration_policy_file_is_read_the_same_way() -> None:
    from corral.supervisor.context import collaboration

    for text, message in (
        ('{"minStaticDelegates": 4}', "minStaticDelegates: must be a finite number between 0 and 3, got 4"),
        ('{"minStaticDelegate": 1}', "unknown key 'minStaticDelegate'; did you mean 'minStaticDelegates'?"),
        ('{"requiredInitialWave": "yes"}', "requiredInitialWave: 'yes' is not one of auto, static, isolated, mixed"),
    ):
        with pytest.raises(SpecError) as caught:
            collaboration.parse(text)
        assert str(caught.value) == message
    assert collaboration.PolicyError is SpecError  # the one error type, under the name its service catches


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


#: Every module that declares spec sections (pydantic dataclasses).
_SECTION_MODULES = (
    "spec.spec_models", "mcp.mcp_spec", "models.model_spec", "bridge.bridge_spec", "context.collaboration",
)


def _numeric(kind: type) -> list[str]:
    fields = getattr(kind, "__pydantic_fields__", {})
    return [name for name, info in fields.items() if bare(info.annotation) in (int, float)]


def test_every_numeric_field_of_every_section_has_a_range() -> None:
    """A new numeric field without ``Field(ge=..., le=...)`` would accept 0, -1 and 10**20 silently."""
    modules = [importlib.import_module(f"corral.supervisor.{name}") for name in _SECTION_MODULES]
    sections = {
        obj for module in modules for obj in vars(module).values()
        if isinstance(obj, type) and hasattr(obj, "__pydantic_fields__")
    }
    numeric = [(kind, name) for kind in sections for name in _numeric(kind)]
    assert len(numeric) > 40, "the field scan found too little: it is broken"
    unbounded = [f"{kind.__name__}.{name}" for kind, name in numeric
                 if not all(map(math.isfinite, bounds(kind.__pydantic_fields__[name])))]
    assert unbounded == []


def _sections(kind: Any, place: str = "") -> Iterator[tuple[str, type[Any]]]:
    """Every section under ``kind`` with its place in a spec file (``agents``, ``mcp_servers.tools``)."""
    fields = getattr(kind, "__pydantic_fields__", {})
    if fields:
        yield place, kind
    for name, info in fields.items():
        inner = bare(info.annotation)
        while get_origin(inner) in (list, tuple, dict):
            inner = bare(get_args(inner)[-1 if get_origin(inner) is dict else 0])
        yield from _sections(inner, f"{place}.{name}" if place else name)


#: Every ranged key a spec file can hold, as ``section.key``, read from the models.
RANGES = {
    f"{place}.{name}": bounds(kind.__pydantic_fields__[name])
    for place, kind in _sections(SpecFile) if place for name in _numeric(kind)
}
#: A valid entry of each array section, and the keys a table section needs.
_ENTRY = {"groups": {"id": "g"}, "actors": {"id": "e", "template": "echo"}, "agents": _agent(),
          "mcp_servers": {"id": "m", "command": ["x"]}, "models": {"id": "m"}}
_TABLE = {"bridge": {"url": "http://127.0.0.1:9", "agent": "a"}}


def test_the_probe_below_covers_every_section() -> None:
    sections = {key.split(".")[0] for key in RANGES}
    assert {"supervisor", "groups", "actors", "agents", "limits", "sandbox", "mcp_servers", "models", "bridge",
            "ledger"} <= sections


@pytest.mark.parametrize("key", sorted(RANGES))
@pytest.mark.parametrize("bad", ["below", "above", "nan", "inf"])
def test_each_ranged_value_is_refused_out_of_range_naming_the_field(key: str, bad: str) -> None:
    section, name = key.split(".")
    low, high = RANGES[key]
    value = {"below": low - 1, "above": high * 10 + 1, "nan": float("nan"), "inf": float("inf")}[bad]
    if bad in ("below", "above") and float(low).is_integer() and float(high).is_integer():
        value = int(value)
    table: dict[str, Any] = {name: value}
    data: dict[str, Any]
    if section in _ENTRY:
        data, where = {section: [{**_ENTRY[section], **table}]}, f"{section}[0].{name}"
    else:
        data, where = {section: {**_TABLE.get(section, {}), **table}}, f"{section}.{name}"
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    assert where in str(caught.value), str(caught.value)


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


@pytest.mark.parametrize("root", ["/", "/etc", "/usr/share", "/libx32", "/var", "~"])
def test_an_explicit_project_root_is_checked_without_any_agent(tmp_path: Path, root: str) -> None:
    root = str(Path.home()) if root == "~" else root
    with pytest.raises(SpecError, match=r"^project\.root: "):
        parse_spec({"project": {"root": root}}, str(tmp_path / "s.toml"))


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
            "mcp_servers": [{"id": "git", "command": ["true"]}],  # a program on PATH
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
        for method, params in (
            ("events", {"since": 2**64 - 1}),
            ("events", {"wait_ms": -1}),
            ("events", {"limit": 2**63}),
            ("request_actor", {"actor_id": "echo", "body": {}, "timeout_s": float("nan")}),
            ("request_actor", {"actor_id": "echo", "body": {}, "timeout_s": float("inf")}),
            ("show", {"run_id": "x" * 5000}),
            ("cancel", {"run_id": "run-nothere", "reason": 3}),
            ("continue_action", {"action_id": "act-x", "decision": "approve", "fingerprint": "f" * 5000}),
        ):
            with pytest.raises(ControlError) as caught:
                daemon.call(method, **params)
            assert caught.value.code in ("bad-request", "not-found"), (method, caught.value)
            if method in ("events", "request_actor", "cancel", "continue_action"):
                assert caught.value.code == "bad-request", (method, caught.value)
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


def test_long_tasks_and_reasons_do_not_break_the_run_list(short_tmp: Path) -> None:
    """Like the 50 MB name: stored text is shown again, and `runs` must still fit a frame."""
    # The project apart from the home (`corral up` refuses a home inside it, issue 32).
    spec = '[project]\nroot = "ws"\n[[agents]]\nid = "a"\nsteps = [{ final = "done" }]\n'
    with running(short_tmp / "home", spec) as daemon:
        for _ in range(60):  # 60 x 20,000 characters would be past the 1 MiB frame if listed whole
            daemon.call("run", agent_id="a", task="t" * MAX_TASK_CHARS)
        listed = daemon.call("runs")["runs"]
        assert len(listed) == 60 and all(len(run["task"]) == 300 for run in listed)
        shown = daemon.call("show", run_id=listed[0]["run_id"])
        assert len(shown["run"]["task"]) == MAX_TASK_CHARS  # show gives the whole task
        result = cli(daemon.home, "runs")
        assert result.returncode == 0 and "Traceback" not in result.stderr
        for task in ("t" * (MAX_TASK_CHARS + 1), 7):
            with pytest.raises(ControlError) as caught:
                daemon.call("run", agent_id="a", task=task)
            assert caught.value.code == "bad-request" and "task" in caught.value.message
        assert len(daemon.call("runs")["runs"]) == 60  # and no run was created


def test_an_api_key_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "key"
    os.mkfifo(fifo, 0o600)
    from corral.actors.providers.openai import OpenAIConfig, OpenAIConfigError, load_api_key

    config = OpenAIConfig.from_mapping({"base_url": "http://127.0.0.1:9", "model": "m", "api_key_file": str(fifo)})
    with pytest.raises(OpenAIConfigError, match="not a regular file"):
        load_api_key(config)

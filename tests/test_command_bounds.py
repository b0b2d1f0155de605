"""The seed's bounds on a command (seed 004, V1.11): the program is a bare name of
1-64 ASCII letters, digits, dots, underscores, pluses or hyphens (never a path);
args are at most 64 items of at most 512 characters, 8 KiB in all, with no NUL or
control character. A call outside them is refused with a clear error and runs
nothing; a call at the limits runs. One supervisor for the module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from corral.sandbox.bwrap import bwrap_available
from tests.harness import Daemon, ledger_rows, module_daemon, wait_run

SANDBOX_TABLE = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'

SPEC = f"""
name = "bounds"
[project]
root = "ws"
{SANDBOX_TABLE}
[[agents]]
id = "runner"
  [[agents.steps]]
  final = "nothing scripted"
"""


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with module_daemon(SPEC) as running_daemon:
        yield running_daemon


def _exec(program: str, args: list[str]) -> dict[str, Any]:
    return {"tool": "command.exec", "input": {"program": program, "args": args}}


def _outcomes(daemon: Daemon, *calls: dict[str, Any]) -> list[dict[str, Any]]:
    script = {"steps": [*({"actions": [call]} for call in calls), {"final": "done"}]}
    run_id = daemon.call("run", agent_id="runner", task="run", script=json.dumps(script))["run_id"]
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    outcomes = []
    for action in shown["actions"]:
        (row,) = ledger_rows(daemon.home, "SELECT result, error, reason FROM actions WHERE action_id = ?",
                             action["action_id"])
        result = json.loads(row["result"]) if row["result"] else {}
        outcomes.append({"output": result.get("output", {}), "error": row["error"] or row["reason"] or ""})
    return outcomes


def test_program_names_and_args_outside_the_seeds_bounds_are_refused(daemon: Daemon) -> None:
    # An absolute program ("/bin/echo") never gets this far: its plan fails the
    # handoff closed (seed 004 V1.43; tests/test_provider_secrets.py).
    refused = _outcomes(
        daemon,
        _exec("./echo", ["x"]),
        _exec("bin/echo", ["x"]),
        _exec("e" * 65, []),
        _exec("ec\x01ho", []),
        _exec("echo", ["a"] * 65),
        _exec("echo", ["a" * 513]),
        _exec("echo", ["a" * 500] * 17),  # 8,500 bytes
        _exec("echo", ["a\nb"]),
        _exec("echo", ["a\x00b"]),
    )
    errors = [outcome["error"] for outcome in refused]
    assert all("program" in error for error in errors[:4]), errors[:4]
    assert "64" in errors[4] and "512" in errors[5] and "8 KiB" in errors[6], errors[4:7]
    assert all("control" in error for error in errors[7:]), errors[7:]
    # Refused as bad input before any launch: nothing ran, so there is no exit code.
    assert all(outcome["output"].get("code") == "bad-input" and "exit_code" not in outcome["output"]
               for outcome in refused), [o["output"] for o in refused]


def test_a_command_at_the_seeds_limits_runs(daemon: Daemon) -> None:
    # 64 args, 8 KiB in all; a 64-character name of every allowed kind of character.
    (at_limits, longest_arg) = _outcomes(
        daemon, _exec("echo", ["a" * 128] * 64), _exec("echo", ["b" * 512]))
    assert at_limits["error"] == "" and at_limits["output"]["exit_code"] == 0, at_limits
    assert longest_arg["error"] == "" and longest_arg["output"]["exit_code"] == 0, longest_arg
    (odd_name,) = _outcomes(daemon, _exec("no-such_prog.v1+x" + "z" * 47, []))
    assert "bare name" not in odd_name["error"] and odd_name["error"], odd_name


def test_every_command_receipt_names_its_sandbox(daemon: Daemon) -> None:
    """V1.11: the receipt of a command records the fixed sandbox facts: its mode,
    whether it had the network, the backend and the profile's version."""
    ran, started = _outcomes(daemon, _exec("echo", ["hi"]),
                             {"tool": "process.start", "input": {"program": "true"}})
    facts = {key: ran["output"].get(key) for key in
             ("sandboxMode", "networkAccess", "sandboxBackend", "sandboxProfileVersion")}
    assert {key: started["output"].get(key) for key in facts} == facts, started
    if bwrap_available():
        assert facts == {"sandboxMode": "sandboxed", "networkAccess": False, "sandboxBackend": "bubblewrap",
                         "sandboxProfileVersion": 1}, facts
    else:
        assert facts == {"sandboxMode": "unsandboxed", "networkAccess": True, "sandboxBackend": "none",
                         "sandboxProfileVersion": 1}, facts

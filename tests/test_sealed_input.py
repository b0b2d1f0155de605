"""Sealed tool inputs, without processes: spooled privately, digests in the plan."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import pytest

from corral.actors.tools.base import ToolError, validate_input
from corral.actors.tools.process import ProcessStdin
from corral.actors.tools.registry import builtin_tools
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.runs import action_store, run_store, sealed_input
from corral.supervisor.runs.action_state import ActionPhase, action_id
from corral.supervisor.runs.run_feature import RunFeatures

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

PLAN = {
    "actions": [
        {"tool": "process.poll", "input": {"process_id": "proc-1"}},
        {"tool": "process.stdin", "input": {"process_id": "proc-1", "data": "hunter2", "append_newline": True}},
    ],
    "final": None,
}
#: The catalog that says which fields are sealed (process.stdin's ``data``).
TOOLS = builtin_tools()


def test_a_plan_keeps_only_the_digest_and_the_value_is_spooled_privately(tmp_path: Path) -> None:
    spool = sealed_input.spool_dir(tmp_path)
    sealed, changed = sealed_input.seal_plan(spool, "run-abcdef", 2, PLAN, TOOLS)
    assert changed
    marker = sealed["actions"][1]["input"]["data"]
    assert marker == {"sealed": hashlib.sha256(b"hunter2").hexdigest(), "bytes": 7}
    assert sealed["actions"][0] == PLAN["actions"][0] and "hunter2" not in repr(sealed)
    assert PLAN["actions"][1]["input"]["data"] == "hunter2", "the caller's plan is not modified"
    entry = spool / f"run-abcdef.{action_id('run-abcdef', 2, 1)}.data"
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600 and stat.S_IMODE(spool.stat().st_mode) == 0o700
    # The tool still validates with the marker in place of its string.
    validate_input(ProcessStdin.schema, sealed["actions"][1]["input"])
    with pytest.raises(ToolError):
        validate_input(ProcessStdin.schema, {"process_id": "p", "data": {"sealed": "x"}})
    assert sealed_input.unseal(spool, "run-abcdef", action_id("run-abcdef", 2, 1), "data", marker) == "hunter2"


def test_a_plan_without_sealed_fields_is_left_alone(tmp_path: Path) -> None:
    plan = {"actions": [{"tool": "process.stdin", "input": {"process_id": "p", "eof": True}}], "final": None}
    assert sealed_input.seal_plan(sealed_input.spool_dir(tmp_path), "run-abcdef", 0, plan, TOOLS) == (plan, False)
    assert list((tmp_path / "sealed").iterdir()) == []


def test_a_tampered_or_used_entry_is_refused(tmp_path: Path) -> None:
    spool = sealed_input.spool_dir(tmp_path)
    sealed, _ = sealed_input.seal_plan(spool, "run-abcdef", 0, PLAN, TOOLS)
    marker = sealed["actions"][1]["input"]["data"]
    the_id = action_id("run-abcdef", 0, 1)
    (spool / f"run-abcdef.{the_id}.data").write_bytes(b"hunter3")
    with pytest.raises(sealed_input.SealedInputError, match="does not match its digest"):
        sealed_input.unseal(spool, "run-abcdef", the_id, "data", marker)
    sealed_input.discard(spool, "run-abcdef", the_id)
    with pytest.raises(sealed_input.SealedInputError, match="already used"):
        sealed_input.unseal(spool, "run-abcdef", the_id, "data", marker)
    with pytest.raises(sealed_input.SealedInputError, match="not a sealed value"):
        sealed_input.unseal(spool, "run-abcdef", the_id, "data", "hunter2")


def test_the_boot_sweep_keeps_only_entries_an_action_will_still_read(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.db")
    ledger.begin_boot("b", 1, 1)
    spool = sealed_input.spool_dir(tmp_path)
    run_id = run_store.create_run(
        ledger, NO_FEATURES,
        agent_id="a", task="t", provider="scripted", provider_config={}, options={"workspace": "/tmp"}
    )
    waiting_plan = {"actions": [PLAN["actions"][1]] * 2, "final": None}
    sealed, _ = sealed_input.seal_plan(spool, run_id, 0, waiting_plan, TOOLS)
    started = action_store.prepare_action(
        ledger, run_id, 0, 0, "process.stdin", sealed["actions"][0]["input"], NO_FEATURES,
        rerunnable=False, policy="auto"
    )
    run_store.set_run_status(ledger, run_id, run_store.RunStatus.RUNNING, NO_FEATURES)
    action_store.move_action(ledger, started["action_id"], ActionPhase.EXECUTING)
    sealed_input.seal_plan(spool, "run-gone0000", 0, PLAN, TOOLS)  # a run the ledger never saw
    # Action 0 started (it will never be re-run), action 1 is not prepared yet: only it stays.
    assert sealed_input.sweep(spool, ledger) == 2
    assert [p.name for p in spool.iterdir()] == [f"{run_id}.{action_id(run_id, 0, 1)}.data"]

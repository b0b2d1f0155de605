"""The step boundary answered from per-run versions (issue 50 §4), without processes.

The supervisor is the only writer of its SQLite ledger, so a per-run version kept in
memory, bumped by every write to what the boundary's checks read, tells ``advance``
when nothing changed since a boundary that found nothing to do: it then skips
those reads. These tests show the reads go, and that every change still gets seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.mailbox.steps import ExecuteStep, ProviderStep
from corral.supervisor.interactive import steer_store
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import action_store, provider_store, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.loop_plan_store import commit_plan
from corral.supervisor.runs.next_step import advance
from corral.supervisor.runs.run_feature import RunFeature, RunFeatures

#: What the boundary's checks read, by table (next_step.py, the boundary hooks).
BOUNDARY_TABLES = ("finalizations", "steers")


class Steers(RunFeature):
    """The steer feature's run-layer part (interactive/interactive_service.py's)."""

    def __init__(self, features: RunFeatures) -> None:
        self.features = features

    def at_boundary(self, ledger: Ledger, run_id: str) -> None:
        steer_store.apply_steers(ledger, run_id, self.features)

    def provider_guard(self, ledger: Ledger, run_id: str) -> str | None:
        return steer_store.steer_holds_provider(ledger, run_id)


def steering() -> RunFeatures:
    """The features of a supervisor that has steers alone."""
    features = RunFeatures()
    features.install([Steers(features)])
    return features


@pytest.fixture
def features() -> RunFeatures:
    return steering()


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[SqliteLedger]:
    ledger = SqliteLedger(tmp_path / "l.db")
    ledger.begin_boot("b", 1, 1)
    try:
        yield ledger
    finally:
        ledger.close()


def running_run(ledger: SqliteLedger, features: RunFeatures) -> str:
    run_id = run_store.create_run(ledger, features, agent_id="a", task="t", provider="scripted", provider_config={})
    run_store.set_run_status(ledger, run_id, run_store.RunStatus.RUNNING, features)
    return run_id


def boundary_reads(ledger: SqliteLedger, features: RunFeatures, run_id: str) -> tuple[Any, list[str]]:
    """``advance``'s step, and its reads of the boundary's tables."""
    seen: list[str] = []
    ledger.db.set_trace_callback(seen.append)
    try:
        step = advance(ledger, run_id, features)
    finally:
        ledger.db.set_trace_callback(None)
    return step, [sql for sql in seen if any(f"FROM {table}" in sql for table in BOUNDARY_TABLES)]


def test_an_unchanged_run_is_answered_without_the_boundary_reads(
    ledger: SqliteLedger, features: RunFeatures
) -> None:
    run_id = running_run(ledger, features)
    first, reads = boundary_reads(ledger, features, run_id)
    assert first == ProviderStep(loop=0) and reads  # the first boundary reads them
    again, reads = boundary_reads(ledger, features, run_id)
    assert again == first and reads == []  # nothing the checks read changed since


def test_a_steer_written_after_a_quiet_boundary_is_applied_at_the_next(
    ledger: SqliteLedger, features: RunFeatures
) -> None:
    run_id = running_run(ledger, features)
    advance(ledger, run_id, features)
    advance(ledger, run_id, features)  # quiet now
    steer_store.record_steer(ledger, run_id, "do it differently", features)
    step, reads = boundary_reads(ledger, features, run_id)
    assert reads and step == ProviderStep(loop=1)
    assert steer_store.pending_steers(ledger, run_id) == []
    # And a provider turn asks the guards again only when something changed.
    assert provider_store.control_pending(ledger, run_id, features) is None


def test_a_steer_held_by_an_executing_action_is_applied_once_it_ends(
    ledger: SqliteLedger, features: RunFeatures
) -> None:
    """The steer waits while an action executes (steer_store.apply_steers): a boundary
    that found it waiting is no quiet one, so the next boundary looks again."""
    run_id = running_run(ledger, features)
    slot = provider_store.begin_provider_request(ledger, run_id, 0, features)["slot"]
    provider_store.provider_handoff(ledger, run_id, slot, '{"actions": []}')
    commit_plan(ledger, run_id, 0, slot, {"actions": [{"tool": "fs.list", "input": {"path": "."}}]})
    prepared = action_store.prepare_action(
        ledger, run_id, 0, 0, "fs.list", {"path": "."}, features, rerunnable=True, policy="auto"
    )
    action_store.move_action(ledger, prepared["action_id"], ActionPhase.EXECUTING)
    steer_store.record_steer(ledger, run_id, "stop", features)
    assert isinstance(advance(ledger, run_id, features), ExecuteStep)
    assert isinstance(advance(ledger, run_id, features), ExecuteStep)
    assert len(steer_store.pending_steers(ledger, run_id)) == 1  # held by the executing action
    action_store.finish_action(ledger, prepared["action_id"], True, {"entries": []}, "listed", None, features)
    step = advance(ledger, run_id, features)
    assert steer_store.pending_steers(ledger, run_id) == [] and step == ProviderStep(loop=1)


def test_a_rolled_back_write_only_costs_a_read(ledger: SqliteLedger, features: RunFeatures) -> None:
    run_id = running_run(ledger, features)
    advance(ledger, run_id, features)
    with pytest.raises(RuntimeError), ledger.tx():
        steer_store.record_steer(ledger, run_id, "never committed", features)
        raise RuntimeError("rolled back")
    step, reads = boundary_reads(ledger, features, run_id)
    assert reads and step == ProviderStep(loop=0)  # read again, never skipped on a guess
    assert boundary_reads(ledger, features, run_id)[1] == []  # and quiet again


def test_a_new_boot_starts_with_nothing_known(tmp_path: Path) -> None:
    """A reopened ledger (a boot, a recovery) knows no version: its first boundary reads."""
    path = tmp_path / "l.db"
    first = SqliteLedger(path)
    features = steering()
    run_id = running_run(first, features)
    advance(first, run_id, features)
    first.close()
    second = SqliteLedger(path)
    try:
        _, reads = boundary_reads(second, steering(), run_id)
        assert reads
    finally:
        second.close()

"""One feature object per feature, called in the list's one order
(supervisor/runs/run_feature.py): no processes, no ledger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import pytest
import trio

from corral.supervisor.runs.run_feature import RunFeature, RunFeatures
from corral.supervisor.runs.run_state import RunStatus

LEDGER = cast(Any, None)  # none of these features reads it


class Recorder(RunFeature):
    """Overrides a few methods; records each call with its name."""

    def __init__(self, name: str, calls: list[str], *, owns: str = "", blocks: bool = True) -> None:
        self.name, self.calls, self.owns, self.blocks = name, calls, owns, blocks

    def on_status(self, ledger: Any, run_id: str, status: RunStatus, reason: str | None) -> None:
        self.calls.append(f"{self.name}:status:{status.value}")

    def finalize_blockers(self, ledger: Any, run_id: str) -> list[str]:
        self.calls.append(f"{self.name}:blockers")
        return [f"{self.name} waits"] if self.blocks else []

    async def reconcile(self, target: str, params: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append(f"{self.name}:reconcile")
        return {"by": self.name} if target.startswith(self.owns or "\0") else None

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {self.name: run_id}


class Quiet(RunFeature):
    """Overrides nothing: it is never called."""

    def __getattribute__(self, name: str) -> Any:
        if name in {n for n in vars(RunFeature) if not n.startswith("_")}:
            raise AssertionError(f"a feature's base no-op {name} was called")
        return super().__getattribute__(name)


def test_each_method_is_called_on_the_features_that_have_it_in_the_lists_order() -> None:
    calls: list[str] = []
    features = RunFeatures()
    features.install([Recorder("b", calls), None, Quiet(), Recorder("a", calls, blocks=False)])
    for hook in features.on_status:
        hook(LEDGER, "run-1", RunStatus.RUNNING, None)
    assert features.finalize_blockers(LEDGER, "run-1") == ["b waits"]
    assert features.show("run-1") == {"b": "run-1", "a": "run-1"}
    assert list(features.show("run-1")) == ["b", "a"]
    assert calls == ["b:status:running", "a:status:running", "b:blockers", "a:blockers"]
    # Nothing overrides these: each gathers nothing, and calls no base no-op.
    assert features.pending() == {} and features.start_options(LEDGER, {}) == {}
    assert features.final_snapshot(LEDGER, "run-1", "done") is None
    assert features.action_guards == () and features.boundary == ()


def test_reconcile_is_answered_by_the_first_feature_that_owns_the_id() -> None:
    calls: list[str] = []
    features = RunFeatures()
    features.install([Recorder("elsewhere", calls, owns="act-"), Recorder("sessions", calls, owns="proc-")])
    assert trio.run(features.reconcile, "proc-1", {}) == {"by": "sessions"}
    assert trio.run(features.reconcile, "act-1", {}) == {"by": "elsewhere"}
    assert trio.run(features.reconcile, "llm-1", {}) is None  # the run layer's own
    assert calls == ["elsewhere:reconcile", "sessions:reconcile", "elsewhere:reconcile",
                     "elsewhere:reconcile", "sessions:reconcile"]


def test_a_supervisors_features_are_listed_once() -> None:
    features = RunFeatures()
    features.install([])
    with pytest.raises(RuntimeError, match="once"):
        features.install([Recorder("late", [])])

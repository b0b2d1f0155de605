"""A delegated specialist keeps its own provider-retry budget (seed 004 V1.29: the
gate sets the target agent's ``maxRetries`` and backoff): the run a delegation
creates carries the specialist spec's ``max_provider_retries``, ``retry_base_s`` and
``retry_cap_s``, not the runtime's defaults (3 retries, 0.5 s)."""

from __future__ import annotations

import json
from pathlib import Path

from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.runs import action_store, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.spec.swarm_spec import parse_spec
from corral.supervisor.swarm import delegation_store

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()


def test_a_delegated_run_carries_its_specialists_retry_limits(tmp_path: Path) -> None:
    spec = parse_spec({
        "project": {"root": str(tmp_path)},
        "agents": [
            {"id": "boss", "steps": [{"final": "x"}]},
            {"id": "helper", "role": "specialist", "steps": [{"final": "x"}], "max_provider_retries": 1,
             "retry_base_s": 15.0, "retry_cap_s": 15.0},
        ],
    }, str(tmp_path / "spec.toml"))
    ledger = SqliteLedger(tmp_path / "ledger.db")
    try:
        ledger.begin_boot("b", 1, 1)
        root = run_store.create_run(ledger, NO_FEATURES,
                                    agent_id="boss", task="t", provider="scripted", provider_config={},
                                    options={"workspace": str(tmp_path)})
        run_store.set_run_status(ledger, root, run_store.RunStatus.RUNNING, NO_FEATURES)
        action = action_store.prepare_action(ledger, root, 0, 0, "agent.delegate", {"n": 0}, NO_FEATURES,
                                             rerunnable=True,
                                             policy="auto")
        action_store.move_action(ledger, action["action_id"], ActionPhase.EXECUTING)
        made = delegation_store.delegate(ledger, spec, run_store.get_run(ledger, root), action["action_id"],
                                         {"agent_id": "helper", "task": "write the notes"}, NO_FEATURES)
        limits = json.loads(run_store.get_run(ledger, made["run_id"])["options"])["limits"]
    finally:
        ledger.close()
    assert {k: limits.get(k) for k in ("max_provider_retries", "retry_base_s", "retry_cap_s")} == {
        "max_provider_retries": 1, "retry_base_s": 15.0, "retry_cap_s": 15.0}

"""The collaboration policy (seed 004 V1.32, V1.37, V1.38): a root run's first wave
is held to the project's policy, the first valid wave binds a snapshot, a bound
root only orchestrates, and only the CLI writes the policy file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from corral.supervisor.context import collaboration
from tests.harness import Daemon, cli, ledger_rows, wait_run

DEMO = Path(__file__).resolve().parent.parent / "corral" / "defaults" / "demo.toml"
POLICY = {"requiredInitialWave": True, "minStaticDelegates": 2, "requiredStaticAgentIds": ["researcher"],
          "orchestratorOnlyAfterDelegation": True}
_REVIEWER = {"tool": "agent.delegate", "input": {"agent_id": "reviewer", "task": "review"}}
_RESEARCHER = {"tool": "agent.delegate", "input": {"agent_id": "researcher", "task": "survey"}}
# A script that answers each refusal (the repairs stay in loop 0 until a wave passes).
SCRIPT = {"steps": [
    {"unless_observed": "collaboration-policy",
     "actions": [{"tool": "fs.write", "input": {"path": "notes.md", "content": "alone"}}]},
    {"when_observed": "this plan has 0", "unless_observed": "this plan has 1", "actions": [_REVIEWER]},
    {"when_observed": "this plan has 1", "actions": [_REVIEWER, _RESEARCHER]},
    {"actions": [{"tool": "fs.write", "input": {"path": "notes.md", "content": "after the wave"}}]},
    {"final": "done"},
]}


def test_the_rules_and_the_safe_defaults() -> None:
    assert collaboration.parse("{}") == collaboration.Policy()
    assert not collaboration.wants_a_wave(collaboration.Policy())
    policy = collaboration.parse(json.dumps(POLICY))
    short = collaboration.wave_shortfalls(policy, [_REVIEWER])
    assert short == ["at least 2 agent.delegate call(s) (this plan has 1)", "a delegation to researcher"]
    assert collaboration.wave_shortfalls(policy, [_REVIEWER, _RESEARCHER]) == []
    for bad in ('{"minStaticDelegates": -1}', '{"surprise": 1}', '{"requiredInitialWave": "yes"}', "[]",
                '{"a": 1, "a": 2}'):
        with pytest.raises(collaboration.PolicyError):
            collaboration.parse(bad)


def test_a_short_first_wave_is_refused_and_the_first_valid_one_binds_a_snapshot(short_tmp: Path) -> None:
    (short_tmp / "project").mkdir()
    spec = short_tmp / "swarm.toml"
    spec.write_text(DEMO.read_text())
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        policy_file = short_tmp / "policy.json"
        policy_file.write_text(json.dumps(POLICY))
        done = cli(daemon.home, "collaboration", "set", str(policy_file), "--json")
        assert done.returncode == 0, done.stderr
        digest = json.loads(done.stdout)["digest"]
        installed = short_tmp / "project" / ".corral" / "collaboration-policy.json"
        assert collaboration.parse(installed.read_text()).digest == digest
        run_id = daemon.call("run", agent_id="project-supervisor", task="plan the launch",
                             script=json.dumps(SCRIPT))["run_id"]
        daemon.wait_until(lambda st: ledger_rows(daemon.home, "SELECT 1 FROM collaboration_bindings"),
                          what="the binding")
        # Editing the live file now changes nothing for the bound run.
        loosened = {**POLICY, "minStaticDelegates": 3, "orchestratorOnlyAfterDelegation": False}
        policy_file.write_text(json.dumps(loosened))
        assert cli(daemon.home, "collaboration", "set", str(policy_file)).returncode == 0
        shown = wait_run(daemon, run_id, {"completed", "failed", "waiting-for-join", "needs-input"}, timeout=60)
        refusals = [json.loads(e["data"]) for e in ledger_rows(
            daemon.home, "SELECT data FROM events WHERE kind = 'plan-invalid' AND subject = ? ORDER BY cursor",
            run_id)]
        # Seed 004 V1.33's category, and the rule that refused it.
        assert [(r["category"], r["rule"]) for r in refusals] == [("batch-constraint", "collaboration-policy")] * 2
        assert "a delegation to researcher" in refusals[0]["detail"] + refusals[1]["detail"]
        (binding,) = ledger_rows(daemon.home, "SELECT run_id, digest FROM collaboration_bindings")
        assert binding == {"run_id": run_id, "digest": digest}, "bound to the policy of its first valid wave"
        writes = [a for a in shown["actions"] if a["tool"] == "fs.write"]
        assert [a["phase"] for a in writes] == ["denied"] and "only orchestrates" in writes[0]["reason"]
        assert not (short_tmp / "project" / "notes.md").exists()
        shown_policy = json.loads(cli(daemon.home, "collaboration", "show", "--json").stdout)
        assert shown_policy["policy"]["minStaticDelegates"] == 3 and shown_policy["bindings"][0]["run_id"] == run_id
        bad = short_tmp / "bad.json"
        bad.write_text('{"minStaticDelegates": "two"}')
        refused = cli(daemon.home, "collaboration", "set", str(bad))
        assert refused.returncode != 0 and "minStaticDelegates" in refused.stderr
        assert collaboration.parse(installed.read_text()).minStaticDelegates == 3, "a bad policy changes nothing"
    finally:
        daemon.shutdown()

"""A supervisor sends back work that is done but wrong (seed 004 V1.28, V1.30).

A delegation's receipt may be ``evidence-ready`` (it finished, its artifacts exist,
its verification passed) and still miss the acceptance criteria: only the
supervisor judges those. So one repair (``repair_of``) is allowed on any delivery
the same parent run has claimed, whatever its status; never a second one, never a
repair of a repair, never of a delivery another parent claimed. The criteria are a
list of 1-8 items, carried to the specialist and into its result; a specialist can
run ``project.verify`` and its receipt names the real project revision it verified;
``agent.run_status(delegation_id=...)`` reads back one claimed delegation's contract.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from corral.actors.tools.fs import SOURCES_CHANGED
from corral.sandbox.bwrap import bwrap_available
from corral.supervisor.errors import BadRequest, Refused
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.project import revision_store, verification_store
from corral.supervisor.runs import action_store, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.spec.swarm_spec import SwarmSpec, parse_spec
from corral.supervisor.swarm import claim_store, delegation_store
from tests.harness import Daemon, ledger_rows, wait_run

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

# -- the ledger rules, without processes ---------------------------------------------

def _spec(root: Path, project: dict[str, Any] | None = None) -> SwarmSpec:
    """Two roots and a specialist, in a project of their own (never the repository:
    its .venv is corral's own code)."""
    return parse_spec({
        "project": {"root": str(root), **(project or {})},
        "agents": [
            {"id": "boss", "steps": [{"final": "x"}]},
            {"id": "other-boss", "steps": [{"final": "x"}]},
            {"id": "helper", "role": "specialist", "steps": [{"final": "x"}]},
        ],
    }, str(root / "spec.toml"))


@pytest.fixture
def spec(short_tmp: Path) -> SwarmSpec:
    return _spec(short_tmp)


CRITERIA = ["the notes name the launch date", "the notes list three risks"]


@pytest.fixture
def ledger(open_ledger: Any) -> Ledger:
    ledger: Ledger = open_ledger()
    ledger.begin_boot("b", 1, 1)
    return ledger


def _root(ledger: Ledger, agent_id: str = "boss") -> Any:
    run_id = run_store.create_run(ledger, NO_FEATURES,
                                  agent_id=agent_id, task="t", provider="scripted", provider_config={},
                                  options={"workspace": "/tmp"})
    run_store.set_run_status(ledger, run_id, run_store.RunStatus.RUNNING, NO_FEATURES)
    return run_store.get_run(ledger, run_id)


def _action(ledger: Ledger, run_id: str, index: int, tool: str) -> str:
    row = action_store.prepare_action(ledger, run_id, 0, index, tool, {"n": index}, NO_FEATURES,
                                      rerunnable=True, policy="auto")
    action_store.move_action(ledger, row["action_id"], ActionPhase.EXECUTING)
    return str(row["action_id"])


def _delegate(ledger: Ledger, spec: SwarmSpec, run: Any, index: int, **params: Any) -> dict[str, Any]:
    fields = {"agent_id": "helper", "task": f"write the notes ({index})", "acceptance_criteria": CRITERIA, **params}
    return delegation_store.delegate(ledger, spec, run, _action(ledger, run["run_id"], index, "agent.delegate"),
                                     fields, NO_FEATURES)


def _finish(ledger: Ledger, delegated: dict[str, Any], reply: str) -> str:
    """The specialist ran and replied: its receipt is delivered to the parent."""
    run_store.set_run_status(ledger, delegated["run_id"], run_store.RunStatus.RUNNING, NO_FEATURES)
    delivery = delegation_store.finish_delegation(ledger, delegated["run_id"], reply, None, NO_FEATURES)
    assert delivery is not None
    return delivery


def _claimed(ledger: Ledger, run: Any, index: int, delegated: dict[str, Any]) -> dict[str, Any]:
    delivery = _finish(ledger, delegated, "notes written")
    view = claim_store.claim(ledger, run["run_id"], _action(ledger, run["run_id"], index, "agent.run_status"),
                             [str(delivery)])
    return dict(view["claimed"][0])


@pytest.mark.parametrize(
    ("criteria", "says"),
    [
        ([], "1 to 8"),
        ([f"criterion {n}" for n in range(9)], "1 to 8"),
        ("one string", "a list"),
        (["same", "same"], "repeats"),
        (["ok", ""], "non-empty"),
        (["x" * 501], "500 characters"),
        ([7], "strings"),
    ],
)
def test_acceptance_criteria_are_a_list_of_one_to_eight(
    ledger: Ledger, spec: SwarmSpec, criteria: Any, says: str,
) -> None:
    run = _root(ledger)
    with pytest.raises(BadRequest, match="acceptance_criteria") as refused:
        _delegate(ledger, spec, run, 0, acceptance_criteria=criteria)
    assert says in str(refused.value)
    assert ledger.one("SELECT COUNT(*) FROM delegations")[0] == 0
    assert ledger.one("SELECT COUNT(*) FROM runs")[0] == 1, "bad input changes nothing"


def test_the_criteria_reach_the_specialist_and_its_result(ledger: Ledger, spec: SwarmSpec) -> None:
    run = _root(ledger)
    delegated = _delegate(ledger, spec, run, 0, expected_artifacts=[])
    task = run_store.get_run(ledger, delegated["run_id"])["task"]
    assert delegated["delegation_id"] in task and run["run_id"] in task
    assert all(criterion in task for criterion in CRITERIA)
    result = _claimed(ledger, run, 1, delegated)
    assert result["status"] == "evidence-ready"
    assert result["acceptance_criteria"] == CRITERIA
    assert result["verification_required"] is False and result["verified_revision"] is None


def test_one_repair_of_a_claimed_evidence_ready_delivery_by_its_own_parent_only(
    ledger: Ledger, spec: SwarmSpec,
) -> None:
    boss, other = _root(ledger), _root(ledger, "other-boss")
    original = _delegate(ledger, spec, boss, 0)
    _finish(ledger, original, "notes written")
    # Not claimed yet: the supervisor has not seen the work it would send back.
    with pytest.raises(Refused, match="not claimed"):
        _delegate(ledger, spec, boss, 1, repair_of=original["delegation_id"])
    view = claim_store.claim(ledger, boss["run_id"], _action(ledger, boss["run_id"], 2, "agent.run_status"), None)
    assert view["claimed"][0]["status"] == "evidence-ready"
    # Another parent may neither repair it nor read its contract.
    with pytest.raises(Refused, match="another parent run"):
        _delegate(ledger, spec, other, 0, repair_of=original["delegation_id"])
    with pytest.raises(Refused, match="another parent run"):
        delegation_store.contract(ledger, other["run_id"], original["delegation_id"])
    # A repair keeps the contract it repairs; the refusal carries that contract whole.
    with pytest.raises(Refused, match="inherits the contract") as changed:
        _delegate(ledger, spec, boss, 3, task="add the date", acceptance_criteria=["a date"],
                  repair_of=original["delegation_id"])
    assert json.dumps(CRITERIA) in str(changed.value)
    # Its own parent may send done-but-wrong work back, once.
    repair = _delegate(ledger, spec, boss, 7, task="add the launch date", repair_of=original["delegation_id"])
    row = ledger.one("SELECT * FROM delegations WHERE delegation_id = ?", repair["delegation_id"])
    assert row["repair_of"] == original["delegation_id"] and row["target_agent"] == "helper"
    with pytest.raises(Refused, match="already has its one repair"):
        _delegate(ledger, spec, boss, 4, task="once more", repair_of=original["delegation_id"])
    second = claim_store.claim(ledger, boss["run_id"], _action(ledger, boss["run_id"], 5, "agent.run_status"),
                               [_finish(ledger, repair, "fixed")])
    # Every claim lists the run's claimed contracts, one line each, to find the one to read or repair.
    assert second["claimed_delegate_contracts"] == [
        {"delegation_id": original["delegation_id"], "target_agent": "helper", "repair_of": None,
         "contract_status": "evidence-ready", "acceptance_criteria_count": 2, "expected_artifacts_count": 0},
        {"delegation_id": repair["delegation_id"], "target_agent": "helper", "repair_of": original["delegation_id"],
         "contract_status": "evidence-ready", "acceptance_criteria_count": 2, "expected_artifacts_count": 0},
    ]
    with pytest.raises(Refused, match="repair depth is 1"):
        _delegate(ledger, spec, boss, 6, task="and again", repair_of=repair["delegation_id"])
    assert ledger.one("SELECT COUNT(*) FROM delegations")[0] == 2
    # The contract read: the whole contract and the delivery, for the parent that claimed it.
    read = delegation_store.contract(ledger, boss["run_id"], original["delegation_id"])
    assert read["delegation_id"] == original["delegation_id"] and read["target_agent"] == "helper"
    assert read["acceptance_criteria"] == CRITERIA and read["repair_of"] is None
    assert read["delivery_status"] == "claimed-by-parent" and read["contract_status"] == "evidence-ready"
    assert read["terminal_status"] == "completed" and read["repaired_by"] == repair["delegation_id"]
    assert "task" not in read


def _wrote(ledger: Ledger, run_id: str, action_id: str) -> int:
    """The specialist's write committed: the receipt hook made the next revision."""
    row = {"action_id": action_id, "run_id": run_id, "tool": "fs.write",
           "result": json.dumps({"output": {SOURCES_CHANGED: True}})}
    with ledger.tx():
        revision_store.on_receipt(ledger, row)
    return revision_store.current(ledger)


def test_changed_sources_are_evidence_only_with_the_specialists_own_passed_verification(
    ledger: Ledger, short_tmp: Path,
) -> None:
    run, spec = _root(ledger), _spec(short_tmp, {"verify": [["true"]]})
    outcomes = []
    for index, verify in enumerate((False, True)):
        delegated = delegation_store.delegate(
            ledger, spec, run, _action(ledger, run["run_id"], index, "agent.delegate"),
            {"agent_id": "helper", "task": f"change the code ({index})", "acceptance_criteria": CRITERIA}, NO_FEATURES)
        revision = _wrote(ledger, delegated["run_id"], f"act-write-{index}")
        if verify:
            verification_store.record(ledger, delegated["run_id"], f"act-verify-{index}", revision=revision,
                                      fingerprint="f", passed=True, sources_changed=False, outputs=[])
        delivery = _finish(ledger, delegated, "changed")
        payload = json.loads(ledger.one("SELECT payload FROM deliveries WHERE delivery_id = ?", delivery)[0])
        outcomes.append((revision, payload))
    (_, unverified), (revision, verified) = outcomes
    assert unverified["status"] == "needs-repair" and unverified["verification_required"] is True
    assert unverified["verified_revision"] is None and "no passed project.verify" in unverified["error"]
    assert verified["status"] == "evidence-ready" and verified["verification_required"] is True
    assert verified["verified_revision"] == revision == 2 and verified["error"] is None


# -- a real swarm: the repair of an evidence-ready delivery (the audit's live check A) --

SANDBOX_TABLE = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'
VERIFY = "grep -q '^# Launch notes' out/notes.md"
FIXED = "# Launch notes\n\nLaunch: May 1.\nRisks: load, billing, docs.\n"
SWARM = f"""
[project]
root = "ws"
verify = [["sh", "-c", {json.dumps(VERIFY)}]]
{SANDBOX_TABLE}
[policy]
"fs.write" = "auto"
"project.verify" = "auto"

[[agents]]
id = "boss"
role = "root"
  [[agents.steps]]
  [[agents.steps.actions]]
  tool = "agent.delegate"
    [agents.steps.actions.input]
    agent_id = "maker"
    task = "Write the launch notes"
    acceptance_criteria = {json.dumps(CRITERIA)}
    expected_artifacts = ["out/notes.md"]
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{ delegation_id = "${{evidence-ready.delegation_id}}" }} }}]
  [[agents.steps]]
  [[agents.steps.actions]]
  tool = "agent.delegate"
    [agents.steps.actions.input]
    agent_id = "maker"
    task = "Repair: name the launch date"
    acceptance_criteria = {json.dumps(CRITERIA)}
    expected_artifacts = ["out/notes.md"]
    repair_of = "${{evidence-ready.delegation_id}}"
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  final = "The launch notes name the date and three risks."

[[agents]]
id = "maker"
role = "specialist"
write_scopes = ["out"]
  [[agents.steps]]
  unless_task = "Repair"
  actions = [{{ tool = "fs.write", input = {{ path = "out/notes.md", content = "# Launch notes\\n\\nSoon.\\n" }} }}]
  [[agents.steps]]
  unless_task = "Repair"
  actions = [{{ tool = "project.verify", input = {{}} }}]
  [[agents.steps]]
  unless_task = "Repair"
  final = "Notes written and verified."
  [[agents.steps]]
  when_task = "Repair"
  actions = [{{ tool = "fs.write", input = {{ path = "out/notes.md", content = {json.dumps(FIXED)} }} }}]
  [[agents.steps]]
  when_task = "Repair"
  actions = [{{ tool = "project.verify", input = {{}} }}]
  [[agents.steps]]
  when_task = "Repair"
  final = "Launch date and risks added, verified."
"""


def test_a_claimed_evidence_ready_delivery_is_sent_back_once_and_verified_on_the_real_revision(
    short_tmp: Path,
) -> None:
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(SWARM)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="boss", task="prepare the launch notes")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
        delegations = shown["swarm"]["delegations"]
        assert [d["repair_of"] for d in delegations] == [None, delegations[0]["delegation_id"]], delegations
        first, repair = (d["result"] for d in delegations)
        # Done and verified, yet wrong: evidence-ready, and still sent back.
        assert first["status"] == "evidence-ready" and repair["status"] == "evidence-ready"
        for delegation, result in zip(delegations, (first, repair), strict=True):
            assert result["acceptance_criteria"] == CRITERIA
            assert result["verification_required"] is True
            verified = ledger_rows(daemon.home, "SELECT revision FROM project_verifications WHERE run_id = ?"
                                   " AND status = 'passed'", delegation["run_id"])
            written = ledger_rows(daemon.home, "SELECT revision FROM project_revisions WHERE run_id = ?",
                                  delegation["run_id"])
            assert [v["revision"] for v in verified] == [w["revision"] for w in written] \
                == [result["verified_revision"]], (verified, written, result)
        assert first["verified_revision"] < repair["verified_revision"]
        task = ledger_rows(daemon.home, "SELECT task FROM runs WHERE run_id = ?", delegations[0]["run_id"])[0]
        assert all(c in task["task"] for c in CRITERIA) and delegations[0]["delegation_id"] in task["task"]
        # The targeted contract read returned that one delegation's contract and delivery.
        reads = [a for a in shown["actions"] if a["tool"] == "agent.run_status"]
        output = json.loads(ledger_rows(daemon.home, "SELECT result FROM actions WHERE action_id = ?",
                                        reads[1]["action_id"])[0]["result"])["output"]
        assert output["delegation_id"] == delegations[0]["delegation_id"]
        assert output["acceptance_criteria"] == CRITERIA and output["expected_artifacts"] == ["out/notes.md"]
        assert output["contract_status"] == "evidence-ready" and output["delivery_status"] == "claimed-by-parent"
        assert output["delivery"]["verified_revision"] == first["verified_revision"]
        assert [d["status"] for d in shown["swarm"]["deliveries"]] == ["claimed-by-parent"] * 2
        assert "May 1" in (short_tmp / "ws" / "out" / "notes.md").read_text()
        assert len(ledger_rows(daemon.home, "SELECT 1 FROM replies WHERE run_id = ?", run_id)) == 1
    finally:
        daemon.shutdown()

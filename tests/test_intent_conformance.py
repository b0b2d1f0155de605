"""Issue 35: corral and the reference guard (execution-fidelity-guard, seed 000)
exchange contracts and receipts. tests/intent/vectors.json restates upstream's own
test assertions and the seed's rules as data: canonical hashing (also recomputed by
Node), contract parsing, action classification and decisions. Each parsing vector
says what upstream does and, where corral deliberately differs, why
(``corral_differs``). Live receipts, snapshots and contract documents are checked
against upstream's schemas (tests/intent/upstream, vendored) and read by a Node
consumer written from those wire shapes (tests/intent/receipt_reader.mjs). The
seed's own examples are used verbatim (tests/intent/seed)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.supervisor.intent.intent_classify import host_action
from corral.supervisor.intent.intent_contract import ContractError, canonical_sha256, parse, validate
from corral.supervisor.intent.intent_guard import decide, with_paths
from corral.supervisor.intent.intent_scope import judge_action, scope_of
from tests.harness import cli, running, wait_run
from tests.intent.schemas import upstream_errors

HERE = Path(__file__).resolve().parent / "intent"
VECTORS: dict[str, Any] = json.loads((HERE / "vectors.json").read_text(encoding="utf-8"))
SEED_DOCUMENT = (HERE / "seed" / "provider-document.json").read_text(encoding="utf-8")
SEED_SNAPSHOT = (HERE / "seed" / "continuity-snapshot.json").read_text(encoding="utf-8")


def node() -> str:
    found = shutil.which("node")
    assert found is not None, "Node.js is needed for the cross-language checks (apt-get install nodejs); none on PATH"
    return found


# -- hashing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["hashing"], ids=lambda v: v["name"])
def test_the_canonical_hash_of_each_vector(vector: dict[str, Any]) -> None:
    assert canonical_sha256(vector["value"]) == vector["sha256"]


def test_node_computes_the_same_canonical_hashes() -> None:
    values = [vector["value"] for vector in VECTORS["hashing"]]
    done = subprocess.run([node(), str(HERE / "canonical_hash.mjs")], input=json.dumps(values), capture_output=True,
                          text=True, check=True, timeout=60)
    assert json.loads(done.stdout) == [vector["sha256"] for vector in VECTORS["hashing"]]


# -- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["parsing"], ids=lambda v: v["name"])
def test_each_parsing_vector(vector: dict[str, Any]) -> None:
    value = vector.get("document_text", vector.get("document"))
    expected = vector["corral"]
    # Upstream's verdict is the vector's unless corral says why it differs.
    assert (expected["status"] == vector["upstream"]) != ("corral_differs" in vector), vector["name"]
    if expected["status"] == "bound":
        contract = parse(copy.deepcopy(value))
        assert (contract.contract_ref, contract.contract_version) == (
            expected.get("contract_ref", contract.contract_ref), expected.get("contract_version",
                                                                              contract.contract_version))
        return
    with pytest.raises(ContractError) as caught:
        parse(copy.deepcopy(value))
    assert caught.value.code == expected["code"], str(caught.value)


def test_what_binds_in_corral_is_valid_by_upstreams_schemas() -> None:
    """Every vector corral binds as a provider document or a bare TaskContractLite
    also passes upstream's schemas (the flat shape, corral's own, excepted)."""
    for vector in VECTORS["parsing"]:
        value = vector.get("document")
        if vector["corral"]["status"] != "bound" or not isinstance(value, dict):
            continue
        if "envelope" in value:
            assert upstream_errors("provider-contract", value) == [], vector["name"]
        elif "objective" in value:
            assert upstream_errors("task-contract-lite", value) == [], vector["name"]


# -- classification and decisions ------------------------------------------------------------


@pytest.mark.parametrize("vector", VECTORS["classification"],
                         ids=lambda v: f"{v['tool_name']}:{v['command']}"[:80])
def test_each_classification_vector(vector: dict[str, Any]) -> None:
    action = host_action(vector["tool_name"], vector["command"])
    for tag in vector.get("includes", []):
        assert tag in action.tags, (vector["from"], action.tags)
    for tag in vector.get("excludes", []):
        assert tag not in action.tags, (vector["from"], action.tags)
    if "tags" in vector:
        assert list(action.tags) == vector["tags"]
    if "reversible" in vector:
        assert action.reversible is vector["reversible"]
    if "high_risk" in vector:
        assert action.high_risk is vector["high_risk"]


def _projection(rules: dict[str, list[str]]) -> dict[str, Any]:
    projection: dict[str, Any] = copy.deepcopy(VECTORS["contract"])
    for bucket, entries in rules.items():
        place = projection["must_and_must_not"] if bucket == "must_not" else projection["authorization"]
        place[bucket] = entries
    return projection


@pytest.mark.parametrize("vector", VECTORS["decisions"], ids=lambda v: f"{v['command'] or v['tool_name']}"[:80])
def test_each_decision_vector(vector: dict[str, Any]) -> None:
    projection = None if vector["rules"] is None else _projection(vector["rules"])
    decision = decide(projection, host_action(vector["tool_name"], vector["command"]))
    for field, expected in vector["expect"].items():
        got = getattr(decision, field)
        assert (list(got) if isinstance(got, tuple) else got) == expected, (field, vector["from"])


def test_a_word_in_scope_include_limits_nothing(tmp_path: Path) -> None:
    """The seed's ``include: ["workspace"]`` is plain language: writes and commands
    anywhere continue (corral only reads ``path:`` entries as paths)."""
    projection = json.loads(SEED_DOCUMENT)["projection"]
    scope = scope_of(projection)
    assert not scope.active
    for tool, tool_input in (("fs.write", {"path": "src/app.py", "content": ""}),
                             ("command.exec", {"program": "make", "cwd": "."})):
        action = host_action("Bash", "make") if tool == "command.exec" else host_action("write")
        verdicts = judge_action(scope, tmp_path, tmp_path / "home", tool, tool_input)
        assert with_paths(decide(projection, action), verdicts, action).decision == "continue"


# -- the seed's examples, verbatim -------------------------------------------------------------


def test_the_seeds_examples_verbatim() -> None:
    # The document is a template: its hash is a sentence and it names no evidence.
    with pytest.raises(ContractError) as caught:
        parse(SEED_DOCUMENT)
    assert caught.value.code == "schema"
    assert upstream_errors("provider-contract", json.loads(SEED_DOCUMENT)) != []
    # The snapshot is exactly the shape both sides accept (and corral's stricter
    # producer rule, unique items, holds for it too).
    snapshot = json.loads(SEED_SNAPSHOT)
    validate("continuity-snapshot", snapshot)
    assert upstream_errors("continuity-snapshot", snapshot) == []


# -- live: receipts, snapshots and contracts, read by upstream's schemas and by Node ------------

SPEC = """
name = "conformance"
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
[[agents]]
id = "writer"
  [[agents.steps]]
  final = "each run brings its own script"
"""


def _script(*steps: Any) -> str:
    return json.dumps({"steps": [{"final": s} if isinstance(s, str) else {"actions": s} for s in steps]})


def _act(tool: str, **tool_input: Any) -> dict[str, Any]:
    return {"tool": tool, "input": tool_input}


def test_live_records_are_read_by_upstreams_schemas_and_by_node(short_tmp: Path) -> None:
    node_path = node()
    (short_tmp / "ws").mkdir()
    seed = json.loads(SEED_DOCUMENT)
    seed["projection"]["completion_evidence"] = [{"requirement": "a note is written", "acceptable_sources": ["file"]}]
    seed["envelope"]["snapshot_sha256"] = canonical_sha256(seed["projection"])
    ruled = copy.deepcopy(VECTORS["contract"])
    ruled["authorization"].update(forbidden=["action:install_local"], requires_user=["tool:effect.record"])
    ruled["must_and_must_not"]["must_not"] = ["Do not publish anything"]
    lite = copy.deepcopy(VECTORS["contract"])
    with running(short_tmp / "home", SPEC) as daemon:
        def run(steps: str, intent: Any) -> str:
            run_id: str = daemon.call("run", agent_id="writer", task="t", script=steps, intent=intent)["run_id"]
            return run_id

        # The seed's document (hash computed, one requirement): its word scope limits nothing.
        seeded = run(_script([_act("fs.write", path="src/notes.md", content="n"),
                              _act("command.exec", program="sh", args=["-c", "echo hi > out.txt"])], "done"), seed)
        ruled_run = run(_script([_act("command.exec", program="pip", args=["install", "x"])],
                                [_act("effect.record", label="publish")],
                                [_act("command.exec", program="rm", args=["-f", "nothing"])], "done"), ruled)
        unbound = run(_script([_act("effect.record", label="publish")], "done"), '{"a": 1, "a": 2}')
        lite_run = run(_script([_act("fs.read", path="src/notes.md")], "done"), lite)
        assert wait_run(daemon, seeded, {"completed", "failed", "needs-input"})["run"]["status"] == "completed"
        assert (short_tmp / "ws" / "src" / "notes.md").read_bytes() == b"n"
        asked = wait_run(daemon, ruled_run, {"waiting-confirmation", "completed", "failed"})
        assert asked["run"]["status"] == "waiting-confirmation"
        pending = daemon.call("intent.receipts", run_id=ruled_run)["receipts"][-1]
        assert cli(daemon.home, "deny", pending["event_ref"]).returncode == 0
        for run_id in (ruled_run, unbound, lite_run):
            wait_run(daemon, run_id, {"completed", "failed", "needs-input"})
        receipts = [r for run_id in (seeded, ruled_run, unbound, lite_run)
                    for r in daemon.call("intent.receipts", run_id=run_id)["receipts"]]
        snapshots = [daemon.call("intent.snapshot", run_id=run_id) for run_id in (seeded, ruled_run, lite_run)]
        contracts = [daemon.call("intent.contract", run_id=run_id)["contract"] for run_id in (seeded, lite_run)]

    assert {r["decision"] for r in receipts} == {"continue", "block", "ask", "remind"}
    assert {r["authority"] for r in receipts} >= {"deterministic_rule", "semantic_candidate", "user"}
    for receipt in receipts:
        assert upstream_errors("decision-receipt", receipt) == [], receipt
        validate("decision-receipt", receipt)
    for snapshot in snapshots:
        assert upstream_errors("continuity-snapshot", snapshot) == [], snapshot
    assert contracts[0] == seed  # emitted as the seed sends it
    assert upstream_errors("provider-contract", contracts[0]) == []
    assert upstream_errors("task-contract-lite", contracts[1]) == []

    records = short_tmp / "records.json"
    records.write_text(json.dumps({"receipts": receipts, "snapshots": snapshots, "contracts": contracts}))
    done = subprocess.run([node_path, str(HERE / "receipt_reader.mjs"), str(records)], capture_output=True, text=True,
                          check=True, timeout=60)
    report = json.loads(done.stdout)
    assert report["errors"] == []
    assert report["read"] == {"receipts": len(receipts), "snapshots": 3, "contracts": 2}
    assert report["decisions"] == {d: sum(r["decision"] == d for r in receipts) for d in report["decisions"]}
    assert report["authorities"]["user"] == 1
    # Node derives the same identities: the provider's ref, and lite:<20 hex> of the bare contract.
    assert report["identities"] == [{"ref": "intent:stable-task-id", "version": 1},
                                    {"ref": f"lite:{canonical_sha256(lite)[:20]}", "version": 1}]

"""Intent contracts (issue 20): validation, identity and versions, the guard and
its decision receipts, completion evidence, updates, and the canonical hash
computed alike by Python and Node."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.supervisor.intent_contract import ContractError, canonical_sha256, parse, parse_json_strict, validate
from corral.supervisor.intent_guard import classify
from tests.harness import Daemon, cli, ledger_rows, running, wait_run

PROJECTION: dict[str, Any] = {
    "objective": "Write the launch page",
    "primary_object": "docs/launch.md",
    "delivery_surface": ["docs"],
    "scope": {"include": ["docs/"], "exclude": ["docs/private/"]},
    "must_and_must_not": {"must": ["keep the tone"], "must_not": ["exec"]},
    "authorization": {"allowed": ["fs.*"], "requires_user": ["effect.record"], "forbidden": ["agent.*"]},
    "completion_evidence": [{"requirement": "the page exists", "acceptable_sources": ["file"]}],
}


def envelope(projection: dict[str, Any] = PROJECTION, version: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "schema_version": "1.0",
        "contract_ref": "launch-page",
        "contract_version": version,
        "source": "user-intent-plugin",
        "source_message_refs": ["msg-1"],
        "snapshot_sha256": canonical_sha256(projection),
        "updated_at": "2026-12-04T10:00:00.123Z",
        "projection": projection,
        **extra,
    }


# -- the contract (pure) ---------------------------------------------------------------------


def test_both_forms_parse_and_a_bare_contract_gets_a_content_identity() -> None:
    bound = parse(envelope())
    assert (bound.contract_ref, bound.contract_version) == ("launch-page", 1)
    bare = parse(copy.deepcopy(PROJECTION))
    assert bare.contract_ref == f"tcl-{canonical_sha256(PROJECTION)[:16]}" and bare.contract_version == 1
    lite = envelope(source="task-contract-lite")
    lite["task_contract_lite"] = lite.pop("projection")
    assert parse(lite).snapshot_sha256 == bound.snapshot_sha256


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda e: e["projection"].__setitem__("colour", "blue"), "schema"),
        (lambda e: e["projection"].__setitem__("delivery_surface", []), "schema"),
        (lambda e: e["projection"].__setitem__("delivery_surface", ["a", "a"]), "schema"),
        (lambda e: e["projection"]["completion_evidence"][0].__setitem__("acceptable_sources", ["vibes"]), "schema"),
        (lambda e: e.__setitem__("snapshot_sha256", "0" * 64), "hash-mismatch"),
        (lambda e: e.__setitem__("updated_at", "2026-12-04T10:00:00Z"), "schema"),
        (lambda e: e.__setitem__("contract_version", 0), "schema"),
        (lambda e: e["projection"].__setitem__("objective", 1.5), "unsafe-number"),
        (lambda e: e.__setitem__("contract_version", 2**53), "unsafe-number"),
    ],
)
def test_a_contract_that_breaks_a_rule_is_refused_with_the_rule(mutate: Any, code: str) -> None:
    value = copy.deepcopy(envelope())
    mutate(value)
    with pytest.raises(ContractError) as caught:
        parse(value)
    assert caught.value.code == code


def test_strict_json_refuses_duplicate_keys() -> None:
    with pytest.raises(ContractError, match="duplicate key"):
        parse_json_strict('{"objective": "a", "objective": "b"}')


def test_the_guard_classifies_by_class_scope_and_authorization() -> None:
    def decide(tool: str, **tool_input: Any) -> str:
        return classify(PROJECTION, tool, tool_input).decision

    assert decide("fs.write", path="docs/launch.md", content="x") == "continue"
    assert decide("fs.write", path="src/app.py", content="x") == "block"
    assert decide("fs.read", path="src/app.py") == "continue"  # a read is not a write out of scope
    assert decide("fs.read", path="docs/private/notes.md") == "block"  # excluded for every access
    assert decide("command.exec", argv=["ls"]) == "block"  # must_not: exec
    assert decide("agent.delegate", agent_id="x", task="y") == "block"  # forbidden
    assert decide("effect.record", label="x") == "ask"
    reasons = classify(PROJECTION, "fs.write", {"path": "src/x", "content": ""})
    assert reasons.reason_codes == ("out-of-scope",) and reasons.rule_ids == ("scope.include",)


VECTORS: list[Any] = [
    {"b": 1, "a": [3, 2, 1], "c": {"z": True, "y": None}},
    {"é": "naïve café", "emoji": "\U0001f600", "esc": "line\nbreak \"quoted\" \\ /", "ctl": "\u0001"},
    {"edge": 9007199254740991, "neg": -9007199254740991, "zero": 0},
    {"nest": [[{"b": [1, {"d": 4, "c": 3}]}], [], {}]},
    {"\u00e9": 1, "e\u0301": 2, "\U0001d11e": 3, "z": 4, "A": 5},
    {"text": "\u2028\u2029 tab\t end", "empty": ""},
]

NODE_JCS = r"""
const crypto = require("crypto");
function jcs(v) {
  if (v === null || typeof v !== "object") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(jcs).join(",") + "]";
  const keys = Object.keys(v).sort();
  return "{" + keys.map(k => JSON.stringify(k) + ":" + jcs(v[k])).join(",") + "}";
}
const vectors = JSON.parse(require("fs").readFileSync(0, "utf8"));
console.log(JSON.stringify(vectors.map(v => crypto.createHash("sha256").update(jcs(v), "utf8").digest("hex"))));
"""


def test_python_and_node_compute_the_same_canonical_hashes() -> None:
    node = shutil.which("node")
    assert node is not None, "Node is needed for the cross-language check (apt-get install nodejs)"
    result = subprocess.run(
        [node, "-e", NODE_JCS], input=json.dumps(VECTORS), capture_output=True, text=True, check=True, timeout=30
    )
    assert json.loads(result.stdout) == [canonical_sha256(vector) for vector in VECTORS]


def test_the_wire_schemas_check_receipts_and_snapshots() -> None:
    with pytest.raises(ContractError):
        validate("decision-receipt", {"receipt_id": "r", "extra": 1})
    with pytest.raises(ContractError):
        validate("continuity-snapshot", {"schema_version": "1.0"})


# -- in a swarm ---------------------------------------------------------------------------------

SPEC = """
name = "intent"
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
[[agents]]
id = "writer"
  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "src/app.md", content = "out of scope" } }]
  [[agents.steps]]
  actions = [{ tool = "effect.record", input = { label = "publish" } }]
  [[agents.steps]]
  final = "done, trust me"
  [[agents.steps]]
  actions = [{ tool = "fs.write", input = { path = "docs/launch.md", content = "# Launch" } }]
  [[agents.steps]]
  final = "done, with the page"
"""


def _contract_file(tmp: Path, value: Any) -> str:
    path = tmp / f"contract-{len(list(tmp.glob('contract-*')))}.json"
    path.write_text(json.dumps(value))
    return str(path)


def _start(daemon: Daemon, tmp: Path, value: Any) -> str:
    contract = _contract_file(tmp, value)
    result = cli(daemon.home, "run", "--agent", "writer", "--task", "launch page", "--intent", contract)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def _receipts(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    result = cli(daemon.home, "intent", "receipts", run_id, "--json")
    assert result.returncode == 0, result.stderr
    receipts: list[dict[str, Any]] = json.loads(result.stdout)["receipts"]
    return receipts


def test_a_bound_run_is_guarded_asks_the_user_and_finishes_only_with_evidence(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", SPEC) as daemon:
        run_id = _start(daemon, short_tmp, envelope())
        shown = wait_run(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
        assert shown["run"]["status"] == "waiting-confirmation"
        denied = shown["actions"][0]
        assert denied["tool"] == "fs.write" and denied["phase"] == "denied"
        assert "outside the intent contract's scope" in denied["error"]
        assert not (short_tmp / "ws" / "src" / "app.md").exists()
        # A SIGKILL of the supervisor keeps the binding and every receipt.
        before = _receipts(daemon, run_id)
        daemon.kill_supervisor()
        daemon.up()
        assert _receipts(daemon, run_id) == before
        assert cli(daemon.home, "approve", shown["actions"][1]["action_id"]).returncode == 0
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input"})
        assert shown["run"]["status"] == "completed", shown["run"]
        assert shown["final_reply"] == "done, with the page"  # "trust me" was refused: no evidence yet
        receipts = _receipts(daemon, run_id)
        decisions = [(r["decision"], r["authority"], r["reason_codes"][0]) for r in receipts]
        assert decisions == [
            ("block", "deterministic_rule", "out-of-scope"),
            ("ask", "deterministic_rule", "requires-user"),
            ("continue", "user", "user-approved"),
            ("continue", "deterministic_rule", "allowed"),
        ]
        for receipt in receipts:
            validate("decision-receipt", receipt)
        snapshot = json.loads(cli(daemon.home, "intent", "snapshot", run_id, "--json").stdout)
        validate("continuity-snapshot", snapshot)
        page = next(a for a in shown["actions"] if a["tool"] == "fs.write" and a["phase"] == "ok")
        assert snapshot["open_commitments"] == [] and snapshot["evidence_refs"] == [page["action_id"]]
        assert "bound to launch-page v1" in cli(daemon.home, "show", run_id).stdout


FINAL_ONLY = """
name = "evidence"
[project]
root = "ws"
[[agents]]
id = "writer"
  [[agents.steps]]
  final = "done"
  [[agents.steps]]
  final = "really done"
"""


def test_missing_evidence_parks_the_run_and_an_update_rebinds_it(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", FINAL_ONLY) as daemon:
        run_id = _start(daemon, short_tmp, envelope())
        shown = wait_run(daemon, run_id, {"needs-input", "completed", "failed"})
        assert shown["run"]["status"] == "needs-input"
        assert shown["final_reply"] is None
        assert "completion evidence missing" in cli(daemon.home, "pending").stdout
        same = cli(daemon.home, "intent", "update", run_id, "--file", _contract_file(short_tmp, envelope()))
        assert same.returncode != 0 and "not above the bound v1" in same.stderr
        changed = copy.deepcopy(PROJECTION)
        changed["objective"] = "something else"
        collision = envelope(changed)
        clash = cli(daemon.home, "intent", "update", run_id, "--file", _contract_file(short_tmp, collision))
        assert clash.returncode != 0
        v2 = envelope(changed, version=2)
        assert cli(daemon.home, "intent", "update", run_id, "--file", _contract_file(short_tmp, v2)).returncode == 0
        wait_run(daemon, run_id, {"needs-input", "completed", "failed"})
        rebound = [e for e in daemon.events() if e["kind"] == "intent-rebound" and e["subject"] == run_id]
        assert rebound and rebound[0]["data"]["version"] == 2
        back = cli(daemon.home, "intent", "update", run_id, "--file", _contract_file(short_tmp, envelope(version=1)))
        assert back.returncode != 0


def test_a_tampered_or_invalid_contract_leaves_the_run_unbound_and_working(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "home", FINAL_ONLY) as daemon:
        tampered = envelope()
        tampered["snapshot_sha256"] = "f" * 64
        extra = copy.deepcopy(PROJECTION)
        extra["colour"] = "blue"
        for value, code in ((tampered, "hash-mismatch"), (extra, "schema")):
            run_id = _start(daemon, short_tmp, value)
            shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input"})
            assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"
            assert shown["intent"]["status"] == "unbound" and shown["intent"]["reason"].startswith(code)
            assert _receipts(daemon, run_id) == []
        assert ledger_rows(daemon.home, "SELECT * FROM intent_contracts") == []
        bad = cli(daemon.home, "run", "--agent", "writer", "--task", "t", "--intent", "/nonexistent.json")
        assert bad.returncode == 2

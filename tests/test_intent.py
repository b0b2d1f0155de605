"""Intent contracts (issues 20 and 35), live: the seed's document binds a run, the
guard decides in the reference guard's rule language and writes its receipts,
versions never go backwards, a contract that cannot bind leaves the run unbound
and advisory whatever the fault, completion evidence is what the runtime ran
(exit status included), and the continuity snapshot holds verified facts only.
The pure rules are pinned by tests/test_intent_conformance.py."""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.sandbox.bwrap import bwrap_available
from corral.supervisor.intent.intent_contract import canonical_sha256, validate
from corral.supervisor.intent.intent_guard import requirement_ref, sha16
from tests.harness import Daemon, cli, ledger_rows, running, wait_run
from tests.intent.schemas import upstream_errors

PROJECTION: dict[str, Any] = {
    "objective": "Write the launch page",
    "primary_object": "docs/launch.md",
    "delivery_surface": ["docs"],
    "scope": {"include": ["path:docs/**"], "exclude": []},
    "must_and_must_not": {"must": ["keep the tone"],
                          "must_not": ["command-prefix:git push", "Do not publish anything"]},
    "authorization": {"allowed": ["action:write"], "requires_user": ["tool:effect.record"],
                      "forbidden": ["action:install_local"]},
    "completion_evidence": [{"requirement": "the page exists", "acceptable_sources": ["file"]}],
}


def document(projection: dict[str, Any] = PROJECTION, version: int = 1,
             ref: str = "intent:launch-page") -> dict[str, Any]:
    """A contract as seed 000 sends it."""
    return {
        "envelope": {
            "schema_version": "1.0",
            "contract_ref": ref,
            "contract_version": version,
            "source": "user-intent-plugin",
            "source_message_refs": ["msg:1"],
            "snapshot_sha256": canonical_sha256(projection),
            "updated_at": "2026-12-04T10:00:00Z",  # no milliseconds: still a date-time
        },
        "projection": projection,
    }


SANDBOX = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'
SPEC = f"""
name = "intent"
[project]
root = "ws"
{SANDBOX}
[chaos]
effects_file = "effects.log"
[[agents]]
id = "writer"
  [[agents.steps]]
  final = "each run brings its own script"
"""


def _project(top: Path) -> None:
    (top / "ws" / "docs").mkdir(parents=True)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    """One supervisor for the tests that do not restart it (starting one is most of a test's time)."""
    top = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    try:
        _project(top)
        with running(top / "home", SPEC) as running_daemon:
            yield running_daemon
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def own_daemon(short_tmp: Path) -> Iterator[Daemon]:
    """A supervisor of the test's own, which it may kill and restart."""
    _project(short_tmp)
    with running(short_tmp / "home", SPEC) as running_daemon:
        yield running_daemon


def ws(daemon: Daemon) -> Path:
    return daemon.home.parent / "ws"


def act(tool: str, **tool_input: Any) -> dict[str, Any]:
    return {"tool": tool, "input": tool_input}


def script(*steps: Any) -> str:
    """Steps: a list of actions, or a final reply (a string)."""
    return json.dumps({"steps": [{"final": s} if isinstance(s, str) else {"actions": s} for s in steps]})


def start(daemon: Daemon, steps: str, contract: Any) -> str:
    run_id: str = daemon.call("run", agent_id="writer", task="launch page", script=steps, intent=contract)["run_id"]
    return run_id


def receipts(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = daemon.call("intent.receipts", run_id=run_id)["receipts"]
    for receipt in found:
        validate("decision-receipt", receipt)
        assert upstream_errors("decision-receipt", receipt) == [], receipt
    return found


def actions_of(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(daemon.home, "SELECT action_id, tool, phase FROM actions WHERE run_id = ?"
                       " ORDER BY loop_index, action_index", run_id)


def test_a_bound_run_is_judged_in_the_reference_guards_terms(own_daemon: Daemon) -> None:
    daemon = own_daemon
    run_id = start(daemon, script(
        [act("command.exec", program="pip", args=["install", "requests"])],
        [act("effect.record", label="publish")],
        [act("fs.write", path="docs/launch.md", content="# Launch\n")],
        [act("command.exec", program="rm", args=["-f", "docs/nothing.md"])],
        "the page is written",
    ), document())
    shown = wait_run(daemon, run_id, {"waiting-confirmation", "completed", "failed"})
    assert shown["run"]["status"] == "waiting-confirmation"
    # A SIGKILL of the supervisor keeps the binding and every receipt.
    before = receipts(daemon, run_id)
    daemon.kill_supervisor()
    daemon.up()
    assert receipts(daemon, run_id) == before
    asked = actions_of(daemon, run_id)[1]
    assert cli(daemon.home, "approve", asked["action_id"]).returncode == 0
    shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input"})
    assert shown["run"]["status"] == "completed", shown["run"]
    assert (ws(daemon) / "docs" / "launch.md").read_bytes() == b"# Launch\n"
    found = receipts(daemon, run_id)
    assert [(r["decision"], r["authority"], r["reason_codes"], r["rule_ids"]) for r in found] == [
        ("block", "deterministic_rule", ["explicit_contract_conflict"], [f"forbidden:{sha16('action:install_local')}"]),
        ("ask", "deterministic_rule", ["explicit_user_authorization_required"],
         [f"requires_user:{sha16('tool:effect.record')}"]),
        ("continue", "user", ["user_approved"], [f"requires_user:{sha16('tool:effect.record')}"]),
        ("continue", "deterministic_rule", ["explicit_contract_allowance", "path_in_scope"], []),
        ("remind", "semantic_candidate", ["semantic_constraint_candidate", "no_deterministic_match", "path_in_scope"],
         []),
    ]
    assert {(r["schema_version"], r["contract_ref"], r["contract_version"]) for r in found} == {
        ("1.0", "intent:launch-page", 1)}
    phases = [a["phase"] for a in actions_of(daemon, run_id)]
    assert phases == ["denied", "ok", "ok", "ok"]  # the reminder is advice: the command ran
    shown_text = cli(daemon.home, "show", run_id).stdout
    assert "bound to intent:launch-page v1 (5 decision receipts)" in shown_text
    # The contract comes back out as the seed sends it.
    emitted = json.loads(cli(daemon.home, "intent", "contract", run_id).stdout)
    assert emitted == document()


def test_completion_evidence_is_what_the_runtime_ran_with_its_exit_status(daemon: Daemon) -> None:
    assert shutil.which("node"), "node is needed: the test runs `node --test` as the suite (apt-get install nodejs)"
    (ws(daemon) / "fails.test.mjs").write_text("import t from 'node:test'; t('x', () => { throw new Error('no'); });\n")
    (ws(daemon) / "passes.test.mjs").write_text("import t from 'node:test'; t('x', () => {});\n")
    projection = copy.deepcopy(PROJECTION)
    projection.update(scope={"include": ["workspace"], "exclude": []},
                      must_and_must_not={"must": [], "must_not": []},
                      authorization={"allowed": [], "requires_user": [], "forbidden": []},
                      completion_evidence=[{"requirement": "the suite passes", "acceptable_sources": ["test"]}])
    run_id = start(daemon, script(
        [act("command.exec", program="node", args=["--test", "passes.test.mjs"])],
        [act("command.exec", program="node", args=["--test", "fails.test.mjs"])],
        "the tests pass",  # refused: the latest run of the suite failed
        [act("command.exec", program="node", args=["--test", "--test-reporter=dot", "passes.test.mjs"])],
        "the tests pass now",
    ), document(projection, ref="intent:tests"))
    shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input"})
    assert shown["run"]["status"] == "completed", shown["run"]
    assert shown["final_reply"] == "the tests pass now"
    ran = actions_of(daemon, run_id)
    assert [a["phase"] for a in ran] == ["ok", "failed", "ok"]
    snapshot = daemon.call("intent.snapshot", run_id=run_id)
    validate("continuity-snapshot", snapshot)
    assert upstream_errors("continuity-snapshot", snapshot) == []
    assert (snapshot["phase"], snapshot["open_commitments"], snapshot["evidence_refs"]) == (
        "delivered", [], [ran[2]["action_id"]])


FINAL_ONLY = script("done", "really done")


def test_versions_never_go_backwards_whatever_the_path(daemon: Daemon) -> None:
    changed = copy.deepcopy(PROJECTION)
    changed["objective"] = "Write the launch page, in French"
    v2 = document(changed, version=2, ref="intent:upd")
    run_id = start(daemon, FINAL_ONLY, v2)
    shown = wait_run(daemon, run_id, {"needs-input", "completed", "failed"})
    assert shown["run"]["status"] == "needs-input" and shown["intent"]["contract_version"] == 2
    # The open commitment is the unmet requirement's stable id; nothing is verified yet.
    snapshot = daemon.call("intent.snapshot", run_id=run_id)
    assert upstream_errors("continuity-snapshot", snapshot) == []
    requirement = PROJECTION["completion_evidence"][0]["requirement"]
    assert (snapshot["phase"], snapshot["open_commitments"]) == ("unknown", [requirement_ref(0, requirement)])

    def update(contract: Any) -> Any:
        path = ws(daemon).parent / f"update-{len(list(ws(daemon).parent.glob('update-*')))}.json"
        path.write_text(json.dumps(contract))
        return cli(daemon.home, "intent", "update", run_id, "--file", str(path))

    assert update(document(ref="intent:other")).returncode == 0  # a hop to another ref
    back = update(document(ref="intent:upd"))  # and back to upd v1, below v2
    assert back.returncode != 0 and "version-backwards" in back.stderr
    # A new run cannot bind v1 either, while v2 exists: it starts unbound, and says why.
    late = start(daemon, FINAL_ONLY, document(ref="intent:upd"))
    late_shown = wait_run(daemon, late, {"completed", "failed", "needs-input"})
    assert late_shown["intent"]["status"] == "unbound"
    assert late_shown["intent"]["reason"].startswith("version-backwards")
    # v2 again (the same projection) binds.
    again = start(daemon, FINAL_ONLY, v2)
    assert wait_run(daemon, again, {"needs-input", "completed", "failed"})["intent"]["status"] == "bound"
    rows = ledger_rows(daemon.home, "SELECT contract_version FROM intent_contracts WHERE contract_ref = 'intent:upd'")
    assert [row["contract_version"] for row in rows] == [2]


RISKY = script([act("effect.record", label="publish")], "done")


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (json.dumps(document()).replace('"contract_version": 1', '"contract_version": 9007199254740993'),
         "unsafe-number"),
        (json.dumps(document()).replace(canonical_sha256(PROJECTION), "f" * 64), "hash-mismatch"),
        (json.dumps({**document()["envelope"], "source": "task-contract-lite", "task_contract_lite": PROJECTION}),
         "fallback-envelope"),
    ],
    ids=["unsafe-integer", "tampered", "fallback-envelope"],
)
def test_a_contract_that_cannot_bind_leaves_the_run_unbound_and_advisory(daemon: Daemon, text: str,
                                                                          code: str) -> None:
    contract = ws(daemon).parent / f"contract-{code}.json"
    contract.write_text(text)
    steps = ws(daemon).parent / "risky.json"
    steps.write_text(RISKY)
    started = cli(daemon.home, "run", "--agent", "writer", "--task", "t", "--intent", str(contract),
                  "--script", str(steps))
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert started.stdout == f"{run_id}\n" and run_id.startswith("run-"), started.stdout
    # The person who asked for a guard hears at once that there is none (stderr: stdout stays the run id).
    (warned,) = [line for line in started.stderr.splitlines() if line.startswith("corral run: intent warning: ")]
    assert f"did not bind ({code}:" in warned and "advisory for this run" in warned, started.stderr
    shown = wait_run(daemon, run_id, {"completed", "failed", "needs-input"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"
    assert shown["intent"]["status"] == "unbound" and shown["intent"]["reason"].startswith(code)
    assert f"intent: unbound ({code}" in cli(daemon.home, "show", run_id).stdout
    # The risky action ran, with an advisory reminder on record.
    (receipt,) = receipts(daemon, run_id)
    assert (receipt["decision"], receipt["contract_ref"], receipt["reason_codes"], receipt["coverage"]) == (
        "remind", "unbound", ["contract_unbound", "high_risk_action_uncovered"], "partial")
    assert [a["phase"] for a in actions_of(daemon, run_id)] == ["ok"]


def test_an_unbound_contract_is_warned_of_with_json_output_too(daemon: Daemon) -> None:
    """``--json`` keeps stdout the JSON; the warning still reaches stderr."""
    contract = ws(daemon).parent / "contract-tampered-json.json"
    contract.write_text(json.dumps(document()).replace(canonical_sha256(PROJECTION), "e" * 64))
    steps = ws(daemon).parent / "final-only-json.json"
    steps.write_text(FINAL_ONLY)
    started = cli(daemon.home, "run", "--agent", "writer", "--task", "t", "--intent", str(contract),
                  "--script", str(steps), "--json")
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    assert "intent warning: the contract did not bind (hash-mismatch:" in started.stderr, started.stderr
    wait_run(daemon, run_id, {"completed", "failed", "needs-input"})


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('{"objective": "a", "objective": "b"}', "duplicate-key"),
        ("{not json", "bad-json"),
        ('{"objective": ' + "[" * 50_000 + "]" * 50_000 + "}", "too-deep"),
    ],
    ids=["duplicate-key", "not-json", "nested-50000"],
)
def test_a_contract_that_cannot_be_parsed_is_refused_and_no_run_starts(daemon: Daemon, text: str,
                                                                        code: str) -> None:
    """Text the strict JSON reader refuses is bad input: ``corral run`` exits 2 naming
    why, and no run starts (the supervisor never sees it)."""
    contract = ws(daemon).parent / f"contract-unparsed-{code}.json"
    contract.write_text(text)
    before = ledger_rows(daemon.home, "SELECT count(*) AS n FROM runs")[0]["n"]
    refused = cli(daemon.home, "run", "--agent", "writer", "--task", "t", "--intent", str(contract))
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stdout == "" and "Traceback" not in refused.stderr
    assert f"intent contract {contract}: {code}:" in refused.stderr and "no run was started" in refused.stderr
    assert ledger_rows(daemon.home, "SELECT count(*) AS n FROM runs")[0]["n"] == before


def test_a_missing_contract_file_is_a_usage_error(daemon: Daemon) -> None:
    bad = cli(daemon.home, "run", "--agent", "writer", "--task", "t", "--intent", "/nonexistent.json")
    assert bad.returncode == 2 and "intent contract" in bad.stderr


def test_a_scope_entry_that_looks_like_a_path_but_lacks_path_is_warned_of(daemon: Daemon) -> None:
    """Issue 48, D.15: ``exclude: ["src/**"]`` is a plain-language note and protects
    nothing. Binding it says so, with the ``path:`` spelling that would be enforced:
    in ``corral run --intent``'s output (stderr: stdout stays the run id), in
    ``corral show`` (kept with the run's binding) and in ``intent update``'s. Real
    notes and real path rules get no warning."""
    noted = copy.deepcopy(PROJECTION)
    noted["scope"] = {"include": ["path:docs/**", "the launch page"],
                      "exclude": ["src/**", "docs/private", "the marketing copy", "path:docs/drafts"]}
    contract = ws(daemon).parent / "contract-noted.json"
    contract.write_text(json.dumps(document(noted, ref="intent:noted")))
    steps = ws(daemon).parent / "final-only.json"
    steps.write_text(FINAL_ONLY)
    started = cli(daemon.home, "run", "--agent", "writer", "--task", "t", "--intent", str(contract),
                  "--script", str(steps))
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert run_id.startswith("run-"), started.stdout
    expected = [
        'scope.exclude[0] "src/**" looks like a path but is read as a plain-language note and limits nothing;'
        ' write "path:src/**" to enforce it',
        'scope.exclude[1] "docs/private" looks like a path but is read as a plain-language note and limits'
        ' nothing; write "path:docs/private" to enforce it',
    ]
    warned = [line.removeprefix("corral run: intent warning: ") for line in started.stderr.splitlines()
              if line.startswith("corral run: intent warning: ")]
    assert warned == expected, started.stderr
    shown = wait_run(daemon, run_id, {"needs-input", "completed", "failed"})
    assert shown["intent"]["status"] == "bound" and shown["intent"]["scope_warnings"] == expected
    text = cli(daemon.home, "show", run_id).stdout
    assert [line.strip().removeprefix("intent warning: ") for line in text.splitlines()
            if line.strip().startswith("intent warning: ")] == expected, text
    # A rebinding warns too, and the run keeps the new contract's warnings.
    fixed = copy.deepcopy(noted)
    fixed["scope"]["exclude"] = ["path:src/**", "docs/private"]
    path = ws(daemon).parent / "contract-noted-2.json"
    path.write_text(json.dumps(document(fixed, version=2, ref="intent:noted")))
    updated = cli(daemon.home, "intent", "update", run_id, "--file", str(path))
    assert updated.returncode == 0, updated.stderr
    assert '"docs/private" looks like a path' in updated.stdout and '"src/**"' not in updated.stdout
    # A contract of path rules and notes only is bound without a word.
    clean = cli(daemon.home, "run", "--agent", "writer", "--task", "t", "--intent",
                str(_written(ws(daemon).parent / "contract-clean.json", document())), "--script", str(steps))
    assert clean.returncode == 0 and "warning" not in clean.stderr, clean.stderr
    clean_shown = wait_run(daemon, clean.stdout.strip(), {"needs-input", "completed", "failed"})
    assert "scope_warnings" not in clean_shown["intent"]
    assert "intent warning" not in cli(daemon.home, "show", clean.stdout.strip()).stdout


def _written(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value))
    return path


def test_the_path_spelling_suggested_is_one_the_contract_accepts() -> None:
    """The pure rule behind the warnings: what looks like a path, and the ``path:``
    rule offered (which must itself parse), or why none is."""
    from corral.supervisor.intent.intent_scope import parse_rule, path_like_notes

    scope = {"include": ["workspace", "the docs", "path:docs/**", "./src/", "lib/*.py"],
             "exclude": [".env", "secrets.txt", "/etc/passwd", "../up", "*.key", "docs//a/"]}
    notes = path_like_notes({"scope": scope})
    offered = {note.split(" ")[0]: note.split("write ")[1].split(" ")[0].strip('"') if "write " in note else None
               for note in notes}
    assert offered == {"scope.include[3]": "path:src", "scope.include[4]": "path:lib/**",
                       "scope.exclude[0]": "path:.env", "scope.exclude[1]": "path:secrets.txt",
                       "scope.exclude[2]": None, "scope.exclude[3]": None, "scope.exclude[4]": None,
                       "scope.exclude[5]": "path:docs/a"}
    for rule in filter(None, offered.values()):
        assert parse_rule(rule) is not None
    assert "covers all of lib" in notes[1] and "relative to the workspace" in notes[4]
    many = path_like_notes({"scope": {"include": [], "exclude": [f"d{i}/x" for i in range(50)]}})
    assert len(many) == 20 and many[-1] == "... and 31 more scope entries like these"

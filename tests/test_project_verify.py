"""The project revision and ``project.verify`` (seed 004 V1.2, V1.3, V1.12), with real
processes: every committed write makes a revision, a verification is bound to one,
and a final reply of a run that changed sources needs a passed verification on the
current revision. One home, two boots: the first dies at ``verify.after-record``
(nothing lost, nothing done twice), the second runs the other flows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.actors.tools.fs import SOURCES_CHANGED
from corral.sandbox.bwrap import bwrap_available
from corral.supervisor.project import revision_store, verification_store
from corral.supervisor.project.project_service import project_settings
from corral.supervisor.runs import run_store
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.spec.spec_base import SpecError
from corral.supervisor.spec.spec_resolve import parse
from tests.harness import Daemon, ledger_rows, wait_run, wait_supervisor_gone

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

#: The sandbox of this host: the real one when bubblewrap works here, else the
#: explicitly allowed unsandboxed mode (the fail-closed path is tested in test_process_sessions.py).
SANDBOX_TABLE = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'
#: Fails unless app.py says "good"; removes ``stamp`` (a verify command that changes a source).
VERIFY = "grep -q good app.py || { echo 'app.py is not good' >&2; exit 1; }; rm -f stamp"


def _write(content: str, path: str = "app.py") -> str:
    return f'{{ tool = "fs.write", input = {{ path = "{path}", content = "{content}" }} }}'


def _steps(task: str, *steps: str) -> str:
    return "".join(f'[[agents.steps]]\nwhen_task = "{task}"\n{step}\n' for step in steps)


VERIFY_STEP = 'actions = [{ tool = "project.verify", input = {} }]'
EDIT_BY_COMMAND = \
    'actions = [{ tool = "command.exec", input = { program = "sh", args = ["-c", "echo bad > app.py"] } }]'

STEPS = (
    _steps("crash", f"actions = [{_write('good')}]", VERIFY_STEP, 'final = "done"')
    + _steps("edit", f"actions = [{_write('good one')}]", VERIFY_STEP, f"actions = [{_write('good two')}]",
             'final = "too early"', VERIFY_STEP, 'final = "done"')
    + _steps("command", f"actions = [{_write('good')}]", VERIFY_STEP, EDIT_BY_COMMAND, 'final = "too early"',
             VERIFY_STEP, f"actions = [{_write('good again')}, {_write('x', 'stamp')}]", VERIFY_STEP, VERIFY_STEP,
             'final = "done"')
)

SPEC = f"""
[project]
root = "ws"
verify = [["sh", "-c", {json.dumps(VERIFY)}]]
{SANDBOX_TABLE}
[policy]
"fs.write" = "auto"
"command.exec" = "auto"
"project.verify" = "auto"
[[agents]]
id = "writer"
{STEPS}
"""


def _verifications(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(daemon.home, "SELECT * FROM project_verifications WHERE run_id = ? ORDER BY created_at",
                       run_id)


def _revisions(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(daemon.home, "SELECT * FROM project_revisions WHERE run_id = ? ORDER BY revision", run_id)


def _blocked(daemon: Daemon, run_id: str) -> list[str]:
    rows = ledger_rows(daemon.home, "SELECT data FROM events WHERE kind = 'final-blocked' AND subject = ?", run_id)
    return [json.loads(row["data"])["detail"] for row in rows]


def test_verify_settings_come_from_the_spec() -> None:
    assert not project_settings({}).verification_required
    assert project_settings({"project": {"verify": [["pytest", "-q"]]}}).verification_required
    assert not project_settings({"project": {"verify": [["pytest"]], "require_verification": False}}) \
        .verification_required
    for bad, says in (({"require_verification": True}, "needs verify commands"), ({"verify": "pytest -q"}, "list"),
                      ({"verify": [[]]}, "empty")):
        try:
            parse({"project": bad}, "<embedded>")
        except SpecError as exc:
            assert says in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")


def _receipt(ledger: Any, run_id: str, action_id: str, tool: str, output: dict[str, Any]) -> None:
    """What the receipt hook is given: the action's row as the receipt sees it."""
    row = {"action_id": action_id, "run_id": run_id, "tool": tool, "result": json.dumps({"output": output})}
    with ledger.tx():
        revision_store.on_receipt(ledger, row)


def test_revisions_and_verifications_in_the_ledger(open_ledger: Any) -> None:
    """On each backend: a write makes one revision (once per action), a record is
    kept once per action, and a revision that moved makes it stale."""
    ledger = open_ledger()
    run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="writer", task="t", provider="scripted",
                                  provider_config={"script": {"steps": []}})
    assert revision_store.current(ledger) == 0 and verification_store.state(ledger)["verification"] is None
    _receipt(ledger, run_id, "act-1", "fs.write", {"path": "a", SOURCES_CHANGED: True})
    _receipt(ledger, run_id, "act-1", "fs.write", {"path": "a", SOURCES_CHANGED: True})
    _receipt(ledger, run_id, "act-2", "fs.read", {"path": "a", "content": json.dumps({SOURCES_CHANGED: True})})
    # A result past the ledger's bound, kept as a preview: the flag still counts.
    cut = {"action_id": "act-6", "run_id": run_id, "tool": "command.exec",
           "result": run_store.bounded_json({"output": {SOURCES_CHANGED: True, "stdout": "x" * 70_000}})}
    assert "preview" in json.loads(cut["result"])
    with ledger.tx():
        revision_store.on_receipt(ledger, cut)
    assert revision_store.current(ledger) == 2
    assert revision_store.last_change_in_tree(ledger, run_id) == 2
    outputs = [{"argv": ["true"], "status": "exited", "exit_code": 0, "output": ""}]
    first = verification_store.record(ledger, run_id, "act-3", revision=2, fingerprint="f", passed=True,
                                      sources_changed=False, outputs=outputs)
    again = verification_store.record(ledger, run_id, "act-3", revision=2, fingerprint="g", passed=False,
                                      sources_changed=True, outputs=[])
    assert first == again and first["status"] == "passed"
    assert verification_store.missing_reason(ledger) is None
    _receipt(ledger, run_id, "act-4", "command.exec", {SOURCES_CHANGED: True})
    late = verification_store.record(ledger, run_id, "act-5", revision=2, fingerprint="f", passed=True,
                                     sources_changed=False, outputs=outputs)
    assert late["status"] == "stale"
    assert verification_store.missing_reason(ledger) == \
        "sources changed at revision 3; run project.verify (the last verification, at revision 2, is stale)"
    assert ledger.one("SELECT COUNT(*) AS n FROM project_verifications")["n"] == 2


def _crash_at_record(daemon: Daemon) -> None:
    """SIGKILL right after the verification is recorded: the outcome is in the
    ledger, so recovery ends the action from the record (no person, the verify
    command not run again), and the run completes on that one verification."""
    first = daemon.up(env={"CORRAL_FAILPOINTS": "verify.after-record=kill@once"})
    run_id = daemon.call("run", agent_id="writer", task="crash")["run_id"]
    wait_supervisor_gone(daemon, first.pid)
    assert (daemon.home / "failpoints" / "verify.after-record.fired").exists()
    daemon.up()
    shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done", shown["run"]
    (verify,) = [a for a in shown["actions"] if a["tool"] == "project.verify"]
    assert verify["phase"] == "ok"
    verifications = _verifications(daemon, run_id)
    assert [(v["status"], v["revision"]) for v in verifications] == [("passed", 1)]
    transcripts = sorted(p.name for p in (daemon.home / "transcripts" / run_id).iterdir())
    assert transcripts == [f"{verify['action_id']}-0.log"], "the verify command ran once"
    assert _blocked(daemon, run_id) == []
    assert shown["project"]["passed_on_current"] is True and shown["project"]["final_blocked"] is None


def _write_after_verify(daemon: Daemon) -> None:
    run_id = daemon.call("run", agent_id="writer", task="edit")["run_id"]
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"
    revisions = [r["revision"] for r in _revisions(daemon, run_id)]
    assert revisions == [2, 3], "one revision per write, after the crash run's"
    assert [(v["status"], v["revision"]) for v in _verifications(daemon, run_id)] == [("passed", 2), ("passed", 3)]
    # The write after the first verify refused the final reply, and the model heard why.
    assert _blocked(daemon, run_id) == [
        "sources changed at revision 3; run project.verify (the last verification, at revision 2, is passed)"]
    refusals = ledger_rows(daemon.home, "SELECT data FROM observations WHERE run_id = ? AND data LIKE ?",
                           run_id, "%sources changed at revision 3%")
    assert len(refusals) == 1


def _command_edits_a_source(daemon: Daemon) -> None:
    run_id = daemon.call("run", agent_id="writer", task="command")["run_id"]
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done", shown["run"]
    tools = [(r["revision"], r["tool"]) for r in _revisions(daemon, run_id)]
    # fs.write, the command that rewrote app.py, two fs.writes, the verify that removed the stamp.
    assert tools == [(4, "fs.write"), (5, "command.exec"), (6, "fs.write"), (7, "fs.write"), (8, "project.verify")]
    command = ledger_rows(daemon.home, "SELECT result FROM actions WHERE run_id = ? AND tool = 'command.exec'", run_id)
    assert json.loads(command[0]["result"])["output"]["sources_changed"] is True
    assert _blocked(daemon, run_id) == [
        "sources changed at revision 5; run project.verify (the last verification, at revision 4, is passed)"]
    verifications = _verifications(daemon, run_id)
    assert [(v["status"], v["revision"]) for v in verifications] == [
        ("passed", 4), ("failed", 5), ("stale", 7), ("passed", 8)]
    failed = json.loads(verifications[1]["output"])
    assert failed[0]["exit_code"] == 1 and "app.py is not good" in failed[0]["output"]
    assert failed[0]["argv"] == ["sh", "-c", VERIFY]
    assert shown["project"]["revision"] == 8 and shown["project"]["passed_on_current"] is True
    state = shown["project"]["verification"]
    assert state["status"] == "passed" and state["revision"] == 8


def test_revision_verify_and_the_final_reply_gate(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(SPEC)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        _crash_at_record(daemon)
        _write_after_verify(daemon)
        _command_edits_a_source(daemon)
    finally:
        daemon.shutdown()

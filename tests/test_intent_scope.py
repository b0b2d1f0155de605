"""Issue 35, the scope escapes: a bound run's paths are judged after the file tools'
own resolution, commands run in a sandbox that holds them to the scope, every
path-bearing tool is judged (changesets included), and a delegate works under its
parent's contract. Real runs, real files, and the bytes on disk checked each time."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.sandbox.bwrap import bwrap_available
from corral.supervisor.intent.intent_contract import canonical_sha256, validate
from tests.harness import Daemon, ledger_rows, running, wait_run
from tests.intent.schemas import upstream_errors

SECRET = "TOPSECRET-4f1c9e"
PROJECTION: dict[str, Any] = {
    "objective": "Write the project documentation",
    "primary_object": "docs/",
    "delivery_surface": ["repository"],
    "scope": {"include": ["path:docs/**"], "exclude": ["path:docs/private"]},
    "must_and_must_not": {"must": [], "must_not": []},
    "authorization": {"allowed": [], "requires_user": [], "forbidden": []},
    "completion_evidence": [{"requirement": "a page is written", "acceptable_sources": ["file"]}],
}
CONTRACT = {
    "envelope": {
        "schema_version": "1.0",
        "contract_ref": "intent:docs",
        "contract_version": 1,
        "source": "user-intent-plugin",
        "source_message_refs": ["msg:1"],
        "snapshot_sha256": canonical_sha256(PROJECTION),
        "updated_at": "2026-09-01T00:00:00Z",
    },
    "projection": PROJECTION,
}
SANDBOX = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'
#: One supervisor for the module (starting one is most of a test's time); each test
#: has its own agent, whose workspace is its own directory of the project.
AGENTS = ("files", "commands", "delegating")
AGENT_TABLES = "".join(
    f'[[agents]]\nid = "{agent}"\nworkspace = "{agent}"\n  [[agents.steps]]\n  final = "each run brings its script"\n'
    for agent in AGENTS
)
SPEC = f"""
name = "scope"
[project]
root = "proj"
{SANDBOX}
{AGENT_TABLES}
[[agents]]
id = "helper"
role = "specialist"
workspace = "delegating"
  [[agents.steps]]
  actions = [{{ tool = "fs.write", input = {{ path = "src/deleg.txt", content = "delegated" }} }}]
  [[agents.steps]]
  final = "wrote it"
[[templates]]
id = "coder"
  [[templates.steps]]
  actions = [{{ tool = "fs.write", input = {{ path = "src/child.txt", content = "isolated" }} }}]
  [[templates.steps]]
  final = "wrote it"
"""


def act(tool: str, **tool_input: Any) -> dict[str, Any]:
    return {"tool": tool, "input": tool_input}


def script(*steps: list[dict[str, Any]]) -> str:
    """A scripted run: each step's actions (three at most), then a final reply."""
    return json.dumps({"steps": [*({"actions": actions} for actions in steps), {"final": "done"}]})


def _workspace(root: Path) -> None:
    (root / "docs" / "private").mkdir(parents=True)
    (root / "src").mkdir()
    (root / "docs" / "readme.md").write_text("# Docs\n")
    (root / "docs" / "private" / "secret.md").write_text(SECRET + "\n")
    (root / "src" / "app.py").write_text("print('app')\n")
    os.symlink("../src", root / "docs" / "link")
    os.symlink("private", root / "docs" / "plink")


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    top = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    try:
        for agent in AGENTS:
            _workspace(top / "proj" / agent)
        with running(top / "home", SPEC) as running_daemon:
            yield running_daemon
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def ws(daemon: Daemon, request: pytest.FixtureRequest) -> Path:
    agent = {"test_file_tool_paths_are_judged_after_resolution": "files",
             "test_commands_are_confined_by_the_sandbox_to_the_scope": "commands",
             "test_delegates_and_isolated_children_work_under_their_parents_contract": "delegating"}[request.node.name]
    return daemon.home.parent / "proj" / agent


def tree(root: Path) -> dict[str, bytes]:
    """Every regular file under root (symlinks not followed), with its bytes."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory) / name
            if not path.is_symlink():
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


def start(daemon: Daemon, ws: Path, steps: str, contract: Any = CONTRACT) -> str:
    run_id: str = daemon.call("run", agent_id=ws.name, task="write the docs", script=steps, intent=contract)["run_id"]
    return run_id


def finish(daemon: Daemon, run_id: str) -> dict[str, Any]:
    return wait_run(daemon, run_id, {"completed", "failed", "needs-input", "waiting-confirmation"}, timeout=90)


def receipts(daemon: Daemon, run_id: str) -> dict[str, dict[str, Any]]:
    """The run's decision receipts by the action they judged (each one checked against the wire schema)."""
    found = daemon.call("intent.receipts", run_id=run_id)["receipts"]
    for receipt in found:
        validate("decision-receipt", receipt)
        assert upstream_errors("decision-receipt", receipt) == [], receipt
    return {receipt["event_ref"]: receipt for receipt in found}


def actions_of(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    rows = ledger_rows(daemon.home, "SELECT action_id, tool, input, phase FROM actions WHERE run_id = ?"
                       " ORDER BY loop_index, action_index", run_id)
    return [{**row, "input": json.loads(row["input"])} for row in rows]


def by_path(actions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {a["input"].get("path") or a["tool"]: a for a in actions if a["tool"] != "command.exec"}


def test_file_tool_paths_are_judged_after_resolution(daemon: Daemon, ws: Path) -> None:
    before = tree(ws)
    run_id = start(daemon, ws, script(
        [act("fs.write", path="docs/./private/b.md", content="b"), act("fs.write", path="docs//private/c.md",
                                                                       content="c")],
        [act("fs.write", path="..docs/e.md", content="e"), act("fs.write", path=".docs/f.md", content="f")],
        [act("fs.write", path="docs/link/l.md", content="l"), act("fs.write", path="docs/plink/p.md", content="p")],
        [act("fs.write", path="src/../x.md", content="x"), act("fs.write", path="/docs/x.md", content="x")],
        [act("fs.read", path="docs/./private/secret.md"), act("fs.read", path="docs/plink/secret.md")],
        [act("project.changeset", changes=[{"path": "src/cs.txt", "content": "cs"}]),
         act("project.changeset", changes=[{"path": "docs/private/cs.txt", "content": "cs"}])],
        [act("fs.write", path="docs/ok.md", content="# ok\n"), act("fs.read", path="docs/readme.md")],
    ))
    shown = finish(daemon, run_id)
    assert shown["run"]["status"] == "completed", shown["run"]
    # On disk: only the in-scope page changed anything.
    after = tree(ws)
    assert {k: v for k, v in after.items() if k != "docs/ok.md"} == before
    assert after["docs/ok.md"] == b"# ok\n"
    for escaped in ("..docs", ".docs", "x.md", "src/x.md", "src/l.md", "src/cs.txt"):
        assert not (ws / escaped).exists(), escaped
    # The excluded file never left the workspace through a read.
    assert SECRET not in json.dumps(shown)
    assert not any(SECRET in row["result"] or "" for row in ledger_rows(
        daemon.home, "SELECT coalesce(result, '') AS result FROM actions WHERE run_id = ?", run_id))
    decided = receipts(daemon, run_id)
    expected = {
        "docs/./private/b.md": ("path_excluded", "docs/private/b.md"),
        "docs//private/c.md": ("path_excluded", "docs/private/c.md"),
        "..docs/e.md": ("path_outside_scope", "..docs/e.md"),
        ".docs/f.md": ("path_outside_scope", ".docs/f.md"),
        "docs/link/l.md": ("path_outside_scope", "src/l.md"),
        "docs/plink/p.md": ("path_excluded", "docs/private/p.md"),
        "src/../x.md": ("path_refused", ""),
        "/docs/x.md": ("path_refused", ""),
        "docs/./private/secret.md": ("path_excluded", "docs/private/secret.md"),
        "docs/plink/secret.md": ("path_excluded", "docs/private/secret.md"),
    }
    every = actions_of(daemon, run_id)
    actions = by_path(every)
    for path, (code, resolved) in expected.items():
        action = actions[path]
        receipt = decided[action["action_id"]]
        assert (action["phase"], receipt["decision"], receipt["reason_codes"]) == ("denied", "block", [code]), path
        # The receipt says what was decided about the resolved path.
        assert resolved in (receipt["unlock"] or ""), (path, receipt["unlock"])
    changesets = [a for a in every if a["tool"] == "project.changeset"]
    assert [(a["phase"], decided[a["action_id"]]["reason_codes"]) for a in changesets] == [
        ("denied", ["path_outside_scope"]), ("denied", ["path_excluded"])]
    page = actions["docs/ok.md"]
    assert page["phase"] == "ok" and decided[page["action_id"]]["reason_codes"] == ["no_material_conflict",
                                                                                     "path_in_scope"]


def test_commands_are_confined_by_the_sandbox_to_the_scope(daemon: Daemon, ws: Path) -> None:
    before = tree(ws)
    run_id = start(daemon, ws, script(
        [act("command.exec", program="cat", args=["private/secret.md"], cwd="docs"),
         act("command.exec", program="sh", args=["-c", "echo pwned > ../src/x"], cwd="docs")],
        [act("command.exec", program="sh", args=["-c", "echo inside > inside.txt"], cwd="docs"),
         act("command.exec", program="ln", args=["-s", "../src", "made"], cwd="docs")],
        [act("fs.write", path="docs/made/through.md", content="through"),
         act("command.exec", program="cat", args=["secret.md"], cwd="docs/private")],
        [act("process.start", program="sh", args=["-c", "echo leak > ../src/y; echo leak > inside-too.txt"],
             cwd="docs"), act("fs.write", path="docs/ok.md", content="# ok\n")],
    ))
    shown = finish(daemon, run_id)
    assert shown["run"]["status"] == "completed", shown["run"]

    def session_ended() -> bool:
        rows = ledger_rows(daemon.home, "SELECT state FROM sessions WHERE run_id = ?", run_id)
        return all(row["state"] in ("exited", "failed", "terminated", "timed-out") for row in rows)

    daemon.wait_until(lambda _status: session_ended(), what="the process session to end")
    after = tree(ws)
    assert not (ws / "src" / "x").exists() and not (ws / "src" / "through.md").exists()
    assert not (ws / "src" / "y").exists()
    assert {k: v for k, v in after.items() if k not in ("docs/ok.md", "docs/inside.txt", "docs/inside-too.txt")
            } == before
    assert SECRET not in json.dumps(shown)
    for path in Path(daemon.home, "transcripts", run_id).glob("*.log"):
        assert SECRET not in path.read_text(errors="replace")
    decided = receipts(daemon, run_id)
    every = actions_of(daemon, run_id)
    commands = [a for a in every if a["tool"] == "command.exec"]
    through = by_path(every)["docs/made/through.md"]
    # The link a command made inside the scope does not carry a write out of it.
    assert through["phase"] == "denied" and decided[through["action_id"]]["reason_codes"] == ["path_outside_scope"]
    # A command whose working directory is excluded is refused outright.
    assert commands[4]["phase"] == "denied" and decided[commands[4]["action_id"]]["reason_codes"] == ["path_excluded"]
    if bwrap_available():
        # The OS holds the rest: the excluded directory is empty inside, src/ is read-only,
        # and the scope itself stays writable.
        assert [a["phase"] for a in commands[:4]] == ["failed", "failed", "ok", "ok"]
        assert after["docs/inside.txt"] == b"inside\n"
        assert after["docs/inside-too.txt"] == b"leak\n"  # the session's own write in scope, after the refused one
        assert os.readlink(ws / "docs" / "made") == "../src"
    else:
        # No sandbox to hold a command to the scope: commands are blocked, never guessed at.
        assert {decided[a["action_id"]]["reason_codes"][0] for a in commands[:4]} == {"scope_unenforceable"}


def test_delegates_and_isolated_children_work_under_their_parents_contract(daemon: Daemon, ws: Path) -> None:
    before = tree(ws)
    run_id = start(daemon, ws, script(
        [act("agent.delegate", agent_id="helper", task="write the code file")],
        [act("agent.spawn_isolated", children=[{"template": "coder", "task": "write the child file",
                                                "write_scopes": ["src"], "expected_artifacts": ["src/child.txt"]}])],
        [act("fs.write", path="docs/ok.md", content="# ok\n")],
    ))
    finish(daemon, run_id)

    def handed_on() -> list[dict[str, Any]]:
        return [row for row in ledger_rows(daemon.home, "SELECT run_id, kind, status FROM runs"
                                           " WHERE parent_run_id = ? ORDER BY kind", run_id)
                if row["status"] in ("completed", "failed", "needs-input")]

    daemon.wait_until(lambda _status: len(handed_on()) == 2, what="the delegated and the isolated run to end")
    assert not (ws / "src" / "deleg.txt").exists() and not (ws / "src" / "child.txt").exists()
    assert {k: v for k, v in tree(ws).items() if k != "docs/ok.md"} == before
    for child in handed_on():
        (receipt,) = receipts(daemon, child["run_id"]).values()
        assert (receipt["contract_ref"], receipt["decision"], receipt["reason_codes"]) == (
            "intent:docs", "block", ["path_outside_scope"]), child["kind"]
        shown = daemon.call("show", run_id=child["run_id"])
        assert shown["intent"]["inherited_from"] == run_id

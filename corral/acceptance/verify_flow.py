"""The verify and preview flow (seed 004 V1.1 §5.5): the agent changes the project
(the version file the check reads), verifies it (``project.verify``), then starts the project's
preview as a process session, validates it in Chromium (``preview.validate``, desktop
and mobile screenshots into the run's evidence directory) and runs ``project.verify``.
What it needs and lacks (the tool, Chromium, playwright, Chromium's sandbox,
bubblewrap) is named first."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from corral.acceptance import specs
from corral.acceptance.host import Host, HostError
from corral.acceptance.provider import Provider
from corral.acceptance.workspace import Workspace
from corral.core.errors import CorralError
from corral.supervisor.ledger.ledger_spec import open_for_reading

RUN_TIMEOUT_S = 600.0
#: A page whose canvas is drawn: a preview that passes in both viewports.
PAGE = """<!doctype html><html><head><title>Release preview</title></head><body>
<canvas id="c" width="320" height="200"></canvas>
<script>const g = document.getElementById("c").getContext("2d");
g.fillStyle = "#2a6"; g.fillRect(10, 10, 200, 120); g.fillStyle = "#c33"; g.fillRect(60, 60, 120, 100);</script>
</body></html>
"""
#: The project's verify command: it passes only once the agent made the change.
CHECK = """import pathlib, sys
version = pathlib.Path("site/version.txt")
ok = version.is_file() and version.read_text().strip() == "2"
print("check: ok" if ok else "check: site/version.txt must hold 2")
sys.exit(0 if ok else 1)
"""


@dataclass
class VerifyFacts:
    home: Path
    project: Path
    blocked: str = ""
    run_id: str = ""
    error: str = ""
    final_status: str = ""
    #: tool -> (phase, error code or "") of its last action.
    tools: dict[str, tuple[str, str]] = field(default_factory=dict)
    screenshots: list[Path] = field(default_factory=list)
    #: Changes (fs.write, fs.patch, project.changeset) that ran ok before the last ok
    #: project.verify (seed 004 V1.1 §5.5: "修改后通过 project.verify").
    changed_before_verify: int = 0
    #: The project revision that verification verified (0: nothing was ever changed).
    verified_revision: int = 0


def missing() -> str:
    """What the flow needs and this machine lacks ("" when nothing)."""
    from corral.actors.tools.registry import builtin_tools

    if "preview.validate" not in builtin_tools():
        return "preview.validate is not in this build"
    from corral.actors.tools.preview_browser import sandbox_problem

    # Chromium, playwright, and Chromium's own sandbox (a real start): without it the
    # check is blocked (seed 004 V1.1 §3 forbids --no-sandbox), so say so before a run.
    browser = sandbox_problem()
    if browser:
        return browser
    from corral.sandbox.bwrap import bwrap_available

    if not bwrap_available():
        return "no bubblewrap (process.start needs its sandbox)"
    return ""


def verify_flow(workspace: Workspace, host: Host, provider: Provider) -> VerifyFacts:
    project = workspace.project("verify-project")
    (project / "site").mkdir()
    (project / "site" / "index.html").write_text(PAGE)
    (project / "check.py").write_text(CHECK)
    facts = VerifyFacts(workspace.home("verify"), project, blocked=missing())
    if facts.blocked:
        return facts
    spec = workspace.root / "verify.toml"
    spec.write_text(specs.verify_spec(provider, str(project)))
    try:
        host.up(facts.home, spec)
        ran = host.cli(facts.home, "run", "--agent", "verifier", "--task", specs.VERIFY_TASK, "--wait", "--json",
                       "--timeout", str(RUN_TIMEOUT_S), timeout=RUN_TIMEOUT_S + 30)
        shown = json.loads(ran.stdout) if ran.stdout.strip().startswith("{") else {}
        if not shown:
            raise HostError(f"`corral run` printed no run (exit {ran.returncode}): {ran.stderr.strip()[-300:]}")
        facts.run_id = shown["run"]["run_id"]
        facts.final_status = shown["run"]["status"]
        with contextlib.closing(open_for_reading(facts.home)) as ledger:
            rows = ledger.all("SELECT action_id, tool, phase, error FROM actions WHERE run_id = ?"
                              " ORDER BY loop_index, action_index", facts.run_id)
            verified = ledger.all("SELECT action_id, revision FROM project_verifications WHERE run_id = ?"
                                  " AND status = 'passed'", facts.run_id)
        for row in rows:
            facts.tools[row[1]] = (row[2], _code(row[3]))
        _changes_before_verify(facts, [(str(r[0]), str(r[1]), str(r[2])) for r in rows],
                               {str(r[0]): int(r[1]) for r in verified})
        facts.screenshots = sorted(facts.home.rglob("*.png"))
    except (HostError, CorralError, OSError, ValueError, KeyError) as exc:
        facts.error = f"{type(exc).__name__}: {exc}"[:500]
    with contextlib.suppress(HostError):
        host.down(facts.home)
    return facts


CHANGES = ("fs.write", "fs.patch", "project.changeset")


def _changes_before_verify(facts: VerifyFacts, rows: list[tuple[str, str, str]], verified: dict[str, int]) -> None:
    """``rows``: (action id, tool, phase) in plan order; ``verified``: the passed
    verifications' action ids and revisions."""
    last = max((i for i, row in enumerate(rows) if row[1] == "project.verify" and row[2] == "ok"), default=None)
    if last is None:
        return
    facts.changed_before_verify = sum(1 for row in rows[:last] if row[1] in CHANGES and row[2] == "ok")
    facts.verified_revision = verified.get(rows[last][0], 0)


def _code(error: str | None) -> str:
    if not error:
        return ""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        value = json.loads(error)
        if isinstance(value, dict):
            return str(value.get("code") or "")
    return ""

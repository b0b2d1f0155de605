"""``corral chaos`` counts the user's effects (issue 34): the "side effect at most
once" row checks a user tool's external effects by the ledger's executing records
even when the tool reports nothing, and a row that checked nothing is reported as
"not exercised", never as a pass. Real supervisors, one episode each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

EFFECTS = "side effect at most once, never before executing"

#: A user's own external tool: it knows nothing of chaos and writes no effects file.
TICKET_TOOLS = '''
import corral


@corral.tool(effect="external", name="ticket.open")
def open_ticket(ctx: corral.ToolContext, subject: str) -> dict:
    """Open a ticket in the tracker."""
    return {"ticket": 1, "subject": subject}
'''


def _spec(steps: str) -> str:
    return f"""
name = "tickets"
[project]
root = "project"
[chaos]
root_agent = "clerk"
task = "Open a ticket"
[tools]
modules = ["./ticket_tools.py"]
[[agents]]
id = "clerk"
role = "root"
tools = ["ticket.*"]
{steps}
"""


def _chaos(base: Path, steps: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """One failpoint episode (a supervisor kill after a terminal commit) of the spec."""
    (base / "ticket_tools.py").write_text(TICKET_TOOLS)
    spec = base / "tickets.toml"
    spec.write_text(_spec(steps))
    report_path = base / "report.json"
    argv = ["--scenario", str(spec), "--mode", "failpoints", "--failpoint", "action.after-terminal",
            "--targets", "supervisor", "--seed", "1", "--quiet", "--json", str(report_path)]
    result = subprocess.run(
        [sys.executable, "-m", "corral", "chaos", *argv], capture_output=True, text=True, timeout=300, check=False
    )
    assert report_path.exists(), result.stdout[-2000:] + result.stderr[-2000:]
    return result, json.loads(report_path.read_text())


def _row(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if EFFECTS in line)


def test_chaos_counts_the_effects_of_a_user_tool_that_reports_none(short_tmp: Path) -> None:
    steps = '[[agents.steps]]\nactions = [{ tool = "ticket.open", input = { subject = "disk full" } }]\n'
    result, report = _chaos(short_tmp, steps + '[[agents.steps]]\nfinal = "opened"\n')
    assert result.returncode == 0, result.stdout[-2000:]
    effects = report["invariants"][EFFECTS]
    assert effects["count"] > 0 and effects["breakdown"] == {"ticket.open": effects["count"]}
    assert effects["status"] == "pass" and EFFECTS not in report["not_exercised"]
    assert _row(result.stdout).startswith("PASS") and "effects: ticket.open" in _row(result.stdout)


def test_a_row_that_checked_nothing_is_not_exercised_never_a_pass(short_tmp: Path) -> None:
    result, report = _chaos(short_tmp, '[[agents.steps]]\nfinal = "nothing to do"\n')
    assert result.returncode == 0, result.stdout[-2000:]  # nothing failed
    effects = report["invariants"][EFFECTS]
    assert effects["count"] == 0 and effects["status"] == "not exercised" and effects["passed"] is True
    assert EFFECTS in report["not_exercised"]
    assert _row(result.stdout).startswith("not exercised")
    assert "ALL INVARIANTS PASS" not in result.stdout
    verdict = next(line for line in result.stdout.splitlines() if line.startswith("NO INVARIANT FAILED"))
    assert "NOT EXERCISED: " in verdict and EFFECTS in verdict

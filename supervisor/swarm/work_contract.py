"""The contract of delegated work, the same for an isolated child and a specialist's
delegation: the checks of a request's path lists, the task text the worker gets,
and the evidence its result carries (artifacts hashed by the supervisor from the
files, never taken from the worker; its receipts; for a child, a digest of its
artifacts; for a specialist, the project revision its verification covers).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from corral.actors.tools.base import ToolError
from corral.actors.tools.paths import check_relative, resolve_in_workspace
from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.tool_boundary import CHILD_TOOLS as CHILD_TOOLS
from corral.supervisor.runs.tool_boundary import FILE_TOOLS
from corral.supervisor.swarm.swarm_state import sha

#: The tools of a specialist's delegated run (its own allow list still holds). Unlike
#: an isolated child it works in the project itself, so it may verify what it changed
#: (seed 004 V1.28: evidence-ready needs a passed verification when one is required).
SPECIALIST_TOOLS = [*FILE_TOOLS, "project.verify"]
#: A delegation's acceptance criteria: 1 to 8 distinct items of bounded length (seed 004 V1.28).
MAX_CRITERIA = 8
MAX_CRITERION_CHARS = 500
#: A delegation's expected artifacts (seed 004 V1.28: 0 to 16).
MAX_ARTIFACTS = 16


def str_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise BadRequest(f"{what} must be a list of non-empty strings")
    return list(value)


def relative_paths(paths: list[str], what: str) -> None:
    for path in paths:
        try:
            check_relative(path)
        except ToolError as exc:
            raise BadRequest(f"{what}: {exc}") from None


def criteria_list(value: Any) -> list[str]:
    """A delegation's acceptance criteria, as the seed states them: what the
    supervisor will judge the work by, so none may be empty, repeated or unbounded."""
    if not isinstance(value, list):
        raise BadRequest(f"acceptance_criteria must be a list of 1 to {MAX_CRITERIA} strings,"
                         f" not {type(value).__name__}")
    if not 1 <= len(value) <= MAX_CRITERIA:
        raise BadRequest(f"acceptance_criteria must hold 1 to {MAX_CRITERIA} items (it has {len(value)})")
    if not all(isinstance(item, str) for item in value):
        raise BadRequest("acceptance_criteria must be strings")
    if not all(item.strip() for item in value):
        raise BadRequest("acceptance_criteria must be non-empty strings")
    if any(len(item) > MAX_CRITERION_CHARS for item in value):
        raise BadRequest(f"acceptance_criteria: each item is at most {MAX_CRITERION_CHARS} characters")
    if len(set(value)) != len(value):
        raise BadRequest("acceptance_criteria repeats an item")
    return list(value)


def stored_criteria(text: str) -> list[str]:
    """The criteria of a delegation row: a JSON list; a row written before they were
    a list holds one string (or none)."""
    try:
        value = json.loads(text)
    except ValueError:
        return [text] if text else []
    return [str(item) for item in value] if isinstance(value, list) else ([text] if text else [])


def delegation_task_text(task: str, contract: dict[str, Any]) -> str:
    """The specialist's task: the whole delegation contract (seed 004 V1.28), and
    that its reply is a receipt for its parent, not an answer to the user."""
    lines = [
        task,
        f"Delegation: {contract['delegation_id']} (you are agent {contract['agent_id']}, run {contract['run_id']};"
        f" delegated by agent {contract['parent_agent']}, run {contract['parent_run_id']})",
    ]
    criteria = contract["acceptance_criteria"]
    if criteria:
        lines.append("Acceptance criteria:")
        lines.extend(f"{index}. {item}" for index, item in enumerate(criteria, 1))
    if contract["expected_artifacts"]:
        lines.append("Expected artifacts: " + ", ".join(contract["expected_artifacts"]))
    if contract["repair_of"]:
        lines.append(f"Repair of delegation: {contract['repair_of']} (your parent judged that work unmet)")
    lines.append("Your reply is a receipt with evidence for your parent run, not an answer to the user.")
    return "\n".join(lines)


def verification_of(ledger: Ledger, run_id: str, required_by_project: bool) -> tuple[bool, int | None, str | None]:
    """Whether the worker's run must be verified (the project requires verification
    and the run changed sources), the project revision its latest passed
    ``project.verify`` covers (None when none covers its last change), and why it
    falls short, if it does."""
    changed = ledger.one("SELECT MAX(revision) AS r FROM project_revisions WHERE run_id = ?", run_id)
    passed = ledger.one(
        "SELECT MAX(revision) AS r FROM project_verifications WHERE run_id = ? AND status = 'passed'", run_id)
    last_change = None if changed is None or changed["r"] is None else int(changed["r"])
    last_pass = None if passed is None or passed["r"] is None else int(passed["r"])
    verified = last_pass if last_pass is not None and (last_change is None or last_pass >= last_change) else None
    required = required_by_project and last_change is not None
    if required and verified is None:
        return True, None, (f"not verified: run {run_id} changed sources at revision {last_change}"
                            " and has no passed project.verify since")
    return required, verified, None


def task_text(task: str, criteria: str, artifacts: list[str]) -> str:
    lines = [task]
    if criteria:
        lines.append(f"Acceptance criteria: {criteria}")
    if artifacts:
        lines.append("Expected artifacts: " + ", ".join(artifacts))
    return "\n".join(lines)


def hashed_artifacts(workspace: Path, expected: list[str]) -> tuple[list[dict[str, str]], list[str]]:
    """sha256 recomputed by the supervisor from the files, never taken from the worker."""
    found, missing = [], []
    for path in expected:
        try:
            target = resolve_in_workspace(workspace, path)
        except ToolError:
            missing.append(path)
            continue
        if target.is_file():
            found.append({"path": path, "sha256": hashlib.sha256(target.read_bytes()).hexdigest()})
        else:
            missing.append(path)
    return found, missing


def refused_work(ledger: Ledger, run_id: str) -> str | None:
    """Why a worker's delivery is no evidence: it took actions and every one that
    ended was refused (denied) or failed, so nothing it did stands, whatever its
    reply says. None when some action succeeded, or it took none (its artifacts and
    reply are then judged alone)."""
    rows = ledger.all(
        "SELECT phase, COUNT(*) AS n FROM actions WHERE run_id = ? AND phase IN ('ok', 'denied', 'failed')"
        " GROUP BY phase", run_id,
    )
    ended = {row["phase"]: int(row["n"]) for row in rows}
    if not ended or ended.get("ok"):
        return None
    return (f"no evidence: every action of run {run_id} was refused or failed"
            f" ({ended.get('denied', 0)} refused, {ended.get('failed', 0)} failed)")


def evidence(ledger: Ledger, run_id: str) -> list[str]:
    rows = ledger.all("SELECT tool, status, result_summary FROM receipts WHERE run_id = ? ORDER BY receipt_id", run_id)
    return [f"{row['tool']} {row['status']}: {row['result_summary']}" for row in rows][:20]


def revision(artifacts: list[dict[str, str]]) -> str:
    return sha(json.dumps(sorted((a["path"], a["sha256"]) for a in artifacts)))[:16]

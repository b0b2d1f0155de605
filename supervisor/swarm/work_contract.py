"""The contract of delegated work, the same for an isolated child and a specialist's
delegation: the checks of a request's path lists, the task text the worker gets,
and the evidence its result carries (artifacts hashed by the supervisor from the
files, never taken from the worker; its receipts; a revision of the artifacts).
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
from corral.supervisor.swarm.swarm_state import sha

#: The tools of an isolated child's run (its template may narrow them further).
CHILD_TOOLS = ["fs.read", "fs.write", "fs.patch", "fs.list", "effect.record", "effect.barrier"]
#: The tools of a specialist's delegated run (its own allow list still holds).
SPECIALIST_TOOLS = CHILD_TOOLS


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

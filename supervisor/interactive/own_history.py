"""What an agent may read back of its own past actions (seed 004, V1.6 and V1.8).

* :func:`action_history` (the ``agent.action_history`` tool): receipts of the calling
  agent's own terminal actions, newest first, at most 10, redacted, the calling
  action excluded and the tool's own receipts left out unless asked for by name.
* :func:`command_source` (``command.output_read``): where the transcript of one of
  the agent's own finished ``command.exec`` actions is, in any of its runs, with
  the command's end (exit code, digest of the transcript, whether the capture was
  cut). Another agent's command is "not found", exactly like one that never was.

Read-only: nothing here writes to the ledger.
"""

from __future__ import annotations

import json
from typing import Any

from corral.actors.tools.fs import SOURCES_CHANGED
from corral.core.redact import redact
from corral.supervisor.errors import BadRequest, NotFound
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.action_state import TERMINAL as ACTION_TERMINAL

HISTORY_TOOL = "agent.action_history"
MAX_HISTORY = 10
#: The seed's default page of receipts (V1.6): 5 unless asked.
DEFAULT_HISTORY = 5
STATUSES = tuple(sorted(phase.value for phase in ACTION_TERMINAL))
#: ``run_id`` for every run of the agent (omitted: the calling run only).
ALL_RUNS = "all"
_RECEIPT_FIELDS = (
    "action_id", "run_id", "tool", "status", "fingerprint", "input_summary", "result_summary", "note",
    "started_at", "finished_at",
)


def _own_run(ledger: Ledger, agent_id: str, run_id: str) -> str:
    row = ledger.one("SELECT agent_id FROM runs WHERE run_id = ?", run_id)
    if row is None or row["agent_id"] != agent_id:
        raise BadRequest(f"run {run_id[:80]!r} is not one of your runs")
    return run_id


def action_history(
    ledger: Ledger, caller: Any, action_id: str, filters: dict[str, Any]
) -> dict[str, Any]:
    """``caller`` is the calling run's row; ``action_id`` the calling action."""
    agent_id = caller["agent_id"]
    limit = filters.get("limit", DEFAULT_HISTORY)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_HISTORY:
        raise BadRequest(f"limit must be an integer within 1..{MAX_HISTORY}")
    where = ["agent_id = ?", "action_id != ?"]
    args: list[Any] = [agent_id, action_id]
    run_id = filters.get("run_id")
    if run_id is None:
        where.append("run_id = ?")
        args.append(caller["run_id"])
    elif run_id != ALL_RUNS:
        if not isinstance(run_id, str):
            raise BadRequest("run_id must be a run id, or 'all'")
        where.append("run_id = ?")
        args.append(_own_run(ledger, agent_id, run_id))
    wanted = filters.get("action_id")
    if wanted is not None:
        if not isinstance(wanted, str) or len(wanted) > 100:
            raise BadRequest("action_id must be an action id")
        where.append("action_id = ?")
        args.append(wanted)
    tool = filters.get("tool")
    if tool is None:
        where.append("tool != ?")  # asking about asking: only when named
        args.append(HISTORY_TOOL)
    else:
        if not isinstance(tool, str) or not 1 <= len(tool) <= 100:
            raise BadRequest("tool must be a tool name")
        where.append("tool = ?")
        args.append(tool)
    status = filters.get("status")
    if status is not None:
        if status not in STATUSES:
            raise BadRequest(f"status must be one of: {', '.join(STATUSES)}")
        where.append("status = ?")
        args.append(status)
    rows = ledger.all(
        f"SELECT {', '.join(_RECEIPT_FIELDS)} FROM receipts WHERE {' AND '.join(where)}"
        " ORDER BY receipt_id DESC LIMIT ?",
        *args, limit + 1,
    )
    receipts = [redact({key: row[key] for key in _RECEIPT_FIELDS}) for row in rows[:limit]]
    return {"agent_id": agent_id, "receipts": receipts, "more": len(rows) > limit}


def command_source(ledger: Ledger, caller: Any, source: str) -> dict[str, Any]:
    """The run and end of the agent's own finished ``command.exec`` ``source``."""
    row = ledger.one(
        "SELECT a.run_id, a.agent_id, a.tool, a.phase, a.result, c.exit_code FROM actions a"
        " LEFT JOIN command_launches c ON c.action_id = a.action_id WHERE a.action_id = ?",
        source,
    )
    if row is None or row["agent_id"] != caller["agent_id"] or row["tool"] != "command.exec":
        raise NotFound(f"no command transcript for action {source} of yours (command.exec, any of your runs)")
    if row["phase"] not in {phase.value for phase in ACTION_TERMINAL}:
        raise BadRequest(f"command {source} has not finished ({row['phase']}); its transcript is not final")
    result = json.loads(row["result"]) if row["result"] else {}
    output = result.get("output") or {}
    return {
        "run_id": row["run_id"],
        "exit_code": output.get("exit_code", row["exit_code"]),
        "status": output.get("status"),
        "output_sha256": output.get("outputSha256"),
        "capture_truncated": bool(output.get("captureTruncated", output.get("status") == "output-limit-exceeded")),
        "timed_out": output.get("status") == "timed-out",
        "source_changed": bool(output.get(SOURCES_CHANGED)),
    }

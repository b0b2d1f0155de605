"""What an agent may read back of its own past actions (seed 004, V1.6 and V1.8).

* :func:`action_history` (the ``agent.action_history`` tool): receipts of the calling
  agent's own terminal actions, newest first, at most 10, redacted, the calling
  action excluded and the tool's own receipts left out unless asked for by name.
  Their detail keeps to ``DETAIL_BUDGET`` characters and names no absolute path
  (V1.6), and a parent run waits for it until its isolated groups' join is claimed
  (:func:`join_gate`).
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
from corral.core.path_scrub import scrub_paths
from corral.core.redact import redact
from corral.supervisor.errors import BadRequest, NotFound, Refused
from corral.supervisor.interactive import receipt_read
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
#: The seed's detail budget (V1.6: "结构化 detail 上限 7,200 字符"): the receipts'
#: JSON, whole. Past it the optional fields go first, least telling first and the
#: oldest receipts' first, then whole receipts, oldest first; never a cut string,
#: never an id or a fingerprint ("禁止用字符截断破坏 JSON，禁止清空 runId /
#: actionFingerprint").
DETAIL_BUDGET = 7_200
OPTIONAL_FIELDS = ("note", "started_at", "detail", "input_summary", "result_summary")
_TEXT_FIELDS = ("input_summary", "result_summary", "note")


def join_gate(ledger: Ledger, run_id: str) -> list[str]:
    """What keeps the run's ``agent.action_history`` back (V1.6: "在所有子结果终态且
    ready join 已由当前父 run 的 agent.run_status action 认领前，Runtime 必须阻止最终
    回复和 agent.action_history"): its isolated groups still running, and their
    joins delivered and not yet claimed. Empty: it may read its history."""
    reasons = []
    groups = ledger.one("SELECT COUNT(*) FROM isolated_groups WHERE parent_run_id = ? AND status = 'open'", run_id)
    if groups and groups[0]:
        reasons.append(f"{groups[0]} isolated group(s) still running")
    for row in ledger.all(
        "SELECT delivery_id FROM deliveries WHERE parent_run_id = ? AND kind = 'join' AND status = 'dispatched'"
        " ORDER BY created_at, delivery_id",
        run_id,
    ):
        reasons.append(f"join delivery {row['delivery_id']} ready and not claimed")
    return reasons


def _within_budget(receipts: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """``receipts`` (newest first) within ``DETAIL_BUDGET``; whether anything went."""

    def size() -> int:
        return len(json.dumps(receipts))

    if size() <= DETAIL_BUDGET:
        return receipts, False
    for name in OPTIONAL_FIELDS:
        for receipt in reversed(receipts):  # the oldest first
            if receipt.pop(name, None) is not None and size() <= DETAIL_BUDGET:
                return receipts, True
    while len(receipts) > 1 and size() > DETAIL_BUDGET:
        receipts.pop()  # the oldest, whole
    return receipts, True


def _cleaned(row: Any, agent_id: str) -> dict[str, Any]:
    """One receipt as the model reads it: checked again against its action and its
    run (receipt_read.py; what fails, fails the read closed), bound to the run's
    session, with the execution mode it ran under and its safe detail parsed again;
    redacted, its texts naming no absolute path (V1.6: "绝对路径统一替换为
    <absolute-path>")."""
    wrong = receipt_read.problem(row, agent_id)
    if wrong is not None:
        raise Refused(
            f"the receipt of action {row['action_id']} does not match the ledger ({wrong}): nothing is shown",
            code="receipt-invalid",
        )
    receipt: dict[str, Any] = redact({key: row[key] for key in _RECEIPT_FIELDS})
    for name in _TEXT_FIELDS:
        if isinstance(receipt.get(name), str):
            receipt[name] = scrub_paths(receipt[name])
    receipt["session_id"] = row["u_session"]
    receipt["execution_mode"] = row["a_policy"]
    detail = receipt_read.safe_detail(row["tool"], row["a_result"])
    if detail.fields is not None:
        receipt["detail"] = detail.fields
    if detail.unavailable:
        receipt["detail_unavailable"] = True
    return receipt


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
    waiting = join_gate(ledger, caller["run_id"])
    if waiting:
        raise Refused(
            f"agent.action_history waits until this run's isolated join is claimed ({'; '.join(waiting)}):"
            " query agent.run_status to claim it, then ask again",
            code="join-unclaimed",
        )
    limit = filters.get("limit", DEFAULT_HISTORY)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_HISTORY:
        raise BadRequest(f"limit must be an integer within 1..{MAX_HISTORY}")
    where = ["r.agent_id = ?", "r.action_id != ?"]
    args: list[Any] = [agent_id, action_id]
    run_id = filters.get("run_id")
    if run_id is None:
        where.append("r.run_id = ?")
        args.append(caller["run_id"])
    elif run_id != ALL_RUNS:
        if not isinstance(run_id, str):
            raise BadRequest("run_id must be a run id, or 'all'")
        where.append("r.run_id = ?")
        args.append(_own_run(ledger, agent_id, run_id))
    wanted = filters.get("action_id")
    if wanted is not None:
        if not isinstance(wanted, str) or len(wanted) > 100:
            raise BadRequest("action_id must be an action id")
        where.append("r.action_id = ?")
        args.append(wanted)
    tool = filters.get("tool")
    if tool is None:
        where.append("r.tool != ?")  # asking about asking: only when named
        args.append(HISTORY_TOOL)
    else:
        if not isinstance(tool, str) or not 1 <= len(tool) <= 100:
            raise BadRequest("tool must be a tool name")
        where.append("r.tool = ?")
        args.append(tool)
    status = filters.get("status")
    if status is not None:
        if status not in STATUSES:
            raise BadRequest(f"status must be one of: {', '.join(STATUSES)}")
        where.append("r.status = ?")
        args.append(status)
    rows = ledger.all(
        f"SELECT {receipt_read.COLUMNS} FROM {receipt_read.JOINS} WHERE {' AND '.join(where)}"
        " ORDER BY r.receipt_id DESC LIMIT ?",
        *args, limit + 1,
    )
    receipts, truncated = _within_budget([_cleaned(row, agent_id) for row in rows[:limit]])
    more = len(rows) > len(receipts)
    return {"agent_id": agent_id, "receipts": receipts, "more": more, "truncated": truncated}


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

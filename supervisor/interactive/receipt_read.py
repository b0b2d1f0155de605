"""A receipt as ``agent.action_history`` may show it (seed 004, V1.6): checked again
against its action's record and its run when read, with its safe detail parsed
again under today's whitelist. Pure: own_history.py reads the rows.

"agent.action_history 不能把 Agent DB 中已有 receipt 当成已经可信的展示 DTO。读取时必须
再次验证终态 status、actionId、64 位 fingerprint、executionMode、tool，并把 receipt 的
task / session 与同 run 的 task ledger 绑定；safeDetail 还要按当前工具白名单重新解析，
无法通过时只返回 detailUnavailable，不得回显伪造或旧版本遗留的原始 detail."

A receipt is written in the transaction of the terminal move it records
(supervisor/runs/action_store.py), so on an intact ledger every check holds; one
that fails means the ledger was changed behind the supervisor, and the read fails
closed naming the action and the field, never showing the receipt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from corral.supervisor.runs.action_state import TERMINAL, action_id
from corral.supervisor.spec.spec_models import POLICIES

_STATUSES = frozenset(phase.value for phase in TERMINAL)
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")
_CHECKPOINT = re.compile(r"cp-[0-9a-f]{20}")
#: The one tool with a safe structured detail (the seed's first version:
#: "首版只保留 project.patchset 的 checkpointId / revision / changeCount /
#: revisionAdvanced"); corral's ``project.changeset`` is the seed's ``project.patchset``.
CHANGESET = "project.changeset"

#: The receipt's columns and its action's and run's, as own_history.py selects them.
COLUMNS = (
    "r.action_id, r.run_id, r.agent_id, r.tool, r.status, r.fingerprint, r.input_summary, r.result_summary,"
    " r.note, r.started_at, r.finished_at, a.action_id AS a_id, a.run_id AS a_run, a.agent_id AS a_agent,"
    " a.tool AS a_tool, a.phase AS a_phase, a.fingerprint AS a_fingerprint, a.policy AS a_policy,"
    " a.loop_index AS a_loop, a.action_index AS a_index, a.result AS a_result, u.agent_id AS u_agent,"
    " u.session_id AS u_session"
)
JOINS = "receipts r LEFT JOIN actions a ON a.action_id = r.action_id LEFT JOIN runs u ON u.run_id = r.run_id"


@dataclass(frozen=True, slots=True)
class Detail:
    """A receipt's safe detail: the whitelisted fields, or ``unavailable`` when its
    tool has some and the result does not parse under them."""

    fields: dict[str, Any] | None = None
    unavailable: bool = False


def problem(row: Any, agent_id: str) -> str | None:
    """What no longer holds of the receipt ``row`` (selected with :data:`COLUMNS`)
    read by ``agent_id``; None: it is its action's and its run's, as written."""
    if row["a_id"] is None:
        return "no action of the ledger has this action id"
    if row["status"] not in _STATUSES or row["status"] != row["a_phase"]:
        return f"status {row['status']!r} is not its action's terminal status {row['a_phase']!r}"
    if row["a_run"] != row["run_id"] or action_id(row["a_run"], row["a_loop"], row["a_index"]) != row["action_id"]:
        return "its action id is not the one its run and step derive"
    if not _FINGERPRINT.fullmatch(row["fingerprint"]) or row["fingerprint"] != row["a_fingerprint"]:
        return "its fingerprint is not its action's 64-hex fingerprint"
    if row["a_policy"] not in POLICIES:
        return f"its action's execution mode {row['a_policy']!r} is none of {', '.join(POLICIES)}"
    if row["tool"] != row["a_tool"]:
        return f"tool {row['tool']!r} is not its action's tool {row['a_tool']!r}"
    if row["u_session"] is None:
        return "its run is not in the ledger"
    if not row["agent_id"] == row["a_agent"] == row["u_agent"] == agent_id:
        return "its agent is not its action's and its run's"
    return None


def safe_detail(tool: str, result: str | None) -> Detail:
    """The detail of ``tool``'s receipt, parsed from its action's stored result by the
    whitelist of that tool's fields (V1.6: "按工具类型和字段名双重白名单抽取"): never
    file contents, output, a diff's body or a message; what does not parse is
    ``unavailable``, never echoed."""
    if tool != CHANGESET:
        return Detail()
    try:
        output = json.loads(result or "{}").get("output")
    except (ValueError, AttributeError):
        return Detail(unavailable=True)
    if not isinstance(output, dict):
        return Detail(unavailable=True)
    checkpoint, revision, files = output.get("checkpoint"), output.get("revision"), output.get("files")
    if (
        not isinstance(checkpoint, str)
        or not _CHECKPOINT.fullmatch(checkpoint)
        or isinstance(revision, bool)
        or not isinstance(revision, int)
        or revision < 0
        or not isinstance(files, list)
    ):
        return Detail(unavailable=True)
    return Detail(
        {
            "checkpoint_id": checkpoint,
            "revision": revision,
            "change_count": len(files),
            "revision_advanced": revision > 0,
        }
    )

"""What a parent's planning prompt carries about its delegations (seed 004 V1.16:
"planning prompt 必须持续携带当前用户原始目标、已委派目标、待回执集合、已认领结果和当前完成条件").

The run's task is the original goal and rides in every provider turn, never
compacted; this note follows it, built from the ledger at each turn, so the
delegated goals, the receipts still pending, the claimed results and what still
holds the final reply survive any compaction of the observations that first told
the model. Bounded: the newest delegations only, each goal summarised.
"""

from __future__ import annotations

import json

from corral.core.redact import summarize
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.swarm.claim_store import claimed_joins

#: Delegations a note lists (the newest), and the characters of each goal shown.
MAX_LISTED = 12
GOAL_CHARS = 120
#: Completion conditions a note lists, and the characters of each.
MAX_CONDITIONS = 6
CONDITION_CHARS = 160


def note(ledger: Ledger, run_id: str, features: RunFeatures) -> str | None:
    """The coordination note of a parent run, or None when it delegated nothing and
    claimed no isolated join."""
    joins = claimed_joins(ledger, run_id)
    rows = ledger.all(
        "SELECT d.delegation_id, d.target_agent, d.task, d.status, v.status AS delivery, v.payload"
        " FROM delegations d LEFT JOIN deliveries v ON v.source_id = d.delegation_id AND v.kind = 'receipt'"
        " WHERE d.parent_run_id = ? ORDER BY d.created_at DESC, d.delegation_id DESC LIMIT ?",
        run_id,
        MAX_LISTED + 1,
    )
    if not rows and not joins:
        return None
    lines = ["", "", "[Coordination, as the ledger holds it at this turn]"]
    if len(rows) > MAX_LISTED:
        lines.append(f"(the newest {MAX_LISTED} delegations; agent.run_status lists all)")
    pending = 0
    for row in reversed(rows[:MAX_LISTED]):
        who = f"{row['target_agent']} ({summarize(row['task'], GOAL_CHARS)}) [{row['delegation_id']}]"
        lines.append(f"delegated: {who}")
        if row["status"] == "running":
            pending += 1
            lines.append(f"pending receipt: {who}, still running")
        elif row["delivery"] == "dispatched":
            pending += 1
            lines.append(f"pending receipt: {who}, ready: claim it with agent.run_status")
        elif row["delivery"] == "claimed-by-parent":
            result = json.loads(row["payload"])
            summary = summarize(str(result.get("summary") or result.get("error") or ""), GOAL_CHARS)
            lines.append(f"claimed: {who}: {result.get('status', '?')}" + (f": {summary}" if summary else ""))
    # Claimed isolated joins are a milestone too (seed 004 V1.9: "其结果摘要必须进入
    # 跨 context window 的安全里程碑"): their results survive any compaction.
    for join in joins:
        children = "; ".join(
            f"{child['template']}: {child['status']}" + (f": {child['summary']}" if child["summary"] else "")
            for child in join["children"]
        )
        lines.append(
            f"claimed isolated group {join['group_id']} (join {join['delivery_id']}): {children};"
            " no need to query it again"
        )
    # The current completion conditions: what every feature holds the final reply for
    # (receipts not claimed, children, sessions, the plan, a goal, evidence).
    holding = features.finalize_blockers(ledger, run_id)
    if pending and not holding:
        holding = [f"{pending} pending receipt(s) to be claimed"]
    for reason in holding[:MAX_CONDITIONS]:
        lines.append(f"your final reply waits for: {summarize(reason, CONDITION_CHARS)}")
    if len(holding) > MAX_CONDITIONS:
        lines.append(f"... and {len(holding) - MAX_CONDITIONS} more")
    if not holding:
        lines.append("nothing holds your final reply now")
    return "\n".join(lines)

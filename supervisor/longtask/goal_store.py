"""Goal mode (seed 004 V1.18): a run bound to a goal, finished only on the model's
own verdict that the goal is met, with evidence.

The goal is the run's first task and stays in its options; a user's steers refine
it. Before the final reply the run needs a ``goal.verdict`` (recorded once per
action id) that says *met*, gives evidence, and is newer than the last steer.
Otherwise the final reply is blocked and the refusal, a repair on the next loop,
asks the model for that verdict: the same runner, the same run.
"""

from __future__ import annotations

import json
import time
from typing import Any

from corral.supervisor.ledger.port import Ledger

MAX_GOAL_CHARS = 4000
MAX_EVIDENCE_CHARS = 4000


def goal_of(ledger: Ledger, run_id: str) -> str | None:
    row = ledger.one("SELECT options FROM runs WHERE run_id = ?", run_id)
    if row is None:
        return None
    goal = json.loads(row["options"]).get("goal")
    return str(goal["text"]) if isinstance(goal, dict) and "text" in goal else None


def record_verdict(ledger: Ledger, run_id: str, action_id: str, met: bool, evidence: str) -> dict[str, Any]:
    with ledger.tx() as db:
        done = db.execute("SELECT * FROM goal_verdicts WHERE action_id = ?", (action_id,)).fetchone()
        if done is None:
            db.execute(
                "INSERT INTO goal_verdicts (action_id, run_id, met, evidence, created_at) VALUES (?, ?, ?, ?, ?)",
                (action_id, run_id, int(met), evidence, time.time()),
            )
            ledger.event("goal-verdict", run_id, met=met)
            done = db.execute("SELECT * FROM goal_verdicts WHERE action_id = ?", (action_id,)).fetchone()
    return _verdict(done)


def _verdict(row: Any) -> dict[str, Any]:
    return {"action_id": row["action_id"], "met": bool(row["met"]), "evidence": row["evidence"],
            "at": row["created_at"]}


def verdicts(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    rows = ledger.all("SELECT * FROM goal_verdicts WHERE run_id = ? ORDER BY created_at, rowid", run_id)
    return [_verdict(row) for row in rows]


def refinements(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """The user's steers of a goal run: they refine the goal."""
    rows = ledger.all("SELECT text, created_at, applied_at FROM steers WHERE run_id = ? ORDER BY created_at", run_id)
    return [dict(row) for row in rows]


def blockers(ledger: Ledger, run_id: str) -> list[str]:
    goal = goal_of(ledger, run_id)
    if goal is None:
        return []
    found = verdicts(ledger, run_id)
    if not found:
        return [f"this run has a goal ({goal[:120]!r}): judge it first with goal.verdict (met, evidence)"]
    latest = found[-1]
    refined = [r for r in refinements(ledger, run_id) if r["created_at"] > latest["at"]]
    if refined:
        return ["the user refined the goal after your last verdict: judge it again with goal.verdict"]
    if not latest["met"]:
        return [f"your last goal verdict says the goal is not met ({latest['evidence'][:120]!r})"]
    return []


def status(ledger: Ledger, run_id: str) -> dict[str, Any]:
    from corral.supervisor.longtask import plan_store

    row = ledger.one("SELECT status FROM runs WHERE run_id = ?", run_id)
    return {
        "run_id": run_id,
        "status": row["status"] if row else None,
        "goal": goal_of(ledger, run_id),
        "refinements": refinements(ledger, run_id),
        "plan": plan_store.current(ledger, run_id),
        "verdicts": verdicts(ledger, run_id),
        "blockers": blockers(ledger, run_id),
    }

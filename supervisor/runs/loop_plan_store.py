"""Ledger operations of a run's loop plans: the plan parsed from each loop's
provider response (committed once), a response that did not parse (a bounded
repair), and a final reply the ledger cannot accept yet (a repair too).

A run's durable step list (an answer's ``planUpdate``, applied as its plan commits
through the plan feature's hook) is another thing: supervisor/longtask/plan_store.py.
Every function here is one transaction (or a read) on the ledger.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from corral.core.redact import redact, summarize
from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.runs.run_store import RunLimits, add_observation, get_run, set_run_status


def _now() -> float:
    return time.time()


def commit_plan(
    ledger: Ledger,
    run_id: str,
    loop_index: int,
    slot: str,
    plan: dict[str, Any],
    *,
    withhold_response: str | None = None,
    raw_sha256: str | None = None,
    shown: Any = None,
) -> dict[str, Any]:
    """Commit the parsed plan of a loop step (once). Returns the plan as stored
    (redacted; ``raw_sha256`` names the raw copy in the private spool).
    ``withhold_response`` replaces the raw response in the same transaction (it
    carried input that the plan now holds sealed). ``shown``: ``redact(plan)`` when
    the caller computed it already."""
    text = dumps(redact(plan) if shown is None else shown)
    with ledger.tx() as db:
        # Inserted unless the loop has its plan already (a replay): the one written
        # first stands, and is read back only then.
        if not db.execute(
            "INSERT OR IGNORE INTO plans (run_id, loop_index, plan, raw_sha256, created_at) VALUES (?, ?, ?, ?, ?)",
            (run_id, loop_index, text, raw_sha256, _now()),
        ).rowcount:
            existing = db.execute(
                "SELECT plan FROM plans WHERE run_id = ? AND loop_index = ?", (run_id, loop_index)
            ).fetchone()
            stored: dict[str, Any] = json.loads(existing["plan"])
            return stored
        ledger.plan_written(run_id, loop_index, text, raw_sha256)
        db.execute("UPDATE provider_requests SET consumed = 1 WHERE slot = ?", (slot,))
        if withhold_response is not None:
            db.execute("UPDATE provider_requests SET response = ? WHERE slot = ?", (withhold_response, slot))
        normalized = audited(plan.get("normalized"))
        if normalized:
            # Seed 004 V1.33: what parsing dropped, by kind, count, characters and SHA-256; no text.
            ledger.emit("response-normalized", run_id, slot=slot, loop=loop_index, normalized=normalized)
        ledger.emit(
            "plan-committed",
            run_id,
            loop=loop_index,
            actions=len(plan.get("actions", [])),
            final=plan.get("final") is not None,
        )
    ledger.failpoint("plan.after-commit")
    result: dict[str, Any] = json.loads(text)
    return result


_NORMALIZATION_KINDS = ("complete-think-block", "planner-commentary")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def audited(items: Any) -> list[dict[str, Any]]:
    """A plan's normalization audit as the agent sent it, kept only in its fixed
    shape (a kind of the seed's two, counts, a SHA-256): nothing else gets into the
    event, whatever the agent sent."""
    kept: list[dict[str, Any]] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict) or item.get("kind") not in _NORMALIZATION_KINDS:
            continue
        count, chars, digest = item.get("count"), item.get("chars"), item.get("sha256")
        if (isinstance(count, int) and isinstance(chars, int) and isinstance(digest, str)
                and _SHA256.fullmatch(digest)):
            kept.append({"kind": item["kind"], "count": count, "chars": chars, "sha256": digest})
    return kept


def detail_audit(detail: str) -> dict[str, Any]:
    """What a public record keeps of a refusal's detail: its SHA-256 and length."""
    return {"detail_sha256": hashlib.sha256(detail.encode()).hexdigest(), "detail_chars": len(detail)}


#: A conflict in the local catalog (seed 004 V1.33: "catalog-binding 属于本地目录冲突，
#: 必须直接失败，不能重问 Provider"): no repair, the run fails at once.
CATALOG_BINDING = "catalog-binding"


def plan_invalid(
    ledger: Ledger,
    run_id: str,
    loop_index: int,
    slot: str,
    category: str,
    detail: str,
    limits: RunLimits,
    features: RunFeatures,
    *,
    rule: str = "",
) -> dict[str, Any]:
    """A response that did not parse: a bounded repair, or the run fails clearly.
    ``category``: one of seed 004's eight repair categories (V1.33); ``rule``: the
    guard's own name for the rule, when a guard refused the plan."""
    with ledger.tx() as db:
        run = get_run(ledger, run_id)
        repairs: dict[str, int] = json.loads(run["repairs"])
        total = sum(repairs.values())
        repairs[category] = repairs.get(category, 0) + 1
        db.execute("UPDATE runs SET repairs = ? WHERE run_id = ?", (dumps(repairs), run_id))
        db.execute("UPDATE provider_requests SET consumed = 2 WHERE slot = ?", (slot,))
        named = {"rule": rule} if rule else {}
        # Public: the category, the rule, the counts and the detail's hash, never its text
        # (seed 004 V1.17: "原始模型正文、解析错误、function arguments 或调用体不得进入 event、task
        # 或 Agent DB 公共审计"; V1.33: "只保存类别、计数和既有哈希"). The text goes only to the
        # model, in the repair observation below.
        ledger.emit("plan-invalid", run_id, slot=slot, category=category, repairs=total + 1, **named,
                    **detail_audit(detail))
        if total >= limits.max_repairs or category == CATALOG_BINDING:
            why = f"the {category} refusal ended it" if category == CATALOG_BINDING else (
                f"{total + 1} repairs, the last {category}; max_repairs is {limits.max_repairs}")
            set_run_status(ledger, run_id, RunStatus.FAILED, features,
                           f"invalid plan from the provider ({category}): {why}")
            return {"repair": False}
        add_observation(
            ledger,
            run_id,
            f"repair:{slot}",
            loop_index,
            {"role": "repair", "category": category, **named, "detail": summarize(detail, 300)},
        )
    return {"repair": True}


FINAL_BLOCKED_CATEGORY = "plan-semantics"


def final_blocked(
    ledger: Ledger, run_id: str, reasons: list[str], limits: RunLimits, features: RunFeatures
) -> dict[str, Any]:
    """A final reply the ledger cannot accept yet (an unclaimed receipt, a live
    session...). Retrying the same plan would spin, so the refusal goes back to the
    provider as a repair on the next loop; past the repair budget the run fails."""
    detail = summarize("; ".join(reasons), 300)
    with ledger.tx() as db:
        run = get_run(ledger, run_id)
        loop = int(run["loop_index"])
        repairs: dict[str, int] = json.loads(run["repairs"])
        total = sum(repairs.values())
        # Seed 004's category for it (V1.33); the event and the observation name the rule.
        repairs[FINAL_BLOCKED_CATEGORY] = repairs.get(FINAL_BLOCKED_CATEGORY, 0) + 1
        db.execute("UPDATE runs SET repairs = ? WHERE run_id = ?", (dumps(repairs), run_id))
        ledger.emit("final-blocked", run_id, loop=loop, detail=detail)
        if total >= limits.max_repairs:
            set_run_status(ledger, run_id, RunStatus.FAILED, features, f"final reply blocked: {detail}")
            return {"status": "failed", "reasons": reasons}
        add_observation(
            ledger,
            run_id,
            f"final-blocked:{run_id}:{loop}",
            loop,
            {
                "role": "repair",
                "category": FINAL_BLOCKED_CATEGORY,
                "rule": "final-blocked",
                "detail": f"your final reply was refused: {detail}. Resolve these first (claim deliveries with"
                " agent.run_status, finish or terminate processes), then reply.",
            },
        )
        db.execute(
            "UPDATE runs SET loop_index = loop_index + 1, updated_at = ? WHERE run_id = ? AND loop_index = ?",
            (_now(), run_id, loop),
        )
        ledger.emit("loop-advanced", run_id, loop=loop + 1)
    return {"status": "blocked", "reasons": reasons}


def plan_raw_sha256(ledger: Ledger, run_id: str, loop_index: int) -> str | None:
    committed = ledger.committed_plan(run_id, loop_index)
    return None if committed is None else committed[1]


def get_plan(ledger: Ledger, run_id: str, loop_index: int) -> dict[str, Any] | None:
    committed = ledger.committed_plan(run_id, loop_index)
    return None if committed is None else dict(json.loads(committed[0]))

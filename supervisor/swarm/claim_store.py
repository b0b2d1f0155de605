"""Claims in the ledger: a parent run takes its ready deliveries (joins and
delegation receipts), all or nothing, in a stable order, through a journal
(prepared, committed, observed) that recovery can finish.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from corral.core.redact import summarize
from corral.supervisor.errors import BadRequest, Refused
from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.runs.run_store import MAX_RESULT_CHARS
from corral.supervisor.swarm.delegation_store import contracts_directory
from corral.supervisor.swarm.parent_work import open_work
from corral.supervisor.swarm.swarm_state import ClaimPhase, DeliveryStatus, check_claim, check_delivery, sha

#: What one claim's deliveries may take in its observation, as JSON characters. The
#: observation keeps MAX_RESULT_CHARS (64 KiB) whole, past which it is cut to a
#: preview; the claimed deliveries come first in it, and the rest (the open count,
#: the directory of claimed contracts) keeps the other 16 KiB.
CLAIM_OBSERVATION_CHARS = MAX_RESULT_CHARS - 16 * 1024
#: The earlier claimed joins a later query lists (the newest), and the characters of
#: each child's summary in them: within the 16 KiB the claimed deliveries leave.
MAX_LISTED_JOINS = 8
MAX_LISTED_CHILDREN = 16
JOIN_SUMMARY_CHARS = 160
CLAIMED_JOINS_CHARS = 8 * 1024


#: Asked before a parent's first new claim is written, with the number of ready
#: isolated groups (joins) it would take: why it must wait, or None.
FirstClaimCheck = Callable[[int], "str | None"]


def claim(ledger: Ledger, parent_run_id: str, action_id: str, delivery_ids: list[str] | None,
          first_claim: FirstClaimCheck | None = None) -> dict[str, Any]:
    """Claim ready deliveries for the parent, all-or-nothing in a stable order.
    ``first_claim``: the collaboration policy's gate on the parent's first new claim
    (seed 004 V1.37); a claim being recovered or replayed (its journal exists) and
    any later claim pass without it."""
    journal = ledger.one("SELECT * FROM claim_journal WHERE action_id = ?", action_id)
    if journal is None:
        if delivery_ids is None:
            rows = ledger.all(
                "SELECT delivery_id FROM deliveries WHERE parent_run_id = ? AND status = 'dispatched'"
                " ORDER BY created_at, delivery_id",
                parent_run_id,
            )
            targets = [row["delivery_id"] for row in rows]
        else:
            targets = sorted(set(delivery_ids))
            for delivery_id in targets:
                row = ledger.one("SELECT * FROM deliveries WHERE delivery_id = ?", delivery_id)
                if row is None or row["parent_run_id"] != parent_run_id:
                    raise BadRequest(f"no delivery {delivery_id!r} for this run")
                if row["status"] != DeliveryStatus.DISPATCHED:
                    raise Refused(
                        f"delivery {delivery_id} is already {row['status']} (by {row['claimed_by_action_id']})",
                        code="already-claimed",
                    )
        # Before any mutation: only what the observation holds whole (seed 004 V1.35).
        targets = fitting_prefix(ledger, targets, named=delivery_ids is not None)
        if not targets:
            return {"claim_id": None, "claimed": [], "open": open_work(ledger, parent_run_id),
                    "claimed_isolated_joins": claimed_joins(ledger, parent_run_id)}
        if first_claim is not None and _first(ledger, parent_run_id):
            why = first_claim(_joins(ledger, targets))
            if why is not None:  # before the journal and any delivery moves
                raise Refused(why, code="collaboration-policy")
        claim_id = "clm-" + sha(action_id)[:20]
        with ledger.tx() as db:
            db.execute(
                "INSERT INTO claim_journal (claim_id, parent_run_id, action_id, delivery_ids, phase, created_at,"
                " updated_at) VALUES (?, ?, ?, ?, 'prepared', ?, ?)",
                (claim_id, parent_run_id, action_id, dumps(targets), time.time(), time.time()),
            )
            ledger.event("claim-prepared", claim_id, action=action_id, deliveries=len(targets))
        ledger.failpoint("claim.after-prepared")
        journal = ledger.one("SELECT * FROM claim_journal WHERE action_id = ?", action_id)
        assert journal is not None
    if journal["phase"] == ClaimPhase.PREPARED:
        commit_claim(ledger, journal["claim_id"])
        ledger.failpoint("claim.after-commit")
    return claimed_view(ledger, journal["claim_id"])


def _first(ledger: Ledger, parent_run_id: str) -> bool:
    """No claim of the parent's exists yet, journaled or (from before the journal) not."""
    return ledger.one(
        "SELECT 1 AS x FROM claim_journal WHERE parent_run_id = ? UNION ALL SELECT 1 AS x FROM deliveries"
        " WHERE parent_run_id = ? AND status != 'dispatched' LIMIT 1", parent_run_id, parent_run_id) is None


def _joins(ledger: Ledger, targets: list[str]) -> int:
    """How many of the deliveries are isolated groups' joins."""
    row = ledger.one(f"SELECT COUNT(*) AS n FROM deliveries WHERE kind = 'join' AND delivery_id IN"
                     f" ({','.join('?' * len(targets))})", *targets)
    return int(row["n"]) if row else 0


def fitting_prefix(ledger: Ledger, targets: list[str], *, named: bool) -> list[str]:
    """The ordered prefix of ``targets`` whose claimed views fit one observation
    whole (``CLAIM_OBSERVATION_CHARS``): the rest stay ready for the next claim
    ("只认领能够完整放入本轮 ... 私有观察预算的有序前缀"). Refused, before any claim
    mutation, when the first alone does not fit ("单个 group 已超过完整观察上限时在任何
    claim mutation 前失败关闭"), or when deliveries the model named together do not."""
    taken: list[str] = []
    used = 0
    for delivery_id in targets:
        row = ledger.one("SELECT kind, payload FROM deliveries WHERE delivery_id = ?", delivery_id)
        assert row is not None
        size = len(dumps({"delivery_id": delivery_id, "kind": row["kind"], **json.loads(row["payload"])}))
        if used + size > CLAIM_OBSERVATION_CHARS:
            if not taken:
                raise Refused(
                    f"delivery {delivery_id}'s result is {size} characters; one claim's observation holds at most"
                    f" {CLAIM_OBSERVATION_CHARS} whole, so it cannot be claimed (nothing was claimed)",
                    code="too-large",
                )
            if named:
                raise Refused(
                    f"the named deliveries' results are more than one observation holds whole"
                    f" ({CLAIM_OBSERVATION_CHARS} characters): name fewer (nothing was claimed)",
                    code="too-large",
                )
            break
        taken.append(delivery_id)
        used += size
    return taken


def commit_claim(ledger: Ledger, claim_id: str) -> None:
    with ledger.tx() as db:
        journal = db.execute("SELECT * FROM claim_journal WHERE claim_id = ?", (claim_id,)).fetchone()
        check_claim(ClaimPhase(journal["phase"]), ClaimPhase.COMMITTED)
        for delivery_id in json.loads(journal["delivery_ids"]):
            row = db.execute("SELECT * FROM deliveries WHERE delivery_id = ?", (delivery_id,)).fetchone()
            if row["status"] != DeliveryStatus.DISPATCHED:
                # All or nothing: one lost race aborts the whole claim (rollback).
                raise Refused(
                    f"delivery {delivery_id} was claimed by {row['claimed_by_action_id']}", code="already-claimed"
                )
            check_delivery(DeliveryStatus(row["status"]), DeliveryStatus.CLAIMED)
            db.execute(
                "UPDATE deliveries SET status = 'claimed-by-parent', claimed_by_action_id = ?, claim_id = ?,"
                " claimed_at = ? WHERE delivery_id = ?",
                (journal["action_id"], claim_id, time.time(), delivery_id),
            )
        db.execute(
            "UPDATE claim_journal SET phase = 'committed', updated_at = ? WHERE claim_id = ?",
            (time.time(), claim_id),
        )
        ledger.event("claim-committed", claim_id, action=journal["action_id"])


def claimed_view(ledger: Ledger, claim_id: str) -> dict[str, Any]:
    journal = ledger.one("SELECT * FROM claim_journal WHERE claim_id = ?", claim_id)
    assert journal is not None
    ids = json.loads(journal["delivery_ids"])
    rows = {
        row["delivery_id"]: row
        for row in ledger.all(f"SELECT * FROM deliveries WHERE delivery_id IN ({','.join('?' * len(ids))})", *ids)
    }
    claimed = [{"delivery_id": i, "kind": rows[i]["kind"], **json.loads(rows[i]["payload"])} for i in ids]
    return {"claim_id": claim_id, "claimed": claimed, "open": open_work(ledger, journal["parent_run_id"]),
            "claimed_delegate_contracts": contracts_directory(ledger, journal["parent_run_id"]),
            "claimed_isolated_joins": claimed_joins(ledger, journal["parent_run_id"], but=claim_id)}


def claimed_joins(ledger: Ledger, parent_run_id: str, but: str | None = None) -> list[dict[str, Any]]:
    """The isolated groups' joins this run claimed earlier (``but``: not by this
    claim), a stable summary of each (seed 004 V1.9: "后续查询返回
    claimedIsolatedJoins 和稳定认领摘要，明确同一组无需再查"): the group, the action
    that claimed it and each child's template, status and summary, oldest first.
    The same rows give the same summary on every later query. Bounded: the newest
    ``MAX_LISTED_JOINS``, each child's summary cut to ``JOIN_SUMMARY_CHARS``."""
    rows = ledger.all(
        "SELECT delivery_id, source_id, claimed_by_action_id, claim_id, payload FROM deliveries"
        " WHERE parent_run_id = ? AND kind = 'join' AND status = 'claimed-by-parent'"
        " ORDER BY claimed_at DESC, delivery_id DESC LIMIT ?",
        parent_run_id, MAX_LISTED_JOINS,
    )
    joins: list[dict[str, Any]] = []
    used = 0
    for row in rows:  # newest first, so the budget keeps the newest
        if row["claim_id"] == but:
            continue
        results = json.loads(row["payload"]).get("results") or []
        join = {
            "group_id": row["source_id"],
            "delivery_id": row["delivery_id"],
            "claimed_by_action_id": row["claimed_by_action_id"],
            "children": [
                {"instance_id": r.get("instance_id"), "template": r.get("template"), "status": r.get("status"),
                 "summary": summarize(str(r.get("summary") or r.get("error") or ""), JOIN_SUMMARY_CHARS)}
                for r in results[:MAX_LISTED_CHILDREN]
            ],
            "more_children": max(0, len(results) - MAX_LISTED_CHILDREN),
            "note": "claimed already by this run: no need to query this group again",
        }
        used += len(dumps(join))
        if used > CLAIMED_JOINS_CHARS:
            break
        joins.append(join)
    return joins[::-1]


def observe_claim(ledger: Ledger, action_id: str) -> None:
    """The claim's observation reached the parent's context (its receipt was written)."""
    with ledger.tx() as db:
        journal = db.execute("SELECT * FROM claim_journal WHERE action_id = ?", (action_id,)).fetchone()
        if journal is None or journal["phase"] != ClaimPhase.COMMITTED:
            return
        db.execute(
            "UPDATE claim_journal SET phase = 'observed', updated_at = ? WHERE claim_id = ?",
            (time.time(), journal["claim_id"]),
        )
        ledger.event("claim-observed", journal["claim_id"], action=action_id)

"""Invariants checked from persisted evidence only: the ledger (read-only) and the
external effects file that ``effect.record`` (and any tool that reports its effects)
appends to. Never process memory."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.supervisor.ledger.port import Ledger


@dataclass
class Check:
    name: str
    #: What ``count`` counts ("effects", "runs", ...): the report says how many of what.
    unit: str = "items"
    passed: bool = True
    count: int = 0
    failures: list[str] = field(default_factory=list)
    #: The count split by where it came from (the effects row: by tool), when that helps
    #: a reader see whose things were checked.
    breakdown: Counter[str] = field(default_factory=Counter)

    def fail(self, message: str) -> None:
        self.passed = False
        if len(self.failures) < 20:
            self.failures.append(message)

    @property
    def exercised(self) -> bool:
        """A check that looked at nothing proves nothing: it is not a pass."""
        return self.count > 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "passed": self.passed,
            "exercised": self.exercised,
            "count": self.count,
            "breakdown": dict(self.breakdown),
            "failures": self.failures,
        }


def _rows(db: sqlite3.Connection, sql: str, *args: Any) -> list[sqlite3.Row]:
    return list(db.execute(sql, args).fetchall())


def read_effects(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line from a kill mid-write is not an execution record
    return out


def check_all(
    ledger_path: Path | Ledger,
    effects_path: Path,
    *,
    secrets: tuple[str, ...] = (),
    scan_paths: tuple[Path, ...] = (),
) -> list[Check]:
    """``ledger_path``: an SQLite ledger file, or an open ledger of any backend (a
    PostgreSQL partition); the caller closes what it opened."""
    if isinstance(ledger_path, Ledger):
        return _checks(ledger_path.db, effects_path)
    db = sqlite3.connect(f"file:{ledger_path}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        checks = _checks(db, effects_path)
    finally:
        db.close()
    if secrets:
        checks.append(no_secrets(secrets, (ledger_path, *_siblings(ledger_path), *scan_paths)))
    return checks


def check_rows(db: Any, effects_path: Path) -> list[Check]:
    """The checks on any connection whose ``execute(sql, params).fetchall()`` gives
    rows by column name: one partition, or every partition of a cluster at once."""
    return _checks(db, effects_path)


def _checks(db: Any, effects_path: Path) -> list[Check]:
    return [
        _effects_at_most_once(db, read_effects(effects_path)),
        _one_receipt_per_terminal_action(db),
        _claims(db),
        _one_final_reply(db),
        _no_run_lost(db),
        _no_duplicates(db),
    ]


def _siblings(ledger_path: Path) -> list[Path]:
    return [p for p in (Path(f"{ledger_path}-wal"), Path(f"{ledger_path}-shm")) if p.exists()]


def _effects_at_most_once(db: sqlite3.Connection, effects: list[dict[str, Any]]) -> Check:
    """Every external effect of every tool that ran: the evidence lines a tool reports
    (``effect.record``, MCP servers and user tools that write the effects file), and
    every external action the ledger committed ``executing`` for, whether or not its
    tool reports evidence (a user's own tool usually does not). ``rerunnable = 0``
    is how the ledger marks an external tool: recovery may never run it again."""
    check = Check("side effect at most once, never before executing", "effects")
    actions = {row["action_id"]: row for row in _rows(db, "SELECT * FROM actions")}
    counts = Counter(e["action_id"] for e in effects)
    check.count = len(effects)
    for effect in effects:
        action = actions.get(effect["action_id"])
        check.breakdown[action["tool"] if action is not None else str(effect.get("tool", "unknown"))] += 1
    for action_id, n in counts.items():
        if n > 1:
            check.fail(f"{action_id} executed {n} times")
    for effect in effects:
        action = actions.get(effect["action_id"])
        if action is None:
            check.fail(f"effect of {effect['action_id']} has no action in the ledger")
            continue
        if action["executing_at"] is None or effect["at"] < action["executing_at"]:
            check.fail(
                f"{effect['action_id']}: side effect at {effect['at']:.6f} before executing was"
                f" committed ({action['executing_at']})"
            )
        if action["phase"] in ("prepared", "waiting-confirmation", "approved", "denied"):
            check.fail(f"{effect['action_id']} ran but the ledger says {action['phase']}")
    # Tools seen reporting evidence in this episode: an ok external action of one of
    # them must have exactly one line (unless a person reconciled it).
    reporting = {"effect.record"} | {actions[a]["tool"] for a in counts if a in actions}
    for action_id, action in actions.items():
        if action["rerunnable"] or (action["executing_at"] is None and action["phase"] != "ok"):
            continue
        if action_id not in counts:  # checked by its ledger records alone
            check.count += 1
            check.breakdown[action["tool"]] += 1
        if action["executing_at"] is None:
            check.fail(f"{action_id} ({action['tool']}) is ok but executing was never committed")
        if action["attempts"] > 1:
            check.fail(f"{action_id} ({action['tool']}) executing committed {action['attempts']} times")
        if (
            action["tool"] in reporting
            and action["phase"] == "ok"
            and counts[action_id] != 1
            and not (action["reason"] or "").startswith("reconciled")
        ):
            check.fail(f"{action_id} is ok in the ledger but ran {counts[action_id]} times")
    return check


def _one_receipt_per_terminal_action(db: sqlite3.Connection) -> Check:
    check = Check("one receipt per terminal action", "receipts")
    receipts = Counter(row["action_id"] for row in _rows(db, "SELECT action_id FROM receipts"))
    check.count = sum(receipts.values())
    for action_id, n in receipts.items():
        if n != 1:
            check.fail(f"{action_id} has {n} receipts")
    for row in _rows(db, "SELECT action_id, phase FROM actions"):
        terminal = row["phase"] in ("ok", "failed", "denied")
        if terminal and receipts[row["action_id"]] != 1:
            check.fail(f"terminal action {row['action_id']} has {receipts[row['action_id']]} receipts")
        if not terminal and receipts[row["action_id"]]:
            check.fail(f"{row['phase']} action {row['action_id']} already has a receipt")
    return check


def _claims(db: sqlite3.Connection) -> Check:
    check = Check("each delivery claimed at most once, observed before the reply", "claims")
    journals = _rows(db, "SELECT * FROM claim_journal")
    check.count = len(journals)
    claimed_in: Counter[str] = Counter()
    for journal in journals:
        for delivery_id in json.loads(journal["delivery_ids"]):
            if journal["phase"] != "prepared":
                claimed_in[delivery_id] += 1
    for delivery_id, n in claimed_in.items():
        if n > 1:
            check.fail(f"delivery {delivery_id} claimed by {n} claims")
    for row in _rows(db, "SELECT * FROM deliveries WHERE status = 'claimed-by-parent'"):
        if not row["claimed_by_action_id"]:
            check.fail(f"delivery {row['delivery_id']} claimed without claimed_by_action_id")
    for reply in _rows(db, "SELECT run_id, created_at FROM replies"):
        for journal in _rows(db, "SELECT * FROM claim_journal WHERE parent_run_id = ?", reply["run_id"]):
            if journal["phase"] != "observed" or journal["updated_at"] > reply["created_at"]:
                check.fail(f"claim {journal['claim_id']} not observed before the reply of {reply['run_id']}")
        open_deliveries = _rows(
            db,
            "SELECT delivery_id FROM deliveries WHERE parent_run_id = ? AND status = 'dispatched'",
            reply["run_id"],
        )
        for row in open_deliveries:
            check.fail(f"{reply['run_id']} replied with delivery {row['delivery_id']} unclaimed")
    return check


def _one_final_reply(db: sqlite3.Connection) -> Check:
    check = Check("exactly one final reply per completed root run", "replies")
    replies = Counter(row["run_id"] for row in _rows(db, "SELECT run_id FROM replies"))
    check.count = sum(replies.values())
    for run in _rows(db, "SELECT run_id, status, kind FROM runs"):
        n = replies[run["run_id"]]
        if run["kind"] == "root" and run["status"] == "completed" and n != 1:
            check.fail(f"completed run {run['run_id']} has {n} replies")
        if run["status"] != "completed" and n:
            check.fail(f"{run['status']} run {run['run_id']} has {n} replies")
        if run["kind"] != "root" and n:
            check.fail(f"{run['kind']} run {run['run_id']} wrote a final reply")
    return check


def _no_run_lost(db: sqlite3.Connection) -> Check:
    check = Check("no run lost (ended, or parked with a reason)", "runs")
    runs = _rows(db, "SELECT run_id, status, reason FROM runs")
    check.count = len(runs)
    for run in runs:
        if run["status"] in ("completed", "cancelled"):
            continue
        if run["status"] in ("failed", "needs-reconciliation"):
            if not run["reason"]:
                check.fail(f"{run['status']} run {run['run_id']} has no reason")
            continue
        check.fail(f"run {run['run_id']} left {run['status']}")
    return check


def _no_duplicates(db: sqlite3.Connection) -> Check:
    check = Check("no duplicate receipt, message, action or spawn", "events")
    events = _rows(db, "SELECT kind, subject FROM events")
    check.count = len(events)
    once = (
        # A receipt is announced by the terminal move it is committed with (or, when
        # a repair wrote it late, by ``receipt-written``): each at most once.
        "action-ok",
        "action-failed",
        "action-denied",
        "receipt-written",
        "reply-appended",
        "group-spawned",
        "delegated",
        "join-delivered",
        "delegation-receipt",
        "claim-committed",
        "claim-observed",
        "plan-committed-dup",
    )
    counts = Counter((e["kind"], e["subject"]) for e in events if e["kind"] in once)
    for (kind, subject), n in counts.items():
        if n > 1:
            check.fail(f"{kind} for {subject} recorded {n} times")
    groups = Counter(
        (row["parent_run_id"], row["request_digest"])
        for row in _rows(db, "SELECT parent_run_id, request_digest FROM isolated_groups")
    )
    for (run_id, _digest), n in groups.items():
        if n > 1:
            check.fail(f"{run_id} spawned the same children {n} times")
    observations = Counter(row["source"] for row in _rows(db, "SELECT source FROM observations"))
    for source, n in observations.items():
        if n > 1:
            check.fail(f"observation {source} recorded {n} times")
    return check


def no_secrets(secrets: tuple[str, ...], paths: tuple[Path, ...]) -> Check:
    check = Check("no secret in ledger, events, logs or report", "files")
    for path in paths:
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for file in files:
            try:
                data = file.read_bytes()
            except OSError:
                continue
            check.count += 1
            for secret in secrets:
                if secret.encode() in data:
                    check.fail(f"secret {secret[:4]}… found in {file}")
    return check

"""Ledger operations of runs: a run's row and status, the agent's claim on its
next run, and the run's observations (its history, in order).

A run's provider requests, loop plans and actions live in provider_store.py,
loop_plan_store.py and action_store.py; what the agent does next is derived from
all of them by next_step.py. Every function here is one transaction (or a read)
on the ledger: no processes, no network, so it is tested directly.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from corral.core import failpoints
from corral.core.redact import redact, redact_text, summarize
from corral.supervisor.errors import BadRequest, NotFound
from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import RunStatus, check_run_transition

MAX_RESULT_CHARS = 64 * 1024
#: What a run id looks like ("run-" and what create_run or a client chose).
RUN_ID = re.compile(r"^run-[a-z0-9-]{6,40}$")


@dataclass(frozen=True)
class RunLimits:
    """A run's budgets: repairs of invalid plans, and provider retries with backoff."""

    max_repairs: int = 2
    max_provider_retries: int = 3
    retry_base_s: float = 0.5
    retry_cap_s: float = 30.0


def _now() -> float:
    return time.time()


def bounded_json(value: Any, limit: int = MAX_RESULT_CHARS, *, redacted: bool = False) -> str:
    """A value as the ledger keeps it: redacted JSON, cut to a preview past ``limit``.
    ``redacted``: every string in ``value`` has been through the redaction already
    (it was read back from a column the ledger wrote redacted), so it is not again."""
    return bounded_json_cut(value if redacted else redact(value), limit)[0]


def bounded_json_cut(shown: Any, limit: int = MAX_RESULT_CHARS) -> tuple[str, bool]:
    """``bounded_json`` of a value already redacted, and whether it was cut to a preview."""
    text = dumps(shown)
    if len(text) > limit:
        return dumps({"truncated": True, "preview": text[: limit - 200]}), True
    return text, False




#: A task is stored and shown again (show, runs); bounded so replies fit a frame.
MAX_TASK_CHARS = 20_000


def create_run(
    ledger: Ledger,
    features: RunFeatures,
    *,
    agent_id: str,
    task: str,
    provider: str,
    provider_config: dict[str, Any],
    kind: str = "root",
    parent_run_id: str | None = None,
    root_run_id: str | None = None,
    depth: int = 0,
    options: dict[str, Any] | None = None,
    run_id: str | None = None,
    session_id: str | None = None,
    conversation_id: str | None = None,
) -> str:
    if not task.strip():
        raise BadRequest("task must not be empty")
    if len(task) > MAX_TASK_CHARS:
        raise BadRequest(f"task is longer than {MAX_TASK_CHARS} characters")
    run_id = run_id or "run-" + secrets.token_hex(6)
    options = dict(options or {})
    # A scripted provider's script is data the tools act on: the row shows it
    # redacted, and the agent gets the raw copy (see supervisor/runs/sealed_input.py).
    shown = redact(provider_config)
    raw_sha = features.keep_raw_copy(run_id, "provider-config", "config", provider_config, shown)
    if raw_sha is not None:
        options["provider_config_raw_sha256"] = raw_sha
    now = _now()
    with ledger.tx() as db:
        ledger.claim_run_id(run_id)  # unique across every partition of a cluster, committed with the run
        db.execute(
            "INSERT INTO runs (run_id, agent_id, session_id, kind, parent_run_id, root_run_id, depth, task,"
            " status, provider, provider_config, options, created_at, updated_at, conversation_id)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                agent_id,
                session_id or "sess-" + secrets.token_hex(6),
                kind,
                parent_run_id,
                root_run_id or run_id,
                depth,
                redact_text(task),
                provider,
                dumps(redact(provider_config)),
                dumps(options),
                now,
                now,
                conversation_id,
            ),
        )
        failpoints.hit("run.creating")  # another node may be given the same id meanwhile
        ledger.emit("run-created", run_id, agent=agent_id, run_kind=kind, task=summarize(task, 120))
    return run_id


@functools.lru_cache(maxsize=256)
def _parsed_options(text: str) -> Mapping[str, Any]:
    return MappingProxyType(json.loads(text))


def run_options(run: Any) -> Mapping[str, Any]:
    """The run's ``options`` column, parsed once per distinct text (read-only): every
    prepared action's policy, allow lists and guards read it, four to five times
    per action."""
    return _parsed_options(str(run["options"]))


def get_run(ledger: Ledger, run_id: str) -> sqlite3.Row:
    """The run's row; read again only once something wrote it (run_versions.py)."""
    row: sqlite3.Row | None = ledger.run_versions.row("runs", run_id, ledger)
    if row is None:
        row = ledger.one("SELECT * FROM runs WHERE run_id = ?", run_id)
        if row is None:
            raise NotFound(f"no run {run_id!r}")
        ledger.run_versions.keep_row("runs", run_id, row, ledger)
    return row


def set_run_status(
    ledger: Ledger, run_id: str, status: RunStatus, features: RunFeatures, reason: str | None = None
) -> bool:
    """Move a run; a no-op (False) when it is already there. Illegal moves raise.
    Each of ``features``' status hooks sees the move in its transaction."""
    with ledger.tx() as db:
        row = get_run(ledger, run_id)
        current = RunStatus(row["status"])
        if current is status:
            return False
        check_run_transition(current, status)
        now = _now()
        db.execute(
            "UPDATE runs SET status = ?, reason = ?, updated_at = ?,"
            " started_at = COALESCE(started_at, CASE WHEN ? = 'running' THEN ? END),"
            " ended_at = CASE WHEN ? IN ('completed', 'failed', 'cancelled') THEN ? ELSE ended_at END"
            " WHERE run_id = ?",
            (
                status.value,
                redact_text(reason) if reason else None,
                now,
                status.value,
                now,
                status.value,
                now,
                run_id,
            ),
        )
        ledger.emit("run-" + status.value, run_id, reason=reason or "", previous=current.value)
        for hook in features.on_status:
            hook(ledger, run_id, status, reason)
    return True


def claim_run(ledger: Ledger, agent_id: str, features: RunFeatures) -> sqlite3.Row | None:
    """The agent's lane: the oldest run it should work on now, moved to running.

    A run waiting for its provider retry gives the lane up (other agents run on) but
    keeps its place in its own agent's queue (seed 004 V1.39: "同 Agent 后续 pending
    task 仍被该 running task 阻挡，保持 FIFO"): no pending run of that agent starts
    before it ends."""
    row = ledger.one(
        "SELECT * FROM runs WHERE agent_id = ? AND status IN ('running', 'pending', 'waiting-for-provider-retry')"
        " ORDER BY CASE status WHEN 'running' THEN 0 WHEN 'waiting-for-provider-retry' THEN 1 ELSE 2 END,"
        " created_at LIMIT 1",
        agent_id,
    )
    if row is None or row["status"] == RunStatus.WAITING_FOR_PROVIDER_RETRY:
        return None
    if row["status"] == RunStatus.PENDING:
        set_run_status(ledger, row["run_id"], RunStatus.RUNNING, features)
        row = get_run(ledger, row["run_id"])
    return row


def history(ledger: Ledger, run_id: str, after: int = 0) -> list[dict[str, Any]]:
    """The run's observations in order; ``after``: only those past the first ``after``
    (observations are only ever appended, numbered 1, 2, ... per run)."""
    rows = ledger.all("SELECT data FROM observations WHERE run_id = ? AND seq > ? ORDER BY seq", run_id, after)
    return [json.loads(row["data"]) for row in rows]


def add_observation(
    ledger: Ledger, run_id: str, source: str, loop_index: int, data: dict[str, Any], *, redacted: bool = False
) -> None:
    """Append to the run's context once per source (an action id, a claim id...).
    ``redacted``: ``data`` is made of values already redacted (see ``bounded_json``).
    Nothing waits for its answer (no row count is read): on a PostgreSQL ledger it
    travels with the transaction's next round trip, its COMMIT at the latest, and a
    failure there still rolls the whole transaction back."""
    with ledger.tx() as db:
        # One statement: the next number, and nothing when the source has one already.
        db.execute(
            "INSERT OR IGNORE INTO observations (run_id, seq, source, loop_index, data, created_at)"
            " SELECT ?, COALESCE(MAX(seq), 0) + 1, ?, ?, ?, ? FROM observations WHERE run_id = ?",
            (run_id, source, loop_index, bounded_json(data, redacted=redacted), _now(), run_id),
        )

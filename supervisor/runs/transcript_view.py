"""A run's transcript as a person reads it (``corral transcript``, the dashboard's
conversation view, docs/transcripts.md): per provider turn, what the model was
sent (the system prompt, by content hash, shown once then "unchanged"; the tool
catalog; the history since the turn before), what it answered, what that became
(a plan's tool calls with their arguments and outcomes, or a repair and its
category), and the runs it started (children and delegates), linked by id.

Pure reads over one ledger: the supervisor's ``transcript`` control method and
the offline reader (corral/offline_read.py) answer with the same function.
Everything read here was redacted when it was written (one path:
corral/core/redact.py), so nothing is redacted again here: a long run's
transcript would stall the supervisor's loop for as long.
"""

from __future__ import annotations

import json
from typing import Any

from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.params import param_int, param_str
from corral.supervisor.runs.run_store import get_run

#: A page of turns of the control method stays well inside one frame (1 MiB):
#: a longer transcript is read in pages (``next_turn``), which the client joins.
PAGE_CHARS = 600 * 1024


def transcript(ledger: Ledger, run_id: str, *, turn: int | None = None, from_turn: int = 1,
               page_chars: int | None = None) -> dict[str, Any]:
    """The run's transcript: all its turns, or only turn ``turn`` (1-based; its
    system prompt then in full), from ``from_turn`` on, at most ``page_chars`` of
    them (at least one; ``next_turn`` says where the next page starts)."""
    run = get_run(ledger, run_id)
    turns = _turns(ledger, run_id)
    if turn is not None:
        if not 1 <= turn <= len(turns):
            have = f"turns 1 to {len(turns)}" if turns else "no provider turn yet"
            raise BadRequest(f"run {run_id} has {have}; there is no turn {turn}")
        chosen = turns[turn - 1]
        _full_texts(ledger, chosen)
        turns = [chosen]
    else:
        turns = turns[from_turn - 1:]
    next_turn = None
    if page_chars is not None:
        size = 0
        for index, entry in enumerate(turns):
            size += len(json.dumps(entry, default=str))
            if index and size > page_chars:
                next_turn, turns = entry["turn"], turns[:index]
                break
    reply = ledger.one("SELECT text FROM replies WHERE run_id = ?", run_id)
    shown: dict[str, Any] = {
        "run": {key: run[key] for key in ("run_id", "agent_id", "kind", "status", "reason", "task", "provider",
                                          "parent_run_id", "root_run_id")},
        "turns": turns,
        "children": _children(ledger, run_id),
        "final_reply": reply["text"] if reply else None,
        "next_turn": next_turn,
    }
    return shown


def control_params(params: dict[str, Any]) -> dict[str, Any]:
    """The ``transcript`` control method's parameters, checked."""
    turn = params.get("turn")
    return {
        "run_id": param_str(params, "run_id"),
        # Any integer: one out of range is refused by ``transcript`` itself, in the
        # same words as a read from the ledger.
        "turn": None if turn is None else param_int(params, "turn", low=-(10**9), high=10**9),
        "from_turn": param_int(params, "from_turn", 1, low=1, high=10**9),
    }


def _turns(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    # The planning turns; a compaction's summary request is no turn (its row and the
    # summary it stored are in ``corral show``: supervisor/longtask/compaction_requests.py).
    requests = ledger.all(
        "SELECT * FROM provider_requests WHERE run_id = ? AND request_kind = 'tool-plan' ORDER BY rowid", run_id
    )
    observations = [(int(row["seq"]), row["source"], json.loads(row["data"])) for row in ledger.all(
        "SELECT seq, source, data FROM observations WHERE run_id = ? ORDER BY seq", run_id)]
    repairs = {source.partition(":")[2]: data for _, source, data in observations if source.startswith("repair:")}
    plans = {int(row["loop_index"]): json.loads(row["plan"])
             for row in ledger.all("SELECT loop_index, plan FROM plans WHERE run_id = ?", run_id)}
    outcomes = _outcomes(ledger, run_id)
    shas = {row[column] for row in requests for column in ("system_sha256", "catalog_sha256") if row[column]}
    blobs = _blobs(ledger, shas)
    turns: list[dict[str, Any]] = []
    last_system = last_catalog = None
    seen_before = 0
    for number, row in enumerate(requests, start=1):
        loop = int(row["loop_index"])
        seen = row["history_seq"]
        delta = [] if seen is None else [
            {"seq": seq, **entry} for seq, _, entry in observations if seen_before < seq <= int(seen)]
        entry: dict[str, Any] = {
            "turn": number,
            "slot": row["slot"],
            "loop": loop,
            "attempt": int(row["attempt"]),
            "status": row["status"],
            "started_at": row["started_at"],
            "finished_at": row["finished_at"],
            "system": _text_ref(row["system_sha256"], last_system, blobs),
            "catalog": _catalog_ref(row["catalog_sha256"], last_catalog, blobs),
            "history_seq": seen,
            "reasoning_effort": row["reasoning_effort"],
            "web_search": None if row["web_search"] is None else bool(row["web_search"]),
            "history": delta,
            "response": row["response"],
            "said": said_text(row["response"]),
            "plan": None,
            "repair": None,
            "error": {"kind": row["error_kind"], "error": row["error"]} if row["status"] == "failed" else None,
        }
        if row["consumed"] == 1 and loop in plans:
            entry["plan"] = _plan_with_outcomes(plans[loop], outcomes.get(loop, {}))
        elif row["consumed"] == 2:
            entry["repair"] = repairs.get(row["slot"]) or {"role": "repair", "category": "unknown",
                                                          "detail": "the repair budget was spent: the run failed"}
        turns.append(entry)
        last_system = row["system_sha256"] or last_system
        last_catalog = row["catalog_sha256"] or last_catalog
        if seen is not None:
            seen_before = int(seen)
    return turns


def said_text(response: str | None) -> str | None:
    """What the model wrote, taken out of a chat-completion envelope: its message's
    content and tool calls. The raw response is kept beside it for ``--json``; a
    body that is not such an envelope is shown as it is."""
    if response is None:
        return None
    try:
        body = json.loads(response)
        message = body["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return response
    if not isinstance(message, dict):
        return response
    parts = [message["content"]] if isinstance(message.get("content"), str) and message["content"] else []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(f"tool call {function.get('name')}({function.get('arguments', '')})")
    return "\n".join(parts) if parts else response


def _blobs(ledger: Ledger, shas: set[str]) -> dict[str, dict[str, Any]]:
    if not shas:
        return {}
    marks = ",".join("?" * len(shas))
    rows = ledger.all(f"SELECT sha256, kind, text FROM transcript_blobs WHERE sha256 IN ({marks})", *sorted(shas))
    return {row["sha256"]: {"kind": row["kind"], "text": row["text"]} for row in rows}


def _text_ref(sha: str | None, last: str | None, blobs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """A turn's system prompt: its text where it changed, else marked unchanged."""
    if sha is None:
        return None
    blob = blobs.get(sha)
    unchanged = sha == last
    return {"sha256": sha, "unchanged": unchanged, "recorded": blob is not None,
            "text": None if unchanged or blob is None else blob["text"]}


def _catalog_ref(sha: str | None, last: str | None, blobs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    ref = _text_ref(sha, last, blobs)
    if ref is None:
        return None
    blob = blobs.get(sha or "")
    tools: list[str] = []
    if blob is not None:
        try:
            tools = [str(tool.get("name")) for tool in json.loads(blob["text"]) if isinstance(tool, dict)]
        except (ValueError, TypeError):
            tools = []  # a catalog cut at the cap is no longer JSON: its text says what it held
    return {**ref, "tools": tools}


def _full_texts(ledger: Ledger, entry: dict[str, Any]) -> None:
    """One turn shown alone: its system prompt and catalog in full, changed or not."""
    for key in ("system", "catalog"):
        ref = entry.get(key)
        if ref is not None and ref["text"] is None and ref["recorded"]:
            row = ledger.one("SELECT text FROM transcript_blobs WHERE sha256 = ?", ref["sha256"])
            ref["text"] = row["text"] if row is not None else None


def _outcomes(ledger: Ledger, run_id: str) -> dict[int, dict[int, dict[str, Any]]]:
    """Each loop's actions by index: how each call of its plan ended."""
    found: dict[int, dict[int, dict[str, Any]]] = {}
    for row in ledger.all(
        "SELECT action_id, loop_index, action_index, tool, phase, result, error, reason FROM actions"
        " WHERE run_id = ?", run_id):
        result = json.loads(row["result"]) if row["result"] else {}
        found.setdefault(int(row["loop_index"]), {})[int(row["action_index"])] = {
            "action_id": row["action_id"],
            "phase": row["phase"],
            "summary": result.get("summary") or row["error"] or row["reason"] or "",
            "traceback": result.get("traceback"),
        }
    return found


def _plan_with_outcomes(plan: dict[str, Any], outcomes: dict[int, dict[str, Any]]) -> dict[str, Any]:
    calls = [{"tool": call.get("tool"), "input": call.get("input"), "outcome": outcomes.get(index)}
             for index, call in enumerate(plan.get("actions") or [])]
    return {"actions": calls, "final": plan.get("final")}


def _children(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """The runs this run started: isolated children and delegates, with the action
    that started each (``corral transcript CHILD`` reads one)."""
    started_by: dict[str, tuple[str, str]] = {}
    for row in ledger.all("SELECT run_id, parent_action_id FROM delegations WHERE parent_run_id = ?", run_id):
        started_by[row["run_id"]] = ("delegate", row["parent_action_id"])
    for row in ledger.all(
        "SELECT c.run_id, g.parent_action_id FROM children c JOIN isolated_groups g ON g.group_id = c.group_id"
        " WHERE g.parent_run_id = ?", run_id):
        started_by[row["run_id"]] = ("child", row["parent_action_id"])
    return [
        {"run_id": row["run_id"], "agent_id": row["agent_id"], "status": row["status"],
         "via": started_by.get(row["run_id"], (row["kind"], None))[0],
         "action_id": started_by.get(row["run_id"], (row["kind"], None))[1], "task": row["task"]}
        for row in ledger.all(
            "SELECT run_id, agent_id, kind, status, task FROM runs WHERE parent_run_id = ? ORDER BY created_at",
            run_id)
    ]


async def control(ledger: Ledger, params: dict[str, Any]) -> dict[str, Any]:
    """The ``transcript`` control method: one page of a run's transcript."""
    return transcript(ledger, **control_params(params), page_chars=PAGE_CHARS)

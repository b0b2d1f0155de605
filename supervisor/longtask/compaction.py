"""Token-aware context compaction (seed 004 V1.21): what the model sees of a long
run, kept under the agent's token limits, while the ledger keeps everything.

Pure functions over a run's observations (``(seq, entry)``, oldest first) and its
latest compaction (a summary covering ``seq <= to_seq``):

* ``view``: the summary, then the later observations, each tool output over
  ``tool_output_token_limit`` cut, with where the full output is;
* ``plan``: when the view passes ``auto_compact_token_limit``, what to summarise:
  everything but the newest ``KEEP_RECENT`` observations (and the older summary).

The newest successful ``project.diff`` is protected (seed 004 V1.3: "最新内容 diff
…作为窗口压缩保护项"), and so is the newest successful ``agent.action_history``
(V1.9: "额外保护最新成功的 agent.action_history 原始 observation"): each is not cut
at the tool-output limit but kept up to its own size (``PROTECTED_CHARS``), never
folded into a summary, and stays in view right after the summary once older turns
are folded. So is the newest successful git diff (V1.4: "最新成功 Git diff 在 context
bundle 中按内容 diff 保护项最多保留 24,256 字符"): a ``project.git_inspect`` that carries
its diff, or a ``project.git_diff``, in a slot of its own, so a later git review never
displaces the content diff nor the other way round (V1.5: "两个独立保护槽"). A review
without a diff, or a failed one, is an ordinary observation and displaces nothing.

A summary is never a source of truth: the goal, the plan, permissions and side
effects are read from the ledger, not from it. Tokens are counted with the
model's own tokenizer when corral runs it (a local GGUF), else with a documented
estimate (``estimate_tokens``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from corral.actors.providers import observation_budget
from corral.actors.providers.observation_budget import budget_of, fit

#: The estimate: one token per 4 characters of the entry's JSON (English text and
#: JSON average 3.5-4.5 characters per token with the usual BPE vocabularies).
CHARS_PER_TOKEN = 4
#: The newest observations are never summarised: the model acts on them next (seed
#: 004 V1.21: at least the newest 4 as they are). A conversation's earlier messages
#: are never folded at all.
KEEP_RECENT = 4


#: What the protected latest content diff keeps (seed 004 V1.3: 24,256 characters).
PROTECTED_DIFF_CHARS = observation_budget.PROTECTED_DIFF_CHARS
DIFF_TOOL = "project.diff"
#: The protected latest history keeps what the tool gave (its receipts hold at most
#: 7,200 characters of detail, V1.6), with room for its envelope: protection keeps
#: it from being cut, it never makes the history longer (V1.9: "不扩大动作历史输出上限").
PROTECTED_HISTORY_CHARS = 8_192
HISTORY_TOOL = "agent.action_history"
#: The latest git diff keeps as much as the content diff (seed 004 V1.4: 24,256).
PROTECTED_GIT_DIFF_CHARS = observation_budget.PROTECTED_DIFF_CHARS
GIT_DIFF_SLOT = "git-diff"
#: Each protected tool's slot: the newest successful observation of each slot is kept.
SLOTS = {DIFF_TOOL: DIFF_TOOL, HISTORY_TOOL: HISTORY_TOOL, "project.git_inspect": GIT_DIFF_SLOT,
         "project.git_diff": GIT_DIFF_SLOT}
#: What each slot keeps.
PROTECTED_CHARS = {DIFF_TOOL: PROTECTED_DIFF_CHARS, HISTORY_TOOL: PROTECTED_HISTORY_CHARS,
                   GIT_DIFF_SLOT: PROTECTED_GIT_DIFF_CHARS}

Count = Callable[[Any], int]


def text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def estimate_tokens(value: Any) -> int:
    return math.ceil(len(text_of(value)) / CHARS_PER_TOKEN) + 1


def cut(entry: dict[str, Any], limit: int | None, count: Count = estimate_tokens) -> dict[str, Any]:
    """A tool observation whose output passes ``limit`` tokens, cut, with a pointer."""
    if not limit or "output" not in entry:
        return entry
    tokens = count(entry["output"])
    if tokens <= limit:
        return entry
    budget = budget_of(entry)
    if budget is not None:
        # A page or a diff is cut inside its text: its cursor and line fields stay.
        return {**entry, "output": fit(entry["output"], budget, limit * CHARS_PER_TOKEN, _pointer(entry))}
    text = entry["output"] if isinstance(entry["output"], str) else json.dumps(entry["output"], sort_keys=True)
    where = entry.get("action_id", "?")
    return {**entry, "output": text[: limit * CHARS_PER_TOKEN]
            + f" ... [cut: {tokens} tokens; the full output stays in the ledger: corral show, action {where}]"}


def _pointer(entry: dict[str, Any]) -> str:
    return f"; the full output stays in the ledger: corral show, action {entry.get('action_id', '?')}"


def slot_of(entry: dict[str, Any]) -> str | None:
    """The protection slot of a successful observation of a protected tool, with its
    output (a git review only with its diff), else None."""
    slot = SLOTS.get(entry.get("tool", ""))
    if slot is None or entry.get("status") != "ok" or "output" not in entry:
        return None
    if slot == GIT_DIFF_SLOT and not (isinstance(entry["output"], dict) and "diff" in entry["output"]):
        return None  # a status-only review holds no diff to keep
    return slot


def is_protectable(entry: dict[str, Any]) -> bool:
    return slot_of(entry) is not None


def is_steer(entry: dict[str, Any]) -> bool:
    """A person's instruction to the running run (seed 004 V1.13): never folded into a
    summary, whatever the limits ("永远不交给摘要模型改写"); every steer stays, in its
    order, where the model reads it."""
    return entry.get("role") == "user" and entry.get("kind") == "steer"


def protected_seqs(observations: list[tuple[int, dict[str, Any]]]) -> set[int]:
    """The seqs of the newest protectable observation of each slot."""
    newest: dict[str, int] = {}
    for seq, entry in observations:
        slot = slot_of(entry)
        if slot is not None:
            newest[slot] = int(seq)
    return set(newest.values())


def kept_whole(entry: dict[str, Any]) -> dict[str, Any]:
    """A protected observation: as it is, or cut at its slot's ``PROTECTED_CHARS``."""
    limit = PROTECTED_CHARS[SLOTS[entry["tool"]]]
    budget = budget_of(entry)
    if budget is not None:
        # Its files, checksums and flags whole; only its hunks are cut (and say so).
        return {**entry, "output": fit(entry["output"], budget, limit, _pointer(entry))}
    text = text_of(entry["output"])
    if len(text) <= limit:
        return entry
    where = entry.get("action_id", "?")
    return {**entry, "output": text[:limit]
            + f" ... [cut: {len(text)} characters; the full output stays in the ledger: corral show, action {where}]"}


def view(observations: list[tuple[int, dict[str, Any]]], compaction: dict[str, Any] | None,
         tool_output_limit: int | None, count: Count = estimate_tokens) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    after = 0
    protected = protected_seqs(observations)
    if compaction is not None:
        after = int(compaction["to_seq"])
        entries.append({"role": "summary", "text": compaction["summary"],
                        "covers": [int(compaction["from_seq"]), after]})
        # What the summary covers but never folds: the newest protected outputs and
        # every steer, oldest first.
        entries.extend(kept_whole(entry) if seq in protected else entry for seq, entry in observations
                       if seq <= after and (seq in protected or is_steer(entry)))
    entries.extend(kept_whole(entry) if seq in protected else cut(entry, tool_output_limit, count)
                   for seq, entry in observations if seq > after)
    return entries


def plan(observations: list[tuple[int, dict[str, Any]]], compaction: dict[str, Any] | None,
         limits: dict[str, Any], *, requested: bool = False, count: Count = estimate_tokens,
         overhead: int = 0) -> dict[str, Any] | None:
    """What to compact now (None: nothing): the request passes the limit (or a person
    asked), and more than ``KEEP_RECENT`` observations follow the last summary.
    ``count`` is the model's own tokenizer when it has one, else the estimate;
    ``overhead``: what every request carries besides the view (the task, the system
    prompt, the tool schemas: compaction_service.fixed_tokens)."""
    seen = view(observations, compaction, limits.get("tool_output"), count)
    tokens = sum(count(entry) for entry in seen) + overhead
    limit = limits.get("auto_compact")
    if not requested and (not limit or tokens <= limit):
        return None
    after = int(compaction["to_seq"]) if compaction is not None else 0
    tail = [seq for seq, _ in observations if seq > after]
    if len(tail) <= KEEP_RECENT:
        return None  # nothing old enough to fold in
    to_seq = tail[-KEEP_RECENT - 1]
    covered = [entry for entry in seen if entry.get("role") == "summary"]
    protected = protected_seqs(observations)
    covered += [cut(entry, limits.get("tool_output"), count) for seq, entry in observations
                if after < seq <= to_seq and seq not in protected and not is_steer(entry)]
    return {"from_seq": 1, "to_seq": to_seq, "entries": covered, "tokens_before": tokens}

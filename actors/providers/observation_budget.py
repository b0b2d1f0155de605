"""How much of one tool observation the model is sent, and where it is cut.

A tool whose output is a page of bulk text beside the fields the model needs to go on
(a cursor, a next line, a status) has a budget of its own, the seed's number for it
(seed 004): the newest content diff keeps 24,256 characters (V1.3: "在 128 KiB context
bundle 内最多保留 24,256 字符", and so does the newest git diff, V1.4); a
``process.poll`` page keeps its ``max_chars`` of output, at most 16,000 (V1.10); a
``command.output_read`` page keeps its lines (V1.8, the tool's own page bound). When
the bulk text is over what a view allows (a smaller ``cap``, an older diff, a
compaction's tool-output limit), the cut falls inside the bulk text only, with a
marker saying how much was cut; every other field (``next_cursor``, ``status``,
``more``, ``nextLine``, ``totalLines``, ``hasMore``, the checksums) reaches the model
whole. Any other tool's output is one text cut at ``DEFAULT_CHARS``.

Bulk text is counted in its own characters, not in its JSON escapes: a page the tool
bounded is never cut for the quotes or newlines it holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.core.redact import redact_text
from corral.mailbox.protocol import MAX_POLL_CHARS

#: Characters of an observation without a budget of its own (the ``local`` provider
#: sends fewer).
DEFAULT_CHARS = 8000
#: The seed's bound on the whole context bundle (V1.3): no one observation the
#: model is sent is longer, whatever its tool.
CONTEXT_BUNDLE_CHARS = 128 * 1024
#: The newest content diff and the newest git diff (seed 004 V1.3, V1.4).
PROTECTED_DIFF_CHARS = 24_256
#: A ``process.poll`` page: its ``max_chars``, at most this (seed 004 V1.10).
POLL_PAGE_CHARS = MAX_POLL_CHARS
#: A ``command.output_read`` page: the tool stops a page before this many characters
#: of numbered lines (actors/tools/process.py ``MAX_PAGE_CHARS``).
OUTPUT_PAGE_CHARS = 32 * 1024

#: A step of a path to bulk text that stands for every item of a list.
EACH = "*"


@dataclass(frozen=True)
class Budget:
    """Where a tool's bulk text is (paths into its output, in order) and how many of
    its characters the model is sent. ``newest_only``: the budget is the newest
    successful observation's of the tool's ``slot``; older ones get ``DEFAULT_CHARS``
    (seed 004 V1.3: only "最新内容 diff" is kept past the usual bound)."""

    texts: tuple[tuple[str, ...], ...]
    chars: int
    newest_only: bool = False
    slot: str = ""


_DIFF = Budget(texts=(("files", EACH, "diff"),), chars=PROTECTED_DIFF_CHARS, newest_only=True, slot="content-diff")
_GIT_DIFF = "git-diff"
#: Each tool with a budget of its own (the tools the seed gives a page or a protected slot).
BUDGETS: Mapping[str, Budget] = {
    "project.diff": _DIFF,
    "project.git_diff": Budget(texts=(("diff",),), chars=PROTECTED_DIFF_CHARS, newest_only=True, slot=_GIT_DIFF),
    "project.git_inspect": Budget(
        texts=(("diff", "staged"), ("diff", "unstaged")), chars=PROTECTED_DIFF_CHARS, newest_only=True, slot=_GIT_DIFF
    ),
    # The review a changeset returns: its checkpoint, revision and files whole, its
    # diffs as an ordinary observation (project.diff with the checkpoint shows them).
    "project.changeset": Budget(texts=(("files", EACH, "diff"),), chars=DEFAULT_CHARS),
    "process.poll": Budget(texts=(("chunk",),), chars=POLL_PAGE_CHARS),
    "command.output_read": Budget(texts=(("lines",),), chars=OUTPUT_PAGE_CHARS),
}


#: A claim's observation (``agent.run_status``) is kept whole up to the supervisor's
#: result bound, 64 KiB (supervisor/runs/run_store.py ``MAX_RESULT_CHARS``): its
#: claimed deliveries fill up to 48 KiB of it, and a delivery the model is not sent
#: is one it never sees (seed 004 V1.35: "完整 observation 必须实际包含被标记 observed 的全部
#: delegationGroupId").
CLAIM_RESULT_CHARS = 64 * 1024
#: Tools whose whole output (no bulk field of its own) keeps more than ``DEFAULT_CHARS``.
WHOLE_TEXT_CHARS: Mapping[str, int] = {"agent.run_status": CLAIM_RESULT_CHARS}


def whole_text_chars(entry: Mapping[str, Any]) -> int:
    """What an observation without a bulk field keeps of its whole text."""
    return WHOLE_TEXT_CHARS.get(str(entry.get("tool", "")), DEFAULT_CHARS)


def budget_of(entry: Mapping[str, Any]) -> Budget | None:
    """The budget of a successful observation whose output is structured, or None."""
    budget = BUDGETS.get(str(entry.get("tool", "")))
    if budget is None or entry.get("status", "ok") != "ok" or not isinstance(entry.get("output"), dict):
        return None
    return budget


def newest_of_slots(history: tuple[Mapping[str, Any], ...]) -> set[int]:
    """The indexes in ``history`` of the newest successful observation of each slot."""
    newest: dict[str, int] = {}
    for index, entry in enumerate(history):
        budget = budget_of(entry)
        # A review without a diff (a status-only git review) holds nothing to keep and
        # displaces nothing, as in the compaction's slots.
        if budget is not None and budget.newest_only and _holds_text(entry["output"], budget):
            newest[budget.slot] = index
    return set(newest.values())


def _holds_text(output: dict[str, Any], budget: Budget) -> bool:
    return any(_places(output, path) for path in budget.texts)


def _places(value: Any, path: tuple[str, ...]) -> list[tuple[dict[str, Any], str]]:
    """Each (container, key) ``path`` reaches in ``value``, in order."""
    if not path or not isinstance(value, dict):
        return []
    step, rest = path[0], path[1:]
    if step == EACH:
        return []  # a list step is taken by the caller's list branch below
    if not rest:
        return [(value, step)] if step in value else []
    inner = value.get(step)
    if rest[0] == EACH and isinstance(inner, list):
        return [place for item in inner for place in _places(item, rest[1:])]
    return _places(inner, rest)


def _size(text: Any) -> int:
    if isinstance(text, str):
        return len(text)
    if isinstance(text, list):
        return sum(len(line) for line in text if isinstance(line, str))
    return 0


def _cut_text(text: str, left: int, note: str) -> str:
    return text[:left] + f"\n[… {len(text) - left} more characters cut{note}]"


def _cut_lines(lines: list[Any], left: int, note: str) -> list[Any]:
    kept: list[Any] = []
    for line in lines:
        size = len(line) if isinstance(line, str) else 0
        if size > left:
            break
        kept.append(line)
        left -= size
    return [*kept, f"[… {len(lines) - len(kept)} more lines of this page cut{note}]"]


def _redacted(text: Any) -> Any:
    if isinstance(text, str):
        return redact_text(text)
    if isinstance(text, list):
        return [redact_text(line) if isinstance(line, str) else line for line in text]
    return text


def _copy(value: Any) -> Any:
    """A deep copy of plain JSON data (the entry itself is the caller's)."""
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def fit(output: dict[str, Any], budget: Budget, chars: int, note: str = "") -> dict[str, Any]:
    """``output`` with its bulk text at most ``chars`` characters in all, cut inside
    that text (in order: what comes first is kept first; redacted first); every
    other field as it was, but a ``truncated`` flag beside a cut text (and the
    output's own), which says so; ``note`` ends the cut's marker. The output itself
    when nothing is over."""
    places = [place for path in budget.texts for place in _places(output, path)]
    if sum(_size(container[key]) for container, key in places) <= chars:
        return output
    shown: dict[str, Any] = _copy(output)
    left = chars
    for container, key in (place for path in budget.texts for place in _places(shown, path)):
        # Redacted before the cut: a secret cut in two would be a secret no filter knows.
        text = _redacted(container[key])
        container[key] = text
        size = _size(text)
        if size <= left:
            left -= size
            continue
        if isinstance(text, str):
            container[key] = _cut_text(text, left, note)
        elif isinstance(text, list):
            container[key] = _cut_lines(text, left, note)
        left = 0
        if "truncated" in container:
            container["truncated"] = True
    if "truncated" in shown:
        shown["truncated"] = True
    return shown


def render(output: Any) -> str:
    """An output as the model reads it: a text as it is, else compact JSON with its
    characters as they are (a ``\\uXXXX`` escape would count six for one). A lone
    surrogate (a file name that is not UTF-8, as Python lists it) is written as its
    escape: the request body is UTF-8, which cannot hold one."""
    text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, default=str)
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode(errors="backslashreplace").decode()
    return text

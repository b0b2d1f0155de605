"""What a person is asked to approve, shown whole: the one view behind ``corral
pending``, ``corral approve ACTION --show``, the chat's ``[y/n]`` prompt and the
dashboard's pending page.

For an action waiting for a person: its tool, every argument with its real value,
the effect class, policy, reason, run and agent, the fingerprint the approval is
bound to (``continue_action`` refuses any other: supervisor/runs/resolutions.py),
and for a file tool the diff against the file as it is now
(supervisor/runs/approval_diff.py).

Values are masked by the one redaction path (corral/core/redact.py): only the
substrings that look like secrets, so a recipient or a message body reads as
written. The ledger's copy of the input is masked already; it is masked again
here, with what the supervisor knows to be secret now. Sealed fields
(``ToolSchema.sealed``) never reach the ledger and show only their digest and size.

Long values are paged, never cut silently: each value is split into pages of
``page_chars`` characters and a view holds one page of each, with the value's
full length, its page count and a digest of the whole (a client that reads every
page checks the pages belong together). One view fits one control reply: the
page size shrinks with the number of values (``VIEW_BUDGET_CHARS``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.actors.tools.base import Tool, is_sealed
from corral.core.redact import redact
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.approval_diff import FileChange
from corral.supervisor.runs.run_feature import RunFeatures

#: One page of a value in ``approval.show`` (characters).
PAGE_CHARS = 64_000
#: What every page of one view holds together at most: a character may take four
#: bytes, and a control reply is at most 1 MiB.
VIEW_BUDGET_CHARS = 192_000
#: No page is smaller than this, however many values an action has.
MIN_PAGE_CHARS = 500
#: What ``pending`` shows of one action's values together (its first page).
PREVIEW_BUDGET_CHARS = 4_000
#: Actions ``pending`` previews; the rest are listed with ``approval.show`` to see them.
MAX_PREVIEWS = 50
#: Arguments shown of one action (a tool's input has far fewer).
MAX_ARGUMENTS = 200
#: Phases in which the action has not run: its file diff is against the file it would change.
NOT_RUN = frozenset({ActionPhase.PREPARED, ActionPhase.WAITING_CONFIRMATION, ActionPhase.APPROVED})


@dataclass(frozen=True)
class Argument:
    """One argument as shown: ``kind`` is "text" (a string), "json" (anything else,
    as JSON text) or "sealed" (its digest and size only)."""

    name: str
    kind: str
    text: str


def arguments(tool_input: Mapping[str, Any], sealed: tuple[str, ...]) -> list[Argument]:
    """Every argument of ``tool_input`` (the ledger's copy), masked, in name order."""
    shown = []
    for name in sorted(tool_input)[:MAX_ARGUMENTS]:
        value = tool_input[name]
        if is_sealed(value) or name in sealed:
            shown.append(Argument(name, "sealed", _sealed_text(value)))
        elif isinstance(value, str):
            shown.append(Argument(name, "text", _masked_text(name, value)))
        else:
            shown.append(Argument(name, "json", _json_text(redact(value))))
    return shown


def _masked_text(name: str, value: str) -> str:
    # Through ``redact`` on the pair: a key named like a secret masks its whole value,
    # as it does in the ledger.
    masked: str = redact({name: value})[name]
    return masked


def _sealed_text(value: Any) -> str:
    if is_sealed(value):
        return f"<sealed {str(value['sealed'])[:12]}… {int(value['bytes'])} bytes>"
    return "<sealed>"


def _json_text(value: Any) -> str:
    compact = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return compact if len(compact) <= 100 else json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2)


def effect_class(ledger: Ledger, row: Any, tools: Mapping[str, Tool], features: RunFeatures) -> str:
    """The tool's effect class (read, idempotent, external): from the catalog for
    corral's and the user's tools, from the feature that provides any other (the
    run's pinned catalog for an MCP tool: ``RunFeature.tool_effect``)."""
    tool = tools.get(row["tool"])
    if tool is not None:
        return tool.schema.effect_class
    effect = features.tool_effect(ledger, row["run_id"], row["tool"])
    if effect is not None:
        return effect
    return "external" if not row["rerunnable"] else "idempotent"


def sealed_fields(row: Any, tools: Mapping[str, Tool]) -> tuple[str, ...]:
    tool = tools.get(row["tool"])
    return tool.schema.sealed if tool is not None else ()


def has_run(row: Any) -> bool:
    """Whether a file diff is against the file the action would change (it has not run)."""
    return ActionPhase(row["phase"]) not in NOT_RUN


def page_size(values: int, budget: int = VIEW_BUDGET_CHARS, most: int = PAGE_CHARS) -> int:
    """The page of each value in a view of ``values`` values, within ``budget``."""
    return max(MIN_PAGE_CHARS if budget >= MIN_PAGE_CHARS else 1, min(most, budget // max(1, values)))


def paged(text: str, page: int, page_chars: int) -> dict[str, Any]:
    """One page of ``text``: the page, the whole length, how many pages, its digest."""
    pages = max(1, -(-len(text) // page_chars))
    start = (page - 1) * page_chars
    return {
        "text": text[start : start + page_chars],
        "chars": len(text),
        "page": page,
        "pages": pages,
        "digest": hashlib.sha256(text.encode(errors="replace")).hexdigest()[:16],
    }


def view(
    row: Any,
    *,
    effect: str,
    sealed: tuple[str, ...],
    files: list[FileChange],
    page: int = 1,
    page_chars: int | None = None,
    budget: int = VIEW_BUDGET_CHARS,
) -> dict[str, Any]:
    """The approval view of the action ``row`` (its ledger row): page ``page`` of
    each value. ``files``: what it would write (approval_diff.file_changes)."""
    tool_input = json.loads(row["input"])
    shown = arguments(tool_input, sealed)
    size = page_chars or page_size(len(shown) + len(files), budget)
    return {
        **{key: row[key] for key in ("action_id", "run_id", "agent_id", "tool", "phase", "policy", "fingerprint")},
        "reason": row["reason"] or "",
        "effect": effect,
        "page": page,
        "page_chars": size,
        "arguments": [{"name": a.name, "kind": a.kind, **paged(a.text, page, size)} for a in shown],
        "omitted_arguments": max(0, len(tool_input) - len(shown)),
        "files": [{"path": f.path, "error": f.error, **paged(f.diff, page, size)} for f in files],
    }

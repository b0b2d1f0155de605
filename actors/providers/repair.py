"""Asking a model to fix its last output: the bounded repair message, and the count
of repairs sent per category (seed 004 V1.33's eight, actors/providers/base.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from corral.core.redact import redact_text

from .base import MAX_ACTIONS_PER_PLAN, RepairCategory

#: Repair messages go back to the model and into the ledger: keep them small.
MAX_REPAIR_CHARS = 500

_REPAIR_TEXT: dict[RepairCategory, str] = {
    RepairCategory.RESPONSE_SHAPE: (
        "Your answer was not a plan: give tool calls, or one final reply, in the expected shape."
    ),
    RepairCategory.CALL_IDENTITY: "A tool call named no function. Name one of the listed tools in each call.",
    RepairCategory.UNKNOWN_FUNCTION: "You called a tool that does not exist. Use only the listed tools.",
    RepairCategory.ARGUMENTS_JSON: (
        "Your arguments were not valid JSON (or named a key twice). Send well-formed JSON only."
    ),
    RepairCategory.ARGUMENTS_SCHEMA: (
        "Your arguments did not match the tool's input schema. Fix the fields and types."
    ),
    RepairCategory.BATCH_CONSTRAINT: (
        f"Your actions together broke a rule of this turn (at most {MAX_ACTIONS_PER_PLAN}, or the one named)."
    ),
    RepairCategory.PLAN_SEMANTICS: "Your plan was refused for what it does. Do what the detail says first.",
    RepairCategory.CATALOG_BINDING: "The tool catalogue is in conflict.",
}


def repair_message(category: RepairCategory, detail: str) -> dict[str, str]:
    """A chat message asking the model to fix its last output; at most
    MAX_REPAIR_CHARS of content, redacted, since the detail may quote model output."""
    head = f"[corral repair: {category.value}] {_REPAIR_TEXT[category]} Problem: "
    room = MAX_REPAIR_CHARS - len(head)
    detail = " ".join(redact_text(detail).split())
    if len(detail) > room:
        detail = detail[: room - 1] + "…"
    return {"role": "user", "content": head + detail}


class RepairCounter:
    """Repairs sent so far, per category.

    The agent calls ``exhausted(max_repairs, category)`` when a parse fails: if True
    the run fails, otherwise it calls ``record(category)`` and sends the repair. The
    counts can be rebuilt from a run's history after a restart (``from_history``), so
    a crash never grants a fresh repair budget.
    """

    def __init__(self, counts: Mapping[RepairCategory | str, int] | None = None) -> None:
        self._counts: Counter[RepairCategory] = Counter()
        for category, n in (counts or {}).items():
            self._counts[RepairCategory(category)] += int(n)

    @classmethod
    def from_history(cls, history: Iterable[Mapping[str, Any]]) -> RepairCounter:
        counter = cls()
        for entry in history:
            if entry.get("role") == "repair" and entry.get("category") is not None:
                counter.record(RepairCategory(entry["category"]))
        return counter

    def record(self, category: RepairCategory) -> int:
        self._counts[category] += 1
        return self._counts[category]

    def count(self, category: RepairCategory) -> int:
        return self._counts[category]

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def exhausted(self, max_repairs: int, category: RepairCategory | None = None) -> bool:
        """True when ``category`` (or, without one, any category) has used all of its
        ``max_repairs`` repairs."""
        if category is not None:
            return self._counts[category] >= max_repairs
        return any(n >= max_repairs for n in self._counts.values())

    def as_dict(self) -> dict[str, int]:
        return {category.value: n for category, n in sorted(self._counts.items()) if n}

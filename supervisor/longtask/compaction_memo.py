"""What compaction keeps of a run between its provider turns (supervisor/longtask/
compaction_service.py): the parsed observations, each one's shown form (cut at the
tool-output limit) and token count, and their running total, so a turn reads, parses
and counts only the rows appended since the last one.

Sound because observations are only ever appended (numbered 1, 2, ... per run) and the
supervisor is the ledger's only writer. A memo holds for one key (the limits, the
latest compaction, the local model); a new key starts a new memo. The view and the
compaction decision it gives are exactly ``compaction.view`` and ``compaction.plan``
over the same observations: a due compaction is planned by ``compaction.plan`` itself.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from typing import Any

from corral.supervisor.longtask import compaction

Observation = tuple[int, dict[str, Any]]


@dataclass(frozen=True)
class MemoKey:
    """What the kept counts depend on besides the observations themselves."""

    auto_compact: Any
    tool_output: Any
    #: The latest compaction: (from_seq, to_seq, summary), or None.
    previous: tuple[int, int, str] | None
    #: The local model whose tokenizer counts, or None (the estimate).
    model: str | None


def key_of(limits: dict[str, Any], previous: dict[str, Any] | None, model: str | None) -> MemoKey:
    kept = (None if previous is None
            else (int(previous["from_seq"]), int(previous["to_seq"]), str(previous["summary"])))
    return MemoKey(limits.get("auto_compact"), limits.get("tool_output"), kept, model)


def texts_of(entry: dict[str, Any]) -> list[str]:
    """The texts the model's tokenizer is asked to count for one observation."""
    texts = [compaction.text_of(entry)]
    if "output" in entry:
        texts.append(compaction.text_of(entry["output"]))
    return texts


@dataclass
class RunMemo:
    key: MemoKey
    previous: dict[str, Any] | None
    observations: list[Observation] = field(default_factory=list)
    last_seq: int = 0
    #: The model's counts, by text (a tokenizer's count of a text never changes).
    known: dict[str, int] = field(default_factory=dict)
    #: How many texts today's full count would send (its limit falls back to the estimate).
    text_total: int = 0
    #: Which counts ``shown`` was made with: True the model's, False the estimate.
    by_model: bool = False
    #: Observations after the latest compaction: seq, shown form (cut), its tokens.
    shown_seqs: list[int] = field(default_factory=list)
    shown: list[dict[str, Any]] = field(default_factory=list)
    shown_tokens: list[int] = field(default_factory=list)
    total: int = 0
    #: How many of ``observations`` are in ``shown`` (or before the compaction).
    shown_upto: int = 0
    #: The newest protectable observation of each slot, by slot: its seq and entry
    #: (``compaction.protected_seqs``).
    protected: dict[str, Observation] = field(default_factory=dict)
    #: Every steer, oldest first (``compaction.is_steer``: never folded).
    steers: list[Observation] = field(default_factory=list)

    @property
    def after(self) -> int:
        return int(self.previous["to_seq"]) if self.previous is not None else 0

    def summary_entry(self) -> dict[str, Any] | None:
        previous = self.previous
        if previous is None:
            return None
        return {"role": "summary", "text": previous["summary"],
                "covers": [int(previous["from_seq"]), int(previous["to_seq"])]}

    def add_rows(self, rows: list[Any]) -> list[Observation]:
        """Parse rows read with ``seq > last_seq`` (oldest first), in the same sync step
        as the read (no turn of the run reads them twice); the new observations."""
        new = [(int(row["seq"]), json.loads(row["data"])) for row in rows]
        for seq, entry in new:
            slot = compaction.slot_of(entry)
            if slot is not None:
                self.protected[slot] = (seq, entry)
            elif compaction.is_steer(entry):
                self.steers.append((seq, entry))
            self.text_total += len(texts_of(entry))
        self.observations.extend(new)
        if new:
            self.last_seq = new[-1][0]
        return new

    def count(self, by_model: bool) -> compaction.Count:
        if not by_model:
            return compaction.estimate_tokens
        known = self.known

        def count(value: Any) -> int:
            text = compaction.text_of(value)
            return known[text] if text in known else compaction.estimate_tokens(value)

        return count

    def extend_shown(self, by_model: bool) -> None:
        """Keep the shown form and count of the observations not yet shown (all of them
        again when the counts change kind: the model's tokenizer became ready, or
        stopped being). Sync: no other turn of the run interleaves with it."""
        if by_model != self.by_model:
            self.by_model = by_model
            self.shown_seqs, self.shown, self.shown_tokens, self.total = [], [], [], 0
            self.shown_upto = 0
        count, after, limit = self.count(by_model), self.after, self.key.tool_output
        for seq, entry in self.observations[self.shown_upto:]:
            if seq > after:
                shown = compaction.cut(entry, limit, count)
                tokens = count(shown)
                self.shown_seqs.append(seq)
                self.shown.append(shown)
                self.shown_tokens.append(tokens)
                self.total += tokens
        self.shown_upto = len(self.observations)

    def tokens(self, count: compaction.Count) -> int:
        """``sum(count(e) for e in compaction.view(...))``, from the running total."""
        tokens = self.total
        summary = self.summary_entry()
        if summary is not None:
            tokens += count(summary)
        for seq, entry in self.protected.values():
            tokens += count(compaction.kept_whole(entry))
            if seq > self.after:
                tokens -= self.shown_tokens[self._index(seq)]
        if summary is not None:  # steers a summary covers are still shown whole
            tokens += sum(count(entry) for seq, entry in self.steers if seq <= self.after)
        return tokens

    def view(self) -> list[dict[str, Any]]:
        """``compaction.view(...)`` of the kept observations."""
        entries: list[dict[str, Any]] = []
        summary = self.summary_entry()
        if summary is not None:
            entries.append(summary)
        shown = list(self.shown)
        covered: list[tuple[int, dict[str, Any]]] = []
        for seq, entry in self.protected.values():
            if seq > self.after:
                shown[self._index(seq)] = compaction.kept_whole(entry)
            elif summary is not None:
                covered.append((seq, compaction.kept_whole(entry)))
        if summary is not None:
            covered += [(seq, entry) for seq, entry in self.steers if seq <= self.after]
        # Oldest first, as ``compaction.view`` lists the ones a summary covers.
        entries.extend(entry for _, entry in sorted(covered, key=lambda kept: kept[0]))
        entries.extend(shown)
        return entries

    def _index(self, seq: int) -> int:
        index = bisect.bisect_left(self.shown_seqs, seq)
        if index == len(self.shown_seqs) or self.shown_seqs[index] != seq:
            raise AssertionError(f"observation {seq} is not in the memo")
        return index

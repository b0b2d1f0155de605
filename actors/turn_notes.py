"""What a lane tells the supervisor about each provider turn, for the run's
transcript (docs/transcripts.md): the system prompt its provider rendered and
the tool catalog it offered, each named by the sha256 of its text, with the text
itself only when this lane has not sent that text yet; and how many of the run's
observations the turn had seen (the supervisor holds the history already, so
none of it is sent again).

The common turn costs a string compare: the prompt is rendered (the provider's
optional ``prompt_text``) and compared with the last one; the catalog is fixed
for the lane and hashed once.
"""

from __future__ import annotations

import hashlib
import json
import logging

import msgspec

from corral.actors import recordable
from corral.actors.providers.base import MAX_TRANSCRIPT_CHARS, Provider, ProviderRequest, ToolSchema
from corral.core.redact import summarize
from corral.mailbox.protocol.run_records import REASONING_EFFORTS, TurnNote
from corral.mailbox.steps import ProviderStep

log = logging.getLogger("corral.agent")


def capped(text: str) -> str:
    """``text`` as the transcript keeps it: valid Unicode, at most ``MAX_TRANSCRIPT_CHARS``."""
    text = recordable.text(text)
    if len(text) <= MAX_TRANSCRIPT_CHARS:
        return text
    return text[:MAX_TRANSCRIPT_CHARS] + f"\n[… {len(text) - MAX_TRANSCRIPT_CHARS} more characters cut]"


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def catalog_text(tools: tuple[ToolSchema, ...]) -> str:
    """The offered tools as JSON with sorted keys and no spaces: the same catalog,
    the same text (so the same hash). Not RFC 8785, which costs ten times more for
    the same guarantee here: the text is hashed where it is made, never re-encoded."""
    entries = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema, "effect": t.effect_class}
        for t in tools
    ]
    return json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class _Sent:
    """One text of a lane's turns: its latest version, its hash, and whether the
    supervisor has it (only a call that succeeded says so)."""

    def __init__(self) -> None:
        self.source: str | None = None
        self.text = ""
        self.sha256 = ""
        self.delivered = False

    def update(self, source: str) -> None:
        if source is self.source or source == self.source:
            return
        self.source = source
        self.text = capped(source)
        self.sha256 = text_sha256(self.text)
        self.delivered = False

    def named(self) -> tuple[str | None, str | None]:
        """(its hash, its text when the supervisor does not have it yet)."""
        if self.source is None:
            return None, None
        return self.sha256, None if self.delivered else self.text


class TurnNotes:
    """A lane's transcript notes, one per lane (a new lane sends each text again;
    the supervisor keeps one copy of each)."""

    def __init__(self, offered: tuple[ToolSchema, ...]) -> None:
        self.offered = offered
        self.system = _Sent()
        self.catalog = _Sent()

    def for_turn(self, provider: Provider, request: ProviderRequest, seen: int | None) -> TurnNote:
        """This turn's notes, sent with its handoff (or failure)."""
        if self.catalog.source is None:
            self.catalog.update(catalog_text(self.offered))
        render = getattr(provider, "prompt_text", None)
        if render is not None:
            try:
                rendered = render(request)
                if isinstance(rendered, str):
                    self.system.update(rendered)
            except Exception as exc:  # a user provider's bug costs its transcript line, never the turn
                log.warning("%s: the provider's prompt_text raised %s: %s", request.run_id, type(exc).__name__,
                            summarize(str(exc), 200))
        system_sha256, system = self.system.named()
        catalog_sha256, catalog = self.catalog.named()
        # The request parameter a provider sends with every turn (seed 004 V1.2).
        effort = getattr(provider, "reasoning_effort", None)
        return TurnNote(
            system_sha256=system_sha256,
            catalog_sha256=catalog_sha256,
            system=system,
            catalog=catalog,
            seen=seen,
            reasoning_effort=effort if effort in REASONING_EFFORTS else None,
            # Whether the turn let the provider search the web (seed 004 V1.20).
            web_search=request.web_search,
        )

    def delivered(self, notes: TurnNote) -> None:
        """The supervisor took ``notes``: later turns name these texts by hash only."""
        if notes.system is not None and notes.system_sha256 == self.system.sha256:
            self.system.delivered = True
        if notes.catalog is not None and notes.catalog_sha256 == self.catalog.sha256:
            self.catalog.delivered = True

    @staticmethod
    def without_texts(notes: TurnNote) -> TurnNote:
        """``notes`` naming the texts only (a message too large to carry them)."""
        return msgspec.structs.replace(notes, system=None, catalog=None)


def observations_seen(step: ProviderStep) -> int | None:
    """How many of the run's observations a provider step showed the model: the
    count the lane holds, or for a shaped view (compaction) the summary's end plus
    the observations after it. None: a view this cannot tell."""
    history = step.history or []
    if step.history_from is not None:
        return step.history_from + len(history)
    after = 0
    count = 0
    for entry in history:
        if entry.get("role") == "summary":
            covers = entry.get("covers")
            if not (isinstance(covers, list) and len(covers) == 2 and isinstance(covers[1], int)):
                return None
            after = covers[1]
        else:
            count += 1
    return after + count

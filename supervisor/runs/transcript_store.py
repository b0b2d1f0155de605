"""The ledger side of transcripts (docs/transcripts.md): what an agent says of a
provider turn besides its response, checked and kept.

A turn names its system prompt and its tool catalog by the sha256 of their text
(actors/turn_notes.py); a text comes with the first turn of a lane that sends it
and is kept once, redacted and bounded, in ``transcript_blobs``. The turn's row
(provider_requests) gets the two hashes and ``history_seq``, how many of the
run's observations it had seen: the history is the run's own observations, read
back by range, never copied per turn.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from corral.actors.providers.base import MAX_TRANSCRIPT_CHARS
from corral.core.redact import redact_text
from corral.mailbox.protocol import TurnNote
from corral.supervisor.errors import BadRequest

#: Room past the cap for the note an agent adds where it cut a text.
_CUT_NOTE_CHARS = 100


@dataclass(frozen=True)
class TurnNotes:
    """What one provider turn was sent, as far as the ledger keeps it."""

    system_sha256: str | None = None
    catalog_sha256: str | None = None
    #: name -> text, for the texts this message carries (a lane's first sending).
    texts: tuple[tuple[str, str], ...] = ()
    #: The run's observations the turn had seen (None: not said).
    seen: int | None = None
    #: The ``reasoning_effort`` the provider sent (None: a provider without one),
    #: and the turn's slot it is kept on.
    reasoning_effort: str | None = None
    slot: str | None = None
    #: Whether the turn let the provider search the web (None: not said).
    web_search: bool | None = None


def notes_from(note: TurnNote | None, slot: str | None = None) -> TurnNotes:
    """The notes of a handoff or a failure on turn ``slot`` (their shape checked at
    the boundary, ``TurnNote``); a text that is too long or is not the text its
    hash names is refused, and the notes with it."""
    if note is None:
        return TurnNotes(slot=slot)
    texts: list[tuple[str, str]] = []
    sent = (("system", note.system, note.system_sha256), ("catalog", note.catalog, note.catalog_sha256))
    for kind, text, sha in sent:
        if text is None:
            continue
        if len(text) > MAX_TRANSCRIPT_CHARS + _CUT_NOTE_CHARS:
            raise BadRequest(f"{kind} must be a string of at most {MAX_TRANSCRIPT_CHARS} characters")
        if sha != hashlib.sha256(text.encode("utf-8")).hexdigest():
            raise BadRequest(f"{kind}_sha256 is not the sha256 of {kind}")
        texts.append((kind, text))
    return TurnNotes(
        note.system_sha256, note.catalog_sha256, tuple(texts), note.seen, note.reasoning_effort, slot, note.web_search
    )


def keep_texts(db: Any, notes: TurnNotes, *, parameters: bool = True) -> None:
    """Inside the caller's transaction: the texts the notes carry, once each,
    redacted (the turn's row names them by hash: provider_store.py), and the
    turn's request parameters on its row (``parameters=False``: the caller's own
    update of that row sets them, one statement fewer per turn)."""
    if parameters and notes.slot is not None:
        if notes.reasoning_effort is not None:
            db.execute("UPDATE provider_requests SET reasoning_effort = ? WHERE slot = ?",
                       (notes.reasoning_effort, notes.slot))
        if notes.web_search is not None:
            db.execute("UPDATE provider_requests SET web_search = ? WHERE slot = ?",
                       (int(notes.web_search), notes.slot))
    for kind, text in notes.texts:
        sha = notes.system_sha256 if kind == "system" else notes.catalog_sha256
        if db.execute("SELECT 1 FROM transcript_blobs WHERE sha256 = ?", (sha,)).fetchone() is not None:
            continue  # another lane's (another run's) turn sent it: redacting it again costs ms
        db.execute(
            "INSERT OR IGNORE INTO transcript_blobs (sha256, kind, text, created_at) VALUES (?, ?, ?, ?)",
            (sha, kind, redact_text(text), time.time()),
        )

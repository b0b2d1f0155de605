"""Streamed final replies on the supervisor (seed 004 V1.19): the text stays private.

An agent sends its final reply's text as it is generated (``reply.delta``,
actors/providers/reply_stream.py). The public events table gets, per delta, only
its identity and size: the provider slot, the sequence number, the character
count and the SHA-256 of the (redacted) text, and a ``reply-stream-restart`` when
a lifecycle starts over. The text itself is kept in a bounded in-memory cache
keyed by the delta's event cursor, and put back into the ``reply-delta`` events
the ``events`` method serves to a follower (the chat, ``corral events --follow``,
``Client.events``) while it is cached. The cache is lossy: the oldest text goes
first when it is full, and a restarted supervisor has none (a reader then shows
the final reply from the finalization journal, the one source of the final text).

Progress reports (tokens so far while a model generates anything) ride the same
actor method and are kept the same way: the newest per run, in memory only.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from corral.core.redact import redact_text
from corral.mailbox.protocol import Ack, ReplyDelta
from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import run_store
from corral.supervisor.service_part import ServicePart
from corral.supervisor.tree.supervision_tree import ActorSlot

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

#: Templates that may stream a run's final-reply text.
STREAMING_TEMPLATES = ("agent", "child", "model")
MAX_DELTA_CHARS = 8000
#: The text the cache holds at most, over all runs: the oldest deltas' text goes first.
MAX_CACHED_CHARS = 2_000_000
#: Progress reports kept (the newest per run, in memory): the oldest run's goes first.
MAX_PROGRESS_RUNS = 256
MAX_PROGRESS_QUERY = 100
#: Runs whose last streamed slot is remembered (else read back from the ledger).
MAX_STREAMING_RUNS = 1024


def delta_event_data(slot: str, seq: int, text: str) -> dict[str, Any]:
    """What the public events table keeps of one delta: ids, a count and a hash."""
    return {"slot": slot, "seq": seq, "chars": len(text), "sha256": hashlib.sha256(text.encode()).hexdigest()}


class ReplyStreamService:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        #: run -> the provider slot whose reply text was streamed last.
        self.streaming: OrderedDict[str, str] = OrderedDict()
        #: event cursor of a ``reply-delta`` -> its text (redacted). Lossy, bounded.
        self.texts: OrderedDict[int, str] = OrderedDict()
        self.cached_chars = 0
        #: run -> the newest progress report of its provider (tokens so far while a
        #: model generates). A view of now: never written to the ledger, so a long
        #: generation adds no row, and a restarted supervisor simply has none.
        self.progress: dict[str, dict[str, Any]] = {}

    async def reply_delta(self, slot: ActorSlot, request: ReplyDelta) -> Ack:
        """Final-reply text as it is generated. A lifecycle that starts over (a
        retry after a cut or a kill) is marked, so a reader drops what it showed
        instead of seeing the text twice."""
        if slot.spec.template not in STREAMING_TEMPLATES:
            raise BadRequest(f"actor {slot.id} does not stream replies")
        run_id = request.run_id
        run = run_store.get_run(self.ledger, run_id)
        if slot.spec.template != "model" and run["agent_id"] != slot.spec.params.get("agent_id", slot.id):
            raise BadRequest(f"run {run_id} is not driven by {slot.id}")
        provider_slot = request.slot
        if request.tokens is not None:
            self._progress_report(run_id, provider_slot, request.tokens)
            return Ack()
        text, seq = request.text, request.seq
        if len(text) > MAX_DELTA_CHARS:
            raise BadRequest(f"text must be a string of at most {MAX_DELTA_CHARS} characters")
        previous = self._last_slot(run_id)
        shown = redact_text(text)
        with self.ledger.tx(fsync=False):
            if previous is not None and previous != provider_slot:
                self.ledger.event("reply-stream-restart", run_id, previous=previous, slot=provider_slot)
            cursor = self.ledger.event("reply-delta", run_id, **delta_event_data(provider_slot, seq, shown))
        self._remember(run_id, provider_slot)
        self._cache(cursor, shown)
        return Ack()

    def _last_slot(self, run_id: str) -> str | None:
        """The slot this run streamed last: in memory, else (a restarted supervisor)
        the last delta's event."""
        if run_id in self.streaming:
            return self.streaming[run_id]
        last = self.ledger.one(
            "SELECT data FROM events WHERE kind = 'reply-delta' AND subject = ? ORDER BY cursor DESC LIMIT 1", run_id
        )
        slot = json.loads(last["data"]).get("slot") if last is not None else None
        return slot if isinstance(slot, str) else None

    def _remember(self, run_id: str, provider_slot: str) -> None:
        self.streaming[run_id] = provider_slot
        self.streaming.move_to_end(run_id)
        while len(self.streaming) > MAX_STREAMING_RUNS:
            self.streaming.popitem(last=False)

    def _cache(self, cursor: int, text: str) -> None:
        self.texts[cursor] = text
        self.cached_chars += len(text)
        while self.cached_chars > MAX_CACHED_CHARS and self.texts:
            _, dropped = self.texts.popitem(last=False)
            self.cached_chars -= len(dropped)

    def with_text(self, events: list[dict[str, Any]]) -> None:
        """The ``events`` method's page: each ``reply-delta`` gets its text back while
        the cache has it (a follower's view; the table itself never holds it)."""
        for event in events:
            if event["kind"] == "reply-delta":
                text = self.texts.get(int(event["cursor"]))
                if text is not None:
                    event["data"] = {**event["data"], "text": text}

    # -- progress ---------------------------------------------------------------------

    def _progress_report(self, run_id: str, provider_slot: str, tokens: int) -> None:
        now = time.time()
        previous = self.progress.pop(run_id, None)
        first = previous if previous is not None and previous["slot"] == provider_slot else None
        self.progress[run_id] = {
            "slot": provider_slot,
            "tokens": tokens,
            "at": now,
            # The first report of this lifecycle: tokens/s is measured from it.
            "first_at": first["first_at"] if first is not None else now,
            "first_tokens": first["first_tokens"] if first is not None else tokens,
        }
        while len(self.progress) > MAX_PROGRESS_RUNS:
            self.progress.pop(next(iter(self.progress)))

    async def progress_view(self, params: dict[str, Any]) -> dict[str, Any]:
        """``progress``: the newest provider progress report of each of ``run_ids``
        that has one (runs that generate nothing, or ended long ago, have none)."""
        run_ids = params.get("run_ids")
        if (
            not isinstance(run_ids, list)
            or len(run_ids) > MAX_PROGRESS_QUERY
            or not all(isinstance(run_id, str) for run_id in run_ids)
        ):
            raise BadRequest(f"run_ids must be a list of at most {MAX_PROGRESS_QUERY} run ids")
        return {"progress": {run_id: self.progress[run_id] for run_id in run_ids if run_id in self.progress}}


class ReplyStreamPart(ServicePart):
    """Each page of ``events`` gets its streamed reply text back from memory."""

    def __init__(self, service: ReplyStreamService) -> None:
        self.service = service

    def fill_events(self, page: list[dict[str, Any]]) -> None:
        self.service.with_text(page)


def install(sup: Supervisor) -> ReplyStreamService:
    service = ReplyStreamService(sup.ledger)
    sup.control_methods["progress"] = service.progress_view
    sup.methods.reply_stream = service
    return service

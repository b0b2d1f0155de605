"""Streaming the user-visible final reply, and nothing else.

A provider that streams its answer feeds the raw content text to a
``FinalReplyDecoder``, which yields only the text of a final reply: in JSON mode
(a grammar-shaped or text-JSON answer) the characters of the ``"final"`` string,
decoded as they arrive; a plan of tool calls yields nothing. ``ReplyDeltas``
batches that text to the supervisor (``reply.delta``), which puts it on the event
stream. The stream is a view: the finalization journal stays the one source of
the final text, and a lifecycle that starts over is marked on the stream instead
of repeating text.

While a provider generates anything (a plan of tool calls too), ``ReplyDeltas``
also reports progress on the same channel: the count of tokens so far, at most
every ``PROGRESS_EVERY_S``, never their text (seed 004 V1.19: a plan's tool
calls, function arguments and repair context stay out of every stream; the
committed plan shows them, in the transcript). The supervisor keeps only the
newest report of a run in memory (never in the ledger), for live views.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING

from corral.mailbox.protocol import ReplyDelta

if TYPE_CHECKING:
    from corral.actors.runtime import ActorContext

_FINAL_PREFIX = re.compile(r'\s*\{\s*"final"\s*:\s*"')
_COMPACT_PREFIX = '{"final":"'
#: How long deltas are gathered before one message to the supervisor.
FLUSH_S = 0.05
MAX_DELTA_CHARS = 4000
#: Progress reports (tokens so far): the first at once, then at most this often.
PROGRESS_EVERY_S = 0.5


class FinalReplyDecoder:
    """Incremental decoder of the ``"final"`` string of a JSON answer."""

    def __init__(self) -> None:
        self.raw = ""
        self.state = "prefix"  # prefix | inside | done | off
        self.pos = 0

    def feed(self, chunk: str) -> str:
        self.raw += chunk
        if self.state == "prefix":
            match = _FINAL_PREFIX.match(self.raw)
            if match:
                self.state, self.pos = "inside", match.end()
            elif not _COMPACT_PREFIX.startswith(re.sub(r"\s+", "", self.raw)):
                self.state = "off"  # a plan of tool calls, or anything else: never streamed
        if self.state != "inside":
            return ""
        out: list[str] = []
        raw = self.raw
        while self.pos < len(raw):
            char = raw[self.pos]
            if char == '"':
                self.state = "done"
                break
            if char != "\\":
                out.append(char)
                self.pos += 1
                continue
            width = 6 if raw[self.pos + 1 : self.pos + 2] == "u" else 2
            if self.pos + width > len(raw):
                break  # an escape cut in half: wait for the rest
            try:
                out.append(json.loads(f'"{raw[self.pos:self.pos + width]}"'))
            except ValueError:
                out.append(raw[self.pos : self.pos + width])
            self.pos += width
        return "".join(out)


class ReplyDeltas:
    """Batches final-reply text of one provider lifecycle to the supervisor."""

    def __init__(self, ctx: ActorContext, run_id: str, slot: str) -> None:
        #: The actor it reports through (``reply.delta``, best effort).
        self.ctx = ctx
        self.run_id = run_id
        self.slot = slot
        self.seq = 0
        self.buffer: list[str] = []
        self.last_flush = time.monotonic()
        self.tokens = 0
        self.reported_tokens = 0
        self.last_report: float | None = None

    def count(self, tokens: int) -> bool:
        """Counts generated tokens (a model's, or a stream's chunks); True when a
        progress report is due. Synchronous, so a generating
        worker thread crosses to trio only when a report is due."""
        self.tokens += tokens
        now = time.monotonic()
        if self.last_report is not None and now - self.last_report < PROGRESS_EVERY_S:
            return False
        self.last_report = now
        return True

    async def generated(self, tokens: int) -> None:
        if self.count(tokens):
            await self.report_progress()

    async def report_progress(self) -> None:
        from corral.actors.runtime import ask_best_effort

        self.reported_tokens = self.tokens
        await ask_best_effort(self.ctx, ReplyDelta(self.run_id, self.slot, self.seq, "", tokens=self.tokens))

    async def finish(self) -> None:
        """The rest of the reply text, and the final token count."""
        await self.flush()
        if self.tokens != self.reported_tokens:
            await self.report_progress()

    async def add(self, text: str) -> None:
        if not text:
            return
        self.buffer.append(text)
        # The first words go out at once (time to first word), then in batches.
        due = self.seq == 0 or time.monotonic() - self.last_flush >= FLUSH_S
        if due or sum(map(len, self.buffer)) >= MAX_DELTA_CHARS:
            await self.flush()

    async def flush(self) -> None:
        if not self.buffer:
            return
        text, self.buffer = "".join(self.buffer), []
        self.last_flush = time.monotonic()
        self.seq += 1
        # The stream is a view: a delta lost with a dying supervisor is not an error.
        from corral.actors.runtime import ask_best_effort

        await ask_best_effort(self.ctx, ReplyDelta(self.run_id, self.slot, self.seq, text))

"""A bidirectional message channel over one link (mailbox/transport.py): msgpack
frames over nng (the default) or a raw stream socket.

Request/reply is built here because both ends of an actor link make requests: the
reader task matches replies to waiting requests by ``corr_id`` and puts everything
else into a bounded inbox. When the inbox is full the reader stops reading, the
link's buffers fill, and the peer's sends wait: backpressure end to end with
bounded memory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from corral.mailbox import link as links
from corral.mailbox.codec import DEFAULT_MAX_FRAME, decode, encode
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.errors import (
    ChannelClosed,
    DeadlineExceeded,
    FrameError,
    MailboxFull,
    RemoteError,
)
from corral.mailbox.transport import NNG, Link, Transport

log = logging.getLogger(__name__)

DEFAULT_INBOX = 256
#: Body key of a batched tell (``Channel.tell_many``).
BATCH = "__batch__"
#: Hard limit of a frame, in multiples of max_frame: frames between max_frame and
#: this are read and answered with a typed error; a peer announcing more is cut off,
#: which bounds a hostile peer's memory.
HARD_FRAME_FACTOR = 4


_ANSWERS = (Kind.REPLY, Kind.ERROR, Kind.WELCOME)


@dataclass
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    reply: Envelope | None = None


class Channel:
    def __init__(
        self,
        name: str,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        inbox_size: int = DEFAULT_INBOX,
        token: str | None = None,
    ) -> None:
        self.name = name
        self.max_frame = max_frame
        self.token = token
        self._link: Link | None = None
        #: Set once the link is attached, or the channel closed without one.
        self._linked = trio.Event()
        self._pending: dict[str, _Pending] = {}
        self._inbox_send, self.inbox = trio.open_memory_channel[Envelope](inbox_size)
        self._closed = False
        self.frames_in = 0
        self.frames_out = 0
        self.bad_frames = 0

    @property
    def hard_limit(self) -> int:
        return self.max_frame * HARD_FRAME_FACTOR

    def attach(self, link: Link) -> None:
        if self._closed:
            link.close()
            return
        self._link = link
        self._linked.set()

    async def send(self, envelope: Envelope, timeout: float | None = None) -> None:
        frame = encode(envelope, self.max_frame)
        await self.send_frame(frame, timeout)

    async def send_frame(self, frame: bytes, timeout: float | None = None) -> None:
        limit = math.inf if timeout is None else timeout
        link = self._link
        if link is None and not self._closed:
            # Sent before the peer connected (a listener's first moments): wait for it.
            with trio.move_on_after(limit):
                await self._linked.wait()
            link = self._link
            if link is None and not self._closed:
                raise MailboxFull(f"{self.name}: no peer connected within {timeout}s")
        if self._closed or link is None:
            raise ChannelClosed(f"channel {self.name} is closed")
        try:
            await link.send(frame, limit)
        except MailboxFull:
            raise MailboxFull(f"{self.name}: peer mailbox stayed full for {timeout}s") from None
        except ChannelClosed:
            raise ChannelClosed(f"channel {self.name} is closed") from None
        self.frames_out += 1

    async def tell(self, recipient: str, body: dict[str, Any], timeout: float | None = None) -> None:
        await self.send(Envelope(Kind.TELL, self.name, recipient, body, token=self.token), timeout)

    async def tell_many(self, recipient: str, bodies: list[dict[str, Any]], timeout: float | None = None) -> None:
        """Many one-way messages in one frame: the receiver's inbox sees them one by
        one, in order. Amortizes the per-frame cost (syscalls, nng, envelope)."""
        await self.send(Envelope(Kind.TELL, self.name, recipient, {BATCH: bodies}, token=self.token), timeout)

    async def request(self, recipient: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        envelope = Envelope(Kind.REQUEST, self.name, recipient, body, token=self.token)
        reply = await self.request_envelope(envelope, timeout)
        return reply.body

    async def request_envelope(self, envelope: Envelope, timeout: float) -> Envelope:
        pending = _Pending()
        self._pending[envelope.msg_id] = pending
        try:
            with trio.move_on_after(timeout) as scope:
                await self.send(envelope)
                await pending.done.wait()
            if scope.cancelled_caught:
                raise DeadlineExceeded(
                    f"{envelope.body.get('method', envelope.kind)} to {envelope.recipient}: no reply within {timeout}s"
                )
        finally:
            self._pending.pop(envelope.msg_id, None)
        reply = pending.reply
        if reply is None:
            raise ChannelClosed(f"channel {self.name} closed while waiting for a reply")
        if reply.kind is Kind.ERROR:
            raise RemoteError(str(reply.body.get("code", "error")), str(reply.body.get("message")))
        return reply

    async def reply(self, request: Envelope, body: dict[str, Any]) -> None:
        await self.send(request.reply(body, sender=self.name))

    async def reply_error(self, request: Envelope, code: str, message: str) -> None:
        await self.send(request.error(code, message, sender=self.name))

    async def run_reader(
        self,
        connect: Callable[[], Awaitable[Link | None]] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Read frames until the link closes (first waiting for ``connect``: a
        listener's peer). Owned by the channel owner's nursery."""
        task_status.started()
        try:
            if connect is not None:
                link = await connect()
                if link is None:
                    return  # the peer never came
                self.attach(link)
            await self._linked.wait()
            if self._link is None or self._closed:
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._link.run_writer)
                await self._read(self._link)
                nursery.cancel_scope.cancel()
        finally:
            self._closed = True
            self._linked.set()
            for pending in self._pending.values():
                pending.done.set()
            self._inbox_send.close()

    async def _read(self, link: Link) -> None:
        while True:
            try:
                frame = await link.receive()
            except links.FrameOverflow as exc:
                log.warning("%s: dropping the link: %s", self.name, exc)
                return
            if frame is None:
                return
            self.frames_in += 1
            try:
                envelope = decode(frame, self.max_frame)
            except FrameError as exc:
                self.bad_frames += 1
                log.warning("%s: rejected frame: %s", self.name, exc)
                await self._send_frame_error(exc)
                continue
            if envelope.kind in _ANSWERS and envelope.corr_id in self._pending:
                pending = self._pending[envelope.corr_id]
                pending.reply = envelope
                pending.done.set()
                continue
            if envelope.kind is Kind.TELL and BATCH in envelope.body:
                await self._unbatch(envelope)
                continue
            await self._inbox_send.send(envelope)

    async def _unbatch(self, envelope: Envelope) -> None:
        bodies = envelope.body[BATCH]
        if not isinstance(bodies, list) or not all(isinstance(b, dict) for b in bodies):
            self.bad_frames += 1
            return
        for index, body in enumerate(bodies):
            await self._inbox_send.send(Envelope(
                Kind.TELL, envelope.sender, envelope.recipient, body, msg_id=f"{envelope.msg_id[:56]}.{index}",
                sent_at=envelope.sent_at, token=envelope.token,
            ))

    async def _send_frame_error(self, exc: FrameError) -> None:
        error = Envelope(Kind.ERROR, self.name, "?", {"code": exc.code, "message": str(exc)})
        try:
            await self.send(error, timeout=1.0)
        except (ChannelClosed, MailboxFull):
            pass

    def close(self) -> None:
        """Close the link: a task still sending (e.g. a reply to an actor that just
        died) or receiving gets ChannelClosed instead of waiting on a closed socket."""
        self._closed = True
        self._linked.set()
        if self._link is not None:
            self._link.close()


@asynccontextmanager
async def open_channel(
    address: str,
    name: str,
    *,
    listen: bool,
    max_frame: int = DEFAULT_MAX_FRAME,
    inbox_size: int = DEFAULT_INBOX,
    token: str | None = None,
    transport: Transport = NNG,
    secret: bytes | None = None,
) -> AsyncIterator[Channel]:
    """A channel with its reader running in a nursery owned by this context. The
    listening end is usable at once: what it sends waits for its peer. ``secret``:
    the link's peer must prove it (mailbox/transport.py)."""
    channel = Channel(name, max_frame=max_frame, inbox_size=inbox_size, token=token)
    connect: Callable[[], Awaitable[Link | None]] | None = None
    listener = None
    try:
        if listen:
            listener = transport.listen(address, channel.hard_limit, secret)
            connect = listener.accept
        else:
            channel.attach(await transport.dial(address, channel.hard_limit, secret))
        async with trio.open_nursery() as nursery:
            await nursery.start(channel.run_reader, connect)
            try:
                yield channel
            finally:
                nursery.cancel_scope.cancel()
    finally:
        channel.close()
        if listener is not None:
            listener.close()

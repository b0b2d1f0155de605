"""A bidirectional message channel over one nng Pair0 socket.

Request/reply is built here (not with nng Req/Rep) because both ends of an actor link
make requests: the reader task matches replies to waiting requests by ``corr_id``
and puts everything else into a bounded inbox. When the inbox is full the reader
stops reading, nng's buffers fill, and the peer's sends block: backpressure end to
end with bounded memory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pynng
import trio

from corral.mailbox.codec import DEFAULT_MAX_FRAME, decode, encode
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.errors import (
    ChannelClosed,
    DeadlineExceeded,
    FrameError,
    MailboxFull,
    RemoteError,
)

log = logging.getLogger(__name__)

DEFAULT_INBOX = 256
#: nng hard limit: frames between max_frame and this are read and answered with a
#: typed error; beyond it nng drops the pipe, which bounds a hostile peer's memory.
HARD_FRAME_FACTOR = 4


_ANSWERS = (Kind.REPLY, Kind.ERROR, Kind.WELCOME)


@dataclass
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    reply: Envelope | None = None


class Channel:
    def __init__(
        self,
        socket: pynng.Socket,
        name: str,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        inbox_size: int = DEFAULT_INBOX,
        token: str | None = None,
    ) -> None:
        self.socket = socket
        self.name = name
        self.max_frame = max_frame
        self.token = token
        self._pending: dict[str, _Pending] = {}
        self._inbox_send, self.inbox = trio.open_memory_channel[Envelope](inbox_size)
        self._closed = False
        self.frames_in = 0
        self.frames_out = 0
        self.bad_frames = 0
        self.send_lock = trio.Lock()

    async def send(self, envelope: Envelope, timeout: float | None = None) -> None:
        frame = encode(envelope, self.max_frame)
        await self.send_frame(frame, timeout)

    async def send_frame(self, frame: bytes, timeout: float | None = None) -> None:
        if self._closed:
            raise ChannelClosed(f"channel {self.name} is closed")
        with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
            try:
                await self.socket.asend(frame)
            except pynng.Closed:
                raise ChannelClosed(f"channel {self.name} is closed") from None
            self.frames_out += 1
        if scope.cancelled_caught:
            raise MailboxFull(f"{self.name}: peer mailbox stayed full for {timeout}s")

    async def tell(self, recipient: str, body: dict[str, Any], timeout: float | None = None) -> None:
        await self.send(Envelope(Kind.TELL, self.name, recipient, body, token=self.token), timeout)

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

    async def run_reader(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read frames until the socket closes. Owned by the channel owner's nursery."""
        task_status.started()
        try:
            while True:
                try:
                    frame = await self.socket.arecv()
                except pynng.Closed:
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
                await self._inbox_send.send(envelope)
        finally:
            self._closed = True
            for pending in self._pending.values():
                pending.done.set()
            self._inbox_send.close()

    async def _send_frame_error(self, exc: FrameError) -> None:
        error = Envelope(Kind.ERROR, self.name, "?", {"code": exc.code, "message": str(exc)})
        with trio.move_on_after(1.0):
            try:
                await self.send(error)
            except (ChannelClosed, pynng.NNGException):
                pass

    def close(self) -> None:
        self._closed = True
        self.socket.close()


def configure_socket(socket: pynng.Socket, max_frame: int) -> None:
    socket.recv_max_size = max_frame * HARD_FRAME_FACTOR


@asynccontextmanager
async def open_channel(
    address: str,
    name: str,
    *,
    listen: bool,
    max_frame: int = DEFAULT_MAX_FRAME,
    inbox_size: int = DEFAULT_INBOX,
    token: str | None = None,
) -> AsyncIterator[Channel]:
    """A channel with its reader running in a nursery owned by this context."""
    socket = pynng.Pair0()
    configure_socket(socket, max_frame)
    try:
        if listen:
            socket.listen(address)
        else:
            socket.dial(address, block=True)
        channel = Channel(socket, name, max_frame=max_frame, inbox_size=inbox_size, token=token)
        async with trio.open_nursery() as nursery:
            await nursery.start(channel.run_reader)
            try:
                yield channel
            finally:
                nursery.cancel_scope.cancel()
    finally:
        socket.close()

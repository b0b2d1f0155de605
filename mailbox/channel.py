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
#: Body key of a batched tell (``Channel.tell_many``).
BATCH = "__batch__"
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
        self._send_fd: int | None = None
        self._recv_fd: int | None = None

    async def send(self, envelope: Envelope, timeout: float | None = None) -> None:
        frame = encode(envelope, self.max_frame)
        await self.send_frame(frame, timeout)

    async def send_frame(self, frame: bytes, timeout: float | None = None) -> None:
        if self._closed:
            raise ChannelClosed(f"channel {self.name} is closed")
        with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
            try:
                await self._send_nowait_or_wait(frame)
            except (pynng.Closed, trio.ClosedResourceError):
                raise ChannelClosed(f"channel {self.name} is closed") from None
            self.frames_out += 1
        if scope.cancelled_caught:
            raise MailboxFull(f"{self.name}: peer mailbox stayed full for {timeout}s")

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

    # nng's own aio completes on an nng thread and wakes trio through a cross-thread
    # callback, which cost ~150 µs per round trip here. Its pollable fds let trio's
    # epoll wait instead, and the non-blocking calls then never block: same latency
    # as a synchronous socket, still cancellable. (Callers cancel the reader before
    # closing the socket, which is what trio needs for an fd it waits on.)

    async def _send_nowait_or_wait(self, frame: bytes) -> None:
        try:
            self.socket.send(frame, block=False)
            return
        except pynng.TryAgain:
            pass
        # Full: wait for room. trio allows one waiter per fd, so senders queue on
        # the lock (FIFO, which also keeps their frames in order).
        async with self.send_lock:
            while True:
                try:
                    self.socket.send(frame, block=False)
                    return
                except pynng.TryAgain:
                    if self._send_fd is None:
                        self._send_fd = self.socket.send_fd
                    await trio.lowlevel.wait_readable(self._send_fd)

    async def _recv_nowait_or_wait(self) -> bytes:
        while True:
            try:
                frame: bytes = self.socket.recv(block=False)
                return frame
            except pynng.TryAgain:
                if self._recv_fd is None:
                    self._recv_fd = self.socket.recv_fd
                await trio.lowlevel.wait_readable(self._recv_fd)

    async def run_reader(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read frames until the socket closes. Owned by the channel owner's nursery."""
        task_status.started()
        try:
            while True:
                try:
                    frame = await self._recv_nowait_or_wait()
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
                if envelope.kind is Kind.TELL and BATCH in envelope.body:
                    await self._unbatch(envelope)
                    continue
                await self._inbox_send.send(envelope)
        finally:
            self._closed = True
            for pending in self._pending.values():
                pending.done.set()
            self._inbox_send.close()

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
        with trio.move_on_after(1.0):
            try:
                await self.send(error)
            except (ChannelClosed, pynng.NNGException):
                pass

    def close(self) -> None:
        """Close the socket, first telling trio about the nng fds it may be waiting
        on: a task still sending (e.g. a reply to an actor that just died) then
        gets ChannelClosed instead of waiting on a closed fd."""
        self._closed = True
        for fd in (self._send_fd, self._recv_fd):
            if fd is not None:
                trio.lowlevel.notify_closing(fd)
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

"""The control protocol: nng Req/Rep carrying envelopes with token and version.

The server side answers every frame it receives, garbage included, with an envelope
(an ERROR with a stable code when the frame is bad), so a client always learns why.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pynng
import trio

from corral.core.errors import CorralError
from corral.mailbox.addresses import bound_tcp_address
from corral.mailbox.channel import HARD_FRAME_FACTOR
from corral.mailbox.codec import DEFAULT_MAX_FRAME, decode, encode
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.errors import DeadlineExceeded, FrameError, FrameTooLarge, RemoteError

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


def configure_socket(socket: pynng.Socket, max_frame: int) -> None:
    """nng drops a frame past the hard limit (and its pipe), which bounds a hostile peer's memory."""
    socket.recv_max_size = max_frame * HARD_FRAME_FACTOR


class ControlError(RemoteError):
    """An error answered by the control API (code is stable, message is for people)."""


class ControlServer:
    def __init__(
        self,
        address: str,
        token: str,
        handler: Handler,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        idle_workers: int = 8,
        max_workers: int = 1024,
    ) -> None:
        self.address = address
        self._token = token
        self._handler = handler
        self.max_frame = max_frame
        #: An elastic pool: ``idle_workers`` contexts always wait for a request, so a
        #: request that takes long (an events long poll, a run waiting for its
        #: supervisor work) never starves pings and run creation; up to ``max_workers``.
        self.idle_workers = idle_workers
        self.max_workers = max_workers
        self.workers = 0
        self.idle = 0
        self.rejected = 0

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        with pynng.Rep0() as socket:
            configure_socket(socket, self.max_frame)
            socket.listen(self.address)
            address = self.address
            if address.startswith("tcp://") and address.endswith(":0"):
                address = bound_tcp_address(socket.listeners[0])
            async with trio.open_nursery() as nursery:
                for _ in range(self.idle_workers):
                    self._spawn(nursery, socket)
                task_status.started(address)

    def _spawn(self, nursery: trio.Nursery, socket: pynng.Rep0) -> None:
        self.workers += 1
        nursery.start_soon(self._worker, nursery, socket, socket.new_context())

    async def _worker(self, nursery: trio.Nursery, socket: pynng.Rep0, context: pynng.Context) -> None:
        try:
            with context:
                while True:
                    self.idle += 1
                    try:
                        frame = await context.arecv()
                    except pynng.Closed:
                        return
                    finally:
                        self.idle -= 1
                    if self.idle < self.idle_workers and self.workers < self.max_workers:
                        self._spawn(nursery, socket)
                    reply = await self._answer(frame)
                    try:
                        await context.asend(reply)
                    except pynng.NNGException as exc:
                        log.debug("control reply not delivered: %s", exc)
                    if self.idle >= self.idle_workers:
                        return  # surplus after a burst: the pool shrinks back
        finally:
            self.workers -= 1

    async def _answer(self, frame: bytes) -> bytes:
        try:
            request = decode(frame, self.max_frame)
        except FrameError as exc:
            self.rejected += 1
            return encode(Envelope(Kind.ERROR, "supervisor", "?", _err(exc.code, str(exc))))
        if request.kind is not Kind.REQUEST:
            self.rejected += 1
            return encode(request.error("bad-request", f"expected a request, got {request.kind}"))
        if request.token is None or not hmac.compare_digest(request.token, self._token):
            self.rejected += 1
            return encode(request.error("bad-token", "wrong or missing token for this supervisor"))
        method = request.body.get("method")
        params = request.body.get("params", {})
        if not isinstance(method, str) or not isinstance(params, dict):
            self.rejected += 1
            return encode(request.error("bad-request", "body needs method: str and params: map"))
        try:
            result = await self._handler(method, params)
        except ControlError as exc:
            return encode(request.error(exc.code, exc.message))
        except Exception as exc:  # a handler bug must not take the control API down
            log.exception("control method %s failed", method)
            return encode(request.error("internal", f"{type(exc).__name__}: {exc}"))
        reply = request.reply({"result": result}, sender="supervisor")
        try:
            return encode(reply, self.max_frame)
        except FrameTooLarge as exc:
            return encode(request.error(exc.code, str(exc)))


def _err(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


class SupervisorGone(CorralError, ConnectionError):
    """The supervisor is not there to answer: it exited mid-call, or nothing listens at its address."""


class ControlClient:
    """Synchronous client for the CLI: one Req0 socket, a deadline per call.

    Each call races the nng exchange against a pidfd of the supervisor, so a
    supervisor that dies mid-call is reported at once instead of after the
    deadline (nng's Req socket would otherwise wait to resend to a new peer).
    """

    def __init__(self, address: str, token: str, timeout: float = 10.0, pid: int | None = None) -> None:
        self.address = address
        self._token = token
        self.timeout = timeout
        self.pid = pid
        self._socket = pynng.Req0()
        # Answers are capped by the server's frame limit; nng's own default (1 MiB)
        # would silently drop the pipe on a maximal one instead.
        configure_socket(self._socket, DEFAULT_MAX_FRAME)
        try:
            self._socket.dial(address, block=True)
        except pynng.NNGException as exc:
            self._socket.close()
            raise SupervisorGone(f"no supervisor answers at {address}: {exc}") from exc

    def call(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        request = Envelope(Kind.REQUEST, "cli", "supervisor", {"method": method, "params": params}, token=self._token)
        reply = self.call_raw(encode(request), timeout)
        if reply.kind is Kind.ERROR:
            raise ControlError(str(reply.body.get("code")), str(reply.body.get("message")))
        if reply.corr_id != request.msg_id:
            raise ControlError("bad-reply", "reply does not match the request id")
        return reply.body.get("result")

    def call_raw(self, frame: bytes, timeout: float | None = None) -> Envelope:
        """Send any bytes (tests use this for garbage) and decode the answer."""
        data: bytes = trio.run(self._exchange, frame, self.timeout if timeout is None else timeout)
        return decode(data)

    async def _exchange(self, frame: bytes, timeout: float) -> bytes:
        try:
            return await self._race(frame, timeout)
        except BaseExceptionGroup as group:
            # Callers catch SupervisorGone / DeadlineExceeded, not trio's group.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise

    async def _race(self, frame: bytes, timeout: float) -> bytes:
        answer: list[bytes] = []
        async with trio.open_nursery() as nursery:

            async def talk() -> None:
                try:
                    await self._socket.asend(frame)
                    answer.append(await self._socket.arecv())
                except pynng.NNGException as exc:
                    # The pipe can drop (ECONNSHUT) a moment before the pidfd turns
                    # readable; both mean the same thing to the caller.
                    raise SupervisorGone(f"lost the connection to the supervisor: {exc}") from exc
                nursery.cancel_scope.cancel()

            async def watch() -> None:
                if self.pid is None:
                    return
                try:
                    fd = os.pidfd_open(self.pid)
                except ProcessLookupError:
                    raise SupervisorGone(f"the supervisor (pid {self.pid}) is gone") from None
                try:
                    await trio.lowlevel.wait_readable(fd)
                finally:
                    trio.lowlevel.notify_closing(fd)
                    os.close(fd)
                raise SupervisorGone(f"the supervisor (pid {self.pid}) exited before answering")

            nursery.start_soon(talk)
            nursery.start_soon(watch)
            with trio.move_on_after(timeout) as scope:
                await trio.sleep_forever()
            if scope.cancelled_caught:
                raise DeadlineExceeded(f"supervisor at {self.address} did not answer within {timeout}s")
        return answer[0]

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

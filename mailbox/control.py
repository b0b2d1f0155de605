"""The control protocol: nng Req/Rep carrying envelopes with token and version.

The server side answers every frame it receives, garbage included, with an envelope
(an ERROR with a stable code when the frame is bad), so a client always learns why.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pynng
import trio
from corral.mailbox.channel import configure_socket
from corral.mailbox.codec import DEFAULT_MAX_FRAME, decode, encode
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.errors import DeadlineExceeded, FrameError, FrameTooLarge, RemoteError

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


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
        concurrency: int = 16,
    ) -> None:
        self.address = address
        self._token = token
        self._handler = handler
        self.max_frame = max_frame
        self.concurrency = concurrency
        self.rejected = 0

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        with pynng.Rep0() as socket:
            configure_socket(socket, self.max_frame)
            socket.listen(self.address)
            address = self.address
            if address.startswith("tcp://") and address.endswith(":0"):
                port = socket.listeners[0].local_address.port
                address = f"tcp://127.0.0.1:{port}"
            async with trio.open_nursery() as nursery:
                for _ in range(self.concurrency):
                    nursery.start_soon(self._worker, socket.new_context())
                task_status.started(address)

    async def _worker(self, context: pynng.Context) -> None:
        with context:
            while True:
                try:
                    frame = await context.arecv()
                except pynng.Closed:
                    return
                reply = await self._answer(frame)
                try:
                    await context.asend(reply)
                except pynng.NNGException as exc:
                    log.debug("control reply not delivered: %s", exc)

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


class ControlClient:
    """Synchronous client for the CLI: one Req0 socket, a deadline per call."""

    def __init__(self, address: str, token: str, timeout: float = 10.0) -> None:
        self.address = address
        self._token = token
        self.timeout = timeout
        self._socket = pynng.Req0(recv_timeout=int(timeout * 1000), send_timeout=int(timeout * 1000))
        self._socket.dial(address, block=True)

    def call(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        request = Envelope(
            Kind.REQUEST, "cli", "supervisor", {"method": method, "params": params}, token=self._token
        )
        reply = self.call_raw(encode(request), timeout)
        if reply.kind is Kind.ERROR:
            raise ControlError(str(reply.body.get("code")), str(reply.body.get("message")))
        if reply.corr_id != request.msg_id:
            raise ControlError("bad-reply", "reply does not match the request id")
        return reply.body.get("result")

    def call_raw(self, frame: bytes, timeout: float | None = None) -> Envelope:
        """Send any bytes (tests use this for garbage) and decode the answer."""
        if timeout is not None:
            self._socket.recv_timeout = int(timeout * 1000)
        try:
            self._socket.send(frame)
            return decode(self._socket.recv())
        except pynng.Timeout:
            raise DeadlineExceeded(f"supervisor at {self.address} did not answer in time") from None
        finally:
            if timeout is not None:
                self._socket.recv_timeout = int(self.timeout * 1000)

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

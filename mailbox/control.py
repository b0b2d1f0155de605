"""The control protocol: nng Req/Rep carrying envelopes with token and version.

The server side answers every frame it receives, garbage included, with an envelope
(an ERROR with a stable code when the frame is bad), so a client always learns why.
"""

from __future__ import annotations

import errno
import functools
import hmac
import logging
import os
import secrets
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pynng
import trio

from corral.core import failpoints
from corral.core.errors import CorralError
from corral.mailbox import port_fallback
from corral.mailbox.addresses import bound_tcp_address
from corral.mailbox.channel import HARD_FRAME_FACTOR
from corral.mailbox.codec import DEFAULT_MAX_FRAME, decode, encode
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.errors import DeadlineExceeded, FrameError, FrameTooLarge, RemoteError

log = logging.getLogger(__name__)

Handler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
#: Whether a request (method, params) waits: it goes to the long-poll pool.
LongPollCheck = Callable[[str, dict[str, Any]], bool]

#: Before the control socket binds (a test: ``raise`` stands for a kernel with no free ephemeral port).
BIND_FAILPOINT = "control.bind-any"

#: Long polls held at once by default: past the 900 a swarm's followers were seen to
#: hold; each costs an nng context and a task, not a worker.
DEFAULT_MAX_LONG_POLLS = 1024


def configure_socket(socket: pynng.Socket, max_frame: int) -> None:
    """nng drops a frame past the hard limit (and its pipe), which bounds a hostile peer's memory."""
    socket.recv_max_size = max_frame * HARD_FRAME_FACTOR


class ControlError(RemoteError):
    """An error answered by the control API (code is stable, message is for people)."""


class ControlServer:
    """The supervisor's Rep socket, with two pools.

    Quick requests are answered by an elastic pool of workers: ``idle_workers``
    contexts always wait for a request, up to ``max_workers``. A request that
    waits (``is_long_poll``: an events long poll, a run wait, a session poll) is
    handed, with its context, to a pool of its own, at most ``max_long_polls`` at
    once; past that it is refused at once with ``too-many-long-polls``. The worker
    that received it takes a fresh context, so no number of waiting requests from
    anyone holding the token leaves ``status`` or ``ping`` without a worker.
    """

    def __init__(
        self,
        address: str,
        token: str,
        handler: Handler,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        idle_workers: int = 8,
        max_workers: int = 1024,
        is_long_poll: LongPollCheck | None = None,
        max_long_polls: int = DEFAULT_MAX_LONG_POLLS,
        listen_at: str | None = None,
    ) -> None:
        #: What clients dial; ``listen_at`` (default: the same) is what nng binds.
        self.address = address
        self.listen_at = listen_at or address
        self._token = token
        self._handler = handler
        self.max_frame = max_frame
        self.idle_workers = idle_workers
        self.max_workers = max_workers
        self.workers = 0
        self.idle = 0
        self.rejected = 0
        self._is_long_poll = is_long_poll or _never
        self.max_long_polls = max_long_polls
        self.long_polls = 0
        self.long_polls_refused = 0

    def counters(self) -> dict[str, int]:
        return {
            "workers": self.workers,
            "idle_workers": self.idle,
            "long_polls": self.long_polls,
            "max_long_polls": self.max_long_polls,
            "long_polls_refused": self.long_polls_refused,
            "rejected": self.rejected,
        }

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        with pynng.Rep0() as socket:
            configure_socket(socket, self.max_frame)
            self._listen(socket)
            address = self.address
            if address.startswith("tcp://") and address.endswith(":0"):
                address = bound_tcp_address(socket.listeners[0])
            async with trio.open_nursery() as nursery:
                for _ in range(self.idle_workers):
                    self._spawn(nursery, socket)
                task_status.started(address)

    def _listen(self, socket: pynng.Rep0) -> None:
        """Listen where asked; a loopback ``:0`` that finds no free port (``AddrInUse``)
        on Linux tries the high ports instead (mailbox/port_fallback.py, seed 004 V1.1
        §2). Any other failure, and a fallback that finds nothing, fail closed."""
        try:
            failpoints.hit(BIND_FAILPOINT)  # a test: the kernel had no ephemeral port free
            socket.listen(self.listen_at)
            return
        except (pynng.AddressInUse, failpoints.FailpointError):
            host, _, port = self.listen_at.removeprefix("tcp://").rpartition(":")
            if not self.listen_at.startswith("tcp://") or port != "0" or not sys.platform.startswith("linux"):
                raise
        for candidate in port_fallback.read_candidates(seed=secrets.randbelow(1 << 30)):
            try:
                socket.listen(f"tcp://{host}:{candidate}")
            except pynng.AddressInUse:
                continue  # taken: the next one
            log.warning("control: no ephemeral loopback port was free; listening on %s:%d", host, candidate)
            return
        raise port_fallback.FallbackError("every candidate port in the high range is taken")

    def _spawn(self, nursery: trio.Nursery, socket: pynng.Rep0) -> None:
        self.workers += 1
        nursery.start_soon(self._worker, nursery, socket)

    async def _worker(self, nursery: trio.Nursery, socket: pynng.Rep0) -> None:
        context: pynng.Context | None = None
        try:
            while True:
                if context is None:
                    context = socket.new_context()
                self.idle += 1
                try:
                    frame = await context.arecv()
                except pynng.Closed:
                    return
                finally:
                    self.idle -= 1
                if self.idle < self.idle_workers and self.workers < self.max_workers:
                    self._spawn(nursery, socket)
                request = self._admit(frame)
                if isinstance(request, bytes):
                    reply = request
                elif self._is_long_poll(*_method_params(request)):
                    if self.long_polls < self.max_long_polls:
                        self.long_polls += 1
                        nursery.start_soon(self._long_poll, context, request)
                        context = None  # the long poll answers on it; this worker goes on
                        continue
                    self.long_polls_refused += 1
                    reply = encode(request.error("too-many-long-polls", self._refusal()))
                else:
                    reply = await self._dispatch(request)
                await _send(context, reply)
                if self.idle >= self.idle_workers:
                    return  # surplus after a burst: the pool shrinks back
        finally:
            self.workers -= 1
            if context is not None:
                context.close()

    async def _long_poll(self, context: pynng.Context, request: Envelope) -> None:
        try:
            with context:
                await _send(context, await self._dispatch(request))
        finally:
            self.long_polls -= 1

    def _refusal(self) -> str:
        return (
            f"{self.long_polls} long polls are already waiting on this supervisor (its limit); "
            "wait for one to end, poll from fewer clients, or raise supervisor.max_long_polls in the spec"
        )

    def _admit(self, frame: bytes) -> Envelope | bytes:
        """The request, or the encoded refusal of a frame that is not a valid one."""
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
        if not isinstance(request.body.get("method"), str) or not isinstance(request.body.get("params", {}), dict):
            self.rejected += 1
            return encode(request.error("bad-request", "body needs method: str and params: map"))
        return request

    async def _dispatch(self, request: Envelope) -> bytes:
        method, params = _method_params(request)
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


def _method_params(request: Envelope) -> tuple[str, dict[str, Any]]:
    """Of a request ``_admit`` let through (method: str, params: map)."""
    return str(request.body["method"]), dict(request.body.get("params", {}))


def _never(method: str, params: dict[str, Any]) -> bool:
    return False


async def _send(context: pynng.Context, reply: bytes) -> None:
    try:
        await context.asend(reply)
    except pynng.NNGException as exc:
        log.debug("control reply not delivered: %s", exc)


def _err(code: str, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


class SupervisorGone(CorralError, ConnectionError):
    """The supervisor is not there to answer: it exited mid-call, or nothing listens at its address."""


class ClientClosed(CorralError, ConnectionError):
    """The client was closed while this call was in flight (by another task or thread)."""


class ControlClient:
    """The client end of the control API: one Req0 socket, a deadline per call.

    ``acall`` is the exchange, awaited under asyncio or trio (anyio); ``call`` runs
    it in a short trio loop for synchronous callers (the CLI). Any number of calls
    may be in flight at once, from any number of tasks: each opens its own nng
    context on the one socket, and nng matches each reply to its context's request
    (a ``wait`` long poll does not hold up an ``approve``). Each call races the
    exchange against a pidfd of the supervisor, so a supervisor that dies mid-call
    is reported at once instead of after the deadline (nng's Req socket would
    otherwise wait to resend to a new peer).
    """

    def __init__(self, address: str, token: str, timeout: float = 10.0, pid: int | None = None) -> None:
        self.address = address
        self._token = token
        self.timeout = timeout
        self.pid = pid
        self.closed = False
        self._in_flight = 0
        self._retired = False
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
        return trio.run(functools.partial(self.acall, method, timeout, **params))

    async def acall(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        request = Envelope(Kind.REQUEST, "cli", "supervisor", {"method": method, "params": params}, token=self._token)
        reply = decode(await self._exchange(encode(request), self.timeout if timeout is None else timeout))
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
        if self.closed:
            raise ClientClosed(f"this connection to the supervisor at {self.address} is closed")
        self._in_flight += 1
        try:
            return await self._race(frame, timeout)
        except BaseExceptionGroup as group:
            # Callers catch SupervisorGone / DeadlineExceeded, not a task group's group.
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        finally:
            self._in_flight -= 1
            if self._retired and not self._in_flight:
                self.close()

    async def _race(self, frame: bytes, timeout: float) -> bytes:
        answer: list[bytes] = []
        with anyio.move_on_after(timeout) as deadline:
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch)  # its SupervisorGone cancels the exchange
                group.start_soon(self._talk, frame, answer, group.cancel_scope)
        if answer:
            return answer[0]
        if deadline.cancelled_caught:
            raise DeadlineExceeded(f"supervisor at {self.address} did not answer within {timeout}s")
        raise AssertionError("unreachable: the exchange answers, raises or is cancelled")

    async def _talk(self, frame: bytes, answer: list[bytes], done: anyio.CancelScope) -> None:
        """One request and its reply on a context of its own.

        Why contexts: nng's Req protocol already matches replies to requests per
        context, and a context costs no descriptor and no connection, so any number
        of followers share one pipe. A socket per call would cost a connection and
        descriptors each, and ids matched by hand a raw socket and nng's header
        done over. Their send and receive are pynng's awaitables (nng's aio), which on asyncio
        end a cancellation with a bare CancelledError that anyio's deadlines do not
        take for theirs; run here as a task of the race's group, the exchange is
        cancelled by the group, which takes any CancelledError of its task as the
        task's end. A cancelled exchange cancels its request: nng drops the late
        reply with the context, never handing it to another call."""
        try:
            context = self._socket.new_context()
        except pynng.NNGException as exc:
            raise self._lost(exc) from exc
        try:
            await context.asend(frame)
            answer.append(await context.arecv())
        except pynng.NNGException as exc:
            raise self._lost(exc) from exc
        finally:
            try:
                context.close()
            except pynng.NNGException:
                pass  # closed with its socket already
        done.cancel()  # answered: stop watching

    def _lost(self, exc: pynng.NNGException) -> CorralError:
        if self.closed:
            return ClientClosed(f"the client was closed while this call to {self.address} was in flight")
        return SupervisorGone(f"lost the connection to the supervisor: {exc}")

    async def _watch(self) -> None:
        """Raise ``SupervisorGone`` once the supervisor's process has exited."""
        if self.pid is None:
            return
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            raise SupervisorGone(f"the supervisor (pid {self.pid}) is gone") from None
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            # Out of descriptors (each call in flight holds a pidfd): this call goes
            # unwatched, and a supervisor that dies under it is found by its deadline.
            return
        try:
            await anyio.wait_readable(fd)
        finally:
            anyio.notify_closing(fd)
            os.close(fd)
        raise SupervisorGone(f"the supervisor (pid {self.pid}) exited before answering")

    def retire(self) -> None:
        """Take no new call and close once the calls in flight have ended: for a
        connection found stale (its supervisor gone, or restarted with a new token)
        while other tasks' calls may still be running on it."""
        self._retired = True
        if not self._in_flight:
            self.close()

    def close(self) -> None:
        """Close now: calls in flight on this connection fail at once with ``ClientClosed``."""
        self.closed = True
        self._socket.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

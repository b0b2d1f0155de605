"""A fault proxy, loopback only: the acceptance suite puts it in front of a real
OpenAI-compatible server (seed 004 V1.29, V1.42), the tests in front of their fake one.

``FaultProxy`` sits in front of any upstream and drops, delays or holds a chosen
request, before the upstream sees it or after it answered. The request is chosen by
its sequence number at the proxy: from a fixed table, or by a ``selector`` called
with the sequence number only (never a URL, header or body), which may consult
persisted facts elsewhere (the acceptance suite reads its ledger) to decide. Like the fake server it records
metadata only (sequence, path without query, arrival times, whether an
Authorization header came, what fault applied and how the exchange ended), never a
body or a header value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import trio

from corral.acceptance.loopback_http import (
    CHUNK,
    DEFAULT_WAIT_S,
    GONE,
    LOOPBACK,
    BadRequest,
    RecordLog,
    Request,
    listen,
    read_or_refuse,
    send_simple,
    wait_for_eof,
)

MAX_PROXIED_RESPONSE = 16 * 1024 * 1024


# --- records ----------------------------------------------------------------------


@dataclass
class ProxyRecord:
    seq: int
    method: str
    path: str
    arrived_wall: float
    arrived_monotonic: float
    has_authorization: bool
    fault: str | None = None
    held: bool = False
    forwarded: bool = False
    #: relayed, dropped-request, dropped-response, client-gone, upstream-error.
    outcome: str | None = None


# --- the fault proxy --------------------------------------------------------------

FaultAction = Literal["drop", "delay", "hold"]
FaultPhase = Literal["request", "response"]


@dataclass(frozen=True)
class Fault:
    """What to do to one request. Phase ``request``: before it reaches the
    upstream (which never sees a dropped one). Phase ``response``: after the
    upstream answered in full, before the client gets it (a dropped response means
    the upstream did the work but the client saw only a broken connection)."""

    action: FaultAction
    phase: FaultPhase = "request"
    delay_ms: int = 0
    #: For ``hold``: the test sets it (same trio run) or calls FaultProxy.release.
    release: trio.Event | None = None

    @classmethod
    def drop(cls, phase: FaultPhase = "request") -> Fault:
        return cls("drop", phase)

    @classmethod
    def delay(cls, delay_ms: int, phase: FaultPhase = "request") -> Fault:
        return cls("delay", phase, delay_ms=delay_ms)

    @classmethod
    def hold(cls, release: trio.Event | None = None, phase: FaultPhase = "request") -> Fault:
        return cls("hold", phase, release=release)

    def label(self) -> str:
        return f"{self.action}-{self.phase}"


#: Chooses the fault of a request the table does not name, from its sequence number
#: alone; runs in a worker thread (it may block, on a ledger read say).
Selector = Callable[[int], "Fault | None"]


def _forwarded_request(request: Request, host: str) -> bytes:
    # Connection: close makes the upstream's response end at EOF, whatever its framing.
    hop = {"connection", "keep-alive", "proxy-connection", "host"}
    lines = [f"{request.method} {request.target} {request.version}", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in request.headers if k.lower() not in hop]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body


async def _read_to_eof(stream: trio.abc.ReceiveStream, limit: int) -> bytes:
    data = bytearray()
    while chunk := await stream.receive_some(CHUNK):
        data += chunk
        if len(data) > limit:
            raise BadRequest(502, "upstream response too large for the proxy to hold")
    return bytes(data)


class FaultProxy:
    """A TCP-level HTTP proxy in front of ``upstream_url`` applying per-request
    faults, keyed by the 1-based sequence number of requests at the proxy."""

    def __init__(
        self,
        upstream_url: str,
        faults: Mapping[int, Fault] | None = None,
        selector: Selector | None = None,
    ) -> None:
        parts = urlsplit(upstream_url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream URL needs a host and a port: {upstream_url!r}")
        self._upstream = (parts.hostname, parts.port)
        self._base_path = parts.path.rstrip("/")
        self._faults = dict(faults or {})
        self._selector = selector
        self._lock = threading.Lock()
        self._next_seq = 1
        self._events: dict[int, trio.Event] = {}
        self._released: set[int] = set()
        self._token: trio.lowlevel.TrioToken | None = None
        self.log: RecordLog[ProxyRecord] = RecordLog()
        self.url = ""

    @property
    def requests(self) -> list[ProxyRecord]:
        return self.log.snapshot()

    def set_fault(self, seq: int, fault: Fault) -> None:
        with self._lock:
            self._faults[seq] = fault

    def release(self, seq: int) -> None:
        """Let a held request (or one yet to arrive) go on; safe from any thread."""
        with self._lock:
            self._released.add(seq)
            event = self._events.get(seq)
        if event is not None:
            self._in_loop(event.set)

    def _in_loop(self, fn: Callable[[], object]) -> None:
        try:
            here = trio.lowlevel.current_trio_token()
        except RuntimeError:
            here = None
        if self._token is None or here is self._token:
            fn()
        else:
            self._token.run_sync_soon(fn)

    async def wait_for_requests(self, n: int, timeout: float = DEFAULT_WAIT_S) -> None:
        await self.log.wait_until(lambda records: len(records) >= n, timeout)

    async def wait_held(self, seq: int, timeout: float = DEFAULT_WAIT_S) -> None:
        await self.log.wait_until(lambda rs: any(r.seq == seq and r.held for r in rs), timeout)

    async def wait_for_outcomes(self, n: int, timeout: float = DEFAULT_WAIT_S) -> None:
        await self.log.wait_until(lambda records: sum(r.outcome is not None for r in records) >= n, timeout)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            port, token = await listen(self._handle, nursery)
            self._token = token
            self.log.bind(token)
            self.url = f"http://{LOOPBACK}:{port}{self._base_path}"
            task_status.started(self.url)

    def _record(self, request: Request) -> tuple[ProxyRecord, Fault | None]:
        with self._lock:
            seq, self._next_seq = self._next_seq, self._next_seq + 1
            fault = self._faults.get(seq)
        record = ProxyRecord(
            seq=seq,
            method=request.method,
            path=request.path,
            arrived_wall=time.time(),
            arrived_monotonic=time.monotonic(),
            has_authorization=request.header("authorization") is not None,
            fault=fault.label() if fault else None,
        )
        self.log.append(record)
        return record, fault

    def _finish(self, record: ProxyRecord, outcome: str) -> None:
        record.outcome = outcome
        self.log.changed()

    async def _hold(self, record: ProxyRecord, fault: Fault) -> None:
        with self._lock:
            if record.seq in self._released:
                return
            event = fault.release if fault.release is not None else trio.Event()
            self._events[record.seq] = event
        record.held = True
        self.log.changed()
        await event.wait()
        record.held = False
        self.log.changed()

    async def _apply(self, fault: Fault | None, phase: FaultPhase, record: ProxyRecord) -> bool:
        """Apply the fault for ``phase``; False when the exchange must be dropped."""
        if fault is None or fault.phase != phase:
            return True
        if fault.action == "drop":
            return False
        if fault.action == "delay":
            await trio.sleep(fault.delay_ms / 1000)
        else:
            await self._hold(record, fault)
        return True

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            request = await read_or_refuse(stream)
            if request is None:
                return
            record, fault = self._record(request)
            if fault is None and self._selector is not None:
                fault = await trio.to_thread.run_sync(self._selector, record.seq)
                if fault is not None:
                    record.fault = fault.label()
                    self.log.changed()
            try:
                await self._exchange(stream, request, record, fault)
            except GONE:
                self._finish(record, "client-gone")

    async def _exchange(
        self, client: trio.SocketStream, request: Request, record: ProxyRecord, fault: Fault | None
    ) -> None:
        if not await self._apply(fault, "request", record):
            self._finish(record, "dropped-request")
            return
        try:
            upstream = await trio.open_tcp_stream(*self._upstream)
        except OSError:
            await send_simple(client, 502, {"error": {"message": "upstream unreachable"}})
            self._finish(record, "upstream-error")
            return
        async with upstream:
            host = f"{self._upstream[0]}:{self._upstream[1]}"
            await upstream.send_all(_forwarded_request(request, host))
            record.forwarded = True
            self.log.changed()
            if fault is not None and fault.phase == "response":
                await self._relay_buffered(client, upstream, record, fault)
            else:
                self._finish(record, await self._relay_streaming(client, upstream))

    async def _relay_buffered(
        self,
        client: trio.SocketStream,
        upstream: trio.SocketStream,
        record: ProxyRecord,
        fault: Fault,
    ) -> None:
        response = await _read_to_eof(upstream, MAX_PROXIED_RESPONSE)
        if not await self._apply(fault, "response", record):
            self._finish(record, "dropped-response")
            return
        await client.send_all(response)
        self._finish(record, "relayed")

    async def _relay_streaming(self, client: trio.SocketStream, upstream: trio.SocketStream) -> str:
        """Copy the upstream response to the client; returns the outcome. Errors
        are turned into outcomes inside the nursery, which would otherwise wrap
        them in an ExceptionGroup."""
        relay = _Relay()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(relay.watch_client, client, nursery.cancel_scope)
            await relay.pump(client, upstream)
            nursery.cancel_scope.cancel()
        return relay.outcome


@dataclass
class _Relay:
    answered: bool = False
    outcome: str = "client-gone"

    async def watch_client(self, client: trio.SocketStream, scope: trio.CancelScope) -> None:
        # A client that leaves before any answer (its timeout) ends the exchange
        # instead of lingering on a slow upstream until shutdown; once an answer
        # flows, the client closing after the last byte is normal.
        await wait_for_eof(client)
        if not self.answered:
            scope.cancel()

    async def pump(self, client: trio.SocketStream, upstream: trio.SocketStream) -> None:
        while True:
            try:
                chunk = await upstream.receive_some(CHUNK)
            except GONE:
                self.outcome = "upstream-error"
                return
            if not chunk:
                self.outcome = "relayed"
                return
            self.answered = True
            try:
                await client.send_all(chunk)
            except GONE:
                return

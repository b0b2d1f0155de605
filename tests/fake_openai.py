"""A fake OpenAI-compatible server and a fault proxy, for tests. Loopback only.

``FakeOpenAIServer`` replays a script of replies to ``POST {base}/chat/completions``
in arrival order. ``FaultProxy`` sits in front of any upstream and drops, delays or
holds a chosen request (by its sequence number at the proxy). Both record metadata
only (sequence, path without query, arrival times, whether an Authorization header
came): never a body or a header value, so a test can show that nothing secret was
kept.

Run either inside a trio test::

    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)      # "http://127.0.0.1:PORT/v1"
        ...
        nursery.cancel_scope.cancel()

or in a background thread (for tests whose provider runs in another process)::

    with serve_in_thread(server) as url:
        ...
        server.log.wait_until_blocking(lambda records: len(records) == 1)

The HTTP/1.1 handling is deliberately minimal: one request per connection
(``Connection: close``), Content-Length request bodies only.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from typing import Any, Generic, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

import trio

LOOPBACK = "127.0.0.1"
MAX_HEAD_BYTES = 64 * 1024
MAX_REQUEST_BODY = 16 * 1024 * 1024
MAX_PROXIED_RESPONSE = 16 * 1024 * 1024
DEFAULT_WAIT_S = 10.0
_CHUNK = 64 * 1024


# --- scripted replies -------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``body`` is JSON-encoded when it is a dict or list."""

    status: int = 200
    body: Mapping[str, Any] | list[Any] | str | bytes | None = None
    delay_ms: int = 0
    #: Never answer; hold the connection until the client closes it (or shutdown).
    hang: bool = False
    #: Send the body this many times: a huge body without holding it in memory.
    repeat: int = 1
    #: False: no Content-Length, the body ends when the connection closes.
    content_length: bool = True
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()

    def body_bytes(self) -> bytes:
        if self.body is None:
            return b""
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return json.dumps(self.body).encode()


def tool_call(name: str, arguments: Mapping[str, Any] | str, call_id: str = "") -> dict[str, Any]:
    """A native tool call as a server sends it (arguments as a JSON string)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": call_id or f"call_{name}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    model: str = "fake-model",
) -> dict[str, Any]:
    """A Chat Completions response body with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


# --- records ----------------------------------------------------------------------


@dataclass
class RequestRecord:
    seq: int
    method: str
    path: str
    arrived_wall: float
    arrived_monotonic: float
    has_authorization: bool
    #: Whether the header matched the server's expected key; None if none expected.
    authorized: bool | None = None
    #: How handling ended: responded, hung-up, client-gone, not-found, unauthorized.
    outcome: str | None = None


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


R = TypeVar("R", RequestRecord, ProxyRecord)


class RecordLog(Generic[R]):
    """Records shared between the serving loop and a test, with waits that are
    woken by each change (no polling)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._records: list[R] = []
        self._token: trio.lowlevel.TrioToken | None = None
        self._waiters: set[trio.Event] = set()

    def bind(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token

    def append(self, record: R) -> None:
        with self._cond:
            self._records.append(record)
        self.changed()

    def changed(self) -> None:
        """Call after updating a record in place (from the serving loop)."""
        with self._cond:
            self._cond.notify_all()
        for event in list(self._waiters):
            event.set()

    def snapshot(self) -> list[R]:
        with self._cond:
            return list(self._records)

    def _in_serving_loop(self) -> bool:
        try:
            return self._token is None or trio.lowlevel.current_trio_token() is self._token
        except RuntimeError:
            return False

    async def wait_until(
        self, predicate: Callable[[list[R]], bool], timeout: float = DEFAULT_WAIT_S
    ) -> list[R]:
        """Wait until ``predicate(records)``; the timeout only guards against a hung
        test. Works from the serving loop or, through a worker thread, from another."""
        if not self._in_serving_loop():
            return await trio.to_thread.run_sync(
                self.wait_until_blocking, predicate, timeout, abandon_on_cancel=True
            )
        with trio.fail_after(timeout):
            while True:
                records = self.snapshot()
                if predicate(records):
                    return records
                event = trio.Event()
                self._waiters.add(event)
                try:
                    await event.wait()
                finally:
                    self._waiters.discard(event)

    def wait_until_blocking(
        self, predicate: Callable[[list[R]], bool], timeout: float = DEFAULT_WAIT_S
    ) -> list[R]:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(list(self._records)), timeout):
                raise TimeoutError(f"records never satisfied the condition: {self._records}")
            return list(self._records)


# --- minimal HTTP/1.1 -------------------------------------------------------------


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes = field(repr=False)

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def path(self) -> str:
        # Without the query: a key passed as ?api-key= must not be recorded.
        return urlsplit(self.target).path


async def _read_head(stream: trio.abc.ReceiveStream) -> tuple[bytes, bytes] | None:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        if len(buffer) > MAX_HEAD_BYTES:
            raise BadRequest(431, "request head too large")
        chunk = await stream.receive_some(_CHUNK)
        if not chunk:
            if buffer:
                raise BadRequest(400, "connection closed inside the request head")
            return None
        buffer += chunk
    head, _, rest = buffer.partition(b"\r\n\r\n")
    return head, rest


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise BadRequest(400, "malformed request line") from None
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise BadRequest(400, "malformed header line")
        headers.append((name.strip(), value.strip()))
    return method, target, version, headers


async def read_request(stream: trio.abc.ReceiveStream) -> _Request | None:
    """One request, body included (reading all of it matters: closing a socket with
    unread input sends RST, which can destroy the response on its way out)."""
    got = await _read_head(stream)
    if got is None:
        return None
    head, body = got
    method, target, version, headers = _parse_head(head)
    request = _Request(method, target, version, headers, b"")
    if request.header("transfer-encoding"):
        raise BadRequest(501, "chunked request bodies are not supported")
    length_text = request.header("content-length") or "0"
    if not length_text.isdigit() or int(length_text) > MAX_REQUEST_BODY:
        raise BadRequest(413, "bad or too large Content-Length")
    length = int(length_text)
    while len(body) < length:
        chunk = await stream.receive_some(min(_CHUNK, length - len(body)))
        if not chunk:
            raise BadRequest(400, "connection closed inside the request body")
        body += chunk
    request.body = body[:length]
    return request


def _response_head(
    status: int, content_type: str, length: int | None, extra: Iterable[tuple[str, str]] = ()
) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.1 {status} {phrase}", f"Content-Type: {content_type}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += [f"{name}: {value}" for name, value in extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _send_simple(stream: trio.abc.SendStream, status: int, body: Mapping[str, Any]) -> None:
    data = json.dumps(body).encode()
    await stream.send_all(_response_head(status, "application/json", len(data)) + data)


async def _wait_for_eof(stream: trio.abc.ReceiveStream) -> None:
    try:
        while await stream.receive_some(_CHUNK):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


async def _read_or_refuse(stream: trio.SocketStream) -> _Request | None:
    """The next request, or None once a bad one was answered or the client left."""
    try:
        return await read_request(stream)
    except BadRequest as exc:
        with contextlib.suppress(*_GONE):
            await _send_simple(stream, exc.status, {"error": {"message": str(exc)}})
    except _GONE:
        pass
    return None


class _Servable(Protocol):
    async def serve(self, *, task_status: trio.TaskStatus[str] = ...) -> None: ...


async def _listen(
    handler: Callable[[trio.SocketStream], Any], nursery: trio.Nursery
) -> tuple[int, trio.lowlevel.TrioToken]:
    listeners: list[trio.SocketListener] = await nursery.start(
        partial(trio.serve_tcp, handler, 0, host=LOOPBACK)
    )
    port = int(listeners[0].socket.getsockname()[1])
    return port, trio.lowlevel.current_trio_token()


# --- the fake server --------------------------------------------------------------


class FakeOpenAIServer:
    """Replays ``script`` in request order; after it runs out, ``default`` (or a 500
    saying the script is exhausted, so an unexpected extra request is loud)."""

    def __init__(
        self,
        script: Iterable[Reply] = (),
        *,
        default: Reply | None = None,
        expected_api_key: str | None = None,
        base_path: str = "/v1",
    ) -> None:
        self._script = list(script)
        self._default = default
        # Kept only to compare against; records say just whether it matched.
        self._expected_api_key = expected_api_key
        self._base_path = base_path.rstrip("/")
        self._lock = threading.Lock()
        self._next_seq = 1
        self.log: RecordLog[RequestRecord] = RecordLog()
        self.url = ""

    @property
    def requests(self) -> list[RequestRecord]:
        return self.log.snapshot()

    def add(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    async def wait_for_requests(self, n: int, timeout: float = DEFAULT_WAIT_S) -> None:
        await self.log.wait_until(lambda records: len(records) >= n, timeout)

    async def wait_for_outcomes(self, n: int, timeout: float = DEFAULT_WAIT_S) -> None:
        """Until ``n`` requests have finished being handled."""
        await self.log.wait_until(lambda records: sum(r.outcome is not None for r in records) >= n, timeout)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            port, token = await _listen(self._handle, nursery)
            self.log.bind(token)
            self.url = f"http://{LOOPBACK}:{port}{self._base_path}"
            task_status.started(self.url)

    def _next_reply(self) -> Reply:
        with self._lock:
            if self._script:
                return self._script.pop(0)
        return self._default or Reply(500, {"error": {"message": "fake server script exhausted"}})

    def _record(self, request: _Request) -> RequestRecord:
        authorization = request.header("authorization")
        authorized = None
        if self._expected_api_key is not None:
            authorized = authorization == f"Bearer {self._expected_api_key}"
        with self._lock:
            seq, self._next_seq = self._next_seq, self._next_seq + 1
        record = RequestRecord(
            seq=seq,
            method=request.method,
            path=request.path,
            arrived_wall=time.time(),
            arrived_monotonic=time.monotonic(),
            has_authorization=authorization is not None,
            authorized=authorized,
        )
        self.log.append(record)
        return record

    def _finish(self, record: RequestRecord, outcome: str) -> None:
        record.outcome = outcome
        self.log.changed()

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            request = await _read_or_refuse(stream)
            if request is None:
                return
            record = self._record(request)
            try:
                await self._route(stream, request, record)
            except _GONE:
                self._finish(record, "client-gone")

    async def _route(self, stream: trio.SocketStream, request: _Request, record: RequestRecord) -> None:
        if request.method == "GET" and request.path == f"{self._base_path}/models":
            await _send_simple(stream, 200, {"object": "list", "data": [{"id": "fake-model"}]})
            self._finish(record, "responded")
        elif request.method != "POST" or request.path != f"{self._base_path}/chat/completions":
            await _send_simple(stream, 404, {"error": {"message": "not found"}})
            self._finish(record, "not-found")
        elif record.authorized is False:
            await _send_simple(stream, 401, {"error": {"message": "invalid api key"}})
            self._finish(record, "unauthorized")
        else:
            await self._play(stream, self._next_reply(), record)

    async def _play(self, stream: trio.SocketStream, reply: Reply, record: RequestRecord) -> None:
        if reply.delay_ms:
            await trio.sleep(reply.delay_ms / 1000)
        if reply.hang:
            await _wait_for_eof(stream)
            self._finish(record, "hung-up")
            return
        body = reply.body_bytes()
        length = len(body) * reply.repeat if reply.content_length else None
        await stream.send_all(_response_head(reply.status, reply.content_type, length, reply.headers))
        for _ in range(reply.repeat):
            await stream.send_all(body)
        self._finish(record, "responded")


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


def _forwarded_request(request: _Request, host: str) -> bytes:
    # Connection: close makes the upstream's response end at EOF, whatever its framing.
    hop = {"connection", "keep-alive", "proxy-connection", "host"}
    lines = [f"{request.method} {request.target} {request.version}", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in request.headers if k.lower() not in hop]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body


async def _read_to_eof(stream: trio.abc.ReceiveStream, limit: int) -> bytes:
    data = bytearray()
    while chunk := await stream.receive_some(_CHUNK):
        data += chunk
        if len(data) > limit:
            raise BadRequest(502, "upstream response too large for the proxy to hold")
    return bytes(data)


class FaultProxy:
    """A TCP-level HTTP proxy in front of ``upstream_url`` applying per-request
    faults, keyed by the 1-based sequence number of requests at the proxy."""

    def __init__(self, upstream_url: str, faults: Mapping[int, Fault] | None = None) -> None:
        parts = urlsplit(upstream_url)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream URL needs a host and a port: {upstream_url!r}")
        self._upstream = (parts.hostname, parts.port)
        self._base_path = parts.path.rstrip("/")
        self._faults = dict(faults or {})
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
            port, token = await _listen(self._handle, nursery)
            self._token = token
            self.log.bind(token)
            self.url = f"http://{LOOPBACK}:{port}{self._base_path}"
            task_status.started(self.url)

    def _record(self, request: _Request) -> tuple[ProxyRecord, Fault | None]:
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
            request = await _read_or_refuse(stream)
            if request is None:
                return
            record, fault = self._record(request)
            try:
                await self._exchange(stream, request, record, fault)
            except _GONE:
                self._finish(record, "client-gone")

    async def _exchange(
        self, client: trio.SocketStream, request: _Request, record: ProxyRecord, fault: Fault | None
    ) -> None:
        if not await self._apply(fault, "request", record):
            self._finish(record, "dropped-request")
            return
        try:
            upstream = await trio.open_tcp_stream(*self._upstream)
        except OSError:
            await _send_simple(client, 502, {"error": {"message": "upstream unreachable"}})
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
        await _wait_for_eof(client)
        if not self.answered:
            scope.cancel()

    async def pump(self, client: trio.SocketStream, upstream: trio.SocketStream) -> None:
        while True:
            try:
                chunk = await upstream.receive_some(_CHUNK)
            except _GONE:
                self.outcome = "upstream-error"
                return
            if not chunk:
                self.outcome = "relayed"
                return
            self.answered = True
            try:
                await client.send_all(chunk)
            except _GONE:
                return


# --- running in a thread ----------------------------------------------------------


_Started = tuple[str, trio.lowlevel.TrioToken, trio.CancelScope]


@contextmanager
def serve_in_thread(servable: _Servable, *, start_timeout: float = DEFAULT_WAIT_S) -> Iterator[str]:
    """Run ``servable.serve`` in its own trio loop on a thread owned by this context;
    yields the URL, and on exit cancels the loop and joins the thread. An error in
    the server is re-raised here rather than lost in the thread."""
    started: queue.Queue[_Started | BaseException] = queue.Queue()
    errors: list[BaseException] = []

    async def main() -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(servable.serve)
                started.put((url, trio.lowlevel.current_trio_token(), scope))

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # handed to the owning thread below
            errors.append(exc)
            started.put(exc)

    thread = threading.Thread(target=run, name=f"fake-{type(servable).__name__}", daemon=True)
    thread.start()
    try:
        item = started.get(timeout=start_timeout)
    except queue.Empty:
        raise RuntimeError("server thread did not start in time") from None
    if isinstance(item, BaseException):
        thread.join(start_timeout)
        raise item
    url, token, scope = item
    try:
        yield url
    finally:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(scope.cancel)
        thread.join(DEFAULT_WAIT_S)
        if thread.is_alive():
            raise RuntimeError("server thread did not stop")
        if errors:
            raise errors[0]

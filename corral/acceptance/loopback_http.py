"""Loopback HTTP plumbing shared by the fault proxy (corral/acceptance/fault_proxy.py)
and the tests' fake OpenAI server (tests/fake_openai.py, through tests/loopback_http.py).

Minimal HTTP/1.1 (one request per connection, ``Connection: close``,
Content-Length request bodies only), a listener on 127.0.0.1, the record log both
servers keep and tests wait on, and ``serve_in_thread``.

Run a server (anything with ``serve``) either inside a trio test::

    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)      # "http://127.0.0.1:PORT/v1"
        ...
        nursery.cancel_scope.cancel()

or in a background thread (for tests whose provider runs in another process)::

    with serve_in_thread(server) as url:
        ...
        server.log.wait_until_blocking(lambda records: len(records) == 1)
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

import trio

LOOPBACK = "127.0.0.1"
MAX_HEAD_BYTES = 64 * 1024
MAX_REQUEST_BODY = 16 * 1024 * 1024
DEFAULT_WAIT_S = 10.0
CHUNK = 64 * 1024


# --- the record log ---------------------------------------------------------------


#: A server's own record type (the fake server's or the proxy's).
R = TypeVar("R")


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
class Request:
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
        chunk = await stream.receive_some(CHUNK)
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


async def read_request(stream: trio.abc.ReceiveStream) -> Request | None:
    """One request, body included (reading all of it matters: closing a socket with
    unread input sends RST, which can destroy the response on its way out)."""
    got = await _read_head(stream)
    if got is None:
        return None
    head, body = got
    method, target, version, headers = _parse_head(head)
    request = Request(method, target, version, headers, b"")
    if request.header("transfer-encoding"):
        raise BadRequest(501, "chunked request bodies are not supported")
    length_text = request.header("content-length") or "0"
    if not length_text.isdigit() or int(length_text) > MAX_REQUEST_BODY:
        raise BadRequest(413, "bad or too large Content-Length")
    length = int(length_text)
    while len(body) < length:
        chunk = await stream.receive_some(min(CHUNK, length - len(body)))
        if not chunk:
            raise BadRequest(400, "connection closed inside the request body")
        body += chunk
    request.body = body[:length]
    return request


def response_head(
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


async def send_simple(stream: trio.abc.SendStream, status: int, body: Mapping[str, Any]) -> None:
    data = json.dumps(body).encode()
    await stream.send_all(response_head(status, "application/json", len(data)) + data)


async def wait_for_eof(stream: trio.abc.ReceiveStream) -> None:
    try:
        while await stream.receive_some(CHUNK):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


async def read_or_refuse(stream: trio.SocketStream) -> Request | None:
    """The next request, or None once a bad one was answered or the client left."""
    try:
        return await read_request(stream)
    except BadRequest as exc:
        with contextlib.suppress(*GONE):
            await send_simple(stream, exc.status, {"error": {"message": str(exc)}})
    except GONE:
        pass
    return None


class _Servable(Protocol):
    async def serve(self, *, task_status: trio.TaskStatus[str] = ...) -> None: ...


async def listen(
    handler: Callable[[trio.SocketStream], Any], nursery: trio.Nursery
) -> tuple[int, trio.lowlevel.TrioToken]:
    listeners: list[trio.SocketListener] = await nursery.start(
        partial(trio.serve_tcp, handler, 0, host=LOOPBACK)
    )
    port = int(listeners[0].socket.getsockname()[1])
    return port, trio.lowlevel.current_trio_token()


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

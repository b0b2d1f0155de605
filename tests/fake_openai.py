"""A fake OpenAI-compatible server, for tests. Loopback only.

``FakeOpenAIServer`` replays a script of replies to ``POST {base}/chat/completions``
in arrival order (``Reply``, with ``completion`` and ``tool_call`` to build bodies).
It records metadata only (sequence, path without query, arrival times, whether an
Authorization header came): never a body or a header value, so a test can show
that nothing secret was kept. Run it in a trio nursery or with
``loopback_http.serve_in_thread``; ``fault_proxy.FaultProxy`` goes in front of it
to drop, delay or hold requests.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from loopback_http import (
    DEFAULT_WAIT_S,
    GONE,
    LOOPBACK,
    RecordLog,
    Request,
    listen,
    read_or_refuse,
    response_head,
    send_simple,
    wait_for_eof,
)

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
    """A native tool call as a server sends it (arguments as a JSON string). A
    mapping is the tool's input, sent in seed 004's envelope ``{"reason", "input"}``
    (V1.33) unless it is one already; a string is sent as it is."""
    if not isinstance(arguments, str) and set(arguments) != {"reason", "input"}:
        arguments = {"reason": f"call {name}", "input": dict(arguments)}
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
    #: The request body, only for a server made with ``keep_bodies=True`` (a test of
    #: what a request carries: image parts, web_search_options).
    body: bytes | None = field(default=None, repr=False)


# --- the fake server --------------------------------------------------------------

#: A reply made when its request arrives, from the request's body: a scripted
#: "model" that reads what it was sent (a cursor, a line number) and acts on it.
Responder = Callable[[bytes], Reply]


class FakeOpenAIServer:
    """Replays ``script`` in request order; after it runs out, ``default`` (or a 500
    saying the script is exhausted, so an unexpected extra request is loud)."""

    def __init__(
        self,
        script: Iterable[Reply | Responder] = (),
        *,
        default: Reply | None = None,
        expected_api_key: str | None = None,
        base_path: str = "/v1",
        keep_bodies: bool = False,
    ) -> None:
        self._script = list(script)
        self._default = default
        # Kept only to compare against; records say just whether it matched.
        self._expected_api_key = expected_api_key
        self._base_path = base_path.rstrip("/")
        self._keep_bodies = keep_bodies
        self._lock = threading.Lock()
        self._next_seq = 1
        self.log: RecordLog[RequestRecord] = RecordLog()
        self.url = ""

    @property
    def requests(self) -> list[RequestRecord]:
        return self.log.snapshot()

    def add(self, *replies: Reply | Responder) -> None:
        with self._lock:
            self._script.extend(replies)

    async def wait_for_requests(self, n: int, timeout: float = DEFAULT_WAIT_S) -> None:
        await self.log.wait_until(lambda records: len(records) >= n, timeout)

    async def wait_for_outcomes(self, n: int, timeout: float = DEFAULT_WAIT_S) -> None:
        """Until ``n`` requests have finished being handled."""
        await self.log.wait_until(lambda records: sum(r.outcome is not None for r in records) >= n, timeout)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            port, token = await listen(self._handle, nursery)
            self.log.bind(token)
            self.url = f"http://{LOOPBACK}:{port}{self._base_path}"
            task_status.started(self.url)

    def _next_reply(self, body: bytes) -> Reply:
        with self._lock:
            if self._script:
                scripted = self._script.pop(0)
                return scripted if isinstance(scripted, Reply) else scripted(body)
        return self._default or Reply(500, {"error": {"message": "fake server script exhausted"}})

    def _record(self, request: Request) -> RequestRecord:
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
            body=request.body if self._keep_bodies else None,
        )
        self.log.append(record)
        return record

    def _finish(self, record: RequestRecord, outcome: str) -> None:
        record.outcome = outcome
        self.log.changed()

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            request = await read_or_refuse(stream)
            if request is None:
                return
            record = self._record(request)
            try:
                await self._route(stream, request, record)
            except GONE:
                self._finish(record, "client-gone")

    async def _route(self, stream: trio.SocketStream, request: Request, record: RequestRecord) -> None:
        if request.method == "GET" and request.path == f"{self._base_path}/models":
            await send_simple(stream, 200, {"object": "list", "data": [{"id": "fake-model"}]})
            self._finish(record, "responded")
        elif request.method != "POST" or request.path != f"{self._base_path}/chat/completions":
            await send_simple(stream, 404, {"error": {"message": "not found"}})
            self._finish(record, "not-found")
        elif record.authorized is False:
            await send_simple(stream, 401, {"error": {"message": "invalid api key"}})
            self._finish(record, "unauthorized")
        else:
            await self._play(stream, self._next_reply(request.body), record)

    async def _play(self, stream: trio.SocketStream, reply: Reply, record: RequestRecord) -> None:
        if reply.delay_ms:
            await trio.sleep(reply.delay_ms / 1000)
        if reply.hang:
            await wait_for_eof(stream)
            self._finish(record, "hung-up")
            return
        body = reply.body_bytes()
        length = len(body) * reply.repeat if reply.content_length else None
        await stream.send_all(response_head(reply.status, reply.content_type, length, reply.headers))
        for _ in range(reply.repeat):
            await stream.send_all(body)
        self._finish(record, "responded")

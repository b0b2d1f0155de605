"""Chat Completions with ``stream: true``: server-sent events in, one body out.

The chunks are folded back into an ordinary Chat Completions body (content, tool
calls with their arguments joined, finish reason, usage), so what is committed
and parsed is the same as without streaming. A stream that ends before
``data: [DONE]`` (a cut connection) is a transport failure: the lifecycle fails
as transient and is retried durably, never half-parsed.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx


class StreamCut(Exception):
    """The event stream ended before ``[DONE]``."""


class StreamAssembler:
    def __init__(self) -> None:
        self.pending = b""
        self.content: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.meta: dict[str, Any] = {}
        self.done = False
        #: Pieces generated so far (content or tool-call arguments): about one token each.
        self.pieces = 0

    def feed(self, data: bytes) -> list[str]:
        """Returns the content text that arrived with these bytes."""
        self.pending += data
        out: list[str] = []
        while b"\n" in self.pending:
            line, self.pending = self.pending.split(b"\n", 1)
            text = line.decode("utf-8", errors="replace").strip()
            if not text.startswith("data:"):
                continue  # comments, event names, blank separators
            payload = text[5:].strip()
            if payload == "[DONE]":
                self.done = True
                continue
            try:
                chunk = json.loads(payload)
            except ValueError:
                continue
            out.extend(self._chunk(chunk))
        return out

    def _chunk(self, chunk: Any) -> list[str]:
        if not isinstance(chunk, dict):
            return []
        for key in ("id", "model", "created"):
            if key in chunk:
                self.meta.setdefault(key, chunk[key])
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        out: list[str] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
                out.append(delta["content"])
                self.pieces += 1
            for call in delta.get("tool_calls") or []:
                self._tool_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return out

    def _tool_call(self, call: Any) -> None:
        if not isinstance(call, dict):
            return
        entry = self.tool_calls.setdefault(
            int(call.get("index", 0)), {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if call.get("id"):
            entry["id"] = call["id"]
        function = call.get("function") or {}
        if function.get("name"):
            entry["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            entry["function"]["arguments"] += function["arguments"]
            self.pieces += 1

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.tool_calls)

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            message["tool_calls"] = [self.tool_calls[index] for index in sorted(self.tool_calls)]
        body: dict[str, Any] = {
            "id": self.meta.get("id", ""),
            "object": "chat.completion",
            "model": self.meta.get("model", ""),
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        }
        if self.usage is not None:
            body["usage"] = self.usage
        return body


async def read_stream(
    response: httpx.Response,
    limit: int,
    on_content: Callable[[str], Awaitable[None]],
    too_large: Callable[[str], Exception],
    on_progress: Callable[[int], Awaitable[None]] | None = None,
) -> bytes:
    """The assembled body of an event-stream response (bounded like any other).
    ``on_progress(pieces)``: how many pieces (about a token each) each read
    brought, a plan's tool-call arguments included (their count, never their text)."""
    assembler = StreamAssembler()
    received = 0
    async for chunk in response.aiter_raw():
        received += len(chunk)
        if received > limit:
            raise too_large("the event stream kept coming")
        before = assembler.pieces
        for piece in assembler.feed(chunk):
            await on_content(piece)
        if on_progress is not None and assembler.pieces != before:
            await on_progress(assembler.pieces - before)
        if assembler.done:
            break
    if not assembler.done:
        raise StreamCut(f"the event stream ended after {received} bytes, before [DONE]")
    return json.dumps(assembler.body()).encode()

"""An MCP server for corral's tests, written with the official SDK.

It counts real executions in a file (``LAB_EFFECTS``), so a test can prove that
a tool ran at most once, and it misbehaves on request: it crashes mid-call, hangs,
floods, writes a line that is not JSON-RPC, or changes its catalog between starts
(``LAB_SCHEMA_FILE``). ``--http PORT --token T`` serves Streamable HTTP on
127.0.0.1 behind a bearer token instead of stdio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

EFFECTS = os.environ.get("LAB_EFFECTS", "")
SCHEMA_FILE = os.environ.get("LAB_SCHEMA_FILE", "")

server = MCPServer("lab", instructions="The lab server: counts executions and misbehaves on request.")


def _meta(ctx: Context | None) -> dict[str, Any]:
    meta = ctx.request_context.meta if ctx is not None else None
    if meta is None:
        return {}
    return dict(meta.model_dump(by_alias=True)) if hasattr(meta, "model_dump") else dict(meta)


def _record(tool: str, ctx: Context | None = None, **fields: Any) -> None:
    """One line per real execution, in effect.record's format (chaos reads it)."""
    if not EFFECTS:
        return
    meta = _meta(ctx)
    line = {
        "action_id": meta.get("corral/action_id", ""),
        "idempotency_key": meta.get("corral/idempotency_key", ""),
        "label": tool,
        "tool": tool,
        "pid": os.getpid(),
        "at": time.time(),
        **fields,
    }
    with open(EFFECTS, "a") as handle:
        handle.write(json.dumps(line) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def send(to: str, body: str = "", ctx: Context | None = None) -> str:
    """An external side effect: one line in the effects file."""
    _record("send", ctx, to=to)
    return f"sent to {to}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def peek(item: str, ctx: Context | None = None) -> str:
    """A read tool."""
    _record("peek", ctx, item=item)
    return f"value of {item}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=True, destructive_hint=False))
def put(item: str, value: str, ctx: Context | None = None) -> str:
    """An idempotent tool."""
    _record("put", ctx, item=item)
    return f"{item}={value}"


@server.tool()
def crash_after_effect(to: str, ctx: Context | None = None) -> str:
    """Records the effect, then dies before answering."""
    _record("crash_after_effect", ctx, to=to)
    os._exit(17)


@server.tool()
def hang(seconds: float = 3600, ctx: Context | None = None) -> str:
    """Never answers in time."""
    _record("hang", ctx)
    time.sleep(seconds)
    return "woke"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def flood(megabytes: int = 20) -> str:
    """A result far past any sane size."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def big(kilobytes: int = 100) -> str:
    """A large result (sidecar-sized, not oversized)."""
    return "y" * (kilobytes * 1024)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def garble() -> str:
    """Writes a line that is not JSON-RPC to stdout, then answers."""
    sys.stdout.write("this is not json-rpc\n")
    sys.stdout.flush()
    return "garbled"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def fail_politely() -> str:
    """Answers with is_error."""
    raise ValueError("the lab says no")


@server.tool(annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False))
async def nap(seconds: float = 0.3, ctx: Context | None = None) -> str:
    """Sleeps without blocking the server (so two calls could overlap here), then
    records when it started and ended."""
    import anyio

    start = time.time()
    await anyio.sleep(seconds)
    _record("nap", ctx, start=start, end=time.time())
    return "rested"


#: The bytes ``picture`` answers with, as an image block beside a line of text.
PICTURE = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


@server.tool(annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False), structured_output=False)
def picture() -> Any:
    """A line of text and a PNG image."""
    from mcp.server.mcpserver import Image

    return ["here it is", Image(data=PICTURE, format="png")]


@server.tool(annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False))
def environ() -> str:
    """The names and values of this server's environment, as JSON."""
    return json.dumps(dict(os.environ), sort_keys=True)


if os.environ.get("LAB_LONG_DESCRIPTION"):

    @server.tool(description="d" * 5000)
    def wordy() -> str:
        return "a description past the catalog's limit"


if SCHEMA_FILE and Path(SCHEMA_FILE).exists() and Path(SCHEMA_FILE).read_text().strip() == "v2":

    @server.tool(name="versioned")
    def versioned_v2(name: str, extra: int) -> str:
        """Version 2 of the catalog: a new required argument."""
        return f"v2 {name} {extra}"

else:

    @server.tool(name="versioned")
    def versioned_v1(name: str) -> str:
        """Version 1 of the catalog."""
        return f"v1 {name}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve Streamable HTTP on 127.0.0.1:PORT")
    parser.add_argument("--token", default="", help="bearer token the HTTP server requires")
    parser.add_argument("--port-file", default="", help="write the bound port here (for --http 0)")
    args = parser.parse_args()
    if args.http is None:
        server.run("stdio")
        return
    serve_http(args.http, args.token, args.port_file)


def serve_http(port: int, token: str, port_file: str) -> None:
    import socket

    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve
    from starlette.types import ASGIApp, Receive, Scope, Send

    inner = server.streamable_http_app()

    def bearer(app: ASGIApp) -> ASGIApp:
        async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                headers = dict(scope.get("headers") or [])
                if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                    await send({"type": "http.response.start", "status": 401, "headers": []})
                    await send({"type": "http.response.body", "body": b"unauthorized"})
                    return
            await app(scope, receive, send)

        return guarded

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    bound = sock.getsockname()[1]
    sock.close()
    config = Config()
    config.bind = [f"127.0.0.1:{bound}"]
    config.loglevel = "WARNING"
    if port_file:
        Path(port_file).write_text(str(bound))
    trio.run(serve, bearer(inner), config)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()

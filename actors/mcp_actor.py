"""The ``mcp`` template: one actor owns one MCP client session.

The actor starts (or connects to) its server with the official ``mcp`` SDK,
reports the server's tool catalog and instructions to the supervisor
(``mcp.ready``), then serves ``call`` requests relayed by the supervisor. It holds
no durable state: the action lifecycle around every call lives in the ledger.

A stdio server is this actor's child (its pipes: actors/mcp_stdio.py) and dies
with it: the transport stops it on a clean exit, and a watcher its launcher
forks kills it when the actor itself is SIGKILLed (actors/mcp_launch.py). What
the server started ends with it too (actors/mcp_tree.py). A session that breaks
(the server crashed, the connection dropped) ends the actor with a non-zero
code, so the supervisor restarts it per its policy and counts it against the
restart intensity.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio

from corral.actors import recordable
from corral.actors.mcp_stdio import StdioPipes, stdio_pipes
from corral.actors.mcp_tree import TAG_VAR, ServerTree, tree_tag
from corral.actors.runtime import ActorContext, ask_best_effort, serve_requests
from corral.actors.tools.sidecar import ResultTooLarge, bounded
from corral.core import failpoints
from corral.core.mcp_credentials import VAR, CredentialsError, expand_credentials, read_credentials
from corral.core.redact import redact_text, register_secret, summarize
from corral.mailbox.envelope import Envelope
from corral.mailbox.protocol import McpFailed, McpReady

log = logging.getLogger("corral.mcp")

#: The launcher every stdio server is started through.
LAUNCHER = Path(__file__).with_name("mcp_launch.py")
#: How often the zombies of workers the server's tree orphaned are reaped.
REAP_INTERVAL_S = 5.0

EXIT_SESSION_BROKEN = 3
EXIT_START_FAILED = 4


class McpStartError(Exception):
    """The server could not be started, connected to or initialized."""


def expand_all(table: dict[str, str], server: dict[str, Any]) -> dict[str, str]:
    """``${NAME}`` in each value from the user's private credentials file only
    (corral/core/mcp_credentials.py), never from this process's environment."""
    if not any(VAR.search(value) for value in table.values()):
        return dict(table)
    path = Path(str(server["credentials_file"]))
    try:
        credentials = read_credentials(path)
        expanded = {name: expand_credentials(value, credentials, path) for name, value in table.items()}
    except CredentialsError as exc:
        raise McpStartError(str(exc)) from None
    for value in table.values():
        for name in VAR.findall(value):
            register_secret(credentials.get(name) or "")
    return expanded


def server_argv(command: list[str]) -> list[str]:
    """The server's command behind the launcher that ends it with this actor
    (actors/mcp_launch.py, run isolated). ``python``/``python3`` mean the
    interpreter corral runs on (where the user's MCP packages are installed),
    not whatever PATH finds first, and ``python -m`` runs with ``-P``; any other
    program is run by the name the spec wrote (a venv's ``bin/python`` must stay
    the link it is)."""
    program, *args = command
    if program in ("python", "python3"):
        program = sys.executable
        if args[:1] == ["-m"]:
            # `python -m server` would put its working directory (the spec's, by
            # default) first on the server's path: a project file would shadow what
            # the server imports. A server module of the project is named by path.
            args = ["-P", *args]
    return [sys.executable, "-I", "-S", str(LAUNCHER), str(os.getpid()), program, *args]


@asynccontextmanager
async def open_session(
    server: dict[str, Any], pipes: StdioPipes | None = None, tree: ServerTree | None = None
) -> AsyncIterator[Any]:
    """The ``ClientSession`` of one server spec (stdio or HTTP); a stdio server's
    pipes described in ``pipes`` and its process tree held by ``tree``, if given."""
    from mcp import ClientSession

    async with AsyncExitStack() as stack:
        if server.get("url"):
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            headers = expand_all(server.get("headers", {}), server)
            seen = pipes if pipes is not None else StdioPipes()

            async def status(response: Any) -> None:
                # The SDK turns a 401 into a bare "error response": keep the cause.
                if response.status_code == 401:
                    seen.unauthorized = True

            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0),
                                   event_hooks={"response": [status]})
            )
            read, write = await stack.enter_async_context(streamable_http_client(server["url"], http_client=http))
        else:
            argv = server_argv(list(server["command"]))
            # The trusted PATH found at `corral up` (absolute entries outside the
            # project), then the spec's env: nothing else of corral's environment.
            env = {"PATH": str(server.get("path") or os.defpath), **expand_all(server.get("env", {}), server)}
            if tree is not None:
                env[TAG_VAR] = tree.tag
            errlog = await stack.enter_async_context(_server_log(server.get("log")))
            if tree is not None:
                # Entered before the pipes, so left after the server is stopped:
                # then whatever the server started is ended too.
                await stack.enter_async_context(tree.held())
            pipes = pipes if pipes is not None else StdioPipes()
            read, write = await stack.enter_async_context(
                stdio_pipes(argv, env, server.get("cwd"), errlog, pipes)
            )
            if tree is not None:
                tree.server_pid = pipes.pid
        session = await stack.enter_async_context(ClientSession(read, write))
        yield session


@asynccontextmanager
async def _server_log(log_path: str | None) -> AsyncIterator[Any]:
    """The server's stderr goes to a private log of the home, never to the ledger."""
    path = Path(log_path or os.devnull)
    if str(path) != os.devnull:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
    try:
        yield handle
    finally:
        handle.close()


def tool_entry(tool: Any) -> dict[str, Any]:
    """The parts of an MCP tool the catalog keeps and fingerprints, as the server
    gave them (all plain JSON): the catalog judges them, whole
    (supervisor/mcp/mcp_catalog.py refuses a bad one rather than mending it)."""
    annotations = tool.annotations
    execution = getattr(tool, "execution", None)
    return {
        "name": tool.name,
        "description": tool.description or "",
        "input_schema": tool.input_schema,
        "output_schema": getattr(tool, "output_schema", None),
        "annotations": {
            "title": getattr(annotations, "title", None),
            "read_only": getattr(annotations, "read_only_hint", None),
            "idempotent": getattr(annotations, "idempotent_hint", None),
            "destructive": getattr(annotations, "destructive_hint", None),
            "open_world": getattr(annotations, "open_world_hint", None),
        },
        "execution": None if execution is None else {"task_support": getattr(execution, "task_support", None)},
    }


#: What one tools/list may hold before it is refused whole: a report of the catalog
#: is one mailbox frame (1 MiB), and the catalog's own limits are far below these.
MAX_LISTED_TOOLS = 1024
MAX_LISTED_BYTES = 768 * 1024
MAX_LIST_PAGES = 100
MAX_LISTED_INSTRUCTIONS = 32_000


async def list_all_tools(session: Any) -> list[dict[str, Any]]:
    """Every tool of every page, or ``McpStartError`` past the bounds above (a
    server that pages forever, or lists more than a run could ever be offered)."""
    tools: list[dict[str, Any]] = []
    size = 0
    cursor = None
    for _ in range(MAX_LIST_PAGES):
        if cursor:
            from mcp import types

            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
        else:
            page = await session.list_tools()
        for tool in page.tools:
            entry = tool_entry(tool)
            size += len(json.dumps(entry, default=str))
            tools.append(entry)
            if len(tools) > MAX_LISTED_TOOLS or size > MAX_LISTED_BYTES:
                raise McpStartError(f"its tools/list passed {MAX_LISTED_TOOLS} tools or {MAX_LISTED_BYTES} bytes;"
                                    " the catalog is refused")
        cursor = getattr(page, "next_cursor", None)
        if not cursor:
            return tools
    raise McpStartError(f"its tools/list went on past {MAX_LIST_PAGES} pages; the catalog is refused")


def _content_facts(item: Any) -> dict[str, Any]:
    """A non-text content block as metadata only: its type, MIME type, size and
    SHA-256 (seed 004 V1.22: "image/audio/embedded resource 只给类型、MIME、大小和 SHA-256
    元数据"); the bytes themselves never reach the ledger or a provider."""
    facts: dict[str, Any] = {
        "type": str(getattr(item, "type", "unknown")),
        "mime_type": getattr(item, "mime_type", None),
    }
    raw: bytes | None = None
    encoded = getattr(item, "data", None)
    resource = getattr(item, "resource", None)
    if resource is not None:
        facts["mime_type"] = getattr(resource, "mime_type", None)
        encoded = getattr(resource, "blob", None)
        text = getattr(resource, "text", None)
        raw = text.encode() if isinstance(text, str) else None
    if isinstance(encoded, str):
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raw = encoded.encode()
    if raw is None and getattr(item, "size", None) is not None:
        facts["bytes"] = item.size  # a resource link: its size as the server gives it
    if raw is not None:
        facts["bytes"] = len(raw)
        facts["sha256"] = hashlib.sha256(raw).hexdigest()
    return facts


def result_payload(result: Any) -> dict[str, Any]:
    """An MCP CallToolResult as plain JSON: text joined, structured content kept,
    any other block reduced to its facts."""
    texts: list[str] = []
    other: list[dict[str, Any]] = []
    for item in result.content or []:
        if getattr(item, "type", None) == "text":
            texts.append(item.text)
        else:
            other.append(_content_facts(item))
    return {
        "is_error": bool(result.is_error),
        "text": "\n".join(texts),
        "structured": result.structured_content,
        "other_content": other,
    }


def _bounded_result(payload: dict[str, Any], sidecar: str | None) -> dict[str, Any]:
    """The relay's answer: the result inline, or a sidecar reference with a preview
    (the one helper user tools use too), or a refusal past the hard cap."""
    try:
        shown = bounded(payload, Path(sidecar) if sidecar else None, preview=payload["text"])
    except ResultTooLarge as exc:
        return {"ok": False, "code": ResultTooLarge.code, "error": f"the server's answer: {exc}"}
    if "sidecar" not in shown:
        return {"ok": True, "result": payload}
    preview = {"is_error": payload["is_error"], "text": shown["preview"], "structured": None, "other_content": []}
    return {"ok": True, "result": preview, "sidecar": shown["sidecar"], "bytes": shown["bytes"], "truncated": True}


async def run(ctx: ActorContext) -> int:
    server: dict[str, Any] = {**ctx.params["server"]}
    server_id = str(server["id"])
    log_path = Path(ctx.config["home"]) / "logs" / f"mcp-{server_id}.server.log"
    server["log"] = str(log_path)
    server["home"] = str(ctx.config["home"])
    # This incarnation's stderr starts here: a failure shows its own lines only.
    log_start = _size(log_path)
    startup_timeout = float(server.get("startup_timeout_s", 20.0))
    started = False
    pipes = StdioPipes()
    try:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(startup_timeout):
                session = await nursery.start(_hold_session, server, pipes)
                init = session.initialize_result
                tools = await list_all_tools(session)
                instructions = getattr(init, "instructions", None) or ""
                if len(instructions) > MAX_LISTED_INSTRUCTIONS:
                    raise McpStartError(f"its instructions are {len(instructions)} characters; refused")
            ready = McpReady(
                server=server_id,
                tools=tools,
                instructions=redact_text(instructions),
                server_info={
                    "name": str(getattr(getattr(init, "server_info", None), "name", "") or ""),
                    "version": str(getattr(getattr(init, "server_info", None), "version", "") or ""),
                },
            )
            await ctx.ask(ready)
            started = True
            nursery.start_soon(_watch_liveness, session, float(server.get("ping_interval_s", 2.0)))
            code = await _serve(ctx, session, pipes)
            nursery.cancel_scope.cancel()
            return code
    except BaseException as exc:  # classified: cancellation re-raised, the rest is an exit code
        cause = _first_cause(exc)
        if isinstance(cause, trio.Cancelled | KeyboardInterrupt | SystemExit):
            raise
        if isinstance(cause, trio.TooSlowError) and not started:
            message = f"did not start within {startup_timeout:g} s"
        elif pipes.unauthorized:
            # Seed 004 V1.22: "OAuth 缺失时必须明确报'当前切片未支持'，不能静默降级成匿名连接".
            message = ("the server answered 401 Unauthorized: it wants an authorization corral does not have"
                       " (OAuth is not supported in this version; give a bearer token in `headers`)")
        else:
            message = f"{type(cause).__name__}: {cause}"
        tail = stderr_tail(log_path, log_start) if server.get("command") else []
        await _report_failure(ctx, server_id, message if started else f"failed to start: {message}",
                              log_path if server.get("command") else None, tail)
        return EXIT_SESSION_BROKEN if started else EXIT_START_FAILED


#: What a failure shows of the server's stderr: its last lines, bounded both ways.
TAIL_LINES = 10
TAIL_BYTES = 2048
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def stderr_tail(path: Path, start: int) -> list[str]:
    """The last lines the server wrote to stderr since ``start`` (at most
    TAIL_LINES and TAIL_BYTES), redacted: they are shown by ``corral mcp list``,
    ``corral status`` and the errors of calls, and kept in memory only."""
    try:
        with open(path, "rb") as handle:
            end = handle.seek(0, os.SEEK_END)
            start = start if start <= end else 0  # the log was cut since
            begin = max(start, end - TAIL_BYTES)
            handle.seek(begin)
            data = handle.read(TAIL_BYTES)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    if begin > start and lines:
        lines = lines[1:]  # the first line was cut by the byte bound
    kept = [_CONTROL.sub("?", line.rstrip()) for line in lines if line.strip()][-TAIL_LINES:]
    return redact_text("\n".join(kept)).splitlines() if kept else []


class _SessionBroken(Exception):
    pass


def _first_cause(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (trio nurseries wrap what they raise)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


async def _hold_session(
    server: dict[str, Any], pipes: StdioPipes, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    tree = ServerTree(tree_tag(server["home"], server["id"])) if server.get("command") else None
    async with open_session(server, pipes, tree) as session:
        await session.initialize()
        task_status.started(session)
        while True:
            await trio.sleep(REAP_INTERVAL_S)
            if tree is not None:
                tree.reap_orphans()


class _InFlight:
    """Calls under way: a busy session answers its calls, so it is not pinged."""

    count = 0


async def _watch_liveness(session: Any, interval: float) -> None:
    """A server that died between calls is noticed by a ping, not by the next
    unlucky call: the actor then exits and is restarted per policy. While calls
    are in flight their own outcome tells (a ping queued behind a huge result
    would time out for no fault of the server)."""
    while True:
        await trio.sleep(interval)
        if _InFlight.count:
            continue
        try:
            with trio.fail_after(max(30.0, interval * 5)):
                await session.send_ping()
        except Exception as exc:
            raise _SessionBroken(f"the server stopped answering pings ({type(exc).__name__}: {exc})") from None


async def _report_failure(
    ctx: ActorContext, server_id: str, message: str, log_path: Path | None, tail: list[str]
) -> None:
    log.error("mcp server %s: %s", server_id, summarize(message, 300))
    failed = McpFailed(
        server=server_id,
        error=summarize(message, 500),
        log=str(log_path) if log_path is not None else "",
        stderr_tail=tail,
    )
    await ask_best_effort(ctx, failed)


async def _serve(ctx: ActorContext, session: Any, pipes: StdioPipes) -> int:
    broken = trio.Event()
    async with trio.open_nursery() as nursery:

        async def watch_broken() -> None:
            await broken.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch_broken)
        # One call at a time per server (seed 004 V1.22: "同一 server 的 catalog/call 串行，
        # 不同 server 可并行"): each server has its own actor, so its own lock.
        serial = trio.Lock()
        await serve_requests(
            ctx, nursery, {"call": partial(_call, ctx, session, broken=broken, pipes=pipes, serial=serial)})
        if ctx.shutdown.is_set():
            nursery.cancel_scope.cancel()
            return 0
        nursery.cancel_scope.cancel()
    if broken.is_set():
        raise _SessionBroken("a call found the session broken")
    return 0


async def _call(
    ctx: ActorContext, session: Any, envelope: Envelope, broken: trio.Event, pipes: StdioPipes, serial: trio.Lock
) -> None:
    body = envelope.body
    timeout = float(body.get("timeout_s", 60.0))
    # The action id lets a server (and a person reconciling) tie an effect to its
    # action; an idempotent tool also gets its key, the same on every attempt.
    meta: dict[str, Any] = {"corral/action_id": str(body.get("action_id", ""))}
    if body.get("idempotency_key"):
        meta["corral/idempotency_key"] = str(body["idempotency_key"])
    failpoints.hit("mcp.before-call")
    _InFlight.count += 1
    sent = False
    try:
        # The timeout covers the wait for the server's earlier calls too, so the
        # relay's deadline holds; a call still waiting then was never sent.
        with trio.fail_after(timeout):
            async with serial:
                sent = True
                result = await session.call_tool(str(body["tool"]), dict(body.get("arguments") or {}), meta=meta)
    except trio.TooSlowError:
        if not sent:
            await ctx.channel.reply_error(
                envelope, "mcp-busy", f"the server's earlier calls took all of {timeout:g} s; this one was not sent")
            return
        await ctx.channel.reply_error(envelope, "mcp-timeout", f"no result within {timeout:g} s")
        return
    except Exception as exc:
        # A JSON-RPC error answer is the server's word on this call; anything else
        # (a dead pipe, a malformed stream) means the session cannot be trusted.
        from mcp.shared.exceptions import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        if isinstance(exc, MCPError) and exc.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
            await ctx.channel.reply_error(envelope, "mcp-error", summarize(str(exc), 500))
            return
        # The transport's own reason, recorded before it closed the stream, beats
        # the closed connection it caused (a message past the bound).
        why = pipes.refused or f"{type(exc).__name__}: {exc}"
        await ctx.channel.reply_error(envelope, "mcp-session-broken", summarize(why, 500))
        broken.set()
        return
    finally:
        _InFlight.count -= 1
    failpoints.hit("mcp.after-call")
    payload = result_payload(result)
    try:
        # A server's JSON can still hold what the wire cannot carry (a lone surrogate,
        # nesting past msgpack's limit): the server answered, with a result that
        # fails the call (as one too large does), never this actor.
        recordable.check(payload, "the server's result")
    except recordable.NotRecordable as exc:
        await ctx.channel.reply_error(envelope, "mcp-error", summarize(f"unusable result: {exc}", 500))
        return
    answer = _bounded_result(payload, body.get("sidecar"))
    if not answer["ok"]:
        await ctx.channel.reply_error(envelope, answer["code"], answer["error"])
        return
    await ctx.channel.reply(envelope, answer)

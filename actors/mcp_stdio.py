"""A stdio MCP server's pipes, read in linear time and within a bound.

The SDK's stdio transport joins every chunk it reads to the pending text and
splits the whole again, so reading one line costs time quadratic in its length:
a 9 MiB result took about 6 s of CPU. On a loaded machine a flood then ran into
the call's timeout (or the server was lost meanwhile) before the size limit was
ever applied, and the action failed with a closed connection instead of the
limit (issue 48, D.12). This transport gives the SDK's ``ClientSession`` the
same two streams, but finds line ends in a byte buffer, and never holds a
message longer than ``MAX_MESSAGE_BYTES``: such a message ends the session, and
the reason is recorded (``StdioPipes.refused``) before the stream is closed, so
every call then in flight names the limit, whatever the timing.

It starts the server in a session and process group of its own, like the SDK.
On exit it closes the server's stdin and gives it ``EXIT_GRACE_S`` to exit,
then kills the group; the caller's ServerTree ends whatever is left
(actors/mcp_tree.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import anyio
import trio

from corral.actors.tools.sidecar import MAX_RESULT_BYTES

#: The longest message read from a server. A result past MAX_RESULT_BYTES is
#: refused anyway; the headroom is for what a result carries that corral drops
#: (images, audio, base64 resources) and for JSON's escaping.
MAX_MESSAGE_BYTES = 4 * MAX_RESULT_BYTES
#: How long a server gets to exit once its stdin is closed (the MCP spec's shutdown).
EXIT_GRACE_S = 2.0
_CHUNK = 1 << 16


@dataclass
class StdioPipes:
    """What the transport knows beyond the streams."""

    #: Why this side ended the session (a message past the bound), set before the
    #: read stream closes; None while it has not.
    refused: str | None = None
    pid: int | None = None
    #: An HTTP server answered 401 (it wants an authorization corral lacks).
    unauthorized: bool = False


@asynccontextmanager
async def stdio_pipes(
    argv: list[str], env: dict[str, str], cwd: str | None, errlog: TextIO, pipes: StdioPipes,
    *, max_bytes: int = MAX_MESSAGE_BYTES,
) -> AsyncIterator[tuple[Any, Any]]:
    """``(read_stream, write_stream)`` of a server started as ``argv``, with what
    else is known in ``pipes``; the streams carry the SDK's ``SessionMessage``
    (and parse errors, as values). ``env`` is the server's whole environment:
    nothing of this process's is inherited (seed 004 V1.22: "清空继承环境，只注入
    安全 PATH、配置中的 env"), not even the SDK's default HOME, SHELL, TERM or USER."""
    from mcp.shared.message import SessionMessage

    process = await trio.lowlevel.open_process(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errlog,
        env=env,
        cwd=Path(cwd) if cwd else None,
        start_new_session=True,
    )
    pipes.pid = process.pid
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_lines, process, read_send, pipes, max_bytes)
            nursery.start_soon(_write_messages, process, write_recv, read_send)
            try:
                yield read_recv, write_send
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await _stop(process)
            for stream in (read_send, read_recv, write_send, write_recv):
                await stream.aclose()


async def _read_lines(process: trio.Process, read_send: Any, pipes: StdioPipes, max_bytes: int) -> None:
    """One message per line, each parsed once; the read stream closes at the
    server's EOF or when a message passes ``max_bytes`` (the reason recorded first)."""
    assert process.stdout is not None
    pending = bytearray()
    async with read_send:
        try:
            while True:
                chunk = await process.stdout.receive_some(_CHUNK)
                if not chunk:
                    return
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    pending += chunk[start:end]
                    start = end + 1
                    if len(pending) > max_bytes:
                        break
                    await read_send.send(_parse(bytes(pending)))
                    pending.clear()
                else:
                    pending += chunk[start:]
                if len(pending) > max_bytes:
                    pipes.refused = (f"the server sent a message of more than {max_bytes} bytes; the limit is"
                                     f" {max_bytes} (the session was ended, the result is lost)")
                    return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, trio.ClosedResourceError,
                trio.BrokenResourceError):
            return  # the session is gone, or our own shutdown closed the pipe


def _parse(line: bytes) -> Any:
    """A message, or the parse error as a value (the SDK's contract: the session
    reports it, and the stream goes on)."""
    import mcp_types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


async def _write_messages(process: trio.Process, write_recv: Any, read_send: Any) -> None:
    assert process.stdin is not None
    try:
        async with write_recv:
            async for message in write_recv:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                await process.stdin.send_all(data.encode())
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, trio.ClosedResourceError,
            trio.BrokenResourceError, OSError):
        # The server cannot be written to: the session sees the connection end
        # instead of a request waiting forever.
        await read_send.aclose()


async def _stop(process: trio.Process) -> None:
    """Close stdin, give the server its grace, then kill its group and reap it."""
    assert process.stdin is not None and process.stdout is not None
    try:
        await process.stdin.aclose()
    except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
        pass
    with trio.move_on_after(EXIT_GRACE_S):
        await process.wait()
    if process.returncode is None:
        # The group number is still ours: its leader is our unreaped child.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        with trio.move_on_after(EXIT_GRACE_S):  # only an unkillable process runs this out
            await process.wait()
    await process.stdout.aclose()

"""Serving an ASGI app (the dashboard, the task bridge): a listening socket on a
chosen address, hypercorn under trio on it, until SIGINT or SIGTERM; and reading
a request's body within a cap."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from typing import Any

import trio


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is over {limit} bytes")
        self.limit = limit


class BadBody(Exception):
    """A body that cannot be read: a malformed Content-Length, a client gone mid-way."""


async def read_body(request: Any, limit: int) -> bytes:
    """A starlette request's body, at most ``limit`` bytes, refused while streaming.

    A declared Content-Length past the cap is refused before a byte is read; a
    chunked body is refused as soon as it passes the cap, and what was read is
    dropped. Nothing past the cap is read or kept: hypercorn's receive queue is
    bounded, so an unread body waits in the socket, not in memory."""
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()) or len(declared) > 19:
            raise BadBody(f"Content-Length {declared[:40]!r} is not a byte count")
        if int(declared) > limit:
            raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise BadBody("the client went away before the body ended") from None
    return b"".join(chunks)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket (``port`` 0: any free one); OSError says which address."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


async def serve(app: Any, sock: socket.socket, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """hypercorn on ``sock`` (it takes the socket over); ``started`` with the port."""
    from hypercorn.config import Config
    from hypercorn.trio import serve as hypercorn_serve

    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    task_status.started(sock.getsockname()[1])
    await hypercorn_serve(app, config, mode="asgi")


def run_until_signal(app: Any, sock: socket.socket, announce: Callable[[], None]) -> None:
    """Serve until SIGINT or SIGTERM; ``announce`` runs once the server listens."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, app, sock)
            announce()
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    trio.run(main)

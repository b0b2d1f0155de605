"""A TCP proxy between corral nodes and PostgreSQL: a database on another host, on
one machine, and an outsider's count of the round trips.

``LatencyProxy`` listens on loopback only and forwards every connection to the
server's Unix socket (corral/core/pg_local.py listens on no TCP port). Each chunk
read from either side is delivered ``delay_s`` later, in order: latency, not a
bandwidth cap, so a pipeline still travels as one burst and costs one round trip.

It counts, per connection, the *turns*: client bytes that arrive after the server
last spoke (or first). A request-and-answer protocol turns once per round trip, so
this is what each connection waited for, counted outside the driver: every
connection a node opens (its ledger, group commit's sync, its cluster
connection, adoptions) goes through the proxy and is counted.

The proxy runs an asyncio loop in a thread of the bench process; ``stop`` (or
leaving the ``with`` block) closes every connection and joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: How much a read takes from a socket at once.
CHUNK = 65536


@dataclass
class _Link:
    """One proxied connection: who spoke last, and how often the client turned."""

    last_from_client: bool = False
    turns: int = 0


@dataclass
class _Counts:
    links: list[_Link] = field(default_factory=list)
    bytes_up: int = 0
    bytes_down: int = 0


class LatencyProxy:
    """Loopback TCP → ``target`` (a Unix socket path), ``delay_s`` each way."""

    def __init__(self, target: Path, *, delay_s: float = 0.0) -> None:
        self.target = target
        self.delay_s = delay_s
        self.port = 0
        self._counts = _Counts()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None

    # -- what the bench reads ---------------------------------------------------------

    @property
    def round_trips(self) -> int:
        """Client turns over every connection so far (open and closed)."""
        with self._lock:
            return sum(link.turns for link in self._counts.links)

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._counts.links)

    def url(self, database: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    # -- life -----------------------------------------------------------------------------

    def start(self) -> LatencyProxy:
        self._thread = threading.Thread(target=self._run, name="pg-latency-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._failure is not None:
            raise self._failure
        if not self.port:
            raise RuntimeError("the latency proxy did not start")
        return self

    def stop(self) -> None:
        loop, stopped = self._loop, self._stopped
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start()'s caller
            self._failure = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await self._carry(reader, writer)
            finally:
                tasks.discard(task)

        server = await asyncio.start_server(accepted, "127.0.0.1", 0)
        self.port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        async with server:
            await self._stopped.wait()
            server.close()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _carry(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        try:
            server_in, server_out = await asyncio.open_unix_connection(str(self.target))
        except OSError:
            client_out.close()
            return
        link = _Link()
        with self._lock:
            self._counts.links.append(link)
        try:
            await asyncio.gather(
                self._direction(client_in, server_out, link, from_client=True),
                self._direction(server_in, client_out, link, from_client=False),
            )
        finally:
            for writer in (client_out, server_out):
                writer.close()

    async def _direction(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: _Link, *, from_client: bool
    ) -> None:
        """Read, stamp, and deliver each chunk ``delay_s`` after it arrived, in order."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                sink.write(data)
                await sink.drain()
            with contextlib.suppress(OSError):
                if sink.can_write_eof():
                    sink.write_eof()

        delivering = asyncio.create_task(deliver())
        try:
            while True:
                data = await source.read(CHUNK)
                now = loop.time()
                if data:
                    with self._lock:
                        if from_client:
                            link.turns += 0 if link.last_from_client else 1
                            self._counts.bytes_up += len(data)
                        else:
                            self._counts.bytes_down += len(data)
                        link.last_from_client = from_client
                queue.put_nowait((now + self.delay_s, data))
                if not data:
                    break
            await delivering
        except (OSError, asyncio.IncompleteReadError):
            delivering.cancel()
        finally:
            if not delivering.done():
                delivering.cancel()


@contextlib.contextmanager
def latency_proxy(target: Path, delay_s: float = 0.0) -> Iterator[LatencyProxy]:
    """A started proxy, stopped (its thread joined, its connections closed) on exit."""
    proxy = LatencyProxy(target, delay_s=delay_s)
    with proxy:
        yield proxy

"""multiprocessing targets for the bare baselines. Standard library only, on purpose:
this module is what a spawned child imports, and is the fork server's preload."""

from __future__ import annotations

import os
from multiprocessing.connection import Connection


def ready_then_wait(index: int, ready: Connection, stop: Connection) -> None:
    """Report ready (our index and pid), then idle until ``stop`` reaches EOF."""
    ready.send_bytes(index.to_bytes(4, "little") + os.getpid().to_bytes(4, "little"))
    try:
        stop.recv_bytes()
    except (EOFError, OSError):
        pass


def work_once(index: int, result: Connection) -> None:
    """A fan-out child: do trivial work, send the result, exit."""
    result.send_bytes(index.to_bytes(4, "little") + b"result")


def pipe_echo(conn: Connection) -> None:
    """Echo every message until EOF (multiprocessing.Pipe RTT)."""
    try:
        while True:
            conn.send_bytes(conn.recv_bytes())
    except (EOFError, OSError):
        pass


def pipe_sink(conn: Connection, count: int) -> None:
    """Receive ``count`` messages, answer b"done", repeat until EOF (throughput)."""
    try:
        while True:
            for _ in range(count):
                conn.recv_bytes()
            conn.send_bytes(b"done")
    except (EOFError, OSError):
        pass

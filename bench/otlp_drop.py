"""A loopback OTLP/HTTP traces endpoint that accepts every export and keeps only
counts: the telemetry variant of ``durable_actions`` exports to it, so the figure
measures what exporting costs the supervisor (projection, encoding, the
exporter's thread), not a network or a collector."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


@dataclass
class Received:
    requests: int = 0
    bytes: int = 0


@contextmanager
def otlp_drop() -> Iterator[tuple[str, Received]]:
    """``(endpoint, counts)``: the base URL for ``[telemetry] endpoint``."""
    received = Received()
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            size = len(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            with lock:
                received.requests += 1
                received.bytes += size
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)

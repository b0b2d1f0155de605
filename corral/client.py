"""Finding and talking to the supervisor of a home, for the CLI and tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.mailbox.control import ControlClient
from corral.supervisor import home as homes


def connect(home: Path, timeout: float = 10.0) -> ControlClient:
    endpoint = homes.read_endpoint(home)
    return ControlClient(endpoint.control, endpoint.token, timeout=timeout, pid=endpoint.pid)


def call(home: Path, method: str, timeout: float = 10.0, **params: Any) -> Any:
    with connect(home, timeout) as client:
        return client.call(method, **params)


def all_events(home: Path, since: int = 0) -> list[dict[str, Any]]:
    """Every event after ``since``. The supervisor answers in pages bounded by
    count and bytes (so a reply always fits a frame); this follows the cursor."""
    events: list[dict[str, Any]] = []
    while True:
        page = call(home, "events", since=since, limit=5000)
        if not page["events"]:
            return events
        events.extend(page["events"])
        since = page["cursor"]

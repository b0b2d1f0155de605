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

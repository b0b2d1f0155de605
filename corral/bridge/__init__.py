"""The agent-task bridge (protocol bridge-m1-1): a JSON-RPC 2.0 service through
which independent agent clients hand tasks to each other (docs/bridge.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.bridge.client import BridgeCallError, Client

__all__ = ["BridgeCallError", "Client"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from corral.bridge import client

        return getattr(client, name)
    raise AttributeError(name)

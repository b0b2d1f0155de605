"""corral: a supervised actor runtime for local LLM agent swarms.

The public API is on this page; everything else is private. Names load lazily, on
first use, so ``import corral`` stays cheap (no trio, pynng or pydantic until you
touch something that needs them).

Bring your own code:

* ``@corral.tool`` turns a typed function into a durable tool (``ToolContext``,
  ``ToolError``);
* ``corral.Actor`` is the base class of a user actor template
  (``[[actors]] template = "my_pkg.actors:Counter"``);
* ``corral.Provider`` is the protocol a user model client implements
  (``provider = "my_pkg.llm:MyProvider"``).

Drive a swarm: ``corral.Client`` (synchronous) and ``corral.AsyncClient`` (asyncio or
trio).
Every error raised at you is a ``corral.CorralError``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Wire protocol version carried by every envelope and the endpoint file.
PROTOCOL_VERSION = 1

# name -> module that defines it (import paths, relative to nothing: absolute).
_EXPORTS: dict[str, str] = {
    # tools
    "tool": "corral.actors.tools.declare",
    "ToolContext": "corral.actors.tools.base",
    "ToolError": "corral.actors.tools.base",
    # actors
    "Actor": "corral.actors.user_actor",
    "ActorContext": "corral.actors.runtime",
    # providers
    "Provider": "corral.actors.providers.base",
    "ProviderRequest": "corral.actors.providers.base",
    "ProviderResponse": "corral.actors.providers.base",
    "ProviderError": "corral.actors.providers.base",
    "ErrorKind": "corral.actors.providers.base",
    "Plan": "corral.actors.providers.base",
    "PlanError": "corral.actors.providers.base",
    "RepairCategory": "corral.actors.providers.base",
    "ToolCall": "corral.actors.providers.base",
    "ToolSchema": "corral.actors.providers.base",
    # client
    "Client": "corral.client",
    "AsyncClient": "corral.async_client",
    "RunResult": "corral.client_types",
    "Action": "corral.client_types",
    "Event": "corral.client_types",
    "Pending": "corral.client_types",
    # errors
    "CorralError": "corral.core.errors",
    "UserCodeError": "corral.core.errors",
    "RunFailed": "corral.core.errors",
    "RunTimeout": "corral.core.errors",
    "LedgerDoorError": "corral.core.errors",
    "LedgerLost": "corral.core.errors",
    "SpecError": "corral.supervisor.spec.swarm_spec",
    "NotRunning": "corral.supervisor.home.home_dir",
    "SupervisorGone": "corral.mailbox.control",
    "ClientClosed": "corral.mailbox.control",
    "ControlError": "corral.mailbox.control",
    "DeadlineExceeded": "corral.mailbox.errors",
    "SupervisorStartError": "corral.client_start",
}

__all__ = [
    "PROTOCOL_VERSION",
    "Action",
    "Actor",
    "ActorContext",
    "AsyncClient",
    "Client",
    "ClientClosed",
    "ControlError",
    "CorralError",
    "DeadlineExceeded",
    "ErrorKind",
    "Event",
    "LedgerDoorError",
    "LedgerLost",
    "NotRunning",
    "Pending",
    "Plan",
    "PlanError",
    "Provider",
    "ProviderError",
    "ProviderRequest",
    "ProviderResponse",
    "RepairCategory",
    "RunFailed",
    "RunResult",
    "RunTimeout",
    "SpecError",
    "SupervisorGone",
    "SupervisorStartError",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolSchema",
    "UserCodeError",
    "__version__",
    "tool",
]

if TYPE_CHECKING:  # what editors and type checkers see; at run time __getattr__ loads
    from corral.actors.providers.base import (
        ErrorKind,
        Plan,
        PlanError,
        Provider,
        ProviderError,
        ProviderRequest,
        ProviderResponse,
        RepairCategory,
        ToolCall,
        ToolSchema,
    )
    from corral.actors.runtime import ActorContext
    from corral.actors.tools.base import ToolContext, ToolError
    from corral.actors.tools.declare import tool  # type: ignore[import-not-found, unused-ignore]
    from corral.actors.user_actor import Actor
    from corral.async_client import AsyncClient
    from corral.client import Client
    from corral.client_start import SupervisorStartError
    from corral.client_types import Action, Event, Pending, RunResult
    from corral.core.errors import CorralError, LedgerDoorError, LedgerLost, RunFailed, RunTimeout, UserCodeError
    from corral.mailbox.control import ClientClosed, ControlError, SupervisorGone
    from corral.mailbox.errors import DeadlineExceeded
    from corral.supervisor.home.home_dir import NotRunning
    from corral.supervisor.spec.swarm_spec import SpecError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'corral' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

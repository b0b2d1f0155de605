"""The provider interface.

A provider makes exactly one physical request per call of ``complete`` and never
retries on its own: the agent owns the durable request lifecycle (``started ->
completed|failed``), commits the raw response to the ledger before ``parse`` sees
it, and schedules transient retries as new lifecycles.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

MAX_ACTIONS_PER_PLAN = 3


@dataclass(frozen=True)
class ToolSchema:
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    #: Input fields kept out of the ledger: the supervisor spools them privately at
    #: plan commit and the plan holds ``{"sealed": sha256, "bytes": n}`` instead.
    sealed: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProviderRequest:
    run_id: str
    agent_id: str
    task: str
    loop_index: int
    #: Observations so far, oldest first: {"action_id", "tool", "status", "output"}
    #: for tool results, or {"role": "repair", "category", "detail"} for repairs.
    history: tuple[dict[str, Any], ...]
    tools: tuple[ToolSchema, ...]
    #: Lifecycle slot (``<run>:<loop>`` or ``<base>-transient-N``), for logging only.
    slot: str = ""


@dataclass(frozen=True)
class ProviderResponse:
    """The raw answer, as committed to the ledger (redacted and bounded)."""

    text: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    tool: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    actions: tuple[ToolCall, ...] = ()
    final_reply: str | None = None

    def __post_init__(self) -> None:
        if self.final_reply is None and not self.actions:
            raise PlanError(RepairCategory.EMPTY_PLAN, "plan has neither actions nor a reply")
        if self.final_reply is not None and self.actions:
            raise PlanError(RepairCategory.SCHEMA_MISMATCH, "plan has both actions and a reply")
        if len(self.actions) > MAX_ACTIONS_PER_PLAN:
            raise PlanError(
                RepairCategory.TOO_MANY_ACTIONS,
                f"{len(self.actions)} actions, at most {MAX_ACTIONS_PER_PLAN} per plan",
            )


class ErrorKind(enum.StrEnum):
    TRANSIENT = "transient"  # timeout, connection, transport: retry as a new lifecycle
    HTTP = "http"  # a definite answer from the server that is an error (4xx/5xx)
    FATAL = "fatal"  # configuration and anything else that no retry fixes


class ProviderError(Exception):
    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class RepairCategory(enum.StrEnum):
    UNKNOWN_TOOL = "unknown-tool"
    BAD_JSON = "bad-json"
    SCHEMA_MISMATCH = "schema-mismatch"
    TOO_MANY_ACTIONS = "too-many-actions"
    EMPTY_PLAN = "empty-plan"


class PlanError(ValueError):
    """A response that does not parse into a valid plan; the run may ask for repair."""

    def __init__(self, category: RepairCategory, detail: str) -> None:
        super().__init__(f"{category.value}: {detail}")
        self.category = category
        self.detail = detail


class Provider(Protocol):
    name: str

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        """One physical request. Raises ProviderError; never retries."""
        ...

    def parse(self, response: ProviderResponse, tools: tuple[ToolSchema, ...]) -> Plan:
        """Turn a committed response into a plan. Raises PlanError."""
        ...

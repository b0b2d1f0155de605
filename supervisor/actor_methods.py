"""The supervisor's typed actor methods, one ``Protocol`` per family.

A family's service implements its ``Protocol`` and sets its field of
``ActorMethods`` in its setup (``sup.methods.probes = probes``);
supervisor/actor_dispatch.py's ``match`` hands each typed record (mailbox/protocol/)
to its family's method. A family this supervisor was built without stays
``None``, and its methods are answered ``unknown-method``. The run layer is not
here: every supervisor has one (``Supervisor.runs``), and the dispatch calls it
directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from corral.mailbox.protocol import (
        BenchSink,
        BenchSinkCount,
        BenchSinkReset,
        CommandLaunched,
        CommandSandbox,
        McpCall,
        McpFailed,
        McpReady,
        ModelFailed,
        ModelGenerate,
        ModelReady,
        ProjectPreview,
        ProjectRevisionAdvance,
        ProjectVerification,
        ProjectVerifyBegin,
        ProjectVerifyRecord,
        SessionLaunched,
        SessionPoll,
        SessionStart,
        SessionStateReport,
        SessionStdin,
        SessionTerminate,
        SinkCount,
    )
    from corral.supervisor.tree.supervision_tree import ActorSlot


class ProbeMethods(Protocol):
    """The bench's probes (supervisor/probes.py)."""

    async def sink(self, slot: ActorSlot, request: BenchSink) -> dict[str, Any]: ...

    async def sink_count(self, slot: ActorSlot, request: BenchSinkCount) -> SinkCount: ...

    async def sink_reset(self, slot: ActorSlot, request: BenchSinkReset) -> dict[str, Any]: ...


class ProjectMethods(Protocol):
    """The project: ``project.verify``'s ledger calls, its verification, its preview
    (supervisor/project/project_service.py)."""

    async def verify_begin(self, slot: ActorSlot, request: ProjectVerifyBegin) -> dict[str, Any]: ...

    async def verify_record(self, slot: ActorSlot, request: ProjectVerifyRecord) -> dict[str, Any]: ...

    async def verification(self, slot: ActorSlot, request: ProjectVerification) -> dict[str, Any]: ...

    async def preview(self, slot: ActorSlot, request: ProjectPreview) -> dict[str, Any]: ...

    async def revision_advance(self, slot: ActorSlot, request: ProjectRevisionAdvance) -> dict[str, Any]: ...


class SessionMethods(Protocol):
    """Process sessions and one-shot commands: the agent's tools' requests and the
    session actors' own reports (supervisor/sessions/session_service.py)."""

    async def start(self, slot: ActorSlot, request: SessionStart) -> dict[str, Any]: ...

    async def poll(self, slot: ActorSlot, request: SessionPoll) -> dict[str, Any]: ...

    async def stdin(self, slot: ActorSlot, request: SessionStdin) -> dict[str, Any]: ...

    async def terminate(self, slot: ActorSlot, request: SessionTerminate) -> dict[str, Any]: ...

    async def launched(self, slot: ActorSlot, request: SessionLaunched) -> dict[str, Any]: ...

    async def state(self, slot: ActorSlot, request: SessionStateReport) -> dict[str, Any]: ...

    async def command_sandbox(self, slot: ActorSlot, request: CommandSandbox) -> dict[str, Any]: ...

    async def command_launched(self, slot: ActorSlot, request: CommandLaunched) -> dict[str, Any]: ...


class ModelMethods(Protocol):
    """Local models: a model actor's readiness, an agent's generation (supervisor/models/model_service.py)."""

    async def ready(self, slot: ActorSlot, request: ModelReady) -> dict[str, Any]: ...

    async def failed(self, slot: ActorSlot, request: ModelFailed) -> dict[str, Any]: ...

    async def generate(self, slot: ActorSlot, request: ModelGenerate) -> dict[str, Any]: ...


class McpMethods(Protocol):
    """MCP servers: a server actor's catalog or failure, an agent's tool call (supervisor/mcp/mcp_service.py)."""

    async def ready(self, slot: ActorSlot, request: McpReady) -> dict[str, Any]: ...

    async def failed(self, slot: ActorSlot, request: McpFailed) -> dict[str, Any]: ...

    async def call(self, slot: ActorSlot, request: McpCall) -> dict[str, Any]: ...


@dataclass
class ActorMethods:
    """The families this supervisor serves: each set by its service's setup."""

    probes: ProbeMethods | None = None
    project: ProjectMethods | None = None
    sessions: SessionMethods | None = None
    models: ModelMethods | None = None
    mcp: McpMethods | None = None

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
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from corral.mailbox.protocol import (
        Ack,
        ActionReceipts,
        BenchSink,
        BenchSinkCount,
        BenchSinkReset,
        BridgeJob,
        BridgeJobAdvance,
        BridgeJobList,
        BridgeJobOpen,
        BridgeJobs,
        BridgeReport,
        BridgeRunState,
        BridgeRunStatus,
        Claimed,
        CommandLaunched,
        CommandSandbox,
        CommandSource,
        Compacted,
        ContextCompacted,
        Contract,
        Delegated,
        Generation,
        GoalVerdict,
        GroupSpawned,
        HistoryActions,
        HistoryCommand,
        InputRequest,
        McpAnswer,
        McpCall,
        McpFailed,
        McpReady,
        ModelFailed,
        ModelGenerate,
        ModelReady,
        Preview,
        ProjectCommitMoved,
        ProjectPreview,
        ProjectRevisionAdvance,
        ProjectVerification,
        ProjectVerifyBegin,
        ProjectVerifyRecord,
        ProviderInterrupted,
        ReplyDelta,
        Revision,
        RunChildResult,
        SandboxGrant,
        SessionLaunched,
        SessionOutput,
        SessionPoll,
        SessionStart,
        SessionStateReport,
        SessionStdin,
        SessionTerminate,
        SessionView,
        SinkCount,
        StdinWritten,
        SwarmClaim,
        SwarmContract,
        SwarmDelegate,
        SwarmSpawn,
        Verdict,
        Verification,
        VerificationState,
        VerifyBegun,
    )
    from corral.supervisor.tree.supervision_tree import ActorSlot


class ProbeMethods(Protocol):
    """The bench's probes (supervisor/probes.py)."""

    async def sink(self, slot: ActorSlot, request: BenchSink) -> Ack: ...

    async def sink_count(self, slot: ActorSlot, request: BenchSinkCount) -> SinkCount: ...

    async def sink_reset(self, slot: ActorSlot, request: BenchSinkReset) -> Ack: ...


class ProjectMethods(Protocol):
    """The project: ``project.verify``'s ledger calls, its verification, its preview
    (supervisor/project/project_service.py)."""

    async def verify_begin(self, slot: ActorSlot, request: ProjectVerifyBegin) -> VerifyBegun: ...

    async def verify_record(self, slot: ActorSlot, request: ProjectVerifyRecord) -> Verification: ...

    async def verification(self, slot: ActorSlot, request: ProjectVerification) -> VerificationState: ...

    async def preview(self, slot: ActorSlot, request: ProjectPreview) -> Preview: ...

    async def revision_advance(self, slot: ActorSlot, request: ProjectRevisionAdvance) -> Revision: ...

    async def commit_moved(self, slot: ActorSlot, request: ProjectCommitMoved) -> Ack: ...


class SessionMethods(Protocol):
    """Process sessions and one-shot commands: the agent's tools' requests and the
    session actors' own reports (supervisor/sessions/session_service.py)."""

    async def start(self, slot: ActorSlot, request: SessionStart) -> SessionView: ...

    async def poll(self, slot: ActorSlot, request: SessionPoll) -> SessionOutput: ...

    async def stdin(self, slot: ActorSlot, request: SessionStdin) -> StdinWritten: ...

    async def terminate(self, slot: ActorSlot, request: SessionTerminate) -> SessionView: ...

    async def launched(self, slot: ActorSlot, request: SessionLaunched) -> Ack: ...

    async def state(self, slot: ActorSlot, request: SessionStateReport) -> Ack: ...

    async def command_sandbox(self, slot: ActorSlot, request: CommandSandbox) -> SandboxGrant: ...

    async def command_launched(self, slot: ActorSlot, request: CommandLaunched) -> Ack: ...


class ModelMethods(Protocol):
    """Local models: a model actor's readiness, an agent's generation (supervisor/models/model_service.py)."""

    async def ready(self, slot: ActorSlot, request: ModelReady) -> Ack: ...

    async def failed(self, slot: ActorSlot, request: ModelFailed) -> Ack: ...

    async def generate(self, slot: ActorSlot, request: ModelGenerate) -> Generation: ...


class McpMethods(Protocol):
    """MCP servers: a server actor's catalog or failure, an agent's tool call (supervisor/mcp/mcp_service.py)."""

    async def ready(self, slot: ActorSlot, request: McpReady) -> Ack: ...

    async def failed(self, slot: ActorSlot, request: McpFailed) -> Ack: ...

    async def call(self, slot: ActorSlot, request: McpCall) -> McpAnswer: ...


# -- long tasks (supervisor/longtask/) ---------------------------------------------


class CompactionMethods(Protocol):
    """Context compaction (supervisor/longtask/compaction_service.py)."""

    async def compacted(self, slot: ActorSlot, request: ContextCompacted) -> Compacted: ...


class GoalMethods(Protocol):
    """A goal's verdict (supervisor/longtask/goal_service.py)."""

    async def verdict(self, slot: ActorSlot, request: GoalVerdict) -> Verdict: ...


# -- people (supervisor/interactive/) ----------------------------------------------


class SteerMethods(Protocol):
    """Steers and goal pauses interrupting a provider turn (supervisor/interactive/steer_control.py)."""

    async def provider_interrupted(self, slot: ActorSlot, request: ProviderInterrupted) -> Ack: ...


class QuestionMethods(Protocol):
    """Structured questions for a person (supervisor/interactive/question_service.py)."""

    async def ask(self, slot: ActorSlot, request: InputRequest) -> Ack: ...


class OwnHistoryMethods(Protocol):
    """An agent's own history (supervisor/interactive/own_history_service.py)."""

    async def actions(self, slot: ActorSlot, request: HistoryActions) -> ActionReceipts: ...

    async def command(self, slot: ActorSlot, request: HistoryCommand) -> CommandSource: ...


class ReplyStreamMethods(Protocol):
    """Streamed final replies (supervisor/interactive/reply_stream_service.py)."""

    async def reply_delta(self, slot: ActorSlot, request: ReplyDelta) -> Ack: ...


class SwarmMethods(Protocol):
    """The swarm: spawns, delegations, claims, contracts (supervisor/swarm/swarm_service.py)."""

    async def spawn(self, slot: ActorSlot, request: SwarmSpawn) -> GroupSpawned: ...

    async def delegate(self, slot: ActorSlot, request: SwarmDelegate) -> Delegated: ...

    async def claim(self, slot: ActorSlot, request: SwarmClaim) -> Claimed: ...

    async def contract(self, slot: ActorSlot, request: SwarmContract) -> Contract: ...

    async def child_result(self, slot: ActorSlot, request: RunChildResult) -> Ack: ...


class BridgeMethods(Protocol):
    """An agent-task bridge's jobs, driven by the bridge worker (supervisor/bridge/bridge_service.py)."""

    async def jobs(self, slot: ActorSlot, request: BridgeJobs) -> BridgeJobList: ...

    async def job_open(self, slot: ActorSlot, request: BridgeJobOpen) -> BridgeJob: ...

    async def job_advance(self, slot: ActorSlot, request: BridgeJobAdvance) -> BridgeJob: ...

    async def run_status(self, slot: ActorSlot, request: BridgeRunStatus) -> BridgeRunState: ...

    async def report(self, slot: ActorSlot, request: BridgeReport) -> Ack: ...


@dataclass
class ActorMethods:
    """The families this supervisor serves: each set by its service's setup."""

    probes: ProbeMethods | None = None
    project: ProjectMethods | None = None
    sessions: SessionMethods | None = None
    models: ModelMethods | None = None
    mcp: McpMethods | None = None
    compaction: CompactionMethods | None = None
    goals: GoalMethods | None = None
    steers: SteerMethods | None = None
    questions: QuestionMethods | None = None
    own_history: OwnHistoryMethods | None = None
    reply_stream: ReplyStreamMethods | None = None
    swarm: SwarmMethods | None = None
    bridge: BridgeMethods | None = None

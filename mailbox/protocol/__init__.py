"""The one protocol between an agent (any actor) and its supervisor.

Every request an actor sends the supervisor names a ``Method``; its ``params``
are decoded here, once, at the boundary (``decode``), into that method's typed
request record. A frame whose shape is wrong (an unknown method, a missing
field, a field of the wrong type, a field the method does not have) is refused
here with a ``ProtocolError`` (``Code.UNKNOWN_METHOD`` / ``Code.BAD_REQUEST``)
that names what is wrong, never a ``KeyError`` deep inside a handler.

The records are msgspec ``Struct``s: decoding a hot-path request (``action.finish``,
eight fields) costs about 1.4 µs, against 3.4 µs for pydantic's TypedDict
adapter, 4.6 µs for a pydantic model and 3.9 µs for a hand-written dataclass
check (timeit, docs/architecture.md). On the wire a request stays the map
``{"method": <Method>, "params": {...}}`` (``encode``): the supervisor and its
actors are always the same code, so one version speaks one shape.

The package holds one module per family of methods (``run_records``: the run
layer's; ``probes``: the bench's; ...), each importing its base from ``base``;
this module re-exports them, and holds the union of every typed request and
the one decoder. Every method has its record (tests/test_protocol_seam.py
checks it): there is no untyped way in.

``Code`` is the one list of error codes an actor and the supervisor exchange.
"""

from __future__ import annotations

from typing import Any, Final, TypeVar, cast, get_args

import msgspec

from corral.mailbox.protocol.base import Ack, BadReply, Code, Count, Id, Method, ProtocolError, Request
from corral.mailbox.protocol.bridge import (
    BridgeJob,
    BridgeJobAdvance,
    BridgeJobList,
    BridgeJobOpen,
    BridgeJobs,
    BridgeReport,
    BridgeRequest,
    BridgeRunState,
    BridgeRunStatus,
)
from corral.mailbox.protocol.longtask import Compacted, ContextCompacted, GoalVerdict, LongTaskRequest, Verdict
from corral.mailbox.protocol.mcp import (
    McpAnswer,
    McpCall,
    McpFailed,
    McpReady,
    McpRequest,
    McpResult,
    OtherContent,
)
from corral.mailbox.protocol.models import (
    ChatMessage,
    Generation,
    GenerationTimings,
    ModelFailed,
    ModelGenerate,
    ModelReady,
    ModelRequest,
    ReplyStream,
    TokenUsage,
)
from corral.mailbox.protocol.people import (
    ActionReceipts,
    CommandSource,
    HistoryActions,
    HistoryCommand,
    InputRequest,
    OwnReceipt,
    PeopleRequest,
    ReplyDelta,
    SafeDetail,
)
from corral.mailbox.protocol.probes import BenchSink, BenchSinkCount, BenchSinkReset, ProbeRequest, SinkCount
from corral.mailbox.protocol.project import (
    Preview,
    ProjectCommitMoved,
    ProjectPreview,
    ProjectRequest,
    ProjectRevisionAdvance,
    ProjectVerification,
    ProjectVerifyBegin,
    ProjectVerifyRecord,
    Revision,
    Verification,
    VerificationState,
    VerifyBegun,
)
from corral.mailbox.protocol.run_records import (
    ActionBegin,
    ActionFinish,
    ActionFinishBatch,
    ActionPrepare,
    ActionResult,
    Claim,
    ClaimedRun,
    HandedOff,
    InvalidPlan,
    NextStep,
    Ping,
    PlanAnswer,
    PlanCommit,
    PlanInvalid,
    Pong,
    Prepared,
    ProviderBegin,
    ProviderFailed,
    ProviderFailure,
    ProviderHandoff,
    ProviderInterrupted,
    Receipt,
    RequestIdentity,
    RunChildResult,
    RunClaim,
    RunFail,
    RunFinalize,
    RunFinalized,
    RunRequest,
    StepReply,
    TurnNote,
)
from corral.mailbox.protocol.sessions import (
    DEFAULT_POLL_CHARS,
    MAX_POLL_CHARS,
    MAX_POLL_WAIT_MS,
    CommandLaunched,
    CommandSandbox,
    SandboxGrant,
    SealedValue,
    SessionLaunched,
    SessionOutput,
    SessionPoll,
    SessionRequest,
    SessionStart,
    SessionStateReport,
    SessionStdin,
    SessionTerminate,
    SessionView,
    StdinWritten,
)
from corral.mailbox.protocol.swarm import (
    Claimed,
    ClaimedJoin,
    Contract,
    ContractLine,
    Delegated,
    GroupSpawned,
    JoinedChild,
    SpawnChild,
    SpawnedChild,
    SwarmClaim,
    SwarmContract,
    SwarmDelegate,
    SwarmRequest,
    SwarmSpawn,
)
from corral.mailbox.steps import ActionBegun, ProviderBegun, Stepped

__all__ = [
    "DEFAULT_POLL_CHARS",
    "MAX_POLL_CHARS",
    "MAX_POLL_WAIT_MS",
    "Ack",
    "ActionBegin",
    "ActionBegun",
    "ActionFinish",
    "ActionFinishBatch",
    "ActionPrepare",
    "ActionReceipts",
    "ActionResult",
    "BadReply",
    "BenchSink",
    "BenchSinkCount",
    "BenchSinkReset",
    "BridgeJob",
    "BridgeJobAdvance",
    "BridgeJobList",
    "BridgeJobOpen",
    "BridgeJobs",
    "BridgeReport",
    "BridgeRunState",
    "BridgeRunStatus",
    "ChatMessage",
    "Claim",
    "Claimed",
    "ClaimedJoin",
    "ClaimedRun",
    "Code",
    "CommandLaunched",
    "CommandSandbox",
    "CommandSource",
    "Compacted",
    "ContextCompacted",
    "Contract",
    "ContractLine",
    "Count",
    "Delegated",
    "Generation",
    "GenerationTimings",
    "GoalVerdict",
    "GroupSpawned",
    "HandedOff",
    "HistoryActions",
    "HistoryCommand",
    "Id",
    "InputRequest",
    "InvalidPlan",
    "JoinedChild",
    "McpAnswer",
    "McpCall",
    "McpFailed",
    "McpReady",
    "McpResult",
    "Method",
    "ModelFailed",
    "ModelGenerate",
    "ModelReady",
    "NextStep",
    "OtherContent",
    "OwnReceipt",
    "Ping",
    "PlanAnswer",
    "PlanCommit",
    "PlanInvalid",
    "Pong",
    "Prepared",
    "Preview",
    "ProjectCommitMoved",
    "ProjectPreview",
    "ProjectRevisionAdvance",
    "ProjectVerification",
    "ProjectVerifyBegin",
    "ProjectVerifyRecord",
    "ProtocolError",
    "ProviderBegin",
    "ProviderBegun",
    "ProviderFailed",
    "ProviderFailure",
    "ProviderHandoff",
    "ProviderInterrupted",
    "Receipt",
    "ReplyDelta",
    "ReplyStream",
    "Request",
    "RequestIdentity",
    "Revision",
    "RunChildResult",
    "RunClaim",
    "RunFail",
    "RunFinalize",
    "RunFinalized",
    "SafeDetail",
    "SandboxGrant",
    "SealedValue",
    "SessionLaunched",
    "SessionOutput",
    "SessionPoll",
    "SessionStart",
    "SessionStateReport",
    "SessionStdin",
    "SessionTerminate",
    "SessionView",
    "SinkCount",
    "SpawnChild",
    "SpawnedChild",
    "StdinWritten",
    "StepReply",
    "StepRequest",
    "Stepped",
    "SwarmClaim",
    "SwarmContract",
    "SwarmDelegate",
    "SwarmSpawn",
    "TokenUsage",
    "TurnNote",
    "TypedRequest",
    "Verdict",
    "Verification",
    "VerificationState",
    "VerifyBegun",
    "decode",
    "encode",
    "reply",
]

R = TypeVar("R")

#: The step methods: their reply carries the run's next step when ``want_next``
#: (supervisor/runs/step_piggyback.py).
StepRequest = (
    ProviderHandoff | PlanCommit | PlanInvalid | ActionPrepare | ActionBegin | ActionFinish | ActionFinishBatch
) | ContextCompacted

#: Every typed request, one family's union each; ``decode`` makes one of these,
#: and supervisor/actor_dispatch.py's ``match`` serves each.
TypedRequest = (
    RunRequest
    | ProbeRequest
    | ProjectRequest
    | SessionRequest
    | ModelRequest
    | McpRequest
    | LongTaskRequest
    | PeopleRequest
    | SwarmRequest
    | BridgeRequest
)

#: Each typed request's record by its method, read off the union (no second list).
_TYPED: Final[dict[Method, type[TypedRequest]]] = {kind.METHOD: kind for kind in get_args(TypedRequest)}


def decode(body: dict[str, Any]) -> TypedRequest:
    """A request body off the wire, checked once: its typed record. Raises
    ``ProtocolError``."""
    name = body.get("method")
    if not isinstance(name, str):
        raise ProtocolError("the request has no method (a string)")
    try:
        method = Method(name)
    except ValueError:
        raise ProtocolError(f"no actor method {name[:80]!r}", Code.UNKNOWN_METHOD) from None
    params = body.get("params", {})
    if not isinstance(params, dict):
        raise ProtocolError(f"{method}: params must be a map")
    kind = _TYPED[method]  # every method has its record (tests/test_protocol_seam.py)
    try:
        return msgspec.convert(params, kind, strict=True)
    except msgspec.ValidationError as exc:
        # msgspec names the field: "Expected `str`, got `int` - at `$.action_id`".
        raise ProtocolError(f"{method}: {exc}") from None


def encode(request: Request[Any]) -> dict[str, Any]:
    """A typed request as the wire carries it."""
    params: dict[str, Any] = msgspec.to_builtins(request)
    return {"method": request.METHOD.value, "params": params}


def reply(request: Request[R], answer: dict[str, Any]) -> R:
    """``request``'s reply off the wire, checked once as it arrives into its typed
    record (``REPLY``). Raises ``BadReply``, naming the method and the field, for
    a reply of the wrong shape."""
    kind = request.REPLY
    try:
        return cast(R, msgspec.convert(answer, kind, strict=True))
    except msgspec.ValidationError as exc:
        raise BadReply(f"{request.METHOD}: malformed reply: {exc}") from None

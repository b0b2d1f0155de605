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

Methods whose request record is not written yet arrive as ``Untyped`` (their
params a map, each handler checks its own fields); each family moves to typed
records in turn (docs/architecture.md says which are typed).

``Code`` is the one list of error codes an actor and the supervisor exchange.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, Generic, TypeVar

import msgspec

from corral.mailbox.steps import Step


class Method(StrEnum):
    """Every method an actor may call on its supervisor."""

    PING = "ping"
    # the run layer (supervisor/runs/run_actor_methods.py)
    RUN_CLAIM = "run.claim"
    RUN_NEXT_STEP = "run.next_step"
    PROVIDER_BEGIN = "provider.begin"
    PROVIDER_HANDOFF = "provider.handoff"
    PROVIDER_FAILED = "provider.failed"
    PROVIDER_INTERRUPTED = "provider.interrupted"
    PLAN_COMMIT = "plan.commit"
    PLAN_INVALID = "plan.invalid"
    ACTION_PREPARE = "action.prepare"
    ACTION_BEGIN = "action.begin"
    ACTION_FINISH = "action.finish"
    ACTION_FINISH_BATCH = "action.finish_batch"
    RUN_FINALIZE = "run.finalize"
    RUN_FAIL = "run.fail"
    RUN_CHILD_RESULT = "run.child_result"
    # long tasks
    CONTEXT_COMPACTED = "context.compacted"
    PLAN_UPDATE = "plan.update"
    GOAL_VERDICT = "goal.verdict"
    # people
    INPUT_REQUEST = "input.request"
    HISTORY_ACTIONS = "history.actions"
    HISTORY_COMMAND = "history.command"
    REPLY_DELTA = "reply.delta"
    # the project
    PROJECT_VERIFY_BEGIN = "project.verify.begin"
    PROJECT_VERIFY_RECORD = "project.verify.record"
    PROJECT_VERIFICATION = "project.verification"
    PROJECT_PREVIEW = "project.preview"
    # sessions and commands
    SESSION_START = "session.start"
    SESSION_POLL = "session.poll"
    SESSION_STDIN = "session.stdin"
    SESSION_TERMINATE = "session.terminate"
    SESSION_LAUNCHED = "session.launched"
    SESSION_STATE = "session.state"
    COMMAND_SANDBOX = "command.sandbox"
    COMMAND_LAUNCHED = "command.launched"
    # models and MCP servers
    MODEL_READY = "model.ready"
    MODEL_FAILED = "model.failed"
    MODEL_GENERATE = "model.generate"
    MCP_READY = "mcp.ready"
    MCP_FAILED = "mcp.failed"
    MCP_CALL = "mcp.call"
    # the swarm
    SWARM_SPAWN = "swarm.spawn"
    SWARM_DELEGATE = "swarm.delegate"
    SWARM_CLAIM = "swarm.claim"
    SWARM_CONTRACT = "swarm.contract"
    # the bridge
    BRIDGE_JOBS = "bridge.jobs"
    BRIDGE_JOB_OPEN = "bridge.job_open"
    BRIDGE_JOB_ADVANCE = "bridge.job_advance"
    BRIDGE_RUN_STATUS = "bridge.run_status"
    BRIDGE_REPORT = "bridge.report"
    # the bench's probes (supervisor/probes.py)
    BENCH_SINK = "bench.sink"
    BENCH_SINK_COUNT = "bench.sink_count"
    BENCH_SINK_RESET = "bench.sink_reset"


class Code(StrEnum):
    """The error codes the supervisor answers an actor with (``RemoteError.code``)."""

    ERROR = "error"
    BAD_REQUEST = "bad-request"
    UNKNOWN_METHOD = "unknown-method"
    NOT_FOUND = "not-found"
    CONFLICT = "conflict"
    REFUSED = "refused"
    LIMIT = "limit"
    DUPLICATE = "duplicate"
    #: The ledger's disk is full: nothing was committed; the actor keeps what it holds.
    DISK_FULL = "disk-full"
    #: The ledger is away (a PostgreSQL restart): nothing was committed; ask again.
    LEDGER_UNAVAILABLE = "ledger-unavailable"
    MODEL_UNAVAILABLE = "model-unavailable"
    MODEL_TIMEOUT = "model-timeout"
    MODEL_FAILED = "model-failed"


class ProtocolError(ValueError):
    """A request whose shape is wrong, refused at the boundary; ``code`` travels as is."""

    def __init__(self, message: str, code: Code = Code.BAD_REQUEST) -> None:
        super().__init__(message)
        self.code = code


R = TypeVar("R")

#: An id the ledger keys a row by (a run's, an action's): never empty, bounded.
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
#: A count of observations the agent holds.
Count = Annotated[int, msgspec.Meta(ge=0, le=10**9)]


class Request(msgspec.Struct, Generic[R], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One method's request; ``R`` is its reply. ``METHOD`` names it on the wire;
    ``REPLY``, when set, is the record the reply is checked into as it arrives."""

    METHOD: ClassVar[Method]
    REPLY: ClassVar[type[Any] | None] = None


class Untyped(msgspec.Struct, frozen=True):
    """A method whose record is not written yet: its params, checked by its handler."""

    method: Method
    params: dict[str, Any]


# -- replies ------------------------------------------------------------------------


class Pong(msgspec.Struct, frozen=True):
    pong: bool
    actor: str


class ClaimedRun(msgspec.Struct, kw_only=True):
    """The run an agent claimed (``run.claim``): what its lane needs to drive it.
    Mutable: the supervisor's claim hooks add to it before it leaves (the MCP
    tools a run may call, supervisor/mcp/mcp_service.py)."""

    run_id: Id
    task: str
    kind: str
    provider: str
    provider_config: dict[str, Any]
    home: str
    workspace: str | None = None
    write_scopes: list[str] = msgspec.field(default_factory=lambda: ["."])
    effects_file: str | None = None
    allowed_tools: list[str] | None = None
    tool_globs: list[str] | None = None
    #: The agent's own instructions: {"text", "file"} (actors/agent_instructions.py).
    instructions: dict[str, Any] | None = None
    #: Its typed output ({"schema", "model"}): the final reply is checked against it.
    output: dict[str, Any] | None = None
    #: The ids a delegation or a spawn may name, by "tool/field": offered as enums.
    known_ids: dict[str, list[str]] = {}
    mcp_tools: list[dict[str, Any]] | None = None
    mcp_instructions: dict[str, str] = {}


class Claim(msgspec.Struct, kw_only=True):
    """``run.claim``'s reply: a run, or none (``parked``: this agent's runs that wait)."""

    run: ClaimedRun | None
    parked: int = 0


#: The reply of a step method: ``next`` when the request said ``want_next``
#: (supervisor/runs/step_piggyback.py), the method's own fields besides.
StepReply = dict[str, Any]


# -- requests -----------------------------------------------------------------------


class Ping(Request[Pong], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Is the supervisor there; ``payload`` (ignored) gives a link probe its size
    (the bench's round trips, actors/echo.py)."""

    METHOD: ClassVar[Method] = Method.PING
    payload: str = ""


class RunClaim(Request[Claim], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``run.claim``: the next queued run of the calling agent, if any."""

    METHOD: ClassVar[Method] = Method.RUN_CLAIM
    REPLY: ClassVar[type[Any] | None] = Claim


class NextStep(Request[Step], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``run.next_step``: what the run does next; ``history_have``: the observations
    the agent holds already (a provider step sends only the rest)."""

    METHOD: ClassVar[Method] = Method.RUN_NEXT_STEP
    run_id: Id
    history_have: Count = 0


class ActionBegin(Request[StepReply], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``action.begin``: may the agent start the action's effect now (``Begun``)."""

    METHOD: ClassVar[Method] = Method.ACTION_BEGIN
    action_id: Id
    run_id: Id | None = None
    want_next: bool = False
    history_have: Count = 0


class ActionResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What an action's effect came to, as the agent reports it."""

    action_id: Id
    ok: bool
    output: dict[str, Any] = {}
    summary: str = ""
    error: str | None = None
    traceback: str | None = None


class ActionFinish(ActionResult, Request[StepReply], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``action.finish``: one action's result (its fields are ``ActionResult``'s, in
    the same order on the wire), committed with its terminal move."""

    METHOD: ClassVar[Method] = Method.ACTION_FINISH
    run_id: Id | None = None
    want_next: bool = False
    history_have: Count = 0

    def result(self) -> ActionResult:
        return ActionResult(self.action_id, self.ok, self.output, self.summary, self.error, self.traceback)

    @classmethod
    def of(cls, result: ActionResult, run_id: str) -> ActionFinish:
        return cls(
            result.action_id, result.ok, result.output, result.summary, result.error, result.traceback, run_id=run_id
        )


class ActionFinishBatch(Request[StepReply], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``action.finish_batch``: a read batch's results, in plan order, in one commit."""

    METHOD: ClassVar[Method] = Method.ACTION_FINISH_BATCH
    run_id: Id
    results: list[ActionResult]
    want_next: bool = False
    history_have: Count = 0


class RunFinalize(Request[dict[str, Any]], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``run.finalize``: the plan's final reply (supervisor/runs/finalization.py)."""

    METHOD: ClassVar[Method] = Method.RUN_FINALIZE
    run_id: Id
    #: None only from a plan with no final text: refused by the handler, as before.
    reply: str | None


class RunFail(Request[dict[str, Any]], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``run.fail``: the agent cannot go on with the run (``reason``, shown to people)."""

    METHOD: ClassVar[Method] = Method.RUN_FAIL
    run_id: Id
    reason: str = "failed"


#: The typed step methods: their reply carries the next step when ``want_next``.
StepRequest = ActionBegin | ActionFinish | ActionFinishBatch

#: Every typed request; ``decode`` makes one of these (or ``Untyped``).
TypedRequest = Ping | RunClaim | NextStep | ActionBegin | ActionFinish | ActionFinishBatch | RunFinalize | RunFail

_TYPED: Final[dict[Method, type[TypedRequest]]] = {
    kind.METHOD: kind
    for kind in (Ping, RunClaim, NextStep, ActionBegin, ActionFinish, ActionFinishBatch, RunFinalize, RunFail)
}


def decode(body: dict[str, Any]) -> TypedRequest | Untyped:
    """A request body off the wire, checked once: its typed record, or ``Untyped``
    for a method whose record is not written yet. Raises ``ProtocolError``."""
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
    kind = _TYPED.get(method)
    if kind is None:
        return Untyped(method, params)
    try:
        return msgspec.convert(params, kind, strict=True)
    except msgspec.ValidationError as exc:
        # msgspec names the field: "Expected `str`, got `int` - at `$.action_id`".
        raise ProtocolError(f"{method}: {exc}") from None


def encode(request: Request[Any]) -> dict[str, Any]:
    """A typed request as the wire carries it."""
    params: dict[str, Any] = msgspec.to_builtins(request)
    return {"method": request.METHOD.value, "params": params}


def reply(kind: type[R], answer: Any) -> R:
    """A reply off the wire as its typed record (``Any`` for a map reply)."""
    return msgspec.convert(answer, kind, strict=True)

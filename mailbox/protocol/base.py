"""What every record of the protocol shares: the ``Method`` names, the ``Code``
list, the ``Request`` base and the bounded field types (mailbox/protocol/__init__.py
says how a request travels and is checked). Each family's records live in its own
module beside this one and import from here, never from the package."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Generic, TypeVar, get_args, get_origin

import msgspec


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
    PROJECT_REVISION_ADVANCE = "project.revision.advance"
    PROJECT_COMMIT_MOVED = "project.commit.moved"
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
    #: A reply whose shape is not its method's (the actor side's ``BadReply``).
    BAD_REPLY = "bad-reply"


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


class BadReply(ProtocolError):
    """A reply whose shape is not its method's, refused as it arrives (``ActorContext.ask``):
    the supervisor and its actor are the same code, so this is a bug, named here
    (the method, the field) rather than met as a ``KeyError`` deep inside the agent."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Code.BAD_REPLY)


class Ack(msgspec.Struct, frozen=True):
    """The reply of a method whose caller reads nothing of it but that it succeeded."""


class Request(msgspec.Struct, Generic[R], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One method's request; ``R`` is its reply. ``METHOD`` names it on the wire;
    ``REPLY`` is the record the reply is checked into as it arrives, read off
    ``R`` itself (``Request[Claim]``: ``Claim``), so the two cannot differ. A reply
    is a record (or a union of records: the step): a map (``dict[str, Any]``) is
    refused as the class is made."""

    METHOD: ClassVar[Method]
    REPLY: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in getattr(cls, "__orig_bases__", ()):
            if get_origin(base) is Request:
                (reply,) = get_args(base)
                if reply is dict or get_origin(reply) is dict:
                    raise TypeError(f"{cls.__name__}: a reply is a record (a msgspec.Struct), not a map")
                cls.REPLY = reply

"""Where each agent->supervisor request goes: one ``match`` on its typed record.

The request was decoded and its shape checked once, at the boundary
(mailbox/protocol/ ``decode``); each case hands the typed record to the one
handler that serves it: the run layer's (``Supervisor.runs``), or its family's
(``Supervisor.methods``, supervisor/actor_methods.py; a family this supervisor
was built without answers ``unknown-method``). A new typed request that no case
serves fails type checking here (``assert_never``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, assert_never

import msgspec

from corral.mailbox.protocol import (
    ActionBegin,
    ActionFinish,
    ActionFinishBatch,
    ActionPrepare,
    BenchSink,
    BenchSinkCount,
    BenchSinkReset,
    BridgeJobAdvance,
    BridgeJobOpen,
    BridgeJobs,
    BridgeReport,
    BridgeRunStatus,
    Code,
    CommandLaunched,
    CommandSandbox,
    ContextCompacted,
    GoalVerdict,
    HistoryActions,
    HistoryCommand,
    InputRequest,
    McpCall,
    McpFailed,
    McpReady,
    ModelFailed,
    ModelGenerate,
    ModelReady,
    NextStep,
    Ping,
    PlanCommit,
    PlanInvalid,
    Pong,
    ProjectCommitMoved,
    ProjectPreview,
    ProjectRevisionAdvance,
    ProjectVerification,
    ProjectVerifyBegin,
    ProjectVerifyRecord,
    ProviderBegin,
    ProviderFailed,
    ProviderHandoff,
    ProviderInterrupted,
    ReplyDelta,
    Request,
    RunChildResult,
    RunClaim,
    RunFail,
    RunFinalize,
    SessionLaunched,
    SessionPoll,
    SessionStart,
    SessionStateReport,
    SessionStdin,
    SessionTerminate,
    SwarmClaim,
    SwarmContract,
    SwarmDelegate,
    SwarmSpawn,
    TypedRequest,
)
from corral.supervisor.errors import SupervisorError

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree.supervision_tree import ActorSlot

F = TypeVar("F")


def _need(family: F | None, request: Request[Any]) -> F:
    """The family that serves ``request``, or ``unknown-method`` when this
    supervisor was built without it."""
    if family is None:
        raise SupervisorError(f"no actor method {request.METHOD.value!r}", code=Code.UNKNOWN_METHOD)
    return family


#: A handler's answer: its method's reply record (``Request[R]``'s ``R``); no
#: method answers a map (tests/test_typed_replies.py).
Answer = msgspec.Struct


async def dispatch(sup: Supervisor, slot: ActorSlot, request: TypedRequest) -> dict[str, Any]:
    """The answer to one decoded request as the wire carries it (committed; the
    caller waits for the barrier): a reply record encoded once, here (the actor
    checks it back into the same record, ``protocol.reply``). Bytes stay bytes
    (msgpack carries them as they are)."""
    body: dict[str, Any] = msgspec.to_builtins(await _answer(sup, slot, request), builtin_types=_AS_IS)
    return body


_AS_IS = (bytes, bytearray)


async def _answer(sup: Supervisor, slot: ActorSlot, request: TypedRequest) -> Answer:
    """The handler's answer to ``request``: one ``case`` per record."""
    runs = sup.runs
    steps = runs.steps
    methods = sup.methods
    match request:
        case Ping():
            return Pong(pong=True, actor=slot.id)
        # -- the run layer (supervisor/runs/run_actor_methods.py)
        case RunClaim():
            return await runs.claim(slot, request)
        case NextStep():
            return await runs.next_step(slot, request)
        case ProviderBegin():
            return await runs.provider_begin(slot, request)
        case ProviderHandoff():
            # With the plan it carries and the actions that plan begins: one commit
            # (supervisor/runs/step_piggyback.py).
            return await steps.handoff(slot, request)
        case ProviderFailed():
            return await runs.provider_failed(slot, request)
        case PlanCommit():
            return await steps.carry_next(slot, request, await runs.plan_commit(slot, request))
        case PlanInvalid():
            return await steps.carry_next(slot, request, await runs.plan_invalid(slot, request))
        case ActionPrepare():
            return await steps.carry_next(slot, request, await runs.action_prepare(slot, request))
        case ActionBegin():
            return await steps.carry_next(slot, request, await runs.action_begin(slot, request))
        case ActionFinish() | ActionFinishBatch():
            # With the next step's writes (a loop's advance, the next actions begun): one commit.
            return await steps.finish(slot, request)
        case RunFinalize():
            return await runs.finalize(slot, request)
        case RunFail():
            return await runs.fail(slot, request)
        case RunChildResult():
            # The run layer's method, served by the swarm (supervisor/swarm/swarm_service.py).
            return await _need(methods.swarm, request).child_result(slot, request)
        # -- long tasks (supervisor/longtask/)
        case ContextCompacted():
            compacted = await _need(methods.compaction, request).compacted(slot, request)
            return await steps.carry_next(slot, request, compacted)
        case GoalVerdict():
            return await _need(methods.goals, request).verdict(slot, request)
        # -- people (supervisor/interactive/)
        case ProviderInterrupted():
            return await _need(methods.steers, request).provider_interrupted(slot, request)
        case InputRequest():
            return await _need(methods.questions, request).ask(slot, request)
        case HistoryActions():
            return await _need(methods.own_history, request).actions(slot, request)
        case HistoryCommand():
            return await _need(methods.own_history, request).command(slot, request)
        case ReplyDelta():
            return await _need(methods.reply_stream, request).reply_delta(slot, request)
        # -- the bench's probes (supervisor/probes.py)
        case BenchSink():
            return await _need(methods.probes, request).sink(slot, request)
        case BenchSinkCount():
            return await _need(methods.probes, request).sink_count(slot, request)
        case BenchSinkReset():
            return await _need(methods.probes, request).sink_reset(slot, request)
        case ProjectVerifyBegin():
            return await _need(methods.project, request).verify_begin(slot, request)
        case ProjectVerifyRecord():
            return await _need(methods.project, request).verify_record(slot, request)
        case ProjectVerification():
            return await _need(methods.project, request).verification(slot, request)
        case ProjectPreview():
            return await _need(methods.project, request).preview(slot, request)
        case ProjectRevisionAdvance():
            return await _need(methods.project, request).revision_advance(slot, request)
        case ProjectCommitMoved():
            return await _need(methods.project, request).commit_moved(slot, request)
        case SessionStart():
            return await _need(methods.sessions, request).start(slot, request)
        case SessionPoll():
            return await _need(methods.sessions, request).poll(slot, request)
        case SessionStdin():
            return await _need(methods.sessions, request).stdin(slot, request)
        case SessionTerminate():
            return await _need(methods.sessions, request).terminate(slot, request)
        case SessionLaunched():
            return await _need(methods.sessions, request).launched(slot, request)
        case SessionStateReport():
            return await _need(methods.sessions, request).state(slot, request)
        case CommandSandbox():
            return await _need(methods.sessions, request).command_sandbox(slot, request)
        case CommandLaunched():
            return await _need(methods.sessions, request).command_launched(slot, request)
        case ModelReady():
            return await _need(methods.models, request).ready(slot, request)
        case ModelFailed():
            return await _need(methods.models, request).failed(slot, request)
        case ModelGenerate():
            return await _need(methods.models, request).generate(slot, request)
        case McpReady():
            return await _need(methods.mcp, request).ready(slot, request)
        case McpFailed():
            return await _need(methods.mcp, request).failed(slot, request)
        case McpCall():
            return await _need(methods.mcp, request).call(slot, request)
        case SwarmSpawn():
            return await _need(methods.swarm, request).spawn(slot, request)
        case SwarmDelegate():
            return await _need(methods.swarm, request).delegate(slot, request)
        case SwarmClaim():
            return await _need(methods.swarm, request).claim(slot, request)
        case SwarmContract():
            return await _need(methods.swarm, request).contract(slot, request)
        case BridgeJobs():
            return await _need(methods.bridge, request).jobs(slot, request)
        case BridgeJobOpen():
            return await _need(methods.bridge, request).job_open(slot, request)
        case BridgeJobAdvance():
            return await _need(methods.bridge, request).job_advance(slot, request)
        case BridgeRunStatus():
            return await _need(methods.bridge, request).run_status(slot, request)
        case BridgeReport():
            return await _need(methods.bridge, request).report(slot, request)
        case _:
            assert_never(request)


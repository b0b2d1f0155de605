"""The run layer's records (supervisor/runs/run_actor_methods.py serves them): a
run's claim, its steps, its actions' begin and finish, its end."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal, get_args

import msgspec

from corral.mailbox.protocol.base import Ack, Count, Id, Method, Request
from corral.mailbox.steps import ActionBegun, ProviderBegun, Step, Stepped

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
StepReply = Stepped


class HandedOff(Stepped, kw_only=True):
    """``provider.handoff``'s reply: ``refused``, why the response was not stored
    (a secret in it: seed 004 V1.43), else None."""

    refused: str | None = None


class PlanAnswer(Stepped, kw_only=True):
    """``plan.commit``'s and ``plan.invalid``'s reply: the plan as stored (redacted),
    or why it was refused (``refused``, as an invalid plan); ``repair``: the model
    is asked again (an invalid plan within the run's repairs), False: the run failed."""

    plan: dict[str, Any] | None = None
    refused: str | None = None
    repair: bool | None = None


class Prepared(Stepped, kw_only=True):
    """``action.prepare``'s reply: the action's id, its phase (``prepared``, or
    refused at once: ``denied``/``failed``) and its fingerprint."""

    action_id: str
    phase: str
    fingerprint: str


class ProviderFailure(msgspec.Struct, kw_only=True):
    """``provider.failed``'s reply: a retry is scheduled (``retry_at``), or the run failed."""

    retry: bool
    retry_at: float | None
    attempt: int


class RunFinalized(msgspec.Struct, kw_only=True):
    """``run.finalize``'s reply: ``completed``, ``invalidated`` (``reason``), or held
    (a person's input, a blocked final reply: ``reasons``)."""

    status: str
    reason: str | None = None
    reasons: list[str] | None = None


#: A provider turn's slot, as the ledger keys it (``<run>:<loop>:<n>``).
Slot = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
#: A loop of a run, or an action's place in its plan (SQLite's int64).
Index = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
#: A short name the ledger keeps as a category or a kind.
Kind = Annotated[str, msgspec.Meta(min_length=1, max_length=40)]
#: A turn's ``reasoning_effort`` (actors/providers/openai.py's, seed 004 V1.2).
ReasoningEffort = Literal["default", "low", "medium", "high"]
REASONING_EFFORTS: Final[tuple[str, ...]] = get_args(ReasoningEffort)
#: A text's sha256, in hex.
Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]


class TurnNote(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """What one provider turn was sent, for the run's transcript (actors/turn_notes.py
    makes it; supervisor/runs/transcript_store.py ``notes_from`` checks each text
    against its hash and keeps it once). A text travels only with the first turn of
    a lane that sends it; later turns name it by hash."""

    system_sha256: Sha256 | None = None
    catalog_sha256: Sha256 | None = None
    system: str | None = None
    catalog: str | None = None
    #: The run's observations the turn had seen.
    seen: Count | None = None
    reasoning_effort: ReasoningEffort | None = None
    web_search: bool | None = None


class RequestIdentity(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A provider request's stable identity (seed 004 V1.39: "请求指纹只包含实际 Provider
    请求的稳定语义"), one SHA-256 per part of what is sent (actors/request_identity.py):
    kept with a failed request's durable retry and compared, part by part, when the
    retry falls due. Digests only: never a prompt, a message or a setting's value."""

    task: Sha256
    history: Sha256
    tools: Sha256
    tool_notes: Sha256
    project_context: Sha256
    instructions: Sha256
    output_schema: Sha256
    images: Sha256
    web_search: Sha256
    provider: Sha256


class InvalidPlan(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Why a response's plan is invalid (the model may repair it, within the run's repairs)."""

    category: Kind
    detail: str = ""


# -- requests -----------------------------------------------------------------------


class Ping(Request[Pong], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Is the supervisor there; ``payload`` (ignored) gives a link probe its size
    (the bench's round trips, actors/echo.py)."""

    METHOD: ClassVar[Method] = Method.PING
    payload: str = ""


class RunClaim(Request[Claim], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``run.claim``: the next queued run of the calling agent, if any."""

    METHOD: ClassVar[Method] = Method.RUN_CLAIM


class NextStep(Request[Step], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``run.next_step``: what the run does next; ``history_have``: the observations
    the agent holds already (a provider step sends only the rest)."""

    METHOD: ClassVar[Method] = Method.RUN_NEXT_STEP
    run_id: Id
    history_have: Count = 0


class ActionBegin(Request[ActionBegun], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``action.begin``: may the agent start the action's effect now (``Begun``)."""

    METHOD: ClassVar[Method] = Method.ACTION_BEGIN
    action_id: Id
    run_id: Id | None = None
    want_next: bool = False
    history_have: Count = 0


class Receipt(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An executed action's receipt and observation as the agent built them from the
    input it ran (actors/action_receipt.py). The supervisor checks them against the
    action's record (its tool, its fingerprint) and their bounds, redacts them, and
    stores them in the transaction of the action's terminal move."""

    #: The tool the agent ran: the action's recorded tool.
    tool: Annotated[str, msgspec.Meta(max_length=200)]
    #: sha256 of the canonical {tool, input} it ran: the action's recorded fingerprint.
    fingerprint: Annotated[str, msgspec.Meta(max_length=64)]
    #: What was called, names and sizes, never contents (``input_summary``).
    call: str
    #: The input as the model's next turn is shown it, each string cut (``echo_input``).
    echo: dict[str, Any]


class ActionResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What an action's effect came to, as the agent reports it; ``receipt``: what it
    built for the record (None: the supervisor builds it from the action's record);
    ``unknown``: the tool could not tell what its effect came to (a rollback that did
    not complete), so the action goes to ``needs-reconciliation`` for a person."""

    action_id: Id
    ok: bool
    output: dict[str, Any] = {}
    summary: str = ""
    error: str | None = None
    traceback: str | None = None
    receipt: Receipt | None = None
    unknown: bool = False


class ActionFinish(ActionResult, Request[StepReply], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``action.finish``: one action's result (its fields are ``ActionResult``'s, in
    the same order on the wire), committed with its terminal move."""

    METHOD: ClassVar[Method] = Method.ACTION_FINISH
    run_id: Id | None = None
    want_next: bool = False
    history_have: Count = 0

    def result(self) -> ActionResult:
        return ActionResult(
            self.action_id,
            self.ok,
            self.output,
            self.summary,
            self.error,
            self.traceback,
            self.receipt,
            self.unknown,
        )

    @classmethod
    def of(cls, result: ActionResult, run_id: str) -> ActionFinish:
        return cls(
            result.action_id,
            result.ok,
            result.output,
            result.summary,
            result.error,
            result.traceback,
            result.receipt,
            result.unknown,
            run_id=run_id,
        )


class ActionFinishBatch(Request[StepReply], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``action.finish_batch``: a read batch's results, in plan order, in one commit."""

    METHOD: ClassVar[Method] = Method.ACTION_FINISH_BATCH
    run_id: Id
    results: list[ActionResult]
    want_next: bool = False
    history_have: Count = 0


class RunFinalize(Request[RunFinalized], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``run.finalize``: the plan's final reply (supervisor/runs/finalization.py)."""

    METHOD: ClassVar[Method] = Method.RUN_FINALIZE
    run_id: Id
    #: None only from a plan with no final text: refused by the handler, as before.
    reply: str | None


class RunFail(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``run.fail``: the agent cannot go on with the run (``reason``, shown to people)."""

    METHOD: ClassVar[Method] = Method.RUN_FAIL
    run_id: Id
    reason: str = "failed"


class ProviderBegin(Request[ProviderBegun], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``provider.begin``: a provider request's lifecycle begins (its ``slot`` in the reply)."""

    METHOD: ClassVar[Method] = Method.PROVIDER_BEGIN
    run_id: Id
    loop: Index
    #: The request about to be sent: a due retry is sent only when it is the request
    #: that failed (supervisor/runs/retry_identity.py), else it is superseded.
    identity: RequestIdentity | None = None


class ProviderHandoff(Request[HandedOff], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``provider.handoff``: the model's response, committed before anyone parses or
    acts on it; with the plan the agent parsed from it (``plan``, or why it is
    invalid: ``plan_invalid``), committed after it (supervisor/runs/step_piggyback.py)."""

    METHOD: ClassVar[Method] = Method.PROVIDER_HANDOFF
    run_id: Id
    slot: Slot
    text: str
    plan: dict[str, Any] | None = None
    plan_invalid: InvalidPlan | None = None
    notes: TurnNote | None = None
    want_next: bool = False
    history_have: Count = 0


class ProviderFailed(Request[ProviderFailure], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``provider.failed``: the turn failed (``kind``: transient ones are retried)."""

    METHOD: ClassVar[Method] = Method.PROVIDER_FAILED
    run_id: Id
    slot: Slot
    kind: Kind
    error: str = ""
    notes: TurnNote | None = None
    #: The failed request's identity, kept with its retry.
    identity: RequestIdentity | None = None


class ProviderInterrupted(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``provider.interrupted``: the agent stopped waiting for turn ``slot``, as a
    steer or a goal pause told it (supervisor/interactive/steer_control.py)."""

    METHOD: ClassVar[Method] = Method.PROVIDER_INTERRUPTED
    run_id: Id
    slot: Annotated[str, msgspec.Meta(max_length=300)]


class PlanCommit(Request[PlanAnswer], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``plan.commit``: the plan parsed from loop ``loop``'s response (a response
    handed off without one, or before a crash)."""

    METHOD: ClassVar[Method] = Method.PLAN_COMMIT
    run_id: Id
    loop: Index
    slot: Slot
    plan: dict[str, Any]
    want_next: bool = False
    history_have: Count = 0


class PlanInvalid(Request[PlanAnswer], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``plan.invalid``: loop ``loop``'s response holds no valid plan (``category``, ``detail``)."""

    METHOD: ClassVar[Method] = Method.PLAN_INVALID
    run_id: Id
    loop: Index
    slot: Slot
    category: Kind
    detail: str = ""
    want_next: bool = False
    history_have: Count = 0


class ActionPrepare(Request[Prepared], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``action.prepare``: the plan's action ``index`` of loop ``loop`` becomes a
    prepared action (or is refused, recorded, never run)."""

    METHOD: ClassVar[Method] = Method.ACTION_PREPARE
    run_id: Id
    loop: Index
    index: Index
    tool: Annotated[str, msgspec.Meta(min_length=1, max_length=80)]
    input: dict[str, Any]
    want_next: bool = False
    history_have: Count = 0


class RunChildResult(Request[Ack], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``run.child_result``: a child's or a delegation's final reply, delivered to
    its parent (supervisor/swarm/swarm_service.py)."""

    METHOD: ClassVar[Method] = Method.RUN_CHILD_RESULT
    run_id: Id
    reply: str | None = None


#: The run layer's requests (the package's ``TypedRequest`` includes them).
RunRequest = (
    Ping
    | RunClaim
    | NextStep
    | ProviderBegin
    | ProviderHandoff
    | ProviderFailed
    | ProviderInterrupted
    | PlanCommit
    | PlanInvalid
    | ActionPrepare
    | ActionBegin
    | ActionFinish
    | ActionFinishBatch
    | RunFinalize
    | RunFail
    | RunChildResult
)

"""The agent template: one lane, runs one run at a time, asks the ledger what's next.

The agent holds no state a crash could lose. For every step it asks the supervisor
(``run.next_step``, derived from committed rows), does that one thing, and reports
it back; a side effect only starts after ``action.begin`` answered ``execute``,
which the supervisor sends only once ``executing`` is on disk. The lane drives the
run and its provider turns; the actions it began are run by actors/action_runner.py.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import logging
from pathlib import Path
from typing import Any, TypeVar, assert_never

import msgspec
import trio

from corral.actors import agent_instructions, project_context, recordable, typed_output
from corral.actors.action_runner import STORAGE_FULL, ActionRunner
from corral.actors.inflight import InFlight
from corral.actors.provider_interrupts import ProviderInterrupts
from corral.actors.providers.base import (
    MAX_RESPONSE_CHARS,
    ErrorKind,
    ImagePart,
    PlanError,
    Provider,
    ProviderError,
    ProviderRequest,
    ProviderResponse,
    RepairCategory,
    ToolSchema,
    history_digest,
    searches_this_turn,
)
from corral.actors.providers.registry import make_provider
from corral.actors.request_identity import request_identity
from corral.actors.runtime import ActorContext, is_shutdown
from corral.actors.tools.base import (
    Tool,
)
from corral.actors.tools.image_inspect import attachments
from corral.actors.tools.mcp import mcp_tools
from corral.actors.tools.registry import all_tools
from corral.actors.turn_notes import TurnNotes, observations_seen
from corral.core import failpoints
from corral.core.redact import summarize
from corral.mailbox.envelope import Kind
from corral.mailbox.errors import RemoteError
from corral.mailbox.protocol import (
    ActionBegin,
    ActionPrepare,
    BadReply,
    ClaimedRun,
    ContextCompacted,
    InvalidPlan,
    NextStep,
    PlanCommit,
    PlanInvalid,
    ProviderBegin,
    ProviderFailed,
    ProviderHandoff,
    ProviderInterrupted,
    Request,
    RequestIdentity,
    RunChildResult,
    RunClaim,
    RunFail,
    RunFinalize,
    TurnNote,
)
from corral.mailbox.steps import (
    Begin,
    CompactStep,
    DoneStep,
    ExecuteStep,
    FinalizeStep,
    ParkStep,
    ParseStep,
    PrepareStep,
    ProviderStep,
    Step,
    Stepped,
)

log = logging.getLogger("corral.agent")

#: What a model is asked when its older turns are folded into a summary.
SUMMARY_TASK = (
    "Summarise the conversation so far for yourself, to continue the same task: what was done, what was"
    " found (names, numbers, paths), what is still open. Reply with the summary as your final reply."
)

#: While the supervisor's disk is full (``STORAGE_FULL``), the agent waits and asks again.
STORAGE_RETRY_S = 1.0
#: Room an envelope needs beside the values it carries (ids, token, field names).
WIRE_SLACK_BYTES = 64 * 1024
#: The broken build that runs a side effect before committing ``executing``, armed
#: only through the failpoint spec (chaos proves its checker catches it).
_EFFECT_FIRST = "agent.effect-before-executing"

#: A step method's reply (``Stepped`` or a record that extends it).
S = TypeVar("S", bound=Stepped)


async def run(ctx: ActorContext) -> int:
    wake = trio.Event()
    woken = [wake]
    inflight = InFlight(Path(ctx.config["home"]), ctx.actor_id)
    interrupts = ProviderInterrupts()

    async def listen() -> None:
        async for envelope in ctx.channel.inbox:
            if is_shutdown(envelope):
                ctx.shutdown.set()
                # An idle agent waits for work: wake it so it ends now (a busy one
                # finishes its step within the runtime's drain) instead of idling
                # out the whole drain at every graceful stop.
                woken[0].set()
                return
            if envelope.kind is Kind.TELL and envelope.body.get("op") == "wake":
                woken[0].set()
            elif envelope.kind is Kind.TELL and envelope.body.get("op") == "interrupt":
                slot = envelope.body.get("slot")
                if isinstance(slot, str):
                    interrupts.ask(slot)  # a steer or a goal pause: stop waiting for that turn
            elif envelope.kind is Kind.REQUEST:
                await ctx.channel.reply(envelope, {"agent": ctx.actor_id, "ok": True})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(listen)
        while not ctx.shutdown.is_set():
            woken[0] = trio.Event()
            try:
                answer = await ctx.ask(RunClaim())
            except RemoteError as exc:
                if exc.code != STORAGE_FULL:
                    raise
                await trio.sleep(STORAGE_RETRY_S)
                continue
            claimed = answer.run
            if claimed is None:
                if ctx.params.get("exit_when_idle") and not answer.parked:
                    break  # an isolated child ends with its run
                await woken[0].wait()
                continue
            await Lane(ctx, claimed, inflight, interrupts).drive()
        nursery.cancel_scope.cancel()
    return 0


def with_known_ids(schema: ToolSchema, known: dict[str, list[str]]) -> ToolSchema:
    """``schema`` with the string fields that name a spec id turned into enums
    (``"agent.delegate/agent_id"``: the specialists). Only what is offered changes:
    the supervisor validates against the tool's own schema."""
    mine = {where.partition("/")[2]: ids for where, ids in known.items() if where.startswith(schema.name + "/") and ids}
    if not mine:
        return schema  # most tools name no spec id: nothing to copy
    changed = copy.deepcopy(schema.input_schema)
    for path, ids in mine.items():
        node: Any = changed
        for part in path.split("/"):
            node = node.get("properties", {}).get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get("type") == "array":
                node = node.get("items")
        if isinstance(node, dict) and node.get("type") == "string":
            node["enum"] = list(ids)
    return schema if changed == schema.input_schema else dataclasses.replace(schema, input_schema=changed)


class Lane:
    """Drives one run until it ends or parks (which releases the lane)."""

    def __init__(
        self,
        ctx: ActorContext,
        run: ClaimedRun,
        inflight: InFlight | None = None,
        interrupts: ProviderInterrupts | None = None,
    ) -> None:
        self.ctx = ctx
        self.run = run
        #: The provider turns a steer or a goal pause may interrupt.
        self.interrupts = interrupts or ProviderInterrupts()
        #: Which actions run right now, for the supervisor to charge a crash to.
        self.inflight = inflight
        #: What the values of one message may take on the wire.
        self.budget = max(16 * 1024, ctx.config["max_frame"] - WIRE_SLACK_BYTES)
        self.run_id: str = run.run_id
        self.tools: dict[str, Tool] = all_tools(ctx.user_tools)
        self.tools.update(mcp_tools(run.mcp_tools))
        globs = run.tool_globs
        if globs is not None:
            # Only the agent's allow list is offered; the supervisor refuses the rest.
            self.tools = {
                name: tool for name, tool in self.tools.items() if any(fnmatch.fnmatchcase(name, g) for g in globs)
            }
        # Every remaining tool stays parseable, so a call outside the run's tool set
        # (a child spawning, say) gets a recorded, explained denial; but the model is
        # only offered what the run may use.
        self.schemas: tuple[ToolSchema, ...] = tuple(tool.schema for tool in self.tools.values())
        allowed = run.allowed_tools
        self.offered = tuple(
            with_known_ids(schema, run.known_ids)
            for schema in self.schemas
            if allowed is None or schema.name in allowed
        )
        self.provider: Provider | None = None
        #: The repository's instructions, references and skills (read from inside the
        #: workspace only, at the lane's first provider turn: a lane that only runs
        #: actions never walks the tree; re-checked by stat at every later turn).
        self.project: project_context.LiveContext | None = None
        #: The agent's own instructions (spec ``instructions``/``instructions_file``),
        #: the file re-read when it moved; ``instructions`` is what the last prompt led with.
        self.instruction_cache = agent_instructions.InstructionsCache()
        self.instructions: agent_instructions.Instructions | None = None
        #: The agent's typed output (spec ``output``): its final reply is checked against it.
        self.output = typed_output.OutputSpec.from_options(run.output)
        #: The next step, when the last step's reply carried it (no extra round trip).
        self.next: Step | None = None
        #: The run's observations as far as provider steps sent them: each turn
        #: brings only the new ones (``history_from`` says where they start).
        self.history: list[dict[str, Any]] = []
        #: What this lane told the supervisor of its turns' prompts (the transcript).
        self.notes = TurnNotes(self.offered)
        #: Runs the actions this lane began (actors/action_runner.py).
        self.actions = ActionRunner(ctx, run, self.tools, inflight, self.budget, self.step_ask, self.sees_images)

    async def fail_run(self, reason: str) -> None:
        await self.ctx.ask(RunFail(self.run_id, reason))

    async def step_ask(self, request: Request[S]) -> S:
        """A typed step whose reply also carries the next step (supervisor/runs/step_piggyback.py),
        checked as it arrives (``ctx.ask``: a malformed one is a ``BadReply``)."""
        if failpoints.armed(_EFFECT_FIRST):
            return await self.ctx.ask(request)  # the broken build keeps its own order
        answer = await self.ctx.ask(msgspec.structs.replace(request, want_next=True, history_have=len(self.history)))
        self.next = answer.next
        return answer

    def project_context(self) -> str:
        if self.project is None:
            home = Path(self.run.home) if self.run.home else None
            layout = bool(getattr(self.get_provider(), "repository_layout", True))
            self.project = project_context.LiveContext(Path(self.run.workspace or "."), home, layout)
        return self.project.prompt()

    def context_stamp(self) -> dict[str, Any]:
        """The repository context the plan was made with (the supervisor blocks its
        actions if that context changed before they run: repo_fingerprint_service.py)."""
        if not self.run.workspace:
            return {}
        if self.project is None:
            self.project_context()  # a lane that parses after a restart renders it now
        assert self.project is not None
        if self.instructions is None:
            self.instructions = self.instruction_cache.current(self.run.instructions)
        # What the last prompt was made from: the repository's context and the agent's instructions.
        return {"context": agent_instructions.fold(self.project.stamp(), self.instructions)}

    def get_provider(self) -> Provider:
        if self.provider is None:
            self.provider = make_provider(self.run.provider, self.run.provider_config)
        return self.provider

    async def take(self, step: Step) -> bool:
        """Take one step; False when it ends the lane (``done``, ``park``)."""
        match step:
            case DoneStep() | ParkStep():
                return False
            case ProviderStep():
                await self.step_provider(step)
            case ParseStep():
                await self.step_parse(step)
            case PrepareStep():
                await self.step_prepare(step)
            case ExecuteStep():
                await self.step_execute(step)
            case CompactStep():
                await self.step_compact(step)
            case FinalizeStep():
                await self.step_finalize(step)
            case _:
                assert_never(step)
        return True

    async def drive(self) -> None:
        while True:
            do = "next_step"
            try:
                step, self.next = self.next, None
                if step is None:
                    step = await self.ctx.ask(NextStep(self.run_id, len(self.history)))
                do = step.DO
                if not await self.take(step):
                    return
            except BadReply as exc:
                # The supervisor's answer is not the shape its method promises (a bug on
                # one side): this run cannot go on safely, the lane and the agent can.
                log.error("%s: %s: %s; the run fails", self.run_id, do, exc)
                await self.fail_run(recordable.text(f"protocol error: {exc}"))
                return
            except RemoteError as exc:
                if exc.code == STORAGE_FULL:
                    # Nothing was committed and the step was not taken: wait for the
                    # disk (the supervisor stays up, read-only) and ask again.
                    log.warning("%s: %s postponed: %s", self.run_id, do, exc.message)
                    await trio.sleep(STORAGE_RETRY_S)
                    continue
                # The supervisor refused a step (a fail-closed replay, say): the ledger
                # now says what happens next; ask again unless the run is gone.
                log.warning("%s: %s refused: %s", self.run_id, do, exc)
                if exc.code not in ("conflict", "refused"):
                    raise

    async def step_provider(self, step: ProviderStep) -> None:
        loop = step.loop
        try:
            provider = self.get_provider()
        except Exception as exc:
            await self.fail_run(recordable.text(f"provider cannot start: {exc}"))
            return
        try:
            context = self.project_context()
        except Exception as exc:  # every file is bounded first; whatever is left fails this run by name, not the lane
            await self.fail_run(recordable.text(
                f"the repository context cannot be built: {type(exc).__name__}: {exc}"))
            return
        try:
            self.instructions = self.instruction_cache.current(self.run.instructions)
        except agent_instructions.InstructionsError as exc:
            await self.fail_run(recordable.text(f"the agent's instructions cannot be read: {exc}"))
            return
        begun = step.begun
        history = self.provider_history(step)
        images = await self.images_for(provider, history)
        request = ProviderRequest(
            run_id=self.run_id,
            agent_id=self.ctx.actor_id,
            task=step.task,
            loop_index=loop,
            history=history,
            tools=self.offered,
            slot=begun.slot if begun is not None else "",
            tool_notes=tuple(sorted(self.run.mcp_instructions.items())),
            project_context=context,
            instructions=self.instructions.prompt if self.instructions else "",
            output_schema=self.output.schema if self.output else None,
            images=images,
            # Planning turns only: a summary (step_compact), a format repair, a turn
            # that looks at images and a parent's closing turn never search.
            web_search=searches_this_turn(getattr(provider, "web_search", False) is True, history,
                                          images=bool(images), closing=step.closing),
        )
        # Hashed only when it is needed: a begin of the agent's own, or a failure.
        identity: RequestIdentity | None = None
        if begun is None:  # else the lifecycle was begun with the last step's reply
            # Begun with what it will send: a due retry goes out only as the request
            # that failed; a changed one is superseded (the supervisor refuses this
            # begin and opens a new loop, so the next step plans afresh).
            identity = request_identity(request, self.run.provider, self.run.provider_config)
            begun = await self.ctx.ask(ProviderBegin(self.run_id, loop, identity=identity))
            request = dataclasses.replace(request, slot=begun.slot)
        # The transcript's notes of this turn (what was sent), with the handoff or the failure.
        notes = self.notes.for_turn(provider, request, observations_seen(step))
        interrupt = self.interrupts.open(begun.slot)
        try:
            with interrupt:
                response = await provider.complete(request)
        except ProviderError as exc:
            identity = identity or request_identity(request, self.run.provider, self.run.provider_config)
            await self.provider_failed(begun.slot, exc.kind.value, recordable.text(str(exc)), notes, identity)
            return
        except Exception as exc:  # a provider bug is a failed lifecycle, never a hang
            error = recordable.text(f"{type(exc).__name__}: {exc}")
            await self.provider_failed(begun.slot, ErrorKind.FATAL.value, error, notes)
            return
        finally:
            self.interrupts.close(begun.slot)
        if interrupt.cancelled_caught:
            # A steer or a pause: recorded as interrupted, never retried as an error.
            await self.ctx.ask(ProviderInterrupted(self.run_id, begun.slot))
            return
        problem = self.unsendable_response(response)
        if problem is not None:
            # Refused here, before the handoff: sent, it would crash this agent on
            # every attempt (the same request, the same answer).
            await self.provider_failed(begun.slot, ErrorKind.FATAL.value, problem, notes)
            return
        failpoints.hit("provider.before-handoff")
        text = response.text[:MAX_RESPONSE_CHARS]
        # The plan travels with the response it was parsed from (one round trip);
        # the supervisor commits the response first, then the plan.
        handoff = ProviderHandoff(self.run_id, begun.slot, text, notes=notes)
        if not failpoints.armed(_EFFECT_FIRST):
            parsed = self.parsed(provider, text)
            with_plan = msgspec.structs.replace(
                handoff,
                plan=parsed if not isinstance(parsed, InvalidPlan) else None,
                plan_invalid=parsed if isinstance(parsed, InvalidPlan) else None,
            )
            if recordable.encoded_size(msgspec.to_builtins(with_plan)) <= self.budget:
                handoff = with_plan  # else too much for one message: the plan follows in its own (step_parse)
        if recordable.encoded_size(msgspec.to_builtins(handoff)) > self.budget:
            # The texts of a lane's first turn (or a new prompt): the transcript names them only.
            handoff = msgspec.structs.replace(handoff, notes=TurnNotes.without_texts(notes))
        await self.step_ask(handoff)
        if handoff.notes is not None:
            self.notes.delivered(handoff.notes)
        failpoints.hit("provider.after-handoff")

    async def images_for(self, provider: Provider, history: tuple[dict[str, Any], ...]) -> tuple[ImagePart, ...]:
        """The images the model is to see (image.inspect's), read again from the
        workspace now: they never travel through the ledger."""
        if getattr(provider, "sees_images", False) is not True or not self.run.workspace:
            return ()
        workspace, home = Path(self.run.workspace), Path(self.run.home)
        return await trio.to_thread.run_sync(attachments, history, workspace, home, self.run_id)

    def sees_images(self) -> bool:
        try:
            return getattr(self.get_provider(), "sees_images", False) is True
        except Exception:  # a provider that cannot start sees nothing; its turn says why
            return False

    async def provider_failed(
        self, slot: str, kind: str, error: str, notes: TurnNote, identity: RequestIdentity | None = None
    ) -> None:
        """``identity``: the failed request's, kept with its durable retry (a transient failure)."""
        failed = ProviderFailed(self.run_id, slot, kind, error, notes, identity)
        if recordable.encoded_size(msgspec.to_builtins(failed)) > self.budget:
            failed = msgspec.structs.replace(failed, notes=TurnNotes.without_texts(notes))
        await self.ctx.ask(failed)
        if failed.notes is not None:
            self.notes.delivered(failed.notes)

    def provider_history(self, step: ProviderStep) -> tuple[dict[str, Any], ...]:
        """What the model sees: a shaped view (compaction) as sent, else the run's
        observations, of which the step carries only those past ``history_from``."""
        history = step.history or []
        start = step.history_from
        if start is None:
            return tuple(history)
        if start != len(self.history):
            # Cannot happen while the supervisor answers what this lane asked; refuse
            # to show the model a history with a hole in it.
            raise RuntimeError(f"history starts at {start}, this lane holds {len(self.history)}")
        self.history.extend(history)
        return tuple(self.history)

    def unsendable_response(self, response: Any) -> str | None:
        """Why a provider's response cannot be handed off (not a response, text that
        is not a string or not valid Unicode, too large for a message), or None."""
        if not isinstance(response, ProviderResponse):
            return f"the provider returned a {type(response).__name__}, not a ProviderResponse"
        text: object = response.text  # a user provider's, whatever its annotation says
        if not isinstance(text, str):
            return f"the provider's response text is a {type(text).__name__}, not a string"
        try:
            recordable.check_bounded(text[:MAX_RESPONSE_CHARS], self.budget, "the response text")
        except recordable.NotRecordable as exc:
            return f"the provider returned a response that cannot be recorded: {exc}"
        return None

    def parsed(self, provider: Provider, text: str) -> dict[str, Any] | InvalidPlan:
        """The plan, or why it is invalid: a plan that cannot be sent and recorded,
        or a ``parse`` that fails in an unforeseen way, is an invalid plan (the model
        may repair it, within the run's repairs)."""
        try:
            plan = provider.parse(ProviderResponse(text), self.schemas)
            carried = {
                "actions": [
                    {"tool": call.tool, "input": call.input, **({"reason": call.reason} if call.reason else {})}
                    for call in plan.actions
                ],
                "final": self.checked_output(plan.final_reply),
                **self.context_stamp(),
            }
            if plan.normalized:  # audited with the commit (seed 004 V1.33): kind, count, chars, SHA-256
                carried["normalized"] = [item.as_dict() for item in plan.normalized]
            if plan.plan_update is not None:  # the plan as it now stands (seed 004 V1.17): applied with the commit
                carried["plan_update"] = plan.plan_update
            recordable.check_bounded(carried, self.budget, "the plan")
        except PlanError as exc:
            return InvalidPlan(exc.category.value, exc.detail)
        except recordable.NotRecordable as exc:
            return InvalidPlan(RepairCategory.RESPONSE_SHAPE.value, str(exc))
        except Exception as exc:  # the provider's bug: an invalid plan, never a crashed agent
            detail = f"the provider's parse raised {type(exc).__name__}: {summarize(str(exc), 300)}"
            return InvalidPlan(RepairCategory.RESPONSE_SHAPE.value, detail)
        return carried

    def checked_output(self, final: str | None) -> str | None:
        """The final reply, as the typed output's JSON when the agent has one; an
        invalid output is an invalid plan naming the field (the bounded repair)."""
        if final is None or self.output is None:
            return final
        try:
            return self.output.check(final)[1]
        except typed_output.OutputInvalid as exc:
            raise PlanError(RepairCategory.RESPONSE_SHAPE, f"the output is invalid at {exc.where}: {exc.message};"
                            " answer with the whole output as one JSON object matching its schema") from None
        except typed_output.OutputSpecError as exc:
            raise PlanError(RepairCategory.RESPONSE_SHAPE, f"the output cannot be checked: {exc}") from None

    async def step_compact(self, step: CompactStep) -> None:
        """The run's older turns passed the agent's token limit: a summary of them
        (supervisor/longtask/compaction.py), recorded once per covered range. Its request
        has a provider lifecycle of its own, begun by the supervisor with this step
        (``step.slot``, supervisor/longtask/compaction_requests.py): a failure is reported
        on it (a transient one waits durably, as a planning turn's does), and a kill
        leaves it started, for the orphan rule (never sent again blindly)."""
        try:
            summary = await self.summarize(step)
        except ProviderError as exc:
            assert step.slot is not None  # only a request with a lifecycle raises
            await self.ctx.ask(ProviderFailed(self.run_id, step.slot, exc.kind.value, recordable.text(str(exc))))
            return
        failpoints.hit("context.mid-compaction")
        await self.step_ask(ContextCompacted(self.run_id, step.to_seq, summary, slot=step.slot))

    async def summarize(self, step: CompactStep) -> str:
        """The model writes it: through its provider's ``summarize`` when it has one,
        else an ordinary request whose final reply is the summary. The runtime's
        own digest stands in only when the model answered with no usable summary; a
        request that failed raises its ``ProviderError`` (a provider's bug is a fatal
        one) when it has a lifecycle to end, and a supervisor from before lifecycles
        gets the digest."""
        entries = tuple(step.entries)
        provider = self.get_provider()
        own = getattr(provider, "summarize", None)
        try:
            if own is not None:
                text = str(await own(entries))
            else:
                request = ProviderRequest(
                    run_id=self.run_id, agent_id=self.ctx.actor_id, task=SUMMARY_TASK, loop_index=step.loop,
                    history=entries, tools=(), slot=step.slot or f"{self.run_id}:compact:{step.to_seq}",
                    tool_notes=(), instructions=self.instructions.prompt if self.instructions else "",
                )
                text = provider.parse(await provider.complete(request), ()).final_reply or ""
        except PlanError as exc:
            log.warning("%s: the model wrote no summary (%s); the runtime's digest stands in", self.run_id, exc)
            text = ""
        except ProviderError as exc:
            if step.slot is not None:
                raise
            log.warning("%s: the model wrote no summary (%s); the runtime's digest stands in", self.run_id, exc)
            text = ""
        except Exception as exc:  # a provider bug fails its lifecycle, never the lane
            if step.slot is None:
                raise
            raise ProviderError(ErrorKind.FATAL, f"{type(exc).__name__}: {exc}") from None
        try:
            recordable.check(text, "the summary")
        except recordable.NotRecordable as exc:
            log.warning("%s: %s; the runtime's digest stands in", self.run_id, exc)
            text = ""
        return (text.strip() or history_digest(list(entries)))[:8000]

    async def step_parse(self, step: ParseStep) -> None:
        """A response handed off without its plan (or before a crash): parse it now."""
        loop = step.loop
        parsed = self.parsed(self.get_provider(), step.response or "")
        if isinstance(parsed, InvalidPlan):
            await self.step_ask(PlanInvalid(self.run_id, loop, step.slot, parsed.category, parsed.detail))
        else:
            await self.step_ask(PlanCommit(self.run_id, loop, step.slot, parsed))

    async def step_prepare(self, step: PrepareStep) -> None:
        prepare = ActionPrepare(self.run_id, step.loop, step.index, step.tool, step.input)
        await self.step_ask(prepare)

    async def step_execute(self, step: ExecuteStep) -> None:
        if failpoints.armed(_EFFECT_FIRST):
            await self.actions.execute_unsafely(step)
            return
        if not step.begun:  # else ``executing`` was committed with the last reply
            begun = await self.step_ask(ActionBegin(step.action_id, run_id=self.run_id))
            if begun.begin is not Begin.EXECUTE:
                return
            self.next = None
        await self.actions.run_begun(step)

    async def step_finalize(self, step: FinalizeStep) -> None:
        if self.run.kind != "root":
            await self.ctx.ask(RunChildResult(self.run_id, step.reply))
            return
        await self.ctx.ask(RunFinalize(self.run_id, step.reply))

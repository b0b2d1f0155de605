"""Running a lane's actions (actors/agent.py drives the run; this runs what it began).

The lane asks ``action.begin`` (or gets its action begun with the last step's
reply); only then, with ``executing`` durable, does the action's effect run here:
the tool called with its checked input, its outcome (with the receipt and the
observation, actors/action_receipt.py) reported in ``action.finish`` (or a read
batch's ``action.finish_batch``) and sent again until the ledger takes it.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
import trio

from corral.actors import recordable
from corral.actors.action_receipt import with_receipt
from corral.actors.inflight import InFlight
from corral.actors.runtime import ActorContext
from corral.actors.tools.base import (
    OUTCOME_UNKNOWN,
    RAISED,
    ActionParked,
    Tool,
    ToolContext,
    ToolError,
    ToolOutcome,
    checked_result,
    validate_input,
)
from corral.core import failpoints
from corral.core.redact import bounded_traceback, summarize
from corral.mailbox.errors import DeadlineExceeded, RemoteError
from corral.mailbox.protocol import (
    ActionBegin,
    ActionFinish,
    ActionFinishBatch,
    ActionResult,
    ClaimedRun,
    Code,
    Request,
)
from corral.mailbox.steps import BatchEntry, Begin, ExecuteStep, Stepped

S = TypeVar("S", bound=Stepped)

log = logging.getLogger("corral.agent")

#: The supervisor's answer while its disk is full.
STORAGE_FULL = Code.DISK_FULL
#: An outcome the ledger refused (a full disk) is kept and reported again, after
#: these delays (doubling up to the cap), until the ledger takes it.
FINISH_RETRY_BASE_S = 0.2
FINISH_RETRY_CAP_S = 10.0


class StepAsk(Protocol):
    """The lane's ``step_ask``: a step method whose reply carries the next step."""

    async def __call__(self, request: Request[S], /) -> S: ...


class ActionRunner:
    """One lane's actions: ``step_ask`` is the lane's (a reply carries its next step)."""

    def __init__(
        self,
        ctx: ActorContext,
        run: ClaimedRun,
        tools: dict[str, Tool],
        inflight: InFlight | None,
        budget: int,
        step_ask: StepAsk,
        sees_images: Callable[[], bool],
    ) -> None:
        self.ctx = ctx
        self.run = run
        self.run_id = run.run_id
        self.tools = tools
        #: Which actions run right now, for the supervisor to charge a crash to.
        self.inflight = inflight
        #: What the values of one message may take on the wire.
        self.budget = budget
        self.step_ask = step_ask
        self.sees_images = sees_images

    async def run_begun(self, step: ExecuteStep) -> None:
        """The step's action (and the batch of reads begun with it), its ``executing``
        durable: run, and each outcome reported until the ledger takes it."""
        batch = [BatchEntry(action_id=step.action_id, tool=step.tool, input=step.input), *step.batch]
        if step.parallel:
            await self.execute_parallel(batch)
            return
        results: list[ActionResult] = []
        for action in batch:  # a read batch runs in plan order; see supervisor/runs/step_piggyback.py
            failpoints.hit("agent.before-effect")
            try:
                outcome = await self.execute(action.action_id, action.tool, action.input)
            except ActionParked:
                return  # the supervisor finishes this action (an answer); the run is parked
            failpoints.hit("agent.after-effect")
            results.append(with_receipt(outcome, action.action_id, action.tool, action.input))
        await self.finish(results)

    async def finish(self, results: list[ActionResult]) -> None:
        """Report the outcomes of a batch, in one message when they fit in one."""
        if len(results) == 1:
            await self.report(ActionFinish.of(results[0], self.run_id), piggyback=True)
        elif recordable.encoded_size(msgspec.to_builtins(results)) <= self.budget:
            await self.report(ActionFinishBatch(self.run_id, results), piggyback=True)
        else:
            # Each result fits a message (checked at the tool boundary), all of them
            # together do not: one by one, in plan order, the last with the next step.
            for result in results[:-1]:
                await self.report(ActionFinish.of(result, self.run_id), piggyback=False)
            await self.report(ActionFinish.of(results[-1], self.run_id), piggyback=True)

    async def report(self, request: ActionFinish | ActionFinishBatch, *, piggyback: bool) -> None:
        """Send an outcome until the ledger takes it. The side effect happened (or
        was tried): dropping its outcome would leave the action unknown
        (``needs-reconciliation``) for want of disk space. Sending it again is
        harmless: a finish of an action already finished changes nothing."""
        delay = FINISH_RETRY_BASE_S
        while True:
            try:
                if piggyback:
                    await self.step_ask(request)
                else:
                    await self.ctx.ask(request)
                return
            except RemoteError as exc:
                if exc.code != STORAGE_FULL:
                    raise
                why = exc.message
            except DeadlineExceeded as exc:  # no answer: it may have been recorded, or not
                why = str(exc)
            log.warning("%s: %s not recorded (%s); kept, sent again in %.1f s", self.run_id, request.METHOD,
                        summarize(why, 200), delay)
            await trio.sleep(delay)
            delay = min(FINISH_RETRY_CAP_S, delay * 2)

    async def execute_parallel(self, batch: list[BatchEntry]) -> None:
        """A batch of allow-listed reads, run at once; each result is committed as
        soon as its read ends (the next step is asked for afterwards)."""

        async def one(action: BatchEntry) -> None:
            failpoints.hit("agent.before-effect")
            outcome = await self.execute(action.action_id, action.tool, action.input)
            failpoints.hit("agent.after-effect")
            result = with_receipt(outcome, action.action_id, action.tool, action.input)
            await self.report(ActionFinish.of(result, self.run_id), piggyback=False)

        async with trio.open_nursery() as nursery:
            for action in batch:
                nursery.start_soon(one, action)

    async def execute_unsafely(self, step: ExecuteStep) -> None:
        """The deliberately broken build: side effect first, ``executing`` after.
        Exists so that chaos can prove its checker fails; runs only when the broken
        build ``agent.effect-before-executing`` is armed (corral/core/failpoints.py)."""
        action_id = step.action_id
        outcome = await self.execute(action_id, step.tool, step.input)
        begun = await self.ctx.ask(ActionBegin(action_id))
        if begun.begin is Begin.EXECUTE:
            await self.ctx.ask(ActionFinish.of(outcome.result(action_id), self.run_id))

    async def execute(self, action_id: str, tool_name: str, tool_input: dict[str, Any]) -> ToolOutcome:
        tool = self.tools.get(tool_name)
        if tool is None:
            return ToolOutcome(False, {}, f"{tool_name} is not available here", f"tool {tool_name!r} is not available")
        context = ToolContext(
            agent_id=self.ctx.actor_id,
            run_id=self.run_id,
            action_id=action_id,
            workspace=Path(self.run.workspace or "."),
            write_scopes=tuple(self.run.write_scopes),
            home=Path(self.run.home),
            ask=self.ctx.ask,
            is_child=self.run.kind == "child",
            effects_file=Path(self.run.effects_file) if self.run.effects_file else None,
            idempotency_key=action_id,
            sees_images=self.sees_images(),
            deps=self.ctx.deps,
        )
        if self.inflight is not None:
            self.inflight.add(action_id)
        try:
            validate_input(tool.schema, tool_input)
            # One check for every kind of tool (built-in, user, MCP): what the tool
            # returned can be sent and recorded, or the action fails saying why.
            result = checked_result(tool.schema.name, await tool.run(context, tool_input), self.budget)
        except ToolError as exc:
            message = recordable.text(str(exc))  # a user's exception text may not be valid Unicode
            if exc.code == RAISED:  # a crash is a crash: "raised", never a refusal's word
                trace = recordable.text(exc.traceback) if exc.traceback else None
                return ToolOutcome(False, {"error": message, "code": RAISED}, summarize(message, 120), message, trace)
            if exc.code == OUTCOME_UNKNOWN:  # for a person to reconcile, never ok or failed
                return ToolOutcome(False, {"error": message, "code": OUTCOME_UNKNOWN},
                                   f"outcome unknown: {summarize(message, 120)}", message, unknown=True)
            return ToolOutcome(
                False, {"error": message, "code": exc.code}, f"refused: {summarize(message, 120)}", message
            )
        except RemoteError as exc:
            if exc.code == OUTCOME_UNKNOWN:  # the supervisor cannot let it take effect, nor say it failed
                return ToolOutcome(False, {"error": exc.message, "code": OUTCOME_UNKNOWN},
                                   f"outcome unknown: {summarize(exc.message, 120)}", exc.message, unknown=True)
            return ToolOutcome(
                False, {"error": exc.message, "code": exc.code}, f"refused: {summarize(exc.message, 120)}", exc.message
            )
        except OSError as exc:
            reason = recordable.text(exc.strerror or str(exc))
            return ToolOutcome(False, {"error": reason}, f"failed: {reason}", reason)
        except ActionParked:
            raise
        except Exception as exc:  # a tool's bug is a failed action, never a crashed agent
            message = recordable.text(f"{tool_name} raised {type(exc).__name__}: {summarize(str(exc), 300)}")
            trace = recordable.text(bounded_traceback("".join(traceback.format_exception(exc))))
            return ToolOutcome(False, {"error": message, "code": RAISED}, summarize(message, 120), message, trace)
        finally:
            if self.inflight is not None:
                self.inflight.remove(action_id)
        return ToolOutcome(result.ok, result.output, result.summary, None if result.ok else result.summary)

"""Fewer round trips per action: a step's reply carries the run's next step, and
a step's params may carry the step that follows it.

An agent used to ask ``run.next_step`` after every step, and ``action.begin`` and
``provider.begin`` before the effect and the request: about twelve round trips
per loop of one action. With ``want_next`` in a step's params, the reply holds
``next``: the step the agent would have asked for, computed after the step's own
commit. When that next step is an action to execute, ``executing`` is committed
here first (``begun``: the agent starts the effect without asking again); when it
is a provider turn, the request lifecycle is begun here. Every reply still leaves
only after the group commit made it durable, so no effect starts before its
``executing`` record is on disk: the same order.

Three more cuts, each through the same methods and checks as the long way:

- The next action of a plan is prepared here (``action.prepare``).
- **Read batches.** When the action to run is a read (``effect_class == "read"``:
  no side effect, recovery may run it again) and the actions after it in the plan
  are reads the policy auto-approves, they are prepared and begun together and go
  to the agent as one ``batch``; the agent runs them in order and reports them in
  one ``action.finish_batch``. Each keeps its own identity and lifecycle. A kill
  mid-batch leaves them ``executing`` and rerunnable: recovery runs them again,
  exactly as it would one at a time. When every read of the batch is on the
  agent's ``parallel_reads`` allow list, they run at once instead (``parallel``),
  each reported by its own ``action.finish`` as it ends, so a kill re-runs only
  the reads whose result was not committed yet.
- **Handoff with its plan.** The agent parses the provider's response itself and
  sends the plan (or the parse failure) with ``provider.handoff``; the handoff
  commits first, then the plan through ``plan.commit`` (or ``plan.invalid``). A
  crash between the two leaves a response to parse, as before.

So a loop of three reads costs two round trips: the handoff (its reply carries the
batch, begun) and the batch's results (whose reply carries the next provider turn).

**One commit per message** (``handoff``, ``finish``): the step the agent reports and
the writes of the next step its reply carries are one transaction: the response,
its plan and the actions that plan begins; the results and the loop's advance.
Only what may wait (a provider turn, shaped by compaction, then begun) is decided
after that commit. When deciding the next step fails, the step is committed
alone, as when they were two transactions, and the next step is asked again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar, assert_never

from corral.mailbox.protocol import (
    ActionFinish,
    ActionFinishBatch,
    ActionPrepare,
    HandedOff,
    NextStep,
    PlanCommit,
    PlanInvalid,
    ProviderHandoff,
    StepRequest,
)
from corral.mailbox.steps import (
    BatchEntry,
    Begin,
    ExecuteStep,
    ParseStep,
    PrepareStep,
    ProviderBegun,
    ProviderStep,
    Step,
    Stepped,
)
from corral.supervisor.errors import SupervisorError
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import action_store, provider_store
from corral.supervisor.runs.next_step import next_step
from corral.supervisor.runs.run_store import run_options

if TYPE_CHECKING:
    from corral.supervisor.runs.run_service import RunService
    from corral.supervisor.tree.supervision_tree import ActorSlot

A = TypeVar("A", bound=Stepped)


@dataclass(frozen=True, slots=True)
class _Decided:
    """The next step, decided inside the transaction of the step before it: final,
    or a provider turn still to shape and begin (``shape``); None: to be asked again
    after the commit (preparing or beginning changed what comes next)."""

    step: Step | None
    shape: bool = False


class _FollowFailed(Exception):
    """What follows a step in its transaction failed (and rolled the step back)."""


def _nothing() -> bool:
    return False


class StepPiggyback:
    """The next step carried in a step method's reply, through ``runs``' own methods."""

    def __init__(self, ledger: Ledger, runs: RunService) -> None:
        self.ledger = ledger
        self.runs = runs

    async def carry_next(
        self,
        slot: ActorSlot,
        request: StepRequest,
        answer: A,
        *,
        boundary: bool = True,
        decided: _Decided | None = None,
    ) -> A:
        """A step method's reply (supervisor/actor_dispatch.py calls the method, then
        this), with the next step when the agent asked for it (``want_next``): the
        run layer's step methods and compaction's ``context.compacted``.
        ``boundary=False``: the boundary's checks just ran in this same step
        (``commit_carried_plan``). ``decided``: the next step as ``_in_one_commit``
        decided it in the step's own transaction."""
        if request.want_next and request.run_id is not None:
            answer.next = await self.next_step_begun(
                slot, request.run_id, request.history_have, boundary=boundary, decided=decided
            )
        return answer

    async def handoff(self, slot: ActorSlot, request: ProviderHandoff) -> HandedOff:
        """``provider.handoff`` with the plan it carries (``commit_carried_plan``) and
        the next step: one commit."""
        return await self._in_one_commit(
            slot,
            request,
            lambda: self.runs.provider_handoff_now(slot, request),
            lambda: self.commit_carried_plan(slot, request),
        )

    async def finish(self, slot: ActorSlot, request: ActionFinish | ActionFinishBatch) -> Stepped:
        """``action.finish`` or ``action.finish_batch`` with the next step: one commit."""
        own: Callable[[], Stepped]
        match request:
            case ActionFinishBatch():
                own = partial(self.runs.action_finish_batch_now, slot, request)
            case ActionFinish():
                own = partial(self.runs.action_finish_now, slot, request)
            case _:
                assert_never(request)
        return await self._in_one_commit(slot, request, own)

    async def _in_one_commit(
        self, slot: ActorSlot, request: StepRequest, own: Callable[[], A], then: Callable[[], bool] = _nothing
    ) -> A:
        """``own`` (the step's synchronous work), ``then`` (what the same message
        carries after it; True: it ran the boundary's checks) and the next step's
        writes (``_decide_now``) in one transaction: one commit where there were
        up to three (a durable read action's statements and Python calls go with
        each). A failure after ``own`` rolls all of it back: ``own`` then commits
        alone and the rest runs as when each was its own transaction (its error,
        if it comes again, is the reply, as it was)."""
        try:
            with self.ledger.tx():
                answer = own()
                try:
                    boundary = not then()
                    decided = self._decide_now(slot, request, boundary=boundary)
                except Exception as exc:
                    raise _FollowFailed from exc
        except _FollowFailed:
            answer = own()
            boundary = not then()
            decided = None
        return await self.carry_next(slot, request, answer, boundary=boundary, decided=decided)

    def _decide_now(self, slot: ActorSlot, request: StepRequest, *, boundary: bool) -> _Decided | None:
        """The next step, with its writes, inside the caller's transaction: an action
        to run prepared and begun (as ``next_step_begun``); a provider turn only
        decided (its shaping may wait, so it is shaped and begun after the commit).
        None: the agent did not ask for it."""
        if not request.want_next or request.run_id is None:
            return None
        run_id = request.run_id
        step = self.runs.next_step_now(slot, NextStep(run_id, request.history_have), boundary=boundary)
        if isinstance(step, ProviderStep):
            return _Decided(step, shape=True)
        if not isinstance(step, PrepareStep | ExecuteStep):
            return _Decided(step)
        return _Decided(self._prepare_and_begin(slot, run_id, step))

    def commit_carried_plan(self, slot: ActorSlot, handoff: ProviderHandoff) -> bool:
        """The plan the agent parsed from the response it just handed off: committed
        through ``plan.commit`` / ``plan.invalid`` once the ledger says that response
        is the one to parse (else the agent is told the step the ledger wants).
        Synchronous, so that no other task runs between the boundary's checks and the
        commit. True when it committed (the boundary's checks ran and found nothing
        to stop at: ``next_step`` returns ``parse`` only past them): the next step
        then need not run them again (a third of the boundary queries of a loop)."""
        if handoff.plan is None and handoff.plan_invalid is None:
            return False
        run_id = handoff.run_id
        step = next_step(self.ledger, run_id, self.runs.features)
        if not isinstance(step, ParseStep) or step.slot != handoff.slot:
            return False
        loop, slot_name = step.loop, step.slot
        if handoff.plan is not None:
            self.runs.plan_commit_now(slot, PlanCommit(run_id, loop, slot_name, handoff.plan))
            return True
        assert handoff.plan_invalid is not None
        invalid = handoff.plan_invalid
        self.runs.plan_invalid_now(slot, PlanInvalid(run_id, loop, slot_name, invalid.category, invalid.detail))
        return True

    async def next_step_begun(
        self,
        slot: ActorSlot,
        run_id: str,
        history_have: int = 0,
        *,
        boundary: bool = True,
        decided: _Decided | None = None,
    ) -> Step:
        """The run's next step, begun when it may be (``boundary``: as next_step.py's).
        ``decided``: decided already, in the transaction of the step before it."""
        runs = self.runs
        asked = NextStep(run_id, history_have)
        if decided is not None:
            if decided.step is None:
                return await runs.next_step(slot, asked)  # as below: preparing changed what comes next
            if not decided.shape:
                return decided.step
            step = await runs.shape_step(asked, decided.step)
        else:
            step = await runs.next_step(slot, asked, boundary=boundary)
        if isinstance(step, ProviderStep):
            lifecycle = provider_store.begin_unless_retry(self.ledger, run_id, step.loop, runs.features)
            if lifecycle is not None:  # None: a due retry, begun by the agent with what it sends
                step.begun = ProviderBegun(slot=lifecycle["slot"], attempt=lifecycle["attempt"])
            return step
        if not isinstance(step, PrepareStep | ExecuteStep):
            return step
        with self.ledger.tx():
            # The action, and the reads that follow it in the plan: prepared and begun
            # in one commit (the reply leaves only once it is durable).
            begun = self._prepare_and_begin(slot, run_id, step)
        return begun if begun is not None else await runs.next_step(slot, asked)

    def _prepare_and_begin(
        self, slot: ActorSlot, run_id: str, step: PrepareStep | ExecuteStep
    ) -> PrepareStep | ExecuteStep | None:
        """The step with its action prepared (when it was to be) and begun (when recovery
        may run it again); None when that changed what the ledger says comes next (a
        refusal, a denial, a wait for approval)."""
        # The run's row, read (and its owner checked) once for every action the
        # batch prepares: none of them changes it.
        run = self.runs.run_of(slot, run_id)
        if isinstance(step, PrepareStep):
            # The next action of a committed plan: prepared here, through the same
            # method (and checks) as when the agent asks, one round trip fewer.
            row = self._prepare(slot, run, step)
            if row is None:
                return step  # the agent asks itself and gets the refusal as the answer to its own step
            if row["phase"] != "prepared":
                return None
            # What the ledger would now say: execute it, on the raw input just prepared.
            step = ExecuteStep(action_id=row["action_id"], tool=step.tool, input=step.input, phase="prepared")
        else:
            row = self.ledger.one("SELECT * FROM actions WHERE action_id = ?", step.action_id)
        # Only an action recovery may run again is begun for the agent: if the agent died
        # before it read the reply, the action is simply run again. An external one is
        # begun by the agent itself (``action.begin``), as it is about to act, so a dead
        # agent never leaves an ``executing`` record nobody acted on.
        if row is None or not row["rerunnable"] or step.phase not in ("prepared", "approved"):
            return step
        begun = action_store.begin_action(self.ledger, step.action_id, self.runs.features, current=row)
        if begun["begin"] is not Begin.EXECUTE:
            return None  # denied, or parked for approval
        step.begun = True
        if self.runs.is_read(step.tool):
            following = self._begin_following_reads(slot, run, row)
            if following:
                step.batch = following
                allowed = set(run_options(run).get("parallel_reads") or ())
                # Every read of the batch on the agent's strict allow list: they
                # run at once, each reported as it ends (a kill re-runs only the rest).
                step.parallel = {step.tool, *(entry.tool for entry in following)} <= allowed
        return step

    def _prepare(self, slot: ActorSlot, run: Any, step: PrepareStep) -> Any:
        """The action prepared, to be begun in this same transaction when it may be
        (``begins_now``: then it has no ``action-prepared`` event; see prepare_checked)."""
        try:
            asked = ActionPrepare(run["run_id"], step.loop, step.index, step.tool, step.input)
            return self.runs.prepare_call(slot, asked, begins_now=True, run=run)
        except SupervisorError:
            return None

    def _begin_following_reads(self, slot: ActorSlot, run: Any, row: Any) -> list[BatchEntry]:
        """The reads that follow action ``row`` in its plan, prepared and begun, in order,
        up to the first action that is not a read the policy auto-approves (that one
        and the rest go the ordinary way, after the batch)."""
        runs = self.runs
        loop, index = int(row["loop_index"]), int(row["action_index"]) + 1
        batch: list[BatchEntry] = []
        while True:
            call = runs.planned_call(run["run_id"], loop, index)
            if call is None or not runs.is_read(call.tool):
                return batch
            action = self._prepare(slot, run, call)
            if action is None or action["phase"] != "prepared":
                return batch
            if action["policy"] != "auto" or not action["rerunnable"]:
                return batch
            begun = action_store.begin_action(self.ledger, action["action_id"], runs.features, current=action)
            if begun["begin"] is not Begin.EXECUTE:
                return batch
            batch.append(BatchEntry(action_id=action["action_id"], tool=call.tool, input=call.input))
            index += 1

"""The run layer's actor methods: what an agent calls to claim a run, learn its
next step, hand off a provider response, commit a plan, and prepare, begin and
finish actions, then finalize or fail its run.

Each checks that the run belongs to the calling agent, then moves the ledger
through the stores (run_store.py, provider_store.py, loop_plan_store.py,
action_store.py); the next step is read off the ledger (next_step.py).
"""

from __future__ import annotations

import json
from functools import cached_property, partial
from typing import Any

from corral.actors.providers.base import MAX_ACTIONS_PER_PLAN, MAX_RESPONSE_CHARS, RepairCategory
from corral.actors.tools.registry import rerunnable
from corral.actors.tools.validation import validation_error
from corral.core import failpoints
from corral.core.redact import redact, redact_text, summarize
from corral.mailbox.protocol import (
    Ack,
    ActionBegin,
    ActionBegun,
    ActionFinish,
    ActionFinishBatch,
    ActionPrepare,
    ActionResult,
    Claim,
    ClaimedRun,
    HandedOff,
    NextStep,
    PlanAnswer,
    PlanCommit,
    PlanInvalid,
    Prepared,
    ProviderBegin,
    ProviderBegun,
    ProviderFailed,
    ProviderFailure,
    ProviderHandoff,
    RunClaim,
    RunFail,
    RunFinalize,
    RunFinalized,
    Stepped,
)
from corral.mailbox.steps import DoneStep, PrepareStep, ProviderStep, Step
from corral.supervisor.errors import BadRequest, NotFound
from corral.supervisor.runs import (
    action_store,
    child_scope,
    finalization,
    loop_plan_store,
    provider_store,
    response_secrets,
    run_store,
    sealed_input,
)
from corral.supervisor.runs.action_state import ActionPhase, action_id, canonical_json
from corral.supervisor.runs.next_step import next_step
from corral.supervisor.runs.receipt_check import check_receipt
from corral.supervisor.runs.response_secrets import Handling
from corral.supervisor.runs.run_core import POLICY_STRICTNESS, RunCore
from corral.supervisor.runs.run_feature import ClaimRefused, PlanRefusal
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.runs.transcript_store import notes_from
from corral.supervisor.tree.supervision_tree import ActorSlot


class RunActorMethods(RunCore):
    @cached_property
    def config_traces(self) -> tuple[str, ...]:
        """The runtime's configuration a provider's response must not name (V1.43)."""
        return response_secrets.config_traces(str(self.home))

    async def claim(self, slot: ActorSlot, request: RunClaim) -> Claim:
        agent_id = slot.spec.params.get("agent_id", slot.id)
        run = run_store.claim_run(self.ledger, agent_id, self.features)
        if run is None:
            # Parked runs (waiting for a person, a join, a retry) still belong to this
            # agent: an isolated child must stay up for them, not exit as idle.
            parked = self.ledger.one(
                "SELECT COUNT(*) FROM runs WHERE agent_id = ? AND status NOT IN ('completed', 'failed', 'cancelled')",
                agent_id,
            )
            return Claim(run=None, parked=int(parked[0]) if parked else 0)
        options = json.loads(run["options"])
        try:
            provider_config = self._provider_config(run, options)
        except sealed_input.SealedInputError as exc:
            run_store.set_run_status(
                self.ledger, run["run_id"], RunStatus.FAILED, self.features, f"cannot start: {exc}"
            )
            return Claim(run=None)
        claimed = ClaimedRun(
            run_id=run["run_id"],
            task=run["task"],
            kind=run["kind"],
            provider=run["provider"],
            provider_config=provider_config,
            workspace=options.get("workspace"),
            write_scopes=options.get("write_scopes", ["."]),
            effects_file=options.get("effects_file"),
            home=str(self.home),
            allowed_tools=options.get("allowed_tools"),
            tool_globs=options.get("tool_globs"),
            instructions=options.get("instructions"),
            output=options.get("output"),
            known_ids={
                "agent.delegate/agent_id": [a.id for a in self.spec.agents if a.role == "specialist"],
                "agent.spawn_isolated/children/template": [t.id for t in self.spec.templates],
            },
        )
        try:
            for hook in self.features.claim_hooks:
                await hook(claimed)  # e.g. the MCP tools this run may call
        except ClaimRefused as exc:
            run_store.set_run_status(
                self.ledger, run["run_id"], RunStatus.FAILED, self.features, f"cannot plan: {exc}"
            )
            return Claim(run=None)
        return Claim(run=claimed)

    async def next_step(self, slot: ActorSlot, request: NextStep, *, boundary: bool = True) -> Step:
        """``boundary=False``: the step boundary's checks ran already in this same
        step, with nothing else run since (supervisor/runs/step_piggyback.py)."""
        return await self.shape_step(request, self.next_step_now(slot, request, boundary=boundary))

    def next_step_now(self, slot: ActorSlot, request: NextStep, *, boundary: bool = True) -> Step:
        """The next step as far as it is decided without waiting, so that a step
        method may take it in its own transaction (step_piggyback.py): a provider
        turn is left to ``shape_step``, every other step is final."""
        run_id = request.run_id
        self.check_owner(slot, run_id)
        step = next_step(self.ledger, run_id, self.features, boundary=boundary)
        return step if isinstance(step, ProviderStep) else self._with_raw_or_failed(run_id, step)

    async def shape_step(self, request: NextStep, step: Step) -> Step:
        """A provider turn from ``next_step_now``, shaped by the features (which may
        wait: compaction's view, or compact first) and given the history the agent
        lacks; any other step as it is."""
        if not isinstance(step, ProviderStep):
            return step
        run_id = request.run_id
        step.task = run_store.get_run(self.ledger, run_id)["task"]
        shaped: Step = step
        for shape in self.features.provider_shapers:
            if isinstance(shaped, ProviderStep):
                shaped = await shape(run_id, shaped)  # e.g. compaction: its view, or compact first
        if isinstance(shaped, ProviderStep) and shaped.history is None:
            # No hook shaped it: all of it, of which the agent already holds the
            # first ``history_have`` (it keeps what earlier turns sent, so a long
            # run does not resend and re-decode its whole history every turn).
            have = request.history_have
            shaped.history = run_store.history(self.ledger, run_id, after=have)
            shaped.history_from = have
        return self._with_raw_or_failed(run_id, shaped)

    def _with_raw_or_failed(self, run_id: str, step: Step) -> Step:
        try:
            self._with_raw_copies(run_id, step)
        except sealed_input.SealedInputError as exc:
            # Acting on the redacted copy would corrupt what the tool writes: fail closed.
            run_store.set_run_status(self.ledger, run_id, RunStatus.FAILED, self.features, f"cannot continue: {exc}")
            return DoneStep(status=RunStatus.FAILED.value)
        return step

    async def provider_begin(self, slot: ActorSlot, request: ProviderBegin) -> ProviderBegun:
        run = self.run_of(slot, request.run_id)
        return ProviderBegun(**provider_store.begin_provider_request(self.ledger, run["run_id"], request.loop,
                                                                     self.features, request.identity))

    async def provider_handoff(self, slot: ActorSlot, request: ProviderHandoff) -> HandedOff:
        return self.provider_handoff_now(slot, request)

    def provider_handoff_now(self, slot: ActorSlot, request: ProviderHandoff) -> HandedOff:
        """``provider.handoff``, synchronous (step_piggyback.py commits it with the
        plan it carries and the actions that plan begins)."""
        run = self.run_of(slot, request.run_id)
        slot_name = request.slot
        notes = notes_from(request.notes, slot_name)  # what the turn was sent, for its transcript
        text = response_secrets.without_thinking(request.text[:MAX_RESPONSE_CHARS])
        shown = redact_text(text)
        verdict = response_secrets.handoff_verdict(text, shown, request.plan, self.config_traces)
        if verdict.handling is Handling.REFUSE:
            # Before anything of it is stored, raw or redacted (seed 004 V1.43); the
            # carried plan is not committed (the request is no longer one to parse).
            provider_store.secret_refused(self.ledger, run["run_id"], slot_name, verdict.reason(), self.features)
            return HandedOff(refused=verdict.reason())
        raw_sha = None
        if verdict.handling is Handling.STORE:
            raw_sha = self.keep_raw(run["run_id"], "response", slot_name, text, shown)
        elif verdict.handling is Handling.FILTER:
            text = response_secrets.filter_reply(text, response_secrets.project_roots(run))
        provider_store.provider_handoff(self.ledger, run["run_id"], slot_name, text, raw_sha256=raw_sha, notes=notes)
        return HandedOff()

    async def provider_failed(self, slot: ActorSlot, request: ProviderFailed) -> ProviderFailure:
        run = self.run_of(slot, request.run_id)
        result = provider_store.provider_failed(
            self.ledger,
            run["run_id"],
            request.slot,
            request.kind,
            request.error[:1000],
            self.limits_for(run),
            self.features,
            notes_from(request.notes, request.slot),
            request.identity,
        )
        self._retry_schedule_changed()
        return ProviderFailure(**result)

    async def plan_commit(self, slot: ActorSlot, request: PlanCommit) -> PlanAnswer:
        return self.plan_commit_now(slot, request)

    def plan_commit_now(self, slot: ActorSlot, request: PlanCommit) -> PlanAnswer:
        """``plan.commit``, synchronous (the handoff commits the plan it carries
        through it, with no other task run in between)."""
        run = self.run_of(slot, request.run_id)
        plan, loop, slot_name = request.plan, request.loop, request.slot
        withheld = raw_sha = shown = None
        # Read once: the guards below commit no plan (they refuse one, or let it be).
        fresh = loop_plan_store.get_plan(self.ledger, run["run_id"], loop) is None
        if fresh:
            for guard in self.features.plan_guards:
                why = guard(run, loop, plan)  # e.g. the collaboration policy's first wave
                if why:
                    category, why, rule = (
                        (why.category, why.reason, why.rule) if isinstance(why, PlanRefusal)
                        else ("batch-constraint", why, "collaboration-policy"))
                    refused = loop_plan_store.plan_invalid(self.ledger, run["run_id"], loop, slot_name,
                                                           category, why, self.limits_for(run), self.features,
                                                           rule=rule)
                    return PlanAnswer(refused=why, repair=refused["repair"])
        if fresh:  # a replay must not spool again
            plan, sealed = sealed_input.seal_plan(self.spool, run["run_id"], loop, plan, self.tools)
            withheld = sealed_input.WITHHELD_RESPONSE if sealed else None
            shown = redact(plan)  # what the ledger keeps, computed once
            verdict = response_secrets.plan_verdict(canonical_json(plan), plan, shown != plan, self.config_traces)
            if verdict.handling is Handling.REFUSE:
                provider_store.secret_refused(self.ledger, run["run_id"], slot_name, verdict.reason(), self.features)
                sealed_input.drop(self.spool, sealed_input.raw_name(run["run_id"], "response", slot_name))
                for index in range(len(plan.get("actions") or ())):  # its sealed inputs, if any
                    sealed_input.discard(self.spool, run["run_id"], action_id(run["run_id"], loop, index))
                return PlanAnswer(refused=verdict.reason())
            if verdict.handling is Handling.STORE:
                raw_sha = self.keep_raw(run["run_id"], "plan", str(loop), plan, shown)
            elif verdict.handling is Handling.FILTER:
                # The reply and the response it came from (if the handoff could not
                # know it was a reply: the plan followed on its own) are filtered.
                roots = response_secrets.project_roots(run)
                shown = response_secrets.filter_reply_plan(plan, roots)
                response = provider_store.stored_response(self.ledger, run["run_id"], slot_name)
                if withheld is None and response is not None:
                    withheld = response_secrets.filter_reply(response, roots)
            for hook in self.features.plan_committing:  # the model's plan update, beside its actions
                refusal = hook(self.ledger, run["run_id"], loop, shown)
                if refusal is not None:
                    refused = loop_plan_store.plan_invalid(self.ledger, run["run_id"], loop, slot_name,
                                                           refusal.category, refusal.reason, self.limits_for(run),
                                                           self.features, rule=refusal.rule)
                    sealed_input.drop(self.spool, sealed_input.raw_name(run["run_id"], "response", slot_name))
                    for index in range(len(plan.get("actions") or ())):  # its sealed inputs, if any
                        sealed_input.discard(self.spool, run["run_id"], action_id(run["run_id"], loop, index))
                    return PlanAnswer(refused=refusal.reason, repair=refused["repair"])
        stored = loop_plan_store.commit_plan(
            self.ledger, run["run_id"], loop, slot_name, plan, withhold_response=withheld, raw_sha256=raw_sha,
            shown=shown,
        )
        # The plan is durable: the raw response (which may hold sealed input) is not needed.
        sealed_input.drop(self.spool, sealed_input.raw_name(run["run_id"], "response", slot_name))
        return PlanAnswer(plan=stored)

    async def plan_invalid(self, slot: ActorSlot, request: PlanInvalid) -> PlanAnswer:
        return self.plan_invalid_now(slot, request)

    def plan_invalid_now(self, slot: ActorSlot, request: PlanInvalid) -> PlanAnswer:
        """``plan.invalid``, synchronous (as ``plan_commit_now``)."""
        run = self.run_of(slot, request.run_id)
        try:  # one of seed 004's eight (an older agent's names map onto them)
            category = RepairCategory(request.category).value
        except ValueError:
            raise BadRequest(f"category must be one of {', '.join(RepairCategory)}") from None
        answer = loop_plan_store.plan_invalid(
            self.ledger,
            run["run_id"],
            request.loop,
            request.slot,
            category,
            request.detail[:1000],
            self.limits_for(run),
            self.features,
        )
        return PlanAnswer(repair=answer["repair"])

    async def action_prepare(self, slot: ActorSlot, request: ActionPrepare) -> Prepared:
        row = self.prepare_call(slot, request)
        return Prepared(action_id=row["action_id"], phase=row["phase"], fingerprint=row["fingerprint"])

    def prepare_call(
        self, slot: ActorSlot, request: ActionPrepare, *, begins_now: bool = False, run: Any = None
    ) -> Any:
        """``action.prepare``, synchronous (the next step prepares through it inside
        its own transaction): the first of the ``prepare_routes`` that takes the tool
        (an MCP server's), else corral's tool registry. Returns the action's row.
        ``begins_now``: see ``prepare_checked``. ``run``: the run's row, which the
        caller read through ``run_of`` in this same synchronous step (a read
        batch prepares several actions of one run)."""
        for route in self.features.prepare_routes:  # an MCP server's tool, say
            row = route(slot, request)
            if row is not None:
                return row
        if run is None or run["run_id"] != request.run_id:
            run = self.run_of(slot, request.run_id)
        tool_name, tool_input = request.tool, request.input
        tool = self.tools.get(tool_name)
        if tool is None:
            raise BadRequest(f"unknown tool {tool_name!r}")
        # A tool outside the run's bound (a child may not spawn or delegate) is ``deny``:
        # refused, recorded, never run (policy_for; an MCP route prepares through it too).
        policy = self.policy_for(run, tool_name)
        problem = validation_error(tool_name, tool.schema.input_schema, tool_input, sealed=tool.schema.sealed)
        return self.prepare_checked(
            run, request.loop, request.index, tool_name, tool_input, rerunnable=rerunnable(tool), policy=policy,
            problem=problem, begins_now=begins_now,
        )

    def prepare_checked(
        self,
        run: Any,
        loop: int,
        index: int,
        tool_name: str,
        tool_input: dict[str, Any],
        *,
        rerunnable: bool,
        policy: str,
        problem: str | None,
        begins_now: bool = False,
    ) -> Any:
        """The one way every tool (built-in, user, MCP) becomes a prepared action: the
        raw input kept privately, then refused at once when the agent may not use the
        tool or the arguments are invalid (never executing, so never run; the model
        sees why in the observation). ``begins_now``: the caller begins the action in
        this same transaction when ``begin_action`` will run it (recovery may run it
        again, its policy is ``auto``); such an action is never seen prepared, so it
        gets no ``action-prepared`` event, only its ``action-executing`` one (events
        per durable read action: 5.3 before, 4.3 after)."""
        blocked = None
        the_id = action_id(run["run_id"], loop, index)
        for guard in self.features.action_guards:
            # The user's intent contract (supervisor/intent/intent_service.py): stricter only.
            verdict, why = guard(run, the_id, tool_name, tool_input)
            if verdict == "ask":
                policy = max(policy, "confirm", key=POLICY_STRICTNESS.index)
            elif verdict == "block":
                blocked = why
        shown = redact(tool_input)  # what the ledger keeps, computed once
        allowed = self.tool_allowed(run, tool_name)
        out_of_scope = None
        if run["kind"] == "child" and blocked is None and allowed and problem is None and policy != "deny":
            # Before its policy may ask a person, on the raw input (seed 004 V1.34); an
            # action refused for its own reason keeps that reason.
            out_of_scope = child_scope.plan_refusal(self.ledger, run, loop, index, tool_name, tool_input)
        refused = blocked is not None or not allowed or problem is not None or out_of_scope is not None
        quiet = begins_now and rerunnable and policy == "auto" and not refused
        row = action_store.prepare_action(
            self.ledger,
            run["run_id"],
            loop,
            index,
            tool_name,
            tool_input,
            self.features,
            rerunnable=rerunnable,
            policy=policy,
            raw_sha256=self.keep_raw_input(run["run_id"], loop, index, tool_input, shown),
            run=run,
            shown_input=shown,
            announce=not quiet,
        )
        if blocked is not None:
            row = self.refuse_prepared(row, ActionPhase.DENIED, blocked)
        elif not allowed:
            row = self.refuse_prepared(row, ActionPhase.DENIED, f"{tool_name} is not in this agent's tools list")
        elif problem is not None:
            row = self.refuse_prepared(row, ActionPhase.FAILED, problem)
        elif out_of_scope is not None:
            row = self.refuse_prepared(row, ActionPhase.DENIED, out_of_scope)
        return row

    async def action_begin(self, slot: ActorSlot, request: ActionBegin) -> ActionBegun:
        action = action_store.get_action(self.ledger, request.action_id)
        self.check_owner(slot, action["run_id"])
        begun = action_store.begin_action(self.ledger, action["action_id"], self.features)
        return ActionBegun(begin=begun["begin"], phase=begun["phase"])

    def planned_call(self, run_id: str, loop: int, index: int) -> PrepareStep | None:
        """Action ``index`` of loop ``loop``'s committed plan, as a ``prepare`` step
        with the raw input; None past the plan's end or when nothing is planned."""
        plan = loop_plan_store.get_plan(self.ledger, run_id, loop)
        calls = (plan or {}).get("actions") or []
        if plan is None or plan.get("final") is not None or not 0 <= index < len(calls):
            return None
        step = PrepareStep(
            loop=loop,
            index=index,
            tool=calls[index]["tool"],
            input=calls[index]["input"],
            plan_raw_sha256=loop_plan_store.plan_raw_sha256(self.ledger, run_id, loop),
        )
        self._with_raw_copies(run_id, step)
        return step

    async def action_finish_batch(self, slot: ActorSlot, request: ActionFinishBatch) -> Stepped:
        return self.action_finish_batch_now(slot, request)

    def action_finish_batch_now(self, slot: ActorSlot, request: ActionFinishBatch) -> Stepped:
        """The results of a read batch (supervisor/runs/step_piggyback.py), in order, each
        finished exactly as ``action.finish`` finishes one; all are checked first.
        Synchronous (step_piggyback.py commits it with the next step's writes)."""
        results = request.results
        if not 1 <= len(results) <= MAX_ACTIONS_PER_PLAN:
            raise BadRequest(f"results must be a list of 1 to {MAX_ACTIONS_PER_PLAN} action results")
        run_id = request.run_id
        ids = [result.action_id for result in results]
        if len(set(ids)) != len(ids):
            raise BadRequest("results name an action more than once")
        actions = []
        rows = action_store.actions_by_id(self.ledger, ids)  # one read for the batch
        for the_id, result in zip(ids, results, strict=True):
            action = rows.get(the_id)
            if action is None:
                raise NotFound(f"no action {the_id!r}")
            if action["run_id"] != run_id:
                raise BadRequest(f"action {action['action_id']} is not in run {run_id}")
            if result.receipt is not None:
                check_receipt(action, result.receipt)  # every one before anything is written
            actions.append(action)
        self.check_owner(slot, run_id)
        with self.ledger.tx():  # the whole batch in one commit
            for action, result in zip(actions, results, strict=True):
                # Read just above, with no await since: nothing else moved it.
                self._finish(action, result)
        return Stepped()

    async def action_finish(self, slot: ActorSlot, request: ActionFinish) -> Stepped:
        return self.action_finish_now(slot, request)

    def action_finish_now(self, slot: ActorSlot, request: ActionFinish) -> Stepped:
        """``action.finish``, synchronous (as ``action_finish_batch_now``)."""
        action = action_store.get_action(self.ledger, request.action_id)
        self.check_owner(slot, action["run_id"])
        if request.receipt is not None:
            check_receipt(action, request.receipt)  # before anything is written
        self._finish(action, request.result())
        return Stepped()

    def _finish(self, action: Any, result: ActionResult) -> None:
        if result.unknown:
            # The tool could not tell what its effect came to: a person reconciles it
            # (with what the tool could say, kept in its result); it never runs again.
            action_store.park_unknown_outcome(self.ledger, action, result.output, result.summary,
                                              result.error or result.summary, self.features)
            return
        with self.ledger.tx():
            # Where a full disk refuses an outcome (tests: ``disk-full@N``); the agent
            # keeps it and sends it again.
            failpoints.hit("action.before-terminal")
            action_store.finish_action(
                self.ledger,
                action["action_id"],
                result.ok,
                result.output,
                result.summary,
                result.error,
                self.features,
                current=action,
                # A finished action's traceback (its tool raised), if the agent sent one.
                traceback=result.traceback or None,
                receipt=result.receipt,
            )
        if action["raw_sha256"]:
            # Once terminal is committed, nothing will act on this raw input again.
            name = sealed_input.raw_name(action["run_id"], "input", action["action_id"])
            self.ledger.after_commit(partial(sealed_input.drop, self.spool, name))

    async def finalize(self, slot: ActorSlot, request: RunFinalize) -> RunFinalized:
        """``run.finalize``: the owner's run; a hold (``finalize_holds``: its sessions
        about to exit should not cost a repair turn); then supervisor/runs/finalization.py
        (guards, blockers, parkers, the journal)."""
        run = self.run_of(slot, request.run_id)
        for hold in self.features.finalize_holds:
            await hold(run)
        if request.reply is None:
            raise BadRequest("reply must be a string")
        done = finalization.finalize(self.ledger, run["run_id"], request.reply, self.limits_for(run), self.features)
        return RunFinalized(**done)

    async def fail(self, slot: ActorSlot, request: RunFail) -> Ack:
        run = self.run_of(slot, request.run_id)
        if RunStatus(run["status"]) not in TERMINAL:
            run_store.set_run_status(
                self.ledger, run["run_id"], RunStatus.FAILED, self.features, summarize(request.reason, 300)
            )
        return Ack()

"""The run layer on the supervisor: actor methods for agents, control methods for
people, recovery at boot, retry timers, and wake-ups of agents whose runs can move.

It is past 600 lines because it still holds two jobs: the actor and control
methods, and the timers and wake-ups. Issue 33's regrouping of supervisor/ into
runs/ splits it at that seam; it was left whole this round so that the typed
services landed without moving code at the same time.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from corral.actors import inflight
from corral.actors.providers.base import MAX_ACTIONS_PER_PLAN, MAX_RESPONSE_CHARS
from corral.actors.providers.registry import is_idempotent
from corral.actors.tools.registry import all_tools, rerunnable
from corral.actors.tools.validation import validation_error
from corral.core import failpoints
from corral.core.redact import redact, redact_text, summarize
from corral.mailbox.steps import Begun, Do, PrepareStep, Step
from corral.supervisor.errors import BadRequest, NotFound, Refused, SupervisorError
from corral.supervisor.params import param_int, param_str, param_text
from corral.supervisor.runs import finalization, poison, recovery, resolutions, run_store, sealed_input, step_piggyback
from corral.supervisor.runs.action_state import ActionPhase, action_id, canonical_json
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.runs.run_store import RunLimits
from corral.supervisor.runs.run_views import RunViews
from corral.supervisor.spec.swarm_spec import AgentSpec
from corral.supervisor.tree.supervision_tree import ActorSlot

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

log = logging.getLogger("corral.runs")

#: Which policy wins when several globs match one tool.
POLICY_STRICTNESS = ("auto", "confirm", "deny")


def _str(params: dict[str, Any], key: str, *, limit: int = 200) -> str:
    return param_str(params, key, limit=limit)


def _history_have(params: dict[str, Any]) -> int:
    """How many of the run's observations the agent holds already (0: send them all)."""
    return param_int(params, "history_have", 0, high=10**9)


def _int(params: dict[str, Any], key: str) -> int:
    return param_int(params, key)


class RunService:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self.ledger = sup.ledger
        self.hooks = sup.ledger.hooks
        self.retry_changed = trio.Event()
        self.recovery_report: recovery.RecoveryReport | None = None
        self.tools = all_tools()
        self._spool: Path | None = None

    # -- helpers ------------------------------------------------------------------

    def agent_spec(self, agent_id: str) -> AgentSpec:
        try:
            return self.sup.spec.agent(agent_id)
        except KeyError:
            raise NotFound(f"no agent {agent_id!r} in the swarm spec") from None

    def limits_for(self, run: Any) -> RunLimits:
        options = json.loads(run["options"])
        limits = options.get("limits", {})
        return RunLimits(**{k: v for k, v in limits.items() if k in RunLimits.__dataclass_fields__})

    def check_owner(self, slot: ActorSlot, run_id: str) -> None:
        """``owned_run`` without reading the whole row (the hot step methods)."""
        row = self.ledger.one("SELECT agent_id FROM runs WHERE run_id = ?", run_id)
        if row is None:
            raise NotFound(f"no run {run_id!r}")
        if row["agent_id"] != slot.spec.params.get("agent_id"):
            raise Refused(f"run {run_id} belongs to {row['agent_id']}, not to {slot.id}")

    def ledger_tool_action(self, slot: ActorSlot, params: dict[str, Any], tool: str) -> tuple[str, Any]:
        """The run and the action a ledger tool (``plan.update``, ``goal.verdict``)
        acts for: the caller's run, and an action of that tool in it."""
        run_id = _str(params, "run_id", limit=64)
        self.check_owner(slot, run_id)
        action = run_store.get_action(self.ledger, _str(params, "action_id", limit=64))
        if action["run_id"] != run_id or action["tool"] != tool:
            raise BadRequest(f"action {action['action_id']} is not a {tool} of run {run_id}")
        return run_id, action

    def owned_run(self, slot: ActorSlot, params: dict[str, Any]) -> Any:
        run = run_store.get_run(self.ledger, _str(params, "run_id"))
        if run["agent_id"] != slot.spec.params.get("agent_id"):
            raise Refused(f"run {run['run_id']} belongs to {run['agent_id']}, not to {slot.id}")
        return run

    def policy_for(self, run: Any, tool: str) -> str:
        """The run's policy for a tool: an exact key first, then the strictest glob
        that matches (deny over confirm over auto), then the spec's, then the tool's
        own default (auto unless it says otherwise)."""
        options = json.loads(run["options"])
        for table in (options.get("policy", {}), self.sup.spec.policy):
            if tool in table:
                return str(table[tool])
            matches = [mode for key, mode in table.items() if fnmatch.fnmatchcase(tool, key)]
            if matches:
                return max(matches, key=POLICY_STRICTNESS.index)
        # A tool may ask for a person by default (project.git_commit): the spec can say otherwise.
        return str(getattr(self.tools.get(tool), "default_policy", "auto"))

    @staticmethod
    def tool_allowed(run: Any, tool: str) -> bool:
        """The agent's ``tools`` allow list (globs); no list: every tool."""
        globs = json.loads(run["options"]).get("tool_globs")
        return globs is None or any(fnmatch.fnmatchcase(tool, pattern) for pattern in globs)

    def refuse_prepared(self, row: Any, phase: ActionPhase, why: str) -> Any:
        """An action refused at prepare (invalid arguments, not allowed): terminal
        before it is ever executing, with a receipt and the reason the model sees."""
        if row["phase"] != ActionPhase.PREPARED:
            return row
        run_store.move_action(self.ledger, row["action_id"], phase, error=why, reason=why)
        run_store.write_receipt(self.ledger, row["action_id"])
        return run_store.get_action(self.ledger, row["action_id"])

    async def wake(self, agent_id: str) -> None:
        slot = self.sup.tree.slots.get(agent_id)
        if slot is not None:
            await self.sup.tree.tell(agent_id, {"op": "wake"})

    async def wake_run(self, run_id: str) -> None:
        run = run_store.get_run(self.ledger, run_id)
        await self.wake(run["agent_id"])

    # -- actor methods --------------------------------------------------------------

    async def claim(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        agent_id = slot.spec.params.get("agent_id", slot.id)
        run = run_store.claim_run(self.ledger, agent_id)
        if run is None:
            # Parked runs (waiting for a person, a join, a retry) still belong to this
            # agent: an isolated child must stay up for them, not exit as idle.
            parked = self.ledger.one(
                "SELECT COUNT(*) FROM runs WHERE agent_id = ? AND status NOT IN ('completed', 'failed', 'cancelled')",
                agent_id,
            )
            return {"run": None, "parked": int(parked[0]) if parked else 0}
        options = json.loads(run["options"])
        try:
            provider_config = self._provider_config(run, options)
        except sealed_input.SealedInputError as exc:
            run_store.set_run_status(self.ledger, run["run_id"], RunStatus.FAILED, f"cannot start: {exc}")
            return {"run": None, "parked": 0}
        claimed = {
                "run_id": run["run_id"],
                "task": run["task"],
                "kind": run["kind"],
                "provider": run["provider"],
                "provider_config": provider_config,
                "workspace": options.get("workspace"),
                "write_scopes": options.get("write_scopes", ["."]),
                "effects_file": options.get("effects_file"),
                "home": str(self.sup.home),
                "allowed_tools": options.get("allowed_tools"),
                "tool_globs": options.get("tool_globs"),
                # The ids a delegation or a spawn may name: offered to the model as
                # enums, so even a small one cannot invent an agent.
                "known_ids": {
                    "agent.delegate/agent_id": [a.id for a in self.sup.spec.agents if a.role == "specialist"],
                    "agent.spawn_isolated/children/template": [t.id for t in self.sup.spec.templates],
                },
        }
        for hook in self.hooks.on_claim:
            await hook(claimed)  # e.g. the MCP tools this run may call
        return {"run": claimed}

    async def next_step(self, slot: ActorSlot, params: dict[str, Any]) -> Step:
        run_id = _str(params, "run_id")
        self.check_owner(slot, run_id)
        step = run_store.next_step(self.ledger, run_id)
        if step["do"] is Do.PROVIDER:
            step["task"] = run_store.get_run(self.ledger, run_id)["task"]
            shaped: Step = step
            for shape in self.hooks.provider_shapers:
                if shaped["do"] is Do.PROVIDER:
                    shaped = await shape(run_id, shaped)  # e.g. compaction: its view, or compact first
            if shaped["do"] is Do.PROVIDER and "history" not in shaped:
                # No hook shaped it: all of it, of which the agent already holds the
                # first ``history_have`` (it keeps what earlier turns sent, so a long
                # run does not resend and re-decode its whole history every turn).
                have = _history_have(params)
                shaped["history"] = run_store.history(self.ledger, run_id, after=have)
                shaped["history_from"] = have
            step = shaped
        try:
            self._with_raw_copies(run_id, step)
        except sealed_input.SealedInputError as exc:
            # Acting on the redacted copy would corrupt what the tool writes: fail closed.
            run_store.set_run_status(self.ledger, run_id, RunStatus.FAILED, f"cannot continue: {exc}")
            return {"do": Do.DONE, "status": RunStatus.FAILED.value}
        return step

    # -- raw copies: the ledger shows redacted data; tools act on the real thing ----------

    def _provider_config(self, run: Any, options: dict[str, Any]) -> dict[str, Any]:
        digest = options.get("provider_config_raw_sha256")
        if not digest:
            config: dict[str, Any] = json.loads(run["provider_config"])
            return config
        name = sealed_input.raw_name(run["run_id"], "provider-config", "config")
        raw: dict[str, Any] = json.loads(sealed_input.load(self.spool, name, digest))
        return raw

    @property
    def spool(self) -> Path:
        if self._spool is None:
            self._spool = sealed_input.spool_dir(self.sup.home)  # made once, not per step
        return self._spool

    def _with_raw_copies(self, run_id: str, step: Step) -> None:
        """Replace the redacted copies in a step with the raw ones the agent acts on."""
        if step["do"] is Do.PARSE:
            digest = step.pop("raw_sha256", None)
            if digest:
                name = sealed_input.raw_name(run_id, "response", step["slot"])
                step["response"] = sealed_input.load(self.spool, name, digest).decode()
        elif step["do"] is Do.PREPARE:
            digest = step.pop("plan_raw_sha256", None)
            if digest:
                name = sealed_input.raw_name(run_id, "plan", str(step["loop"]))
                raw_plan = json.loads(sealed_input.load(self.spool, name, digest))
                step["input"] = raw_plan["actions"][step["index"]]["input"]
        elif step["do"] is Do.EXECUTE:
            digest = step.pop("raw_sha256", None)
            if digest:
                name = sealed_input.raw_name(run_id, "input", step["action_id"])
                step["input"] = json.loads(sealed_input.load(self.spool, name, digest))

    def keep_raw(self, run_id: str, kind: str, key: str, raw: Any, shown: Any) -> str | None:
        """A raw copy when redaction changed what is stored; its digest, else None."""
        if raw == shown:
            return None
        data = raw.encode() if isinstance(raw, str) else canonical_json(raw).encode()
        return sealed_input.keep(self.spool, sealed_input.raw_name(run_id, kind, key), data)

    async def provider_begin(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        run = self.owned_run(slot, params)
        return run_store.begin_provider_request(self.ledger, run["run_id"], _int(params, "loop"))

    async def provider_handoff(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        run = self.owned_run(slot, params)
        text = params.get("text")
        if not isinstance(text, str):
            raise BadRequest("text must be a string")
        slot_name = _str(params, "slot")
        text = text[:MAX_RESPONSE_CHARS]
        raw_sha = self.keep_raw(run["run_id"], "response", slot_name, text, redact_text(text))
        run_store.provider_handoff(self.ledger, run["run_id"], slot_name, text, raw_sha256=raw_sha)
        return {}

    async def provider_failed(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        run = self.owned_run(slot, params)
        result = run_store.provider_failed(
            self.ledger,
            run["run_id"],
            _str(params, "slot"),
            _str(params, "kind", limit=40),
            str(params.get("error", ""))[:1000],
            self.limits_for(run),
        )
        self._retry_schedule_changed()
        return result

    async def plan_commit(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        run = self.owned_run(slot, params)
        plan = params.get("plan")
        if not isinstance(plan, dict):
            raise BadRequest("plan must be a map")
        loop = _int(params, "loop")
        slot_name = _str(params, "slot")
        withheld = raw_sha = None
        if run_store.get_plan(self.ledger, run["run_id"], loop) is None:
            for guard in self.hooks.plan_guards:
                why = guard(run, loop, plan)  # e.g. the collaboration policy's first wave
                if why:
                    refused = run_store.plan_invalid(self.ledger, run["run_id"], loop, slot_name,
                                                     "collaboration-policy", why, self.limits_for(run))
                    return {"refused": why, **refused}
        if run_store.get_plan(self.ledger, run["run_id"], loop) is None:  # a replay must not spool again
            plan, sealed = sealed_input.seal_plan(self.spool, run["run_id"], loop, plan)
            withheld = sealed_input.WITHHELD_RESPONSE if sealed else None
            raw_sha = self.keep_raw(run["run_id"], "plan", str(loop), plan, redact(plan))
        stored = run_store.commit_plan(
            self.ledger, run["run_id"], loop, slot_name, plan, withhold_response=withheld, raw_sha256=raw_sha
        )
        # The plan is durable: the raw response (which may hold sealed input) is not needed.
        sealed_input.drop(self.spool, sealed_input.raw_name(run["run_id"], "response", slot_name))
        return {"plan": stored}

    async def plan_invalid(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        run = self.owned_run(slot, params)
        return run_store.plan_invalid(
            self.ledger,
            run["run_id"],
            _int(params, "loop"),
            _str(params, "slot"),
            _str(params, "category", limit=40),
            str(params.get("detail", ""))[:1000],
            self.limits_for(run),
        )

    async def action_prepare(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        row = self.prepare_call(slot, params)
        return {"action_id": row["action_id"], "phase": row["phase"], "fingerprint": row["fingerprint"]}

    def prepare_call(self, slot: ActorSlot, params: dict[str, Any]) -> Any:
        """``action.prepare``, synchronous (the next step prepares through it inside
        its own transaction): the first of the ``prepare_routes`` that takes the tool
        (an MCP server's), else corral's tool registry. Returns the action's row."""
        for route in self.hooks.prepare_routes:
            row = route(slot, params)
            if row is not None:
                return row
        run = self.owned_run(slot, params)
        tool_name = _str(params, "tool", limit=80)
        tool_input = params.get("input")
        if not isinstance(tool_input, dict):
            raise BadRequest("input must be a map")
        tool = self.tools.get(tool_name)
        if tool is None:
            raise BadRequest(f"unknown tool {tool_name!r}")
        policy = self.policy_for(run, tool_name)
        allowed = json.loads(run["options"]).get("allowed_tools")
        if allowed is not None and tool_name not in allowed:
            policy = "deny"  # e.g. a child may not spawn or delegate: refused, recorded, never run
        problem = validation_error(tool_name, tool.schema.input_schema, tool_input, sealed=tool.schema.sealed)
        loop, index = _int(params, "loop"), _int(params, "index")
        return self.prepare_checked(
            run, loop, index, tool_name, tool_input, rerunnable=rerunnable(tool), policy=policy, problem=problem
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
    ) -> Any:
        """The one way every tool (built-in, user, MCP) becomes a prepared action: the
        raw input kept privately, then refused at once when the agent may not use the
        tool or the arguments are invalid (never executing, so never run; the model
        sees why in the observation)."""
        blocked = None
        for guard in self.hooks.action_guards:
            # The user's intent contract (supervisor/intent/intent_service.py): stricter only.
            verdict, why = guard(run, action_id(run["run_id"], loop, index), tool_name, tool_input)
            if verdict == "ask":
                policy = max(policy, "confirm", key=POLICY_STRICTNESS.index)
            elif verdict == "block":
                blocked = why
        shown = redact(tool_input)  # what the ledger keeps, computed once
        row = run_store.prepare_action(
            self.ledger,
            run["run_id"],
            loop,
            index,
            tool_name,
            tool_input,
            rerunnable=rerunnable,
            policy=policy,
            raw_sha256=self.keep_raw_input(run["run_id"], loop, index, tool_input, shown),
            run=run,
            shown_input=shown,
        )
        if blocked is not None:
            row = self.refuse_prepared(row, ActionPhase.DENIED, blocked)
        elif not self.tool_allowed(run, tool_name):
            row = self.refuse_prepared(row, ActionPhase.DENIED, f"{tool_name} is not in this agent's tools list")
        elif problem is not None:
            row = self.refuse_prepared(row, ActionPhase.FAILED, problem)
        return row

    def keep_raw_input(
        self, run_id: str, loop: int, index: int, tool_input: dict[str, Any], shown: Any = None
    ) -> str | None:
        """Every tool (built-in, user, MCP) prepares through this: the input as the tool
        will get it, kept privately when the ledger's copy (``shown``) is redacted."""
        the_id = action_id(run_id, loop, index)
        return self.keep_raw(run_id, "input", the_id, tool_input, redact(tool_input) if shown is None else shown)

    async def action_begin(self, slot: ActorSlot, params: dict[str, Any]) -> Begun:
        action = run_store.get_action(self.ledger, _str(params, "action_id"))
        self.check_owner(slot, action["run_id"])
        return run_store.begin_action(self.ledger, action["action_id"])

    def planned_call(self, run_id: str, loop: int, index: int) -> PrepareStep | None:
        """Action ``index`` of loop ``loop``'s committed plan, as a ``prepare`` step
        with the raw input; None past the plan's end or when nothing is planned."""
        plan = run_store.get_plan(self.ledger, run_id, loop)
        calls = (plan or {}).get("actions") or []
        if plan is None or plan.get("final") is not None or not 0 <= index < len(calls):
            return None
        step: PrepareStep = {
            "do": Do.PREPARE,
            "loop": loop,
            "index": index,
            "tool": calls[index]["tool"],
            "input": calls[index]["input"],
            "plan_raw_sha256": run_store.plan_raw_sha256(self.ledger, run_id, loop),
        }
        self._with_raw_copies(run_id, step)
        return step

    async def action_finish_batch(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        """The results of a read batch (supervisor/runs/step_piggyback.py), in order, each
        finished exactly as ``action.finish`` finishes one; all are checked first."""
        results = params.get("results")
        if not isinstance(results, list) or not 1 <= len(results) <= MAX_ACTIONS_PER_PLAN:
            raise BadRequest(f"results must be a list of 1 to {MAX_ACTIONS_PER_PLAN} action results")
        if not all(isinstance(result, dict) for result in results):
            raise BadRequest("each result must be a map")
        run_id = _str(params, "run_id")
        ids = [_str(result, "action_id") for result in results]
        if len(set(ids)) != len(ids):
            raise BadRequest("results name an action more than once")
        actions = []
        for the_id, result in zip(ids, results, strict=True):
            action = run_store.get_action(self.ledger, the_id)
            if action["run_id"] != run_id:
                raise BadRequest(f"action {action['action_id']} is not in run {run_id}")
            if not isinstance(result.get("output", {}), dict):
                raise BadRequest("output must be a map")
            actions.append(action)
        self.check_owner(slot, run_id)
        with self.ledger.tx():  # the whole batch in one commit
            for action, result in zip(actions, results, strict=True):
                # Read just above, with no await since: nothing else moved it.
                self._finish(action, result)
        return {}

    async def action_finish(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        action = run_store.get_action(self.ledger, _str(params, "action_id"))
        self.check_owner(slot, action["run_id"])
        if not isinstance(params.get("output", {}), dict):
            raise BadRequest("output must be a map")
        self._finish(action, params)
        return {}

    def _finish(self, action: Any, params: dict[str, Any]) -> None:
        with self.ledger.tx():
            # Where a full disk refuses an outcome (tests: ``disk-full@N``); the agent
            # keeps it and sends it again.
            failpoints.hit("action.before-terminal")
            run_store.finish_action(
                self.ledger,
                action["action_id"],
                bool(params.get("ok")),
                params.get("output", {}),
                str(params.get("summary", "")),
                params.get("error"),
                current=action,
            )
        if action["raw_sha256"]:
            # Once terminal is committed, nothing will act on this raw input again.
            name = sealed_input.raw_name(action["run_id"], "input", action["action_id"])
            self.ledger.after_commit(partial(sealed_input.drop, self.spool, name))

    async def finalize(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        """``run.finalize``: the owner's run; a hold (``finalize_holds``: its sessions
        about to exit should not cost a repair turn); then supervisor/runs/finalization.py
        (guards, blockers, parkers, the journal)."""
        run = self.owned_run(slot, params)
        for hold in self.hooks.finalize_holds:
            await hold(run)
        reply = params.get("reply")
        if not isinstance(reply, str):
            raise BadRequest("reply must be a string")
        return finalization.finalize(self.ledger, run["run_id"], reply, self.limits_for(run))

    async def fail(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        run = self.owned_run(slot, params)
        if RunStatus(run["status"]) not in TERMINAL:
            run_store.set_run_status(
                self.ledger,
                run["run_id"],
                RunStatus.FAILED,
                summarize(str(params.get("reason", "failed")), 300),
            )
        return {}

    # -- control methods --------------------------------------------------------------

    async def create(self, params: dict[str, Any]) -> dict[str, Any]:
        agent = self.agent_spec(_str(params, "agent_id", limit=64))
        goal = params.get("goal")
        if goal is not None and (not isinstance(goal, str) or not goal.strip() or len(goal) > 4000):
            raise BadRequest("goal must be 1 to 4000 characters")
        if goal is not None and not params.get("task"):
            params = {**params, "task": goal}  # the goal is the first task, and its standard
        task = param_text(params, "task", None, limit=run_store.MAX_TASK_CHARS)
        provider, provider_config = agent.provider, agent.provider_config
        script = params.get("script")
        if script is not None:
            from corral.actors.providers.scripted import ScriptError, parse_script_text

            if not isinstance(script, str):
                raise BadRequest("script must be the text of a TOML or JSON script")
            try:
                parsed = parse_script_text(script, ".json" if script.lstrip().startswith("{") else ".toml")
            except ScriptError as exc:
                raise BadRequest(str(exc)) from None
            provider, provider_config = "scripted", {"script": parsed}
        run_id = params.get("run_id")
        if run_id is not None:
            # A caller-chosen id makes `run` idempotent: a client that lost the reply
            # (the supervisor died right after committing) can ask again safely.
            if not isinstance(run_id, str) or not run_store.RUN_ID.match(run_id):
                raise BadRequest("run_id must look like run-<6..40 of a-z, 0-9, ->")
            existing = self.ledger.one("SELECT agent_id FROM runs WHERE run_id = ?", run_id)
            if existing is not None:
                if existing["agent_id"] != agent.id:
                    raise BadRequest(f"run {run_id} exists for another agent")
                return {"run_id": run_id, "existing": True}
        run_id = run_store.create_run(
            self.ledger,
            agent_id=agent.id,
            task=task,
            provider=provider,
            provider_config=provider_config,
            options={**self.agent_options(agent), **self.bind_intent(params.get("intent")),
                     **({"goal": {"text": goal.strip()}} if goal is not None else {})},
            run_id=run_id,
            conversation_id=params.get("conversation_id") if isinstance(params.get("conversation_id"), str) else None,
        )
        from corral.core import failpoints

        failpoints.hit("run.after-create")  # the reply is lost: a client retry must find this run
        await self.wake(agent.id)
        return {"run_id": run_id}

    def bind_intent(self, intent: Any) -> dict[str, Any]:
        """The run's intent binding, kept with its options (bound, or unbound and why)."""
        return {} if intent is None else {"intent": self.sup.intent.bind(intent)}

    def agent_options(self, agent: AgentSpec) -> dict[str, Any]:
        return {
            "workspace": str(agent.workspace),
            "write_scopes": list(agent.write_scopes),
            "policy": {**self.sup.spec.policy, **agent.policy},
            "tool_globs": list(agent.tools) if agent.tools is not None else None,
            "effects_file": str(self.sup.spec.effects_file) if self.sup.spec.effects_file else None,
            "limits": {
                "max_repairs": agent.max_repairs,
                "max_provider_retries": agent.max_provider_retries,
                "retry_base_s": agent.retry_base_s,
                "retry_cap_s": agent.retry_cap_s,
            },
            "role": agent.role,
            "parallel_reads": list(agent.parallel_reads),
            "context": {
                "window": agent.context_window,
                "auto_compact": agent.auto_compact_token_limit or (
                    agent.context_window * 3 // 4 if agent.context_window else None),
                "tool_output": agent.tool_output_token_limit,
            },
        }

    async def continue_action(self, params: dict[str, Any]) -> dict[str, Any]:
        fingerprint = params.get("fingerprint")
        if fingerprint is not None:
            fingerprint = param_text(params, "fingerprint", limit=200)
        run_id = resolutions.continue_action(
            self.ledger, _str(params, "action_id"), _str(params, "decision"), fingerprint
        )
        await self.wake_run(run_id)
        for hook in self.hooks.on_decision:
            hook(params)  # e.g. the user's own intent receipt for this action
        return {"run_id": run_id}

    async def reconcile(self, params: dict[str, Any]) -> dict[str, Any]:
        target = _str(params, "action_id", limit=300)
        for prefix, reconcile_other in self.hooks.reconcilers.items():
            if target.startswith(prefix):
                return await reconcile_other(params)  # e.g. a process session (proc-…)
        note = str(params.get("note", ""))[:1000]
        if target.startswith("act-"):
            run_id = resolutions.reconcile(self.ledger, target, _str(params, "outcome"), note)
        else:
            run_id = resolutions.reconcile_provider_request(self.ledger, target, note or "reconciled")
        await self.wake_run(run_id)
        return {"run_id": run_id}

    async def resume(self, params: dict[str, Any]) -> dict[str, Any]:
        run_id = _str(params, "run_id")
        # A run parked for a provider retry is woken now (the explicit wake an
        # operator, or a test, uses instead of waiting for retry_at).
        run_store.retry_provider_now(self.ledger, run_id)
        resolutions._reopen_run(self.ledger, run_id)
        await self.wake_run(run_id)
        return {"status": run_store.get_run(self.ledger, run_id)["status"]}

    async def wake_pending(self, params: dict[str, Any]) -> dict[str, Any]:
        agents = {
            row["agent_id"]
            for row in self.ledger.all("SELECT DISTINCT agent_id FROM runs WHERE status IN ('pending', 'running')")
        }
        for agent_id in agents:
            await self.wake(agent_id)
        return {"woken": sorted(agents)}

    async def cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        run_id = _str(params, "run_id")
        reason = param_text(params, "reason", "cancelled", limit=1000) or "cancelled"
        run = run_store.get_run(self.ledger, run_id)
        if RunStatus(run["status"]) in TERMINAL:
            raise Refused(f"run {run_id} already ended ({run['status']})")
        with self.ledger.tx():
            run_store.deny_unstarted_actions(self.ledger, run_id, f"run cancelled: {reason}")
            run_store.set_run_status(self.ledger, run_id, RunStatus.CANCELLED, reason)
        return {"status": "cancelled"}

    # -- busy, recovery, retries --------------------------------------------------------

    def busy(self) -> list[str]:
        rows = self.ledger.all(
            "SELECT status, COUNT(*) AS n FROM runs WHERE status NOT IN"
            " ('completed', 'failed', 'cancelled') GROUP BY status"
        )
        return [f"{row['n']} run(s) {row['status']}" for row in rows]

    def is_read(self, tool: str) -> bool:
        found = self.tools.get(tool)
        return found is not None and found.schema.effect_class == "read"

    def on_actor_exit(self, slot: ActorSlot, code: int, crashed: bool) -> None:
        """An agent died: a crash is charged to the actions it had in flight, and
        those that keep crashing it are stopped as poison (supervisor/runs/poison.py)."""
        in_flight = inflight.take(self.sup.home, slot.id)
        if not crashed or not in_flight:
            return
        try:
            stopped = poison.charge(
                self.ledger,
                in_flight,
                agent_id=str(slot.spec.params.get("agent_id", slot.id)),
                actor_id=slot.id,
                incarnation=slot.incarnation,
                exit_code=code,
                is_read=self.is_read,
            )
        except SupervisorError as exc:  # a full disk: this crash goes uncounted, the next one counts
            log.warning("%s: its crash (exit %s) was not charged to %s: %s", slot.id, code, in_flight, exc)
            return
        except Exception:  # bookkeeping: it must never stop the tree from restarting the agent
            log.exception("%s: its crash (exit %s) was not charged to %s", slot.id, code, in_flight)
            return
        if stopped:
            log.error("%s: %s crashed it too often; not run again", slot.id, ", ".join(stopped))

    async def recover(self) -> None:
        inflight.reset(self.sup.home)  # what earlier boots' actors had in flight is no crash of theirs
        self.recovery_report = recovery.recover(self.ledger, is_idempotent, self.is_read)
        sealed_input.sweep(sealed_input.spool_dir(self.sup.home), self.ledger)
        report = self.recovery_report
        self.ledger.event(
            "recovery-done",
            self.sup.boot_id,
            finalizations=report.finalizations,
            reconciliations=len(report.reconciliations),
            receipts=report.receipts_repaired,
            poisoned=len(report.poisoned),
            provider_requests=report.provider_requests,
            runs=report.runs_resumed,
        )

    def _retry_schedule_changed(self) -> None:
        self.retry_changed.set()
        self.retry_changed = trio.Event()

    async def retry_timer(self) -> None:
        """Wakes runs whose provider retry is due, never before the stored retry_at."""
        while True:
            due = run_store.due_retries(self.ledger)
            now = trio.current_time()
            wall = time.time()
            earliest = min((at for _, at in due), default=math.inf)
            if earliest <= wall:
                for run_id, at in due:
                    if at <= wall:
                        run_store.set_run_status(self.ledger, run_id, RunStatus.RUNNING, "provider retry due")
                        await self.wake_run(run_id)
                continue
            changed = self.retry_changed
            with trio.move_on_at(now + (earliest - wall) if earliest != math.inf else math.inf):
                await changed.wait()

    def status_section(self) -> dict[str, Any]:
        rows = self.ledger.all("SELECT status, COUNT(*) AS n FROM runs GROUP BY status")
        report = self.recovery_report
        return {
            "by_status": {row["status"]: row["n"] for row in rows},
            "recovery": None
            if report is None
            else {
                "finalizations": report.finalizations,
                "reconciliations": report.reconciliations,
                "receipts_repaired": report.receipts_repaired,
            },
        }


def install(sup: Supervisor) -> tuple[RunService, RunViews]:
    """The run layer: its actor and control methods, hooks and background tasks.
    The step methods' replies carry the next step (supervisor/runs/step_piggyback.py)."""
    service = RunService(sup)
    views = RunViews(sup)
    hooks = sup.hooks
    hooks.idempotent_provider = is_idempotent
    hooks.keep_raw_copy = service.keep_raw
    hooks.on_status.append(views.on_status)
    hooks.show_sections["crashes"] = partial(poison.show_section, sup.ledger)
    sup.tree.on_exit.append(service.on_actor_exit)
    step = partial(step_piggyback.with_next, sup)
    sup.actor_methods.update(
        {
            "run.claim": service.claim,
            "run.next_step": service.next_step,
            "provider.begin": service.provider_begin,
            "provider.handoff": step("provider.handoff", service.provider_handoff),
            "provider.failed": service.provider_failed,
            "plan.commit": step("plan.commit", service.plan_commit),
            "plan.invalid": step("plan.invalid", service.plan_invalid),
            "action.prepare": step("action.prepare", service.action_prepare),
            "action.begin": step("action.begin", service.action_begin),
            "action.finish": step("action.finish", service.action_finish),
            "action.finish_batch": step("action.finish_batch", service.action_finish_batch),
            "run.finalize": service.finalize,
            "run.fail": service.fail,
        }
    )
    sup.control_methods.update(
        {
            "run": service.create,
            "show": views.show,
            "runs": views.runs,
            "wait": views.wait,
            "pending": views.pending,
            "continue_action": service.continue_action,
            "reconcile": service.reconcile,
            "resume": service.resume,
            "wake_pending": service.wake_pending,
            "cancel": service.cancel,
        }
    )
    sup.busy_checks.append(service.busy)
    sup.recovery_hooks.append(service.recover)
    sup.background.append(service.retry_timer)
    sup.status_sections["runs"] = service.status_section
    return service, views

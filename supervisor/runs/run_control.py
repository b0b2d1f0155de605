"""The run layer's control methods: what people (and the client) call to start a
run, approve or deny an action, reconcile an unknown outcome, resume, wake and
cancel. What they read of runs is run_views.py.
"""

from __future__ import annotations

from typing import Any

from corral.supervisor.errors import BadRequest, Refused
from corral.supervisor.ledger.port import RunIdTaken
from corral.supervisor.params import param_text
from corral.supervisor.runs import action_store, resolutions, run_store
from corral.supervisor.runs.run_core import RunCore, _str
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.spec.swarm_spec import AgentSpec


class RunControlMethods(RunCore):
    async def create(self, params: dict[str, Any], *, from_queue: bool = False) -> dict[str, Any]:
        """``from_queue``: a cluster node creates a run it takes off the shared
        queue (supervisor/cluster/run_queue.py): its id is the queue's already."""
        agent = self.agent_spec(_str(params, "agent_id", limit=64))
        start_task = self.features.start_task(params)  # a goal is the first task, and its standard
        if start_task is not None and not params.get("task"):
            params = {**params, "task": start_task}
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
            self.check_script_tools(agent, parsed)
            provider, provider_config = "scripted", {"script": parsed}
        run_id = params.get("run_id")
        if run_id is not None and not from_queue:
            # A caller-chosen id makes `run` idempotent: a client that lost the reply
            # (the supervisor died right after committing) can ask again safely.
            if not isinstance(run_id, str) or not run_store.RUN_ID.match(run_id):
                raise BadRequest("run_id must look like run-<6..40 of a-z, 0-9, ->")
            existing = self.ledger.one("SELECT agent_id, status FROM runs WHERE run_id = ?", run_id)
            if existing is not None:
                return _existing(run_id, agent.id, dict(existing))
            elsewhere = self.ledger.run_elsewhere(run_id)  # another node's partition (a cluster)
            if elsewhere is not None:
                return _existing(run_id, agent.id, elsewhere)
        conversation_id = params.get("conversation_id") if isinstance(params.get("conversation_id"), str) else None
        self.features.start_check(self.ledger, params)  # e.g. one live goal per conversation
        try:
            placed = None if from_queue else self.features.place_run(run_id, agent.id, params)
            if placed is not None and placed.reply is not None:
                return placed.reply  # in the cluster's shared queue: a node with room takes it
            # Each feature's part of the new run's options (an intent's binding, a
            # goal), kept only by the node that creates it.
            options = {**self.agent_options(agent), **self.features.start_options(self.ledger, params),
                       **(placed.options if placed is not None else {})}
            if params.get("intent") is not None and "intent" not in options:
                raise BadRequest("this supervisor binds no intent contracts")
            run_id = run_store.create_run(
                self.ledger,
                self.features,
                agent_id=agent.id,
                task=task,
                provider=provider,
                provider_config=provider_config,
                options=options,
                run_id=run_id,
                conversation_id=conversation_id,
            )
        except RunIdTaken as taken:
            # Another node was given the same id at the same moment and committed
            # first: its run is the one (nothing of this one was written).
            elsewhere = self.ledger.run_elsewhere(taken.run_id)
            if elsewhere is None:
                raise Refused(f"run {taken.run_id} is being created by another node; ask again") from None
            return _existing(taken.run_id, agent.id, elsewhere)
        self.features.started(self.ledger, run_id, options)  # e.g. a goal's lifecycle row
        from corral.core import failpoints

        failpoints.hit("run.after-create")  # the reply is lost: a client retry must find this run
        await self.wake(agent.id)
        return {"run_id": run_id}

    def check_script_tools(self, agent: AgentSpec, script: dict[str, Any]) -> None:
        """A run's script calls only tools its agent has, as a spec's steps must
        (supervisor/spec/script_tools.py): a misspelled name is refused now, with a
        did-you-mean, and no run starts."""
        from corral.actors.tools.registry import all_tools
        from corral.supervisor.spec.script_tools import script_problem

        mcp_ids = {server.id for server in self.spec.mcp_servers}
        problem = script_problem(script, agent.tools, all_tools(self.spec.user_tools), mcp_ids)
        if problem is not None:
            raise BadRequest(f"script: {problem}")

    def agent_options(self, agent: AgentSpec) -> dict[str, Any]:
        return {
            "workspace": str(agent.workspace),
            "write_scopes": list(agent.write_scopes),
            "policy": {**self.spec.policy, **agent.policy},
            "tool_globs": list(agent.tools) if agent.tools is not None else None,
            "effects_file": str(self.spec.effects_file) if self.spec.effects_file else None,
            "limits": {
                "max_repairs": agent.max_repairs,
                "max_provider_retries": agent.max_provider_retries,
                "retry_base_s": agent.retry_base_s,
                "retry_cap_s": agent.retry_cap_s,
            },
            "role": agent.role,
            "parallel_reads": list(agent.parallel_reads),
            **agent.definition_options(),
            "context": agent.context_limits(),
        }

    async def continue_action(self, params: dict[str, Any]) -> dict[str, Any]:
        fingerprint = params.get("fingerprint")
        if fingerprint is not None:
            fingerprint = param_text(params, "fingerprint", limit=200)
        run_id = resolutions.continue_action(
            self.ledger, _str(params, "action_id"), _str(params, "decision"), fingerprint, self.features
        )
        await self.wake_run(run_id)
        self.features.on_decision(params)  # e.g. the user's own intent receipt for this action
        return {"run_id": run_id}

    async def reconcile(self, params: dict[str, Any]) -> dict[str, Any]:
        target = _str(params, "action_id", limit=300)
        # A feature's own id: another partition's (a cluster node forwards it to its
        # holder), a process session's (proc-…).
        answered = await self.features.reconcile(target, params)
        if answered is not None:
            return answered
        note = str(params.get("note", ""))[:1000]
        if target.startswith("act-"):
            run_id = resolutions.reconcile(self.ledger, target, _str(params, "outcome"), note, self.features)
        else:
            run_id = resolutions.reconcile_provider_request(self.ledger, target, note or "reconciled", self.features)
        await self.wake_run(run_id)
        return {"run_id": run_id}

    async def resume(self, params: dict[str, Any]) -> dict[str, Any]:
        run_id = _str(params, "run_id")
        # A run parked for a provider retry stays parked: its retry is sent at its
        # stored retry_at and never before (seed 004 V1.39: "重复 resume 或到期通知不能
        # 制造第二个物理请求"); the retry timer wakes it.
        resolutions.reopen_run(self.ledger, run_id, self.features)
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
            action_store.deny_unstarted_actions(self.ledger, run_id, f"run cancelled: {reason}", self.features)
            run_store.set_run_status(self.ledger, run_id, RunStatus.CANCELLED, self.features, reason)
        return {"status": "cancelled"}


def _existing(run_id: str, agent_id: str, run: dict[str, Any]) -> dict[str, Any]:
    """A submit of an id the cluster already has: that run, never a second one."""
    if run["agent_id"] != agent_id:
        raise BadRequest(f"run {run_id} exists for another agent")
    answer = {"run_id": run_id, "existing": True, "status": run["status"]}
    if "partition" in run:
        answer["partition"] = run["partition"]
    if run.get("queued"):
        answer["queued"] = True  # in the cluster's shared queue, no node took it yet
    return answer

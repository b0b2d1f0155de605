"""What the run layer's methods share: its collaborators (the ledger, the features,
the spec, the home, the tree), the checks that a run belongs to the calling
agent, the tool policy, the wake-ups of agents, and the raw copies (the ledger
shows redacted data; tools act on the real thing).

RunService (run_service.py) is this and its three kinds of methods: the agents'
(run_actor_methods.py), the people's (run_control.py), and the boot's and the
timers' (run_upkeep.py).
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import trio

from corral.actors.tools.registry import all_tools
from corral.core.redact import redact
from corral.mailbox.steps import ExecuteStep, ParseStep, PrepareStep, Step
from corral.supervisor.errors import BadRequest, NotFound, Refused
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.params import param_int, param_str
from corral.supervisor.runs import action_store, run_store, sealed_input, tool_boundary
from corral.supervisor.runs.action_state import ActionPhase, action_id, canonical_json
from corral.supervisor.runs.recovery import RecoveryReport
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_store import RunLimits
from corral.supervisor.spec.spec_base import did_you_mean
from corral.supervisor.spec.spec_models import POLICY_DEFAULT_KEY
from corral.supervisor.spec.swarm_spec import AgentSpec, SwarmSpec
from corral.supervisor.tree.supervision_tree import ActorSlot, SupervisionTree

#: Which policy wins when several globs match one tool.
POLICY_STRICTNESS = ("auto", "confirm", "deny")


def _str(params: dict[str, Any], key: str, *, limit: int = 200) -> str:
    return param_str(params, key, limit=limit)


def _int(params: dict[str, Any], key: str) -> int:
    return param_int(params, key)


def root_agent(spec: SwarmSpec) -> AgentSpec:
    """The agent a person talks to when they name none (``corral chat``): the
    spec's one agent with ``role = "root"``; with several, or none, a person must
    name one, and the message lists them."""
    roots = [agent for agent in spec.agents if agent.role == "root"]
    if len(roots) == 1:
        return roots[0]
    if roots:
        raise BadRequest(f"the swarm spec has {len(roots)} root agents: {', '.join(a.id for a in roots)}; name one")
    ids = [agent.id for agent in spec.agents]
    raise BadRequest(f"the swarm spec has no root agent (its agents: {', '.join(ids)}); name one" if ids
                     else "the swarm spec has no agents")


class RunCore:
    def __init__(
        self,
        ledger: Ledger,
        features: RunFeatures,
        *,
        spec: SwarmSpec,
        home: Path,
        tree: SupervisionTree,
        boot_id: str,
    ) -> None:
        self.ledger = ledger
        self.features = features
        self.spec = spec
        self.home = home
        self.tree = tree
        self.boot_id = boot_id
        #: Set when a provider retry was scheduled (the retry timer, run_upkeep.py, waits on it).
        self.retry_changed = trio.Event()
        #: What recovery did at this boot (``status`` shows it).
        self.recovery_report: RecoveryReport | None = None
        self.tools = all_tools(spec.user_tools)
        self._spool: Path | None = None

    # -- helpers ------------------------------------------------------------------

    def agent_spec(self, agent_id: str | None) -> AgentSpec:
        """The spec's agent ``agent_id``; None: its root agent (``root_agent``)."""
        if agent_id is None:
            return root_agent(self.spec)
        try:
            return self.spec.agent(agent_id)
        except KeyError:
            ids = [agent.id for agent in self.spec.agents]
            known = f"its agents: {', '.join(ids)}" if ids else "it has no agents"
            raise NotFound(f"no agent {agent_id!r} in the swarm spec{did_you_mean(agent_id, ids)} ({known})") from None

    def limits_for(self, run: Any) -> RunLimits:
        options = json.loads(run["options"])
        limits = options.get("limits", {})
        return RunLimits(**{k: v for k, v in limits.items() if k in RunLimits.__dataclass_fields__})

    def check_owner(self, slot: ActorSlot, run_id: str) -> None:
        """``run_of`` without reading the whole row (the hot step methods)."""
        row = run_store.get_run(self.ledger, run_id)  # kept: usually not read again
        if row["agent_id"] != slot.spec.params.get("agent_id"):
            raise Refused(f"run {run_id} belongs to {row['agent_id']}, not to {slot.id}")

    def tool_action(self, slot: ActorSlot, run_id: str, action_id: str, tool: str) -> Any:
        """The action a ledger tool (``goal.verdict``) acts for: an
        action of that tool in the caller's run ``run_id``."""
        self.check_owner(slot, run_id)
        action = action_store.get_action(self.ledger, action_id)
        if action["run_id"] != run_id or action["tool"] != tool:
            raise BadRequest(f"action {action['action_id']} is not a {tool} of run {run_id}")
        return action

    def run_of(self, slot: ActorSlot, run_id: str) -> Any:
        """Run ``run_id``'s row, when the calling agent owns it (else ``refused``)."""
        run = run_store.get_run(self.ledger, run_id)
        if run["agent_id"] != slot.spec.params.get("agent_id"):
            raise Refused(f"run {run['run_id']} belongs to {run['agent_id']}, not to {slot.id}")
        return run

    def policy_for(self, run: Any, tool: str) -> str:
        """The run's policy for a tool: an exact key first, then the strictest glob
        that matches (deny over confirm over auto), then the spec's, then the tool's
        own default (auto unless it says otherwise). A tool may also name run kinds
        it is always denied in, and a policy nothing lowers (project.git_commit:
        never in a child or a delegation, always with a person's approval). A tool
        outside the run's bound (tool_boundary.py: a child's MCP tool, say) is
        ``deny``, whatever a table says, so no person is asked about it. The
        model's plan update is no tool: it never reaches a policy (seed 004 V1.17)."""
        found = self.tools.get(tool)
        if run["kind"] in getattr(found, "denied_run_kinds", ()) or tool_boundary.refusal(run, tool) is not None:
            return "deny"
        return max(self._chosen_policy(run, tool), str(getattr(found, "min_policy", "auto")),
                   key=POLICY_STRICTNESS.index)

    def effective_policy(self, run: Any) -> dict[str, str]:
        """The run's policy for every tool now, as ``corral show`` lists it (seed 004
        V1.34's "有效策略快照"): ``deny`` for a tool outside the run's bound or its
        agent's ``tools`` list, and for every MCP tool when the bound holds none."""
        shown = {
            name: self.policy_for(run, name) if self.tool_allowed(run, name) else "deny" for name in sorted(self.tools)
        }
        shown.update(tool_boundary.mcp_row(run))
        return shown

    def _chosen_policy(self, run: Any, tool: str) -> str:
        """The agent's table wins over the spec's. In each, a key naming the tool,
        else the strictest glob matching it, else the table's ``default``; past both,
        the tool's own default (``confirm`` for whatever writes or runs a command)."""
        options = run_store.run_options(run)
        # The permission a tool shares (seed 004 V1.6: agent.action_history "权限复用
        # agent.audit"), after the tool's own key.
        permission = str(getattr(self.tools.get(tool), "permission", "") or "")
        for table in (options.get("policy", {}), self.spec.policy):
            if tool in table:
                return str(table[tool])
            if permission and permission in table:
                return str(table[permission])
            matches = [mode for key, mode in table.items()
                       if key != POLICY_DEFAULT_KEY and fnmatch.fnmatchcase(tool, key)]
            if matches:
                return max(matches, key=POLICY_STRICTNESS.index)
            if POLICY_DEFAULT_KEY in table:
                return str(table[POLICY_DEFAULT_KEY])
        return str(getattr(self.tools.get(tool), "default_policy", "auto"))

    @staticmethod
    def tool_allowed(run: Any, tool: str) -> bool:
        """The agent's ``tools`` allow list (globs); no list: every tool."""
        globs = run_store.run_options(run).get("tool_globs")
        return globs is None or any(fnmatch.fnmatchcase(tool, pattern) for pattern in globs)

    def refuse_prepared(self, row: Any, phase: ActionPhase, why: str) -> Any:
        """An action refused at prepare (invalid arguments, not allowed): terminal
        before it is ever executing, with a receipt and the reason the model sees."""
        if row["phase"] != ActionPhase.PREPARED:
            return row
        with self.ledger.tx():  # the terminal move and its receipt: one commit, one event
            action_store.move_action(self.ledger, row["action_id"], phase, error=why, reason=why)
            action_store.write_receipt(self.ledger, row["action_id"], self.features)
        return action_store.get_action(self.ledger, row["action_id"])

    async def wake(self, agent_id: str) -> None:
        slot = self.tree.slots.get(agent_id)
        if slot is not None:
            await self.tree.tell(agent_id, {"op": "wake"})

    async def wake_run(self, run_id: str) -> None:
        run = run_store.get_run(self.ledger, run_id)
        await self.wake(run["agent_id"])

    def is_read(self, tool: str) -> bool:
        found = self.tools.get(tool)
        return found is not None and found.schema.effect_class == "read"

    def _retry_schedule_changed(self) -> None:
        self.retry_changed.set()
        self.retry_changed = trio.Event()

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
            self._spool = sealed_input.spool_dir(self.home)  # made once, not per step
        return self._spool

    def _with_raw_copies(self, run_id: str, step: Step) -> None:
        """Replace the redacted copies in a step with the raw ones the agent acts on
        (the digests are the supervisor's: they do not leave with the step). A
        ``match``, not ``isinstance`` calls: this runs for every step."""
        match step:
            case ParseStep():
                digest, step.raw_sha256 = step.raw_sha256, None
                if digest:
                    name = sealed_input.raw_name(run_id, "response", step.slot)
                    step.response = sealed_input.load(self.spool, name, digest).decode()
            case PrepareStep():
                digest, step.plan_raw_sha256 = step.plan_raw_sha256, None
                if digest:
                    name = sealed_input.raw_name(run_id, "plan", str(step.loop))
                    raw_plan = json.loads(sealed_input.load(self.spool, name, digest))
                    step.input = raw_plan["actions"][step.index]["input"]
            case ExecuteStep():
                digest, step.raw_sha256 = step.raw_sha256, None
                if digest:
                    name = sealed_input.raw_name(run_id, "input", step.action_id)
                    step.input = json.loads(sealed_input.load(self.spool, name, digest))

    def keep_raw(self, run_id: str, kind: str, key: str, raw: Any, shown: Any) -> str | None:
        """A raw copy when redaction changed what is stored; its digest, else None."""
        if raw == shown:
            return None
        data = raw.encode() if isinstance(raw, str) else canonical_json(raw).encode()
        return sealed_input.keep(self.spool, sealed_input.raw_name(run_id, kind, key), data)

    def keep_raw_input(
        self, run_id: str, loop: int, index: int, tool_input: dict[str, Any], shown: Any = None
    ) -> str | None:
        """Every tool (built-in, user, MCP) prepares through this: the input as the tool
        will get it, kept privately when the ledger's copy (``shown``) is redacted."""
        the_id = action_id(run_id, loop, index)
        return self.keep_raw(run_id, "input", the_id, tool_input, redact(tool_input) if shown is None else shown)

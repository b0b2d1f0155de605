"""The collaboration policy (seed 004 V1.32, V1.37, V1.38): what a root agent owes its
team before it works alone. Pure: parsing, defaults, the first-wave rules, the v2
batch contract, the orchestration allow-list and the first-claim group rule. The
service (collaboration_service.py) reads the ledger and applies them.

``.corral/collaboration-policy.json`` in the project root::

    {"requiredInitialWave": "mixed", "minStaticDelegates": 1,
     "requiredStaticAgentIds": ["researcher"], "minIsolatedChildren": 2,
     "orchestratorOnlyAfterDelegation": true, "minIsolatedGroupsBeforeClaim": 2}

Missing file: the seed's defaults (``auto``, nothing required, orchestrator-only
after a delegation). The first collaboration batch of a root run that passes the
preflight freezes the policy for that run (a snapshot with a binding record, V1.38);
later edits of the file do not change it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict
from typing import Annotated, Any, Literal, Protocol

from pydantic import Field, StrictBool, StrictInt, StrictStr, model_validator
from pydantic.dataclasses import dataclass

from corral.core import strict_json
from corral.core.fingerprint import fingerprint
from corral.supervisor.spec.spec_base import SECTION, Reader, SpecError, problem

POLICY_FILE = ".corral/collaboration-policy.json"
WaveMode = Literal["auto", "static", "isolated", "mixed"]
#: The seed's native provider batch: the first wave's requirements must fit one
#: batch of at most three actions ("三项必须在单个最多 3 action 的 native Provider 批次内可满足").
MAX_WAVE_ACTIONS = 3
#: The supervisor's own agent id, which a required static specialist may not be.
SUPERVISOR_AGENT_ID = "project-supervisor"
COLLABORATION_TOOLS = frozenset({"agent.delegate", "agent.spawn_isolated"})
#: Reads, checkpoints and diffs: what a root may always do.
READ_TOOLS = frozenset({
    "fs.read", "fs.list", "project.index", "project.git_inspect", "project.git_status", "project.git_diff",
    "project.git_snapshot", "project.diff", "agent.action_history", "command.output_read", "image.inspect",
    "preview.validate",
})
#: What a root may do before its first wave without the wave being preflighted:
#: reads, ``project.verify`` and ``agent.run_status``; a plan update is no action
#: (an answer's ``planUpdate``), so it is never checked here ("普通读取、
#: project.verify、agent.run_status 和计划更新仍可进行"). Anything else, or a
#: collaboration tool, makes the whole plan a preflighted wave.
PRE_WAVE_TOOLS = READ_TOOLS | {"project.verify", "agent.run_status"}
#: What a root may still do after it delegated, under orchestratorOnlyAfterDelegation:
#: reads, checkpoint and diff reads, project.verify, watching and closing a process
#: (process.poll / process.terminate), its plan, goal and questions, agent.run_status,
#: new isolated checks and delegations (a repair among them), and the MCP tools that
#: declare themselves read-only (``reads``, below). Everything else (file writes,
#: changesets, restores, commits, commands, process starts and input, any other MCP
#: tool) is refused.
ORCHESTRATION_TOOLS = PRE_WAVE_TOOLS | COLLABORATION_TOOLS | {
    "process.poll", "process.terminate", "goal.verdict", "user.input_request",
}

#: The old name, still caught by the collaboration service.
PolicyError = SpecError


@dataclass(frozen=True, kw_only=True, config=SECTION)
class Policy:
    """``.corral/collaboration-policy.json``: what a root agent owes its team before it
    works alone. The file's own key names, as they are written there."""

    requiredInitialWave: WaveMode = Field(
        default="auto", description="The kind of first wave a root run owes: `auto` (only the minimums below),"
        " `static` (at least one delegation), `isolated` (at least one group of isolated children) or `mixed`"
        " (both).")
    minStaticDelegates: StrictInt = Field(
        default=0, ge=0, le=MAX_WAVE_ACTIONS, description="Initial `agent.delegate` calls the first wave must hold"
        " at least (a repair does not count).")
    requiredStaticAgentIds: tuple[Annotated[StrictStr, Field(min_length=1, max_length=64)], ...] = Field(
        default=(), max_length=MAX_WAVE_ACTIONS, description="Specialists the first wave must delegate to (not"
        " `project-supervisor`, not a `child-*` instance).")
    minIsolatedChildren: StrictInt = Field(
        default=0, ge=0, le=64, description="Isolated children one `agent.spawn_isolated` group of the first wave"
        " must hold at least (two smaller groups do not add up).")
    orchestratorOnlyAfterDelegation: StrictBool = Field(
        default=True, description="Once the root delegated or spawned, it only orchestrates: it reads, verifies,"
        " watches and stops processes, delegates, spawns children, checks runs, updates its plan or goal and asks"
        " the user; file writes, commands and commits are refused, and so are MCP tools except those whose"
        " server declares them readOnlyHint and not destructiveHint.")
    minIsolatedGroupsBeforeClaim: StrictInt = Field(
        default=0, ge=0, le=16, description="The root's first claim waits until it has this many isolated groups"
        " and the claimed batch holds this many ready groups; a final reply needs as many groups.")

    @model_validator(mode="after")
    def _satisfiable(self) -> Policy:
        for agent in self.requiredStaticAgentIds:
            if agent == SUPERVISOR_AGENT_ID or agent.startswith("child-"):
                raise problem(f"requiredStaticAgentIds: {agent!r} is not a static specialist")
        if len(set(self.requiredStaticAgentIds)) != len(self.requiredStaticAgentIds):
            raise problem("requiredStaticAgentIds: an agent is named twice")
        if wave_actions(self) > MAX_WAVE_ACTIONS:
            raise problem(f"the first wave this asks for needs {wave_actions(self)} actions; one provider batch"
                          f" holds at most {MAX_WAVE_ACTIONS}")
        return self

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["requiredStaticAgentIds"] = list(self.requiredStaticAgentIds)
        if not self.minIsolatedGroupsBeforeClaim:
            # Left out at zero (V1.37): a policy without it keeps its fingerprint.
            del data["minIsolatedGroupsBeforeClaim"]
        return data

    @property
    def digest(self) -> str:
        return strict_json.sha256(self.as_json())


_READER = Reader(Policy)


def parse(text: str) -> Policy:
    try:
        data = strict_json.loads(text)
    except strict_json.StrictJsonError as exc:
        raise PolicyError(f"not valid JSON: {exc.message}") from None
    return _READER.read(data)


def from_snapshot(data: Mapping[str, Any]) -> Policy:
    return Policy(**{**data, "requiredStaticAgentIds": tuple(data.get("requiredStaticAgentIds", ()))})


def static_needed(policy: Policy) -> int:
    """Initial delegations the first wave needs at least."""
    return max(policy.minStaticDelegates, len(policy.requiredStaticAgentIds),
               1 if policy.requiredInitialWave in ("static", "mixed") else 0)


def isolated_needed(policy: Policy) -> int:
    """Children one group of the first wave needs at least (0: no group needed)."""
    return max(policy.minIsolatedChildren, 1 if policy.requiredInitialWave in ("isolated", "mixed") else 0)


def wave_actions(policy: Policy) -> int:
    """The fewest actions a first wave meeting the policy can have."""
    return static_needed(policy) + (1 if isolated_needed(policy) else 0)


def wants_a_wave(policy: Policy) -> bool:
    return wave_actions(policy) > 0


def _initial_delegates(actions: Sequence[Mapping[str, Any]]) -> list[str]:
    """The agent ids of the plan's initial delegations (a repair_of is not one)."""
    return [str(a["input"].get("agent_id")) for a in actions
            if a.get("tool") == "agent.delegate" and not (a.get("input") or {}).get("repair_of")]


def _groups(actions: Sequence[Mapping[str, Any]]) -> list[int]:
    """The number of children of each ``agent.spawn_isolated`` of the plan."""
    spawns = (a for a in actions if a.get("tool") == "agent.spawn_isolated")
    return [len((a.get("input") or {}).get("children") or []) for a in spawns]


def wave_shortfalls(policy: Policy, actions: Sequence[Mapping[str, Any]]) -> list[str]:
    """What a plan's actions lack to be a valid first wave (none: it is one)."""
    delegates = _initial_delegates(actions)
    groups = _groups(actions)
    short = []
    static = static_needed(policy)
    if len(delegates) < static:
        short.append(f"{static} initial agent.delegate (this plan has {len(delegates)})")
    missing = [agent for agent in policy.requiredStaticAgentIds if agent not in delegates]
    if missing:
        short.append(f"a delegation to {', '.join(missing)}")
    children = isolated_needed(policy)
    if len(groups) > 1:
        short.append(f"one agent.spawn_isolated per batch at most (this plan has {len(groups)})")
    elif children and (not groups or groups[0] < children):
        short.append(f"one group of {children}+ isolated children (this plan's has {groups[0] if groups else 0})")
    return short


def needs_preflight(policy: Policy, plan: Mapping[str, Any], reads: Collection[str] = ()) -> bool:
    """Whether an unbound root's plan is checked as its first wave: it starts a
    collaboration, or (the policy asking for a wave) it changes the project, runs
    anything past reads (``reads``: the run's read-only MCP tools), verification,
    claims and plan updates, or ends the run."""
    actions = list(plan.get("actions") or [])
    if any(a.get("tool") in COLLABORATION_TOOLS for a in actions):
        return True
    if not wants_a_wave(policy):
        return False
    return plan.get("final") is not None or any(
        a.get("tool") not in PRE_WAVE_TOOLS and a.get("tool") not in reads for a in actions)


def spawn_refusal(tools: Sequence[str]) -> str | None:
    """One provider batch holds one ``agent.spawn_isolated`` at most, whatever the
    policy (V1.32: "单个 Provider 批次也最多包含一个 spawn"): a group is one spawn."""
    spawns = sum(1 for tool in tools if tool == "agent.spawn_isolated")
    return None if spawns <= 1 else f"one agent.spawn_isolated per batch at most (this plan has {spawns})"


def orchestration_refusal(policy: Policy, tools: Sequence[str], reads: Collection[str] = ()) -> str | None:
    """A collaboration batch that also asks for work the root may no longer do
    (orchestratorOnlyAfterDelegation): refused whole, before anything is prepared.
    ``reads``: the run's MCP tools that count as read-only (seed 004 V1.32: "MCP 只有
    同时声明 readOnlyHint=true 与 destructiveHint=false 才视为只读，破坏性或注解不完整的
    MCP 在首批原子预检和委派后执行阶段都失败关闭")."""
    if not policy.orchestratorOnlyAfterDelegation or not COLLABORATION_TOOLS.intersection(tools):
        return None
    barred = sorted({tool for tool in tools if tool not in ORCHESTRATION_TOOLS and tool not in reads})
    if not barred:
        return None
    return (f"{', '.join(barred)}: a batch that delegates or spawns only orchestrates"
            " (orchestratorOnlyAfterDelegation); let the specialists do that work")


def action_refusal(policy: Policy, tool: str, delegated: bool, reads: Collection[str] = ()) -> str | None:
    """One action of a root that already delegated or spawned: refused unless it
    orchestrates or is one of the run's read-only MCP tools (``reads``)."""
    if not delegated or not policy.orchestratorOnlyAfterDelegation or tool in ORCHESTRATION_TOOLS or tool in reads:
        return None
    return f"{tool}: after its first delegation this root only orchestrates (orchestratorOnlyAfterDelegation)"


# -- the v2 batch contract --------------------------------------------------------

BATCH_VERSION = 2


def batch_contract(policy: Policy, actions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a collaboration batch that passed its preflight commits to: the policy
    snapshot (and its fingerprint), the initial static specialists, the isolated
    children per group, and each collaboration member's index, tool and action
    fingerprint (the one its action row keeps, over the raw input)."""
    members = [{"index": index, "tool": str(a.get("tool")), "fingerprint": fingerprint(str(a.get("tool")),
                                                                                      a.get("input") or {})}
               for index, a in enumerate(actions) if a.get("tool") in COLLABORATION_TOOLS]
    return {"version": BATCH_VERSION, "policy": policy.as_json(), "policyFingerprint": policy.digest,
            "staticAgentIds": _initial_delegates(actions), "isolatedChildren": _groups(actions), "members": members}


def contract_fingerprint(contract: Mapping[str, Any]) -> str:
    return strict_json.sha256(dict(contract))


def batch_id(run_id: str, loop: int, contract_digest: str) -> str:
    """The batch's id binds the run, the loop and the contract: another contract is another batch."""
    return "pab2-" + strict_json.sha256({"run": run_id, "loop": loop, "contract": contract_digest})[:24]


class BatchRow(Protocol):
    """A stored v2 batch (the ``collaboration_batches`` row)."""

    def __getitem__(self, key: str, /) -> Any: ...


def member_refusal(batch: BatchRow | None, bound: Policy | None, run_id: str, loop: int, index: int, tool: str,
                   action_fingerprint: str) -> str | None:
    """Why a collaboration action may not take effect now (checked before its first
    effect and before every replay): no v2 batch holds it (a v1 batch), the stored
    contract is not the one its fingerprint names, its id does not bind it, its
    policy is not the run's bound snapshot, or the action (index, tool, input) is
    not one of its members. None: it may."""
    if batch is None:
        return "no v2 collaboration batch holds this action (a batch from before V1.32's contract)"
    contract = strict_json.loads(str(batch["contract"]))
    digest = contract_fingerprint(contract)
    if digest != batch["contract_fingerprint"] or batch["batch_id"] != batch_id(run_id, loop, digest):
        return f"collaboration batch {batch['batch_id']}: its id or fingerprint does not bind its contract"
    policy_digests = {contract.get("policyFingerprint"), batch["policy_fingerprint"], strict_json.sha256(
        contract.get("policy"))}
    if bound is None or policy_digests != {bound.digest}:
        return f"collaboration batch {batch['batch_id']}: its policy is not the run's bound snapshot"
    member = {"index": index, "tool": tool, "fingerprint": action_fingerprint}
    if member not in contract.get("members", []):
        return f"collaboration batch {batch['batch_id']}: this action is not one of its members"
    return None


# -- V1.37: the first claim -------------------------------------------------------


def claim_shortfall(policy: Policy, groups: int, ready_groups: int) -> str | None:
    """A root's first new claim: its established isolated groups and the ready
    groups the claim would take must each reach minIsolatedGroupsBeforeClaim."""
    need = policy.minIsolatedGroupsBeforeClaim
    if groups >= need and ready_groups >= need:
        return None
    return (f"the first claim waits for {need} isolated group(s) (minIsolatedGroupsBeforeClaim):"
            f" {groups} established, {ready_groups} ready in this claim; nothing was claimed")


def completion_shortfalls(policy: Policy, delegated_to: Sequence[str], group_sizes: Sequence[int]) -> list[str]:
    """What a root run's durable facts (its initial delegations' targets, its
    groups' sizes) lack for its final reply."""
    short = []
    static = static_needed(policy)
    if len(delegated_to) < static:
        short.append(f"the collaboration policy wants {static} initial delegation(s); this run made"
                     f" {len(delegated_to)}")
    missing = [agent for agent in policy.requiredStaticAgentIds if agent not in delegated_to]
    if missing:
        short.append(f"the collaboration policy wants a delegation to {', '.join(missing)}")
    children = isolated_needed(policy)
    if children and not any(size >= children for size in group_sizes):
        short.append(f"the collaboration policy wants a group of at least {children} isolated children")
    if len(group_sizes) < policy.minIsolatedGroupsBeforeClaim:
        short.append(f"the collaboration policy wants {policy.minIsolatedGroupsBeforeClaim} isolated group(s);"
                     f" this run has {len(group_sizes)}")
    return short

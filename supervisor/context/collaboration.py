"""The collaboration policy (seed 004 V1.32, V1.38; V1.37 only in part): what a root
agent owes its team before it works alone. Pure: parsing, defaults, and the checks.

What differs from the seed (docs/seed-004.md): ``requiredInitialWave`` is a boolean,
not V1.32's auto/static/isolated/mixed; isolated children are counted over all the
wave's spawns, not within one group; V1.37's ``minIsolatedGroupsBeforeClaim`` does
not exist (an unknown key is refused). What stands in for V1.37: with
``minIsolatedChildren`` set, the first claim waits until one group exists
(supervisor/context/collaboration_service.py).

``.corral/collaboration-policy.json`` in the project root::

    {"requiredInitialWave": true, "minStaticDelegates": 1,
     "requiredStaticAgentIds": ["researcher"], "minIsolatedChildren": 2,
     "orchestratorOnlyAfterDelegation": true}

Missing file: the safe defaults below (nothing required). The first valid
collaboration wave of a root run freezes the policy for that run (a snapshot with
a binding record); later edits of the file do not change it.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictInt, StrictStr
from pydantic.dataclasses import dataclass

from corral.core import strict_json
from corral.supervisor.spec.spec_base import SECTION, Reader, SpecError

POLICY_FILE = ".corral/collaboration-policy.json"
#: What a root may still do after it delegated, under orchestratorOnlyAfterDelegation.
ORCHESTRATION_TOOLS = frozenset({
    "agent.delegate", "agent.spawn_isolated", "agent.run_status", "goal.verdict",
    "user.input_request", "fs.read", "fs.list", "project.git_status", "project.git_diff",
})
COLLABORATION_TOOLS = frozenset({"agent.delegate", "agent.spawn_isolated"})

#: The old name, still caught by the collaboration service.
PolicyError = SpecError


@dataclass(frozen=True, kw_only=True, config=SECTION)
class Policy:
    """``.corral/collaboration-policy.json``: what a root agent owes its team before it
    works alone. The file's own key names, as they are written there."""

    requiredInitialWave: StrictBool = Field(
        default=False, description="A root run's first plan must be a collaboration wave (delegations or children).")
    minStaticDelegates: StrictInt = Field(
        default=0, ge=0, le=64, description="`agent.delegate` calls the first wave must hold at least.")
    requiredStaticAgentIds: tuple[Annotated[StrictStr, Field(min_length=1, max_length=64)], ...] = Field(
        default=(), description="Specialists the first wave must delegate to.")
    minIsolatedChildren: StrictInt = Field(
        default=0, ge=0, le=64, description="Isolated children the first wave must spawn at least.")
    orchestratorOnlyAfterDelegation: StrictBool = Field(
        default=False, description="Once the root delegated, it only orchestrates: it delegates, spawns children,"
        " checks runs, updates its plan or goal, asks the user and reads.")

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["requiredStaticAgentIds"] = list(self.requiredStaticAgentIds)
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


def from_snapshot(data: dict[str, Any]) -> Policy:
    return Policy(**{**data, "requiredStaticAgentIds": tuple(data.get("requiredStaticAgentIds", ()))})


def wave_shortfalls(policy: Policy, actions: list[dict[str, Any]]) -> list[str]:
    """What a plan's collaboration actions lack to be a valid first wave."""
    delegates = [a["input"].get("agent_id") for a in actions if a.get("tool") == "agent.delegate"]
    children = sum(len(a["input"].get("children") or []) for a in actions if a.get("tool") == "agent.spawn_isolated")
    short = []
    if len(delegates) < policy.minStaticDelegates:
        short.append(f"at least {policy.minStaticDelegates} agent.delegate call(s) (this plan has {len(delegates)})")
    missing = [agent for agent in policy.requiredStaticAgentIds if agent not in delegates]
    if missing:
        short.append(f"a delegation to {', '.join(missing)}")
    if children < policy.minIsolatedChildren:
        short.append(f"at least {policy.minIsolatedChildren} isolated children (this plan spawns {children})")
    return short


def wants_a_wave(policy: Policy) -> bool:
    return policy.requiredInitialWave or bool(
        policy.minStaticDelegates or policy.requiredStaticAgentIds or policy.minIsolatedChildren)

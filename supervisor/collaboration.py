"""The collaboration policy (seed 004 V1.32, V1.37, V1.38): what a root agent owes
its team before it works alone. Pure: parsing, defaults, and the checks.

``.corral/collaboration-policy.json`` in the project root::

    {"requiredInitialWave": true, "minStaticDelegates": 1,
     "requiredStaticAgentIds": ["researcher"], "minIsolatedChildren": 2,
     "orchestratorOnlyAfterDelegation": true}

Missing file: the safe defaults below (nothing required). The first valid
collaboration wave of a root run freezes the policy for that run (a snapshot with
a binding record); later edits of the file do not change it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from corral.core import strict_json

POLICY_FILE = ".corral/collaboration-policy.json"
#: What a root may still do after it delegated, under orchestratorOnlyAfterDelegation.
ORCHESTRATION_TOOLS = frozenset({
    "agent.delegate", "agent.spawn_isolated", "agent.run_status", "plan.update", "goal.verdict",
    "user.input_request", "fs.read", "fs.list", "project.git_status", "project.git_diff",
})
COLLABORATION_TOOLS = frozenset({"agent.delegate", "agent.spawn_isolated"})


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class Policy:
    """The file's own key names, as they are written there."""

    requiredInitialWave: bool = False
    minStaticDelegates: int = 0
    requiredStaticAgentIds: tuple[str, ...] = ()
    minIsolatedChildren: int = 0
    orchestratorOnlyAfterDelegation: bool = False

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["requiredStaticAgentIds"] = list(self.requiredStaticAgentIds)
        return data

    @property
    def digest(self) -> str:
        return strict_json.sha256(self.as_json())


def parse(text: str) -> Policy:
    try:
        data = strict_json.loads(text)
    except strict_json.StrictJsonError as exc:
        raise PolicyError(f"not valid JSON: {exc.message}") from None
    if not isinstance(data, dict):
        raise PolicyError("the policy is a JSON object")
    known = set(Policy.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise PolicyError(f"unknown keys {sorted(unknown)} (known: {sorted(known)})")
    for key in ("requiredInitialWave", "orchestratorOnlyAfterDelegation"):
        if key in data and not isinstance(data[key], bool):
            raise PolicyError(f"{key} must be true or false")
    for key in ("minStaticDelegates", "minIsolatedChildren"):
        value = data.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
            raise PolicyError(f"{key} must be an integer from 0 to 64")
    ids = data.get("requiredStaticAgentIds", [])
    if not isinstance(ids, list) or not all(isinstance(i, str) and 0 < len(i) <= 64 for i in ids):
        raise PolicyError("requiredStaticAgentIds must be a list of agent ids")
    return Policy(**{**data, "requiredStaticAgentIds": tuple(ids)})


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

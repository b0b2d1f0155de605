"""The swarm (supervisor/swarm/swarm_service.py): a run spawns isolated children,
delegates to a specialist, claims its deliveries and reads a delegation's contract.

The records check the shape; the spec's limits and the ledger's rules (a child's
template, overlapping write scopes, the 1-8 acceptance criteria, a repair's
contract) stay with the pure decisions (supervisor/swarm/swarm_decisions.py).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import UNSET, UnsetType

from corral.mailbox.protocol.base import Id, Method, Request

#: A model-written field (a task, a criterion): bounded so a frame stays whole.
Text = Annotated[str, msgspec.Meta(max_length=100_000)]
Name = Annotated[str, msgspec.Meta(max_length=200)]
Paths = Annotated[list[Annotated[str, msgspec.Meta(max_length=4096)]], msgspec.Meta(max_length=1000)]


# -- the replies: ledger views the swarm's tools hand the model whole (actors/tools/
# swarm.py encodes each back, ``msgspec.to_builtins``, to the JSON the map was).


class SpawnedChild(msgspec.Struct, kw_only=True):
    """One child of a spawned group, as the ledger holds it (children_store.py)."""

    delegation_id: str
    instance_id: str
    run_id: str
    template: str
    status: str


class GroupSpawned(msgspec.Struct, kw_only=True):
    """``swarm.spawn``'s reply: the group and its children (a replay: the same group)."""

    group_id: str
    children: list[SpawnedChild]


class Delegated(msgspec.Struct, kw_only=True):
    """``swarm.delegate``'s reply: the delegation, its run and the specialist it went to."""

    delegation_id: str
    run_id: str
    target: str


class ContractLine(msgspec.Struct, kw_only=True):
    """One claimed delegation in a claim's directory (delegation_store.py
    ``contracts_directory``): enough to find the one to read back whole."""

    delegation_id: str
    target_agent: str
    repair_of: str | None
    contract_status: str | None
    acceptance_criteria_count: int
    expected_artifacts_count: int


class JoinedChild(msgspec.Struct, kw_only=True):
    """One child of an earlier claimed join, summarized (claim_store.py ``claimed_joins``)."""

    instance_id: str | None
    template: str | None
    status: str | None
    summary: str


class ClaimedJoin(msgspec.Struct, kw_only=True):
    """An isolated group's join this run claimed earlier (seed 004 V1.9)."""

    group_id: str
    delivery_id: str
    claimed_by_action_id: str | None
    children: list[JoinedChild]
    more_children: int
    note: str


class Claimed(msgspec.Struct, kw_only=True):
    """``swarm.claim``'s reply (claim_store.py ``claim``): what this claim took, the
    work still open, and the earlier claims' summaries. Each claimed delivery is
    its ``delivery_id`` and ``kind`` with the receipt or join the ledger stored at
    its time, relayed whole: a map, so a field a later version adds to receipts
    leaves an older claim readable. A claim that took nothing has no directory of
    contracts (absent, ``UNSET``, as the map had no key)."""

    claim_id: str | None
    claimed: list[dict[str, Any]]
    open: int
    claimed_delegate_contracts: list[ContractLine] | UnsetType = UNSET
    claimed_isolated_joins: list[ClaimedJoin]


class Contract(msgspec.Struct, kw_only=True):
    """``swarm.contract``'s reply: one claimed delegation's whole contract and its
    delivered receipt (``delivery``, as the ledger stored it; never the task text)."""

    delegation_id: str
    target_agent: str
    acceptance_criteria: list[str]
    expected_artifacts: list[str]
    repair_of: str | None
    repaired_by: str | None
    delivery_id: str
    delivery_status: str
    terminal_status: str
    contract_status: str | None
    delivery: dict[str, Any]


class SpawnChild(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One isolated child of a spawn (``agent.spawn_isolated``'s ``children``)."""

    template: Name
    task: Text
    write_scopes: Paths
    acceptance_criteria: Text = ""
    expected_artifacts: Paths = msgspec.field(default_factory=list)


class SwarmSpawn(Request[GroupSpawned], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``swarm.spawn``: one group of isolated children for the executing action."""

    METHOD: ClassVar[Method] = Method.SWARM_SPAWN
    run_id: Id
    action_id: Id
    children: Annotated[list[SpawnChild], msgspec.Meta(max_length=1000)]
    join_mode: Literal["all"] = "all"


class SwarmDelegate(Request[Delegated], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``swarm.delegate``: a task for a specialist agent (or the one repair of a
    claimed delegation: ``repair_of``)."""

    METHOD: ClassVar[Method] = Method.SWARM_DELEGATE
    run_id: Id
    action_id: Id
    agent_id: Name
    task: Text
    acceptance_criteria: Annotated[list[Text], msgspec.Meta(max_length=1000)] | None = None
    expected_artifacts: Paths | None = None
    repair_of: Name | None = None


class SwarmClaim(Request[Claimed], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``swarm.claim``: the run's ready deliveries (these, or all), all or nothing."""

    METHOD: ClassVar[Method] = Method.SWARM_CLAIM
    run_id: Id
    action_id: Id
    delivery_ids: Annotated[list[Name], msgspec.Meta(max_length=1000)] | None = None


class SwarmContract(Request[Contract], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``swarm.contract``: one claimed delegation's contract and receipt."""

    METHOD: ClassVar[Method] = Method.SWARM_CONTRACT
    run_id: Id
    delegation_id: Id


#: The swarm's requests (the package's ``TypedRequest`` includes them).
SwarmRequest = SwarmSpawn | SwarmDelegate | SwarmClaim | SwarmContract

"""The swarm (supervisor/swarm/swarm_service.py): a run spawns isolated children,
delegates to a specialist, claims its deliveries and reads a delegation's contract.

The records check the shape; the spec's limits and the ledger's rules (a child's
template, overlapping write scopes, the 1-8 acceptance criteria, a repair's
contract) stay with the pure decisions (supervisor/swarm/swarm_decisions.py).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import msgspec

from corral.mailbox.protocol.base import Id, Method, Request

#: A model-written field (a task, a criterion): bounded so a frame stays whole.
Text = Annotated[str, msgspec.Meta(max_length=100_000)]
Name = Annotated[str, msgspec.Meta(max_length=200)]
Paths = Annotated[list[Annotated[str, msgspec.Meta(max_length=4096)]], msgspec.Meta(max_length=1000)]

Reply = dict[str, Any]


class SpawnChild(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One isolated child of a spawn (``agent.spawn_isolated``'s ``children``)."""

    template: Name
    task: Text
    write_scopes: Paths
    acceptance_criteria: Text = ""
    expected_artifacts: Paths = msgspec.field(default_factory=list)


class SwarmSpawn(Request[Reply], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``swarm.spawn``: one group of isolated children for the executing action."""

    METHOD: ClassVar[Method] = Method.SWARM_SPAWN
    run_id: Id
    action_id: Id
    children: Annotated[list[SpawnChild], msgspec.Meta(max_length=1000)]
    join_mode: Literal["all"] = "all"


class SwarmDelegate(Request[Reply], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
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


class SwarmClaim(Request[Reply], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``swarm.claim``: the run's ready deliveries (these, or all), all or nothing."""

    METHOD: ClassVar[Method] = Method.SWARM_CLAIM
    run_id: Id
    action_id: Id
    delivery_ids: Annotated[list[Name], msgspec.Meta(max_length=1000)] | None = None


class SwarmContract(Request[Reply], frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """``swarm.contract``: one claimed delegation's contract and receipt."""

    METHOD: ClassVar[Method] = Method.SWARM_CONTRACT
    run_id: Id
    delegation_id: Id


#: The swarm's requests (the package's ``TypedRequest`` includes them).
SwarmRequest = SwarmSpawn | SwarmDelegate | SwarmClaim | SwarmContract

"""The swarm layer on the supervisor: child actors, joins, delegation, claims,
tombstones, child timeouts, and the blockers they add to finalization.

Its ledger rules are children_store.py (spawn, results, joins), delegation_store.py,
claim_store.py and parent_work.py (open work, blockers, the tombstone)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import trio

from corral.actors.tools.base import OUTCOME_UNKNOWN
from corral.mailbox.protocol import (
    Ack,
    Claimed,
    Contract,
    Delegated,
    GroupSpawned,
    RunChildResult,
    SwarmClaim,
    SwarmContract,
    SwarmDelegate,
    SwarmSpawn,
)
from corral.mailbox.steps import CompactStep, ParkStep, ProviderStep
from corral.supervisor.errors import BadRequest, Refused
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import action_store, finalization, run_store
from corral.supervisor.runs.recovery import RecoveryReport
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.service_part import ServicePart, Task
from corral.supervisor.spec.swarm_spec import ActorSpec, GroupSpec, SwarmSpec, provider_env
from corral.supervisor.swarm import children_store, claim_store, coordination, delegation_store, parent_work
from corral.supervisor.swarm.swarm_state import ClaimPhase
from corral.supervisor.tree.actor_state import ActorState
from corral.supervisor.tree.restart_policy import RestartType, Strategy
from corral.supervisor.tree.supervision_tree import ActorSlot, SupervisionTree

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

CHILD_INTENSITY = (2, 30.0)


class CollaborationGate(Protocol):
    """The collaboration policy's part in the swarm's effects (supervisor/context/
    collaboration_service.py): a root's delegation or spawn must be a member of its
    batch's contract, and its first claim may have to wait for groups."""

    def member_check(self, run: Any, action: Any) -> str | None: ...

    def claim_check(self, run_id: str, ready_groups: int) -> str | None: ...


class SwarmService:
    def __init__(self, ledger: Ledger, tree: SupervisionTree, runs: RunService, spec: SwarmSpec,
                 collaboration: CollaborationGate | None = None) -> None:
        self.ledger = ledger
        #: The collaboration policy's checks before a root's delegation, spawn or first claim.
        self.collaboration = collaboration
        #: The child actors: declared, started, stopped when their run ends.
        self.tree = tree
        #: Which run a caller owns, and waking the agent a delivery or delegation concerns.
        self.runs = runs
        #: The supervisor's features: each sees the runs this service moves.
        self.features = runs.features
        #: The templates, specialists, policy and limits that spawns and delegations obey.
        self.spec = spec
        # Ledger hooks run inside transactions (sync); what must happen to processes
        # afterwards is queued here and done by one background task.
        self._send, self._receive = trio.open_memory_channel[tuple[str, str]](math.inf)
        self._timeouts_changed = trio.Event()

    # -- hooks inside ledger transactions ---------------------------------------------

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        if status not in TERMINAL:
            return
        run = run_store.get_run(ledger, run_id)
        if run["kind"] == "root":
            for instance in parent_work.tombstone(ledger, run_id, reason or status.value, self.features):
                self._send.send_nowait(("stop", instance))
            return
        if run["kind"] == "child":
            if status is not RunStatus.COMPLETED:
                ended = reason or status.value
                self._after_delivery(children_store.finish_child(ledger, run_id, None, ended, self.features), run)
            self._send.send_nowait(("stop", run["agent_id"]))
        elif run["kind"] == "delegation" and status is not RunStatus.COMPLETED:
            ended = reason or status.value
            self._after_delivery(delegation_store.finish_delegation(ledger, run_id, None, ended, self.features), run)

    def on_receipt(self, ledger: Ledger, action: Any) -> None:
        if action["tool"] == "agent.run_status":
            claim_store.observe_claim(ledger, action["action_id"])

    def park_for_join(self, ledger: Ledger, run_id: str) -> ParkStep | None:
        """A parent whose loop is done but whose children or delegations still run
        parks (lane released, no provider call) until the last of them delivers."""
        if parent_work.open_work(ledger, run_id) == 0:
            return None
        run_store.set_run_status(
            ledger,
            run_id,
            RunStatus.WAITING_FOR_JOIN,
            self.features,
            f"{parent_work.open_work(ledger, run_id)} group(s)/delegation(s) still running",
        )
        return ParkStep(status=RunStatus.WAITING_FOR_JOIN.value)

    def _after_delivery(self, delivery_id: str | None, child_run: Any) -> None:
        if delivery_id is None or child_run["parent_run_id"] is None:
            return
        parent = run_store.get_run(self.ledger, child_run["parent_run_id"])
        if parent["status"] == RunStatus.WAITING_FOR_JOIN and parent_work.open_work(self.ledger, parent["run_id"]) == 0:
            run_store.set_run_status(self.ledger, parent["run_id"], RunStatus.RUNNING, self.features, "joined")
            self._send.send_nowait(("wake", parent["agent_id"]))

    # -- actor methods --------------------------------------------------------------

    def _parent(self, slot: ActorSlot, run_id: str) -> Any:
        return self.runs.run_of(slot, run_id)

    def _action_id(self, action_id: str, run: Any) -> str:
        action = action_store.get_action(self.ledger, action_id)
        if action["run_id"] != run["run_id"] or action["phase"] != "executing":
            raise BadRequest(f"action {action_id} is not an executing action of this run")
        return action_id

    def _member(self, action_id: str, run: Any) -> str:
        """An executing delegation or spawn, checked against its batch's contract
        before its first effect and before a replay returns the first one (seed 004
        V1.32): when the contract does not hold it, nothing is created and its
        outcome is left to a person (``outcome-unknown``: needs-reconciliation)."""
        the_id = self._action_id(action_id, run)
        if self.collaboration is not None:
            why = self.collaboration.member_check(run, action_store.get_action(self.ledger, the_id))
            if why is not None:
                raise Refused(why, code=OUTCOME_UNKNOWN)
        return the_id

    async def spawn(self, slot: ActorSlot, request: SwarmSpawn) -> GroupSpawned:
        run = self._parent(slot, request.run_id)
        # The stores keep their ledger views (maps); each is checked into its
        # reply record here, once.
        view = children_store.spawn_group(
            self.ledger,
            self.spec,
            run,
            self._member(request.action_id, run),
            # As the agent sent them (a child's defaults left out): the pure checks
            # and the duplicate's digest read them so (swarm_decisions.plan_spawn).
            msgspec.to_builtins(request.children),
            request.join_mode,
            self.features,
        )
        spawned = msgspec.convert(view, GroupSpawned)
        for child in spawned.children:
            await self.start_child(child.instance_id)
        self._timeouts_changed.set()
        return spawned

    async def start_child(self, instance_id: str) -> None:
        slot = self.tree.slots.get(instance_id)
        if slot is not None:
            if slot.state is ActorState.STOPPED and self.tree.running and self._child_run_open(instance_id):
                await self.tree.start_actor(slot)  # declared, never (or no longer) running
            return
        group = GroupSpec(f"g-{instance_id}", Strategy.ONE_FOR_ONE, *CHILD_INTENSITY)
        self.tree.declare_group(group)
        spec = ActorSpec(
            id=instance_id,
            template="agent",
            group=group.id,
            restart=RestartType.TRANSIENT,
            shutdown_timeout_ms=2000,
            params={"agent_id": instance_id, "exit_when_idle": True},
            env_passthrough=self._child_env(instance_id),
        )
        if self.tree.running:
            await self.tree.add_actor(spec)
        else:
            self.tree.declare_actor(spec, dynamic=True)

    def _child_run_open(self, instance_id: str) -> bool:
        row = self.ledger.one(
            "SELECT r.status FROM children c JOIN runs r ON r.run_id = c.run_id WHERE c.instance_id = ?", instance_id
        )
        return row is not None and RunStatus(row["status"]) not in TERMINAL

    def _child_env(self, instance_id: str) -> tuple[str, ...]:
        row = self.ledger.one("SELECT template FROM children WHERE instance_id = ?", instance_id)
        try:
            template = self.spec.template(row["template"]) if row else None
        except KeyError:
            return ()
        return provider_env(template.provider, template.provider_config) if template else ()

    async def delegate(self, slot: ActorSlot, request: SwarmDelegate) -> Delegated:
        run = self._parent(slot, request.run_id)
        # An optional field left out is absent, not None (None would fail its check).
        fields: dict[str, Any] = msgspec.to_builtins(request)
        for envelope_field in ("run_id", "action_id"):
            fields.pop(envelope_field)
        action_id = self._member(request.action_id, run)
        reply = msgspec.convert(
            delegation_store.delegate(self.ledger, self.spec, run, action_id, fields, self.features), Delegated
        )
        await self.runs.wake(reply.target)
        return reply

    async def claim(self, slot: ActorSlot, request: SwarmClaim) -> Claimed:
        run = self._parent(slot, request.run_id)
        action_id = self._action_id(request.action_id, run)
        gate = self.collaboration
        first = None if gate is None or run["kind"] != "root" else (
            lambda ready: gate.claim_check(run["run_id"], ready))
        return msgspec.convert(claim_store.claim(self.ledger, run["run_id"], action_id, request.delivery_ids, first),
                               Claimed)

    async def contract(self, slot: ActorSlot, request: SwarmContract) -> Contract:
        """One claimed delegation's contract and receipt (``agent.run_status(delegation_id=...)``)."""
        run = self._parent(slot, request.run_id)
        return msgspec.convert(delegation_store.contract(self.ledger, run["run_id"], request.delegation_id), Contract)

    async def child_result(self, slot: ActorSlot, request: RunChildResult) -> Ack:
        run = self._parent(slot, request.run_id)
        summary = request.reply or ""
        blockers = finalization.blockers(self.ledger, run["run_id"], self.runs.features)
        error = ("ended with open work: " + "; ".join(blockers)) if blockers else None
        if run["kind"] == "child":
            delivery = children_store.finish_child(self.ledger, run["run_id"], summary, error, self.features)
        elif run["kind"] == "delegation":
            delivery = delegation_store.finish_delegation(self.ledger, run["run_id"], summary, error, self.features)
        else:
            raise BadRequest("a root run writes a final reply, not a child result")
        self._after_delivery(delivery, run)
        return Ack()

    # -- background: stops, wakes, timeouts, escalations ------------------------------

    async def worker(self) -> None:
        async for op, target in self._receive:
            if op == "stop" and target in self.tree.slots:
                await self.tree.stop_actor(self.tree.slots[target], reason="run ended")
            elif op == "wake":
                await self.runs.wake(target)

    async def watchdog(self) -> None:
        """Children that run past child_timeout_s yield a failed result."""
        limit = self.spec.limits.child_timeout_s
        while True:
            now = time.time()
            earliest = math.inf
            for child in children_store.children_to_run(self.ledger):
                deadline = child["created_at"] + limit
                if deadline <= now:
                    run_store.set_run_status(
                        self.ledger, child["run_id"], RunStatus.FAILED, self.features, f"timed out after {limit}s"
                    )
                else:
                    earliest = min(earliest, deadline)
            changed = self._timeouts_changed = trio.Event()
            with trio.move_on_after(max(0.0, earliest - time.time()) if earliest != math.inf else math.inf):
                await changed.wait()

    async def on_escalated(self, group_id: str) -> None:
        if not group_id.startswith("g-child-"):
            return
        instance = group_id[2:]
        child = self.ledger.one("SELECT run_id, status FROM children WHERE instance_id = ?", instance)
        if child is not None and child["status"] != "terminal":
            run_store.set_run_status(
                self.ledger,
                child["run_id"],
                RunStatus.FAILED,
                self.features,
                "the child crashed past its restart intensity",
            )

    # -- recovery -------------------------------------------------------------------

    def recover(self, ledger: Ledger, report: RecoveryReport) -> None:
        for row in ledger.all("SELECT claim_id FROM claim_journal WHERE phase = ?", ClaimPhase.PREPARED.value):
            try:
                claim_store.commit_claim(ledger, row["claim_id"])
            except Exception as exc:  # a lost race: the claim stays prepared and is refused on replay
                report.notes.append(f"claim {row['claim_id']}: {exc}")
        for row in ledger.all(
            "SELECT c.run_id, r.status, r.reason FROM children c JOIN runs r ON r.run_id = c.run_id"
            " WHERE c.status != 'terminal' AND r.status IN ('failed', 'cancelled')"
        ):
            children_store.finish_child(ledger, row["run_id"], None, row["reason"] or row["status"], self.features)
        for row in ledger.all(
            "SELECT run_id FROM runs WHERE status = 'waiting-for-join' AND run_id NOT IN"
            " (SELECT parent_run_id FROM isolated_groups WHERE status = 'open')"
            " AND run_id NOT IN (SELECT parent_run_id FROM delegations WHERE status != 'terminal')"
        ):
            run_store.set_run_status(ledger, row["run_id"], RunStatus.RUNNING, self.features, "joined during recovery")

    async def restart_children(self) -> None:
        for child in children_store.children_to_run(self.ledger):
            await self.start_child(child["instance_id"])

    def show_section(self, run_id: str) -> dict[str, Any]:
        groups = []
        for group in self.ledger.all("SELECT * FROM isolated_groups WHERE parent_run_id = ?", run_id):
            children = self.ledger.all(
                "SELECT delegation_id, instance_id, template, run_id, status, result"
                " FROM children WHERE group_id = ? ORDER BY idx",
                group["group_id"],
            )
            groups.append(
                {
                    "group_id": group["group_id"],
                    "status": group["status"],
                    "children": [
                        {**dict(c), "result": json.loads(c["result"]) if c["result"] else None} for c in children
                    ],
                }
            )
        delegations = [
            {**dict(d), "result": json.loads(d["result"]) if d["result"] else None}
            for d in self.ledger.all(
                "SELECT delegation_id, target_agent, repair_of, run_id, status, result"
                " FROM delegations WHERE parent_run_id = ? ORDER BY created_at",
                run_id,
            )
        ]
        deliveries = [
            dict(d)
            for d in self.ledger.all(
                "SELECT delivery_id, kind, source_id, status, claimed_by_action_id, claim_id FROM deliveries"
                " WHERE parent_run_id = ? ORDER BY created_at",
                run_id,
            )
        ]
        claims = [
            dict(c)
            for c in self.ledger.all(
                "SELECT claim_id, action_id, delivery_ids, phase FROM claim_journal WHERE parent_run_id = ?",
                run_id,
            )
        ]
        return {"groups": groups, "delegations": delegations, "deliveries": deliveries, "claims": claims}


class SwarmFeature(RunFeature):
    """The swarm's part in runs: children and delegations follow their parents'
    status and receipts, a loop waits for a join, a parent finalizes after its
    children, recovery restarts the work, ``show`` lists the swarm."""

    def __init__(self, service: SwarmService) -> None:
        self.service = service

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        self.service.on_status(ledger, run_id, status, reason)

    def on_receipt(self, ledger: Ledger, row: Any) -> None:
        self.service.on_receipt(ledger, row)

    def loop_blocker(self, ledger: Ledger, run_id: str) -> ParkStep | None:
        return self.service.park_for_join(ledger, run_id)

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        return parent_work.blockers(ledger, run_id)

    async def shape_provider(self, run_id: str, step: ProviderStep) -> ProviderStep | CompactStep:
        """A parent's task carries its delegations' state (supervisor/swarm/coordination.py);
        past its claims, its turn is a closing one, which never searches (seed 004 V1.20:
        "不能在收束阶段再次引入新的网页事实或额外搜索计费")."""
        ledger = self.service.ledger
        text = coordination.note(ledger, run_id, self.service.runs.features)
        if text is None:
            return step  # it delegated nothing and claimed no join: nothing to close
        return msgspec.structs.replace(step, task=step.task + text, closing=parent_work.past_claims(ledger, run_id))

    def recover(self, ledger: Ledger, report: RecoveryReport) -> None:
        self.service.recover(ledger, report)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"swarm": self.service.show_section(run_id)}


class SwarmPart(ServicePart):
    """The swarm's part in the supervisor's life: children restarted at boot, its
    worker and watchdog."""

    def __init__(self, service: SwarmService) -> None:
        self.service = service

    async def recover(self) -> None:
        await self.service.restart_children()

    def tasks(self) -> Sequence[Task]:
        return (self.service.worker, self.service.watchdog)


def install(sup: Supervisor) -> SwarmService:
    service = SwarmService(sup.ledger, sup.tree, sup.runs, sup.spec, sup.collaboration)
    sup.methods.swarm = service
    sup.tree.on_escalated.append(service.on_escalated)
    return service

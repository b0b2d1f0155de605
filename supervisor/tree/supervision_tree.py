"""The supervision tree at run time: launches actors, watches their pidfds, and
applies restart types, strategies, intensity and backoff (decided in
``restart_policy``) when one exits.

Every incarnation of an actor is one task in the tree's nursery that owns the
actor's socket, its channel reader, its message handler and its exit watcher.

The messages of a running actor (its hello, requests to the supervisor, routing
between actors) are supervisor/tree/actor_messages.py.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from corral.mailbox.actor_config import ActorConfig
from corral.mailbox.addresses import ipc_address, tcp_loopback_address
from corral.mailbox.channel import Channel
from corral.mailbox.envelope import HEARTBEAT, Envelope, Kind
from corral.mailbox.link_nng import lift_open_files_limit
from corral.mailbox.transport import Link, LinkKind, Listener, transport_of
from corral.sandbox.launcher import (
    EXIT_FORKSERVER_LOST,
    EXIT_UNKNOWN,
    ActorProcess,
    Launcher,
    LaunchError,
    LaunchRequest,
)
from corral.supervisor.errors import StorageFull
from corral.supervisor.ledger.port import Ledger, dumps
from corral.supervisor.spec.swarm_spec import ActorSpec, GroupSpec, SupervisorSettings
from corral.supervisor.tree.actor_messages import SUPERVISOR, ActorMessages, MessageHandler, send_or_drop
from corral.supervisor.tree.actor_state import ActorState, check_transition
from corral.supervisor.tree.ledger_outage import OutageMemory, wait_for_ledger
from corral.supervisor.tree.restart_policy import (
    Intensity,
    backoff_delay,
    plan_restart,
    should_restart,
)
from corral.supervisor.tree.stall_watchdog import StallWatchdog

log = logging.getLogger("corral.tree")

HELLO_TIMEOUT_S = 30.0


@dataclass
class ActorSlot:
    spec: ActorSpec
    state: ActorState = ActorState.STOPPED
    incarnation: int = 0
    restarts: int = 0
    process: ActorProcess | None = None
    channel: Channel | None = None
    ready: trio.Event = field(default_factory=trio.Event)
    exited: trio.Event = field(default_factory=trio.Event)
    last_exit: int | None = None
    started_at: float = 0.0
    ready_at: float = 0.0
    dynamic: bool = False
    #: trio time of the last message (a heartbeat included) from this incarnation.
    last_seen: float = 0.0
    #: Since when (trio time) it has been silent past half the stall timeout, or 0.
    stalled_since: float = 0.0

    @property
    def id(self) -> str:
        return self.spec.id

    def move(self, new: ActorState) -> None:
        self.state = check_transition(self.state, new)


@dataclass
class GroupRuntime:
    spec: GroupSpec
    intensity: Intensity
    order: list[str] = field(default_factory=list)
    lock: trio.Lock = field(default_factory=trio.Lock)
    status: str = "running"
    reason: str | None = None
    #: Its members' exits while the ledger was away (supervisor/tree/ledger_outage.py).
    outage: OutageMemory = field(default_factory=OutageMemory)


class SupervisionTree:
    def __init__(
        self,
        home: Path,
        ledger: Ledger,
        launcher: Launcher,
        settings: SupervisorSettings,
        token: str,
        handler: MessageHandler,
        *,
        supervisor_pid: int,
        failpoint_spec: str = "",
    ) -> None:
        self.home = home
        self.ledger = ledger
        self.launcher = launcher
        self.settings = settings
        self.supervisor_pid = supervisor_pid
        self.failpoint_spec = failpoint_spec
        self.slots: dict[str, ActorSlot] = {}
        #: What running actors say to the supervisor and to each other.
        self.messages = ActorMessages(self.slots, ledger, token, handler)
        self.groups: dict[str, GroupRuntime] = {}
        self._addresses = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self._rng = random.Random()
        self.shutting_down = False
        self.changed = trio.Event()
        #: Called with the group id after a group gave up (restart intensity exceeded).
        self.on_escalated: list[Callable[[str], Awaitable[None]]] = []
        #: Called when an incarnation ended, before any restart: (slot, exit code,
        #: crashed), crashed meaning it was not asked to stop and did not die with
        #: its fork server (e.g. charge the crash to the actions it was running).
        self.on_exit: list[Callable[[ActorSlot, int, bool], None]] = []

    # -- declaration --------------------------------------------------------------

    def declare_group(self, spec: GroupSpec) -> GroupRuntime:
        group = GroupRuntime(spec, Intensity(spec.max_restarts, spec.period_s))
        self.groups[spec.id] = group
        with self.ledger.tx() as db:
            db.execute(
                "INSERT INTO groups (group_id, strategy, status, reason, boot_id, updated_at)"
                " VALUES (?, ?, 'running', NULL, ?, ?) ON CONFLICT(group_id) DO UPDATE SET"
                " strategy = excluded.strategy, status = 'running', reason = NULL,"
                " boot_id = excluded.boot_id, updated_at = excluded.updated_at",
                (spec.id, spec.strategy.value, self.ledger.boot_id, time.time()),
            )
        return group

    def declare_actor(self, spec: ActorSpec, *, dynamic: bool = False) -> ActorSlot:
        if spec.id in self.slots:
            raise ValueError(f"actor {spec.id!r} already exists")
        slot = ActorSlot(spec, dynamic=dynamic)
        # The row first: on a full disk the caller gets disk-full and no half-declared slot.
        with self.ledger.tx() as db:
            db.execute(
                "INSERT INTO actors (actor_id, group_id, template, spec_json, status, restarts,"
                " incarnation, boot_id, updated_at) VALUES (?, ?, ?, ?, 'stopped', 0, 0, ?, ?)"
                " ON CONFLICT(actor_id) DO UPDATE SET group_id = excluded.group_id,"
                " template = excluded.template, spec_json = excluded.spec_json,"
                " status = 'stopped', restarts = 0, incarnation = 0, pid = NULL,"
                " boot_id = excluded.boot_id, updated_at = excluded.updated_at",
                (
                    spec.id,
                    spec.group,
                    spec.template,
                    dumps(_spec_json(spec)),
                    self.ledger.boot_id,
                    time.time(),
                ),
            )
        self.slots[spec.id] = slot
        self.groups[spec.group].order.append(spec.id)
        return slot

    # -- running ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._nursery is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.settings.transport == "nng":
            lift_open_files_limit()  # ~6 descriptors per actor link, not 1
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # Launch requests go out in declaration order (the launcher's lock is
            # FIFO) but without waiting for each reply: the fork server forks one
            # after another while the supervisor sets up the next socket.
            async with trio.open_nursery() as starters:
                for group in self.groups.values():
                    for actor_id in list(group.order):
                        starters.start_soon(self.start_actor, self.slots[actor_id])
            task_status.started()
            await StallWatchdog(
                self.slots, self.launcher, self.settings.stall_timeout_s, record=self._record, event=self._event
            ).run()

    def heartbeat_interval(self) -> float:
        """Ten beats per stall timeout, at most one every 5 s: a beat costs the
        supervisor ~160 µs of CPU (measured on the liveness branch), so 200 actors
        beating every second took 5 % of a core; at the default 30 s, every 3 s."""
        return min(5.0, self.settings.stall_timeout_s / 10)

    def start_soon(self, task: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """A task in the tree's nursery (it outlives any one incarnation)."""
        assert self._nursery is not None, "tree is not running"
        self._nursery.start_soon(task, *args)

    def _event(self, kind: str, subject: str, **data: Any) -> None:
        """An event that guards nothing (a full disk only loses it)."""
        try:
            with self.ledger.tx(fsync=False):
                self.ledger.event(kind, subject, **data)
        except StorageFull as exc:
            log.warning("%s not recorded: %s", kind, exc)

    async def start_actor(self, slot: ActorSlot) -> None:
        assert self._nursery is not None, "tree is not running"
        slot.move(ActorState.STARTING)
        slot.incarnation += 1
        slot.ready = trio.Event()
        slot.exited = trio.Event()
        slot.started_at = time.monotonic()
        channel = Channel(SUPERVISOR, max_frame=self.settings.max_frame, inbox_size=self.settings.inbox_size)
        link_kind: LinkKind = "nng" if self.settings.transport == "nng" else "stream"
        # The incarnation's own: a local user who connects first cannot take its link.
        link_secret = secrets.token_bytes(32)
        listener = transport_of(link_kind).listen(self._address(), channel.hard_limit, link_secret)
        try:
            address = listener.address
            config: ActorConfig = {
                "actor_id": slot.id,
                "incarnation": slot.incarnation,
                "template": slot.spec.template,
                "address": address,
                "link": link_kind,
                "link_secret": link_secret.hex(),
                "params": slot.spec.params,
                "home": str(self.home),
                "max_frame": self.settings.max_frame,
                "inbox_size": self.settings.inbox_size,
                "supervisor_pid": self.supervisor_pid,
                "failpoints": self.failpoint_spec,
                "heartbeat_interval_s": self.heartbeat_interval(),
            }
            env = {"CORRAL_FAILPOINT_DIR": str(self.home / "failpoints")}
            env.update({name: os.environ[name] for name in slot.spec.env_passthrough if name in os.environ})
            process = await self.launcher.launch(
                # The launcher carries the config unread, as a plain map.
                LaunchRequest(slot.id, dict(config), self.home / "logs" / f"{slot.id}.log", env)
            )
        except LaunchError as exc:
            # A start that fails (a fork server stopped past the launch timeout) counts
            # as a crash of that incarnation: policy, intensity and backoff decide next.
            listener.close()
            log.warning("%s: launch failed: %s", slot.id, exc)
            self._record(slot, event="actor-launch-failed", error=str(exc))
            self._nursery.start_soon(self._on_exit, slot, slot.incarnation, EXIT_UNKNOWN)
            return
        except BaseException:
            listener.close()
            raise
        slot.process = process
        slot.channel = channel
        self._record(slot, pid=process.pid, event="actor-started")
        self._nursery.start_soon(self._incarnation, slot, slot.incarnation, listener, channel, process)

    def _address(self) -> str:
        if self.settings.transport == "tcp":
            return tcp_loopback_address(0)
        return ipc_address(self.home / "s" / f"a{next(self._addresses)}.ipc")

    async def _incarnation(
        self, slot: ActorSlot, incarnation: int, listener: Listener, channel: Channel, process: ActorProcess
    ) -> None:
        async def accept() -> Link | None:
            # The actor dials in once; one that never does is killed by _serve.
            with trio.move_on_after(HELLO_TIMEOUT_S):
                try:
                    return await listener.accept()
                except OSError as exc:
                    log.warning("%s: its link failed to connect: %s", slot.id, exc)
            return None

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(channel.run_reader, accept)
                nursery.start_soon(self._serve, slot, channel, process)
                code = await process.wait()
                nursery.cancel_scope.cancel()
        finally:
            listener.close()
            channel.close()
            process.close()
        await self._on_exit(slot, incarnation, code)

    async def _serve(self, slot: ActorSlot, channel: Channel, process: ActorProcess) -> None:
        hello: Envelope | None = None
        with trio.move_on_after(HELLO_TIMEOUT_S):
            try:
                hello = await channel.inbox.receive()
            except trio.EndOfChannel:
                pass  # the link never came up, or closed before a word
        if hello is None or not self.messages.accept_hello(slot, hello):
            log.warning("%s: no valid hello; killing it", slot.id)
            process.kill_group()
            return
        await channel.send(
            Envelope(Kind.WELCOME, SUPERVISOR, slot.id, {"boot_id": self.ledger.boot_id}, corr_id=hello.msg_id)
        )
        slot.ready_at = time.monotonic()
        if slot.state is ActorState.STOPPING:
            # Asked to stop while it was still starting: welcome it, then repeat the
            # shutdown it may have missed; it never counts as running.
            slot.ready.set()
            await send_or_drop(channel.tell(slot.id, {"op": "shutdown", "reason": "stopped while starting"}))
        else:
            slot.move(ActorState.RUNNING)
            self._record(slot, pid=process.pid, event="actor-ready")
            slot.ready.set()
        assert self._nursery is not None
        slot.last_seen = trio.current_time()
        async for envelope in channel.inbox:
            slot.last_seen = trio.current_time()
            if slot.stalled_since:
                slot.stalled_since = 0.0
                self._record(slot, event="actor-unstalled")
            if envelope.kind is Kind.TELL and envelope.body.get("op") == HEARTBEAT:
                continue
            if envelope.kind is Kind.REQUEST:
                # In the tree's nursery, not this incarnation's: work the supervisor
                # does on an actor's behalf (a spawn, a claim) must not be cancelled
                # halfway because that actor died; the reply is simply undeliverable.
                self._nursery.start_soon(self.messages.dispatch, slot, channel, envelope)
            else:
                await self.messages.dispatch(slot, channel, envelope)

    # -- exits and restarts -------------------------------------------------------

    async def _on_exit(self, slot: ActorSlot, incarnation: int, code: int) -> None:
        if incarnation != slot.incarnation:
            return
        slot.last_exit = code
        slot.channel = None
        slot.process = None
        group = self.groups[slot.spec.group]
        asked_to_stop = slot.state is ActorState.STOPPING or self.shutting_down or group.status != "running"
        # Dying with its fork server (replaced: it stopped answering) is no crash of its own.
        collateral = code == EXIT_FORKSERVER_LOST
        for hook in self.on_exit:
            hook(slot, code, not asked_to_stop and not collateral)
        group.outage.saw_exit(self.ledger, time.monotonic())
        if asked_to_stop:
            if slot.state is not ActorState.ESCALATED:
                slot.move(ActorState.STOPPED)
            self._record(slot, exit_code=code, event="actor-stopped")
            slot.exited.set()
            return
        if not should_restart(slot.spec.restart, code):
            slot.move(ActorState.STOPPED)
            self._record(slot, exit_code=code, event="actor-exited", restart=False)
            slot.exited.set()
            self._changed()
            return
        slot.move(ActorState.RESTARTING)
        self._record(slot, exit_code=code, event="actor-exited", restart=True)
        slot.exited.set()
        async with group.lock:
            if slot.state is not ActorState.RESTARTING or group.status != "running":
                return
            now = time.monotonic()
            if not collateral and group.intensity.record(now):
                if group.outage.blames_outage(self.ledger, now, group.spec.period_s):
                    await wait_for_ledger(self, group, slot, code)  # not its fault: it resumes
                else:
                    await self._escalate(group, slot, code)
                return
            plan = plan_restart(group.spec.strategy, group.order, slot.id)
            for sibling_id in plan.stop:
                await self.stop_actor(self.slots[sibling_id], reason=f"{group.spec.strategy} restart")
            delay = backoff_delay(
                group.intensity.recent,
                slot.spec.backoff_base_ms / 1000,
                slot.spec.backoff_max_ms / 1000,
                slot.spec.backoff_jitter,
                self._rng,
            )
            if delay:
                await trio.sleep(delay)
            for actor_id in plan.start:
                target = self.slots[actor_id]
                if target.state in (ActorState.STOPPED, ActorState.RESTARTING):
                    if target.state is ActorState.STOPPED:
                        target.move(ActorState.RESTARTING)
                    target.restarts += 1
                    await self.start_actor(target)
                    self._record(target, event="actor-restarted", trigger=slot.id, delay_ms=round(delay * 1000, 1))
        self._changed()

    async def _escalate(self, group: GroupRuntime, trigger: ActorSlot, code: int) -> None:
        reason = (
            f"restart intensity exceeded: more than {group.spec.max_restarts} restarts within"
            f" {group.spec.period_s}s (last: {trigger.id} exited with {code})"
        )
        group.status = "escalated"
        group.reason = reason
        try:
            with self.ledger.tx() as db:
                db.execute(
                    "UPDATE groups SET status = 'escalated', reason = ?, updated_at = ? WHERE group_id = ?",
                    (reason, time.time(), group.spec.id),
                )
                self.ledger.event("group-escalated", group.spec.id, reason=reason, trigger=trigger.id)
        except StorageFull as exc:
            # The escalation happens all the same; only its record waits for space.
            log.warning("group %s escalated, not recorded: %s", group.spec.id, exc)
        for actor_id in reversed(group.order):
            await self.stop_actor(self.slots[actor_id], reason="group escalated")
            target = self.slots[actor_id]
            if target.state is not ActorState.ESCALATED:
                target.state = ActorState.ESCALATED  # terminal for this boot, whatever it was
            self._record(target, event="actor-escalated")
        self._changed()
        for callback in self.on_escalated:
            await callback(group.spec.id)

    async def stop_actor(self, slot: ActorSlot, reason: str = "shutdown") -> None:
        """Graceful stop by the actor's shutdown spec, then SIGKILL."""
        if slot.state in (ActorState.STOPPED, ActorState.ESCALATED, ActorState.RESTARTING):
            if slot.state is ActorState.RESTARTING:
                slot.move(ActorState.STOPPED)
            return
        if slot.state is not ActorState.STOPPING:
            slot.move(ActorState.STOPPING)
        self._record(slot, event="actor-stopping", reason=reason)
        channel, process, exited = slot.channel, slot.process, slot.exited
        if channel is not None:
            with trio.move_on_after(0.5):
                await send_or_drop(channel.tell(slot.id, {"op": "shutdown", "reason": reason}))
        with trio.move_on_after(slot.spec.shutdown_timeout_ms / 1000):
            await exited.wait()
        if not exited.is_set() and process is not None:
            self._record(slot, event="actor-killed", reason="shutdown timeout")
            process.kill_group(signal.SIGKILL)
            await exited.wait()

    async def kill_actor(self, actor_id: str) -> None:
        slot = self.slots[actor_id]
        if slot.process is not None:
            slot.process.send_signal(signal.SIGKILL)

    async def shutdown(self) -> None:
        self.shutting_down = True
        for group in reversed(list(self.groups.values())):
            for actor_id in reversed(group.order):
                await self.stop_actor(self.slots[actor_id])

    # -- dynamic actors, and the supervisor's requests ----------------------------

    async def add_actor(self, spec: ActorSpec) -> ActorSlot:
        slot = self.declare_actor(spec, dynamic=True)
        await self.start_actor(slot)
        return slot

    async def request(self, actor_id: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """A request from the supervisor to a running actor (ChannelClosed when it is not)."""
        return await self.messages.request(actor_id, body, timeout)

    async def tell(self, actor_id: str, body: dict[str, Any]) -> bool:
        """A tell to a running actor; False when it could not be delivered."""
        return await self.messages.tell(actor_id, body)

    def snapshot(self) -> dict[str, Any]:
        return {
            "groups": [
                {
                    "id": g.spec.id,
                    "strategy": g.spec.strategy.value,
                    "status": g.status,
                    "reason": g.reason,
                    "actors": list(g.order),
                }
                for g in self.groups.values()
            ],
            "actors": [
                {
                    "id": s.id,
                    "group": s.spec.group,
                    "template": s.spec.template,
                    "status": s.state.value,
                    "pid": s.process.pid if s.process else None,
                    "restarts": s.restarts,
                    "incarnation": s.incarnation,
                    "last_exit": s.last_exit,
                    "restart": s.spec.restart.value,
                    "stalled_s": round(trio.current_time() - s.stalled_since, 1) if s.stalled_since else None,
                }
                for s in self.slots.values()
            ],
        }

    def live_actors(self) -> list[str]:
        return [s.id for s in self.slots.values() if s.process is not None]

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def _record(
        self,
        slot: ActorSlot,
        *,
        event: str,
        pid: int | None = None,
        exit_code: int | None = None,
        **data: Any,
    ) -> None:
        try:
            self._write_record(slot, event, pid, exit_code, data)
        except StorageFull as exc:
            # Bookkeeping only (it guards no side effect): supervision goes on, and
            # the next record after the disk has room brings the row up to date.
            log.warning("%s: %s not recorded: %s", slot.id, event, exc)

    def _write_record(
        self, slot: ActorSlot, event: str, pid: int | None, exit_code: int | None, data: dict[str, Any]
    ) -> None:
        now = time.time()
        with self.ledger.tx(fsync=False) as db:
            db.execute(
                "UPDATE actors SET status = ?, restarts = ?, incarnation = ?, pid = ?,"
                " last_exit = COALESCE(?, last_exit), last_exit_at = CASE WHEN ? IS NULL"
                " THEN last_exit_at ELSE ? END, updated_at = ? WHERE actor_id = ?",
                (
                    slot.state.value,
                    slot.restarts,
                    slot.incarnation,
                    slot.process.pid if slot.process else None,
                    exit_code,
                    exit_code,
                    now,
                    now,
                    slot.id,
                ),
            )
            extra = {"incarnation": slot.incarnation, **data}
            if pid is not None:
                extra["pid"] = pid
            if exit_code is not None:
                extra["exit_code"] = exit_code
            self.ledger.event(event, slot.id, **extra)


def _spec_json(spec: ActorSpec) -> dict[str, Any]:
    return {
        "template": spec.template,
        "group": spec.group,
        "restart": spec.restart.value,
        "shutdown_timeout_ms": spec.shutdown_timeout_ms,
        "backoff_base_ms": spec.backoff_base_ms,
        "backoff_max_ms": spec.backoff_max_ms,
    }

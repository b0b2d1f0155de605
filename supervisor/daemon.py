"""The supervisor daemon: boot, recovery, the tree, the control API, shutdown."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from corral import PROTOCOL_VERSION
from corral.core import failpoints, redact
from corral.core.redact import register_secret
from corral.mailbox import protocol
from corral.mailbox.addresses import ipc_address, tcp_loopback_address
from corral.mailbox.control import ControlError, ControlServer
from corral.mailbox.envelope import Envelope
from corral.mailbox.errors import ChannelClosed
from corral.sandbox.guard_record import recover_home
from corral.sandbox.launcher import LaunchMode, make_launcher
from corral.supervisor import actor_dispatch, probes
from corral.supervisor.actor_methods import ActorMethods
from corral.supervisor.bridge import bridge_service
from corral.supervisor.bridge.bridge_service import BridgeService
from corral.supervisor.cluster import cluster_reads, node_service
from corral.supervisor.context import collaboration_service, repo_fingerprint_service
from corral.supervisor.context.collaboration_service import CollaborationService
from corral.supervisor.errors import StorageFull, SupervisorError
from corral.supervisor.home import home_dir as homes
from corral.supervisor.home.home_files import HomeFiles, open_home
from corral.supervisor.home.home_placement import project_root_in
from corral.supervisor.intent import intent_service
from corral.supervisor.intent.intent_service import IntentService
from corral.supervisor.interactive import (
    interactive_service,
    own_history_service,
    question_service,
    reply_stream_service,
)
from corral.supervisor.interactive.interactive_service import InteractiveService
from corral.supervisor.ledger.cooperative import cooperatively
from corral.supervisor.ledger.group_commit import GroupCommit
from corral.supervisor.ledger.ledger_link import CONTROL_HOLD_S, run_held
from corral.supervisor.ledger.ledger_spec import Placement
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.longtask import compaction_service, goal_service, plan_service
from corral.supervisor.mcp import mcp_service
from corral.supervisor.mcp.mcp_service import McpService
from corral.supervisor.mcp.mcp_spec import register_mcp_credentials
from corral.supervisor.models import model_service
from corral.supervisor.models.model_service import ModelService
from corral.supervisor.params import param_int, param_seconds
from corral.supervisor.project import project_service
from corral.supervisor.runs import run_service
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_service import RunLayerFeature, RunLayerPart, RunService
from corral.supervisor.runs.run_views import RunViews
from corral.supervisor.service_part import ServicePart
from corral.supervisor.sessions import session_service
from corral.supervisor.sessions.session_parts import SessionFeature, SessionPart
from corral.supervisor.sessions.session_service import SessionService
from corral.supervisor.spec.swarm_spec import SwarmSpec
from corral.supervisor.swarm import swarm_service
from corral.supervisor.swarm.swarm_service import SwarmService
from corral.supervisor.telemetry import telemetry_config, telemetry_service
from corral.supervisor.telemetry.telemetry_service import TelemetryService
from corral.supervisor.tree.supervision_tree import ActorSlot, SupervisionTree

log = logging.getLogger("corral.supervisor")

CONTROL_SOCKET = "control.ipc"

ControlMethod = Callable[[dict[str, Any]], Awaitable[Any]]


class Supervisor:
    def __init__(
        self,
        home: Path,
        spec: SwarmSpec,
        *,
        ready_fd: int | None = None,
        lock: homes.HomeLock | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.home = home
        self.lock = lock
        #: Every file this supervisor writes or removes in its home goes through the
        #: directory it locked: a new home at the same path is never touched.
        self.files = lock.files if lock is not None and lock.files is not None else HomeFiles(open_home(home))
        #: Why writes to the home fail right now (a full disk), or "".
        self.degraded = ""
        self.spec = spec
        self.ready_fd = ready_fd
        # @once failpoints remember that they fired here, across restarts of the home.
        os.environ.setdefault(failpoints.MARKER_DIR_ENV, str(home / "failpoints"))
        self.token = secrets.token_hex(32)
        register_secret(self.token)
        for actor in spec.actors:
            for name in actor.env_passthrough:
                register_secret(os.environ.get(name, ""))
        register_mcp_credentials(spec.mcp_servers)
        #: ``[telemetry]`` and ``OTEL_*``: how traces are exported, or None (off). A
        #: telemetry asked for that cannot be had stops the boot here, with why.
        self.telemetry_config = telemetry_config.resolve(spec.telemetry, os.environ)
        self.boot_id = secrets.token_hex(8)
        self.pid = os.getpid()
        self.started = time.time()
        self.ledger: Ledger
        #: With a PostgreSQL ledger: this node, its partition and its lease (else None).
        self.node: node_service.NodeState | None
        self.ledger, self.node = node_service.open_ledger(
            home,
            placement or Placement(None),
            synchronous=spec.supervisor.synchronous,
            spec_path=spec.source if spec.source != "<embedded>" else None,
            project=project_root_in(spec),
        )
        #: The features' parts in runs (supervisor/runs/run_feature.py): this
        #: supervisor's own, listed once by ``_assemble``. Handed to every run-layer
        #: call that may move a run or write a receipt (never kept on the ledger).
        self.features = RunFeatures()
        self.group_commit = GroupCommit(self.ledger)
        self.launcher = make_launcher(spec.supervisor.launch, self.token, home / "logs" / "forkserver.log")
        self.tree = SupervisionTree(
            home,
            self.ledger,
            self.launcher,
            spec.supervisor,
            self.token,
            self._on_actor_message,
            supervisor_pid=self.pid,
            failpoint_spec=failpoints.active_spec(),
        )
        self.control_methods: dict[str, ControlMethod] = {}
        self.control: ControlServer | None = None
        #: Each service's part in this supervisor's life (supervisor/service_part.py):
        #: listed once by ``_assemble``.
        self.parts: list[ServicePart] = []
        #: The typed actor methods' families, each set by its service's setup
        #: (supervisor/actor_methods.py, served by supervisor/actor_dispatch.py).
        self.methods = ActorMethods()
        self._stop = trio.Event()
        self.stop_reason = "shutdown"
        self._events_changed = trio.Event()
        self.ledger.on_commit(self._wake_event_waiters)
        self.endpoint: homes.Endpoint | None = None
        # The services, built by ``_assemble`` at boot, each once, in its order.
        self.runs: RunService
        self.views: RunViews
        self.swarm: SwarmService
        self.sessions: SessionService
        self.mcp: McpService
        self.models: ModelService
        self.interactive: InteractiveService
        self.intent: IntentService
        self.bridge: BridgeService
        self.collaboration: CollaborationService
        self.telemetry: TelemetryService | None
        self._register_core()

    # -- lifecycle ----------------------------------------------------------------

    async def run(self) -> None:
        seq = self.ledger.begin_boot(self.boot_id, self.pid, PROTOCOL_VERSION)
        log.info("boot %s (#%d) on %s", self.boot_id, seq, self.home)
        self._clear_stale_sockets()
        self._assemble()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_signals)
            # detect-secrets' patterns take ~0.15 s to load: read now, beside the fork
            # server's start (which is handed them: sandbox/launcher.py), not inside
            # the first run's first event.
            if self.launcher.mode is not LaunchMode.FORKSERVER:
                nursery.start_soon(partial(trio.to_thread.run_sync, redact.prepare))
            await nursery.start(self.launcher.run)
            for group in self.spec.groups:
                self.tree.declare_group(group)
            for actor in self.spec.actors:
                self.tree.declare_actor(actor)
            await self._recover()
            # Before any actor starts: the check after a sandboxed command whose launcher died.
            await trio.to_thread.run_sync(recover_home, self.home)
            await nursery.start(self.tree.run)
            address = await nursery.start(self._control_server().serve)
            self.endpoint = homes.Endpoint(
                protocol=PROTOCOL_VERSION,
                pid=self.pid,
                boot_id=self.boot_id,
                control=address,
                token=self.token,
                heartbeat=time.time(),
                home=str(self.home),
            )
            homes.write_endpoint(self.files, self.endpoint)
            nursery.start_soon(self._heartbeat)
            for part in self.parts:
                for task in part.tasks():
                    nursery.start_soon(task)
            self._signal_ready(f"ready {self.boot_id}")
            await self._stop.wait()
            log.info("shutting down: %s", self.stop_reason)
            await self.tree.shutdown()
            for part in self.parts:
                await part.shutdown()
            self.ledger.end_boot(self.stop_reason)
            homes.remove_endpoint(self.files)
            nursery.cancel_scope.cancel()

    def _assemble(self) -> None:
        """Every service, in this order: a service may use those built before it.
        Then the features' parts in runs, in the one order the run layer calls them."""
        forwarding, node = node_service.install(self)  # a cluster node: its lease, before any run moves
        self.runs, self.views = run_service.install(self, cluster_reads.partition_reader(self.node))
        # The collaboration policy first: the swarm asks it before a root's delegation,
        # spawn or first claim takes effect.
        self.collaboration = collaboration_service.install(self)
        self.swarm = swarm_service.install(self)
        self.sessions = session_service.install(self)
        self.mcp = mcp_service.install(self)
        self.models = model_service.install(self)
        self.interactive = interactive_service.install(self)
        question_service.install(self)  # user.input_request: structured questions, their answers
        own_history_service.install(self)  # agent.action_history and command.output_read's lookups
        reply_stream = reply_stream_service.install(self)  # streamed reply text: in memory, never in the events table
        self.intent = intent_service.install(self)
        self.bridge = bridge_service.install(self)
        plan = plan_service.install(self)
        goal = goal_service.install(self)
        compaction = compaction_service.install(self)
        project = project_service.install(self)  # the project revision, project.verify, the final-reply gate
        repo_context = repo_fingerprint_service.install(self)  # an action planned on an older context is blocked
        self.telemetry = telemetry_service.install(self, self.telemetry_config)
        # Every feature's part in runs (supervisor/runs/run_feature.py), in the one
        # order each of its methods is called: status changes, receipts, boundary
        # checks, guards, blockers, ``show`` and ``pending`` sections. Why this order:
        # - a cluster node's forwarding first: an id another partition holds is
        #   handed to its holder before any feature of this one looks at it;
        # - then the run layer's own part, then the features in the order their
        #   services are built above (each may rely on what one before it did in
        #   the same transaction: a person's steer is applied at the boundary
        #   before the intent's updates and before a paused goal parks the run);
        #   the guards only tighten, so their order decides only which reason is
        #   shown, never the verdict;
        # - telemetry last: its status hook sees a run's final status after every
        #   other feature's.
        self.features.install([
            forwarding,
            RunLayerFeature(self.ledger, self.views),
            swarm_service.SwarmFeature(self.swarm),
            SessionFeature(self.ledger, self.sessions),
            mcp_service.run_feature(self.mcp),
            model_service.UsageFeature(self.ledger),
            interactive_service.SteerFeature(self.interactive),
            question_service.QuestionFeature(self.ledger, self.features),
            intent_service.IntentFeature(self.intent),
            plan_service.PlanFeature(plan),
            goal_service.GoalFeature(goal),
            compaction_service.CompactionFeature(compaction),
            project_service.ProjectFeature(project),
            collaboration_service.CollaborationFeature(self.collaboration),
            repo_context,
            telemetry_service.TelemetryFeature(self.telemetry) if self.telemetry is not None else None,
        ])
        # Each service's part in the supervisor's own life (supervisor/service_part.py),
        # in the one order its methods are called: recovery at boot (the run layer's
        # own first, then the swarm restarts its children), background tasks started,
        # ``status`` sections, shutdown (a cluster node leaves its cluster first, then
        # telemetry flushes what the run ends left).
        self.parts = [part for part in (
            node,
            RunLayerPart(self.runs),
            swarm_service.SwarmPart(self.swarm),
            SessionPart(self.ledger, self.sessions),
            mcp_service.service_part(self.mcp),
            model_service.service_part(self.models),
            reply_stream_service.ReplyStreamPart(reply_stream),
            bridge_service.BridgePart(self.bridge) if self.spec.bridge is not None else None,
            telemetry_service.TelemetryPart(self.telemetry) if self.telemetry is not None else None,
        ) if part is not None]
        if self.spec.supervisor.probes:
            probes.install(self)

    async def _recover(self) -> None:
        """Each part's recovery, in order (the run layer's: finalizations, actions, runs)."""
        for part in self.parts:
            await part.recover()

    def _signal_ready(self, line: str) -> None:
        if self.ready_fd is not None:
            try:
                os.write(self.ready_fd, line.encode() + b"\n")
            finally:
                os.close(self.ready_fd)
                self.ready_fd = None

    def request_stop(self, reason: str) -> None:
        self.stop_reason = reason
        self._stop.set()

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.request_stop(f"signal {signal.Signals(signum).name}")

    async def _heartbeat(self) -> None:
        """The endpoint's heartbeat, the home lock, and a full disk: a failed write
        degrades the supervisor to read-only (new work is refused with a clear error,
        actors keep running) until a write succeeds again."""
        while True:
            await trio.sleep(self.spec.supervisor.heartbeat_s)
            if self.lock is not None and not self.lock.still_held():
                log.error("the home %s was removed or replaced under this supervisor; stopping", self.home)
                self.request_stop("lost the home lock")
                return
            if self.endpoint is not None:
                try:
                    self.endpoint = homes.heartbeat_endpoint(self.files, self.endpoint)
                except OSError as exc:
                    self._degrade(f"cannot write {homes.ENDPOINT}: {exc.strerror}")
                    continue
            if self.ledger.full_since is not None:
                self._probe_storage()
            elif self.degraded:
                self._recovered()

    def _degrade(self, why: str) -> None:
        if not self.degraded:
            log.error("storage failing, running read-only until it recovers: %s", why)
        self.degraded = why

    def _probe_storage(self) -> None:
        """One small commit: when it succeeds the disk has room again."""
        try:
            with self.ledger.tx():
                self.ledger.event("storage-recovered", self.boot_id)
        except SupervisorError as exc:
            self._degrade(str(exc))
            return
        self._recovered()

    def _recovered(self) -> None:
        log.info("storage recovered; resuming")
        self.degraded = ""

    def _clear_stale_sockets(self) -> None:
        self.files.remove_stale("s", ".ipc")

    def _control_server(self) -> ControlServer:
        if self.spec.supervisor.transport == "tcp":
            address = listen_at = tcp_loopback_address(0)
        else:
            # Clients dial the path; nng listens (and, closing, unlinks) through this
            # home's descriptor, so a supervisor on its way out never unlinks the
            # socket of a new supervisor on a new home at the same path.
            address = ipc_address(self.home / "s" / CONTROL_SOCKET)
            via_fd = self.files.path_of(f"s/{CONTROL_SOCKET}")
            listen_at = ipc_address(Path(via_fd)) if via_fd is not None else address
        self.control = ControlServer(
            address,
            self.token,
            self._on_control,
            max_frame=self.spec.supervisor.max_frame,
            is_long_poll=is_long_poll,
            max_long_polls=self.spec.supervisor.max_long_polls,
            listen_at=listen_at,
        )
        return self.control

    # -- dispatch -----------------------------------------------------------------

    async def _on_control(self, method: str, params: dict[str, Any]) -> Any:
        handler = self.control_methods.get(method)
        if handler is None:
            raise ControlError(
                "unknown-method",
                f"no control method {method!r}; try: {', '.join(sorted(self.control_methods))}",
            )
        try:
            # A call that found the ledger unreachable committed nothing: it waits a
            # moment for the ledger to be back (a database restart), then runs again.
            # With a ledger on a server, its waits let other calls and actors' requests
            # run meanwhile (supervisor/ledger/cooperative.py).
            call = (lambda: cooperatively(handler, params)) if self.ledger.cooperative else (lambda: handler(params))
            result = await run_held(call, self.ledger, CONTROL_HOLD_S)
        except SupervisorError as exc:
            await self.group_commit.barrier()  # a refusal may follow a commit
            raise ControlError(exc.code, str(exc)) from None
        await self.group_commit.barrier()  # nothing is acknowledged before it is durable
        return result

    async def _on_actor_message(self, slot: ActorSlot, envelope: Envelope) -> dict[str, Any] | None:
        if "method" not in envelope.body and envelope.body.get("op") == "ping":
            return {"pong": True}
        try:
            request = protocol.decode(envelope.body)  # the shape, checked once, here
        except protocol.ProtocolError as exc:
            raise SupervisorError(str(exc), code=exc.code) from None
        try:
            result = await actor_dispatch.dispatch(self, slot, request)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self.group_commit.barrier()  # a refusal may follow a commit
            raise
        # No reply (``executing``, above all) leaves before its commit is durable.
        await self.group_commit.barrier()
        return result

    async def next_commit(self) -> None:
        """Return after the ledger's next commit (what a waiter re-reads on)."""
        await self._events_changed.wait()

    def _wake_event_waiters(self) -> None:
        self._events_changed.set()
        self._events_changed = trio.Event()

    # -- core control methods -----------------------------------------------------

    def _register_core(self) -> None:
        self.control_methods.update(
            ping=self._ping,
            status=self._status,
            snapshot=self._status,
            events=self._events,
            shutdown_if_idle=self._shutdown_if_idle,
            down=self._down,
            kill_actor=self._kill_actor,
            request_actor=self._request_actor,
        )

    async def _ping(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"pong": True, "boot_id": self.boot_id, "pid": self.pid, "protocol": PROTOCOL_VERSION}

    def busy_reasons(self) -> list[str]:
        reasons: list[str] = []
        for part in self.parts:
            reasons.extend(part.busy())
        return reasons

    async def _status(self, params: dict[str, Any]) -> dict[str, Any]:
        boots = self._unless_unreachable(lambda: self.ledger.all(
            "SELECT boot_id, seq, pid, started_at, ended_at, end_reason FROM boots ORDER BY seq"), [])
        return {
            "home": str(self.home),
            "boot_id": self.boot_id,
            "pid": self.pid,
            "uptime_s": round(time.time() - self.started, 3),
            "spec": self.spec.name,
            "launch": self.launcher.mode.value,
            "boots": [dict(row) for row in boots],
            "cursor": self._unless_unreachable(self.ledger.last_cursor, None),
            # Group commit at work: commits, and the fsyncs that made them durable.
            "ledger": {
                "backend": self.ledger.backend,
                **self.ledger.counters(),
                "commits": self.ledger.commits,
                "syncs": self.group_commit.syncs,
                "synced_commits": self.group_commit.batched_commits,
                "group_commit": self.ledger.group_commit,
            },
            "busy": self._unless_unreachable(self.busy_reasons, []),
            "degraded": self.degraded or (f"ledger writes failing since {self.ledger.full_since:.0f}"
                                          if self.ledger.full_since is not None else "") or self.launcher.degraded
            or "; ".join(filter(None, (part.degraded() for part in self.parts))),
            "forkserver": {"pid": self.launcher.forkserver_pid, "replacements": self.launcher.replacements},
            # The control API's own pools: long polls held and refused.
            "control": self.control.counters() if self.control is not None else {},
            **self.tree.snapshot(),
            **{part.status_name: self._unless_unreachable(part.status, None) for part in self.parts
               if part.status_name},
        }

    def _unless_unreachable(self, read: Callable[[], Any], instead: Any) -> Any:
        """What status reads of the ledger: while the ledger cannot be reached (a
        PostgreSQL server away), status still answers, and says degraded."""
        try:
            return read()
        except StorageFull as exc:
            self._degrade(str(exc))
            return instead

    async def _events(self, params: dict[str, Any]) -> dict[str, Any]:
        since = param_int(params, "since", 0)
        wait_ms = param_int(params, "wait_ms", 0, high=3_600_000)
        limit = param_int(params, "limit", 500, high=1_000_000)
        events = self.ledger.events_since(since, min(limit, 5000))
        if not events and wait_ms:
            with trio.move_on_after(min(wait_ms, 30_000) / 1000):
                await self._events_changed.wait()
            events = self.ledger.events_since(since, min(limit, 5000))
        cursor = events[-1]["cursor"] if events else since
        for part in self.parts:
            part.fill_events(events)
        return {"events": events, "cursor": cursor}

    async def _shutdown_if_idle(self, params: dict[str, Any]) -> dict[str, Any]:
        reasons = self.busy_reasons()
        if reasons:
            return {"status": "busy", "reasons": reasons}
        self.request_stop("shutdown_if_idle")
        return {"status": "stopping"}

    async def _down(self, params: dict[str, Any]) -> dict[str, Any]:
        self.request_stop("down")
        return {"status": "stopping"}

    async def _request_actor(self, params: dict[str, Any]) -> dict[str, Any]:
        return await _request_actor_impl(self, params)

    async def _kill_actor(self, params: dict[str, Any]) -> dict[str, Any]:
        actor_id = params.get("actor_id")
        if not isinstance(actor_id, str) or actor_id not in self.tree.slots:
            raise SupervisorError(f"no actor {actor_id!r}", code="not-found")
        await self.tree.kill_actor(actor_id)
        return {"killed": actor_id}


#: Methods that answer at once whatever their params: never long polls, so they
#: always get a worker.
QUICK_METHODS = frozenset({"ping", "status", "snapshot"})
#: Methods that wait by nature: for an actor's answer, up to their ``timeout_s``.
WAITING_METHODS = frozenset({"request_actor"})


def is_long_poll(method: str, params: dict[str, Any]) -> bool:
    """A request that may wait goes to the control server's long-poll pool: it asks
    to wait (a positive ``wait_ms`` or ``wait_s``, the protocol's one way to ask:
    events, wait, session polls, bridge job waits) or waits by nature."""
    if method in QUICK_METHODS:
        return False
    if method in WAITING_METHODS:
        return True
    return any(
        isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        for value in (params.get("wait_ms"), params.get("wait_s"))
    )


async def _request_actor_impl(sup: Supervisor, params: dict[str, Any]) -> dict[str, Any]:
    actor_id = params.get("actor_id")
    body = params.get("body", {})
    timeout = param_seconds(params, "timeout_s", 10.0, low=0.001, high=3600.0)
    if not isinstance(actor_id, str) or actor_id not in sup.tree.slots:
        raise SupervisorError(f"no actor {actor_id!r}", code="not-found")
    if not isinstance(body, dict):
        raise SupervisorError("body must be a map", code="bad-request")
    try:
        return await sup.tree.request(actor_id, body, float(timeout))
    except ChannelClosed:
        raise SupervisorError(f"actor {actor_id} went away before answering", code="actor-gone") from None


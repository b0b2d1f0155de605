"""A supervisor as a node of a PostgreSQL-backed swarm.

At boot a node takes its own partition (supervisor/cluster/cluster_tables.py) and opens the
ledger there, fenced by the partition's epoch. While it runs, it renews its lease
and its node heartbeat, and it watches for partitions whose lease expired with
unfinished runs in them: it takes such a partition over (a new epoch) and starts
one more supervisor process for it, on this host, which boots through the same
recovery as any restart (unknown outcomes become ``needs-reconciliation``,
never replays). That process dies with its node (PDEATHSIG), so a dead node's
adoptions are adopted again in turn.

A node whose lease was taken over stops at its next write or renewal, before
anything reaches the ledger or an actor: it exits with ``FENCED_EXIT``.

A node rides out its database going away: its ledger reconnects
(supervisor/ledger/ledger_link.py), its cluster connection is made again at the next
tick, and its status says ``degraded`` meanwhile. A node that comes back asks
for its own partition, and the adoption hands it back once it holds no
unfinished run. A partition whose schema is newer than this corral is not
adopted: the refusal is in status (and ``corral doctor``) with what to do.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from corral.core import failpoints
from corral.core.child_python import python_argv, python_env
from corral.supervisor.cluster import cluster_tables as cluster
from corral.supervisor.cluster import custody, forwarding, node_queue, node_requests, run_queue
from corral.supervisor.cluster.node_stop import clear as clear_stop_note
from corral.supervisor.cluster.node_stop import write as write_stop_note
from corral.supervisor.errors import StorageFull
from corral.supervisor.ledger.ledger_link import Wakeup, connection_lost, keep_connected
from corral.supervisor.ledger.ledger_pg import PostgresLedger
from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster, schema_of
from corral.supervisor.ledger.ledger_pg_wire import PostgresUnavailable, redact_url
from corral.supervisor.ledger.ledger_spec import URL_ENV, Placement, remember
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.run_feature import Placed, RunFeature
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.service_part import ServicePart, Task

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

log = logging.getLogger("corral.node")

#: The exit status of a fenced supervisor (EX_TEMPFAIL: its node lost the lease).
FENCED_EXIT = 75
#: After an adopted partition's supervisor failed, wait this long before trying again.
ADOPT_RETRY_S = 30.0
ADOPTED_DIR = "adopted"
#: A cluster connection made again after a lost one gives up after this (in a worker thread).
CLUSTER_CONNECT_TIMEOUT_S = 5


def handback_wait_s(lease_s: float) -> float:
    """How long a returning node waits for its adopter to hand its partition back:
    a tick of the adopter (a third of a lease) and a clean stop, within the time
    ``corral up`` waits for a boot."""
    return min(20.0, lease_s + 5.0)


@dataclass
class NodeState:
    placement: Placement
    home: Path
    #: The cluster connection (None: lost; the next tick makes it again).
    conn: Any
    hold: cluster.Hold
    spec_path: str | None
    adopted: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    retry_after: dict[str, float] = field(default_factory=dict)
    #: The cluster as this node last saw it, so its event stream tells every change.
    seen: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: An adopted partition: since when it holds no unfinished run (None: it does).
    idle_since: float | None = None
    #: The cluster as the last tick saw it (status shows it while the database is away).
    last_view: dict[str, Any] = field(default_factory=lambda: {"nodes": [], "partitions": []})
    #: Since when (wall clock) the cluster connection fails, and why.
    cluster_lost_since: float | None = None
    cluster_lost_why: str = ""
    #: Partitions this node must not adopt (their schema is newer), as last seen.
    refused: dict[str, cluster.Refusal] = field(default_factory=dict)
    #: No adoption before this (monotonic): after this node lost the database, the
    #: nodes that lost it too get a lease to renew theirs before anyone takes them over.
    adopt_after: float = 0.0
    #: Why this node cannot make progress ("": it can), and since when (monotonic).
    stuck: str = ""
    stuck_since: float | None = None
    #: Partitions this node owns with no supervisor (their runs are over): name to
    #: the epoch it holds each at; the primary renews their leases (custody.py).
    dormant: dict[str, int] = field(default_factory=dict)
    #: The epoch each adoption supervisor of this node holds its partition at.
    adopted_epochs: dict[str, int] = field(default_factory=dict)
    #: This node's part in the shared queue (None: it takes none).
    queue: run_queue.RunQueue | None = None
    #: The cluster's load as the last status saw it (per node, the queue's depth).
    last_load: dict[str, Any] = field(default_factory=dict)

    @property
    def primary(self) -> bool:
        """The node's own supervisor (it adopts); not one it started for an adoption."""
        return self.placement.adopt is None


def open_ledger(
    home: Path, placement: Placement, *, synchronous: str, spec_path: str | None, project: Path | None = None
) -> tuple[Ledger, NodeState | None]:
    """This supervisor's ledger: its home's SQLite file, or its partition of the cluster's
    database. ``project``: the root its agents work in, whose one revision the cluster's
    partitions share (supervisor/project/revision_store.py)."""
    if placement.url is None:
        from corral.supervisor.home import home_dir as homes

        return SqliteLedger(home / homes.LEDGER, synchronous=synchronous, check=True, group_commit=True), None
    conn = connect_cluster(placement.url, placement.node)
    if placement.adopt is not None:
        assert placement.epoch is not None
        hold = cluster.Hold(placement.adopt, placement.epoch)
        lease_from = None  # taken by the adopting node a while ago: the first write renews it
    else:
        # Heartbeat first: an adopter hands a partition back to a live node only.
        cluster.heartbeat_node(conn, placement.node, str(home), os.getpid(), placement.lease_s)
        lease_from = time.monotonic()  # before the lease is taken: what it surely covers
        hold = cluster.acquire_own(conn, placement.node, spec_path, placement.lease_s, placement.last_partition,
                                   handback_wait_s(placement.lease_s))
    remember(home, placement, hold.partition)
    ledger = PostgresLedger(placement.url, hold.partition, epoch=hold.epoch, group_commit=synchronous == "full",
                            holder=placement.node, lease_s=placement.lease_s, lease_from=lease_from,
                            cooperative=placement.concurrent, project=None if project is None else str(project))
    log.info("ledger: %s (epoch %d, node %s)", ledger.where, hold.epoch, placement.node)
    return ledger, NodeState(placement, home, conn, hold, spec_path)


class ClusterFeature(RunFeature):
    """A cluster node's part in runs: ``reconcile`` of an id another partition
    holds goes to its holder (forwarding.py), first of every feature's; a new root
    run goes through the shared queue (run_queue.py), whose capacity follows every
    status change."""

    def __init__(self, forwarder: forwarding.Forwarder | None, queue: run_queue.RunQueue | None) -> None:
        self.forwarder = forwarder
        self.queue = queue

    async def reconcile(self, target: str, params: dict[str, Any]) -> dict[str, Any] | None:
        return None if self.forwarder is None else await self.forwarder.reconcile(params)

    def place_run(self, run_id: str | None, agent_id: str, params: dict[str, Any]) -> Placed | None:
        return None if self.queue is None else self.queue.place(run_id, agent_id, params)

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        if self.queue is not None:
            self.queue.on_status(ledger, run_id, status, reason)


class NodePart(ServicePart):
    """A cluster node's part in the supervisor's life: the shared queue's loop (if
    it joined one), the lease loop and the reconnecting watch; its ``status``
    section; degraded when its runs cannot move; at shutdown the queue closes and
    the node leaves its cluster."""

    status_name = "cluster"

    def __init__(self, sup: Supervisor, state: NodeState, ledger: PostgresLedger, lost: Wakeup) -> None:
        self.sup, self.state, self.ledger, self.lost = sup, state, ledger, lost

    def tasks(self) -> Sequence[Task]:
        queue = self.state.queue
        return (*((queue.loop,) if queue is not None else ()), partial(_lease_loop, self.sup, self.state),
                partial(node_requests.listen, self.sup, self.state), partial(keep_connected, self.ledger, self.lost))

    def status(self) -> Any:
        return _status(self.state, self.ledger)

    def degraded(self) -> str:
        return _stuck_text(self.state)

    async def shutdown(self) -> None:
        if self.state.queue is not None:
            await trio.to_thread.run_sync(self.state.queue.close)
        await _leave(self.state)


def install(sup: Supervisor) -> tuple[RunFeature | None, ServicePart | None]:
    """A cluster node's lease, events and background work (its ``NodePart``); its
    part in runs, if any (``ClusterFeature``)."""
    state = sup.node
    if state is None:
        return None, None
    ledger = sup.ledger
    assert isinstance(ledger, PostgresLedger)
    ledger.on_fenced = lambda why: _exit_fenced(state, why)
    ledger.on_diverged = lambda why: _exit_diverged(state, why)
    clear_stop_note(sup.home)  # a node that stopped itself is back
    lost = Wakeup()
    ledger.on_lost = lost.set
    hold = state.hold
    if state.primary:
        ledger.event("node-joined", state.placement.node, partition=hold.partition, epoch=hold.epoch, pid=sup.pid)
    else:
        ledger.event("partition-adopted", hold.partition, node=state.placement.node, epoch=hold.epoch, pid=sup.pid)
    # `reconcile` of another partition's action goes to its holder (forwarding.py).
    forwarder = (None if state.placement.url is None
                 else forwarding.Forwarder(state.placement.url, state.placement.node, hold.partition))
    queue = None
    if state.primary and state.placement.queue is not None:
        queue = node_queue.join(sup, state, ledger, state.placement.queue)
    elif state.primary and state.conn is not None:
        run_queue.publish_capacity(state.conn, state.placement.node, None, [])  # it takes no queued run
    feature = None if forwarder is None and queue is None else ClusterFeature(forwarder, queue)
    return feature, NodePart(sup, state, ledger, lost)


def _status(state: NodeState, ledger: PostgresLedger) -> dict[str, Any]:
    """This node's part of ``status``: the cluster as the database says now, or as
    the last tick saw it while the database is away (``reachable`` false)."""
    view = state.last_view
    conn = state.conn
    if conn is not None and state.cluster_lost_since is None:
        try:
            view = state.last_view = cluster.view(conn)
            state.last_load = run_queue.cluster_load(conn)
        except Exception as exc:
            _cluster_failed(state, exc)
    degraded = []
    if not ledger.available:
        degraded.append(f"ledger connection lost: {ledger.lost_why}")
    if state.cluster_lost_since is not None:
        degraded.append(f"cluster connection lost: {state.cluster_lost_why}")
    if state.stuck:
        degraded.append(_stuck_text(state))
    return {
        "node": state.placement.node,
        "partition": state.hold.partition,
        "epoch": state.hold.epoch,
        "ledger": redact_url(state.placement.url or ""),
        "adopting": sorted(state.adopted),
        "dormant": sorted(state.dormant),
        "reachable": not degraded,
        "degraded": "; ".join(degraded),
        "adoption_refused": [refusal.as_dict() for refusal in state.refused.values()],
        "capacity": state.queue.capacity.as_dict() if state.queue is not None else None,
        "load": state.last_load,
        **view,
    }


def _cluster_failed(state: NodeState, exc: BaseException) -> None:
    """The cluster connection failed: the next tick makes a new one."""
    if state.cluster_lost_since is None:
        state.cluster_lost_since = time.time()
        log.warning("cluster connection failed (%s); trying again at the next tick", exc)
    state.cluster_lost_why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    conn, state.conn = state.conn, None
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass


def _cluster_conn(state: NodeState) -> Any:
    """The cluster connection, made again if it was lost (in a worker thread)."""
    if state.conn is None:
        assert state.placement.url is not None
        state.conn = connect_cluster(state.placement.url, state.placement.node, CLUSTER_CONNECT_TIMEOUT_S)
        state.adopt_after = time.monotonic() + state.placement.lease_s
        log.warning("cluster connection made again")
    return state.conn


def _exit_fenced(state: NodeState, why: str) -> None:
    # Nothing more may reach the ledger or an actor: every actor dies with this
    # process (PDEATHSIG), and the open transaction dies with its connection.
    log.error("fenced, stopping at once: %s", why)
    _note_stop(state, f"it was fenced: {why}")
    logging.shutdown()
    os._exit(FENCED_EXIT)


def _exit_diverged(state: NodeState, why: str) -> None:
    # The server lost commits this supervisor had made (a crash with unflushed
    # WAL): its memory is ahead of its ledger. No reply covered by them left
    # (group commit); stop, and let recovery start from what the ledger holds.
    log.error("stopping at once: %s", why)
    _note_stop(state, why)
    logging.shutdown()
    os._exit(FENCED_EXIT)


def _note_stop(state: NodeState, why: str) -> None:
    """What ``status`` and ``doctor`` tell the operator once this node is gone. An
    adoption's supervisor notes nothing: its node adopts the partition again."""
    if state.primary:
        write_stop_note(state.home, state.placement.node, state.spec_path, why)


Change = tuple[str, str, dict[str, Any]]


@dataclass
class Tick:
    renewed: bool
    expired: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    #: The node an adopted partition is handed back to ("": none).
    hand_back: str = ""
    #: Calls other nodes left for this partition, taken (forwarding.py).
    requests: list[forwarding.Request] = field(default_factory=list)
    #: Partitions this node owns that hold unfinished runs again: to be served.
    serve: list[cluster.Hold] = field(default_factory=list)


async def _lease_loop(sup: Supervisor, state: NodeState) -> None:
    lease_s = state.placement.lease_s
    ledger = sup.ledger
    assert isinstance(ledger, PostgresLedger)
    while True:
        await trio.sleep(lease_s / 3)
        try:
            tick = await trio.to_thread.run_sync(_tick, state, ledger)
        except PostgresUnavailable as exc:  # the database is away: the next tick tries again
            _cluster_failed(state, exc)
            continue
        except Exception as exc:  # a statement failed (the connection is fine): the next tick retries
            log.warning("lease renewal failed (%s); retrying", exc)
            continue
        if state.cluster_lost_since is not None:
            log.warning("cluster connection back: the lease is renewed again")
            state.cluster_lost_since = None
        if not tick.renewed:
            ledger.fence(f"the lease on partition {state.hold.partition} was taken over")
        await _serve_requests(sup, state, tick.requests)
        if tick.hand_back:
            # Its own node is back and the partition holds no unfinished run:
            # stop, and give the lease up on the way out, so that node takes it.
            _record(sup, [("partition-handed-back", state.hold.partition, {"to": tick.hand_back})])
            ledger.release_on_close = True
            sup.request_stop(f"adopted partition {state.hold.partition} handed back to node {tick.hand_back}")
            return
        if _retiring(state):
            # Its runs are over: stop, keeping the lease: the node that started this
            # supervisor keeps the partition dormant (custody.py), and hands it to the
            # node it came from when that one asks.
            _record(sup, [("partition-retired", state.hold.partition, {"node": state.placement.node})])
            sup.request_stop(f"adopted partition {state.hold.partition} has no unfinished run")
            return
        _record(sup, tick.changes)
        _reap(state)
        if _cannot_progress(sup, state, ledger):
            return
        for name in tick.expired:
            try:
                hold = await trio.to_thread.run_sync(cluster.adopt, state.conn, name, state.placement.node, lease_s)
            except Exception as exc:
                _cluster_failed(state, exc)
                break
            if hold is None:
                continue
            moved, idle = await node_queue.requeue_taken(state, hold)
            if moved:
                _record(sup, [("runs-requeued", hold.partition, {"runs": moved})])
            if not idle:
                _start_adopted(sup, state, hold)
        for hold in tick.serve:
            _start_adopted(sup, state, hold)


def _stuck_reason(sup: Supervisor) -> str:
    """What keeps this node's runs from moving ("": nothing): a group that gave up
    (its restart intensity exceeded) while runs of its agents are unfinished. A
    group that gave up with nothing to do (an MCP server's, a finished child's)
    does not count. The ledger is read: away, nothing is judged this tick."""
    reasons = []
    for group in sup.tree.groups.values():
        if group.status != "escalated":
            continue
        agents = sorted({str(sup.tree.slots[a].spec.params.get("agent_id", a)) for a in group.order})
        terminal = sorted(str(status) for status in TERMINAL)
        try:
            row = sup.ledger.one(
                f"SELECT COUNT(*) AS n FROM runs WHERE agent_id IN ({', '.join('?' * len(agents))})"
                f" AND status NOT IN ({', '.join('?' * len(terminal))})", *agents, *terminal)
        except StorageFull:
            return ""
        if row is not None and int(row["n"]):
            reasons.append(f"group {group.spec.id} gave up ({group.reason}) with {int(row['n'])} run(s) unfinished")
    return "; ".join(reasons)


def _stuck_text(state: NodeState) -> str:
    return f"cannot make progress: {state.stuck}" if state.stuck else ""


def _cannot_progress(sup: Supervisor, state: NodeState, ledger: PostgresLedger) -> bool:
    """A node whose runs cannot move says ``degraded`` (status, an event); after a
    lease of it, it gives its lease up and stops, so that another node adopts the
    partition and finishes them through the recovery of any restart. A node alone
    in its cluster stays, degraded: nobody else would adopt. True: it stops."""
    reason = _stuck_reason(sup)
    now = time.monotonic()
    if not reason:
        if state.stuck:
            log.warning("making progress again")
        state.stuck, state.stuck_since = "", None
        return False
    if reason != state.stuck:
        log.error("cannot make progress: %s", reason)
        _record(sup, [("node-cannot-progress", state.placement.node,
                       {"partition": state.hold.partition, "reason": reason})])
    state.stuck = reason
    state.stuck_since = state.stuck_since if state.stuck_since is not None else now
    if now - state.stuck_since < state.placement.lease_s:
        return False
    others = [n for n in state.last_view["nodes"] if n["node_id"] != state.placement.node
              and n["status"] == "up" and (n["lease_left_s"] or 0) > 0]
    if state.primary and not others:
        return False
    why = f"it could not make progress ({reason}) and gave its lease up, so that another node adopts its runs"
    log.error("cannot make progress: giving its lease up and stopping (%s)", reason)
    _note_stop(state, why)
    ledger.release_on_close = True
    sup.request_stop(f"node {state.placement.node} cannot make progress: {reason}")
    return True


def _record(sup: Supervisor, changes: list[Change]) -> None:
    """Events that guard nothing (what the cluster tables say): while the ledger is
    away they are dropped; the cluster tables keep the state."""
    if not changes:
        return
    try:
        with sup.ledger.tx(fsync=False):
            for kind, subject, data in changes:
                sup.ledger.event(kind, subject, **data)
    except StorageFull as exc:
        log.warning("cluster events not recorded: %s", exc)


def _tick(state: NodeState, ledger: PostgresLedger) -> Tick:
    """In a worker thread: the database may be slow or away, the event loop is not.
    A connection that failed becomes ``PostgresUnavailable`` (the next tick makes a
    new one); any other error is a bug and is raised."""
    placement = state.placement
    try:
        conn = _cluster_conn(state)
        sent = time.monotonic()
        if not cluster.renew(conn, state.hold, placement.node, placement.lease_s):
            return Tick(False)
        ledger.lease_renewed(sent)
        requests = forwarding.take_requests(conn, state.hold.partition, placement.node)
        if not state.primary:
            busy = cluster.has_unfinished_runs(conn, schema_of(state.hold.partition))
            state.idle_since = None if busy else (state.idle_since or time.monotonic())
            wanted = None if busy else cluster.wanted_back(conn, state.hold.partition)
            return Tick(True, hand_back=wanted or "", requests=requests)
        cluster.heartbeat_node(conn, placement.node, str(state.home), os.getpid(), placement.lease_s)
        idle_after = state.adopt_after + custody.IDLE_GRACE_LEASES * placement.lease_s
        tended = custody.tend(conn, placement.node, placement.lease_s, state.dormant, _serving(state),
                              time.monotonic() >= idle_after)
        view = cluster.view(conn)
        free, refused = cluster.adoptable(conn, placement.lease_s)
    except PostgresUnavailable:
        raise
    except Exception as exc:
        if state.conn is not None and not connection_lost(exc, state.conn):
            raise
        raise PostgresUnavailable(str(exc)) from None
    state.last_view = view
    changes = _changes(state, view) + _refusals(state, refused) + tended.changes
    now = time.monotonic()
    expired = [
        name
        for name in free
        if name != state.hold.partition and name not in state.adopted and state.retry_after.get(name, 0) <= now
    ] if now >= state.adopt_after else []
    return Tick(True, expired, changes, requests=requests, serve=tended.serve)


def _serving(state: NodeState) -> set[str]:
    """Partitions this node serves with a supervisor, or will again after a failure
    (custody leaves them alone)."""
    now = time.monotonic()
    return {state.hold.partition, *state.adopted, *(name for name, at in state.retry_after.items() if at > now)}


async def _serve_requests(sup: Supervisor, state: NodeState, requests: list[forwarding.Request]) -> None:
    """Calls left for this partition that its listener did not take first (node_requests.py)."""
    try:
        await node_requests.serve_requests(sup, state.conn, requests)
    except Exception as exc:  # the asker says the outcome is unknown; `show` tells it
        _cluster_failed(state, exc)


def _refusals(state: NodeState, refused: list[cluster.Refusal]) -> list[Change]:
    """Partitions this node must not adopt: each told once (an event and a log
    line), and again only if it changed (its schema, its epoch); nothing is tried
    meanwhile. One that is fit again is adopted at the next tick."""
    now = {refusal.partition: refusal for refusal in refused}
    changes: list[Change] = []
    for name, refusal in now.items():
        if state.refused.get(name) != refusal:
            log.error("not adopting partition %s: its schema %d is newer than this corral's (%d); %s",
                      name, refusal.schema, refusal.supported, refusal.advice)
            changes.append(("partition-adoption-refused", name,
                            {"schema": refusal.schema, "supported": refusal.supported, "advice": refusal.advice}))
    state.refused = now
    return changes


def _retiring(state: NodeState) -> bool:
    """An adopted partition idle for ``retire_idle_s`` is let go."""
    idle = state.idle_since
    return not state.primary and idle is not None and time.monotonic() - idle >= state.placement.retire_idle_s


def _changes(state: NodeState, view: dict[str, Any]) -> list[Change]:
    """What moved in the cluster since the last tick, as events for this node's
    stream: so every node's stream shows every node."""
    now: dict[str, tuple[Any, ...]] = {}
    for node in view["nodes"]:
        alive = node["status"] == "up" and (node["lease_left_s"] or 0) > 0
        now["node:" + node["node_id"]] = ("up" if alive else ("left" if node["status"] == "down" else "lost"),
                                          node["host"], node["pid"])
    for part in view["partitions"]:
        now["partition:" + part["name"]] = (part["holder"], part["epoch"])
    changes: list[Change] = []
    for key, value in now.items():
        if state.seen.get(key) == value:
            continue
        kind, name = key.split(":", 1)
        if kind == "node":
            changes.append((f"cluster-node-{value[0]}", name, {"host": value[1], "pid": value[2]}))
        else:
            changes.append(("cluster-partition-held", name, {"holder": value[0], "epoch": value[1]}))
    state.seen = now
    return changes


def _start_adopted(sup: Supervisor, state: NodeState, hold: cluster.Hold) -> None:
    """One more supervisor for an adopted partition (from the trio thread: its
    PDEATHSIG follows the thread that forks it)."""
    import prctl

    home = sup.home / ADOPTED_DIR / hold.partition
    spec_path = cluster.spec_path_of(state.conn, hold.partition) if state.conn is not None else state.spec_path
    argv = python_argv("-m", "corral.supervisor", "--home", str(home), "--node", state.placement.node,
                      "--adopt", hold.partition, "--epoch", str(hold.epoch), "--lease-s", str(state.placement.lease_s),
                      "--retire-idle-s", str(state.placement.retire_idle_s))
    if spec_path:
        argv += ["--spec", spec_path]
    (sup.home / "logs").mkdir(mode=0o700, exist_ok=True)
    # Its home is its working directory (below): made before it starts.
    (sup.home / ADOPTED_DIR).mkdir(mode=0o700, exist_ok=True)
    home.mkdir(mode=0o700, exist_ok=True)
    # A fresh supervisor: not the failpoints a test armed in this node's own process.
    env = {k: v for k, v in os.environ.items() if k not in (failpoints.ENV_VAR, failpoints.MARKER_DIR_ENV)}
    env[URL_ENV] = state.placement.url or ""
    with open(sup.home / "logs" / f"adopted-{hold.partition}.log", "ab") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=python_env(env), cwd=home,
            preexec_fn=lambda: prctl.set_pdeathsig(signal.SIGKILL),
        )
    state.adopted[hold.partition] = process
    state.adopted_epochs[hold.partition] = hold.epoch
    log.warning("adopted partition %s (epoch %d): supervisor pid %d", hold.partition, hold.epoch, process.pid)
    _record(sup, [("partition-adopting", hold.partition, {"epoch": hold.epoch, "pid": process.pid})])


def _reap(state: NodeState) -> None:
    for name, process in list(state.adopted.items()):
        code = process.poll()
        if code is None:
            continue
        del state.adopted[name]
        state.retry_after[name] = time.monotonic() + ADOPT_RETRY_S
        epoch = state.adopted_epochs.pop(name, None)
        if code == 0:
            # Retired, it kept its lease: this node keeps the partition dormant. One
            # it let go (handed back, given up) custody forgets (custody.py).
            if epoch is not None:
                state.dormant[name] = epoch
            log.info("adopted partition %s stopped: its runs are over, or it was handed back", name)
        else:
            log.error("the supervisor of adopted partition %s exited (%s)", name, code)


async def _leave(state: NodeState) -> None:
    for process in state.adopted.values():
        process.terminate()
    for process in state.adopted.values():
        await trio.to_thread.run_sync(process.wait)
    conn, state.conn = state.conn, None
    if conn is None:
        return
    try:
        if state.primary:
            cluster.mark_node(conn, state.placement.node, "down")
    except Exception as exc:  # the database is away: the node's heartbeat lease runs out by itself
        log.warning("could not mark node %s down: %s", state.placement.node, exc)
    finally:
        conn.close()

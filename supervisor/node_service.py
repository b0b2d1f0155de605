"""A supervisor as a node of a PostgreSQL-backed swarm.

At boot a node takes its own partition (supervisor/cluster.py) and opens the
ledger there, fenced by the partition's epoch. While it runs, it renews its lease
and its node heartbeat, and it watches for partitions whose lease expired with
unfinished runs in them: it takes such a partition over (a new epoch) and starts
one more supervisor process for it, on this host, which boots through the same
recovery as any restart (unknown outcomes become ``needs-reconciliation``,
never replays). That process dies with its node (PDEATHSIG), so a dead node's
adoptions are adopted again in turn.

A node whose lease was taken over stops at its next write or renewal, before
anything reaches the ledger or an actor: it exits with ``FENCED_EXIT``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from corral.core import failpoints
from corral.supervisor import cluster
from corral.supervisor.ledger import Ledger, SqliteLedger
from corral.supervisor.ledger_pg import PostgresLedger, connect_cluster, redact_url, schema_of
from corral.supervisor.ledger_spec import URL_ENV, Placement, remember

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

log = logging.getLogger("corral.node")

#: The exit status of a fenced supervisor (EX_TEMPFAIL: its node lost the lease).
FENCED_EXIT = 75
#: After an adopted partition's supervisor failed, wait this long before trying again.
ADOPT_RETRY_S = 30.0
ADOPTED_DIR = "adopted"


@dataclass
class NodeState:
    placement: Placement
    home: Path
    conn: Any
    hold: cluster.Hold
    spec_path: str | None
    adopted: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    retry_after: dict[str, float] = field(default_factory=dict)
    #: The cluster as this node last saw it, so its event stream tells every change.
    seen: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: An adopted partition: since when it holds no unfinished run (None: it does).
    idle_since: float | None = None

    @property
    def primary(self) -> bool:
        """The node's own supervisor (it adopts); not one it started for an adoption."""
        return self.placement.adopt is None


def open_ledger(
    home: Path, placement: Placement, *, synchronous: str, spec_path: str | None
) -> tuple[Ledger, NodeState | None]:
    if placement.url is None:
        from corral.supervisor import home as homes

        return SqliteLedger(home / homes.LEDGER, synchronous=synchronous, check=True, group_commit=True), None
    conn = connect_cluster(placement.url)
    if placement.adopt is not None:
        assert placement.epoch is not None
        hold = cluster.Hold(placement.adopt, placement.epoch)
    else:
        hold = cluster.acquire_own(conn, placement.node, spec_path, placement.lease_s, placement.last_partition)
        cluster.heartbeat_node(conn, placement.node, str(home), os.getpid(), placement.lease_s)
    remember(home, placement, hold.partition)
    ledger = PostgresLedger(placement.url, hold.partition, epoch=hold.epoch, group_commit=synchronous == "full")
    log.info("ledger: %s (epoch %d, node %s)", ledger.where, hold.epoch, placement.node)
    return ledger, NodeState(placement, home, conn, hold, spec_path)


def install(sup: Supervisor) -> None:
    state = sup.node
    if state is None:
        return
    ledger = sup.ledger
    assert isinstance(ledger, PostgresLedger)
    ledger.on_fenced = _exit_fenced
    hold = state.hold
    if state.primary:
        ledger.event("node-joined", state.placement.node, partition=hold.partition, epoch=hold.epoch, pid=sup.pid)
    else:
        ledger.event("partition-adopted", hold.partition, node=state.placement.node, epoch=hold.epoch, pid=sup.pid)
    sup.status_sections["cluster"] = lambda: {
        "node": state.placement.node,
        "partition": hold.partition,
        "epoch": hold.epoch,
        "ledger": redact_url(state.placement.url or ""),
        "adopting": sorted(state.adopted),
        **cluster.view(state.conn),
    }
    sup.background.append(lambda: _lease_loop(sup, state))
    sup.shutdown_hooks.append(lambda: _leave(state))


def _exit_fenced(why: str) -> None:
    # Nothing more may reach the ledger or an actor: every actor dies with this
    # process (PDEATHSIG), and the open transaction dies with its connection.
    log.error("fenced, stopping at once: %s", why)
    logging.shutdown()
    os._exit(FENCED_EXIT)


async def _lease_loop(sup: Supervisor, state: NodeState) -> None:
    lease_s = state.placement.lease_s
    while True:
        await trio.sleep(lease_s / 3)
        try:
            renewed, expired, changes = await trio.to_thread.run_sync(_tick, state)
        except Exception as exc:  # the database may be briefly unreachable: the next tick retries
            log.warning("lease renewal failed (%s); retrying", exc)
            continue
        if not renewed:
            assert isinstance(sup.ledger, PostgresLedger)
            sup.ledger.fence(f"the lease on partition {state.hold.partition} was taken over")
        if _retiring(state):
            # Its runs are over: stop, and let the lease run out, so that the node
            # it came from can take its partition back.
            sup.ledger.event("partition-retired", state.hold.partition, node=state.placement.node)
            sup.request_stop(f"adopted partition {state.hold.partition} has no unfinished run")
            return
        if changes:
            with sup.ledger.tx(fsync=False):  # they guard nothing: what the cluster tables say
                for kind, subject, data in changes:
                    sup.ledger.event(kind, subject, **data)
        _reap(state)
        for name in expired:
            hold = await trio.to_thread.run_sync(cluster.adopt, state.conn, name, state.placement.node, lease_s)
            if hold is not None:
                _start_adopted(sup, state, hold)


Change = tuple[str, str, dict[str, Any]]


def _tick(state: NodeState) -> tuple[bool, list[str], list[Change]]:
    """In a worker thread: the database may be slow or away, the event loop is not."""
    placement = state.placement
    renewed = cluster.renew(state.conn, state.hold, placement.node, placement.lease_s)
    if not renewed:
        return renewed, [], []
    if not state.primary:
        busy = cluster.has_unfinished_runs(state.conn, schema_of(state.hold.partition))
        state.idle_since = None if busy else (state.idle_since or time.monotonic())
        return renewed, [], []
    cluster.heartbeat_node(state.conn, placement.node, str(state.home), os.getpid(), placement.lease_s)
    changes = _changes(state, cluster.view(state.conn))
    now = time.monotonic()
    expired = [
        name
        for name in cluster.adoptable(state.conn)
        if name != state.hold.partition and name not in state.adopted and state.retry_after.get(name, 0) <= now
    ]
    return renewed, expired, changes


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
    spec_path = cluster.spec_path_of(state.conn, hold.partition)
    argv = [sys.executable, "-m", "corral.supervisor", "--home", str(home), "--node", state.placement.node,
            "--adopt", hold.partition, "--epoch", str(hold.epoch), "--lease-s", str(state.placement.lease_s),
            "--retire-idle-s", str(state.placement.retire_idle_s)]
    if spec_path:
        argv += ["--spec", spec_path]
    (sup.home / "logs").mkdir(mode=0o700, exist_ok=True)
    # A fresh supervisor: not the failpoints a test armed in this node's own process.
    env = {k: v for k, v in os.environ.items() if k not in (failpoints.ENV_VAR, failpoints.MARKER_DIR_ENV)}
    env[URL_ENV] = state.placement.url or ""
    with open(sup.home / "logs" / f"adopted-{hold.partition}.log", "ab") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
            preexec_fn=lambda: prctl.set_pdeathsig(signal.SIGKILL),
        )
    state.adopted[hold.partition] = process
    log.warning("adopted partition %s (epoch %d): supervisor pid %d", hold.partition, hold.epoch, process.pid)
    sup.ledger.event("partition-adopting", hold.partition, epoch=hold.epoch, pid=process.pid)


def _reap(state: NodeState) -> None:
    for name, process in list(state.adopted.items()):
        code = process.poll()
        if code is None:
            continue
        del state.adopted[name]
        state.retry_after[name] = time.monotonic() + ADOPT_RETRY_S
        if code == 0:
            log.info("adopted partition %s retired: its runs are over", name)
        else:
            log.error("the supervisor of adopted partition %s exited (%s)", name, code)


async def _leave(state: NodeState) -> None:
    for process in state.adopted.values():
        process.terminate()
    for process in state.adopted.values():
        await trio.to_thread.run_sync(process.wait)
    try:
        if state.primary:
            cluster.mark_node(state.conn, state.placement.node, "down")
    finally:
        state.conn.close()

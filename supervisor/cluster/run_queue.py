"""Any node takes any run: the cluster's shared queue, on a node.

A root run submitted to a node of a cluster (the CLI, the Python client, the
bridge: all go through the ``run`` control method) is created on that node at
once if the node has room for it; otherwise it waits in the shared queue
(``corral_cluster.queue``, supervisor/ledger/ledger_pg_queue.py), and the first
live node with room takes it, in the transaction that creates it in that node's
partition (``FOR UPDATE SKIP LOCKED``). A run that started stays where it is
with its actors; its children and delegations are created where it runs.

Room is the node's capacity (``[ledger] max_runs``: root runs pending or
running on the node; ``max_runs_per_agent``: runs of one agent pending or
running there, the agent's lane and those queued behind it). A node takes
queued runs when one of its runs ends, when it is given a submit it has no room
for, and every ``queue_poll_s``.

When a node dies, the root runs it took that never started (pending, never
claimed by their agent) go back to the shared queue, in the adopter's fenced
transaction that takes the partition over; those that started are adopted as
before (supervisor/cluster/custody.py, node_service.py).

A submit whose parameters carry a secret (redaction would change them), a goal
or a conversation stays on the node it was given to: its raw copy, its goal
row and its conversation live in that node's home and partition.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from corral.core.redact import redact
from corral.supervisor.errors import SupervisorError
from corral.supervisor.ledger import ledger_pg_queue
from corral.supervisor.ledger.ledger_link import Wakeup
from corral.supervisor.ledger.ledger_pg import PostgresLedger
from corral.supervisor.ledger.ledger_pg_cluster import CLUSTER_SCHEMA, QUEUED, schema_of
from corral.supervisor.ledger.ledger_pg_queue import QueuedRunTaken
from corral.supervisor.ledger.ledger_pg_wire import connect
from corral.supervisor.ledger.ledger_spec import DEFAULT_MAX_RUNS, DEFAULT_MAX_RUNS_PER_AGENT
from corral.supervisor.ledger.port import RunIdTaken
from corral.supervisor.runs.run_feature import Placed
from corral.supervisor.runs.run_state import TERMINAL, RunStatus

log = logging.getLogger("corral.queue")
_C = CLUSTER_SCHEMA
#: What a run keeps of the submit that made it, so that it can go back to the
#: shared queue if its node dies before it starts.
SUBMIT_KEY = "submit"
#: The submit's parameters a queued run carries (the rest are refused or pinned).
QUEUED_PARAMS = ("agent_id", "task", "script", "intent")


@dataclass(frozen=True)
class Capacity:
    """What a node takes on at once (``[ledger]``, docs/scale-out.md)."""

    max_runs: int = DEFAULT_MAX_RUNS
    max_runs_per_agent: int = DEFAULT_MAX_RUNS_PER_AGENT

    def as_dict(self) -> dict[str, int]:
        return {"max_runs": self.max_runs, "max_runs_per_agent": self.max_runs_per_agent}


@dataclass(frozen=True)
class Load:
    """A node's runs in flight: root runs pending or running, and per agent its
    runs (any kind) pending or running."""

    roots: int = 0
    per_agent: dict[str, int] = field(default_factory=dict)


def room(capacity: Capacity, load: Load, agents: list[str]) -> dict[str, int]:
    """How many more root runs of each agent this node takes now (pure)."""
    left = capacity.max_runs - load.roots
    if left <= 0:
        return {}
    free = {agent: min(left, capacity.max_runs_per_agent - load.per_agent.get(agent, 0)) for agent in agents}
    return {agent: n for agent, n in free.items() if n > 0}


def queueable(params: dict[str, Any]) -> bool:
    """A submit the cluster may run anywhere: no goal or conversation (they live
    in this node's partition), and nothing in what the queue keeps that redaction
    would change (the queue keeps what it is given, and no secret may
    reach the ledger)."""
    if params.get("goal") is not None or params.get("conversation_id") is not None:
        return False
    kept = {key: params[key] for key in QUEUED_PARAMS if params.get(key) is not None}
    return bool(redact(kept) == kept)


def load_of(ledger: PostgresLedger) -> Load:
    rows = ledger.all(
        "SELECT agent_id, kind, COUNT(*) AS n FROM runs WHERE status IN (?, ?) GROUP BY agent_id, kind",
        str(RunStatus.PENDING),
        str(RunStatus.RUNNING),
    )
    per_agent: dict[str, int] = {}
    roots = 0
    for row in rows:
        per_agent[str(row["agent_id"])] = per_agent.get(str(row["agent_id"]), 0) + int(row["n"])
        roots += int(row["n"]) if row["kind"] == "root" else 0
    return Load(roots, per_agent)


Creator = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class RunQueue:
    """A node's side of the shared queue: where its submits go, and taking
    queued runs while it has room. ``create`` is the run layer's ``run`` for a
    run taken off the queue (``RunControlMethods.create(from_queue=True)``)."""

    def __init__(self, ledger: PostgresLedger, node: str, agents: list[str], capacity: Capacity, poll_s: float) -> None:
        self.ledger = ledger
        self.node = node
        self.agents = agents
        self.capacity = capacity
        self.poll_s = poll_s
        self.create: Creator | None = None
        self.wakeup = Wakeup()
        #: Queued runs this node could not create (its spec refuses them): not tried again.
        self.refused: set[str] = set()
        self._conn: Any = None

    # -- submits ------------------------------------------------------------------

    def place(self, run_id: str | None, agent_id: str, params: dict[str, Any]) -> Placed:
        """A submit given to this node: here now if it has room (keeping the
        submit, so that it can go back to the queue), else into the shared queue."""
        if not queueable(params):
            return Placed(None, {})
        submit = {key: params[key] for key in QUEUED_PARAMS if params.get(key) is not None}
        if room(self.capacity, load_of(self.ledger), [agent_id]):
            return Placed(None, {SUBMIT_KEY: submit})
        run_id = run_id or "run-" + secrets.token_hex(6)
        try:
            with self.ledger.tx() as db:
                ledger_pg_queue.enqueue(db, run_id, agent_id, submit, self.node)
                self.ledger.event("run-queued", run_id, agent=agent_id, node=self.node)
        except RunIdTaken:
            raise RunIdTaken(run_id) from None  # the cluster has it: the run layer answers that run
        log.info("run %s queued (no room on node %s)", run_id, self.node)
        return Placed({"run_id": run_id, "queued": True}, {})

    def on_status(self, ledger: Any, run_id: str, status: RunStatus, reason: str | None) -> None:
        """A run that ended frees room: look at the queue now."""
        if status in TERMINAL:
            self.wakeup.set()

    # -- taking queued runs ---------------------------------------------------------

    async def loop(self) -> None:
        while True:
            try:
                while await self.take_some():
                    pass
            except Exception as exc:  # the database is away, or a statement failed: the next round tries again
                log.warning("shared queue: %s; trying again", exc)
                self._drop_conn()
            with trio.move_on_after(self.poll_s):
                await self.wakeup.wait()

    async def take_some(self) -> int:
        """Take queued runs while this node has room: how many it took."""
        if self.create is None or not self.ledger.available:
            return 0
        free = room(self.capacity, load_of(self.ledger), self.agents)
        if not free:
            return 0
        candidates = await trio.to_thread.run_sync(
            ledger_pg_queue.waiting, self._connection(), sorted(free), sum(free.values()) + len(self.refused)
        )
        taken = 0
        for queued in candidates:
            if queued.run_id in self.refused or free.get(queued.agent_id, 0) <= 0:
                continue
            if await self.take(queued):
                free[queued.agent_id] -= 1
                taken += 1
        return taken

    async def take(self, queued: ledger_pg_queue.Queued) -> bool:
        """Create a queued run in this node's partition, taking it off the queue
        in the same transaction; False: another node took it first."""
        assert self.create is not None
        self.ledger.from_queue = queued.run_id
        try:
            await self.create({**queued.params, "agent_id": queued.agent_id, "run_id": queued.run_id})
        except QueuedRunTaken:
            return False
        except SupervisorError as exc:  # this node's spec refuses it: another node may take it
            log.warning("queued run %s not taken here: %s", queued.run_id, exc)
            self.refused.add(queued.run_id)
            return False
        finally:
            self.ledger.from_queue = None
        log.info("took queued run %s (agent %s)", queued.run_id, queued.agent_id)
        return True

    def _connection(self) -> Any:
        if self._conn is None:
            self._conn = connect(self.ledger.url, f"corral-queue:{self.node}")
        return self._conn

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def close(self) -> None:
        self._drop_conn()


def requeue(conn: Any, partition: str, epoch: int) -> list[str]:
    """In a partition just taken over (``epoch``, fenced): its root runs that
    never started and came from a submit the queue may carry go back to the
    shared queue; each leaves the partition in the same transaction. Their ids."""
    schema = schema_of(partition)
    moved: list[str] = []
    with conn.transaction():
        conn.execute(f"SELECT {_C}.fence(%s, %s)", (partition, epoch))
        rows = conn.execute(
            f"SELECT run_id, agent_id, options FROM {schema}.runs WHERE kind = 'root' AND status = %s"
            " AND started_at IS NULL ORDER BY created_at FOR UPDATE",
            (str(RunStatus.PENDING),),
        ).fetchall()
        for run_id, agent_id, options in rows:
            submit = json.loads(options).get(SUBMIT_KEY) if isinstance(options, str) else None
            if not isinstance(submit, dict):
                continue  # pinned to its partition (a goal, a conversation, a secret)
            conn.execute(f"DELETE FROM {schema}.runs WHERE run_id = %s", (run_id,))
            conn.execute(f"UPDATE {_C}.run_ids SET partition = %s WHERE run_id = %s", (QUEUED, run_id))
            conn.execute(
                f"INSERT INTO {_C}.queue (run_id, agent_id, params, submitted_by, submitted_at)"
                " VALUES (%s, %s, %s::jsonb, %s, clock_timestamp())",
                (run_id, agent_id, json.dumps(submit), partition),
            )
            moved.append(str(run_id))
    return moved


def publish_capacity(conn: Any, node: str, capacity: Capacity | None, agents: list[str]) -> None:
    """What ``corral status`` shows of this node (``capacity`` None: it takes part
    in no queue), and the agents it runs (a client with no node refuses a submit
    for an agent no node runs: supervisor/cluster/front_door.py)."""
    conn.execute(
        f"UPDATE {_C}.nodes SET capacity = %s::jsonb, agents = %s::jsonb WHERE node_id = %s",
        (None if capacity is None else json.dumps(capacity.as_dict()), json.dumps(sorted(agents)), node),
    )


def cluster_load(conn: Any) -> dict[str, Any]:
    """For ``corral status``: per node its runs (unfinished; in flight; and
    waiting there for their agent, never started: its own backlog), over the
    partitions it holds, its capacity, and the shared queue's depth, with
    cluster totals."""
    terminal = [str(status) for status in TERMINAL]
    nodes: dict[str, dict[str, Any]] = {}
    for node_id, capacity in conn.execute(f"SELECT node_id, capacity FROM {_C}.nodes ORDER BY node_id"):
        nodes[str(node_id)] = {
            "node": str(node_id),
            "unfinished": 0,
            "in_flight": 0,
            "waiting": 0,
            "capacity": capacity if isinstance(capacity, dict) else None,
        }
    # Only partitions whose schema is made (a node's boot writes the row first): no
    # statement here may fail, since the connection may be inside the tick's
    # transaction (status and the tick share it), which a failure would abort.
    partitions = conn.execute(
        f"SELECT holder, schema_name FROM {_C}.partitions"
        " WHERE to_regclass(quote_ident(schema_name) || '.runs') IS NOT NULL ORDER BY name"
    ).fetchall()
    for holder, schema in partitions:
        row = conn.execute(
            f"SELECT COUNT(*) FILTER (WHERE status <> ALL(%s)),"
            f" COUNT(*) FILTER (WHERE kind = 'root' AND status IN ('pending', 'running')),"
            f" COUNT(*) FILTER (WHERE kind = 'root' AND status = 'pending' AND started_at IS NULL) FROM {schema}.runs",
            (terminal,),
        ).fetchone()
        entry = nodes.setdefault(
            str(holder), {"node": str(holder), "unfinished": 0, "in_flight": 0, "waiting": 0, "capacity": None}
        )
        entry["unfinished"] += int(row[0])
        entry["in_flight"] += int(row[1])
        entry["waiting"] += int(row[2])
    depth = ledger_pg_queue.depth(conn)
    listed = list(nodes.values())
    return {
        "queue_depth": depth,
        "nodes": listed,
        "totals": {
            "unfinished": sum(n["unfinished"] for n in listed),
            "in_flight": sum(n["in_flight"] for n in listed),
            "waiting": sum(n["waiting"] for n in listed),
            "queued": depth,
            "max_runs": sum((n["capacity"] or {}).get("max_runs", 0) for n in listed),
        },
    }


def queued_view(conn: Any, run_id: str) -> dict[str, Any] | None:
    """``show`` of a run waiting in the shared queue (None: it is not)."""
    row = conn.execute(
        f"SELECT agent_id, params, submitted_by, extract(epoch FROM submitted_at), cancelled_at IS NOT NULL"
        f" FROM {_C}.queue WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    if row is None:
        return None
    params = row[1] if isinstance(row[1], dict) else {}
    cancelled = bool(row[4])  # cancelled while it waited: no node ever took it
    run = {
        "run_id": run_id,
        "agent_id": str(row[0]),
        "kind": "root",
        "status": str(RunStatus.CANCELLED if cancelled else RunStatus.PENDING),
        "reason": "cancelled while it waited in the shared queue" if cancelled else None,
        "queued": not cancelled,
        "task": params.get("task") or "",
        "submitted_by": str(row[2]),
        "created_at": float(row[3]),
    }
    return {"run": run, "actions": [], "receipts": [], "final_reply": None, "queued": not cancelled}


def statuses(conn: Any, run_ids: list[str], besides: str) -> dict[str, str]:
    """The status of each run of ``run_ids`` the cluster holds outside partition
    ``besides``: in another partition, or queued (pending)."""
    rows = conn.execute(
        f"SELECT i.run_id, i.partition, p.schema_name, q.cancelled_at IS NOT NULL FROM {_C}.run_ids i"
        f" LEFT JOIN {_C}.partitions p ON p.name = i.partition LEFT JOIN {_C}.queue q ON q.run_id = i.run_id"
        " WHERE i.run_id = ANY(%s) AND i.partition <> %s",
        (run_ids, besides),
    ).fetchall()
    found: dict[str, str] = {}
    for run_id, partition, schema, cancelled in rows:
        if partition == QUEUED:
            found[str(run_id)] = str(RunStatus.CANCELLED if cancelled else RunStatus.PENDING)
        elif schema is not None and schema == schema_of(str(partition)):
            row = conn.execute(f"SELECT status FROM {schema}.runs WHERE run_id = %s", (run_id,)).fetchone()
            if row is not None:
                found[str(run_id)] = str(row[0])
    return found

"""The cluster tables: nodes with heartbeat leases, partitions with fenced leases.

All times are the database's clock (``clock_timestamp()``), so hosts whose clocks
disagree still agree on who holds what. A partition is taken over only once its
lease has expired, and the takeover bumps its epoch: the fencing token that
every write of the old holder checks (supervisor/ledger/ledger_pg.py).

A node that comes back asks for its own partition (``wanted_by``): the node that
adopted it hands it back as soon as it holds no unfinished run (it stops, and
gives the lease up), and nobody else adopts it meanwhile. A partition whose
schema is newer than this corral's is never taken over by it (``refusal``).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from corral.supervisor.ledger.ledger_pg_cluster import CLUSTER_SCHEMA, RENEW_SQL, schema_of
from corral.supervisor.ledger.schema import MIGRATIONS
from corral.supervisor.runs.run_state import TERMINAL

_C = CLUSTER_SCHEMA
#: How many names a node tries for its own partition ("a", "a-2", ...) when an
#: earlier one is held by another node (which adopted it while this one was down).
MAX_GENERATIONS = 50
#: How often a returning node looks whether the adopter handed its partition back.
HANDBACK_POLL_S = 0.1


@dataclass(frozen=True)
class Hold:
    partition: str
    epoch: int


def heartbeat_node(conn: Any, node_id: str, home: str, pid: int, lease_s: float, status: str = "up") -> None:
    conn.execute(
        f"INSERT INTO {_C}.nodes (node_id, host, pid, home, started_at, heartbeat_at, lease_until, status)"
        " VALUES (%s, %s, %s, %s, clock_timestamp(), clock_timestamp(),"
        " clock_timestamp() + make_interval(secs => %s), %s)"
        " ON CONFLICT (node_id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, home = EXCLUDED.home,"
        " heartbeat_at = EXCLUDED.heartbeat_at, lease_until = EXCLUDED.lease_until, status = EXCLUDED.status",
        (node_id, socket.gethostname(), pid, home, lease_s, status),
    )


def mark_node(conn: Any, node_id: str, status: str) -> None:
    conn.execute(f"UPDATE {_C}.nodes SET status = %s, heartbeat_at = clock_timestamp() WHERE node_id = %s",
                 (status, node_id))


def acquire_own(
    conn: Any, node_id: str, spec_path: str | None, lease_s: float, last: str | None, handback_wait_s: float = 0.0
) -> Hold:
    """The partition a node writes its new runs to: the one it used last (``last``)
    if nobody else holds it, else its node id, else the next free generation.

    A restart of the same node takes back at once what it holds (the home lock on
    its host says the previous process is gone, and its adoptions died with it:
    PDEATHSIG). A partition another node adopted is taken back once that node let
    it go (its lease expired: it retired the partition, or died). While that node
    holds it, this node asks for it (``wanted_by``) and waits up to
    ``handback_wait_s`` for the adopter to hand it back, which it does once the
    partition holds no unfinished run; one that still has runs to finish stays
    with its adopter, and this node writes its new runs to a new generation, and
    takes the old partition over (dormant) once its adopter hands it back.
    """
    names = ([last] if last else []) + [node_id] + [f"{node_id}-{n}" for n in range(2, MAX_GENERATIONS + 1)]
    for name in dict.fromkeys(names):
        hold = _take(conn, name, node_id, spec_path, lease_s)
        if hold is None and name in (last, node_id) and handback_wait_s > 0:
            hold = _ask_back(conn, name, node_id, spec_path, lease_s, handback_wait_s)
        if hold is not None:
            return hold
    raise RuntimeError(f"node {node_id}: no free partition among {MAX_GENERATIONS} generations")


def _take(conn: Any, name: str, node_id: str, spec_path: str | None, lease_s: float) -> Hold | None:
    """Create ``name``, or take it if this node holds it or nobody does (its lease expired)."""
    schema = schema_of(name)
    with conn.transaction():
        row = conn.execute(
            f"INSERT INTO {_C}.partitions (name, schema_name, holder, epoch, lease_until, spec_path, created_at)"
            " VALUES (%s, %s, %s, 1, clock_timestamp() + make_interval(secs => %s), %s, clock_timestamp())"
            " ON CONFLICT (name) DO NOTHING RETURNING epoch",
            (name, schema, node_id, lease_s, spec_path),
        ).fetchone()
        if row is None:
            row = conn.execute(
                f"UPDATE {_C}.partitions SET holder = %s, epoch = epoch + 1, spec_path = COALESCE(%s, spec_path),"
                " lease_until = clock_timestamp() + make_interval(secs => %s), wanted_by = NULL,"
                " adopted_from = CASE WHEN holder = %s THEN adopted_from ELSE holder END"
                " WHERE name = %s AND (holder = %s OR lease_until < clock_timestamp())"
                " RETURNING epoch",
                (node_id, spec_path, lease_s, node_id, name, node_id),
            ).fetchone()
    return Hold(name, int(row[0])) if row is not None else None


def _ask_back(
    conn: Any, name: str, node_id: str, spec_path: str | None, lease_s: float, wait_s: float
) -> Hold | None:
    """Ask the adopter of this node's partition to hand it back, and take it once
    it did; None if it still has runs to finish (or did not answer in ``wait_s``).
    The request stays: the adopter hands the partition over once its runs are
    over, and this node takes it then (supervisor/cluster/custody.py), so it is
    never left to nobody."""
    row = conn.execute(f"SELECT schema_name FROM {_C}.partitions WHERE name = %s", (name,)).fetchone()
    if row is None:
        return None
    conn.execute(f"UPDATE {_C}.partitions SET wanted_by = %s WHERE name = %s AND holder <> %s",
                 (node_id, name, node_id))
    if has_unfinished_runs(conn, str(row[0])):
        return None  # its adopter is serving runs: it keeps them until they are over
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        hold = _take(conn, name, node_id, spec_path, lease_s)
        if hold is not None:
            return hold
        # The adopter hands it back to a live node only: this one is alive, booting.
        conn.execute(f"UPDATE {_C}.nodes SET lease_until = clock_timestamp() + make_interval(secs => %s)"
                     " WHERE node_id = %s", (lease_s, node_id))
        time.sleep(HANDBACK_POLL_S)
    return None


def wanted_back(conn: Any, name: str) -> str | None:
    """The live node that asks for this partition back, if any."""
    row = conn.execute(
        f"SELECT p.wanted_by FROM {_C}.partitions p JOIN {_C}.nodes n ON n.node_id = p.wanted_by"
        " WHERE p.name = %s AND p.wanted_by <> p.holder AND n.status = 'up' AND n.lease_until > clock_timestamp()",
        (name,),
    ).fetchone()
    return str(row[0]) if row else None


def renew(conn: Any, hold: Hold, node_id: str, lease_s: float) -> bool:
    """Extend this holder's lease; False: the epoch moved on (this holder is fenced)."""
    row = conn.execute(RENEW_SQL, (lease_s, hold.partition, hold.epoch, node_id)).fetchone()
    return row is not None


def has_unfinished_runs(conn: Any, schema: str) -> bool:
    """A run not yet completed, failed or cancelled (parked ones count)."""
    terminal = tuple(str(status) for status in TERMINAL)
    placeholders = ", ".join(["%s"] * len(terminal))
    try:
        row = conn.execute(f"SELECT 1 FROM {schema}.runs WHERE status NOT IN ({placeholders}) LIMIT 1", terminal)
        return row.fetchone() is not None
    except Exception:  # a partition whose schema is not made yet holds nothing
        return False


def schema_version_of(conn: Any, schema: str) -> int | None:
    """The schema a partition is at (None: not made yet)."""
    try:
        row = conn.execute(f"SELECT value FROM {schema}.corral_meta WHERE key = 'schema_version'").fetchone()
    except Exception:
        return None
    return int(row[0]) if row else None


@dataclass(frozen=True)
class Refusal:
    """A partition this corral may not adopt: its schema is newer than this corral's."""

    partition: str
    schema: int
    supported: int
    epoch: int
    holder: str

    @property
    def advice(self) -> str:
        return (f"upgrade corral on this node (it knows schema {self.supported}), or start a node whose corral"
                f" knows schema {self.schema}: that node adopts partition {self.partition} and finishes its runs")

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, "schema": self.schema, "supported": self.supported,
                "epoch": self.epoch, "holder": self.holder, "advice": self.advice}


def adoptable(conn: Any, grace_s: float = 0.0) -> tuple[list[str], list[Refusal]]:
    """Partitions whose lease expired and that still hold unfinished runs, except
    those their own node asks back (it takes them); and those of them whose
    schema is newer than this corral's, which it must not adopt.

    Within ``grace_s`` of the server's start, none: every lease lapsed while the
    server was down, and the live nodes have not had a tick to renew theirs yet
    (a restart must not turn into every node fencing every other)."""
    rows = conn.execute(
        f"SELECT p.name, p.schema_name, p.epoch, p.holder FROM {_C}.partitions p"
        f" LEFT JOIN {_C}.nodes n ON n.node_id = p.wanted_by"
        " WHERE p.lease_until < clock_timestamp()"
        " AND NOT (n.node_id IS NOT NULL AND n.status = 'up' AND n.lease_until > clock_timestamp())"
        " AND clock_timestamp() > pg_postmaster_start_time() + make_interval(secs => %s)"
        " ORDER BY p.name",
        (grace_s,),
    ).fetchall()
    ours = len(MIGRATIONS)
    free: list[str] = []
    refused: list[Refusal] = []
    for name, schema, epoch, holder in rows:
        if not has_unfinished_runs(conn, schema):
            continue
        version = schema_version_of(conn, schema)
        if version is not None and version > ours:
            refused.append(Refusal(str(name), version, ours, int(epoch), str(holder)))
        else:
            free.append(str(name))
    return free, refused


def adopt(conn: Any, name: str, node_id: str, lease_s: float) -> Hold | None:
    """Take an expired partition over; None: someone renewed or took it first. A
    node that adopts again what it adopted before (its supervisor for it failed)
    keeps the node it was adopted from."""
    row = conn.execute(
        f"UPDATE {_C}.partitions SET adopted_from = CASE WHEN holder = %s THEN adopted_from ELSE holder END,"
        " holder = %s, epoch = epoch + 1,"
        " lease_until = clock_timestamp() + make_interval(secs => %s), adopted_at = clock_timestamp()"
        " WHERE name = %s AND lease_until < clock_timestamp() RETURNING epoch",
        (node_id, node_id, lease_s, name),
    ).fetchone()
    return Hold(name, int(row[0])) if row else None


def partition_of_run(conn: Any, run_id: str, besides: str) -> str | None:
    """The partition (other than ``besides``) that holds run ``run_id``."""
    rows = conn.execute(f"SELECT name, schema_name FROM {_C}.partitions WHERE name <> %s ORDER BY name",
                        (besides,)).fetchall()
    for name, schema in rows:
        try:
            if conn.execute(f"SELECT 1 FROM {schema}.runs WHERE run_id = %s", (run_id,)).fetchone():
                return str(name)
        except Exception:  # a partition whose schema is not made yet holds nothing
            continue
    return None


def spec_path_of(conn: Any, name: str) -> str | None:
    row = conn.execute(f"SELECT spec_path FROM {_C}.partitions WHERE name = %s", (name,)).fetchone()
    return str(row[0]) if row and row[0] else None


def view(conn: Any) -> dict[str, Any]:
    """Every node and partition, with how long until each lease runs out."""
    nodes = conn.execute(
        f"SELECT node_id, host, pid, home, status, extract(epoch FROM heartbeat_at) AS heartbeat_at,"
        f" extract(epoch FROM lease_until - clock_timestamp()) AS lease_left_s FROM {_C}.nodes ORDER BY node_id"
    ).fetchall()
    partitions = conn.execute(
        f"SELECT name, holder, epoch, adopted_from, extract(epoch FROM adopted_at) AS adopted_at,"
        f" extract(epoch FROM lease_until - clock_timestamp()) AS lease_left_s FROM {_C}.partitions ORDER BY name"
    ).fetchall()

    def plain(row: Any) -> dict[str, Any]:
        data = {key: row[key] for key in row.keys()}  # noqa: SIM118 - a row, not a dict
        for key in ("heartbeat_at", "adopted_at", "lease_left_s"):
            if data.get(key) is not None:
                data[key] = round(float(data[key]), 3)
        return data

    return {"nodes": [plain(row) for row in nodes], "partitions": [plain(row) for row in partitions]}

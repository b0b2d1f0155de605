"""The cluster tables: nodes with heartbeat leases, partitions with fenced leases.

All times are the database's clock (``clock_timestamp()``), so hosts whose clocks
disagree still agree on who holds what. A partition is taken over only once its
lease has expired, and the takeover bumps its epoch: the fencing token that
every write of the old holder checks (supervisor/ledger_pg.py).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from corral.supervisor.ledger_pg import CLUSTER_SCHEMA, schema_of
from corral.supervisor.run_state import TERMINAL

_C = CLUSTER_SCHEMA
#: How many names a node tries for its own partition ("a", "a-2", ...) when an
#: earlier one is held by another node (which adopted it while this one was down).
MAX_GENERATIONS = 50


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


def acquire_own(conn: Any, node_id: str, spec_path: str | None, lease_s: float, last: str | None) -> Hold:
    """The partition a node writes its new runs to: the one it used last (``last``)
    if nobody else holds it, else its node id, else the next free generation.

    A restart of the same node takes back at once what it holds (the home lock on
    its host says the previous process is gone, and its adoptions died with it:
    PDEATHSIG). A partition another node
    adopted is taken back once that node let it go (its lease expired: it retired
    the partition, or died); while that node holds it, it is left to it.
    """
    names = ([last] if last else []) + [node_id] + [f"{node_id}-{n}" for n in range(2, MAX_GENERATIONS + 1)]
    for name in dict.fromkeys(names):
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
                    " lease_until = clock_timestamp() + make_interval(secs => %s),"
                    " adopted_from = CASE WHEN holder = %s THEN adopted_from ELSE holder END"
                    " WHERE name = %s AND (holder = %s OR lease_until < clock_timestamp())"
                    " RETURNING epoch",
                    (node_id, spec_path, lease_s, node_id, name, node_id),
                ).fetchone()
        if row is not None:
            return Hold(name, int(row[0]))
    raise RuntimeError(f"node {node_id}: no free partition among {MAX_GENERATIONS} generations")


def renew(conn: Any, hold: Hold, node_id: str, lease_s: float) -> bool:
    """Extend this holder's lease; False: the epoch moved on (this holder is fenced)."""
    row = conn.execute(
        f"UPDATE {_C}.partitions SET lease_until = clock_timestamp() + make_interval(secs => %s)"
        " WHERE name = %s AND epoch = %s AND holder = %s RETURNING epoch",
        (lease_s, hold.partition, hold.epoch, node_id),
    ).fetchone()
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


def adoptable(conn: Any) -> list[str]:
    """Partitions whose lease expired and that still hold unfinished runs."""
    rows = conn.execute(
        f"SELECT name, schema_name FROM {_C}.partitions WHERE lease_until < clock_timestamp() ORDER BY name"
    ).fetchall()
    return [str(name) for name, schema in rows if has_unfinished_runs(conn, schema)]


def adopt(conn: Any, name: str, node_id: str, lease_s: float) -> Hold | None:
    """Take an expired partition over; None: someone renewed or took it first."""
    row = conn.execute(
        f"UPDATE {_C}.partitions SET adopted_from = holder, holder = %s, epoch = epoch + 1,"
        " lease_until = clock_timestamp() + make_interval(secs => %s), adopted_at = clock_timestamp()"
        " WHERE name = %s AND lease_until < clock_timestamp() RETURNING epoch",
        (node_id, lease_s, name),
    ).fetchone()
    return Hold(name, int(row[0])) if row else None


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

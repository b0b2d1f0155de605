"""Every partition has a live owner: a node that holds its lease.

A partition with unfinished runs is held by the supervisor that serves them (its
node's own, or one started for an adoption). One whose runs are all over needs
no supervisor, but it still needs an owner, or it is left to nobody (an adoption
that retired, a node that left). A node's own supervisor therefore keeps such
partitions *dormant*: it renews their leases at each tick, and starts a
supervisor for one only if it holds unfinished runs again.

Who owns a partition whose serving supervisor stops:

- **Retired** (its runs are over and nobody asks for it): the adopting node keeps
  it dormant. Handing it to nobody is what orphaned it.
- **Asked back** (``wanted_by``: the node it came from is back): the holder lets
  it go (a dormant one at once, a busy adoption once its runs are over) and the
  asking node takes it, even while it writes its new runs to a new partition
  (``host-a-2``): it then owns both, the old one dormant. The asking node
  keeps asking until it has it: a busy adopter no longer strands it.
- **Its owner died**: a partition with unfinished runs is adopted as before; an
  idle one is taken dormant by a live node once its lease lapsed well past a
  lease (``IDLE_GRACE_LEASES``) and its holder's node is not live, so that a
  slow but live node is never fenced for a partition nobody needed.
- **A previous life of this node** held it (a restart): taken back at once, with
  a new epoch (a supervisor of that life still dying is fenced).

A dormant partition that another node asked something of (``corral reconcile``
there: supervisor/cluster/forwarding.py) is served again: its supervisor takes
the request, and retires again once idle.

The decisions are pure (``decide``); the statements around them are in
``tend``, which runs in the node's tick (a worker thread).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from corral.supervisor.cluster import cluster_tables as cluster
from corral.supervisor.cluster import forwarding
from corral.supervisor.ledger.ledger_pg_cluster import CLUSTER_SCHEMA, RENEW_SQL

_C = CLUSTER_SCHEMA
#: An idle partition of a node that is not live is taken dormant only once its
#: lease lapsed this many leases ago, and as long after the server's start or
#: this node's reconnection: nothing waits for it, and a node that is merely
#: slow (or reconnecting after an outage) must never be fenced for it.
IDLE_GRACE_LEASES = 3.0


class Step(enum.Enum):
    KEEP = "keep"  # a dormant partition of ours: renew its lease
    DROP = "drop"  # it is not ours any more (a new epoch): forget it
    RELEASE = "release"  # its node asks for it back: let it go now
    TAKE = "take"  # take it (a new epoch), then keep it dormant or serve it
    TAKE_IDLE = "take-idle"  # take it only if no run of it is unfinished
    NONE = "none"


@dataclass(frozen=True)
class Row:
    """One partition as ``tend`` reads it."""

    name: str
    schema: str
    holder: str
    epoch: int
    lapsed: bool
    long_lapsed: bool
    holder_live: bool
    wanted_by: str | None
    wanted_live: bool
    grace_over: bool


def decide(row: Row, me: str, dormant: dict[str, int], busy: set[str], may_take: bool) -> Step:
    """What this node does about one partition (``busy``: its own, those its
    adoption supervisors serve, and those it waits to adopt again after a
    failure; ``dormant``: name to the epoch it holds it at)."""
    wanted_elsewhere = row.wanted_live and row.wanted_by not in (None, me)
    if row.name in dormant:
        # A dormant lease is renewed at every tick: one that lapsed was let go (handed
        # back, or given up by a supervisor that could not make progress).
        if row.holder != me or row.epoch != dormant[row.name] or row.lapsed:
            return Step.DROP
        return Step.RELEASE if wanted_elsewhere else Step.KEEP
    if row.name in busy:
        return Step.NONE
    if row.holder == me and not row.lapsed:
        return Step.TAKE  # a previous life of this node held it (a restart)
    if row.wanted_by == me and row.lapsed:
        return Step.TAKE  # its adopter let it go, or died: ours again
    if (may_take and row.grace_over and row.long_lapsed and (row.holder == me or not row.holder_live)
            and not wanted_elsewhere):
        return Step.TAKE_IDLE  # no live owner; one with unfinished runs is adoption's
    return Step.NONE


@dataclass
class Tended:
    """What a tick of custody did: partitions to serve (unfinished runs), and events."""

    serve: list[cluster.Hold] = field(default_factory=list)
    changes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)


def read_rows(conn: Any, me: str, lease_s: float) -> list[Row]:
    rows = conn.execute(
        f"SELECT p.name, p.schema_name, p.holder, p.epoch, p.wanted_by,"
        " p.lease_until < clock_timestamp() AS lapsed,"
        " p.lease_until < clock_timestamp() - make_interval(secs => %s) AS long_lapsed,"
        f" EXISTS (SELECT 1 FROM {_C}.nodes h WHERE h.node_id = p.holder AND h.status = 'up'"
        "         AND h.lease_until > clock_timestamp()) AS holder_live,"
        f" EXISTS (SELECT 1 FROM {_C}.nodes w WHERE w.node_id = p.wanted_by AND w.status = 'up'"
        "         AND w.lease_until > clock_timestamp()) AS wanted_live,"
        " clock_timestamp() > pg_postmaster_start_time() + make_interval(secs => %s) AS grace_over"
        f" FROM {_C}.partitions p ORDER BY p.name",
        (IDLE_GRACE_LEASES * lease_s, IDLE_GRACE_LEASES * lease_s),
    ).fetchall()
    return [Row(str(r["name"]), str(r["schema_name"]), str(r["holder"]), int(r["epoch"]), bool(r["lapsed"]),
                bool(r["long_lapsed"]), bool(r["holder_live"]), r["wanted_by"], bool(r["wanted_live"]),
                bool(r["grace_over"])) for r in rows]


def tend(conn: Any, me: str, lease_s: float, dormant: dict[str, int], busy: set[str], may_take: bool) -> Tended:
    """One tick of custody (a worker thread): renew, release, take; ``dormant`` is
    updated in place. Partitions taken or kept that hold unfinished runs, or a
    request nobody took, are returned to be served (and leave ``dormant``)."""
    tended = Tended()
    for row in read_rows(conn, me, lease_s):
        step = decide(row, me, dormant, busy, may_take)
        if step is Step.NONE:
            continue
        if step is Step.DROP:
            del dormant[row.name]
            continue
        if step is Step.RELEASE:
            release(conn, row.name, dormant.pop(row.name), me)
            tended.changes.append(("partition-handed-back", row.name, {"to": row.wanted_by}))
            continue
        if step is Step.KEEP:
            if conn.execute(RENEW_SQL, (lease_s, row.name, row.epoch, me)).fetchone() is None:
                del dormant[row.name]
                continue
            epoch = row.epoch
        else:  # TAKE, TAKE_IDLE
            if step is Step.TAKE_IDLE and cluster.has_unfinished_runs(conn, row.schema):
                continue  # unfinished runs of a lost owner: adoption's business
            taken = take(conn, row.name, me, lease_s, row.epoch)
            if taken is None:
                continue
            epoch = taken
            dormant[row.name] = epoch
            tended.changes.append(("partition-held-dormant", row.name, {"epoch": epoch, "from": row.holder}))
        if cluster.has_unfinished_runs(conn, row.schema) or forwarding.has_open_requests(conn, row.name):
            del dormant[row.name]
            tended.serve.append(cluster.Hold(row.name, epoch))
    return tended


def take(conn: Any, name: str, me: str, lease_s: float, seen_epoch: int) -> int | None:
    """A new epoch for this node, if nobody moved the partition since it was read."""
    row = conn.execute(
        f"UPDATE {_C}.partitions SET adopted_from = CASE WHEN holder = %s THEN adopted_from ELSE holder END,"
        " holder = %s, epoch = epoch + 1, lease_until = clock_timestamp() + make_interval(secs => %s),"
        " adopted_at = CASE WHEN holder = %s THEN adopted_at ELSE clock_timestamp() END,"
        " wanted_by = CASE WHEN wanted_by = %s THEN NULL ELSE wanted_by END"
        " WHERE name = %s AND epoch = %s AND (holder = %s OR lease_until < clock_timestamp()) RETURNING epoch",
        (me, me, lease_s, me, me, name, seen_epoch, me),
    ).fetchone()
    return int(row[0]) if row else None


def release(conn: Any, name: str, epoch: int, me: str) -> None:
    """Let a dormant partition go now (its node asks for it back)."""
    conn.execute(
        f"UPDATE {_C}.partitions SET lease_until = clock_timestamp() WHERE name = %s AND epoch = %s AND holder = %s",
        (name, epoch, me),
    )


def release_all(conn: Any, dormant: dict[str, int], me: str) -> None:
    """A node that leaves lets its dormant partitions go (another live node takes
    them once they lapsed past the grace)."""
    for name, epoch in dormant.items():
        release(conn, name, epoch, me)
    dormant.clear()

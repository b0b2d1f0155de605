"""Calls for another node's partition: ``corral reconcile`` works from any node,
and a client with no node approves, denies and cancels (front_door.py).

Only a partition's holder writes it (its epoch fences everyone else), so a node
asked to reconcile an action of a partition it does not hold does not write it:
it leaves the call in ``corral_cluster.requests`` and waits for the answer. The
holder (a node's own supervisor, or the one it started for an adoption) takes
the open requests of its partition as soon as they are announced (``NOTIFY``
on ``REQUESTS_CHANNEL``, node_requests.py) and again at each tick (for one
announced while it was not listening), runs each on its own fenced ledger, and
answers once what it committed is durable.

A request is taken in one statement (``taken_by``), and the asker withdraws one
it gave up on only while nobody took it: so a request is either run once by
the holder or not at all, and the asker says which. A holder that dies after
taking one leaves it taken and unanswered: the asker then says the outcome is
not known, and ``corral show`` tells it.
"""

from __future__ import annotations

import contextlib
import enum
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from corral.supervisor.errors import SupervisorError
from corral.supervisor.ledger.ledger_pg_cluster import CLUSTER_SCHEMA, REQUESTS_CHANNEL, connect_cluster

_C = CLUSTER_SCHEMA
#: How long an asker waits for the holder's answer: a holder takes requests at
#: each tick (a third of its lease), so this is several ticks of the longest lease.
FORWARD_WAIT_S = 20.0
FORWARD_POLL_S = 0.1
#: Where an id of each kind lives in a partition: an action, a process session, a
#: provider request (the reconcilers of supervisor/runs/run_control.py).
_TARGETS = (("act-", "actions", "action_id"), ("proc-", "sessions", "process_id"), ("", "provider_requests", "slot"))


class ForwardedCall(enum.StrEnum):
    """What a node or a client may ask of a partition's holder: the control
    methods of the same names, run there."""

    RECONCILE = "reconcile"
    DECIDE = "continue_action"  # approve or deny
    CANCEL = "cancel"
    APPROVAL = "approval.show"  # a read, but of the holder's workspace files too (a diff)


class ForwardFailed(SupervisorError):
    def __init__(self, message: str, code: str = "unavailable") -> None:
        super().__init__(message, code=code)


@dataclass(frozen=True)
class Request:
    id: int
    call: ForwardedCall
    params: dict[str, Any]
    asked_by: str


def partition_of_target(conn: Any, target: str) -> tuple[str, str] | None:
    """The partition holding this action id, process id or provider slot, and its
    holder; None: no partition does."""
    table, column = next((table, column) for prefix, table, column in _TARGETS if target.startswith(prefix))
    rows = conn.execute(f"SELECT name, schema_name, holder FROM {_C}.partitions ORDER BY name").fetchall()
    for name, schema, holder in rows:
        try:
            if conn.execute(f"SELECT 1 FROM {schema}.{table} WHERE {column} = %s", (target,)).fetchone():
                return str(name), str(holder)
        except Exception:  # a partition whose schema is not made yet holds nothing
            continue
    return None


def has_open_requests(conn: Any, partition: str) -> bool:
    """Someone asked something of this partition that nobody took yet (a dormant
    partition is then served: supervisor/cluster/custody.py)."""
    row = conn.execute(f"SELECT 1 FROM {_C}.requests WHERE partition = %s AND taken_by IS NULL LIMIT 1",
                       (partition,)).fetchone()
    return row is not None


def take_requests(conn: Any, partition: str, node_id: str) -> list[Request]:
    """The holder's side, at each tick: the open requests of its partition, taken."""
    rows = conn.execute(
        f"UPDATE {_C}.requests SET taken_by = %s, taken_at = clock_timestamp()"
        " WHERE partition = %s AND taken_by IS NULL RETURNING id, call, params, asked_by",
        (node_id, partition),
    ).fetchall()
    taken: list[Request] = []
    for row in rows:
        try:
            call = ForwardedCall(str(row[1]))
        except ValueError:
            answer(conn, int(row[0]), {"error": {"code": "bad-request", "message": f"unknown call {row[1]!r}"}})
            continue
        params = row[2] if isinstance(row[2], dict) else json.loads(row[2])
        taken.append(Request(int(row[0]), call, dict(params), str(row[3])))
    return sorted(taken, key=lambda request: request.id)


def answer(conn: Any, request_id: int, reply: dict[str, Any]) -> None:
    conn.execute(f"UPDATE {_C}.requests SET answer = %s::jsonb, answered_at = clock_timestamp() WHERE id = %s",
                 (json.dumps(reply), request_id))


Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def serve(request: Request, handlers: Mapping[ForwardedCall, Handler],
                durable: Callable[[], Awaitable[None]]) -> dict[str, Any]:
    """Run one taken request on this holder's ledger (the control method of its
    name, which checks its parameters as for a local caller); its answer (a
    result, or the refusal a local caller would get), once what it committed is
    durable."""
    params = {**request.params, "forwarded_from": request.asked_by}
    try:
        result = await handlers[request.call](params)
    except SupervisorError as exc:
        await durable()
        return {"error": {"code": exc.code, "message": str(exc)}}
    await durable()
    return {"result": result}


def ask(conn: Any, partition: str, call: ForwardedCall, params: dict[str, Any], asked_by: str) -> int:
    """Leave a call for the partition's holder, and announce it (the holder takes
    it at once; one that missed the announcement, at its next tick)."""
    row = conn.execute(
        f"INSERT INTO {_C}.requests (partition, call, params, asked_by, asked_at)"
        " VALUES (%s, %s, %s::jsonb, %s, clock_timestamp()) RETURNING id",
        (partition, call.value, json.dumps(params), asked_by),
    ).fetchone()
    conn.execute("SELECT pg_notify(%s, %s)", (REQUESTS_CHANNEL, partition))
    return int(row[0])


def forward(conn: Any, partition: str, holder: str, call: ForwardedCall, params: dict[str, Any],
            asked_by: str, wait_s: float = FORWARD_WAIT_S) -> dict[str, Any]:
    """Ask and wait for the answer (blocking: in a worker thread, or a client's).
    The holder's result; ``ForwardFailed`` with its refusal, or when nobody took
    the call in time (nothing was done) or the taker did not answer (not known)."""
    request_id = ask(conn, partition, call, params, asked_by)
    deadline = time.monotonic() + wait_s
    reply = None
    while reply is None and time.monotonic() < deadline:
        reply = _answer_of(conn, request_id)
        if reply is None:
            time.sleep(FORWARD_POLL_S)
    if reply is None:
        reply = _answer_of(conn, request_id)
    if reply is None:
        withdrawn = _withdraw(conn, request_id)
        # Taken and not answered: its row goes too (an answer that comes later
        # lands nowhere); what happened is in the partition's ledger.
        _forget(conn, request_id)
        if withdrawn:
            raise ForwardFailed(f"partition {partition} is held by node {holder}, which did not take the request"
                                f" within {wait_s:.0f} s; nothing was done, try again")
        raise ForwardFailed(f"node {holder} took the request for partition {partition} and has not answered;"
                            " its outcome is not known yet: `corral show RUN` tells it")
    _forget(conn, request_id)
    error = reply.get("error")
    if isinstance(error, dict):
        raise ForwardFailed(f"{error.get('message')} (partition {partition}, held by node {holder})",
                            str(error.get("code") or "refused"))
    result = reply.get("result")
    return {**(result if isinstance(result, dict) else {}), "partition": partition, "holder": holder}


class Forwarder:
    """The asking side: ``reconcile`` of an id that another partition holds."""

    def __init__(self, url: str, node_id: str, own_partition: str) -> None:
        self.url = url
        self.node_id = node_id
        self.own_partition = own_partition

    async def reconcile(self, params: dict[str, Any]) -> dict[str, Any] | None:
        """None: the id is this partition's (or no partition's), the caller handles it."""
        target = params.get("action_id")
        if not isinstance(target, str) or "forwarded_from" in params:
            return None
        # Its own connection, named apart from the node's cluster connection.
        conn = await trio.to_thread.run_sync(connect_cluster, self.url, f"{self.node_id}/forward")
        try:
            where = await trio.to_thread.run_sync(partition_of_target, conn, target)
            if where is None or where[0] == self.own_partition:
                return None
            partition, holder = where
            asked: dict[str, Any] = {key: params[key] for key in ("action_id", "outcome", "note") if key in params}
            return await trio.to_thread.run_sync(forward, conn, partition, holder, ForwardedCall.RECONCILE, asked,
                                                 self.node_id)
        finally:
            with contextlib.suppress(Exception):
                conn.close()


def _answer_of(conn: Any, request_id: int) -> dict[str, Any] | None:
    row = conn.execute(f"SELECT answer FROM {_C}.requests WHERE id = %s AND answered_at IS NOT NULL",
                       (request_id,)).fetchone()
    if row is None:
        return None
    value = row[0]
    return dict(value) if isinstance(value, dict) else dict(json.loads(value))


def _forget(conn: Any, request_id: int) -> None:
    conn.execute(f"DELETE FROM {_C}.requests WHERE id = %s", (request_id,))


def _withdraw(conn: Any, request_id: int) -> bool:
    """Withdraw a request nobody took; False: the holder took it meanwhile."""
    row = conn.execute(f"DELETE FROM {_C}.requests WHERE id = %s AND taken_by IS NULL RETURNING id",
                       (request_id,)).fetchone()
    return row is not None

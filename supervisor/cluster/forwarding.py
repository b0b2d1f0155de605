"""Calls for another node's partition: ``corral reconcile`` works from any node.

Only a partition's holder writes it (its epoch fences everyone else), so a node
asked to reconcile an action of a partition it does not hold does not write it:
it leaves the call in ``corral_cluster.requests`` and waits for the answer. The
holder (a node's own supervisor, or the one it started for an adoption) takes
the open requests of its partition at each tick, runs each on its own fenced
ledger, and answers once what it committed is durable.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from corral.supervisor.errors import SupervisorError
from corral.supervisor.ledger.ledger_pg_cluster import CLUSTER_SCHEMA, connect_cluster

_C = CLUSTER_SCHEMA
#: How long an asker waits for the holder's answer: a holder takes requests at
#: each tick (a third of its lease), so this is several ticks of the longest lease.
FORWARD_WAIT_S = 20.0
FORWARD_POLL_S = 0.1
#: Where an id of each kind lives in a partition: an action, a process session, a
#: provider request (the reconcilers of supervisor/runs/run_control.py).
_TARGETS = (("act-", "actions", "action_id"), ("proc-", "sessions", "process_id"), ("", "provider_requests", "slot"))


class ForwardedCall(enum.StrEnum):
    """What a node may ask of another partition's holder."""

    RECONCILE = "reconcile"


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


Reconcile = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def serve(request: Request, reconcile: Reconcile, durable: Callable[[], Awaitable[None]]) -> dict[str, Any]:
    """Run one taken request on this holder's ledger; its answer (a result, or the
    refusal a local caller would get), once what it committed is durable."""
    params = {**request.params, "forwarded_from": request.asked_by}
    try:
        match request.call:
            case ForwardedCall.RECONCILE:
                result = await reconcile(params)
    except SupervisorError as exc:
        await durable()
        return {"error": {"code": exc.code, "message": str(exc)}}
    await durable()
    return {"result": result}


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
            request_id = await trio.to_thread.run_sync(self._ask, conn, partition, asked)
            reply = await self._wait(conn, request_id, partition, holder)
        finally:
            with contextlib.suppress(Exception):
                conn.close()
        error = reply.get("error")
        if isinstance(error, dict):
            raise ForwardFailed(f"{error.get('message')} (partition {partition}, held by node {holder})",
                                str(error.get("code") or "refused"))
        result = reply.get("result")
        return {**(result if isinstance(result, dict) else {}), "partition": partition, "holder": holder}

    def _ask(self, conn: Any, partition: str, params: dict[str, Any]) -> int:
        row = conn.execute(
            f"INSERT INTO {_C}.requests (partition, call, params, asked_by, asked_at)"
            " VALUES (%s, %s, %s::jsonb, %s, clock_timestamp()) RETURNING id",
            (partition, ForwardedCall.RECONCILE.value, json.dumps(params), self.node_id),
        ).fetchone()
        return int(row[0])

    async def _wait(self, conn: Any, request_id: int, partition: str, holder: str) -> dict[str, Any]:
        deadline = trio.current_time() + FORWARD_WAIT_S
        while True:
            row = await trio.to_thread.run_sync(_answer_of, conn, request_id)
            if row is not None:
                await trio.to_thread.run_sync(_forget, conn, request_id)
                return row
            if trio.current_time() >= deadline:
                break
            await trio.sleep(FORWARD_POLL_S)
        withdrawn = await trio.to_thread.run_sync(_withdraw, conn, request_id)
        # Taken and not answered: its row goes too (an answer that comes later
        # lands nowhere); what happened is in the partition's ledger.
        await trio.to_thread.run_sync(_forget, conn, request_id)
        if withdrawn:
            raise ForwardFailed(f"partition {partition} is held by node {holder}, which did not take the request"
                                f" within {FORWARD_WAIT_S:.0f} s; nothing was done, try again")
        raise ForwardFailed(f"node {holder} took the request for partition {partition} and has not answered;"
                            " its outcome is not known yet: `corral show RUN` tells it")


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

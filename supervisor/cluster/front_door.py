"""The front door: a client on a host with no node talks to the cluster's
PostgreSQL directly, as DBOS's client does (``corral --ledger postgresql://...
run|wait|show|pending|approve|deny|cancel|status``, ``corral.Client.cluster``).

It writes no partition: only a partition's holder does (its epoch fences
everyone else). So:

- **run** queues a root run into the shared queue (its id claimed cluster-wide
  in the same transaction, supervisor/ledger/ledger_pg_queue.py), and the first
  node with room takes it; an id the cluster already has answers that run,
  wherever it is. A submit the queue cannot carry (a goal, a secret in what it
  keeps) is refused: give it to a node.
- **show**, **wait**, **pending** and **status** read the cluster tables and the
  partitions, read-only.
- **approve**, **deny** and **cancel** of a run a node holds are calls for that
  partition's holder (``corral_cluster.requests``, forwarding.py): it runs them
  on its own ledger, as if asked on its own control socket, and answers once
  durable. A run still waiting in the queue is cancelled there: its row stays as
  its record and no node takes it.

A node's control socket stays local to its host; the database's own
authentication (and TLS, ``sslmode``) guards this door. Blocking calls: the
client runs them in a worker thread (corral/ledger_transport.py).
"""

from __future__ import annotations

import enum
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from corral.core.errors import LedgerDoorError as DoorError
from corral.core.errors import LedgerLost
from corral.supervisor.cluster import cluster_reads, cluster_tables, forwarding, run_queue
from corral.supervisor.errors import BadRequest, NotFound, Refused
from corral.supervisor.ledger import ledger_pg_queue
from corral.supervisor.ledger.ledger_pg_cluster import CLUSTER_SCHEMA, QUEUED, is_postgres_url
from corral.supervisor.ledger.ledger_pg_wire import PostgresUnavailable, connect, redact_url
from corral.supervisor.params import param_int, param_str, param_text
from corral.supervisor.runs import run_store
from corral.supervisor.runs.run_views import ELSEWHERE_POLL_S, WaitRequest, wait_request

_C = CLUSTER_SCHEMA
#: At most this long in one ``wait`` call (the client asks again, as of a node).
MAX_WAIT_MS = 30_000
WAIT_MAX_RUNS = 100


class DoorMethod(enum.StrEnum):
    """What a client with no node may do (the control methods of the same names)."""

    PING = "ping"
    RUN = "run"
    SHOW = "show"
    WAIT = "wait"
    PENDING = "pending"
    APPROVAL = "approval.show"
    DECIDE = "continue_action"
    CANCEL = "cancel"
    STATUS = "status"


def safe_url(url: str) -> str:
    """The URL as it may be said: no password, in its user part or its query."""
    parts = urlsplit(redact_url(url))
    query = "&".join(f"{k}={'***' if k == 'password' else v}" for k, v in parse_qsl(parts.query))
    # Built by hand: urllib drops the "//" of a URL with no host (a Unix socket's).
    return f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{query}" if query else "")


def _scrub(text: str, url: str) -> str:
    """An error's first line, with any password of ``url`` masked."""
    line = next((part.strip() for part in text.splitlines() if part.strip()), text)
    parts = urlsplit(url)
    secrets_ = [parts.password or "", *(v for k, v in parse_qsl(parts.query) if k == "password")]
    for secret in filter(None, secrets_):
        line = line.replace(secret, "***")
    return line


class Door:
    """A client's way into a cluster: one connection, one call at a time."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        if not is_postgres_url(url):
            raise DoorError(f"--ledger wants a postgresql:// URL, not {safe_url(url)!r}")
        self.url = url
        self.where = safe_url(url)
        self.timeout = timeout
        self.asked_by = f"client:{socket.gethostname()}"
        self._lock = threading.Lock()
        self._conn: Any = None
        #: Opened once: a database that cannot be reached later is lost, not bad input.
        self._opened = False
        with self._lock:
            conn = self._connection()
            if conn.execute(f"SELECT to_regclass('{_C}.queue') IS NOT NULL").fetchone()[0] is not True:
                raise DoorError(
                    f"no corral cluster in the database at {self.where}: no node has run on it"
                    " (start one: corral up --ledger URL)"
                )
            self._opened = True

    def _connection(self) -> Any:
        if self._conn is None:
            try:
                self._conn = connect(self.url, "corral-client", max(1, int(self.timeout)))
            except PostgresUnavailable as exc:
                if self._opened:  # it went away after the door was opened: ask again later
                    raise LedgerLost(_scrub(str(exc), self.url)) from None
                raise DoorError(_scrub(str(exc), self.url)) from None
        return self._conn

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    # -- calls -----------------------------------------------------------------------

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """One call, as a node's control socket answers it. A method the door does
        not serve is refused (``needs-a-node``); refusals are ``SupervisorError``s."""
        try:
            known = DoorMethod(method)
        except ValueError:
            raise Refused(
                f"{method} needs a node: run it on a node's host (a client of the cluster's database"
                " runs, waits, shows, lists what is pending, approves, denies, cancels and reads the"
                " cluster's status)",
                code="needs-a-node",
            ) from None
        handler: Callable[[dict[str, Any]], Any] = {
            DoorMethod.PING: self._ping,
            DoorMethod.RUN: self._run,
            DoorMethod.SHOW: self._show,
            DoorMethod.WAIT: self._wait,
            DoorMethod.PENDING: self._pending,
            DoorMethod.APPROVAL: self._approval,
            DoorMethod.DECIDE: self._decide,
            DoorMethod.CANCEL: self._cancel,
            DoorMethod.STATUS: self._status,
        }[known]
        return handler(params)

    def _locked(self, read: Callable[[Any], Any]) -> Any:
        """``read`` on the connection, alone on it; a lost connection is made again
        at the next call."""
        import psycopg

        with self._lock:
            conn = self._connection()
            try:
                return read(conn)
            except psycopg.OperationalError as exc:
                self._drop()
                raise LedgerLost(f"the database at {self.where} went away: {_scrub(str(exc), self.url)}") from None

    def _ping(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"pong": True, "ledger": self.where}

    def _run(self, params: dict[str, Any]) -> dict[str, Any]:
        agent_id = param_str(params, "agent_id")
        run_id = param_str(params, "run_id", limit=45)
        if not run_store.RUN_ID.match(run_id):
            raise BadRequest("run_id must look like run-<6..40 of a-z, 0-9, ->")
        param_text(params, "task", None, limit=run_store.MAX_TASK_CHARS)
        if params.get("goal") is not None:
            raise BadRequest(
                "a run with a goal needs a node (its goal lives in that node's partition): run it"
                " there, or with a client of that node",
                code="needs-a-node",
            )
        if not run_queue.queueable(params):
            raise BadRequest(
                "this submit holds something that looks like a secret: the shared queue keeps what"
                " it is given, and no secret may reach the ledger; give it to a node",
                code="needs-a-node",
            )
        kept = {key: params[key] for key in run_queue.QUEUED_PARAMS if params.get(key) is not None}
        return dict(self._locked(lambda conn: self._submit(conn, run_id, agent_id, kept)))

    def _submit(self, conn: Any, run_id: str, agent_id: str, kept: dict[str, Any]) -> dict[str, Any]:
        run_by = conn.execute(
            f"SELECT DISTINCT jsonb_array_elements_text(agents) FROM {_C}.nodes WHERE agents IS NOT NULL"
        ).fetchall()
        runnable = sorted(str(row[0]) for row in run_by)
        if runnable and agent_id not in runnable:
            raise BadRequest(f"no node of the cluster runs agent {agent_id!r} (they run: {', '.join(runnable)})")
        if ledger_pg_queue.submit(conn, run_id, agent_id, kept, self.asked_by):
            return {"run_id": run_id, "queued": True}
        # The cluster has this id: that run, wherever it is, never a second one.
        shown = cluster_reads.show_run(conn, self.url, run_id)
        if shown is None:
            raise Refused(f"run {run_id} is being created by a node; ask again")
        run = shown["run"]
        if run["agent_id"] != agent_id:
            raise BadRequest(f"run {run_id} exists for another agent")
        answer = {"run_id": run_id, "existing": True, "status": run["status"]}
        if shown.get("partition"):
            answer["partition"] = shown["partition"]
        if shown.get("queued"):
            answer["queued"] = True
        return answer

    def _show(self, params: dict[str, Any]) -> dict[str, Any]:
        run_id = param_str(params, "run_id")
        shown = self._locked(lambda conn: cluster_reads.show_run(conn, self.url, run_id))
        if shown is None:
            raise NotFound(f"no run {run_id!r} in the cluster at {self.where}")
        return dict(shown)

    def _wait(self, params: dict[str, Any]) -> dict[str, Any]:
        """Until every run of ``run_ids`` is done (or waits for a person, ``until =
        "settled"``), or ``wait_ms`` passed: the node's ``wait``, by reading."""
        wanted, stop, wait_ms = wait_request(WaitRequest.decode(params), WAIT_MAX_RUNS)
        deadline = time.monotonic() + min(wait_ms, MAX_WAIT_MS) / 1000
        while True:
            found = self._locked(lambda conn: run_queue.statuses(conn, wanted, ""))
            missing = [run_id for run_id in wanted if run_id not in found]
            if missing:
                raise NotFound(f"no run {missing[0]!r} in the cluster at {self.where}")
            reached = all(status in stop for status in found.values())
            if reached or time.monotonic() >= deadline:
                return {"reached": reached, "runs": found}
            time.sleep(ELSEWHERE_POLL_S)  # between reads, the lock is free for other calls

    def _pending(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(self._locked(cluster_reads.pending))

    def _approval(self, params: dict[str, Any]) -> dict[str, Any]:
        """What approving an action would approve: its holder's view (a file diff
        needs the workspace of the node that runs it)."""
        action_id = param_str(params, "action_id", limit=300)
        asked = {"action_id": action_id, "page": param_int(params, "page", 1, low=1, high=1_000_000)}
        return self._to_holder_of(action_id, forwarding.ForwardedCall.APPROVAL, asked)

    def _to_holder_of(self, action_id: str, call: forwarding.ForwardedCall, asked: dict[str, Any]) -> dict[str, Any]:
        where = self._locked(lambda conn: forwarding.partition_of_target(conn, action_id))
        if where is None:
            raise NotFound(f"no action {action_id!r} in the cluster at {self.where}")
        return self._forward(where[0], where[1], call, asked)

    def _decide(self, params: dict[str, Any]) -> dict[str, Any]:
        action_id = param_str(params, "action_id", limit=300)
        decision = param_str(params, "decision", limit=20)
        if decision not in ("approve", "deny"):
            raise BadRequest("decision must be 'approve' or 'deny'")
        asked = {"action_id": action_id, "decision": decision}
        if params.get("fingerprint") is not None:
            asked["fingerprint"] = param_text(params, "fingerprint", limit=200)
        return self._to_holder_of(action_id, forwarding.ForwardedCall.DECIDE, asked)

    def _cancel(self, params: dict[str, Any]) -> dict[str, Any]:
        run_id = param_str(params, "run_id")
        asked = {"run_id": run_id, "reason": param_text(params, "reason", "cancelled", limit=1000) or "cancelled"}
        cancelled = self._locked(lambda conn: ledger_pg_queue.cancel(conn, run_id))
        if cancelled is True:
            return {"status": "cancelled"}
        if cancelled is False:
            raise Refused(f"run {run_id} already ended (cancelled)")
        where = self._locked(lambda conn: _holder_of(conn, run_id))
        if where is None:
            raise NotFound(f"no run {run_id!r} in the cluster at {self.where}")
        return self._forward(where[0], where[1], forwarding.ForwardedCall.CANCEL, asked)

    def _forward(
        self, partition: str, holder: str, call: forwarding.ForwardedCall, asked: dict[str, Any]
    ) -> dict[str, Any]:
        """A call for the partition's holder, answered once durable there."""
        try:
            return dict(
                self._locked(lambda conn: forwarding.forward(conn, partition, holder, call, asked, self.asked_by))
            )
        except forwarding.ForwardFailed as exc:
            raise Refused(str(exc), code=exc.code) from None

    def _status(self, params: dict[str, Any]) -> dict[str, Any]:
        def read(conn: Any) -> dict[str, Any]:
            return {**cluster_tables.view(conn), "load": run_queue.cluster_load(conn)}

        return {"remote": True, "ledger": self.where, "cluster": self._locked(read)}


def _holder_of(conn: Any, run_id: str) -> tuple[str, str] | None:
    """The partition that holds a run, and its holder."""
    name = cluster_reads.where_is(conn, run_id)
    if name is None or name == QUEUED:
        return None
    row = conn.execute(f"SELECT holder FROM {_C}.partitions WHERE name = %s", (name,)).fetchone()
    return None if row is None else (name, str(row[0]))

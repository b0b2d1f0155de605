"""PostgreSQL nodes ride out their database: a fast restart, a terminated backend,
refused connections; a node that comes back gets its own partition back; a node
too old for a partition's schema refuses to adopt it, and says so.

These tests run their own PostgreSQL server (corral/core/pg_local.py, on a Unix
socket), because they stop and restart it under running nodes. Waiting is on
observable state (status, the cluster tables, failpoint markers), never on timers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from corral.chaos.invariants import check_all
from corral.core.pg_local import LocalPostgres
from corral.core.procs import wait_exit
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_spec import URL_ENV
from corral.supervisor.ledger.schema import MIGRATIONS
from tests.harness import (
    Daemon,
    adopted_daemon,
    cli,
    drive_to_end,
    effects,
    ledger_rows,
    one_effect_spec,
    wait_for,
)
from tests.processes import SERVICE_PIDS

LEASE_S = 1.5

ONE_EFFECT = one_effect_spec(f"lease_s = {LEASE_S}")


class Server:
    """The module's own PostgreSQL server, which tests restart and stop; the
    orphan check knows its current postmaster as a service, not a leftover."""

    def __init__(self, root: Path) -> None:
        self.pg = LocalPostgres(root)

    def _track(self, old: int | None) -> None:
        SERVICE_PIDS.discard(old or -1)
        if self.pg.pid is not None:
            SERVICE_PIDS.add(self.pg.pid)

    def start(self) -> None:
        self.pg.start()
        self._track(None)

    def restart(self) -> None:
        old = self.pg.pid
        self.pg.restart()
        self._track(old)

    def shut_down(self) -> None:
        old = self.pg.pid
        self.pg.shut_down()
        self._track(old)

    def launch(self) -> None:
        self.pg.launch()
        self._track(None)

    def stop(self) -> None:
        old = self.pg.pid
        self.pg.stop()
        self._track(old)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    root = Path(tempfile.mkdtemp(prefix="crl-pgr-", dir="/tmp"))
    os.chmod(root, 0o755)  # the server's own user must reach its cluster
    own = Server(root)
    own.start()
    try:
        yield own
    finally:
        own.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def env(server: Server, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A fresh database on the module's server, the one-effect spec, and every
    daemon a test starts (shut down and reaped afterwards)."""
    if server.pg.pid is None:  # a test that failed while the server was down
        server.launch()
    name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40] + "_" + secrets.token_hex(3)
    url = server.pg.create_database(name)
    tmp = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    (tmp / "project").mkdir()
    spec = tmp / "one-effect.toml"
    spec.write_text(ONE_EFFECT)
    daemons: list[Daemon] = []
    try:
        yield {"url": url, "tmp": tmp, "spec": spec, "daemons": daemons, "server": server}
    finally:
        if server.pg.pid is None:
            server.launch()
        for daemon in daemons:
            daemon.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _node(env: dict[str, Any], name: str, failpoints: str = "") -> tuple[Daemon, int]:
    """``corral up`` of node ``name`` in its own home; its supervisor's pid."""
    extra = {"CORRAL_FAILPOINTS": failpoints} if failpoints else {}
    daemon = Daemon(env["tmp"] / name, env["spec"], {URL_ENV: env["url"], **extra})
    env["daemons"].append(daemon)
    result = cli(daemon.home, "up", "--spec", str(env["spec"]), "--node", name, env=daemon.env)
    assert result.returncode == 0, result.stderr + result.stdout
    pid = homes.read_endpoint(daemon.home).pid
    daemon.pids_seen.add(pid)
    return daemon, pid


def _sql(url: str, statement: str, *args: Any) -> list[Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(statement, args or None)
        return list(cursor.fetchall()) if cursor.description else []


def _partition(url: str, name: str) -> dict[str, Any]:
    rows = _sql(url, "SELECT holder, epoch, adopted_from, extract(epoch FROM lease_until - clock_timestamp())"
                     " FROM corral_cluster.partitions WHERE name = %s", name)
    holder, epoch, adopted_from, left = rows[0]
    return {"holder": holder, "epoch": epoch, "adopted_from": adopted_from, "lease_left_s": float(left)}


def _effect_blocked(daemon: Daemon, run_id: str) -> None:
    wait_for("the agent after its effect", (daemon.home / "failpoints" / "agent.after-effect.fired").exists)
    assert [line["run_id"] for line in effects(daemon.home.parent / "effects.log")] == [run_id]


def _release(daemon: Daemon) -> None:
    (daemon.home / "failpoints" / "agent.after-effect.release").touch()


def _finished_once(daemon: Daemon, env: dict[str, Any], run_id: str) -> None:
    """The run completed with its one effect, nothing reconciled, one final reply,
    and the chaos invariants hold over the node's partition."""
    effects_log = env["tmp"] / "effects.log"
    shown, reconciled = drive_to_end(daemon, run_id, effects_log)
    assert shown["run"]["status"] == "completed", shown["run"]
    assert reconciled == 0, "no outcome became unknown: the finish was held, never dropped"
    assert [line["run_id"] for line in effects(effects_log)].count(run_id) == 1, "the effect happened once"
    assert len(ledger_rows(daemon.home, "SELECT * FROM replies WHERE run_id = ?", run_id)) == 1
    assert [row["phase"] for row in shown["actions"]] == ["ok"], shown["actions"]
    with contextlib.closing(_reader(daemon)) as ledger:
        for check in check_all(ledger, effects_log):
            assert check.passed, (check.name, check.failures)


def _reader(daemon: Daemon) -> Any:
    from corral.supervisor.ledger.ledger_spec import open_for_reading

    return open_for_reading(daemon.home)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _status_or_none(daemon: Daemon) -> dict[str, Any] | None:
    """Status, or None if the supervisor did not answer (what the old code did
    while its database was away)."""
    try:
        return daemon.status()
    except Exception:
        return None


# -- case 16: the database goes away and comes back -------------------------------------


def test_a_node_rides_out_a_fast_restart_of_its_database(env: dict[str, Any]) -> None:
    """``pg_ctl restart -m fast`` closes every connection of the node (ledger, group
    commit's, cluster) while an agent holds an effect it has not reported yet."""
    node, pid = _node(env, "node-a", "agent.after-effect=block@once")
    run_id = node.call("run", agent_id="writer", task="record one effect")["run_id"]
    _effect_blocked(node, run_id)
    env["server"].restart()
    _release(node)  # its finish meets a closed connection
    _finished_once(node, env, run_id)
    again = node.call("run", agent_id="writer", task="and once more")["run_id"]
    assert drive_to_end(node, again, env["tmp"] / "effects.log")[0]["run"]["status"] == "completed"
    assert homes.read_endpoint(node.home).pid == pid and _alive(pid), "the same supervisor rode it out"
    held = _partition(env["url"], "node-a")
    assert (held["holder"], held["epoch"]) == ("node-a", 1), "nobody took it over, nothing was fenced"


def _backend(url: str, application: str) -> int | None:
    rows = _sql(url, "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                     " AND application_name = %s", application)
    return int(rows[0][0]) if rows else None


def test_a_node_rides_out_the_termination_of_its_ledger_and_cluster_connections(env: dict[str, Any]) -> None:
    node, pid = _node(env, "node-a", "agent.after-effect=block@once")
    run_id = node.call("run", agent_id="writer", task="record one effect")["run_id"]
    _effect_blocked(node, run_id)
    cluster_backend = wait_for("the cluster connection", lambda: _backend(env["url"], "corral-cluster:node-a"))
    ledger_backend = wait_for("the ledger connection", lambda: _backend(env["url"], "corral-ledger:node-a"))
    terminated_at = _sql(env["url"], "SELECT clock_timestamp()")[0][0]
    for backend in (cluster_backend, ledger_backend):
        assert _sql(env["url"], "SELECT pg_terminate_backend(%s)", backend) == [(True,)]
    # The lease goes on being renewed, on a new cluster connection.
    wait_for("a new cluster connection", lambda: _backend(env["url"], "corral-cluster:node-a") not in
              (None, cluster_backend))
    wait_for("a renewal after the termination", lambda: _sql(
        env["url"], "SELECT lease_until > %s + make_interval(secs => %s) FROM corral_cluster.partitions"
                    " WHERE name = 'node-a'", terminated_at, LEASE_S)[0][0])
    _release(node)  # its finish meets the terminated ledger connection
    _finished_once(node, env, run_id)
    assert homes.read_endpoint(node.home).pid == pid and _alive(pid)
    assert _backend(env["url"], "corral-ledger:node-a") not in (None, ledger_backend), "it reconnected"


def test_a_node_rides_out_refused_connections_reports_degraded_and_renews_its_lapsed_lease(
    env: dict[str, Any],
) -> None:
    """The server is down (connections refused) longer than the lease, under two
    nodes: status still answers, and says degraded; the held finish commits once
    the server is back; neither node adopts the other's partition (every lease
    lapsed while the server was away), so node a renews its lapsed lease."""
    node, pid = _node(env, "node-a", "agent.after-effect=block@once")
    other, other_pid = _node(env, "node-b")
    run_id = node.call("run", agent_id="writer", task="record one effect")["run_id"]
    _effect_blocked(node, run_id)
    env["server"].shut_down()
    _release(node)  # its finish is held while the server is away
    degraded = wait_for("status to say degraded", lambda: (_status_or_none(node) or {}).get("degraded"))
    assert "unreachable" in degraded, degraded
    status = _status_or_none(node)
    assert status is not None and status["pid"] == pid
    assert status["cluster"]["reachable"] is False, status["cluster"]
    env["server"].launch()
    _finished_once(node, env, run_id)
    wait_for("status to be healthy again", lambda: (_status_or_none(node) or {"degraded": "?"})["degraded"] == "")
    assert homes.read_endpoint(node.home).pid == pid and _alive(pid)
    for name in ("node-a", "node-b"):
        held = _partition(env["url"], name)
        assert (held["holder"], held["epoch"]) == (name, 1) and held["lease_left_s"] > 0, held
    assert _alive(other_pid) and other.status()["cluster"]["adopting"] == []
    for daemon in (node, other):
        log = (daemon.home / "logs" / "supervisor.log").read_text()
        assert "fenced" not in log and "Traceback" not in log, log[-2000:]


def test_a_writer_whose_lease_lapsed_renews_before_it_writes_or_stops_if_fenced(
    env: dict[str, Any],
) -> None:
    """At the ledger itself: a write on a lapsed lease first renews it (nobody took
    the partition: the write lands); the server refuses a write whose lease lapsed
    behind the writer's back; and once another node took the partition over,
    nothing more is written."""
    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_link import LedgerUnavailable
    from corral.supervisor.ledger.ledger_pg import Fenced, PostgresLedger
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    url = env["url"]
    conn = connect_cluster(url)
    hold = cluster.acquire_own(conn, "node-a", None, 30.0, None)
    fenced: list[str] = []
    ledger = PostgresLedger(url, hold.partition, epoch=hold.epoch, holder="node-a", lease_s=30.0,
                            on_fenced=fenced.append)
    expire = ("UPDATE corral_cluster.partitions SET lease_until = clock_timestamp() - interval '1 second'"
              " WHERE name = 'node-a'")
    try:
        ledger.begin_boot("b1", 1, 1)
        _sql(url, expire)
        with pytest.raises(LedgerUnavailable, match="lease"), ledger.tx():
            ledger.event("behind its back", "x")
        assert not ledger_events(ledger, "behind its back"), "a write on a lapsed lease lands nowhere"
        ledger.event("renewed first", "x")  # the writer now knows: it renews, then writes
        assert ledger_events(ledger, "renewed first")
        assert _partition(url, "node-a")["lease_left_s"] > 20
        _sql(url, expire)
        assert cluster.adopt(conn, "node-a", "node-b", 30.0) is not None
        with pytest.raises(Fenced, match="node-b"), ledger.tx():
            ledger.event("after the takeover", "x")
        assert not ledger_events(ledger, "after the takeover") and len(fenced) == 1
    finally:
        ledger.close()
        conn.close()


def _commit_in_thread(ledger: Any, kind: str) -> tuple[Any, list[BaseException | None]]:
    """Commit one event in a thread (its COMMIT may wait); what came of it."""
    import threading

    outcome: list[BaseException | None] = []

    def commit() -> None:
        try:
            ledger.event(kind, "x")
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=commit)
    thread.start()
    return thread, outcome


def ledger_events(ledger: Any, kind: str) -> list[Any]:
    return list(ledger.all("SELECT cursor FROM events WHERE kind = ?", kind))


def test_a_commit_whose_answer_was_lost_is_checked_never_replayed(env: dict[str, Any]) -> None:
    """At the ledger itself, two COMMITs whose answer never came. One landed: the
    server committed it locally and its backend was terminated while it waited
    for a synchronous standby that never answers (so the client got no answer).
    The other did not: its connection was already gone. The ledger reads its
    commit marker on a new connection and tells them apart; it never sends
    either again."""
    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_link import LedgerUnavailable
    from corral.supervisor.ledger.ledger_pg import PostgresLedger
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    url = env["url"]
    database = url.split("/")[3].split("?")[0]
    _sql(url, f'ALTER DATABASE "{database}" SET synchronous_commit = on')
    conn = connect_cluster(url)
    hold = cluster.acquire_own(conn, "node-a", None, 30.0, None)
    ledger = PostgresLedger(url, hold.partition, epoch=hold.epoch)
    standby = "ALTER SYSTEM SET synchronous_standby_names = 'nobody'"
    try:
        ledger.begin_boot("b1", 1, 1)
        _sql(url, standby)
        _sql(url, "SELECT pg_reload_conf()")
        # The server applies the setting a moment later: commit until one waits.
        for attempt in range(100):
            commits = ledger.commits
            thread, outcome = _commit_in_thread(ledger, f"landed-{attempt}")
            backend = wait_for("the COMMIT to end or to wait for the standby", lambda thread=thread: (
                not thread.is_alive() and (0,)) or next(iter(_sql(
                    url, "SELECT pid FROM pg_stat_activity WHERE application_name = 'corral-ledger:node-a'"
                         " AND wait_event = 'SyncRep'")), None))[0]
            if backend:
                break
            thread.join()
        _sql(url, "SELECT pg_terminate_backend(%s)", backend)
        thread.join(30)
        assert outcome == [None], "the commit landed: the transaction succeeded"
        _sql(url, "ALTER SYSTEM RESET synchronous_standby_names")
        _sql(url, "SELECT pg_reload_conf()")
        assert ledger.commits == commits + 1 and ledger.available
        assert len(ledger_events(ledger, f"landed-{attempt}")) == 1, "and it was never sent again"

        with pytest.raises(LedgerUnavailable, match="nothing was committed"), ledger.tx():
            ledger.event("lost", "x")
            ledger.db.flush()  # the write is answered: only its COMMIT meets the lost connection
            _sql(url, "SELECT pg_terminate_backend(%s, 10000)", _backend(url, "corral-ledger:node-a"))
        assert ledger.available, "the in-doubt COMMIT was settled on a new connection"
        assert not ledger_events(ledger, "lost"), "the marker said: not landed; and it was not sent again"
        # A read that finds the connection gone: every transaction is refused at once
        # (nothing is sent) until the reconnection, which checks the fence first.
        _sql(url, "SELECT pg_terminate_backend(%s)", _backend(url, "corral-ledger:node-a"))
        with pytest.raises(LedgerUnavailable):
            ledger.one("SELECT COUNT(*) FROM runs")
        assert not ledger.available
        with pytest.raises(LedgerUnavailable):
            ledger.event("refused at once", "x")
        assert ledger.reconnect() and ledger.available
        ledger.event("after", "x")
        assert len(ledger_events(ledger, "after")) == 1 and not ledger_events(ledger, "refused at once")
    finally:
        _sql(url, "ALTER SYSTEM RESET synchronous_standby_names")
        _sql(url, "SELECT pg_reload_conf()")
        ledger.close()
        conn.close()


# -- case 17: a node comes back; a node too old to adopt ----------------------------------


def _adopted(adopter: Daemon, partition: str, env: dict[str, Any]) -> Daemon:
    daemon = adopted_daemon(adopter, partition, adopter.env)
    env["daemons"].insert(0, daemon)
    return daemon


def _kill_node(pid: int) -> None:
    os.killpg(pid, signal.SIGKILL)
    assert wait_exit(pid, 10)


def test_a_returning_node_takes_its_partition_back_and_every_run_stays_readable(env: dict[str, Any]) -> None:
    a, a_pid = _node(env, "node-a", "agent.after-effect=block@once")
    b, _ = _node(env, "node-b")
    run_a = a.call("run", agent_id="writer", task="on a")["run_id"]
    _effect_blocked(a, run_a)
    _kill_node(a_pid)
    adoption = _adopted(b, "node-a", env)
    adoption_pid = homes.read_endpoint(adoption.home).pid
    shown, reconciled = drive_to_end(adoption, run_a, env["tmp"] / "effects.log")
    assert shown["run"]["status"] == "completed" and reconciled == 1
    run_b = b.call("run", agent_id="writer", task="on b")["run_id"]
    assert drive_to_end(b, run_b, env["tmp"] / "effects.log")[0]["run"]["status"] == "completed"
    # A run of a partition another supervisor serves is readable from any node.
    elsewhere = cli(b.home, "show", run_a, "--json", env=b.env)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert json.loads(elsewhere.stdout)["run"]["status"] == "completed"

    a.env.pop("CORRAL_FAILPOINTS")
    result = cli(a.home, "up", "--spec", str(env["spec"]), "--node", "node-a", env=a.env)
    assert result.returncode == 0, result.stderr + result.stdout
    a.pids_seen.add(homes.read_endpoint(a.home).pid)
    assert a.status()["cluster"]["partition"] == "node-a", "its own partition, handed back, not node-a-2"
    assert wait_exit(adoption_pid, 30), "the adoption stopped: it handed the partition back"
    held = _partition(env["url"], "node-a")
    assert (held["holder"], held["epoch"], held["adopted_from"]) == ("node-a", 3, "node-b"), held
    kinds = [row["kind"] for row in ledger_rows(a.home, "SELECT kind FROM events ORDER BY cursor")]
    assert "partition-handed-back" in kinds
    assert not _sql(env["url"], "SELECT 1 FROM corral_cluster.partitions WHERE name LIKE 'node-a-%%'")
    for node, run_id in ((a, run_a), (a, run_b), (b, run_a)):
        assert node.call("show", run_id=run_id)["run"]["status"] == "completed"
    again = a.call("run", agent_id="writer", task="back home")["run_id"]
    assert drive_to_end(a, again, env["tmp"] / "effects.log")[0]["run"]["status"] == "completed"


def test_a_node_too_old_for_a_partitions_schema_refuses_to_adopt_it_and_says_what_to_do(
    env: dict[str, Any],
) -> None:
    a, a_pid = _node(env, "node-a", "agent.after-effect=block@once")
    run_a = a.call("run", agent_id="writer", task="on a")["run_id"]
    _effect_blocked(a, run_a)
    _kill_node(a_pid)
    # A newer corral migrated node-a's partition (a rolling upgrade); node b is older.
    newer = len(MIGRATIONS) + 1
    _sql(env["url"], "UPDATE corral_p_node_a.corral_meta SET value = %s WHERE key = 'schema_version'", newer)
    b, _ = _node(env, "node-b")
    refused = wait_for("b to refuse the adoption", lambda: b.status()["cluster"].get("adoption_refused"))
    assert [(r["partition"], r["schema"], r["supported"]) for r in refused] == [("node-a", newer, len(MIGRATIONS))]
    assert "upgrade corral" in refused[0]["advice"], refused
    held = _partition(env["url"], "node-a")
    assert (held["holder"], held["epoch"], held["adopted_from"]) == ("node-a", 1, None), "never taken over"
    text = cli(b.home, "status", env=b.env).stdout
    assert "node-a" in text and "upgrade corral" in text, text
    doctor = json.loads(cli(b.home, "doctor", "--json", env=b.env).stdout)
    finding = next(f for f in doctor["findings"] if f["check"] == "adoption")
    assert finding["level"] == "error" and "node-a" in finding["detail"], finding
    assert f"schema {newer}" in finding["detail"] and "upgrade corral" in finding["advice"], finding
    # It does not try again while nothing changed: three more ticks of b's lease
    # loop (its node heartbeat moves each tick), and still one refusal, no takeover.
    beat = _sql(env["url"], "SELECT heartbeat_at FROM corral_cluster.nodes WHERE node_id = 'node-b'")[0][0]
    for _ in range(3):
        beat = wait_for("b's next tick", lambda before=beat: next(
            (row[0] for row in _sql(env["url"], "SELECT heartbeat_at FROM corral_cluster.nodes"
                                                " WHERE node_id = 'node-b'") if row[0] > before), None))
    assert _partition(env["url"], "node-a")["epoch"] == 1
    assert [e["subject"] for e in b.events() if e["kind"] == "partition-adoption-refused"] == ["node-a"]
    assert not (b.home / "adopted" / "node-a").exists()
    # Something changed (the partition is back at a schema b knows): b adopts it.
    _sql(env["url"], "UPDATE corral_p_node_a.corral_meta SET value = %s WHERE key = 'schema_version'",
         len(MIGRATIONS))
    adoption = _adopted(b, "node-a", env)
    shown, reconciled = drive_to_end(adoption, run_a, env["tmp"] / "effects.log")
    assert shown["run"]["status"] == "completed" and reconciled == 1
    assert _partition(env["url"], "node-a")["adopted_from"] == "node-a"
    assert not b.status()["cluster"].get("adoption_refused")

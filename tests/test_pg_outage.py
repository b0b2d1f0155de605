"""A cluster rides out a long database outage, and a node that cannot go on says
so and makes way (issue 48, C.5 and C.6).

- An agent whose request outlives the supervisor's hold (the database away longer
  than a held request waits) waits on, instead of crashing.
- A group whose actors crash while the ledger is away waits for the ledger and
  resumes when it is back, instead of giving up for good.
- A node that cannot make progress (a group gave up with runs unfinished) says
  ``degraded``, gives its lease up and stops; another node adopts its runs.
- A node that stopped itself because the database lost commits it had made says
  what to do in ``status`` and ``doctor``, and ``corral up --node`` on the same
  home resumes it.

Real processes on a real PostgreSQL server (the module's own: it is stopped and
started under running nodes). Every wait is on observable state (status, logs,
the cluster tables, failpoint markers); the timeouts are hang guards only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core.procs import wait_exit
from corral.mailbox.control import SupervisorGone
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_spec import URL_ENV
from tests.harness import Daemon, adopted_daemon, agent_spec, cli, drive_to_end, effects, one_effect_spec, wait_for
from tests.test_pg_resilience import (
    LEASE_S,
    ONE_EFFECT,
    Server,
    _alive,
    _effect_blocked,
    _finished_once,
    _partition,
    _release,
    _status_or_none,
)

#: The root group gives up at its second restart, whatever the time between them:
#: a test reaches it by killing the agent twice, with no race against a window.
TWO_STRIKES = one_effect_spec(f"lease_s = {LEASE_S}", '[[groups]]\nid = "root"\nmax_restarts = 1\nperiod_s = 3600.0\n')


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    root = Path(tempfile.mkdtemp(prefix="crl-pgo-", dir="/tmp"))
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
    """A fresh database on the module's server, the specs, and every daemon a test
    starts (shut down and reaped afterwards)."""
    if server.pg.pid is None:  # a test that failed while the server was down
        server.launch()
    name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40] + "_" + secrets.token_hex(3)
    url = server.pg.create_database(name)
    tmp = Path(tempfile.mkdtemp(prefix="crl-", dir="/tmp"))
    (tmp / "project").mkdir()
    specs = {"one": tmp / "one-effect.toml", "two": tmp / "two-strikes.toml"}
    specs["one"].write_text(ONE_EFFECT)
    specs["two"].write_text(TWO_STRIKES)
    daemons: list[Daemon] = []
    try:
        yield {"url": url, "tmp": tmp, "spec": specs["one"], "specs": specs, "daemons": daemons, "server": server}
    finally:
        if server.pg.pid is None:
            server.launch()
        for daemon in daemons:
            daemon.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _node(env: dict[str, Any], name: str, failpoints: str = "", spec: str = "one") -> tuple[Daemon, int]:
    """``corral up`` of node ``name`` in its own home; its supervisor's pid."""
    extra = {"CORRAL_FAILPOINTS": failpoints} if failpoints else {}
    daemon = Daemon(env["tmp"] / name, env["specs"][spec], {URL_ENV: env["url"], **extra})
    env["daemons"].append(daemon)
    return daemon, _up(daemon, name)


def _up(daemon: Daemon, name: str) -> int:
    assert daemon.spec is not None
    result = cli(daemon.home, "up", "--spec", str(daemon.spec), "--node", name, env=daemon.env)
    assert result.returncode == 0, result.stderr + result.stdout
    pid = homes.read_endpoint(daemon.home).pid
    daemon.pids_seen.add(pid)
    return pid


def _log(daemon: Daemon, name: str) -> str:
    try:
        return (daemon.home / "logs" / f"{name}.log").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _agent(daemon: Daemon) -> dict[str, Any]:
    status = _status_or_none(daemon)
    assert status is not None, "status answers throughout"
    return next(actor for actor in status["actors"] if actor["id"] == "writer")


def _kill_agent_until_its_group_gives_up(daemon: Daemon) -> None:
    """SIGKILL the agent, and its next incarnation once it runs: two crashes, one
    past the group's intensity (TWO_STRIKES)."""
    for incarnation in (1, 2):
        agent = wait_for(f"incarnation {incarnation} of the agent", lambda n=incarnation: (
            (a := _agent(daemon))["incarnation"] == n and a["pid"] and a))
        os.kill(agent["pid"], signal.SIGKILL)
    wait_for("the group to stop restarting", lambda: next(
        g for g in (_status_or_none(daemon) or {"groups": []})["groups"] if g["id"] == "root")["status"] != "running")


# -- C.5: an outage longer than a held request ------------------------------------------


def test_an_agent_waits_out_an_outage_longer_than_a_held_request(env: dict[str, Any]) -> None:
    """The database stays away until the supervisor gave up holding the agent's
    finish (it answered ``ledger-unavailable``): the agent keeps the outcome and
    waits, and once the database is back the run finishes with its one effect,
    nothing to reconcile, and the agent's first incarnation."""
    node, pid = _node(env, "node-a", "agent.after-effect=block@once")
    run_id = node.call("run", agent_id="writer", task="record one effect")["run_id"]
    _effect_blocked(node, run_id)
    env["server"].shut_down()
    _release(node)  # its finish is held, then refused: the ledger stays away
    wait_for("the agent to be told the ledger is unavailable",
             lambda: "ledger-unavailable" in _log(node, "writer"), timeout=120)
    env["server"].launch()
    _finished_once(node, env, run_id)
    agent = _agent(node)
    assert (agent["incarnation"], agent["restarts"]) == (1, 0), ("the agent waited, it never crashed", agent)
    assert "Traceback" not in _log(node, "writer"), _log(node, "writer")[-3000:]
    assert homes.read_endpoint(node.home).pid == pid and _alive(pid)


def test_a_group_whose_agent_crashed_while_the_ledger_was_away_resumes_when_it_is_back(
    env: dict[str, Any],
) -> None:
    """The agent dies twice while the database is away, past its group's restart
    intensity: the group waits for the ledger instead of giving up, says so in
    status, and starts its agent again once the ledger is back; the run finishes
    with its effect once."""
    node, pid = _node(env, "node-a", "agent.before-effect=block@100", spec="two")
    run_id = node.call("run", agent_id="writer", task="record one effect")["run_id"]
    wait_for("the agent before its effect", (node.home / "failpoints" / "agent.before-effect.fired").exists)
    env["server"].shut_down()
    wait_for("status to say degraded", lambda: (_status_or_none(node) or {}).get("degraded"))
    _kill_agent_until_its_group_gives_up(node)
    root = next(g for g in node.status()["groups"] if g["id"] == "root")
    assert root["status"] == "waiting-for-ledger", root
    assert "ledger" in (root["reason"] or ""), root
    (node.home / "failpoints" / "agent.before-effect.release").touch()
    env["server"].launch()
    shown, _reconciled = drive_to_end(node, run_id, env["tmp"] / "effects.log")
    assert shown["run"]["status"] == "completed", shown["run"]
    # The kills came between `executing` and the effect: its outcome was unknown,
    # reconciled by evidence, never run again.
    assert [line["run_id"] for line in effects(env["tmp"] / "effects.log")].count(run_id) <= 1
    root = next(g for g in node.status()["groups"] if g["id"] == "root")
    assert root["status"] == "running", root
    kinds = [event["kind"] for event in node.events()]
    assert "group-resumed" in kinds and "group-escalated" not in kinds, kinds
    assert homes.read_endpoint(node.home).pid == pid and _alive(pid)


# -- C.5: a node that cannot make progress makes way -------------------------------------


def test_a_node_whose_group_gave_up_with_runs_unfinished_says_degraded_and_gives_its_lease_up(
    env: dict[str, Any],
) -> None:
    """The database is fine, but node a's group gave up (its agent crashed past the
    intensity) with a run unfinished: a says degraded, gives its lease up and
    stops; node b adopts the partition and the run finishes there."""
    a, a_pid = _node(env, "node-a", "agent.before-effect=block@100", spec="two")
    b, _ = _node(env, "node-b", spec="two")
    run_id = a.call("run", agent_id="writer", task="record one effect")["run_id"]
    wait_for("the agent before its effect", (a.home / "failpoints" / "agent.before-effect.fired").exists)
    _kill_agent_until_its_group_gives_up(a)
    # Status says so while it lasts (a lease); the ledger and the log keep it.
    degraded = wait_for("a to say degraded, or to have stopped", lambda: (_status_or_none(a) or {}).get(
        "degraded") or (not _alive(a_pid) and "stopped"))
    assert "root" in degraded or degraded == "stopped", degraded
    assert wait_exit(a_pid, 60), "node a stopped: it gave its lease up"
    log = _log(a, "supervisor")
    assert "giving its lease up" in log and "group root" in log, log[-3000:]
    adoption = adopted_daemon(b, "node-a", b.env)
    env["daemons"].insert(0, adoption)
    stuck = [e for e in adoption.events() if e["kind"] == "node-cannot-progress"]
    assert stuck and "root" in stuck[0]["data"]["reason"], stuck
    shown, _reconciled = drive_to_end(adoption, run_id, env["tmp"] / "effects.log")
    assert shown["run"]["status"] == "completed", shown["run"]
    assert [line["run_id"] for line in effects(env["tmp"] / "effects.log")].count(run_id) <= 1
    held = _partition(env["url"], "node-a")
    assert (held["holder"], held["adopted_from"]) == ("node-b", "node-a"), held
    note = json.loads(cli(a.home, "doctor", "--json", env=a.env).stdout)
    finding = next(f for f in note["findings"] if f["check"] == "node")
    assert finding["level"] == "error" and "gave its lease up" in finding["detail"], finding
    assert f"corral --home {a.home} up" in finding["advice"] and "--node node-a" in finding["advice"], finding


# -- C.6: the database lost commits a node had made --------------------------------------


def _lose_commits(url: str, partition: str) -> None:
    """What ``pg_ctl stop -m immediate`` does to a node committing with
    ``synchronous_commit = off``, made deterministic: the partition's commit
    marker falls behind what the node was told, and the node's ledger connection
    is cut, so the node reads the marker on a new connection (which waits for
    this transaction: nothing of the node lands in between)."""
    import psycopg

    schema = "corral_p_" + re.sub(r"[^a-z0-9]", "_", partition)
    with psycopg.connect(url) as conn:
        conn.execute(f"LOCK TABLE {schema}.corral_meta IN ACCESS EXCLUSIVE MODE")
        conn.execute(f"UPDATE {schema}.corral_meta SET value = value - 1 WHERE key = 'commit_seq'")
        backends = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                (f"corral-ledger:{partition}",)).fetchall()
        assert backends, "the node's ledger connection"
        for (backend,) in backends:
            conn.execute("SELECT pg_terminate_backend(%s)", (backend,))


def test_a_node_that_stopped_because_the_database_lost_its_commits_says_what_to_do_and_resumes(
    env: dict[str, Any],
) -> None:
    node, pid = _node(env, "node-a", "agent.after-effect=block@once")
    run_id = node.call("run", agent_id="writer", task="record one effect")["run_id"]
    _effect_blocked(node, run_id)
    tree = node.tree_pids()
    _lose_commits(env["url"], "node-a")
    assert wait_exit(pid, 60), "the node stopped: its memory is ahead of its ledger"
    for member in tree:
        assert wait_exit(member, 30), "its fork server and agent died with it"

    status = cli(node.home, "status", env=node.env)
    assert status.returncode != 0
    said = status.stdout + status.stderr
    assert "lost commits" in said and f"corral --home {node.home} up" in said and "--node node-a" in said, said
    doctor = json.loads(cli(node.home, "doctor", "--json", env=node.env).stdout)
    finding = next(f for f in doctor["findings"] if f["check"] == "node")
    assert finding["level"] == "error" and "lost commits" in finding["detail"], finding
    assert "--node node-a" in finding["advice"], finding

    node.env.pop("CORRAL_FAILPOINTS")
    again = _up(node, "node-a")
    assert again != pid
    shown, reconciled = drive_to_end(node, run_id, env["tmp"] / "effects.log")
    assert shown["run"]["status"] == "completed", shown["run"]
    assert reconciled <= 1  # the effect's outcome was in the agent that died with the node
    assert [line["run_id"] for line in effects(env["tmp"] / "effects.log")].count(run_id) == 1
    assert node.status()["cluster"]["partition"] == "node-a", "its own partition, not a new one"
    wait_for("status to be healthy", lambda: node.status()["degraded"] == "")
    doctor = json.loads(cli(node.home, "doctor", "--json", env=node.env).stdout)
    assert next(f for f in doctor["findings"] if f["check"] == "node")["level"] == "ok"
    more = node.call("run", agent_id="writer", task="and once more")["run_id"]
    assert drive_to_end(node, more, env["tmp"] / "effects.log")[0]["run"]["status"] == "completed"


# -- the PostgreSQL chaos run: three nodes, every fault of the issue ----------------------

#: How long the database refuses connections in the chaos run (issue 48: 35 s).
OUTAGE_S = 35.0

CHAOS = one_effect_spec(f"lease_s = {LEASE_S}\nretire_idle_s = 2.0")


class Swarm:
    """The three nodes of the chaos run, every run submitted (and its partition),
    and which supervisor serves a partition now (its node, or an adoption)."""

    def __init__(self, env: dict[str, Any]) -> None:
        self.env = env
        self.nodes: dict[str, Daemon] = {}
        self.pids: dict[str, int] = {}
        self.runs: dict[str, str] = {}
        env["specs"]["chaos"] = env["tmp"] / "chaos.toml"
        env["specs"]["chaos"].write_text(CHAOS)

    def start(self, name: str, failpoints: str = "") -> None:
        if name in self.nodes:
            daemon = self.nodes[name]
            daemon.env.pop("CORRAL_FAILPOINTS", None)
            self.pids[name] = _up(daemon, name)
        else:
            self.nodes[name], self.pids[name] = _node(self.env, name, failpoints, spec="chaos")

    def submit(self, name: str, count: int) -> None:
        daemon = self.nodes[name]
        partition = daemon.status()["cluster"]["partition"]
        for index in range(count):
            self.runs[daemon.call("run", agent_id="writer", task=f"{name} #{index}")["run_id"]] = partition

    def live(self) -> list[Daemon]:
        """The nodes whose supervisor runs now."""
        alive = []
        for name, daemon in self.nodes.items():
            try:
                pid = homes.read_endpoint(daemon.home).pid
            except homes.HomeError:
                continue
            if pid == self.pids[name] and _alive(pid):
                alive.append(daemon)
        return alive

    def drive_all(self, timeout: float = 600) -> dict[str, str]:
        """Every run to its end, reconciling unknown outcomes by evidence on the way:
        what an operator does, from any live node (``show`` reads every partition,
        and ``reconcile`` goes to the partition's holder). Polls observable state;
        ``timeout`` is a hang guard."""
        from corral.chaos.reconciler import decide, pending_reconciliations
        from corral.supervisor.ledger.ledger_pg import PostgresLedger

        effects_path = self.env["tmp"] / "effects.log"
        ended: dict[str, str] = {}
        seen: dict[str, str] = {}

        def step() -> bool:
            nodes = self.live()
            if not nodes:
                return False
            node = nodes[0]
            for run_id, partition in self.runs.items():
                if run_id in ended:
                    continue
                try:
                    status = node.call("show", run_id=run_id)["run"]["status"]
                    seen[run_id] = status
                    if status in ("completed", "failed", "cancelled"):
                        ended[run_id] = status
                        continue
                    ledger = PostgresLedger(self.env["url"], partition, readonly=True)
                    try:
                        pending = pending_reconciliations(ledger)
                    finally:
                        ledger.close()
                    for action in pending:
                        outcome, note = decide(action, effects_path)
                        node.call("reconcile", action_id=action["action_id"], outcome=outcome, note=note)
                except Exception as exc:  # a partition changing hands, a reconcile already done: again
                    seen[run_id] = f"{type(exc).__name__}: {exc}"[:300]
            return len(ended) == len(self.runs)

        try:
            wait_for("every run to end", step, timeout=timeout)
        except AssertionError:
            stuck = {run_id: (self.runs[run_id], seen.get(run_id)) for run_id in self.runs if run_id not in ended}
            where = _partitions(self.env["url"])
            raise AssertionError(f"runs that did not end: {stuck}; partitions: {where}") from None
        return ended


def _partitions(url: str) -> list[dict[str, Any]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT name, holder, epoch, adopted_from, lease_until > clock_timestamp()"
                            " FROM corral_cluster.partitions ORDER BY name").fetchall()
    return [{"name": r[0], "holder": r[1], "epoch": r[2], "from": r[3], "leased": r[4]} for r in rows]


def _orphans(url: str) -> list[dict[str, Any]]:
    """Partitions no live node holds: a holder that is down or lost, or a lease that
    lapsed with nobody serving it."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p.name, p.holder, p.lease_until > clock_timestamp(),"
            " n.status = 'up' AND n.lease_until > clock_timestamp()"
            " FROM corral_cluster.partitions p LEFT JOIN corral_cluster.nodes n ON n.node_id = p.holder"
        ).fetchall()
    return [{"partition": name, "holder": holder, "leased": leased, "holder_up": up}
            for name, holder, leased, up in rows if not (leased and up)]


@pytest.mark.slow
def test_a_three_node_cluster_rides_out_kills_pauses_restarts_and_a_long_outage(env: dict[str, Any]) -> None:
    """Issue 48's PostgreSQL chaos run, on three nodes: kill -9 of a node, SIGSTOP of
    another past its lease, ``pg_ctl restart``, 35 s of refused connections, and
    the nodes coming back. Every run completes, no effect is lost or duplicated,
    the chaos invariants hold in every partition, and no partition is left
    without a live holder."""
    from tests.test_cluster import _invariants

    url, server = env["url"], env["server"]
    swarm = Swarm(env)
    for name in ("node-a", "node-b", "node-c"):
        swarm.start(name, "agent.after-effect=block@once")
    for name in ("node-a", "node-b", "node-c"):
        swarm.submit(name, 3)
    for name, daemon in swarm.nodes.items():
        wait_for(f"{name}'s agent after its first effect",
                 (daemon.home / "failpoints" / "agent.after-effect.fired").exists)

    # 1. kill -9 of node a (its whole process group), an effect done and unreported.
    os.killpg(swarm.pids["node-a"], signal.SIGKILL)
    assert wait_exit(swarm.pids["node-a"], 10)
    wait_for("node a's partition to be adopted", lambda: _partition(url, "node-a")["holder"] != "node-a")

    # 2. node b paused past its lease, an effect done and unreported: c adopts it;
    #    b wakes, fenced, and stops (an adoption it ran dies with it).
    b_pid = swarm.pids["node-b"]
    os.kill(b_pid, signal.SIGSTOP)
    try:
        wait_for("node b's partition to be adopted", lambda: _partition(url, "node-b")["holder"] == "node-c")
    finally:
        os.kill(b_pid, signal.SIGCONT)
    _release(swarm.nodes["node-b"])
    assert wait_exit(b_pid, 60), "a fenced node stops"

    # 3. pg_ctl restart -m fast, with runs under way on c.
    swarm.submit("node-c", 2)
    server.restart()

    # 4. 35 s of refused connections, c's agent holding an effect it reports meanwhile.
    before = _agent(swarm.nodes["node-c"])
    server.shut_down()
    _release(swarm.nodes["node-c"])
    outage_ends = time.monotonic() + OUTAGE_S
    wait_for("c's agent to be told the ledger is away",
             lambda: "ledger-unavailable" in _log(swarm.nodes["node-c"], "writer"), timeout=120)
    time.sleep(max(0.0, outage_ends - time.monotonic()))  # the fault's own length, not a wait for a result
    server.launch()
    back = time.monotonic()
    after = wait_for("c's agent to report its effect", lambda: (a := _agent(swarm.nodes["node-c"]))["status"] and (
        "ledger is back" in _log(swarm.nodes["node-c"], "writer") or a["incarnation"] != before["incarnation"]) and a)
    assert after["incarnation"] == before["incarnation"], ("c's agent waited out the outage, never crashed", after)

    # 5. The nodes that stopped come back, on their homes; more work everywhere.
    swarm.start("node-a")
    swarm.start("node-b")
    for name in ("node-a", "node-b", "node-c"):
        swarm.submit(name, 2)
    ended = swarm.drive_all()
    took = time.monotonic() - back
    print(f"\nchaos: {len(ended)} runs ended {took:.1f} s after the database came back")

    assert set(ended.values()) == {"completed"}, ended
    lines = effects(env["tmp"] / "effects.log")
    per_run = {run_id: sum(1 for line in lines if line["run_id"] == run_id) for run_id in swarm.runs}
    assert max(per_run.values()) <= 1, ("an effect happened twice", per_run)
    partitions = sorted({row["partition"] for row in _orphans(url)} | set(swarm.runs.values()))
    for partition in sorted(set(swarm.runs.values())):
        from corral.supervisor.ledger.ledger_pg import PostgresLedger

        ledger = PostgresLedger(url, partition, readonly=True)
        try:
            for row in ledger.all("SELECT a.run_id, a.phase FROM actions a WHERE a.tool = 'effect.record'"):
                if row["phase"] == "ok":
                    assert per_run.get(row["run_id"]) == 1, ("an effect the ledger counts done is lost", dict(row))
        finally:
            ledger.close()
    _invariants(url, partitions, env["tmp"] / "effects.log")
    last: list[dict[str, Any]] = []

    def none_orphaned() -> bool:
        last[:] = _orphans(url)
        return not last

    try:
        wait_for("every partition held by a live node", none_orphaned, timeout=120)
    except AssertionError:
        raise AssertionError(f"partitions no live node holds: {last}") from None


BUSY = agent_spec(
    workspace="project",
    steps="".join(f'[[agents.steps]]\nactions = [{{ tool = "effect.record", input = {{ label = "e{i}" }} }}]\n'
                  for i in range(30)) + '[[agents.steps]]\nfinal = "done"\n',
    extra=f"[ledger]\nlease_s = {LEASE_S}\n",
)


@pytest.mark.slow
def test_an_immediate_stop_of_the_database_under_a_busy_node_loses_no_effect_and_up_resumes(
    env: dict[str, Any],
) -> None:
    """``pg_ctl stop -m immediate`` for real (SIGQUIT to the postmaster) while a node
    commits: the commits not yet flushed are lost, so the node usually stops
    (lost commits). Then status and doctor say what to do, and ``corral up --node``
    resumes it. Either way every run completes and no effect happens twice."""
    env["specs"]["busy"] = env["tmp"] / "busy.toml"
    env["specs"]["busy"].write_text(BUSY)
    node, pid = _node(env, "node-a", spec="busy")
    runs = [node.call("run", agent_id="writer", task=f"busy {i}")["run_id"] for i in range(3)]
    effects_path = env["tmp"] / "effects.log"
    wait_for("the node at work", lambda: len(effects(effects_path)) >= 5)
    server: Server = env["server"]
    old = server.pg.pid
    assert server.pg.process is not None
    server.pg.process.send_signal(signal.SIGQUIT)  # what `pg_ctl stop -m immediate` sends
    server.pg.process.wait()
    server.pg.process = None
    server._track(old)
    server.launch()

    def settled() -> str:
        if not _alive(pid):
            return "stopped"
        try:
            shown = [node.call("show", run_id=run_id)["run"]["status"] for run_id in runs]
        except (SupervisorGone, homes.NotRunning):  # it stopped while being asked: the next look says so
            return ""
        return "rode it out" if set(shown) == {"completed"} else ""

    outcome = wait_for("the node to stop, or its runs to complete", settled, timeout=180)
    print(f"\nimmediate stop: the node {outcome}")
    if outcome == "stopped":
        said = cli(node.home, "status", env=node.env)
        assert "lost commits" in said.stderr and "--node node-a" in said.stderr, said.stderr
        _up(node, "node-a")
    for run_id in runs:
        shown, _reconciled = drive_to_end(node, run_id, effects_path, timeout=180)
        assert shown["run"]["status"] == "completed", shown["run"]
    lines = effects(effects_path)
    keys = [(line["run_id"], line["label"]) for line in lines]
    assert len(keys) == len(set(keys)), "no effect happened twice"
    wait_for("status to be healthy", lambda: node.status()["degraded"] == "")

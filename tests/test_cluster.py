"""Several supervisors (nodes) sharing one PostgreSQL ledger, on a real server.

Each node is its own process group with its own home, as on separate hosts; the
demo swarm's project directory and effects file stand for shared storage. Nodes
are killed (SIGKILL) and paused (SIGSTOP past their lease) for real.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.chaos.invariants import check_all
from corral.core.procs import wait_exit
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger.ledger_pg import PostgresLedger
from corral.supervisor.ledger.ledger_spec import URL_ENV
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

LEASE_S = 1.5


@pytest.fixture
def cluster(short_tmp: Path, pg_url: str) -> Iterator[dict[str, Any]]:
    """Two nodes' daemons (not started), the demo spec with a short lease, and the
    ledger URL; every node and adoption is shut down and reaped afterwards."""
    from corral.cli.swarm import demo_spec_text

    (short_tmp / "project").mkdir()
    spec = short_tmp / "swarm.toml"
    spec.write_text(demo_spec_text() + f"\n[ledger]\nlease_s = {LEASE_S}\n")
    env = {URL_ENV: pg_url}
    nodes = {name: Daemon(short_tmp / name, spec, env) for name in ("a", "b")}
    extra: list[Daemon] = []
    try:
        yield {"nodes": nodes, "url": pg_url, "tmp": short_tmp, "extra": extra, "env": env}
    finally:
        for daemon in [*extra, *nodes.values()]:
            daemon.shutdown()


def _up(daemon: Daemon, node: str, env: dict[str, str] | None = None) -> int:
    daemon.env = {**daemon.env, **(env or {})}
    result = cli(daemon.home, "up", "--spec", str(daemon.spec), "--node", node, env=daemon.env)
    assert result.returncode == 0, result.stderr + result.stdout
    endpoint = homes.read_endpoint(daemon.home)
    daemon.pids_seen.add(endpoint.pid)
    return endpoint.pid


def _adopted(cluster: dict[str, Any], adopter: Daemon, partition: str) -> Daemon:
    """The supervisor the adopting node started for ``partition``, once it is ready."""
    daemon = adopted_daemon(adopter, partition, cluster["env"])
    cluster["extra"].append(daemon)
    return daemon


def _lease_left(url: str, partition: str) -> float:
    """Seconds left on a partition's lease, by the database's clock (negative: expired)."""
    from corral.supervisor.cluster import cluster_tables as cluster
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn = connect_cluster(url)
    try:
        return float(next(row["lease_left_s"] for row in cluster.view(conn)["partitions"] if row["name"] == partition))
    finally:
        conn.close()


def _invariants(url: str, partitions: list[str], effects_path: Path) -> None:
    """The chaos invariants in each partition, over the effects of its own runs
    (the effects file is shared); every effect belongs to a run of one of them."""
    import json as json_module

    lines = effects(effects_path)
    claimed: set[str] = set()
    for partition in partitions:
        ledger = PostgresLedger(url, partition, readonly=True)
        try:
            runs = {row["run_id"] for row in ledger.all("SELECT run_id FROM runs")}
            own = effects_path.with_name(f"effects-{partition}.log")
            own.write_text("".join(json_module.dumps(line) + "\n" for line in lines if line["run_id"] in runs))
            for check in check_all(ledger, own):
                assert check.passed, (partition, check.name, check.failures)
            claimed |= runs
        finally:
            ledger.close()
    assert {line["run_id"] for line in lines} <= claimed, "an effect of no run at all"


def test_a_killed_node_is_adopted_and_its_run_finishes_once(cluster: dict[str, Any]) -> None:
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    a_pid = _up(a, "node-a", {"CORRAL_FAILPOINTS": "action.after-executing=block@once"})
    _up(b, "node-b")
    assert a.status()["cluster"]["partition"] == "node-a"
    run_id = a.call("run", agent_id="project-supervisor", task="launch")["run_id"]
    # A holds executing committed, the agent not yet told: then the whole node dies.
    wait_for("node a inside its failpoint", (a.home / "failpoints" / "action.after-executing.fired").exists)
    os.killpg(a_pid, signal.SIGKILL)
    assert wait_exit(a_pid, 10)

    adopted = _adopted(cluster, b, "node-a")
    shown, _reconciled = drive_to_end(adopted, run_id, cluster["tmp"] / "effects.log")
    assert shown["run"]["status"] == "completed", shown["run"]
    assert len(ledger_rows(adopted.home, "SELECT * FROM replies WHERE run_id = ?", run_id)) == 1
    _invariants(cluster["url"], ["node-a"], cluster["tmp"] / "effects.log")

    view = b.status()["cluster"]
    partitions = {row["name"]: row for row in view["partitions"]}
    assert partitions["node-a"]["holder"] == "node-b"
    assert partitions["node-a"]["adopted_from"] == "node-a"
    assert partitions["node-a"]["epoch"] == 2, "the takeover moved the fencing token on"
    assert {row["node_id"] for row in view["nodes"]} == {"node-a", "node-b"}
    kinds = {event["kind"] for event in adopted.events()}
    assert "partition-adopted" in kinds
    assert any(event["kind"] == "partition-adopting" for event in b.events())
    # Node b's own stream tells what happened to every node of the cluster.
    wait_for("b's stream to tell the cluster's changes", lambda: {
        ("cluster-node-up", "node-a"), ("cluster-node-lost", "node-a"), ("cluster-partition-held", "node-a")
    } <= {(event["kind"], event["subject"]) for event in b.events()})
    held = [e["data"] for e in b.events() if e["kind"] == "cluster-partition-held" and e["subject"] == "node-a"]
    assert held[-1] == {"holder": "node-b", "epoch": 2}

    # Node a comes back: b's adoption of its partition has no unfinished run, so it
    # hands the partition back, and a writes to its own partition again.
    a.env.pop("CORRAL_FAILPOINTS")
    _up(a, "node-a")
    assert a.status()["cluster"]["partition"] == "node-a"
    second = a.call("run", agent_id="project-supervisor", task="launch again")["run_id"]
    shown, _ = drive_to_end(a, second, cluster["tmp"] / "effects.log")
    assert shown["run"]["status"] == "completed"
    doctor = json.loads(cli(a.home, "doctor", "--json", env=a.env).stdout)
    ledger = next(f for f in doctor["findings"] if f["check"] == "ledger")
    assert ledger["level"] == "ok" and "partition node-a:" in ledger["detail"], ledger


def _one_effect(ledger: str = "") -> str:
    return one_effect_spec(f"lease_s = {LEASE_S}\n{ledger}")


ONE_EFFECT = _one_effect()


def test_a_paused_node_past_its_lease_is_fenced_when_it_wakes(cluster: dict[str, Any]) -> None:
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    assert a.spec is not None
    a.spec = b.spec = a.spec.with_name("one-effect.toml")
    a.spec.write_text(ONE_EFFECT)
    a_pid = _up(a, "node-a", {"CORRAL_FAILPOINTS": "agent.after-effect=block@once"})
    _up(b, "node-b")
    a_boot = a.status()["boot_id"]
    run_id = a.call("run", agent_id="writer", task="record one effect")["run_id"]
    # An agent of node a has done a side effect and not yet reported it; then the
    # node's supervisor stops (a long GC pause, a partition) well past its lease.
    wait_for("an agent of node a after its effect", (a.home / "failpoints" / "agent.after-effect.fired").exists)
    os.kill(a_pid, signal.SIGSTOP)
    try:
        adopted = _adopted(cluster, b, "node-a")
        unknown = wait_for(
            "the adoption's recovery",
            lambda: ledger_rows(adopted.home, "SELECT action_id FROM actions WHERE phase = 'needs-reconciliation'"),
        )
    finally:
        os.kill(a_pid, signal.SIGCONT)
    # Node a wakes; its agent reports the effect. Nothing of it may land.
    (a.home / "failpoints" / "agent.after-effect.release").touch()
    assert wait_exit(a_pid, 30), "a fenced node stops"
    log = (a.home / "logs" / "supervisor.log").read_text()
    assert "fenced, stopping at once" in log
    late = ledger_rows(adopted.home, "SELECT kind FROM events WHERE boot_id = ? AND kind != 'boot-started'"
                       " AND cursor > (SELECT MIN(cursor) FROM events WHERE kind = 'partition-adopted')", a_boot)
    assert late == [], f"the fenced node wrote after the takeover: {late}"
    for row in unknown:
        phase = ledger_rows(adopted.home, "SELECT phase FROM actions WHERE action_id = ?", row["action_id"])
        assert phase == [{"phase": "needs-reconciliation"}], "the old holder's report was refused"

    shown, reconciled = drive_to_end(adopted, run_id, cluster["tmp"] / "effects.log")
    assert shown["run"]["status"] == "completed", shown["run"]
    assert reconciled == 1, "the effect's outcome was unknown: reconciled, never replayed"
    lines = [line for line in effects(cluster["tmp"] / "effects.log") if line["run_id"] == run_id]
    assert len(lines) == 1, "the side effect happened exactly once across both nodes"
    _invariants(cluster["url"], ["node-a"], cluster["tmp"] / "effects.log")


def test_adoptions_chain_when_the_adopter_dies_too(cluster: dict[str, Any]) -> None:
    """Node a dies mid-action and b adopts its partition; then b dies mid-action
    too, with a's partition in its hands. Node a comes back: it takes its own
    partition back and adopts b's. Each run finishes once, each effect happened
    once, in both partitions."""
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    assert a.spec is not None
    a.spec = b.spec = a.spec.with_name("one-effect.toml")
    a.spec.write_text(ONE_EFFECT)
    a_pid = _up(a, "node-a", {"CORRAL_FAILPOINTS": "action.after-executing=block@once"})
    b_pid = _up(b, "node-b", {"CORRAL_FAILPOINTS": "agent.after-effect=block@once"})
    run_a = a.call("run", agent_id="writer", task="effect on a")["run_id"]
    wait_for("node a inside its failpoint", (a.home / "failpoints" / "action.after-executing.fired").exists)
    os.killpg(a_pid, signal.SIGKILL)
    assert wait_exit(a_pid, 10)
    adopted_by_b = _adopted(cluster, b, "node-a")
    # The adoption parks a's run (its effect's outcome is unknown); nobody settles it.
    wait_for("the adoption's recovery", lambda: ledger_rows(
        adopted_by_b.home, "SELECT 1 FROM runs WHERE run_id = ? AND status = 'needs-reconciliation'", run_a))
    run_b = b.call("run", agent_id="writer", task="effect on b")["run_id"]
    wait_for("an agent of node b after its effect", (b.home / "failpoints" / "agent.after-effect.fired").exists)
    adopted_pid = homes.read_endpoint(adopted_by_b.home).pid
    os.killpg(b_pid, signal.SIGKILL)  # b, and with it the supervisor it ran for a's partition
    assert wait_exit(b_pid, 10) and wait_exit(adopted_pid, 10)

    a.env.pop("CORRAL_FAILPOINTS")
    wait_for("the lease b held on node-a to run out", lambda: _lease_left(cluster["url"], "node-a") < 0)
    _up(a, "node-a")
    # b let node-a go (it died): a takes its own partition back, and adopts b's.
    assert a.status()["cluster"]["partition"] == "node-a"
    effects_log = cluster["tmp"] / "effects.log"
    for serving, run_id in ((a, run_a), (_adopted(cluster, a, "node-b"), run_b)):
        shown, reconciled = drive_to_end(serving, run_id, effects_log)
        assert shown["run"]["status"] == "completed", shown["run"]
        assert reconciled == 1
        assert len([e for e in effects(effects_log) if e["run_id"] == run_id]) <= 1
    _invariants(cluster["url"], ["node-a", "node-b"], effects_log)
    partitions = {row["name"]: row for row in a.status()["cluster"]["partitions"]}
    assert partitions["node-a"]["holder"] == partitions["node-b"]["holder"] == "node-a"
    assert partitions["node-a"]["epoch"] == 3, "taken over twice"
    assert partitions["node-b"]["epoch"] == 2


def test_an_adoption_retires_when_its_runs_are_over_and_the_node_takes_its_partition_back(
    cluster: dict[str, Any],
) -> None:
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    assert a.spec is not None
    a.spec = b.spec = a.spec.with_name("one-effect.toml")
    a.spec.write_text(_one_effect("retire_idle_s = 1.0"))
    a_pid = _up(a, "node-a", {"CORRAL_FAILPOINTS": "action.after-executing=block@once"})
    _up(b, "node-b")
    run_id = a.call("run", agent_id="writer", task="record one effect")["run_id"]
    wait_for("node a inside its failpoint", (a.home / "failpoints" / "action.after-executing.fired").exists)
    os.killpg(a_pid, signal.SIGKILL)
    assert wait_exit(a_pid, 10)
    adopted = _adopted(cluster, b, "node-a")
    adopted_pid = homes.read_endpoint(adopted.home).pid
    shown, _ = drive_to_end(adopted, run_id, cluster["tmp"] / "effects.log")
    assert shown["run"]["status"] == "completed"
    # No unfinished run is left: the adoption stops by itself, its lease runs out.
    assert wait_exit(adopted_pid, 30), "an idle adoption retires"
    kinds = [row["kind"] for row in ledger_rows(adopted.home, "SELECT kind FROM events ORDER BY cursor")]
    assert "partition-retired" in kinds
    a.env.pop("CORRAL_FAILPOINTS")
    # Retired, the partition is not left to nobody: node b keeps it, dormant, and
    # lets it go to node a when a asks for it back.
    wait_for("node b to keep the retired partition", lambda: "node-a" in b.status()["cluster"]["dormant"])
    _up(a, "node-a")
    assert a.status()["cluster"]["partition"] == "node-a", "its own partition, back"
    held = {row["name"]: row for row in a.status()["cluster"]["partitions"]}["node-a"]
    assert (held["holder"], held["epoch"], held["adopted_from"]) == ("node-a", 3, "node-b")
    again = a.call("run", agent_id="writer", task="once more")["run_id"]
    assert drive_to_end(a, again, cluster["tmp"] / "effects.log")[0]["run"]["status"] == "completed"
    _invariants(cluster["url"], ["node-a"], cluster["tmp"] / "effects.log")


def test_the_ledger_password_is_kept_out_of_the_home_the_logs_and_the_ledger(
    short_tmp: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL with a password (the test server trusts local users, so any password
    works): it reaches the supervisor, and nothing corral writes holds it. A
    restart without it is refused rather than moved to an empty SQLite ledger."""
    password = "Pg-s3cret-Passw0rd-7731"
    with_password = pg_url.replace("postgresql:///", f"postgresql://postgres:{password}@/", 1)
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(ONE_EFFECT)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        result = cli(daemon.home, "up", "--spec", str(spec), "--ledger", with_password, "--node", "secretive")
        assert result.returncode == 0, result.stderr
        daemon.pids_seen.add(homes.read_endpoint(daemon.home).pid)
        run_id = daemon.call("run", agent_id="writer", task="record one effect")["run_id"]
        monkeypatch.setenv(URL_ENV, with_password)  # how this test reads the ledger, as a user would
        shown, _ = drive_to_end(daemon, run_id, short_tmp / "effects.log")
        assert shown["run"]["status"] == "completed"
        status = cli(daemon.home, "status", "--json")
        assert "postgres:***@" in status.stdout and password not in status.stdout
        ledger = PostgresLedger(pg_url, "secretive", readonly=True)
        try:
            rows = ledger.rows_as_text()
        finally:
            ledger.close()
        assert "boot-started" in rows and password not in rows
        daemon.shutdown()
        for path in daemon.home.rglob("*"):
            if path.is_file() and not path.name.endswith(".ipc"):
                assert password.encode() not in path.read_bytes(), path
        again = cli(daemon.home, "up", env={URL_ENV: ""})
        assert again.returncode != 0 and "password is not stored" in again.stderr + again.stdout
    finally:
        daemon.shutdown()


def test_bad_ledger_settings_are_refused_and_start_nothing(short_tmp: Path, pg_url: str) -> None:
    home = short_tmp / "h"
    for args, message in [
        (["--ledger", "mysql://x/y"], "must be postgresql://"),
        (["--ledger", pg_url, "--node", "Bad Node"], "node id"),
        (["--ledger", "postgresql://nobody@127.0.0.1:1/none"], "cannot reach the PostgreSQL ledger"),
    ]:
        result = cli(home, "up", *args)
        assert result.returncode != 0
        assert message in result.stderr + result.stdout, result.stderr + result.stdout
        with pytest.raises(homes.NotRunning):
            homes.read_endpoint(home)

"""Any node takes any run: the cluster's shared queue, on a real PostgreSQL.

Runs submitted to one node of three spread over the three; a node killed while
it holds runs that never started and one that did: the first run elsewhere, the
second is adopted, and no effect happens twice; two nodes taking the same
queued run at once (held apart by a failpoint, not by time): one run; the same
run id given to every node: one run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.core import failpoints
from corral.core.procs import wait_exit
from corral.supervisor.runs.run_feature import RunFeatures
from tests.harness import Daemon, drive_to_end, effects, one_effect_spec, wait_for
from tests.test_cluster import _adopted, _up

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

LEASE_S = 1.5
TASK = "record one effect"
#: How many runs the default run spreads over three nodes (the slow one: the issue's 90).
SPREAD_RUNS = 30


def _spec(capacity: str) -> str:
    return one_effect_spec(f"lease_s = {LEASE_S}\nqueue_poll_s = 0.1\n{capacity}")


@pytest.fixture
def nodes(short_tmp: Path, pg_url: str) -> Iterator[dict[str, Any]]:
    """Three nodes' daemons (not started) on one spec; all shut down and reaped afterwards."""
    from corral.supervisor.ledger.ledger_spec import URL_ENV

    (short_tmp / "project").mkdir()
    spec = short_tmp / "queue.toml"
    spec.write_text(_spec("max_runs_per_agent = 2"))
    env = {URL_ENV: pg_url}
    daemons = {name: Daemon(short_tmp / name, spec, env) for name in ("a", "b", "c")}
    extra: list[Daemon] = []
    try:
        yield {"nodes": daemons, "url": pg_url, "tmp": short_tmp, "extra": extra, "env": env, "spec": spec}
    finally:
        for daemon in [*extra, *daemons.values()]:
            daemon.shutdown()


def _where(url: str) -> dict[str, tuple[str, str]]:
    """Every run of the cluster: its partition and status."""
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn = connect_cluster(url)
    try:
        found: dict[str, tuple[str, str]] = {}
        for name, schema in conn.execute("SELECT name, schema_name FROM corral_cluster.partitions ORDER BY name"):
            with contextlib.suppress(Exception):
                for run_id, status in conn.execute(f"SELECT run_id, status FROM {schema}.runs").fetchall():
                    assert run_id not in found, f"run {run_id} in two partitions"
                    found[str(run_id)] = (str(name), str(status))
        return found
    finally:
        conn.close()


def _queue_depth(url: str) -> int:
    from corral.supervisor.ledger import ledger_pg_queue
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn = connect_cluster(url)
    try:
        return ledger_pg_queue.depth(conn)
    finally:
        conn.close()


def _effects_per_run(path: Path) -> Counter[str]:
    return Counter(line["run_id"] for line in effects(path)) if path.exists() else Counter()


def _all_done(url: str, run_ids: list[str]) -> bool:
    where = _where(url)
    return all(run_id in where and where[run_id][1] == "completed" for run_id in run_ids)


def _spread(nodes: dict[str, Any], count: int) -> None:
    for name in ("a", "b", "c"):
        _up(nodes["nodes"][name], f"node-{name}")
    a = nodes["nodes"]["a"]
    run_ids = [f"run-spread-{i:04d}" for i in range(count)]
    answers = [a.call("run", agent_id="writer", task=TASK, run_id=run_id) for run_id in run_ids]
    assert any(answer.get("queued") for answer in answers), "node a had no room for most of them"
    wait_for("every run to complete", lambda: _all_done(nodes["url"], run_ids), timeout=30 + 3 * count)
    where = _where(nodes["url"])
    share = Counter(where[run_id][0] for run_id in run_ids)
    assert set(share) == {"node-a", "node-b", "node-c"}, f"every node ran some of them: {share}"
    assert _effects_per_run(nodes["tmp"] / "effects.log") == Counter(run_ids), "each effect exactly once"
    assert _queue_depth(nodes["url"]) == 0
    load = a.status()["cluster"]["load"]
    assert {n["node"] for n in load["nodes"]} == {"node-a", "node-b", "node-c"}
    assert all(n["capacity"] == {"max_runs": 16, "max_runs_per_agent": 2} for n in load["nodes"]), load
    assert load["totals"]["max_runs"] == 48 and load["queue_depth"] == 0, load


def test_a_node_has_room_for_an_agent_below_both_of_its_capacities() -> None:
    from corral.supervisor.cluster.run_queue import Capacity, Load, room

    capacity = Capacity(max_runs=3, max_runs_per_agent=2)
    assert room(capacity, Load(), ["w", "x"]) == {"w": 2, "x": 2}
    assert room(capacity, Load(1, {"w": 2}), ["w", "x"]) == {"x": 2}
    assert room(capacity, Load(2, {"w": 1, "x": 1}), ["w", "x"]) == {"w": 1, "x": 1}
    assert room(capacity, Load(3, {"w": 1}), ["w", "x"]) == {}
    assert room(Capacity(0, 4), Load(), ["w"]) == {}


def test_a_submit_with_a_goal_a_conversation_or_a_secret_stays_on_its_node() -> None:
    from corral.supervisor.cluster.run_queue import queueable

    assert queueable({"agent_id": "w", "task": "t", "run_id": "run-abcdef"})
    assert not queueable({"agent_id": "w", "task": "t", "goal": "g"})
    assert not queueable({"agent_id": "w", "task": "t", "conversation_id": "conv-1"})
    assert not queueable({"agent_id": "w", "task": "use ghp_abcdefghijklmnopqrstuvwxyz0123456789"})


def test_runs_submitted_to_one_node_of_three_spread_over_all_three(nodes: dict[str, Any]) -> None:
    _spread(nodes, SPREAD_RUNS)


@pytest.mark.slow
def test_ninety_runs_submitted_to_one_node_of_three_spread_over_all_three(nodes: dict[str, Any]) -> None:
    _spread(nodes, 90)


def test_a_killed_node_s_runs_that_never_started_run_elsewhere_and_its_started_one_is_adopted(
    nodes: dict[str, Any],
) -> None:
    a, b = nodes["nodes"]["a"], nodes["nodes"]["b"]
    nodes["spec"].write_text(_spec("max_runs_per_agent = 4"))
    url, effects_log = nodes["url"], nodes["tmp"] / "effects.log"
    # The agent holds its first run's effect (executing committed, not done): its
    # lane is busy, so the next runs wait in node a's partition, never started.
    a_pid = _up(a, "node-a", {"CORRAL_FAILPOINTS": "agent.before-effect=block@once"})
    started = a.call("run", agent_id="writer", task=TASK, run_id="run-kill-started")["run_id"]
    wait_for("node a's agent inside its failpoint", (a.home / "failpoints" / "agent.before-effect.fired").exists)
    waiting = [a.call("run", agent_id="writer", task=TASK, run_id=f"run-kill-waiting-{i}")["run_id"] for i in range(3)]
    queued = a.call("run", agent_id="writer", task=TASK, run_id="run-kill-queued")
    assert queued.get("queued") is True, "node a had no room for a fifth"
    where = _where(url)
    assert all(where[run_id] == ("node-a", "pending") for run_id in waiting), where
    assert where[started] == ("node-a", "running")
    # `corral status`: per node its runs in flight, those waiting there for their
    # agent (its own backlog), its capacity; the shared queue's depth; totals.
    load = a.status()["cluster"]["load"]
    (mine,) = [n for n in load["nodes"] if n["node"] == "node-a"]
    assert (mine["in_flight"], mine["waiting"], mine["capacity"]["max_runs_per_agent"]) == (4, 3, 4), load
    assert (load["queue_depth"], load["totals"]["waiting"], load["totals"]["queued"]) == (1, 3, 1), load

    _up(b, "node-b")
    wait_for("node b to take the queued run", lambda: _all_done(url, ["run-kill-queued"]))
    assert _where(url)["run-kill-queued"][0] == "node-b"
    os.killpg(a_pid, signal.SIGKILL)
    assert wait_exit(a_pid, 10)

    # Node b takes node a's partition over: the runs that never started go back
    # to the shared queue and run on b; the started one is adopted and finishes there.
    wait_for("node a's waiting runs to run elsewhere", lambda: _all_done(url, waiting), timeout=90)
    where = _where(url)
    assert all(where[run_id][0] == "node-b" for run_id in waiting), where
    assert any(e["kind"] == "runs-requeued" and e["subject"] == "node-a" for e in b.events())
    adopted = _adopted(nodes, b, "node-a")
    shown, _ = drive_to_end(adopted, started, effects_log)
    assert shown["run"]["status"] == "completed", shown["run"]
    assert _where(url)[started][0] == "node-a", "a run that started stays in its partition"
    per_run = _effects_per_run(effects_log)
    assert per_run[started] <= 1, "the started run's effect at most once"
    assert all(per_run[run_id] == 1 for run_id in [*waiting, "run-kill-queued"]), per_run


def test_the_same_run_id_given_to_each_node_is_one_run(nodes: dict[str, Any]) -> None:
    daemons = nodes["nodes"]
    nodes["spec"].write_text(_spec("max_runs = 0"))  # nobody has room: every submit waits in the queue
    for name in ("a", "b", "c"):
        _up(daemons[name], f"node-{name}")
    answers = [
        daemons[name].call("run", agent_id="writer", task=TASK, run_id="run-same-each") for name in ("a", "b", "c")
    ]
    assert answers[0] == {"run_id": "run-same-each", "queued": True}, answers
    assert all(answer.get("existing") and answer.get("queued") for answer in answers[1:]), answers
    assert _queue_depth(nodes["url"]) == 1
    assert "run-same-each" not in _where(nodes["url"])


def test_a_queued_run_resubmitted_to_each_node_after_a_node_took_it_is_one_run(nodes: dict[str, Any]) -> None:
    daemons = nodes["nodes"]
    for name in ("a", "b", "c"):
        _up(daemons[name], f"node-{name}")
    run_id = "run-same-taken"
    first = daemons["b"].call("run", agent_id="writer", task=TASK, run_id=run_id)
    assert first["run_id"] == run_id and not first.get("existing"), first
    wait_for("the run to complete", lambda: _all_done(nodes["url"], [run_id]))
    for name in ("a", "b", "c"):
        again = daemons[name].call("run", agent_id="writer", task=TASK, run_id=run_id)
        assert (again["run_id"], again.get("existing"), again["status"]) == (run_id, True, "completed"), again
    assert list(_where(nodes["url"])) == [run_id]
    assert _effects_per_run(nodes["tmp"] / "effects.log") == Counter([run_id])


def test_a_node_with_no_room_queues_a_submit_and_its_client_waits_for_the_node_that_ran_it(
    nodes: dict[str, Any],
) -> None:
    """``corral run --wait`` and the Python client, given a node that takes no run
    (``max_runs = 0``): the run waits in the shared queue, node b runs it, and the
    client is answered through node a as if a had run it."""
    import corral
    from tests.harness import cli

    a, b = nodes["nodes"]["a"], nodes["nodes"]["b"]
    full = nodes["tmp"] / "full.toml"
    full.write_text(_spec("max_runs = 0"))
    a.spec = full
    _up(a, "node-a")
    _up(b, "node-b")
    done = cli(
        a.home, "run", "--agent", "writer", "--task", TASK, "--wait", "--json", "--timeout", "60", env=a.env, timeout=90
    )
    assert done.returncode == 0, done.stderr + done.stdout
    shown = json.loads(done.stdout)
    assert shown["run"]["status"] == "completed", shown
    assert _where(nodes["url"])[shown["run"]["run_id"]][0] == "node-b"
    with corral.Client(a.home) as client:
        result = client.run("writer", TASK, wait=True, timeout=60)
    assert result.status == "completed", result.raw
    assert _where(nodes["url"])[result.run_id][0] == "node-b"
    status = cli(a.home, "status", env=a.env)
    assert status.returncode == 0, status.stderr
    assert "shared queue: 0 run(s) waiting" in status.stdout, status.stdout
    assert "0 runs, 4 per agent" in status.stdout and "(cluster)" in status.stdout, status.stdout


@pytest.mark.parametrize("first_commits", [True, False])
def test_two_nodes_taking_the_same_queued_run_at_once_make_one_run(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_commits: bool
) -> None:
    """Node one is inside the transaction that takes the run (the queue row locked,
    its creation not committed), held there by a failpoint; node two asks for the
    same run then: it is told another node has it, at once (SKIP LOCKED: no wait).
    Once one commits, two finds nothing to take; once one rolls back, two takes it."""
    from corral.supervisor.cluster import cluster_tables
    from corral.supervisor.ledger import ledger_pg_queue
    from corral.supervisor.ledger.ledger_pg import PostgresLedger
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster
    from corral.supervisor.ledger.ledger_pg_queue import QueuedRunTaken
    from corral.supervisor.runs.run_store import create_run

    conn = connect_cluster(pg_url)
    ledgers: dict[str, PostgresLedger] = {}
    run_id = "run-two-takers-" + ("commit" if first_commits else "rollback")
    try:
        for name in ("p1", "p2"):
            hold = cluster_tables.acquire_own(conn, name, None, 600.0, None)
            ledgers[name] = PostgresLedger(pg_url, name, epoch=hold.epoch)
        one, two = ledgers["p1"], ledgers["p2"]
        with one.tx() as db:
            ledger_pg_queue.enqueue(db, run_id, "writer", {"task": TASK}, "p1")

        def take(ledger: PostgresLedger) -> str:
            ledger.from_queue = run_id
            try:
                return create_run(
                    ledger, NO_FEATURES,
                    agent_id="writer", task=TASK, provider="scripted", provider_config={}, run_id=run_id
                )
            finally:
                ledger.from_queue = None

        class Abandon(Exception):
            pass

        outcome: dict[str, Any] = {}

        def first() -> None:
            try:
                with one.tx():
                    outcome["one"] = take(one)
                    if not first_commits:
                        raise Abandon
            except Abandon:
                outcome["one"] = "rolled back"

        monkeypatch.setenv(failpoints.MARKER_DIR_ENV, str(tmp_path))
        failpoints.configure("queue.claiming=block@once")
        thread = threading.Thread(target=first)
        thread.start()
        try:
            wait_for("node one inside its taking transaction", (tmp_path / "queue.claiming.fired").exists)
            with pytest.raises(QueuedRunTaken):
                take(two)
            assert ledger_pg_queue.waiting(conn, ["writer"], 10) == [], "a row being taken is skipped"
        finally:
            failpoints.release_path("queue.claiming", tmp_path).touch()
            thread.join(60)
            failpoints.configure("")
        if first_commits:
            assert outcome["one"] == run_id
            with pytest.raises(QueuedRunTaken):
                take(two)
        else:
            assert outcome["one"] == "rolled back"
            assert take(two) == run_id
        owner = "p1" if first_commits else "p2"
        partitions = [
            name
            for name, ledger in ledgers.items()
            if ledger.one("SELECT 1 FROM runs WHERE run_id = ?", run_id) is not None
        ]
        assert partitions == [owner]
        row = conn.execute("SELECT partition FROM corral_cluster.run_ids WHERE run_id = %s", (run_id,)).fetchone()
        assert row[0] == owner
        assert ledger_pg_queue.depth(conn) == 0
    finally:
        for ledger in ledgers.values():
            ledger.close()
        conn.close()


def test_a_bridge_task_given_to_a_node_with_no_room_runs_on_another_and_is_submitted(
    nodes: dict[str, Any], bridge: Any
) -> None:
    """The task bridge's run is an ordinary submit: node a (with the bridge, no
    room) queues it, node b runs it, and a's bridge worker submits its reply."""
    from tests.test_bridge_worker import SPEC as BRIDGE_SPEC
    from tests.test_bridge_worker import _post

    a, b = nodes["nodes"]["a"], nodes["nodes"]["b"]
    (nodes["tmp"] / "ws").mkdir()
    bridged = nodes["tmp"] / "bridged.toml"
    bridged.write_text(BRIDGE_SPEC.format(url=bridge.url) + f"[ledger]\nlease_s = {LEASE_S}\nmax_runs = 0\n")
    plain = nodes["tmp"] / "plain.toml"
    plain.write_text(
        BRIDGE_SPEC.split("[bridge]")[0]
        + "[ledger]\nqueue_poll_s = 0.1\n"
        + BRIDGE_SPEC.split("poll_s = 0.2\n")[1].replace("{{", "{").replace("}}", "}")
    )
    a.spec, b.spec = bridged, plain
    _up(b, "node-b")
    _up(a, "node-a", {"CORRAL_BRIDGE_TOKEN": bridge.tokens["A"]})
    owner = bridge.client("owner")
    task_id = _post(bridge, "write the notes")
    shown = wait_for("the submission", lambda: (t := owner.call("task.get", task_id=task_id))["submissions"] and t)
    assert [s["result"]["summary"] for s in shown["submissions"]] == ["notes written by corral"]
    where = _where(nodes["url"])
    assert list(where.values()) == [("node-b", "completed")], where


FAN_OUT = """
[project]
root = "ws"
{ledger}
[[templates]]
id = "helper"
  [[templates.steps]]
  actions = [{{ tool = "fs.list", input = {{ path = "." }} }}]
  [[templates.steps]]
  final = "listed"

[[agents]]
id = "parent"
  [[agents.steps]]
  actions = [{{ tool = "agent.spawn_isolated", input = {{ children = [
      {{ template = "helper", task = "list", write_scopes = ["s"] }} ] }} }}]
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  final = "joined"
"""


def test_a_queued_run_s_children_are_made_where_it_runs(nodes: dict[str, Any]) -> None:
    """A root run node a had no room for runs on node b, and its child with it."""
    a, b = nodes["nodes"]["a"], nodes["nodes"]["b"]
    (nodes["tmp"] / "ws").mkdir()
    full, room = nodes["tmp"] / "full.toml", nodes["tmp"] / "room.toml"
    full.write_text(FAN_OUT.format(ledger=f"[ledger]\nlease_s = {LEASE_S}\nmax_runs = 0"))
    room.write_text(FAN_OUT.format(ledger=f"[ledger]\nlease_s = {LEASE_S}\nqueue_poll_s = 0.1"))
    a.spec, b.spec = full, room
    _up(a, "node-a")
    _up(b, "node-b")
    run_id = a.call("run", agent_id="parent", task="fan out", run_id="run-fan-out-1")["run_id"]
    wait_for("the root run to end", lambda: _where(nodes["url"]).get(run_id, ("", ""))[1] == "completed", 90)
    where = _where(nodes["url"])
    assert len(where) == 2, f"the root run and its child: {where}"
    assert set(where.values()) == {("node-b", "completed")}, where


@pytest.mark.parametrize("first", ["commits", "dies"])
def test_two_live_nodes_at_one_queued_run_make_one_run(nodes: dict[str, Any], first: str) -> None:
    """Real nodes: node a is inside the transaction that takes a queued run (the
    queue row locked, the run not committed), held there by a failpoint, while
    node b polls the queue. b passes the locked run over (it takes a later one
    meanwhile, so it did look) and never makes a second copy. If a commits, the
    run is a's; if a is killed there, its transaction rolls back and b takes the
    run. Each effect once."""
    from tests.test_pg_front_door import remote

    a, b = nodes["nodes"]["a"], nodes["nodes"]["b"]
    url, tmp = nodes["url"], nodes["tmp"]
    action = "block" if first == "commits" else "kill"
    a_pid = _up(a, "node-a", {"CORRAL_FAILPOINTS": f"queue.claiming={action}@once"})
    held = remote(tmp, url, "run", "--agent", "writer", "--task", TASK, "--run-id", f"run-held-{first}")
    assert held.returncode == 0, held.stderr
    if first == "commits":
        wait_for("node a inside its taking transaction", (a.home / "failpoints" / "queue.claiming.fired").exists)
    else:
        assert wait_exit(a_pid, 30), "node a killed inside its taking transaction"
    _up(b, "node-b")
    later = remote(tmp, url, "run", "--agent", "writer", "--task", TASK, "--run-id", f"run-later-{first}")
    assert later.returncode == 0, later.stderr
    if first == "commits":
        wait_for("node b to take the later run", lambda: _all_done(url, [f"run-later-{first}"]))
        assert _where(url)[f"run-later-{first}"][0] == "node-b"
        assert f"run-held-{first}" not in _where(url), "the run a holds is nobody's until a commits"
        failpoints.release_path("queue.claiming", a.home / "failpoints").touch()
    wait_for("the held run to complete", lambda: _all_done(url, [f"run-held-{first}"]))
    where = _where(url)
    assert where[f"run-held-{first}"][0] == ("node-a" if first == "commits" else "node-b"), where
    assert _queue_depth(url) == 0
    per_run = _effects_per_run(tmp / "effects.log")
    assert per_run == Counter([f"run-held-{first}", f"run-later-{first}"]), per_run

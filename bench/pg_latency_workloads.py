"""Issue 51 §4: what a durable action costs a PostgreSQL node in round trips, and
what a database on another host does to a node's rate.

``pg_round_trips``: the durable loop's scripted agents (three ``fs.list`` per
plan, no think time, bench/durable_workloads.py) on one node:

* on the embedded SQLite ledger (the baseline, same run);
* on PostgreSQL over its Unix socket: the rate, and the ledger's own counters
  (its connection's round trips, commits);
* on PostgreSQL through the latency proxy with no delay (bench/pg_proxy.py): the
  round trips of *every* connection of the node (ledger, group commit's sync,
  cluster), counted outside the driver, per action. The node's background (its
  lease renewals and queue polls) is measured idle, over the same proxy, and
  reported apart (``idle_round_trips_per_s``), so the per-action figure is not
  charged for the wall time.

``pg_latency``: the proxy adds ``DELAY_S`` each way (a database on another host),
16 agents each with one run at a time on one node, then three such nodes driven at
once (the same workload per node), same run: the issue's targets are one node at
25 durable actions/s or more, and three nodes at 2.5x one or more. At that latency
the nodes wait on the network, not on the two cores.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from bench.corral_workloads import _call, _wait_all_ready
from bench.durable_workloads import PER_PLAN, _corral_rate, _spec
from bench.harness import Context, Metrics, Stats, workload
from bench.pg_proxy import LatencyProxy, latency_proxy
from bench.scaleout_workloads import _node, _nodes_rate, _postgres

#: One way, between a node and the database (a LAN hop to another host, with margin).
DELAY_S = 0.010
#: Concurrent runs per node in ``pg_latency``.
RUNS_PER_NODE = 16
#: The issue's targets.
TARGET_TRIPS = 4.0
TARGET_RATIO_SQLITE = 0.6
TARGET_RATE = 25.0
TARGET_SCALE = 2.5


def _database(url: str) -> str:
    return url.split("///", 1)[1].split("?", 1)[0]


def _socket(server: Any) -> Path:
    return Path(server.socket_dir) / ".s.PGSQL.5432"


def _ledger(home: Path) -> dict[str, Any]:
    ledger: dict[str, Any] = _call(home, "status")["ledger"]
    return ledger


def _idle_trips_per_s(proxy: LatencyProxy, seconds: float) -> float:
    before, started = proxy.round_trips, time.perf_counter()
    time.sleep(seconds)
    return (proxy.round_trips - before) / (time.perf_counter() - started)


@workload("pg_round_trips", group="corral", budget_s=600, quick_budget_s=240)
def pg_round_trips(ctx: Context) -> Metrics:
    """Round trips to PostgreSQL per durable action (every connection of the node,
    counted at a proxy; and the ledger connection's own count), commits per action,
    and one node's rate against SQLite on the same workload, same run.
    Return {"round_trips_per_action_{n}", "ledger_round_trips_per_action_{n}",
    "commits_per_action_{pg,sqlite}_{n}", "actions_per_s_{sqlite,pg}_{n}",
    "pg_over_sqlite_{n}", "idle_round_trips_per_s"}."""
    rounds = ctx.reps(1, 3)
    loops = ctx.reps(6, 20)
    counts = (1, 8)
    metrics: dict[str, Any] = ctx.metrics
    with _postgres(ctx) as server:
        for agents in counts:
            spec = _spec(agents, loops)
            actions = agents * loops * PER_PLAN
            ctx.check(f"sqlite n={agents}")
            with _node(ctx, f"sqlite-rt-{agents}", spec, None) as home:
                _wait_all_ready(home, agents, 120)
                before = _ledger(home)
                sqlite = [_corral_rate(home, agents, loops) for _ in range(rounds)]
                after = _ledger(home)
            metrics[f"actions_per_s_sqlite_{agents}"] = Stats.of(sqlite, "per s")
            metrics[f"commits_per_action_sqlite_{agents}"] = Stats.single(
                (after["commits"] - before["commits"]) / (actions * rounds), "tx"
            )
            ctx.check(f"postgres n={agents}")
            with _node(ctx, f"pg-rt-{agents}", spec, server.create_database(f"direct_{agents}")) as home:
                _wait_all_ready(home, agents, 120)
                before = _ledger(home)
                pg = [_corral_rate(home, agents, loops) for _ in range(rounds)]
                after = _ledger(home)
            metrics[f"actions_per_s_pg_{agents}"] = Stats.of(pg, "per s")
            metrics[f"pg_over_sqlite_{agents}"] = Stats.single(
                metrics[f"actions_per_s_pg_{agents}"].median / metrics[f"actions_per_s_sqlite_{agents}"].median,
                f"x SQLite (target >= {TARGET_RATIO_SQLITE})",
            )
            metrics[f"ledger_round_trips_per_action_{agents}"] = Stats.single(
                (after["round_trips"] - before["round_trips"]) / (actions * rounds), "round trips"
            )
            metrics[f"commits_per_action_pg_{agents}"] = Stats.single(
                (after["commits"] - before["commits"]) / (actions * rounds), "tx"
            )
            ctx.check(f"postgres through the counting proxy n={agents}")
            with latency_proxy(_socket(server)) as proxy:
                url = proxy.url(_database(server.create_database(f"counted_{agents}")))
                with _node(ctx, f"pg-counted-{agents}", spec, url) as home:
                    _wait_all_ready(home, agents, 120)
                    idle = _idle_trips_per_s(proxy, 2.0)
                    trips, started = proxy.round_trips, time.perf_counter()
                    for _ in range(rounds):
                        _corral_rate(home, agents, loops)
                    spent = proxy.round_trips - trips - idle * (time.perf_counter() - started)
            metrics[f"round_trips_per_action_{agents}"] = Stats.single(
                spent / (actions * rounds), f"round trips, all connections (target <= {TARGET_TRIPS:g})"
            )
            metrics[f"idle_round_trips_per_s_{agents}"] = Stats.single(idle, "per s (node idle)")
    ctx.note(f"{PER_PLAN} fs.list actions per plan, scripted provider, {loops} loops per agent")
    ctx.note("PostgreSQL 15 on this host, fsync on; round trips counted at a loopback proxy, idle rate subtracted")
    return ctx.metrics


@workload("pg_latency", group="corral", budget_s=900, quick_budget_s=420)
def pg_latency(ctx: Context) -> Metrics:
    """Durable actions/s with a database 10 ms away each way (a proxy): one node
    with 16 concurrent runs, three such nodes at once, and SQLite on the same
    workload, same run. Return {"actions_per_s_{sqlite,pg1,pg3}",
    "three_over_one", "round_trips_per_action"}."""
    loops = ctx.reps(2, 4)
    rounds = ctx.reps(1, 2)
    spec = _spec(RUNS_PER_NODE, loops)
    actions = RUNS_PER_NODE * loops * PER_PLAN
    metrics: dict[str, Any] = ctx.metrics
    ctx.check("sqlite")
    with _node(ctx, "sqlite-far", spec, None) as home:
        _wait_all_ready(home, RUNS_PER_NODE, 120)
        metrics["actions_per_s_sqlite"] = Stats.of(
            [_corral_rate(home, RUNS_PER_NODE, loops) for _ in range(rounds)], "per s"
        )
    with _postgres(ctx) as server, latency_proxy(_socket(server), DELAY_S) as proxy:
        ctx.check("one node")
        url = proxy.url(_database(server.create_database("far_one")))
        with _node(ctx, "far-one", spec, url) as home:
            _wait_all_ready(home, RUNS_PER_NODE, 300)
            trips = proxy.round_trips
            one = [_corral_rate(home, RUNS_PER_NODE, loops) for _ in range(rounds)]
            metrics["round_trips_per_action"] = Stats.single(
                (proxy.round_trips - trips) / (actions * rounds), "round trips, all connections, idle included"
            )
        metrics["actions_per_s_pg1"] = Stats.of(one, f"per s (target >= {TARGET_RATE:g})")
        ctx.check("three nodes")
        url = proxy.url(_database(server.create_database("far_three")))
        with contextlib.ExitStack() as stack:
            homes = [stack.enter_context(_node(ctx, f"far-{chr(97 + i)}", spec, url)) for i in range(3)]
            for home in homes:
                _wait_all_ready(home, RUNS_PER_NODE, 300)
            three = [_nodes_rate(homes, RUNS_PER_NODE, loops) for _ in range(rounds)]
        metrics["actions_per_s_pg3"] = Stats.of(three, "per s")
    metrics["three_over_one"] = Stats.single(
        metrics["actions_per_s_pg3"].median / metrics["actions_per_s_pg1"].median,
        f"x one node, same run (target >= {TARGET_SCALE:g})",
    )
    ctx.note(f"{RUNS_PER_NODE} agents per node, one run each at a time, {PER_PLAN} fs.list per plan, {loops} loops")
    ctx.note(f"a loopback proxy adds {DELAY_S * 1e3:g} ms each way between every node and PostgreSQL 15 (fsync on)")
    return ctx.metrics

"""``durable_actions_postgres``: the durable loop on a shared PostgreSQL ledger.

The same scripted agents as ``durable_actions`` (three ``fs.list`` actions per
plan, no think time), at 1, 8 and 64 agents:

* corral on its embedded SQLite ledger (the baseline, same run);
* corral on PostgreSQL, one node;
* corral on PostgreSQL, two nodes (two supervisors on this host, the agents split
  between them, both driven at once);
* the bare-PostgreSQL limit: one synchronously committed transaction per
  transition (UPDATE + INSERT), from one connection.

The server is a throwaway PostgreSQL (corral/core/pg_local.py) with fsync on and
synchronous commit, as in production; it shares the machine's two cores with the
nodes, so the two-node figure shows contention, not a second host's capacity.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.corral_workloads import _call, _wait_all_ready, supervisor
from bench.durable_workloads import PER_PLAN, TRANSITIONS_PER_ACTION, _corral_rate, _spec
from bench.harness import Context, Metrics, NotRun, Stats, workload

AGENT_COUNTS = (1, 8, 64)


@contextlib.contextmanager
def _postgres(ctx: Context) -> Iterator[Any]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise NotRun("psycopg is not installed (pip install 'corral[postgres]')") from None
    from corral.core.pg_local import LocalPostgres, LocalPostgresError

    server = LocalPostgres(ctx.tmp / "pg", durable=True)
    try:
        server.start()
    except LocalPostgresError as exc:
        raise NotRun(str(exc)) from None
    try:
        yield server
    finally:
        server.stop()


def _node(ctx: Context, name: str, spec_text: str, url: str | None) -> contextlib.AbstractContextManager[Path]:
    return supervisor(ctx, spec_text, ("--ledger", url, "--node", name) if url else ())


def _postgres_limit(url: str) -> float:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id TEXT PRIMARY KEY, phase TEXT); CREATE TABLE e (k BIGSERIAL, b BYTEA)")
        conn.execute("INSERT INTO a VALUES ('x', 'prepared')")
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < 1.0:
            with conn.transaction():
                conn.execute("UPDATE a SET phase = %s WHERE id = 'x'", (str(done),))
                conn.execute("INSERT INTO e (b) VALUES (%s)", (b"x" * 200,))
            done += 1
        return done / (time.perf_counter() - start)


def _two_node_rate(homes: list[Path], agents_per_node: int, loops: int) -> float:
    """Both nodes driven at once; actions/s over the slower node's wall time."""
    results: dict[int, float] = {}
    errors: list[BaseException] = []

    def drive(index: int, home: Path) -> None:
        try:
            started = time.perf_counter()
            _corral_rate(home, agents_per_node, loops)
            results[index] = time.perf_counter() - started
        except BaseException as exc:  # re-raised below, in the bench thread
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(i, home)) for i, home in enumerate(homes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return len(homes) * agents_per_node * loops * PER_PLAN / max(results.values())


def _record(ctx: Context, key: str, rates: list[float]) -> None:
    ctx.metrics[f"actions_per_s_{key}"] = Stats.of(rates, "per s")
    ctx.metrics[f"transitions_per_s_{key}"] = Stats.of([r * TRANSITIONS_PER_ACTION for r in rates], "per s")


def _measured(ctx: Context, key: str, home: Path, agents: int, loops: int, rounds: int) -> None:
    """The rates, and what each action cost the ledger (from the node's counters)."""
    before = _call(home, "status")["ledger"]
    _record(ctx, key, [_corral_rate(home, agents, loops) for _ in range(rounds)])
    after = _call(home, "status")["ledger"]
    actions = agents * loops * PER_PLAN * rounds
    ctx.metrics[f"commits_per_action_{key}"] = Stats.single((after["commits"] - before["commits"]) / actions, "tx")
    if "round_trips" in after:
        trips = (after["round_trips"] - before["round_trips"]) / actions
        ctx.metrics[f"round_trips_per_action_{key}"] = Stats.single(trips, "statements")
        hits = after["cache_hits"] - before["cache_hits"]
        looked = hits + after["cache_misses"] - before["cache_misses"]
        ctx.metrics[f"read_cache_hit_pct_{key}"] = Stats.single(100.0 * hits / max(1, looked), "%")


@workload("durable_actions_postgres", group="corral", budget_s=900, quick_budget_s=240)
def durable_actions_postgres(ctx: Context) -> Metrics:
    """Durable read actions/s at 1, 8 and 64 agents: SQLite, PostgreSQL with one
    node, PostgreSQL with two nodes, and the bare-PostgreSQL limit, same run.
    Return {"actions_per_s_{sqlite,pg1,pg2}_{n}", "transitions_per_s_...",
    "postgres_limit_per_s"}."""
    rounds = ctx.reps(1, 3)
    loops = ctx.reps(8, 20)
    counts = AGENT_COUNTS if not ctx.quick else (1, 8)
    with _postgres(ctx) as server:
        ctx.metrics["postgres_limit_per_s"] = Stats.single(_postgres_limit(server.create_database("limit")), "per s")
        for agents in counts:
            spec = _spec(agents, loops)
            ctx.check(f"sqlite n={agents}")
            with _node(ctx, f"sqlite-{agents}", spec, None) as home:
                _wait_all_ready(home, agents, 120)
                _measured(ctx, f"sqlite_{agents}", home, agents, loops, rounds)
            ctx.check(f"postgres 1 node n={agents}")
            url = server.create_database(f"one_{agents}")
            with _node(ctx, f"pg1-{agents}", spec, url) as home:
                _wait_all_ready(home, agents, 120)
                _measured(ctx, f"pg1_{agents}", home, agents, loops, rounds)
            if agents < 2:
                continue
            ctx.check(f"postgres 2 nodes n={agents}")
            url = server.create_database(f"two_{agents}")
            half = _spec(agents // 2, loops)
            with _node(ctx, f"pg2a-{agents}", half, url) as home_a, _node(ctx, f"pg2b-{agents}", half, url) as home_b:
                for home in (home_a, home_b):
                    _wait_all_ready(home, agents // 2, 120)
                _record(ctx, f"pg2_{agents}",
                        [_two_node_rate([home_a, home_b], agents // 2, loops) for _ in range(rounds)])
    ctx.note(f"{PER_PLAN} fs.list actions per plan, scripted provider, {loops} loops per agent")
    ctx.note("PostgreSQL 15 on this host, fsync on, synchronous_commit on; two nodes share its two cores")
    return ctx.metrics

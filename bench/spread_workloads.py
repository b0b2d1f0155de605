"""``work_spread_postgres``: runs submitted to one node of three spread over all three.

Issue 51's work-spread target: 90 root runs (one counted effect each) submitted
to node a of three nodes sharing one PostgreSQL; every node should run at least
15 % of them, all complete, each effect exactly once. The nodes take queued runs
through the shared queue (supervisor/cluster/run_queue.py: ``[ledger]
max_runs_per_agent`` bounds what a node holds, the rest wait for any node with
room).

Same run, same workload: the 90 runs on one node alone (the baseline), then on
three. All nodes and the server share this host's two cores, so the wall-time
ratio shows the spread's overhead and contention, not more hosts' capacity.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.corral_workloads import _call
from bench.harness import Context, Metrics, NotRun, Stats, workload
from bench.scaleout_workloads import _node, _postgres

RUNS = 90
#: The issue's target: every node runs at least this share.
TARGET_SHARE = 0.15


def _spec(effects: Path) -> str:
    return f"""
[project]
root = "ws"
[chaos]
effects_file = "{effects}"
[ledger]
lease_s = 5.0
max_runs_per_agent = 2
queue_poll_s = 0.1
[[agents]]
id = "writer"
[[agents.steps]]
actions = [{{ tool = "effect.record", input = {{ label = "e1" }} }}]
[[agents.steps]]
final = "done"
"""


def _placed(url: str, run_ids: set[str]) -> dict[str, tuple[str, str]]:
    """Each of ``run_ids`` the cluster holds: its partition and status."""
    import psycopg

    found: dict[str, tuple[str, str]] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, schema in conn.execute("SELECT name, schema_name FROM corral_cluster.partitions").fetchall():
            for run_id, status in conn.execute(f"SELECT run_id, status FROM {schema}.runs").fetchall():
                if run_id in run_ids:
                    found[str(run_id)] = (str(name), str(status))
    return found


def _spread(ctx: Context, url: str, nodes: int, effects: Path, count: int) -> tuple[float, Counter[str], int]:
    """``count`` runs submitted to the first of ``nodes`` nodes: the wall time to
    all completed, the runs per partition, and how many effects were not exactly once."""
    spec = _spec(effects)
    with contextlib.ExitStack() as stack:
        homes = [stack.enter_context(_node(ctx, f"node-{chr(97 + i)}", spec, url)) for i in range(nodes)]
        run_ids = {f"run-spread{nodes}-{i:04d}" for i in range(count)}
        started = time.perf_counter()
        for run_id in sorted(run_ids):
            _call(homes[0], "run", agent_id="writer", task="record one effect", run_id=run_id)
        while True:
            placed = _placed(url, run_ids)
            if len(placed) == count and all(status == "completed" for _, status in placed.values()):
                break
            if time.monotonic() > ctx.deadline:
                raise NotRun(f"{count - sum(s == 'completed' for _, s in placed.values())} runs unfinished")
            time.sleep(0.1)
        wall = time.perf_counter() - started
    from corral.actors.tools.effect import read_effects

    per_run = Counter(line["run_id"] for line in read_effects(effects) if line["run_id"] in run_ids)
    wrong = sum(1 for run_id in run_ids if per_run[run_id] != 1)
    return wall, Counter(partition for partition, _ in placed.values()), wrong


@workload("work_spread_postgres", group="corral", budget_s=600, quick_budget_s=300)
def work_spread_postgres(ctx: Context) -> Metrics:
    """90 runs submitted to one node of three: the share each node ran, all
    completed with effects exactly once; the same runs on one node as the baseline.
    Return {"share_pct_node_{a,b,c}", "min_share_pct", "effects_not_once",
    "runs_per_s_{one,three}_nodes", "three_over_one_nodes"}."""
    count = ctx.reps(30, RUNS)
    with _postgres(ctx) as server:
        ctx.check("one node")
        one_wall, _, one_wrong = _spread(ctx, server.create_database("spread_one"), 1, ctx.tmp / "one.log", count)
        ctx.check("three nodes")
        wall, share, wrong = _spread(ctx, server.create_database("spread_three"), 3, ctx.tmp / "three.log", count)
    metrics: dict[str, Any] = ctx.metrics
    for node in ("node-a", "node-b", "node-c"):
        metrics[f"share_pct_{node.replace('-', '_')}"] = Stats.single(100.0 * share[node] / count, "%")
    low = min(share[node] for node in ("node-a", "node-b", "node-c")) / count
    metrics["min_share_pct"] = Stats.single(100.0 * low, f"% (target >= {TARGET_SHARE:.0%})")
    metrics["effects_not_once"] = Stats.single(float(wrong + one_wrong), "runs")
    metrics["runs_per_s_one_node"] = Stats.single(count / one_wall, "per s")
    metrics["runs_per_s_three_nodes"] = Stats.single(count / wall, "per s")
    metrics["three_over_one_nodes"] = Stats.single(one_wall / wall, "x one node (same run)")
    ctx.note(f"{count} runs of one effect each, all submitted to node a; max_runs_per_agent = 2 per node")
    ctx.note("PostgreSQL 15 on this host, fsync on; the nodes and the server share its two cores")
    return ctx.metrics

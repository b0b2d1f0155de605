"""``durable_counts``: what one durable read action costs the supervisor, counted.

One agent, every plan three ``fs.list`` actions (as ``durable_actions``), run once
with a short script (100 loops) and once with a long one (200 loops) on the same
warm supervisor. Per action = (long - short) / (the long run's extra actions), so a
run's own start and end cancel out:

* ``sql_statements_per_action``: SQL statements the ledger's connection ran
  (SQLite's trace; BEGIN and COMMIT included, a trigger's statements not counted
  apart), with ``commits_per_action`` and ``reads_per_action`` among them;
* ``python_calls_per_action``: Python function and builtin calls in the
  supervisor's main thread (a profile hook on that thread);
* ``cpu_ms_per_action``: CPU, supervisor plus every process under it (the agent,
  the fork server), from /proc, over runs with the counters off;
  ``supervisor_cpu_ms_per_action`` its supervisor share.

The counts come from the supervisor's ``bench.count`` probe
(supervisor/probe_counts.py); a note lists the statements left per action, by
shape, most frequent first.

    python -m bench --only durable_counts
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from bench.corral_workloads import _call, _wait_all_ready, supervisor
from bench.durable_workloads import PER_PLAN, _tree_cpu_s
from bench.harness import Context, Metrics, Stats, workload

SHORT, LONG = 100, 200
QUICK_SHORT, QUICK_LONG = 30, 60
#: Statement shapes listed in the note, most frequent first.
SHOWN_SHAPES = 24
#: Functions listed in the note, most called first.
SHOWN_FUNCTIONS = 120


#: Token limits so high that compaction's check ends at its one aggregate read: the
#: durable path alone (``*_default_context`` measures the seed's default limits).
FAR_LIMITS = "context_window = 10000000\nauto_compact_token_limit = 9000000\n"


def _spec(short: int, long: int) -> str:
    plan = (
        "  [[agents.steps]]\n  actions = ["
        + ", ".join('{ tool = "fs.list", input = { path = "." } }' for _ in range(PER_PLAN))
        + "]\n"
    )
    agents = "".join(
        f'\n[[agents]]\nid = "{name}{suffix}"\n{limits}' + plan * loops + '  [[agents.steps]]\n  final = "ok"\n'
        for name, loops in (("short", short), ("long", long))
        for suffix, limits in (("", FAR_LIMITS), ("-default-context", ""))
    )
    return (
        '[project]\nroot = "ws"\n[supervisor]\nsynchronous = "full"\nprobes = true\n'
        f"[telemetry]\nenabled = false\n{agents}"
    )


def _run(home: Path, agent: str) -> None:
    """One run of ``agent`` to its end (its plans, then its final answer)."""
    run_id = _call(home, "run", agent_id=agent, task="durable")["run_id"]
    while True:
        reply = _call(home, "wait", timeout=130, run_ids=[run_id], until="settled", wait_ms=120_000)
        if reply["reached"]:
            break
    status = reply["runs"][run_id]
    if status != "completed":
        raise RuntimeError(f"the {agent} run ended {status}")


def _counted(home: Path, agent: str) -> dict[str, Any]:
    _call(home, "bench.count", on=True)
    try:
        _run(home, agent)
    finally:
        counts: dict[str, Any] = _call(home, "bench.count", on=False)
    return counts


def _cpu_s(home: Path, agent: str) -> tuple[float, float]:
    before = _tree_cpu_s(home)
    _run(home, agent)
    after = _tree_cpu_s(home)
    return after[0] - before[0], after[1] - before[1]


def _kind(shape: str) -> str:
    word = shape.split(" ", 1)[0].upper()
    if word in ("SELECT", "WITH"):
        return "read"
    if word in ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE"):
        return "transaction"
    if word == "PRAGMA":
        return "pragma"
    return "write"


@workload("durable_counts", group="corral", budget_s=300, quick_budget_s=120)
def durable_counts(ctx: Context) -> Metrics:
    """SQL statements, supervisor Python calls and CPU per durable read action at
    1 agent, as the difference of a long and a short run. Return
    {"sql_statements_per_action", "reads_per_action", "writes_per_action",
    "commits_per_action", "python_calls_per_action", "cpu_ms_per_action",
    "supervisor_cpu_ms_per_action", "python_calls_per_action_default_context"}.
    The agents' token limits are far (``FAR_LIMITS``) but for the last figure, at
    the seed's defaults (compaction's count then grows with the run's history)."""
    short, long = (QUICK_SHORT, QUICK_LONG) if ctx.quick else (SHORT, LONG)
    extra_actions = (long - short) * PER_PLAN
    pairs = ctx.reps(2, 3)
    with supervisor(ctx, _spec(short, long)) as home:
        _wait_all_ready(home, 4, 120)
        for agent in ("short", "long"):
            _run(home, agent)  # warm: the first run of each pays for imports and caches
        counted = []
        for _ in range(pairs):
            # The main thread's calls move with the scheduling (how often trio wakes
            # for a message or the fsync thread): a median of pairs, the spread noted.
            ctx.check("durable_counts: counting")
            counted.append((_counted(home, "short"), _counted(home, "long")))
        ctx.check("durable_counts: default context limits")
        default_context = (_counted(home, "short-default-context"), _counted(home, "long-default-context"))
        cpu: list[tuple[float, float]] = []
        for _ in range(pairs):
            ctx.check("durable_counts: CPU")
            s_sup, s_rest = _cpu_s(home, "short")
            l_sup, l_rest = _cpu_s(home, "long")
            cpu.append(((l_sup - s_sup) * 1e3 / extra_actions, (l_rest - s_rest) * 1e3 / extra_actions))
    per_pair = sorted((many["calls"] - few["calls"]) / extra_actions for few, many in counted)
    ctx.metrics["python_calls_per_action"] = Stats.of(per_pair, "calls")
    few_d, many_d = default_context
    ctx.metrics["python_calls_per_action_default_context"] = Stats.single(
        (many_d["calls"] - few_d["calls"]) / extra_actions, "calls"
    )
    # The median pair names the calls by function; its statements are every pair's.
    counted.sort(key=lambda pair: pair[1]["calls"] - pair[0]["calls"])
    few, many = counted[len(counted) // 2]
    ctx.metrics["cpu_ms_per_action"] = Stats.of([s + a for s, a in cpu], "ms")
    ctx.metrics["supervisor_cpu_ms_per_action"] = Stats.of([s for s, _ in cpu], "ms")
    if many["statements"] is None:
        ctx.skip("sql_statements_per_action", "the ledger traces no statements (not SQLite)")
        return ctx.metrics
    per_shape = Counter(many["shapes"])
    per_shape.subtract(Counter(few["shapes"]))
    by_kind: Counter[str] = Counter()
    for shape, count in per_shape.items():
        by_kind[_kind(shape)] += count
    ctx.metrics["sql_statements_per_action"] = Stats.single(
        (many["statements"] - few["statements"]) / extra_actions, "statements"
    )
    ctx.metrics["reads_per_action"] = Stats.single(by_kind["read"] / extra_actions, "statements")
    ctx.metrics["writes_per_action"] = Stats.single(by_kind["write"] / extra_actions, "statements")
    commits = sum(count for shape, count in per_shape.items() if shape.upper().startswith("COMMIT"))
    ctx.metrics["commits_per_action"] = Stats.single(commits / extra_actions, "statements")
    left = [
        f"{count / extra_actions:.2f} {shape[:110]}"
        for shape, count in sorted(per_shape.items(), key=lambda item: -item[1])[:SHOWN_SHAPES]
        if count
    ]
    ctx.note(
        f"per action = ({long} loops - {short} loops) / {extra_actions} actions, {PER_PLAN} fs.list per plan,"
        " 1 agent, token limits far (compaction's check: one aggregate read);"
        f" Python calls per pair: {', '.join(f'{calls:.0f}' for calls in per_pair)};"
        f" CPU: median of {pairs} alternated pairs, counters off"
        f" (per pair: {', '.join(f'{s + a:.2f}' for s, a in cpu)} ms)"
    )
    ctx.note("statements per action, by shape: " + " | ".join(left))
    functions = Counter(many["functions"])
    functions.subtract(Counter(few["functions"]))
    ctx.note(
        "Python calls per action, by function: "
        + " | ".join(
            f"{count / extra_actions:.1f} {name}" for name, count in functions.most_common(SHOWN_FUNCTIONS) if count
        )
    )
    return ctx.metrics

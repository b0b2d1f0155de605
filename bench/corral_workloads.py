"""corral's side of every figure. PLUG POINT: fill these in as corral's API lands.

Each function below is a workload whose name is the figure's name (see
``bench.figures``); it returns the metrics that figure reads, under exactly the keys
listed in its docstring. How to write one:

    @workload("rtt_actor_supervisor", group="corral", budget_s=120, quick_budget_s=20)
    def rtt_actor_supervisor(ctx: Context) -> Metrics:
        require_corral()
        ...start a supervisor with its home under ctx.tmp (short, for ipc:// paths)...
        samples = [...]  # µs per round trip; or Stats from bench.harness.time_calls
        return {"rtt_64B": Stats.of(samples, "µs"), "rtt_4KiB": Stats.of(..., "µs")}

Rules (the same as for the baselines):
- Return ``Metrics`` (dict[str, Stats | float | int | bool]). A Stats is compared by
  its median; a plain number is one sample. Units are converted within time units
  (ns/µs/ms/s) and size units (B/KiB/MiB), so Stats.of(samples, "ms") for a figure
  in µs is fine. Repeat enough for a median and p99: use ``ctx.reps(quick, full)``.
- Stay within ``ctx.deadline`` (``ctx.remaining()`` s left); the runner interrupts a
  workload past it with WorkloadTimeout and reports "timed out". Record into
  ``ctx.metrics`` as you go (and return it) to keep what was measured if that
  happens. Under --quick the whole corral group should take ~40 s or less, so that
  ``python -m bench --quick`` stays under 2 minutes on 2 cores.
- Stop everything you start (``corral down``, then wait) in a ``finally``; the
  runner then kills and reports whatever is left (it is a subreaper, so detached
  daemons are seen too).
- Raise ``NotRun(reason)`` when it cannot run; ``ctx.skip(metric, reason)`` for one
  metric (e.g. under --quick); ``ctx.note(text)`` for a note in the table.
- Use the same payloads as the baselines: 64 B and 4 KiB (os.urandom).
"""

from __future__ import annotations

import importlib

from bench.harness import Context, Metrics, NotRun, workload

# ---- CORRAL_AVAILABLE: is corral's supervisor API importable yet? -------------------
try:
    importlib.import_module("corral.supervisor.api")
except ImportError:
    CORRAL_AVAILABLE = False
    CORRAL_MISSING = "corral API not built yet"
except Exception as exc:  # a syntax error in the API must not kill the benchmark
    CORRAL_AVAILABLE = False
    CORRAL_MISSING = f"corral API failed to import: {type(exc).__name__}: {exc}"
else:
    CORRAL_AVAILABLE = True
    CORRAL_MISSING = ""
# --------------------------------------------------------------------------------------

NOT_WRITTEN = "corral workload not written yet (bench/corral_workloads.py)"


def require_corral() -> None:
    """Raise NotRun while corral's API is missing."""
    if not CORRAL_AVAILABLE:
        raise NotRun(CORRAL_MISSING)


def _todo() -> Metrics:
    require_corral()
    raise NotRun(NOT_WRITTEN)


@workload("rtt_actor_supervisor", group="corral", budget_s=120, quick_budget_s=20)
def rtt_actor_supervisor(ctx: Context) -> Metrics:
    """Request RTT actor<->supervisor. Return {"rtt_64B": Stats(µs), "rtt_4KiB": Stats(µs)}."""
    return _todo()


@workload("rtt_actor_actor", group="corral", budget_s=120, quick_budget_s=20)
def rtt_actor_actor(ctx: Context) -> Metrics:
    """Request RTT actor<->actor through corral's routing.
    Return {"rtt_64B": Stats(µs), "rtt_4KiB": Stats(µs)}."""
    return _todo()


@workload("oneway_throughput", group="corral", budget_s=90, quick_budget_s=15)
def oneway_throughput(ctx: Context) -> Metrics:
    """One-way tells, 64 B, no batching. Return {"msgs_per_s": Stats(msgs/s)}."""
    return _todo()


@workload("oneway_throughput_batched", group="corral", budget_s=90, quick_budget_s=15)
def oneway_throughput_batched(ctx: Context) -> Metrics:
    """One-way tells, 64 B, with corral's batching. Return {"msgs_per_s": Stats(msgs/s)}."""
    return _todo()


@workload("spawn_50", group="corral", budget_s=120, quick_budget_s=20)
def spawn_50(ctx: Context) -> Metrics:
    """Start 50 echo actors until each answered ready. Return {"ready_s": Stats(s)}."""
    return _todo()


@workload("spawn_200", group="corral", budget_s=180, quick_budget_s=30)
def spawn_200(ctx: Context) -> Metrics:
    """Start 200 echo actors until each answered ready. Return {"ready_s": Stats(s)}."""
    return _todo()


@workload("spawn_1000", group="corral", budget_s=300, quick_budget_s=5)
def spawn_1000(ctx: Context) -> Metrics:
    """Start 1,000 echo actors until each answered ready (skip under --quick with
    ctx.skip("ready_s", "skipped in --quick")). Return {"ready_s": Stats(s)}."""
    return _todo()


@workload("restart_latency", group="corral", budget_s=120, quick_budget_s=20)
def restart_latency(ctx: Context) -> Metrics:
    """SIGKILL an echo actor, time until its replacement answers (several kills).
    Return {"restart_ms": Stats(ms)}."""
    return _todo()


@workload("idle_uss_200", group="corral", budget_s=180, quick_budget_s=30)
def idle_uss_200(ctx: Context) -> Metrics:
    """USS of 200 idle echo actor processes (psutil memory_full_info) / 200.
    Return {"uss_mib": float(MiB)}."""
    return _todo()


@workload("fanout_join_1x3", group="corral", budget_s=90, quick_budget_s=15)
def fanout_join_1x3(ctx: Context) -> Metrics:
    """One parent spawns 3 isolated children and joins their results.
    Return {"join_ms": Stats(ms)}."""
    return _todo()


@workload("fanout_join_10x3", group="corral", budget_s=120, quick_budget_s=20)
def fanout_join_10x3(ctx: Context) -> Metrics:
    """10 parents each spawn 3 isolated children, all joined.
    Return {"join_ms": Stats(ms)}."""
    return _todo()


@workload("durable_transitions_1", group="corral", budget_s=90, quick_budget_s=15)
def durable_transitions_1(ctx: Context) -> Metrics:
    """Ledger transitions committed per second by the supervisor for 1 actor.
    Return {"per_s": Stats(per s)}."""
    return _todo()


@workload("durable_transitions_8", group="corral", budget_s=90, quick_budget_s=15)
def durable_transitions_8(ctx: Context) -> Metrics:
    """Ledger transitions per second with 8 actors asking at once.
    Return {"per_s": Stats(per s)}."""
    return _todo()


@workload("failpoint_check_cost", group="corral", budget_s=30, quick_budget_s=5)
def failpoint_check_cost(ctx: Context) -> Metrics:
    """ns per ``corral.failpoints.hit(name)`` with CORRAL_FAILPOINTS unset.
    Return {"ns_per_check": Stats(ns)}."""
    return _todo()


@workload("scaling_curve", group="corral", budget_s=600, quick_budget_s=40)
def scaling_curve(ctx: Context) -> Metrics:
    """Grow to N = 10, 50, 200, 1000 live echo actors (1000 skipped under --quick).
    Return {"max_live": int, and for each N reached: "ready_s_{N}": Stats(s),
    "uss_mib_{N}": float(MiB), "rtt_us_{N}": Stats(µs) (actor<->supervisor, 64 B)}."""
    return _todo()

"""Measurement helpers and the workload registry (the figure and curve records are
in bench/figure_records.py).

A *workload* measures something and returns named metrics::

    from bench.harness import Context, Metrics, Stats, workload

    @workload("pynng_reqrep", group="limits", budget_s=60, quick_budget_s=20)
    def pynng_reqrep(ctx: Context) -> Metrics:
        samples = [...]                       # one float per round trip, in µs
        return {"rtt_64B": Stats.of(samples, "µs")}

A workload may record metrics as it goes in ``ctx.metrics`` (kept if it then times
out or fails), raise ``NotRun(reason)`` (the peer is missing, the API is not built
yet, ...), skip single metrics with ``ctx.skip(metric, reason)``, and add notes with
``ctx.note(text)``. It must stop by ``ctx.deadline`` (``ctx.remaining()`` seconds) and
reap every process it starts; the runner checks with psutil afterwards and kills and
reports whatever is left.

A *figure* (see ``bench.figures``) is one row of the results: corral's value and each
baseline's value, all looked up by ``Ref("workload.metric:stat")`` among the metrics of
the same run, with the ratio to a chosen reference baseline and a target.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

GROUPS: tuple[str, ...] = ("limits", "corral", "peers")
"""Workload groups, in the order they run (the heavy peers last)."""

# --------------------------------------------------------------------------------------
# statistics


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of ``samples`` (need not be sorted).

    With fewer than 100 samples p99 is the maximum: the table shows ``n`` so that a
    p99 over 5 repetitions is read for what it is.
    """
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class Stats:
    """A summary of repeated measurements of one quantity, in ``unit``."""

    unit: str
    n: int
    median: float
    p99: float
    min: float
    max: float
    mean: float

    @classmethod
    def of(cls, samples: Iterable[float], unit: str) -> Stats:
        values = [float(s) for s in samples]
        if not values:
            raise ValueError("Stats.of() needs at least one sample")
        return cls(
            unit=unit,
            n=len(values),
            median=statistics.median(values),
            p99=percentile(values, 99),
            min=min(values),
            max=max(values),
            mean=statistics.fmean(values),
        )

    @classmethod
    def single(cls, value: float, unit: str) -> Stats:
        return cls.of([value], unit)

    def get(self, stat: str) -> float:
        if stat in ("median", "p50"):
            return self.median
        if stat in ("p99", "min", "max", "mean"):
            return float(getattr(self, stat))
        raise KeyError(f"unknown statistic {stat!r} (median|p50|p99|min|max|mean)")

    def scaled(self, factor: float, unit: str) -> Stats:
        return Stats(
            unit=unit,
            n=self.n,
            median=self.median * factor,
            p99=self.p99 * factor,
            min=self.min * factor,
            max=self.max * factor,
            mean=self.mean * factor,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "n": self.n,
            "median": self.median,
            "p99": self.p99,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
        }


Value = Stats | float | int | bool
"""What a workload reports for one metric: a Stats, or a plain number (one sample)."""

Metrics = dict[str, Value]
"""What a workload returns: metric name -> value."""

_TIME_UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_SIZE_UNITS = {"B": 1.0, "KiB": 1024.0, "MiB": 1024.0**2, "GiB": 1024.0**3}


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """Convert between time units or between size units; same unit is identity."""
    if from_unit == to_unit:
        return value
    for table in (_TIME_UNITS, _SIZE_UNITS):
        if from_unit in table and to_unit in table:
            return value * table[from_unit] / table[to_unit]
    raise ValueError(f"cannot convert {from_unit!r} to {to_unit!r}")


# --------------------------------------------------------------------------------------
# measuring


class NotRun(Exception):
    """Raised by a workload that cannot run here; the reason goes into the table."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WorkloadTimeout(Exception):
    """Raised when a workload passes its deadline (by ``Context.check`` or the alarm)."""


@dataclass
class Context:
    """What a workload gets: the mode, a private short temp dir, and its deadline."""

    name: str
    quick: bool
    tmp: Path
    deadline: float
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=dict)
    """Metrics recorded so far. A workload that records here as it goes (and returns
    this dict) keeps what it measured if it later times out or fails."""

    def reps(self, quick: int, full: int) -> int:
        """The repetition count for this mode."""
        return quick if self.quick else full

    def remaining(self) -> float:
        """Seconds left before the deadline (never negative)."""
        return max(0.0, self.deadline - time.monotonic())

    def check(self, what: str = "") -> None:
        """Raise WorkloadTimeout if the deadline has passed."""
        if time.monotonic() > self.deadline:
            raise WorkloadTimeout(f"deadline passed{': ' + what if what else ''}")

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def skip(self, metric: str, reason: str) -> None:
        """Report one metric as not run (it shows as 'not run: reason')."""
        self.skipped[metric] = reason


def time_calls(
    fn: Callable[[], object],
    n: int,
    *,
    warmup: int = 0,
    unit: str = "µs",
    deadline: float | None = None,
    min_samples: int = 1,
) -> Stats:
    """Time ``n`` calls of ``fn`` one by one (perf_counter_ns), after ``warmup`` calls.

    Stops early (with at least ``min_samples``) when the monotonic ``deadline`` passes.
    """
    for _ in range(warmup):
        fn()
    factor = 1e-9 / _TIME_UNITS[unit]
    samples: list[float] = []
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        fn()
        samples.append((clock() - t0) * factor)
        if deadline is not None and i + 1 >= min_samples and (i & 63) == 0 and (
            time.monotonic() > deadline
        ):
            break
    return Stats.of(samples, unit)


def repeat(
    fn: Callable[[], float],
    repeats: int,
    *,
    unit: str,
    warmup: int = 0,
    deadline: float | None = None,
) -> Stats:
    """Call ``fn`` (which returns one sample, in ``unit``) ``repeats`` times.

    Stops early, keeping at least one sample, when the monotonic ``deadline`` passes.
    """
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    for _ in range(repeats):
        samples.append(float(fn()))
        if deadline is not None and time.monotonic() > deadline:
            break
    return Stats.of(samples, unit)


def measure_echo_peer(
    ctx: Context,
    peer: str,
    *,
    ping: Callable[[bytes], object],
    tell: Callable[[object], object],
    count: Callable[[float], int],
    rtt_reps: int,
    rtt_warmup: int,
    rtt_share: float,
    tells: int,
    tell_reps: int,
    tell_share: float,
    tell_warmup: int = 0,
) -> None:
    """The same two figures for every in-process peer framework: request/reply RTT
    (64 B and 4 KiB) and one-way tells confirmed by the echo's own count.

    ``count(timeout)`` asks the echo how many tells it has seen; ``*_share`` is the
    fraction (1/share) of the remaining budget each figure may use."""
    out = ctx.metrics
    for label, size in (("64B", 64), ("4KiB", 4096)):
        payload = os.urandom(size)

        def ping_once(p: bytes = payload) -> None:
            ping(p)

        out[f"rtt_{label}"] = time_calls(
            ping_once,
            rtt_reps,
            warmup=rtt_warmup,
            unit="µs",
            deadline=time.monotonic() + ctx.remaining() / rtt_share,
        )
    message = ("tell", os.urandom(64))

    def one_way() -> float:
        start = count(10.0)
        t0 = time.perf_counter()
        for _ in range(tells):
            tell(message)
        got = count(60.0)
        if got - start != tells:
            raise RuntimeError(f"{peer} lost messages: {got - start} of {tells} arrived")
        return tells / (time.perf_counter() - t0)

    out["oneway_msgs_per_s"] = repeat(
        one_way, tell_reps, unit="msgs/s", warmup=tell_warmup, deadline=time.monotonic() + ctx.remaining() / tell_share
    )


# --------------------------------------------------------------------------------------
# the workload registry

WorkloadFn = Callable[[Context], Metrics]


@dataclass(frozen=True)
class Workload:
    name: str
    group: str
    fn: WorkloadFn
    budget_s: float
    quick_budget_s: float
    doc: str
    order: int = 50

    def budget(self, quick: bool) -> float:
        return self.quick_budget_s if quick else self.budget_s


WORKLOADS: dict[str, Workload] = {}


def workload(
    name: str,
    group: str,
    *,
    budget_s: float = 120.0,
    quick_budget_s: float | None = None,
    order: int = 50,
) -> Callable[[WorkloadFn], WorkloadFn]:
    """Register ``fn(ctx: Context) -> Metrics`` as workload ``name`` in ``group``.

    ``budget_s`` (and ``quick_budget_s`` under --quick) bound its wall time: the
    workload should watch ``ctx.deadline``; past it (plus a grace) the runner raises
    WorkloadTimeout in it and reports it as timed out. Groups run in GROUPS order,
    and within a group by ``order`` then name.
    """
    if group not in GROUPS:
        raise ValueError(f"group must be one of {GROUPS}, not {group!r}")

    def register(fn: WorkloadFn) -> WorkloadFn:
        if name in WORKLOADS and WORKLOADS[name].fn is not fn:
            raise ValueError(f"workload {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        WORKLOADS[name] = Workload(
            name=name,
            group=group,
            fn=fn,
            budget_s=budget_s,
            quick_budget_s=quick_budget_s if quick_budget_s is not None else budget_s,
            doc=doc[0] if doc else "",
            order=order,
        )
        return fn

    return register


# --------------------------------------------------------------------------------------
# results of one run

Status = Literal["ok", "not run", "failed", "timed out", "not selected"]


@dataclass
class WorkloadResult:
    name: str
    group: str
    status: Status
    reason: str | None = None
    metrics: Metrics = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    leftovers: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "group": self.group,
            "status": self.status,
            "reason": self.reason,
            "elapsed_s": round(self.elapsed_s, 3),
            "metrics": {k: value_to_json(v) for k, v in self.metrics.items()},
            "skipped": {k: f"not run: {v}" for k, v in self.skipped.items()},
            "notes": self.notes,
            "leftovers": self.leftovers,
        }


def value_to_json(value: Value) -> Any:
    return value.to_json() if isinstance(value, Stats) else value

"""Runs the selected workloads one by one, each bounded in time and cleaned up after."""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import importlib.metadata
import os
import pkgutil
import platform
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from bench.figure_records import CURVES, FIGURES, Curve, Figure, build_curve, build_figure
from bench.harness import GROUPS, WORKLOADS, Context, NotRun, Stats, Workload, WorkloadResult, WorkloadTimeout
from bench.procs import become_subreaper, descendants, kill_leftovers

ALARM_GRACE_S = 15.0
"""How long past its budget a workload may run before SIGALRM interrupts it."""
HARD_GRACE_S = 90.0
"""Past budget + this, faulthandler dumps stacks and exits: nothing may hang forever."""

VERSIONED = (
    "corral", "trio", "pynng", "msgpack", "psutil",
    "ray", "pykka", "thespian", "matplotlib", "numpy",
)


def load_workloads() -> None:
    """Import every baseline module, corral's workloads and the figure specs."""
    from bench import baselines

    for info in sorted(pkgutil.iter_modules(baselines.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"bench.baselines.{info.name}")
    importlib.import_module("bench.corral_workloads")
    importlib.import_module("bench.model_workloads")
    importlib.import_module("bench.model_task_workloads")
    importlib.import_module("bench.durable_workloads")
    importlib.import_module("bench.durable_counts")
    importlib.import_module("bench.ui_workloads")
    importlib.import_module("bench.bridge_workloads")
    importlib.import_module("bench.scaleout_workloads")
    importlib.import_module("bench.spread_workloads")
    importlib.import_module("bench.pg_latency_workloads")
    importlib.import_module("bench.transport_workloads")
    importlib.import_module("bench.figures")


def ordered(names: Iterable[str]) -> list[Workload]:
    chosen = [WORKLOADS[n] for n in set(names)]
    return sorted(chosen, key=lambda w: (GROUPS.index(w.group), w.order, w.name))


def select(only: list[str] | None) -> list[str]:
    """Workload names for ``--only``: workload, figure, curve or group names."""
    if not only:
        return list(WORKLOADS)
    picked: set[str] = set()
    for name in only:
        if name in GROUPS:
            picked |= {w.name for w in WORKLOADS.values() if w.group == name}
        elif name in WORKLOADS:
            picked.add(name)
        elif name in FIGURES or name in CURVES:
            spec_refs = FIGURES[name].refs() if name in FIGURES else CURVES[name].refs()
            picked |= {r.workload for r in spec_refs if r.workload in WORKLOADS}
        else:
            raise KeyError(name)
    return sorted(picked)


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def _filesystem(path: Path) -> str:
    best = ""
    fstype = "unknown"
    for part in psutil.disk_partitions(all=True):
        if str(path).startswith(part.mountpoint) and len(part.mountpoint) > len(best):
            best, fstype = part.mountpoint, part.fstype
    return f"{fstype} ({best})" if best else fstype


def machine_info(tmp: Path) -> dict[str, Any]:
    mem = psutil.virtual_memory()
    return {
        "cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(mem.total / 2**30, 1),
        "memory_available_gib": round(mem.available / 2**30, 1),
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "tmp_filesystem": _filesystem(tmp),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "cpu_busy_pct_at_start": psutil.cpu_percent(interval=1.0),
        "versions": {name: _package_version(name) for name in VERSIONED},
    }


@dataclass
class Run:
    quick: bool
    machine: dict[str, Any]
    results: dict[str, WorkloadResult] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    elapsed_s: float = 0.0
    subreaper: bool = False
    final_leftovers: list[str] = field(default_factory=list)


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot."""
    t = psutil.cpu_times()
    idle = float(t.idle) + float(getattr(t, "iowait", 0.0))
    guest = float(getattr(t, "guest", 0.0)) + float(getattr(t, "guest_nice", 0.0))  # in user
    return float(sum(t)) - idle - guest


def _own_cpu_s() -> float:
    """CPU seconds used by this process and every descendant it has reaped."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise WorkloadTimeout("interrupted past its time budget")


def run_workload(w: Workload, quick: bool, root: Path) -> WorkloadResult:
    tmp = Path(tempfile.mkdtemp(prefix=f"{w.name[:10]}-", dir=root))
    budget = w.budget(quick)
    ctx = Context(name=w.name, quick=quick, tmp=tmp, deadline=time.monotonic() + budget)
    before = set(descendants())
    result = WorkloadResult(name=w.name, group=w.group, status="ok")
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, budget + ALARM_GRACE_S)
    faulthandler.dump_traceback_later(budget + HARD_GRACE_S, exit=True)
    t0 = time.monotonic()
    try:
        # Anything a workload (or a peer's background thread) prints goes to stderr:
        # stdout carries the report only.
        with contextlib.redirect_stdout(sys.stderr):
            returned = w.fn(ctx)
        ctx.metrics.update(returned)
    except NotRun as exc:
        result.status, result.reason = "not run", exc.reason
    except WorkloadTimeout as exc:
        result.status, result.reason = "timed out", f"timed out after {budget:.0f}s ({exc})"
    except Exception as exc:
        result.status, result.reason = "failed", f"{type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()
        result.elapsed_s = time.monotonic() - t0
        result.leftovers = kill_leftovers(before)
        shutil.rmtree(tmp, ignore_errors=True)
    if result.status != "not run":
        bad = [k for k, v in ctx.metrics.items() if not isinstance(v, Stats | int | float)]
        if bad and result.status == "ok":
            result.status, result.reason = "failed", f"metrics must be Stats or numbers: {bad}"
        result.metrics = {k: v for k, v in ctx.metrics.items() if k not in bad}
    result.skipped = dict(ctx.skipped)
    result.notes = list(ctx.notes)
    if result.status in ("failed", "timed out") and result.metrics:
        result.notes.append(f"kept {len(result.metrics)} metric(s) measured before it stopped")
    if result.leftovers:
        result.notes.append(f"killed {len(result.leftovers)} leftover process(es)")
    return result


def wait_quiet(max_wait_s: float, busy_pct: float = 15.0, progress: Any = sys.stderr) -> float:
    """Wait (at most ``max_wait_s``) until the machine is below ``busy_pct`` CPU busy
    over 3 s; returns the seconds waited. Other work on a shared machine skews
    every figure, and the tables say how much there was."""
    t0 = time.monotonic()
    while True:
        busy = psutil.cpu_percent(interval=3.0)
        waited = time.monotonic() - t0
        if busy < busy_pct or waited >= max_wait_s:
            if waited > 3.5:
                print(f"waited {waited:.0f}s for a quiet machine (now {busy:.0f}% busy)",
                      file=progress, flush=True)
            return waited


def run(
    only: list[str] | None,
    quick: bool,
    progress: Any = sys.stderr,
    quiet_wait_s: float = 0.0,
) -> Run:
    names = select(only)
    waited = wait_quiet(quiet_wait_s, progress=progress) if quiet_wait_s > 0 else 0.0
    root = Path(tempfile.mkdtemp(prefix="cb-", dir="/tmp"))
    state = Run(quick=quick, machine=machine_info(root))
    state.machine["waited_for_quiet_s"] = round(waited, 1)
    state.subreaper = become_subreaper()
    started = time.monotonic()
    busy0, own0 = _busy_cpu_s(), _own_cpu_s()
    try:
        plan = ordered(names)
        for index, w in enumerate(plan, 1):
            print(f"[{index}/{len(plan)}] {w.group}/{w.name} ...", end=" ", file=progress,
                  flush=True)
            res = run_workload(w, quick, root)
            state.results[w.name] = res
            extra = f" ({res.reason})" if res.reason else ""
            print(f"{res.status} in {res.elapsed_s:.1f}s{extra}", file=progress, flush=True)
    finally:
        state.final_leftovers = kill_leftovers(set(), grace_s=1.0)
        shutil.rmtree(root, ignore_errors=True)
    for name, w in WORKLOADS.items():
        state.results.setdefault(name, WorkloadResult(name, w.group, "not selected"))
    selected = set(names)
    for spec in FIGURES.values():
        if any(r.workload in selected for r in spec.refs()):
            state.figures.append(build_figure(spec, state.results))
    for cspec in CURVES.values():
        if any(r.workload in selected for r in cspec.refs()):
            state.curves.append(build_curve(cspec, state.results))
    state.elapsed_s = time.monotonic() - started
    state.machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    # Noise indicator: CPU the rest of the machine used while we ran.
    other = max(0.0, (_busy_cpu_s() - busy0) - (_own_cpu_s() - own0))
    capacity = state.elapsed_s * (os.cpu_count() or 1)
    state.machine["other_cpu_s_during_run"] = round(other, 1)
    state.machine["other_cpu_pct_during_run"] = round(100 * other / max(capacity, 1e-9), 1)
    return state


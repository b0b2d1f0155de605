"""Bare process start: multiprocessing spawn and forkserver, and fork+exec of python.

Each child reports ready (its index and pid) over one shared pipe and then idles
until the parent closes the stop pipe, so "N ready" means N live processes. The fork
server is warmed up first (its own start is not counted: a runtime keeps one) and
preloads only ``bench._targets``, a standard-library-only module.

multiprocessing polls every live child it knows on each ``Process.start()``
(``_cleanup()``), which makes starting N children O(N^2). The "lean" forkserver
series drops each child from that bookkeeping right after it starts (the workload
joins them itself): that is the fork server's own cost, and the fairer limit at
1,000 processes.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import selectors
import signal
import subprocess
import sys
import time
from multiprocessing import process as mp_process
from multiprocessing.connection import wait as mp_wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

from bench import _targets
from bench.harness import Context, Metrics, Stats, workload
from bench.procs import stop_multiprocessing_helpers, uss_mib

FORKSERVER_NS = (10, 50, 200, 1000)
SPAWN_NS = (50, 200)
EXEC_NS = (50, 200)
READY_TIMEOUT_S = 120.0
EXEC_CHILD = "import sys; sys.stdout.write('r'); sys.stdout.flush(); sys.stdin.read()"


class Group:
    """``n`` processes of ``mpctx``; ``start()`` returns seconds until all are ready."""

    def __init__(self, mpctx: BaseContext, n: int, lean: bool = False) -> None:
        self.mpctx = mpctx
        self.n = n
        self.lean = lean
        self.ready_r, self.ready_w = mpctx.Pipe(duplex=False)
        self.stop_r, self.stop_w = mpctx.Pipe(duplex=False)
        self.procs: list[BaseProcess] = []
        self.pids: list[int] = []

    def start(self, timeout: float = READY_TIMEOUT_S) -> float:
        t0 = time.perf_counter()
        for i in range(self.n):
            proc = self.mpctx.Process(  # type: ignore[attr-defined]
                target=_targets.ready_then_wait,
                args=(i, self.ready_w, self.stop_r),
                daemon=True,
            )
            proc.start()
            if self.lean:
                mp_process._children.discard(proc)  # type: ignore[attr-defined]
            self.procs.append(proc)
        deadline = time.monotonic() + timeout
        while len(self.pids) < self.n:
            if not self.ready_r.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"{len(self.pids)}/{self.n} ready after {timeout}s")
            msg = self.ready_r.recv_bytes()
            self.pids.append(int.from_bytes(msg[4:8], "little"))
        return time.perf_counter() - t0

    def stop(self) -> None:
        self.stop_w.close()
        deadline = time.monotonic() + 10
        for proc in self.procs:
            proc.join(max(0.05, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(3)
        for conn in (self.ready_r, self.ready_w, self.stop_r):
            conn.close()


def _start_group(
    mpctx: BaseContext, n: int, timeout: float, lean: bool = False
) -> tuple[float, float]:
    """(seconds to n ready, USS MiB per process) for one fresh group."""
    group = Group(mpctx, n, lean)
    try:
        elapsed = group.start(timeout)
        return elapsed, uss_mib(group.pids) / n
    finally:
        group.stop()


def _exec_group(n: int, timeout: float) -> float:
    """Seconds until ``n`` fork+exec'd ``python -c`` children have written one byte."""
    procs: list[subprocess.Popen[bytes]] = []
    sel = selectors.DefaultSelector()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            proc = subprocess.Popen(
                [sys.executable, "-c", EXEC_CHILD],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,
            )
            procs.append(proc)
            assert proc.stdout is not None
            sel.register(proc.stdout, selectors.EVENT_READ)
        waiting = n
        deadline = time.monotonic() + timeout
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{n - waiting}/{n} exec'd children ready after {timeout}s")
            for key, _ in sel.select(left):
                if not os.read(key.fd, 1):
                    raise RuntimeError("an exec'd child exited before it was ready")
                sel.unregister(key.fileobj)
                waiting -= 1
        return time.perf_counter() - t0
    finally:
        sel.close()
        for proc in procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(3)
            if proc.stdout is not None:
                proc.stdout.close()


def _restart_samples(mpctx: BaseContext, kills: int, deadline: float) -> list[float]:
    """SIGKILL a ready child, notice through its sentinel, start a new one, wait ready."""
    ready_r, ready_w = mpctx.Pipe(duplex=False)
    stop_r, stop_w = mpctx.Pipe(duplex=False)

    def launch() -> BaseProcess:
        proc: BaseProcess = mpctx.Process(  # type: ignore[attr-defined]
            target=_targets.ready_then_wait, args=(0, ready_w, stop_r), daemon=True
        )
        proc.start()
        if not ready_r.poll(30):
            raise TimeoutError("restarted child never became ready")
        ready_r.recv_bytes()
        return proc

    samples: list[float] = []
    proc = launch()
    try:
        for _ in range(kills):
            assert proc.pid is not None
            t0 = time.perf_counter()
            os.kill(proc.pid, signal.SIGKILL)
            if not mp_wait([proc.sentinel], timeout=10):
                raise TimeoutError("killed child did not exit")
            proc.join()
            proc = launch()
            samples.append((time.perf_counter() - t0) * 1e3)
            if time.monotonic() > deadline:
                break
    finally:
        stop_w.close()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(3)
        for conn in (ready_r, ready_w, stop_r):
            conn.close()
    return samples


def _fanout_ms(mpctx: BaseContext, groups: int, width: int = 3) -> float:
    """Start ``groups`` x ``width`` one-shot children, collect every result, reap all."""
    res_r, res_w = mpctx.Pipe(duplex=False)
    procs: list[BaseProcess] = []
    try:
        t0 = time.perf_counter()
        for i in range(groups * width):
            proc = mpctx.Process(  # type: ignore[attr-defined]
                target=_targets.work_once, args=(i, res_w), daemon=True
            )
            proc.start()
            procs.append(proc)
        for _ in range(groups * width):
            if not res_r.poll(30):
                raise TimeoutError("fan-out child result missing")
            res_r.recv_bytes()
        for proc in procs:
            proc.join(10)
        return (time.perf_counter() - t0) * 1e3
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(3)
        res_r.close()
        res_w.close()


@workload("mp_start", group="limits", budget_s=420, quick_budget_s=45)
def mp_start(ctx: Context) -> Metrics:
    """Bare process start to ready (forkserver 10..1000, spawn, exec), restart, fan-out."""
    out: Metrics = ctx.metrics
    fs = mp.get_context("forkserver")
    fs.set_forkserver_preload(["bench._targets"])
    spawn = mp.get_context("spawn")
    try:
        _start_group(fs, 1, 30)  # warm: start the fork server itself

        live = 0
        for n in FORKSERVER_NS:
            for lean, key in ((False, f"forkserver_{n}"), (True, f"forkserver_lean_{n}")):
                if ctx.quick and n == 1000:
                    ctx.skip(key, "skipped in --quick")
                    continue
                reps = ctx.reps(2 if n < 1000 else 1, 5 if n < 1000 else 3)
                times: list[float] = []
                for _ in range(reps):
                    elapsed, per_proc = _start_group(
                        fs, n, min(READY_TIMEOUT_S, ctx.remaining()), lean
                    )
                    times.append(elapsed)
                    if not lean:
                        out[f"uss_mib_{n}"] = Stats.single(per_proc, "MiB")
                    if ctx.remaining() < ctx.reps(20, 120):
                        break
                out[key] = Stats.of(times, "s")
                live = n
        out["max_live"] = live

        for n in SPAWN_NS:
            if ctx.remaining() < ctx.reps(15, 60):
                ctx.skip(f"spawn_{n}", "out of time budget")
                continue
            times = []
            for _ in range(ctx.reps(1, 3)):
                times.append(_start_group(spawn, n, min(READY_TIMEOUT_S, ctx.remaining()))[0])
            out[f"spawn_{n}"] = Stats.of(times, "s")

        for n in EXEC_NS:
            if ctx.remaining() < ctx.reps(12, 60):
                ctx.skip(f"exec_{n}", "out of time budget")
                continue
            times = [_exec_group(n, min(READY_TIMEOUT_S, ctx.remaining()))
                     for _ in range(ctx.reps(1, 3))]
            out[f"exec_{n}"] = Stats.of(times, "s")

        kills = ctx.reps(5, 20)
        share = time.monotonic() + ctx.remaining() / 3
        out["restart_ms"] = Stats.of(_restart_samples(fs, kills, share), "ms")

        for groups, key in ((1, "fanout_1x3_ms"), (10, "fanout_10x3_ms")):
            _fanout_ms(fs, groups)  # warm
            samples = []
            for _ in range(ctx.reps(5, 10)):
                samples.append(_fanout_ms(fs, groups))
                if ctx.remaining() < 5:
                    break
            out[key] = Stats.of(samples, "ms")
    finally:
        stop_multiprocessing_helpers()
    ctx.note("forkserver preloads bench._targets only; warmed before timing")
    ctx.note("exec = subprocess.Popen of `python -c` (site imported), ready = 1 byte on stdout")
    return out

"""multiprocessing.Pipe between two processes: the stdlib's own IPC limit."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from bench import _targets
from bench.harness import Context, Metrics, repeat, time_calls, workload
from bench.procs import stop_multiprocessing_helpers

PAYLOADS = {"64B": 64, "4KiB": 4096}


def _stop(proc: BaseProcess, conn: Connection) -> None:
    conn.close()
    proc.join(3)
    if proc.is_alive():
        proc.kill()
        proc.join(3)


@workload("mp_pipe", group="limits", budget_s=60, quick_budget_s=15)
def mp_pipe(ctx: Context) -> Metrics:
    """multiprocessing.Pipe round trip (64 B, 4 KiB; µs) and one-way throughput (64 B)."""
    spawn = mp.get_context("spawn")
    out: Metrics = ctx.metrics
    n = ctx.reps(3_000, 20_000)

    parent, child = spawn.Pipe()
    proc = spawn.Process(target=_targets.pipe_echo, args=(child,), daemon=True)
    proc.start()
    child.close()
    try:
        for label, size in PAYLOADS.items():
            payload = os.urandom(size)
            parent.send_bytes(payload)  # the first one also waits for the child to start
            if not parent.poll(20) or parent.recv_bytes() != payload:
                raise RuntimeError("pipe echo did not answer")

            def call(payload: bytes = payload) -> None:
                parent.send_bytes(payload)
                parent.recv_bytes()

            share = time.monotonic() + ctx.remaining() / 4
            out[f"rtt_{label}"] = time_calls(call, n, warmup=300, unit="µs", deadline=share)
    finally:
        _stop(proc, parent)

    count = ctx.reps(20_000, 50_000)
    parent, child = spawn.Pipe()
    proc = spawn.Process(target=_targets.pipe_sink, args=(child, count), daemon=True)
    proc.start()
    child.close()
    payload = os.urandom(64)
    try:

        def one_round() -> float:
            t0 = time.perf_counter()
            for _ in range(count):
                parent.send_bytes(payload)
            if not parent.poll(30) or parent.recv_bytes() != b"done":
                raise RuntimeError("pipe sink did not finish")
            return count / (time.perf_counter() - t0)

        share = time.monotonic() + ctx.remaining() / 1.5
        out["msgs_per_s"] = repeat(
            one_round, ctx.reps(4, 12), unit="msgs/s", warmup=1, deadline=share
        )
    finally:
        _stop(proc, parent)
        stop_multiprocessing_helpers()
    ctx.note("spawn context; send_bytes/recv_bytes (no pickling)")
    return out

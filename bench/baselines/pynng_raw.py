"""Raw pynng between two processes over ipc://: the limit corral's messaging sits on."""

from __future__ import annotations

import os
import time

import msgpack
import pynng

from bench.harness import Context, Metrics, Stats, repeat, time_calls, workload
from bench.procs import Child

PAYLOADS = {"64B": 64, "4KiB": 4096}
TIMEOUT_MS = 5_000
BATCH = 64


@workload("pynng_reqrep", group="limits", budget_s=90, quick_budget_s=20)
def pynng_reqrep(ctx: Context) -> Metrics:
    """Req0/Rep0 round trip, synchronous pynng, 64 B and 4 KiB payloads (µs)."""
    n = ctx.reps(3_000, 20_000)
    addr = f"ipc://{ctx.tmp}/rr.ipc"
    out: Metrics = ctx.metrics
    with Child("rep", addr), pynng.Req0(
        dial=addr, recv_timeout=TIMEOUT_MS, send_timeout=TIMEOUT_MS
    ) as req:
        for label, size in PAYLOADS.items():
            payload = os.urandom(size)
            req.send(payload)
            if req.recv() != payload:
                raise RuntimeError("echo mismatch")

            def call(payload: bytes = payload) -> None:
                req.send(payload)
                req.recv()

            share = time.monotonic() + ctx.remaining() / (len(PAYLOADS) + 1)
            out[f"rtt_{label}"] = time_calls(call, n, warmup=300, unit="µs", deadline=share)
    return out


@workload("pynng_reqrep_trio", group="limits", budget_s=90, quick_budget_s=20)
def pynng_reqrep_trio(ctx: Context) -> Metrics:
    """Req0/Rep0 round trip with pynng's async API under trio on both ends (µs)."""
    import trio

    n = ctx.reps(2_000, 10_000)
    addr = f"ipc://{ctx.tmp}/rrt.ipc"
    out: Metrics = ctx.metrics

    async def measure() -> None:
        with pynng.Req0(dial=addr) as req:
            for label, size in PAYLOADS.items():
                payload = os.urandom(size)
                share = time.monotonic() + ctx.remaining() / (len(PAYLOADS) + 1)
                for _ in range(200):
                    await req.asend(payload)
                    await req.arecv()
                samples: list[float] = []
                clock = time.perf_counter_ns
                for _ in range(n):
                    t0 = clock()
                    await req.asend(payload)
                    await req.arecv()
                    samples.append((clock() - t0) / 1e3)
                    if time.monotonic() > share:
                        break
                out[f"rtt_{label}"] = Stats.of(samples, "µs")

    async def bounded() -> None:
        with trio.fail_after(max(1.0, ctx.remaining())):
            await measure()

    with Child("rep_trio", addr):
        trio.run(bounded)
    return out


@workload("pynng_pushpull", group="limits", budget_s=90, quick_budget_s=20)
def pynng_pushpull(ctx: Context) -> Metrics:
    """Push0/Pull0 one-way throughput, 64 B messages, unbatched and msgpack batches of 64."""
    count = ctx.reps(10_000, 50_000)
    rounds = ctx.reps(4, 12)
    payload = os.urandom(64)
    out: Metrics = ctx.metrics

    addr = f"ipc://{ctx.tmp}/pp.ipc"
    with Child("pull", addr, str(count), "1") as child, pynng.Push0(
        dial=addr, send_timeout=TIMEOUT_MS
    ) as push:

        def unbatched() -> float:
            t0 = time.perf_counter()
            for _ in range(count):
                push.send(payload)
            if child.readline(30) != "done":
                raise RuntimeError("pull side did not finish")
            return count / (time.perf_counter() - t0)

        share = time.monotonic() + ctx.remaining() / 2.5
        out["msgs_per_s"] = repeat(unbatched, rounds, unit="msgs/s", warmup=1, deadline=share)

    addr = f"ipc://{ctx.tmp}/ppb.ipc"
    frames = count // BATCH
    with Child("pull", addr, str(frames * BATCH), str(BATCH)) as child, pynng.Push0(
        dial=addr, send_timeout=TIMEOUT_MS
    ) as push:
        batch = [payload] * BATCH
        pack = msgpack.packb

        def batched() -> float:
            t0 = time.perf_counter()
            for _ in range(frames):
                push.send(pack(batch))
            if child.readline(30) != "done":
                raise RuntimeError("pull side did not finish")
            return frames * BATCH / (time.perf_counter() - t0)

        share = time.monotonic() + ctx.remaining() / 1.5
        out["batched_msgs_per_s"] = repeat(batched, rounds, unit="msgs/s", warmup=1, deadline=share)
    ctx.note(f"batched: one msgpack frame carries {BATCH} messages of 64 B")
    return out

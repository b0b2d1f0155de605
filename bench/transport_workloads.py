"""``link_transports``: corral's actor links on each transport (``[supervisor]
transport = "nng" | "unix"``), in one run, beside the two raw limits they sit on.

For each transport: request RTT actor->supervisor and actor->actor (routed through
the supervisor: two hops), one-way tells/s (64 B, one per frame), and
``durable_actions`` (bench/durable_workloads.py: the full durable loop) at 1, 8
and 64 agents; both transports' supervisors are up at once and the measurements
alternate between them round by round. Baselines, same run: a 64 B round trip with synchronous pynng
(Pair0, blocking send/recv) and with a raw Unix stream socket, each echoed by a
second process over ``ipc://`` / a socket path.

``link_scale``: 1,000 live echo actors on each transport, one transport after the
other in one run: spawn time (``spawn_1000``), idle USS and threads per actor
(``idle_uss``), the supervisor's threads and USS, and the actor->supervisor RTT
with all of them live; every nng figure as a ratio to unix's.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import psutil
import pynng

from bench.corral_workloads import _ask, _call, _echo_spec, _launch_to_ready_s, _wait_all_ready, supervisor
from bench.durable_workloads import AGENT_COUNTS, PER_PLAN, _corral_rate
from bench.durable_workloads import _spec as durable_spec
from bench.harness import Context, Metrics, Stats, time_calls, workload

TRANSPORTS = ("nng", "unix")

#: The far end of both baselines: echo every message until the peer goes.
ECHO = r"""
import socket, sys, pynng
kind, where = sys.argv[1], sys.argv[2]
if kind == "pynng":
    with pynng.Pair0(listen=where) as s:
        print("ready", flush=True)
        while True:
            s.send(s.recv())
else:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(where)
    server.listen(1)
    print("ready", flush=True)
    conn, _ = server.accept()
    while True:
        data = conn.recv(65536)
        if not data:
            break
        conn.sendall(data)
"""


def on_transport(spec_text: str, transport: str) -> str:
    """``spec_text`` (whose ``[supervisor]`` table exists) on ``transport``."""
    return spec_text.replace("[supervisor]\n", f'[supervisor]\ntransport = "{transport}"\n', 1)


def _echo_child(kind: str, where: str) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", ECHO, kind, where], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    if child.stdout.readline().strip() != "ready":
        child.kill()
        child.wait()
        raise RuntimeError(f"the {kind} echo did not start")
    return child


def _raw_pynng_rtt(ctx: Context, n: int) -> Stats:
    address = f"ipc://{ctx.tmp}/raw-pair.ipc"
    child = _echo_child("pynng", address)
    try:
        with pynng.Pair0(dial=address, recv_timeout=5000, send_timeout=5000) as pair:
            payload = os.urandom(64)

            def call() -> None:
                pair.send(payload)
                pair.recv()

            return time_calls(call, n, warmup=300, unit="µs")
    finally:
        child.kill()
        child.wait()


def _raw_unix_rtt(ctx: Context, n: int) -> Stats:
    path = ctx.tmp / "raw-unix.sock"
    child = _echo_child("unix", str(path))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(path))
            payload = os.urandom(64)

            def call() -> None:
                sock.sendall(payload)
                got = 0
                while got < len(payload):
                    got += len(sock.recv(65536))

            return time_calls(call, n, warmup=300, unit="µs")
    finally:
        child.kill()
        child.wait()


def _messaging(ctx: Context, homes: dict[str, Path], rounds: int) -> None:
    """RTTs and tells/s, the transports alternating round by round (both supervisors
    up), so that a change in the machine's load weighs on both alike."""
    n = ctx.reps(300, 3000) // rounds
    samples: dict[str, list[float]] = {}
    rates: dict[str, list[float]] = {transport: [] for transport in homes}
    for home in homes.values():
        for target in ("supervisor", "e-2"):
            _ask(home, "e-1", {"op": "bench_rtt", "target": target, "n": 100, "size": 64})  # warm-up
    for _ in range(rounds):
        for transport, home in homes.items():
            for target, key in (("supervisor", "rtt_actor_supervisor_64B"), ("e-2", "rtt_actor_actor_64B")):
                reply = _ask(home, "e-1", {"op": "bench_rtt", "target": target, "n": n, "size": 64})
                samples.setdefault(f"{transport}_{key}", []).extend(reply["us"])
            count = ctx.reps(5000, 20000)
            result = _ask(home, "e-1", {"op": "bench_tells", "n": count, "batch": 1, "size": 64}, timeout=300)
            rates[transport].append(result["n"] / result["elapsed_s"])
            ctx.check(f"link_transports {transport} messaging")
    for key, values in samples.items():
        ctx.metrics[key] = Stats.of(values, "µs")
    for transport, values in rates.items():
        ctx.metrics[f"{transport}_tells_per_s"] = Stats.of(values, "msgs/s")


def _durable(ctx: Context, ready: ExitStack, agents: int, rounds: int) -> None:
    loops = max(ctx.reps(8, 20), ctx.reps(40, 100) // agents)
    homes = {
        transport: ready.enter_context(supervisor(ctx, on_transport(durable_spec(agents, loops), transport)))
        for transport in TRANSPORTS
    }
    for home in homes.values():
        _wait_all_ready(home, agents, 120)
    rates: dict[str, list[float]] = {transport: [] for transport in homes}
    for _ in range(rounds):
        for transport, home in homes.items():
            ctx.check(f"link_transports {transport} durable n={agents}")
            rates[transport].append(_corral_rate(home, agents, loops))
    for transport, values in rates.items():
        ctx.metrics[f"{transport}_actions_per_s_{agents}"] = Stats.of(values, "per s")


@workload("link_transports", group="corral", budget_s=900, quick_budget_s=240)
def link_transports(ctx: Context) -> Metrics:
    """Both actor-link transports in one run: RTT actor->supervisor and actor->actor,
    one-way tells/s, durable actions/s at 1, 8 and 64 agents; raw sync pynng Pair0
    and a raw Unix socket round trip as baselines. Return {"{t}_rtt_actor_supervisor_64B",
    "{t}_rtt_actor_actor_64B", "{t}_tells_per_s", "{t}_actions_per_s_{n}"} for t in
    nng, unix, "raw_pynng_rtt_64B", "raw_unix_rtt_64B" and the nng/unix ratios."""
    n = ctx.reps(3000, 20000)
    ctx.metrics["raw_pynng_rtt_64B"] = _raw_pynng_rtt(ctx, n)
    ctx.metrics["raw_unix_rtt_64B"] = _raw_unix_rtt(ctx, n)
    rounds = ctx.reps(2, 5)
    with ExitStack() as ready:
        homes = {
            transport: ready.enter_context(supervisor(ctx, on_transport(_echo_spec(2), transport)))
            for transport in TRANSPORTS
        }
        for home in homes.values():
            _wait_all_ready(home, 2, 60)
        _messaging(ctx, homes, rounds)
    for agents in AGENT_COUNTS:
        with ExitStack() as ready:
            _durable(ctx, ready, agents, rounds)
    _ratios(ctx)
    ctx.note(f"durable: {PER_PLAN} fs.list actions per plan, scripted provider, synchronous=full, as durable_actions")
    ctx.note("RTT timed inside the actor; actor->actor is routed by the supervisor (two hops)")
    return ctx.metrics


def _ratios(ctx: Context) -> None:
    """``ratio_nng_to_unix_{key}`` for every figure measured on both transports."""
    for key in [k.removeprefix("nng_") for k in ctx.metrics if k.startswith("nng_")]:
        nng, unix = ctx.metrics[f"nng_{key}"], ctx.metrics.get(f"unix_{key}")
        if isinstance(nng, Stats) and isinstance(unix, Stats) and unix.median:
            ctx.metrics[f"ratio_nng_to_unix_{key}"] = Stats.single(nng.median / unix.median, "ratio")


def _per_process(pids: list[int]) -> tuple[list[float], list[float]]:
    """USS (MiB) and thread count of each process still there."""
    uss, threads = [], []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            uss.append(process.memory_full_info().uss / 2**20)
            threads.append(float(process.num_threads()))
        except psutil.Error:
            continue
    return uss, threads


def _cpu_s(pids: list[int]) -> float:
    """CPU the processes still there have used so far, every thread of each (the
    scheduler's own count, in ns: psutil's cpu_times counts in 10 ms ticks)."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as stat:
                    total += int(stat.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
    return total / 1e9


def _at_scale(ctx: Context, transport: str, n: int) -> None:
    """``n`` echo actors on ``transport``: spawn time, and the CPU it took (the
    supervisor, its fork server and every actor, so far: a figure the machine's
    load moves much less than the wall time); then, all idle, USS and threads per
    actor and of the supervisor; then the RTT with all of them live."""
    with supervisor(ctx, on_transport(_echo_spec(n), transport)) as home:
        _wait_all_ready(home, n, ctx.remaining())
        ctx.metrics[f"{transport}_spawn_{n}_s"] = Stats.single(_launch_to_ready_s(home), "s")
        status = _call(home, "status")
        actors = [a["pid"] for a in status["actors"] if a["pid"]]
        cpu = _cpu_s([status["pid"], status["forkserver"]["pid"], *actors])
        ctx.metrics[f"{transport}_spawn_{n}_cpu_ms_per_actor"] = Stats.single(1000 * cpu / n, "ms")
        uss, threads = _per_process(actors)
        ctx.metrics[f"{transport}_idle_uss_mib_{n}"] = Stats.of(uss, "MiB")
        ctx.metrics[f"{transport}_threads_per_actor_{n}"] = Stats.of(threads, "threads")
        sup_uss, sup_threads = _per_process([status["pid"]])
        ctx.metrics[f"{transport}_supervisor_uss_mib_{n}"] = Stats.of(sup_uss, "MiB")
        ctx.metrics[f"{transport}_supervisor_threads_{n}"] = Stats.of(sup_threads, "threads")
        _ask(home, "e-1", {"op": "bench_rtt", "target": "supervisor", "n": 100, "size": 64})  # warm-up
        probe = {"op": "bench_rtt", "target": "supervisor", "n": ctx.reps(300, 2000), "size": 64}
        both = [status["pid"], next(a["pid"] for a in status["actors"] if a["id"] == "e-1")]
        before = _cpu_s(both)
        samples = _ask(home, "e-1", probe)["us"]
        per_trip = (_cpu_s(both) - before) / len(samples)
        ctx.metrics[f"{transport}_rtt_actor_supervisor_64B_{n}"] = Stats.of(samples, "µs")
        ctx.metrics[f"{transport}_cpu_us_per_rtt_{n}"] = Stats.single(1e6 * per_trip, "µs")
    ctx.check(f"link_scale {transport} n={n}")


@workload("link_scale", group="corral", budget_s=900, quick_budget_s=240)
def link_scale(ctx: Context) -> Metrics:
    """1,000 live echo actors (200 under --quick) on each transport, one after the
    other: spawn time and its CPU per actor, idle USS and threads per actor, the
    supervisor's threads and USS, RTT actor->supervisor at that size. Return
    {"{t}_spawn_{N}_s", "{t}_spawn_{N}_cpu_ms_per_actor",
    "{t}_idle_uss_mib_{N}", "{t}_threads_per_actor_{N}", "{t}_supervisor_uss_mib_{N}",
    "{t}_supervisor_threads_{N}", "{t}_rtt_actor_supervisor_64B_{N}", "{t}_cpu_us_per_rtt_{N}"
    (the supervisor's and the actor's, per round trip)} for t in nng,
    unix, and the nng/unix ratios."""
    n = ctx.reps(200, 1000)
    for transport in TRANSPORTS:
        _at_scale(ctx, transport, n)
    _ratios(ctx)
    ctx.note(
        "spawn: first actor-started to last actor-ready (the supervisor's event clock); its CPU:"
        " supervisor, fork server and actors, from their start to the last ready, per actor"
    )
    ctx.note("USS and threads read with psutil once every actor is ready and idle")
    return ctx.metrics

"""Pykka: a Python actor library. Its actors are *threads in one process*, so it has no
process isolation, no crash containment and no restart; its numbers are a floor for
in-process messaging, not a like-for-like peer."""

from __future__ import annotations

import time
from typing import Any

import psutil

from bench.harness import Context, Metrics, NotRun, Stats, measure_echo_peer, repeat, workload

CREATE_NS = (10, 50, 200, 1000)
ASK_TIMEOUT_S = 10.0


def _uss() -> int:
    return int(psutil.Process().memory_full_info().uss)


@workload("pykka", group="peers", budget_s=120, quick_budget_s=20)
def pykka_peer(ctx: Context) -> Metrics:
    """Pykka ThreadingActor: ask RTT, tell throughput, start N to ready, per-actor USS."""
    try:
        import pykka
    except ImportError as exc:
        raise NotRun(f"pykka not installed ({exc}); pip install pykka") from exc

    class Echo(pykka.ThreadingActor):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def on_receive(self, message: Any) -> Any:
            kind = message[0]
            if kind == "ping":
                return message[1]
            if kind == "tell":
                self.count += 1
                return None
            if kind == "count":
                return self.count
            if kind == "work":
                return message[1]
            return True  # "ready"

    out: Metrics = ctx.metrics
    try:
        echo = Echo.start()
        measure_echo_peer(
            ctx,
            "pykka",
            ping=lambda p: echo.ask(("ping", p), timeout=ASK_TIMEOUT_S),
            tell=echo.tell,
            count=lambda timeout: int(echo.ask(("count",), block=True, timeout=timeout)),
            rtt_reps=ctx.reps(2_000, 10_000),
            rtt_warmup=200,
            rtt_share=6,
            tells=ctx.reps(20_000, 50_000),
            tell_reps=ctx.reps(3, 7),
            tell_warmup=1,
            tell_share=5,
        )
        echo.stop(timeout=ASK_TIMEOUT_S)

        live = 0
        for n in CREATE_NS:
            times: list[float] = []
            for rep in range(ctx.reps(2, 5)):
                before = _uss()
                t0 = time.perf_counter()
                refs = [Echo.start() for _ in range(n)]
                futures = [r.ask(("ready",), block=False) for r in refs]
                for fut in futures:
                    fut.get(timeout=ASK_TIMEOUT_S)
                times.append(time.perf_counter() - t0)
                if rep == 0:
                    out[f"uss_mib_{n}"] = Stats.single(max(0, _uss() - before) / 2**20 / n, "MiB")
                for r in refs:
                    r.stop(timeout=ASK_TIMEOUT_S)
                ctx.check(f"create {n}")
            out[f"create_{n}"] = Stats.of(times, "s")
            live = n
        out["max_live"] = live

        for groups, key in ((1, "fanout_1x3_ms"), (10, "fanout_10x3_ms")):

            def fanout(groups: int = groups) -> float:
                t0 = time.perf_counter()
                kids = [Echo.start() for _ in range(groups * 3)]
                futs = [k.ask(("work", i), block=False) for i, k in enumerate(kids)]
                for fut in futs:
                    fut.get(timeout=ASK_TIMEOUT_S)
                for k in kids:
                    k.stop(timeout=ASK_TIMEOUT_S)
                return (time.perf_counter() - t0) * 1e3

            out[key] = repeat(fanout, ctx.reps(5, 20), unit="ms", warmup=1)
    finally:
        pykka.ActorRegistry.stop_all(timeout=ASK_TIMEOUT_S)
    ctx.note("Pykka actors are threads in one process: no isolation, no restart")
    ctx.note("USS per actor = growth of this process's USS / N")
    return out

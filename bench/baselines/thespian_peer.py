"""Thespian's multiprocTCPBase: a Python actor library with one OS process per actor,
talking TCP on 127.0.0.1 (THESPIAN_BASE_IPADDR pins every address to loopback)."""

from __future__ import annotations

import os
import time
from typing import Any

from bench.harness import Context, Metrics, NotRun, Stats, measure_echo_peer, repeat, workload
from bench.procs import free_tcp_port, uss_mib, wait_gone

CREATE_NS = (10, 50, 200, 1000)
ASK_TIMEOUT_S = 20.0
NULL_LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "root": {"level": "CRITICAL", "handlers": ["null"]},
}


@workload("thespian", group="peers", budget_s=420, quick_budget_s=25, order=60)
def thespian_peer(ctx: Context) -> Metrics:
    """Thespian multiprocTCPBase: ask RTT, tell throughput, create N to ready, USS, fan-out."""
    os.environ["THESPIAN_BASE_IPADDR"] = "127.0.0.1"
    try:
        from thespian.actors import (  # type: ignore[import-untyped]
            ActorExitRequest,
            ActorSystem,
        )

        from bench import _thespian_actors
    except ImportError as exc:
        raise NotRun(f"thespian not installed ({exc}); pip install thespian") from exc

    echo_cls = _thespian_actors.Echo
    port = free_tcp_port()
    asys = ActorSystem(
        "multiprocTCPBase",
        capabilities={"Admin Port": port},
        logDefs=NULL_LOGGING,
        transientUnique=True,
    )
    out: Metrics = ctx.metrics
    actor_pids: list[int] = []

    def ask(addr: Any, msg: Any, timeout: float = ASK_TIMEOUT_S) -> Any:
        reply = asys.ask(addr, msg, timeout)
        if reply is None:
            raise TimeoutError(f"thespian actor did not answer {msg[0]!r} in {timeout}s")
        return reply

    def create(n: int) -> tuple[list[Any], list[int]]:
        addrs = [asys.createActor(echo_cls) for _ in range(n)]
        pids = [int(ask(a, ("pid",))) for a in addrs]
        return addrs, pids

    def destroy(addrs: list[Any], pids: list[int]) -> None:
        for addr in addrs:
            asys.tell(addr, ActorExitRequest())
        wait_gone(pids, 20)

    try:
        addrs, pids = create(1)
        actor_pids += pids
        echo = addrs[0]
        measure_echo_peer(
            ctx,
            "thespian",
            ping=lambda p: ask(echo, ("ping", p)),
            tell=lambda message: asys.tell(echo, message),
            count=lambda timeout: int(ask(echo, ("count",), timeout)),
            rtt_reps=ctx.reps(500, 3_000),
            rtt_warmup=50,
            rtt_share=8,
            tells=ctx.reps(1_000, 5_000),
            tell_reps=ctx.reps(2, 5),
            tell_share=8,
        )
        destroy(addrs, pids)

        live = 0
        for n in CREATE_NS:
            if ctx.quick and n > 200:
                ctx.skip(f"create_{n}", "skipped in --quick")
                continue
            if ctx.remaining() < (n / 50.0) * (3 if n < 1000 else 12) + 10:
                ctx.skip(f"create_{n}", "out of time budget")
                continue
            times: list[float] = []
            for rep in range(ctx.reps(1, 3) if n < 1000 else 1):
                t0 = time.perf_counter()
                addrs, pids = create(n)
                times.append(time.perf_counter() - t0)
                actor_pids += pids
                if rep == 0:
                    out[f"uss_mib_{n}"] = Stats.single(uss_mib(pids) / n, "MiB")
                destroy(addrs, pids)
                if ctx.remaining() < 20:
                    break
            out[f"create_{n}"] = Stats.of(times, "s")
            live = n
        out["max_live"] = live

        for groups, key in ((1, "fanout_1x3_ms"), (10, "fanout_10x3_ms")):

            def fanout(groups: int = groups) -> float:
                t0 = time.perf_counter()
                kids = [asys.createActor(echo_cls) for _ in range(groups * 3)]
                for i, kid in enumerate(kids):
                    ask(kid, ("work", i))
                for kid in kids:
                    asys.tell(kid, ActorExitRequest())
                return (time.perf_counter() - t0) * 1e3

            out[key] = repeat(
                fanout, ctx.reps(3, 10), unit="ms",
                deadline=time.monotonic() + ctx.remaining() / 3,
            )
    finally:
        asys.shutdown()
        wait_gone(actor_pids, 10)
    ctx.note("Thespian: one process per actor (fork), TCP on 127.0.0.1; asks from outside")
    ctx.note("Thespian fan-out joins on answers; actors exit asynchronously (not reaped)")
    return out

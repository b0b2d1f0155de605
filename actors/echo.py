"""The ``echo`` template: answers requests with their body and counts messages.

Tests and benchmarks use it; a few control ops let tests make it exit on purpose.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from corral.actors.runtime import SUPERVISOR, ActorContext, is_shutdown
from corral.mailbox.envelope import Kind
from corral.mailbox.protocol import BenchSink, BenchSinkCount, BenchSinkReset, Ping, encode


async def run(ctx: ActorContext) -> int:
    requests = 0
    tells = 0
    async for envelope in ctx.channel.inbox:
        if is_shutdown(envelope):
            ctx.shutdown.set()
            return 0
        if envelope.kind is Kind.TELL:
            tells += 1
            continue
        if envelope.kind is not Kind.REQUEST:
            continue
        requests += 1
        op = envelope.body.get("op")
        if op == "exit":
            # Reply first so the caller knows the exit is deliberate.
            await ctx.channel.reply(envelope, {"exiting": True})
            return int(envelope.body.get("code", 0))
        if op in BENCH_OPS:
            await ctx.channel.reply(envelope, await BENCH_OPS[op](ctx, envelope.body))
            continue
        if op == "stats":
            await ctx.channel.reply(envelope, {"requests": requests, "tells": tells, "pid": os.getpid()})
            continue
        await ctx.channel.reply(envelope, {"echo": envelope.body, "count": requests})
    return 0


# -- measurement ops, timed inside the actor (for bench/) ------------------------------


async def _bench_rtt(ctx: ActorContext, body: dict[str, Any]) -> dict[str, Any]:
    """N sequential requests to ``target`` (the supervisor, or another actor through
    the supervisor's routing); returns each round trip in microseconds."""
    target = str(body.get("target", SUPERVISOR))
    count = min(int(body.get("n", 1000)), 100_000)
    payload = os.urandom(int(body.get("size", 64))).hex()[: int(body.get("size", 64))]
    request = encode(Ping(payload=payload)) if target == SUPERVISOR else {"p": payload}
    samples = []
    for _ in range(count):
        start = time.perf_counter_ns()
        await ctx.channel.request(target, request, timeout=10)
        samples.append((time.perf_counter_ns() - start) / 1000)
    return {"us": samples}


async def _bench_tells(ctx: ActorContext, body: dict[str, Any]) -> dict[str, Any]:
    """N one-way 64 B tells to the supervisor's sink, optionally batched; returns
    the elapsed time until the supervisor has counted all of them."""
    count = min(int(body.get("n", 10_000)), 1_000_000)
    batch = max(1, int(body.get("batch", 1)))
    payload = "x" * int(body.get("size", 64))
    message = encode(BenchSink(payload=payload))
    await ctx.ask(BenchSinkReset())
    start = time.perf_counter()
    sent = 0
    while sent < count:
        take = min(batch, count - sent)
        if take == 1:
            await ctx.channel.tell(SUPERVISOR, message)
        else:
            await ctx.channel.tell_many(SUPERVISOR, [message] * take)
        sent += take
    while (await ctx.ask(BenchSinkCount())).count < count:
        pass
    return {"elapsed_s": time.perf_counter() - start, "n": count}


BENCH_OPS: dict[str, Callable[[ActorContext, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "bench_rtt": _bench_rtt,
    "bench_tells": _bench_tells,
}

"""The ``echo`` template: answers requests with their body and counts messages.

Tests and benchmarks use it; a few control ops let tests make it exit on purpose.
"""

from __future__ import annotations

import os

from corral.actors.runtime import ActorContext, is_shutdown
from corral.mailbox.envelope import Kind


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
        if op == "stats":
            await ctx.channel.reply(envelope, {"requests": requests, "tells": tells, "pid": os.getpid()})
            continue
        await ctx.channel.reply(envelope, {"echo": envelope.body, "count": requests})
    return 0

"""Issue 50 §5: an actor's nng link costs the actor's process nng's smallest thread
pools. By default nng sizes them for a busy server (two task threads per CPU, one
expiry thread per CPU, four resolvers: 12 threads on 2 CPUs), in every actor, for
one socket on ``ipc://``. The actor's end of a link is the dialing end, in a
process of its own where nng has not run yet (the fork server never opens an nng
socket): the child below is that process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import trio

from corral.mailbox.transport import NNG

#: The actor's side: dial, exchange a frame both ways, report its threads.
ACTOR = r"""
import os, sys, trio
from corral.mailbox.transport import NNG

async def main() -> None:
    link = await NNG.dial(sys.argv[1], 1 << 20)
    await link.send(b"up", 5)
    assert await link.receive() == b"ok"
    print(len(os.listdir("/proc/self/task")), flush=True)
    link.close()

trio.run(main)
"""

#: Python's main thread and nng's floors: 2 task threads, 1 expiry, 1 resolver, the
#: poller and the reaper.
MOST_THREADS = 1 + 6


async def test_an_actor_process_with_an_nng_link_runs_only_nngs_smallest_pools(short_tmp: Path) -> None:
    listener = NNG.listen(f"ipc://{short_tmp}/a.ipc", 1 << 20)
    done: list[subprocess.CompletedProcess[bytes]] = []

    async def actor() -> None:
        done.append(await trio.run_process([sys.executable, "-c", ACTOR, listener.address], capture_stdout=True))

    async with trio.open_nursery() as nursery:  # the child is reaped on the way out
        nursery.start_soon(actor)
        link = await listener.accept()
        try:
            assert await link.receive() == b"up"
            await link.send(b"ok", 5)
            assert await link.receive() is None  # the actor closed its end
        finally:
            link.close()
    threads = int(done[0].stdout)
    assert threads <= MOST_THREADS, f"the actor ran {threads} threads for its one nng link"

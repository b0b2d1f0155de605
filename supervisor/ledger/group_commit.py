"""Group commit: one fsync makes a whole batch of commits durable before any of
their replies leave.

Handlers commit their transactions at once (SQLite appends to the WAL without an
fsync), then ``await barrier()`` before their reply is sent. The first handler to
reach the barrier starts an fsync of the WAL in a worker thread; handlers that
commit meanwhile wait for the next one, which covers all of them. No reply leaves
before the fsync that covers its commit, so "``executing`` is committed before the
effect starts" holds exactly as with ``synchronous = FULL`` per commit; only the
number of fsyncs drops, and the supervisor keeps serving other actors while the
disk works. With one caller the batch is one commit and nothing is delayed. On a
disk whose fsync is quicker than a thread hop (half a millisecond, smoothed), the
fsync runs on the event loop: a slow fsync moves the next ones to a thread.

With a PostgreSQL ledger the sync is a round trip to the server, which may be
away (a restart, a terminated connection): the barrier then waits for it and
tries again, with backoff, and no reply leaves until the sync succeeds (or, past
``DURABLE_WAIT_S``, the caller gets ``LedgerUnavailable`` instead of its reply).
"""

from __future__ import annotations

import logging
import time

import trio

from corral.core import failpoints
from corral.supervisor.ledger.ledger_link import Backoff, LedgerUnavailable
from corral.supervisor.ledger.port import Ledger

log = logging.getLogger("corral.ledger")

#: An fsync faster than this (smoothed) runs on the event loop itself; a slower
#: one in a worker thread, so the supervisor keeps serving actors meanwhile.
INLINE_SYNC_S = 0.0005
SYNC_SMOOTHING = 0.2
#: How long a reply waits for its commit to be made durable while the ledger's
#: server is away, before the caller is told the ledger is unavailable.
DURABLE_WAIT_S = 30.0


class GroupCommit:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._syncing = trio.Lock()  # fair: the waiters of one batch go together
        #: fsyncs done, and the durable commits they covered (their ratio is the batch size).
        self.syncs = 0
        self.batched_commits = 0
        #: How long an fsync takes here lately (smoothed): it picks inline or a thread.
        self.recent_sync_s = 0.0

    async def barrier(self) -> None:
        """Return once every durable commit made before this call is on disk."""
        ledger = self.ledger
        if not ledger.group_commit or not ledger.unsynced:
            return
        mine = ledger.durable_commits
        async with self._syncing:
            if ledger.synced_commits >= mine:
                return  # the fsync this caller waited behind covered its commit
            failpoints.hit("ledger.before-sync")
            before = ledger.synced_commits
            covered, took = await self._sync()
            # The fsync's own time, not the hop's: timed around the await, a busy
            # loop's delay in noticing the thread made a disk look slow for good.
            self.recent_sync_s += (took - self.recent_sync_s) * SYNC_SMOOTHING
            ledger.synced_commits = max(before, covered)
            self.syncs += 1
            self.batched_commits += ledger.synced_commits - before
            failpoints.hit("ledger.after-sync")

    async def _sync(self) -> tuple[int, float]:
        """One sync; while the ledger's server is away, wait and try again (in a
        worker thread: a new connection may take a while)."""
        ledger = self.ledger
        if self.recent_sync_s < INLINE_SYNC_S:
            # A fast disk: the fsync costs less than the hop to a worker thread
            # and back (measured: 1 agent 650 against 530 actions/s).
            try:
                return _timed_sync(ledger)
            except LedgerUnavailable:
                pass
        backoff = Backoff()
        deadline = trio.current_time() + DURABLE_WAIT_S
        while True:
            try:
                return await trio.to_thread.run_sync(_timed_sync, ledger)
            except LedgerUnavailable as exc:
                if trio.current_time() >= deadline:
                    raise
                log.warning("replies wait for their commits to be durable: %s", exc)
                await trio.sleep(backoff.next_delay())


def _timed_sync(ledger: Ledger) -> tuple[int, float]:
    started = time.perf_counter()
    covered = ledger.sync()
    return covered, time.perf_counter() - started

"""The SQLite ledger's high-water mark: the last event it made durable, kept in a
small file beside it, outside the write-ahead log.

Why: SQLite's recovery stops at the first WAL frame whose checksum fails and keeps
the database as it was before that frame: consistent, but older. Damage inside the
log (a bad sector, a stray write) thus drops committed runs without a word. The
PostgreSQL ledger refuses to go on after losing commits it was told of (its commit
marker, supervisor/ledger/ledger_pg.py); this is the same for SQLite. A ledger
opened to boot a supervisor whose newest event is behind its mark lost commits
that were acknowledged, and is refused (supervisor/ledger/port.py).

What it costs: events carry a cursor that only grows (``AUTOINCREMENT``, the table
is append-only), so the mark is one number. It moves only once the commits it
covers are durable: after each group-commit fsync of the WAL (one ``pwrite`` of a
64-byte record per batch, not per commit; with one fsync per commit, after each
such commit), never ahead of the disk, so a power loss can leave it behind the
ledger but never ahead of it. The mark itself is fsync'd at most once a second,
at boot and at close: no fsync on the durable path.

What it protects: every durable commit that appended an event, and every commit
before it (the WAL is a sequence: losing one commit loses all that follow). After
a process crash (SIGKILL, OOM) the mark's last write is in the page cache and
survives; after a power loss, what was committed until the mark's last fsync (at
most about a second before). A loss of durable commits that wrote no event after
the last one that did goes unseen (every step of an action and a run writes one).
With ``synchronous`` other than ``full`` no commit is acknowledged as durable, and
the mark covers what each boot found.
"""

from __future__ import annotations

import logging
import os
import re
import time
import zlib
from pathlib import Path

log = logging.getLogger("corral.ledger")

#: The mark of ``ledger.db`` is ``ledger.db-high-water``: a backup or a removal of
#: ``ledger.db*`` takes it along.
SUFFIX = "-high-water"
#: The mark is fsync'd at most this often (and at boot and close).
SYNC_INTERVAL_S = 1.0
_RECORD = "corral ledger high-water v1: event {cursor:020d} crc32 {crc:08x}\n"
_PARSE = re.compile(rb"corral ledger high-water v1: event (\d{20}) crc32 ([0-9a-f]{8})\n")


class MarkDamaged(ValueError):
    """The mark file holds no valid record: nothing can be said of the ledger."""


def mark_path(ledger: Path) -> Path:
    return ledger.with_name(ledger.name + SUFFIX)


def _crc(cursor: int) -> int:
    return zlib.crc32(f"{cursor:020d}".encode())


def encode(cursor: int) -> bytes:
    return _RECORD.format(cursor=cursor, crc=_crc(cursor)).encode()


def decode(data: bytes) -> int:
    match = _PARSE.fullmatch(data)
    if match is None:
        raise MarkDamaged("it holds no high-water record")
    cursor = int(match.group(1))
    if int(match.group(2), 16) != _crc(cursor):
        raise MarkDamaged("its record's checksum is wrong")
    return cursor


def read_mark(ledger: Path) -> int | None:
    """The event cursor the ledger's mark holds, or None when it has none (a new
    ledger, or one from before marks). Reads only."""
    try:
        fd = os.open(mark_path(ledger), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MarkDamaged(f"it cannot be opened ({exc.strerror})") from None
    try:
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    # Empty: made, and the process died before its first record (nothing was judged yet).
    return decode(data) if data else None


def forget(ledger: Path) -> None:
    """Before a new ledger is made at ``ledger``: the mark of the one that was
    there (moved away on purpose) must not judge it. Durable before the new
    ledger appears, so that a crash in between leaves no stale mark."""
    path = mark_path(ledger)
    try:
        path.unlink()
    except FileNotFoundError:
        return
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def behind(mark: int | None, holds: int) -> bool:
    """Whether a ledger whose newest event is ``holds`` lost commits its mark saw."""
    return mark is not None and holds < mark


def lost_commits(ledger: Path, mark: int, holds: int) -> str:
    """What a refused ledger's error and ``corral doctor`` say."""
    return (
        f"ledger {ledger} lost committed work: its high-water mark says events up to {mark} were"
        f" committed and made durable, but it holds events only up to {holds}. Its write-ahead log"
        f" ({ledger.name}-wal) is damaged, or the file was replaced by an older copy"
    )


def what_to_do(ledger: Path) -> str:
    mark = mark_path(ledger)
    return (
        f"first copy {ledger.name}, {ledger.name}-wal and {ledger.name}-shm aside (the commits past the damage"
        f" are still in the -wal file); then restore the ledger from a backup, or, to go on with what it"
        f" holds and lose the rest for good, move {mark} (the high-water mark) away and start again;"
        " `corral doctor` checks a home"
    )


class HighWater:
    """The mark a supervisor's ledger keeps. ``value`` is what it holds now."""

    def __init__(self, ledger: Path) -> None:
        self.value = read_mark(ledger) or 0
        self._fd = os.open(mark_path(ledger), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._synced_at = 0.0
        self._dirty = False
        #: A write of the mark failed (a full or failing disk) and has not succeeded since.
        self._failing = False

    def start(self, holds: int) -> None:
        """At boot, once the ledger is judged (not behind) and its log is on disk:
        the mark is what it holds now (more than the mark when the last commits
        were not yet synced when the process died; they are now)."""
        os.pwrite(self._fd, encode(holds), 0)
        self.value = holds
        self.sync()

    def advance(self, cursor: int) -> None:
        """Events up to ``cursor`` are durable in the ledger (never call it sooner)."""
        if cursor <= self.value:
            return
        # The mark guards the ledger, it is not part of it: a write of it that fails
        # (a full disk) leaves it behind, which can hide a loss but never invent
        # one, and must not fail the commit it follows.
        try:
            os.pwrite(self._fd, encode(cursor), 0)
            if time.monotonic() - self._synced_at >= SYNC_INTERVAL_S:
                os.fsync(self._fd)
                self._synced_at = time.monotonic()
                self._dirty = False
            else:
                self._dirty = True
        except OSError as exc:
            if not self._failing:
                log.warning("the ledger's high-water mark cannot be written (%s): it stays at %d", exc, self.value)
            self._failing = True
            return
        if self._failing:
            log.warning("the ledger's high-water mark is written again")
            self._failing = False
        self.value = cursor

    def sync(self) -> None:
        if self._fd < 0:
            return
        os.fsync(self._fd)
        self._synced_at = time.monotonic()
        self._dirty = False

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            if self._dirty:
                self.sync()
        except OSError as exc:
            log.warning("the ledger's high-water mark could not be synced at close (%s)", exc)
        finally:
            os.close(self._fd)
            self._fd = -1

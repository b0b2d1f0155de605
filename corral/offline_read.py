"""Reading a home's ledger with no supervisor up: ``corral show``, ``runs``,
``transcript``, ``events`` (without ``--follow``) and ``intent receipts`` after
``corral down``.

Who answers is decided by the home's lock (supervisor/home/home_dir.py ``HomeLock``):
each read holds a shared flock on the home directory while it opens and reads the
ledger, so no supervisor can take its exclusive lock (start) in the middle, and a
home whose lock a supervisor holds (running, or starting and not yet answering) is
never read behind its back: ``HomeHeld`` sends the caller to it.

Nothing is written, not even a file created. SQLite is opened ``immutable`` when it
has no write-ahead log (a clean ``corral down`` checkpoints and removes it): a
read-only connection would create the ``-wal`` and ``-shm`` files and leave them
behind, and the shared lock keeps every writer away while the file is read. A
non-empty log (a supervisor that was killed) holds committed transactions, so that
ledger is opened read-only (``open_for_reading``), which reads the log where it is.
A home on PostgreSQL reads the partition it remembers, read-only.

The answers are the supervisor's own read functions over that ledger (``show_record``
and ``recent_runs`` in supervisor/runs/run_views.py, ``transcript`` in
supervisor/runs/transcript_view.py, ``Ledger.events_since``,
``receipts_view`` in supervisor/intent/intent_service.py), each marked
``read_from: "ledger"``.

A SQLite ledger behind its high-water mark (supervisor/ledger/high_water.py: its
write-ahead log lost commits that were made durable, so ``corral up`` refuses it)
is still read, since what it holds may be all there is, but every answer says so:
``ledger_behind`` (the mark, what it holds, what was lost and what to do, as
``corral doctor`` says), and ``LedgerReader.behind`` for the read that failed
(``not-found`` for a run the damage dropped), which the CLI prints on stderr.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from corral.mailbox.control import ControlError
from corral.supervisor.errors import SupervisorError
from corral.supervisor.home import home_dir as homes
from corral.supervisor.ledger import high_water
from corral.supervisor.ledger.ledger_spec import LedgerSpecError, open_for_reading, remembered_placement
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.ledger.port import Ledger, LedgerError
from corral.supervisor.ledger.schema import MIGRATIONS
from corral.supervisor.runs.run_store import get_run
from corral.supervisor.runs.run_views import recent_runs, show_record

T = TypeVar("T")

#: The mark on every answer read here (``show``, each run of ``runs``, each event,
#: ``intent receipts``): the CLI's --json carries it, its text says it on stderr.
READ_FROM = "ledger"
#: Events per page, as many as the supervisor sends at most.
EVENTS_PAGE = 5000


class HomeHeld(Exception):
    """A supervisor holds the home's lock (running or starting): ask it, not the ledger."""


class SupervisorStarting(homes.NotRunning):
    """A supervisor holds the home's lock but has not answered (written its endpoint)
    in time: it is starting (not running yet), and its ledger is not read behind its back."""


class LedgerUnreadable(homes.NotRunning):
    """No supervisor runs and the home's ledger cannot be read (damaged, of another
    schema, or a PostgreSQL ledger out of reach)."""


class LedgerReader:
    """The reads a client answers from a home's ledger while nobody holds the home.
    Each opens the ledger, reads and closes it, under the shared lock; each raises
    ``HomeHeld`` when a supervisor holds the home, and ``NotRunning`` when the home
    has no ledger (nothing ever ran there)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        #: What the last read found of the ledger's high-water mark: None when the
        #: ledger holds every durable commit (or has no mark, or is on PostgreSQL).
        self.behind: dict[str, Any] | None = None

    def show(self, run_id: str) -> dict[str, Any]:
        return {**self.read(lambda ledger: show_record(ledger, get_run(ledger, run_id))), **self._marks()}

    def runs(self) -> list[dict[str, Any]]:
        return [{**run, **self._marks()} for run in self.read(recent_runs)]

    def events(self, since: int) -> list[dict[str, Any]]:
        """One page of the events after cursor ``since`` (empty: the stream ends)."""
        page = self.read(lambda ledger: ledger.events_since(since, EVENTS_PAGE))
        return [{**event, **self._marks()} for event in page]

    def transcript(self, run_id: str, turn: int | None = None) -> dict[str, Any]:
        from corral.supervisor.runs.transcript_view import transcript

        return {**self.read(lambda ledger: transcript(ledger, run_id, turn=turn)), **self._marks()}

    def intent_receipts(self, run_id: str) -> dict[str, Any]:
        # The intent service imports the run layer and the sandbox: only this read needs it.
        from corral.supervisor.intent.intent_service import receipts_view

        return {**self.read(lambda ledger: receipts_view(ledger, run_id)), **self._marks()}

    def check(self) -> dict[str, Any] | None:
        """Only the high-water judgement (``corral status`` with no supervisor)."""
        self.read(lambda ledger: None)
        return self.behind

    def _marks(self) -> dict[str, Any]:
        return {"read_from": READ_FROM, **({"ledger_behind": self.behind} if self.behind else {})}

    def read(self, what: Callable[[Ledger], T]) -> T:
        """``what`` over the home's ledger, opened for this read alone. A refusal of
        the read functions (``not-found``, ...) is the ``ControlError`` a supervisor
        would answer with, so a caller cannot tell the two paths apart by their errors."""
        self.behind = None
        with _home_free(self.home):
            try:
                ledger = _open(self.home)
            except (LedgerError, LedgerSpecError, sqlite3.DatabaseError) as exc:
                raise LedgerUnreadable(
                    f"no supervisor is running on {self.home}, and its ledger cannot be read: {exc}"
                ) from None
            try:
                _check_schema(ledger)
                if isinstance(ledger, SqliteLedger):
                    self.behind = _judge_mark(self.home / homes.LEDGER, ledger)
                return what(ledger)
            except SupervisorError as exc:
                raise ControlError(exc.code, exc.message) from None
            except sqlite3.DatabaseError as exc:
                raise LedgerUnreadable(
                    f"no supervisor is running on {self.home}, and {ledger.where} cannot be read: {exc}"
                ) from None
            finally:
                ledger.close()


@contextmanager
def _home_free(home: Path) -> Iterator[None]:
    """A shared flock on the home directory for one read (``is_locked`` probes the
    same way): a supervisor's ``HomeLock`` (exclusive) is refused while it is held,
    and retries for longer than a read takes. Raises ``HomeHeld`` if a supervisor
    has it, ``NotRunning`` if there is no home; ``HomeError`` (read nothing) if the
    home is not this user's alone."""
    homes.check_home(home)
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise _no_ledger(home) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HomeHeld(str(home)) from None
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


def _no_ledger(home: Path) -> homes.NotRunning:
    return homes.NotRunning(
        f"no supervisor is running on {home}, and it has no ledger to read (start one with `corral up`)"
    )


def _open(home: Path) -> Ledger:
    if remembered_placement(home).get("shown_url"):
        ledger: Ledger = open_for_reading(home)  # its PostgreSQL partition
        return ledger
    path = home / homes.LEDGER
    if not path.is_file():
        raise _no_ledger(home)
    wal = path.with_name(path.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        # Commits of a supervisor that did not stop cleanly are in the log only.
        ledger = open_for_reading(home)
        return ledger
    return SqliteLedger(path, immutable=True)


def _check_schema(ledger: Ledger) -> None:
    """The read functions query this corral's schema: a ledger of another one is
    refused with what to do, not answered with a missing column."""
    version, known = ledger.schema_version, len(MIGRATIONS)
    if version < known:
        raise LedgerUnreadable(f"{ledger.where} has schema {version}, older than this corral's ({known}):"
                               " `corral up` migrates it, then read through the supervisor")
    if version > known:
        raise LedgerUnreadable(f"{ledger.where} has schema {version}, newer than this corral's ({known}):"
                               " upgrade corral")


def _judge_mark(path: Path, ledger: SqliteLedger) -> dict[str, Any] | None:
    """What the answer must say when ``ledger`` (the file at ``path``, open for this
    read) is behind its high-water mark or the mark is damaged: the commits past
    its newest event were made durable and are gone from what is read. None: it
    holds every durable commit (or it has no mark yet)."""
    row = ledger.one("SELECT MAX(cursor) AS newest FROM events")
    holds = int(row["newest"] or 0) if row is not None else 0
    try:
        mark = high_water.read_mark(path)
    except high_water.MarkDamaged as exc:
        return {"mark": None, "holds": holds, "detail": f"the ledger's high-water mark is damaged ({exc})",
                "advice": high_water.what_to_do(path)}
    if mark is None or not high_water.behind(mark, holds):
        return None
    return {"mark": mark, "holds": holds, "detail": high_water.lost_commits(path, mark, holds),
            "advice": high_water.what_to_do(path)}


def warning_text(home: Path, behind: dict[str, Any]) -> str:
    """The loud line a reading client prints on stderr."""
    why = "is behind its high-water mark" if behind["mark"] is not None else "has a damaged high-water mark"
    return (f"corral: WARNING: the ledger of {home} {why}: what is read here may be missing runs and events"
            f" that were committed. {behind['detail']}. What to do: {behind['advice']}")

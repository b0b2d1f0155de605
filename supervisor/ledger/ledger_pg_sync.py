"""Group commit's flush for a PostgreSQL ledger: one synchronously committed write
on a connection of its own.

A node's transactions commit with ``synchronous_commit = off``; before any reply
leaves, ``GroupSync.flush`` makes one synchronous write, whose WAL flush covers
every earlier commit (the WAL is one sequence). It runs in a worker thread, so the
ledger's own connection stays free meanwhile. On a new connection (the first, or
after a lost one) it also reads the commit marker: the server must still hold every
commit the writer was told of.

That write is fenced like every other of the writer's: the statement that bumps the
counter checks the epoch itself, so it takes the partition's row ``FOR SHARE`` in
its own transaction. A node that was taken over while it waited to sync commits
nothing here, and stops. supervisor/ledger/ledger_pg.py owns it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.supervisor.ledger.ledger_link import LedgerUnavailable, connection_lost
from corral.supervisor.ledger.ledger_pg_cluster import CLUSTER_SCHEMA, FENCE_SQLSTATE
from corral.supervisor.ledger.ledger_pg_wire import PostgresUnavailable, connect


def markers_of(conn: Any, schema: str) -> dict[str, int]:
    """The partition's commit markers (``corral_meta``'s ``commit_seq``, one per
    connection of its writer: supervisor/ledger/ledger_pg_pool.py) as ``conn`` sees them."""
    rows = conn.execute(f"SELECT key, value FROM {schema}.corral_meta WHERE key LIKE 'commit\\_seq%%'").fetchall()
    return {str(row[0]): int(row[1]) for row in rows}


def sync_sql(partition: str, epoch: int | None) -> str:
    """Group commit's write: the counter bumped, in one statement (one implicit
    transaction) with the epoch check when the writer is fenced. The check is the
    epoch alone: a lapsed lease nobody took over only delays a flush of commits
    that were fenced when they were made. The partition name is checked by
    schema_of (letters, digits, - and _ only)."""
    bump = "UPDATE corral_meta SET value = value + 1"
    if epoch is None:
        return f"{bump} WHERE key = 'syncs'"
    fence = f"{CLUSTER_SCHEMA}.fence('{partition}', {int(epoch)})"
    return f"{bump} FROM (SELECT {fence}) AS fenced WHERE key = 'syncs'"


class GroupSync:
    """The flushing connection of one writer (``corral-sync:PARTITION``)."""

    def __init__(
        self,
        url: str,
        partition: str,
        schema: str,
        epoch: int | None,
        *,
        where: str,
        timeout: int,
        fence: Callable[[str], None],
        diverged: Callable[[str], None],
    ) -> None:
        self.url = url
        self.partition = partition
        self.schema = schema
        self.epoch = epoch
        self.where = where
        self.timeout = timeout
        #: Called with why, when the flush found the partition taken over (raises).
        self.fence = fence
        #: Called with why, when the server lacks commits the writer was told of (raises).
        self.diverged = diverged
        self.statement = sync_sql(partition, epoch)
        self.conn: Any = None

    def flush(self, told: dict[str, int]) -> None:
        """One synchronous write; ``told``: the last commit marker the writer was told
        of, per marker key."""
        import psycopg

        conn = self.conn
        try:
            fresh = conn is None
            if conn is None:
                conn = connect(self.url, f"corral-sync:{self.partition}", timeout=self.timeout)
                self.conn = conn
                conn.execute(f"SET search_path TO {self.schema}, public")
            conn.execute(self.statement)
            if fresh and self.epoch is not None:
                held = markers_of(conn, self.schema)
                for key, seq in sorted(told.items()):
                    if held.get(key, 0) < seq:
                        self.diverged(
                            f"it holds commit {held.get(key, 0)} of {key}, and this writer was told of commit {seq}"
                        )
        except PostgresUnavailable as exc:
            raise LedgerUnavailable(f"{self.where}: group commit cannot reach the server ({exc})") from None
        except psycopg.Error as exc:
            self.conn = None
            try:
                conn.close()
            except Exception:
                pass
            if getattr(exc, "sqlstate", None) == FENCE_SQLSTATE:
                self.fence(str(exc.diag.message_primary or exc).removeprefix("corral-fenced: "))
            if not connection_lost(exc, conn):
                raise
            raise LedgerUnavailable(f"{self.where}: group commit lost its connection ({exc})") from None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

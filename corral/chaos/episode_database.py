"""A database of its own for each chaos episode on a shared PostgreSQL server.

Every node keeps renewing the partitions it holds or adopted, so the episodes of
a three-node campaign cannot share one database: each gets a fresh one (CREATE
DATABASE on the URL's server, as the URL's user) and it is dropped after the
episode, its nodes gone or not (``WITH (FORCE)`` ends what still holds it).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any
from urllib.parse import urlsplit

from corral.core.errors import CorralError
from corral.supervisor.ledger.ledger_pg_wire import connect, redact_url


class EpisodeDatabaseError(CorralError, RuntimeError):
    """The URL's user may not create (or drop) databases on its server."""


def with_database(url: str, name: str) -> str:
    """``url`` naming database ``name`` instead of its own (host, user and options kept)."""
    parts = urlsplit(url)
    # Written out, not urlunsplit: that drops the empty host of postgresql:///db?host=/socket.
    return f"{parts.scheme}://{parts.netloc}/{name}" + (f"?{parts.query}" if parts.query else "")


def database_name(campaign: str, index: int) -> str:
    """An episode's database: this campaign's (its pid and seed) and the episode's index."""
    return f"corral_chaos_{campaign}_e{index:04d}"


def _admin(url: str) -> Any:
    return connect(url, "corral-chaos-admin")


def create(url: str, name: str) -> str:
    """Create database ``name`` on ``url``'s server; returns its URL. An existing one
    of that name (a campaign killed before it dropped it) is dropped first."""
    conn = _admin(url)
    try:
        try:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        except Exception as exc:  # psycopg's InsufficientPrivilege, among others
            raise EpisodeDatabaseError(
                f"--nodes needs a database of its own for each episode, and {redact_url(url)} could not create"
                f" one ({type(exc).__name__}: {str(exc).strip()[:300]}); give that user CREATEDB"
                " (ALTER ROLE ... CREATEDB), or run with --nodes 1"
            ) from None
    finally:
        conn.close()
    return with_database(url, name)


def drop(url: str, name: str) -> None:
    """Drop database ``name`` (ending any connection still on it); a failure is not
    raised: the episode's verdict stands, and the next campaign drops it first."""
    with contextlib.suppress(Exception):
        conn = _admin(url)
        try:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            conn.close()


def check_allowed(url: str) -> None:
    """Create and drop a probe database, so a user without CREATEDB hears so before
    any episode starts (``EpisodeDatabaseError``, with what to do)."""
    name = f"corral_chaos_probe_{os.getpid()}"
    create(url, name)
    drop(url, name)

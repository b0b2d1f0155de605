"""Ledger schema migrations, versioned with ``PRAGMA user_version``.

Append a new entry to ``MIGRATIONS`` for every change; never edit a shipped one.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: the actor substrate
    """
    CREATE TABLE boots (
        boot_id     TEXT PRIMARY KEY,
        seq         INTEGER NOT NULL UNIQUE,
        pid         INTEGER NOT NULL,
        protocol    INTEGER NOT NULL,
        started_at  REAL NOT NULL,
        ended_at    REAL,
        end_reason  TEXT
    );
    CREATE TABLE groups (
        group_id    TEXT PRIMARY KEY,
        strategy    TEXT NOT NULL,
        status      TEXT NOT NULL,
        reason      TEXT,
        boot_id     TEXT NOT NULL,
        updated_at  REAL NOT NULL
    );
    CREATE TABLE actors (
        actor_id     TEXT PRIMARY KEY,
        group_id     TEXT NOT NULL,
        template     TEXT NOT NULL,
        spec_json    TEXT NOT NULL,
        status       TEXT NOT NULL,
        restarts     INTEGER NOT NULL DEFAULT 0,
        incarnation  INTEGER NOT NULL DEFAULT 0,
        pid          INTEGER,
        last_exit    INTEGER,
        last_exit_at REAL,
        boot_id      TEXT NOT NULL,
        updated_at   REAL NOT NULL
    );
    CREATE TABLE events (
        cursor   INTEGER PRIMARY KEY AUTOINCREMENT,
        at       REAL NOT NULL,
        boot_id  TEXT NOT NULL,
        kind     TEXT NOT NULL,
        subject  TEXT NOT NULL,
        data     TEXT NOT NULL
    );
    CREATE TRIGGER events_append_only_u BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
    CREATE TRIGGER events_append_only_d BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
    """,
]

"""Raw SQLite in WAL mode: the limit of a single-writer durable ledger on this disk."""

from __future__ import annotations

import sqlite3
import time

from bench.harness import Context, Metrics, repeat, workload

SCHEMA = """
CREATE TABLE actions (id TEXT PRIMARY KEY, phase TEXT NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE events (
    cursor INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL, kind TEXT NOT NULL, subject TEXT NOT NULL, body BLOB
);
"""
ACTIONS = 64


@workload("sqlite_wal", group="limits", budget_s=90, quick_budget_s=15)
def sqlite_wal(ctx: Context) -> Metrics:
    """Transitions/s: UPDATE a phase + INSERT an event per transition, committed (WAL)."""
    out: Metrics = ctx.metrics
    round_s = 0.25 if ctx.quick else 1.0
    rounds = ctx.reps(3, 7)
    body = b"x" * 200
    configs = [(sync, batch) for sync in ("FULL", "NORMAL") for batch in (1, 8)]
    for index, (sync, batch) in enumerate(configs):
        path = ctx.tmp / f"ledger-{sync.lower()}-{batch}.sqlite3"
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={sync}")
            conn.executescript(SCHEMA)
            conn.executemany(
                "INSERT INTO actions VALUES (?, 'prepared', 0)",
                [(f"a{i}",) for i in range(ACTIONS)],
            )
            step = [0]

            def one_round(
                conn: sqlite3.Connection = conn, batch: int = batch, step: list[int] = step
            ) -> float:
                done = 0
                t0 = time.perf_counter()
                end = t0 + round_s
                while time.perf_counter() < end:
                    conn.execute("BEGIN IMMEDIATE")
                    for _ in range(batch):
                        i = step[0] = step[0] + 1
                        now = time.time()
                        conn.execute(
                            "UPDATE actions SET phase = ?, updated_at = ? WHERE id = ?",
                            ("executing" if i % 2 else "ok", now, f"a{i % ACTIONS}"),
                        )
                        conn.execute(
                            "INSERT INTO events (at, kind, subject, body) VALUES (?, ?, ?, ?)",
                            (now, "action.phase", f"a{i % ACTIONS}", body),
                        )
                    conn.execute("COMMIT")
                    done += batch
                return done / (time.perf_counter() - t0)

            key = f"{sync.lower()}_{'1' if batch == 1 else f'group{batch}'}"
            share = time.monotonic() + ctx.remaining() / (len(configs) - index + 0.5)
            out[key] = repeat(one_round, rounds, unit="per s", warmup=1, deadline=share)
        finally:
            conn.close()
    ctx.note("one transition = UPDATE + INSERT; group8 = 8 transitions per COMMIT")
    ctx.note(f"database in {ctx.tmp} (same filesystem as the repository here)")
    return out

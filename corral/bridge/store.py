"""The bridge's ledger: one SQLite WAL database, one transaction per command.

``Store.execute`` is the one path every JSON-RPC call takes:

1. the parameters are checked against the method's JSON Schema;
2. a mutating call is looked up by ``(principal, idempotency_key)`` first: a
   committed receipt is returned as it is, and the same key with other
   parameters (by RFC 8785 digest) is an ``idempotency-conflict``;
3. the command runs inside ``BEGIN IMMEDIATE``; its facts, events, audit row and
   receipt commit together (``synchronous = FULL``), or nothing does;
4. a lease found past its deadline rolls the command back, is materialised once
   in its own transaction (assignment expired, run ended, task open again, one
   revision), and the caller gets ``stale``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

from corral.bridge.model import BridgeError
from corral.core import failpoints, strict_json

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('auth_epoch', 0);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, owner TEXT NOT NULL, issuer TEXT NOT NULL, decider TEXT NOT NULL,
    title TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL, revision INTEGER NOT NULL,
    parent_id TEXT, lease_ms INTEGER NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS relations (child_id TEXT PRIMARY KEY, parent_id TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS grants (
    grant_id TEXT PRIMARY KEY, task_id TEXT NOT NULL, principal TEXT NOT NULL, permissions TEXT NOT NULL,
    lease_cap_ms INTEGER, status TEXT NOT NULL, granted_by TEXT NOT NULL, auth_epoch INTEGER NOT NULL,
    created_at INTEGER NOT NULL, revoked_at INTEGER);
CREATE INDEX IF NOT EXISTS grants_by_task ON grants (task_id, principal);
CREATE TABLE IF NOT EXISTS bindings (
    binding_id TEXT PRIMARY KEY, principal TEXT NOT NULL, status TEXT NOT NULL, lease_cap_ms INTEGER,
    created_at INTEGER NOT NULL, disabled_at INTEGER);
CREATE TABLE IF NOT EXISTS assignments (
    assignment_id TEXT PRIMARY KEY, task_id TEXT NOT NULL, principal TEXT NOT NULL, binding_id TEXT NOT NULL,
    grant_id TEXT, status TEXT NOT NULL, lease_deadline INTEGER NOT NULL, created_at INTEGER NOT NULL,
    ended_at INTEGER);
CREATE INDEX IF NOT EXISTS assignments_by_task ON assignments (task_id, status);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, assignment_id TEXT NOT NULL UNIQUE, task_id TEXT NOT NULL, status TEXT NOT NULL,
    created_at INTEGER NOT NULL, ended_at INTEGER);
CREATE TABLE IF NOT EXISTS reports (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS submissions (
    submission_id TEXT PRIMARY KEY, run_id TEXT NOT NULL UNIQUE, assignment_id TEXT NOT NULL,
    task_id TEXT NOT NULL, result TEXT NOT NULL, at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
    decision_id TEXT PRIMARY KEY, submission_id TEXT NOT NULL UNIQUE, task_id TEXT NOT NULL,
    decider TEXT NOT NULL, verdict TEXT NOT NULL, reason TEXT NOT NULL, at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS receipts (
    principal TEXT NOT NULL, key TEXT NOT NULL, method TEXT NOT NULL, digest TEXT NOT NULL,
    result TEXT NOT NULL, at INTEGER NOT NULL, PRIMARY KEY (principal, key));
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, at INTEGER NOT NULL, task_id TEXT NOT NULL, kind TEXT NOT NULL,
    revision INTEGER NOT NULL, principal TEXT NOT NULL, request_id TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_by_task ON events (task_id, seq);
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY, at INTEGER NOT NULL, principal TEXT NOT NULL, method TEXT NOT NULL,
    request_id TEXT NOT NULL, outcome TEXT NOT NULL, reason TEXT NOT NULL);
"""

#: The schema's migrations, in order; ``PRAGMA user_version`` counts those applied.
#: Each runs in one transaction with its version bump; a database written by a
#: newer bridge (a higher version) is refused rather than guessed at.
MIGRATIONS: tuple[str, ...] = (
    SCHEMA,
    # 2 (issue 32): task.discover walked every grant of the caller, joined to its
    # task, to find the few still open (SCAN g): 19 ms per call at 10,000 tasks, and
    # growing. Open tasks by status, each checked by grants_by_task, stay cheap.
    # The other lookups by a column (ending a grant's or a binding's assignment,
    # a task's runs, submissions and children, a principal's bindings) were scans too.
    """
    CREATE INDEX IF NOT EXISTS tasks_by_status ON tasks (status, created_at);
    CREATE INDEX IF NOT EXISTS assignments_by_grant ON assignments (grant_id, status);
    CREATE INDEX IF NOT EXISTS assignments_by_binding ON assignments (binding_id, status);
    CREATE INDEX IF NOT EXISTS runs_by_task ON runs (task_id, created_at);
    CREATE INDEX IF NOT EXISTS submissions_by_task ON submissions (task_id, at);
    CREATE INDEX IF NOT EXISTS relations_by_parent ON relations (parent_id, created_at);
    CREATE INDEX IF NOT EXISTS bindings_by_principal ON bindings (principal, created_at);
    """,
)


class SchemaError(RuntimeError):
    pass


def migrate(db: sqlite3.Connection) -> int:
    """Apply the migrations this database lacks; its version after them."""
    while True:
        db.execute("BEGIN IMMEDIATE")  # another bridge on the same file waits here
        try:
            version = int(db.execute("PRAGMA user_version").fetchone()[0])
            if version > len(MIGRATIONS):
                raise SchemaError(f"the bridge database is at schema version {version}; this corral knows"
                                  f" {len(MIGRATIONS)} (a newer corral wrote it)")
            if version == len(MIGRATIONS):
                db.execute("COMMIT")
                return version
            for statement in _statements(MIGRATIONS[version]):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {version + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")


def _statements(script: str) -> list[str]:
    """A migration's statements (``executescript`` would commit the open transaction)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return [statement for statement in statements if statement]


#: Fixed limits of the M1 deployment; past one, a command fails with ``capacity``.
LIMITS = {"tasks": 100_000, "reports_per_run": 1_000, "receipts": 1_000_000}


def request_digest(method: str, params: dict[str, Any]) -> str:
    """What an idempotency key is bound to: SHA-256 of the RFC 8785 form of the
    method and its parameters without the key (tests/bridge/node_client.js
    computes the same)."""
    return strict_json.sha256({"method": method, "params": {k: v for k, v in params.items()
                                                            if k != "idempotency_key"}})


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int | None) -> str | None:
    """UTC with milliseconds: ``2026-12-04T09:00:00.123Z``."""
    if ms is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


class LeaseExpired(Exception):
    """Raised inside a command that met a lease past its deadline (rolled back,
    then materialised by the store)."""

    def __init__(self, assignment_id: str) -> None:
        super().__init__(assignment_id)
        self.assignment_id = assignment_id


@dataclass
class Call:
    """What a command sees: its principal, the request, a clock read once, and the
    open transaction's connection."""

    principal: str
    method: str
    request_id: str
    now: int
    db: sqlite3.Connection

    def one(self, sql: str, *args: Any) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.db.execute(sql, args).fetchone()
        return row

    def all(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        return list(self.db.execute(sql, args).fetchall())

    def event(self, task_id: str, kind: str, revision: int, **data: Any) -> None:
        self.db.execute(
            "INSERT INTO events (at, task_id, kind, revision, principal, request_id, data)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.now, task_id, kind, revision, self.principal, self.request_id, json.dumps(data, sort_keys=True)),
        )

    def count(self, table: str) -> int:
        """How many rows ``table`` holds, at most: M1 deletes no row, so the largest
        rowid is the count, found in the index (COUNT(*) walked every row, on every
        command)."""
        row = self.one(f"SELECT COALESCE(MAX(rowid), 0) AS n FROM {table}")
        return int(row["n"]) if row is not None else 0

    def auth_epoch(self) -> int:
        row = self.one("SELECT value FROM meta WHERE key = 'auth_epoch'")
        return int(row["value"]) if row else 0

    def bump_auth_epoch(self) -> int:
        self.db.execute("UPDATE meta SET value = value + 1 WHERE key = 'auth_epoch'")
        return self.auth_epoch()


Command = Callable[[Call, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Method:
    name: str
    run: Command
    params: dict[str, Any]
    mutating: bool
    cas: bool = False  # compares expected_revision
    lease_bound: bool = False  # needs a live assignment
    summary: str = ""
    result: dict[str, Any] | None = None  # the result's JSON Schema, checked before a reply


class Store:
    def __init__(self, path: Path, methods: dict[str, Method], expire: Callable[[Call, str], None]) -> None:
        self.path = path
        self.methods = methods
        self._expire = expire
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute("PRAGMA synchronous = FULL")
        migrate(self.db)
        self._validators = {
            name: jsonschema.Draft202012Validator(method.params) for name, method in methods.items()
        }
        self._results = {
            name: jsonschema.Draft202012Validator(method.result) for name, method in methods.items() if method.result
        }

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _tx(self, mode: str = "IMMEDIATE") -> Iterator[sqlite3.Connection]:
        self.db.execute(f"BEGIN {mode}")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def execute(self, principal: str, method_name: str, params: Any, request_id: str) -> dict[str, Any]:
        method = self.methods.get(method_name)
        if method is None:
            raise BridgeError("method-not-found", f"no method {method_name!r}")
        if not isinstance(params, dict):
            raise BridgeError("invalid-params", "params must be an object")
        problems = sorted(self._validators[method_name].iter_errors(params), key=lambda e: list(e.path))
        if problems:
            where = "/".join(str(part) for part in problems[0].path) or "params"
            raise BridgeError("invalid-params", f"{where}: {problems[0].message}")
        try:
            strict_json.check_numbers(params)
        except strict_json.StrictJsonError as exc:
            raise BridgeError("invalid-params", exc.message) from None
        if not method.mutating:
            with self._tx("DEFERRED") as db:  # one consistent read
                return self._checked(method, method.run(Call(principal, method_name, request_id, now_ms(), db),
                                                        params))
        return self._mutate(principal, method, params, request_id)

    def _checked(self, method: Method, result: dict[str, Any]) -> dict[str, Any]:
        """A result that breaks its own schema is a bug: nothing of it commits."""
        validator = self._results.get(method.name)
        if validator is not None:
            problem = next(iter(validator.iter_errors(result)), None)
            if problem is not None:
                where = "/".join(str(part) for part in problem.path) or "result"
                raise BridgeError("internal", f"{method.name} produced an invalid result at {where}: {problem.message}")
        return result

    def _mutate(self, principal: str, method: Method, params: dict[str, Any], request_id: str) -> dict[str, Any]:
        key = str(params["idempotency_key"])
        digest = request_digest(method.name, params)
        expired: str | None = None
        try:
            with self._tx() as db:
                call = Call(principal, method.name, request_id, now_ms(), db)
                kept = call.one("SELECT method, digest, result FROM receipts WHERE principal = ? AND key = ?",
                                principal, key)
                if kept is not None:
                    if kept["digest"] != digest or kept["method"] != method.name:
                        raise BridgeError("idempotency-conflict",
                                          f"key {key!r} was used for other parameters or another method")
                    result: dict[str, Any] = json.loads(kept["result"])
                    return result
                if call.count("receipts") >= LIMITS["receipts"]:
                    raise BridgeError("capacity", "the receipt store is full (M1 deletes no key)")
                result = self._checked(method, method.run(call, params))
                db.execute(
                    "INSERT INTO receipts (principal, key, method, digest, result, at) VALUES (?, ?, ?, ?, ?, ?)",
                    (principal, key, method.name, digest, json.dumps(result, sort_keys=True), call.now),
                )
                self._audit(call, "ok", str(params.get("reason") or ""))
                failpoints.hit("bridge.before-commit")
            failpoints.hit("bridge.after-commit")
            return result
        except LeaseExpired as exc:
            expired = exc.assignment_id
        except BridgeError as exc:
            self._audit_refusal(principal, method.name, request_id, exc)
            raise
        with self._tx() as db:
            call = Call(principal, method.name, request_id, now_ms(), db)
            self._expire(call, expired)
            self._audit(call, "stale", f"assignment {expired} expired")
        raise BridgeError("stale", f"assignment {expired} passed its lease deadline; it has ended",
                          assignment_id=expired)

    def _audit(self, call: Call, outcome: str, reason: str) -> None:
        call.db.execute(
            "INSERT INTO audit (at, principal, method, request_id, outcome, reason) VALUES (?, ?, ?, ?, ?, ?)",
            (call.now, call.principal, call.method, call.request_id, outcome, reason[:500]),
        )

    def _audit_refusal(self, principal: str, method: str, request_id: str, exc: BridgeError) -> None:
        with self._tx() as db:
            self._audit(Call(principal, method, request_id, now_ms(), db), exc.code, exc.message)

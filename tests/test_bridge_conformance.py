"""The task bridge against seed 002's conformance cases of issue 32 (beyond the
V-vectors in test_bridge.py): revocation, registration files, JSON-RPC notifications,
the bearer scheme, and the task scan as the database grows (docs/bridge.md)."""

from __future__ import annotations

import http.client
import json
import subprocess
from pathlib import Path
from typing import Any

from tests.bridge_harness import Bridge, claim_and_start, published, task_of
from tests.harness import CORRAL

# -- issue 32: seed 002 conformance, and the scan as the database grows -------------------


def _raw(bridge: Bridge, body: bytes, authorization: str) -> tuple[int, bytes]:
    port = int(bridge.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request("POST", "/rpc", body=body, headers={"Authorization": authorization,
                                                          "Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def test_a_revoke_that_ends_a_live_assignment_adds_exactly_one_revision(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = published(owner, ("A", ["claim", "read"]))
    assignment_id, _, revision = claim_and_start(a, task_id)
    cursor = owner.call("events.open")["watermark"]
    grant_id = owner.call("grant.list", task_id=task_id)["grants"][0]["grant_id"]
    revoked = owner.call("grant.revoke", task_id=task_id, expected_revision=revision, grant_id=grant_id,
                         reason="changed my mind")
    assert revoked["revision"] == revision + 1, "one transaction, one revision"
    task = task_of(owner, task_id)
    assert task["revision"] == revision + 1 and task["status"] == "open"
    events = owner.call("events.read", cursor=cursor)["events"]
    assert [(e["kind"], e["revision"]) for e in events] == [("grant.revoked", revision + 1)]
    assert events[0]["data"]["assignment_id"] == assignment_id and events[0]["data"]["grant_id"] == grant_id
    assert owner.call("assignment.get", assignment_id=assignment_id)["assignment"]["status"] == "revoked"
    # The next command sees that one revision, and a revoke with nothing to end adds one too.
    second = owner.call("grant.create", task_id=task_id, expected_revision=revision + 1, principal="B",
                        permissions=["read"])
    again = owner.call("grant.revoke", task_id=task_id, expected_revision=second["revision"],
                       grant_id=second["grant"]["grant_id"], reason="not needed")
    assert again["revision"] == second["revision"] + 1 == task_of(owner, task_id)["revision"]


def test_registration_files_are_refused_naming_the_file_and_the_entry(short_tmp: Path) -> None:
    import hashlib

    good = {"token": "good-token-0123456789"}
    cases = {
        "invalid name": ({"principals": {"ok": good, "bad name!": {"token": "other-token-0123456789"}}},
                         '"bad name!"', "not a principal name"),
        "both, disagreeing": ({"principals": {"alice": {"token": "alice-token-0123456789",
                                                        "token_sha256": hashlib.sha256(b"x").hexdigest()}}},
                              '"alice"', "disagree"),
        "unknown entry field": ({"principals": {"alice": {"token": "alice-token-0123456789", "admin": True}}},
                                '"alice"', "unknown field(s) ['admin']"),
        "unknown top field": ({"principals": {"alice": good}, "principal": {}}, "", "unknown field(s) ['principal']"),
        "bad digest": ({"principals": {"alice": {"token_sha256": "abc"}}}, '"alice"', "64 hex digits"),
    }
    for label, (data, entry, reason) in cases.items():
        path = short_tmp / f"{label.replace(' ', '-').replace(',', '')}.json"
        path.write_text(json.dumps(data))
        path.chmod(0o600)
        result = subprocess.run([*CORRAL, "bridge", "serve", "--db", str(short_tmp / "x.db"), "--listen",
                                 "127.0.0.1:0", "--principals", str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "bad --principals" in result.stderr, (label, result.stderr)
        assert str(path) in result.stderr and entry in result.stderr and reason in result.stderr, (label, result.stderr)
        assert "token-0123456789" not in result.stderr, "a token never reaches an error message"
    assert not (short_tmp / "x.db").exists(), "nothing served, nothing created"
    # Both fields that agree are one principal, as either alone would be.
    path = short_tmp / "agree.json"
    path.write_text(json.dumps({"principals": {"alice": {"token": "alice-token-0123456789", "token_sha256":
                                                         hashlib.sha256(b"alice-token-0123456789").hexdigest()}}}))
    path.chmod(0o600)
    from corral.bridge.server import load_principals

    assert list(load_principals(path).values()) == ["alice"]


def test_a_registration_file_others_can_read_is_refused_like_a_key_file(short_tmp: Path) -> None:
    """Issue 48, D.13: the file holds every principal's token, so it must be 0600 or
    stricter, as an ``api_key_file`` must: any group or other bit is refused (exit 2)
    before anything is served or created, naming the file, its mode and the fix."""
    path = short_tmp / "principals.json"
    path.write_text(json.dumps({"principals": {"alice": {"token": "alice-token-0123456789"}}}))
    for mode in (0o644, 0o640, 0o604, 0o660):
        path.chmod(mode)
        result = subprocess.run([*CORRAL, "bridge", "serve", "--db", str(short_tmp / "x.db"), "--listen",
                                 "127.0.0.1:0", "--principals", str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "bad --principals" in result.stderr, (oct(mode), result.stderr)
        assert str(path) in result.stderr and f"mode {mode:04o}" in result.stderr, (oct(mode), result.stderr)
        assert f"chmod 600 {path}" in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert "alice-token" not in result.stderr
    assert not (short_tmp / "x.db").exists(), "nothing served, nothing created"
    # 0600 and 0400 are the owner's alone: accepted.
    from corral.bridge.server import load_principals

    for mode in (0o600, 0o400):
        path.chmod(mode)
        assert list(load_principals(path).values()) == ["alice"]


def test_notifications_get_no_reply_and_a_batch_of_them_no_body(bridge: Bridge) -> None:
    owner = bridge.client("owner")
    bearer = f"Bearer {bridge.tokens['owner']}"
    note = {"jsonrpc": "2.0", "method": "task.create", "params": {"title": "by notification",
                                                                  "idempotency_key": "note-key-0001"}}
    status, body = _raw(bridge, json.dumps(note).encode(), bearer)
    assert (status, body) == (204, b""), "no reply to a notification"
    titles = [t["task"]["title"] for t in owner.call("snapshot.get")["tasks"]]
    assert titles == ["by notification"], "a notification is still executed"
    notes = [{"jsonrpc": "2.0", "method": "principal.whoami"}, {"jsonrpc": "2.0", "method": "no.such.method"}]
    assert _raw(bridge, json.dumps(notes).encode(), bearer) == (204, b""), "a batch of notifications: no body"
    mixed = [*notes, {"jsonrpc": "2.0", "id": "w", "method": "principal.whoami"}, {"jsonrpc": "2.0"}]
    status, body = _raw(bridge, json.dumps(mixed).encode(), bearer)
    replies = json.loads(body)
    assert status == 200 and [r["id"] for r in replies] == ["w", None], "only the requests are answered"
    assert replies[0]["result"]["principal"] == "owner" and replies[1]["error"]["code"] == -32600


def test_the_bearer_scheme_is_case_insensitive(bridge: Bridge) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "principal.whoami"}).encode()
    token = bridge.tokens["A"]
    for scheme in ("bearer", "BEARER", "Bearer", "bEaReR"):
        status, reply = _raw(bridge, body, f"{scheme} {token}")
        assert status == 200 and json.loads(reply)["result"]["principal"] == "A", (scheme, reply)
    for header in (f"Basic {token}", f"Bearer{token}", "Bearer ", token):
        assert _raw(bridge, body, header)[0] == 401, header


def _plan(db: Path, sql: str, *args: Any) -> list[str]:
    import sqlite3

    with sqlite3.connect(db) as conn:
        return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args)]


def test_task_discover_walks_the_live_tasks_by_an_index_added_by_a_migration(short_tmp: Path) -> None:
    """At 10,000 tasks discover scanned every grant the caller ever had (19 ms a
    call, growing): the index comes with schema migration 2, also to a database
    written before it, and the query plan uses it."""
    import sqlite3

    from corral.bridge.commands import DISCOVER_SQL
    from corral.bridge.store import MIGRATIONS, SCHEMA

    daemon = Bridge(short_tmp)
    with sqlite3.connect(daemon.db) as old:  # a database of the first schema, as the bridge wrote it before
        old.executescript(SCHEMA)
    assert "tasks_by_status" not in str(_plan(daemon.db, DISCOVER_SQL, "A", 100))
    daemon.start()
    try:
        owner, a = daemon.client("owner"), daemon.client("A")
        task_id = published(owner, ("A", ["claim"]))
        assert [t["task_id"] for t in a.call("task.discover")["tasks"]] == [task_id]
    finally:
        daemon.stop()
    with sqlite3.connect(daemon.db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    plan = _plan(daemon.db, DISCOVER_SQL, "A", 100)
    assert any("USING INDEX tasks_by_status" in step for step in plan), plan
    assert not any(step.startswith("SCAN") for step in plan), plan
    # The other lookups by a column use theirs too.
    for sql in ("SELECT * FROM assignments WHERE grant_id = ? AND status = 'active'",
                "SELECT * FROM assignments WHERE binding_id = ? AND status = 'active'",
                "SELECT * FROM runs WHERE task_id = ? ORDER BY created_at",
                "SELECT * FROM submissions WHERE task_id = ? ORDER BY at",
                "SELECT child_id FROM relations WHERE parent_id = ? ORDER BY created_at",
                "SELECT * FROM bindings WHERE principal = ? ORDER BY created_at"):
        assert not any(step.startswith("SCAN") for step in _plan(daemon.db, sql, "x")), sql


def test_a_database_from_a_newer_bridge_is_refused(short_tmp: Path) -> None:
    import sqlite3

    from corral.bridge.store import MIGRATIONS

    daemon = Bridge(short_tmp)
    with sqlite3.connect(daemon.db) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    result = subprocess.run([*CORRAL, "bridge", "serve", "--db", str(daemon.db), "--listen", "127.0.0.1:0",
                             "--principals", str(daemon.registration)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "newer corral" in result.stderr and "Traceback" not in result.stderr

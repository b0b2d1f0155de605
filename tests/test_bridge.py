"""The agent-task bridge, black-box against the running daemon: the H01 handoff
across independent clients, and the V-vectors (fault and race cases), each named
with the invariant it checks (docs/bridge.md). Seed 002's further conformance
cases are in test_bridge_conformance.py."""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from corral.bridge import BridgeCallError, Client
from tests.bridge_harness import Bridge, claim_and_start, published, refusal, task_of
from tests.harness import CORRAL

NODE_CLIENT = Path(__file__).resolve().parent / "bridge" / "node_client.js"


class NodeClient:
    """The independent Node client (tests/bridge/node_client.js), one process,
    one JSON-RPC call per line."""

    def __init__(self, url: str, token: str) -> None:
        node = shutil.which("node")
        assert node is not None, "Node is needed for the second client (apt-get install nodejs)"
        self.process = subprocess.Popen([node, str(NODE_CLIENT), url, token], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"method": method, "params": params}) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self.process.stdout.readline())
        if "error" in reply:
            data = dict(reply["error"].get("data") or {})
            raise BridgeCallError(reply["error"]["code"], str(data.pop("reason", "")), reply["error"]["message"], data)
        result: dict[str, Any] = reply["result"]
        return result

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=20) == 0


# -- H01: the handoff, end to end ------------------------------------------------------


def test_h01_a_task_handed_across_independent_clients_and_recovered_by_a_reader(bridge: Bridge) -> None:
    owner, a, reader, decider = (bridge.client(n) for n in ("owner", "A", "R", "D"))
    b = NodeClient(bridge.url, bridge.tokens["B"])  # B is the other, independent client
    try:
        _h01(owner, a, b, reader, decider)
    finally:
        b.close()


def _h01(owner: Client, a: Client, b: Any, reader: Client, decider: Client) -> None:
    # 1. The owner creates and publishes P (A may claim it, R may read it).
    parent = published(owner, ("A", ["claim", "read"]), ("R", ["read"]))
    # 2. A discovers, claims and starts P, creates the child C with its own grants, publishes it.
    assert [t["task_id"] for t in a.call("task.discover")["tasks"]] == [parent]
    _, _, parent_revision = claim_and_start(a, parent)
    child = a.call("task.createChild", parent_id=parent, expected_revision=parent_revision, title="C",
                   decider="D", publish=True,
                   grants=[{"principal": "B", "permissions": ["claim", "read"]},
                           {"principal": "R", "permissions": ["read"]}])["task"]
    assert child["owner"] == "owner" and child["issuer"] == "A" and child["status"] == "open"
    assert task_of(a, parent)["revision"] == parent_revision, "createChild leaves the parent's revision alone"
    # 3. B discovers, claims, starts and reports C, then submits it.
    assert [t["task_id"] for t in b.call("task.discover")["tasks"]] == [child["task_id"]]
    _, run_id, revision = claim_and_start(b, child["task_id"])  # type: ignore[arg-type]
    revision = b.call("run.report", task_id=child["task_id"], expected_revision=revision, run_id=run_id,
                      body={"progress": 50})["revision"]
    submitted = b.call("run.submit", task_id=child["task_id"], expected_revision=revision, run_id=run_id,
                       result={"summary": "C done", "artifacts": [{"uri": "file:///out/c.txt"}]})
    # 4. The named principal decides on B's submission.
    decided = decider.call("decision.make", task_id=child["task_id"], expected_revision=submitted["revision"],
                           submission_id=submitted["submission"]["submission_id"], verdict="accept",
                           reason="meets the checks")
    assert task_of(decider, child["task_id"])["status"] == "accepted"
    # 5. R recovers the same facts from the snapshot, and the history from events.
    snapshot = reader.call("snapshot.get")
    by_id = {entry["task"]["task_id"]: entry for entry in snapshot["tasks"]}
    assert set(by_id) == {parent, child["task_id"]}
    assert by_id[child["task_id"]]["task"]["revision"] == decided["revision"]
    assert by_id[child["task_id"]]["submissions"][0]["decision"]["verdict"] == "accept"
    assert by_id[parent]["children"] == [child["task_id"]]
    opened = reader.call("events.open")
    events, cursor = [], opened["cursor"]
    while cursor < opened["watermark"]:
        page = reader.call("events.read", cursor=cursor, limit=3)
        events += page["events"]
        cursor = page["cursor"]
    for task_id, entry in by_id.items():
        mine = [e for e in events if e["task_id"] == task_id]
        # Replaying the history reaches the snapshot's revision, one revision per fact.
        assert [e["revision"] for e in mine] == list(range(1, entry["task"]["revision"] + 1)), task_id
    assert snapshot["watermark"] == opened["watermark"] == events[-1]["seq"]
    audit = b.call("audit.read")["audit"]
    assert [row["method"] for row in audit if row["outcome"] == "ok"][-2:] == ["run.report", "run.submit"]


# -- V-vectors ----------------------------------------------------------------------------


def test_v01_concurrent_claims_have_exactly_one_winner(bridge: Bridge) -> None:
    owner = bridge.client("owner")
    task_id = published(owner, ("A", ["claim"]), ("B", ["claim"]))
    revision = task_of(owner, task_id)["revision"]
    outcomes: dict[str, str] = {}

    def claim(name: str) -> None:
        client = bridge.client(name)
        binding = client.call("binding.enable")["binding"]["binding_id"]
        try:
            client.call("assignment.claim", task_id=task_id, expected_revision=revision, binding_id=binding)
            outcomes[name] = "won"
        except BridgeCallError as exc:
            outcomes[name] = exc.reason

    threads = [threading.Thread(target=claim, args=(name,)) for name in ("A", "B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes.values()) == ["revision-conflict", "won"], outcomes
    assert len(owner.call("task.get", task_id=task_id)["assignments"]) == 1


def test_v02_a_stale_revision_is_refused_with_the_current_one(bridge: Bridge) -> None:
    owner = bridge.client("owner")
    task_id = published(owner, ("A", ["claim"]))
    current = task_of(owner, task_id)["revision"]
    refused = refusal("revision-conflict", lambda: owner.call("task.cancel", task_id=task_id,
                                                               expected_revision=current - 1, reason="old view"))
    assert refused.data["current_revision"] == current
    assert task_of(owner, task_id)["status"] == "open"


def test_v03_a_lease_that_expires_before_start_is_materialised_once_as_stale(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = published(owner, ("A", ["claim", "read"]))
    binding = a.call("binding.enable")["binding"]["binding_id"]
    claimed = a.call("assignment.claim", task_id=task_id, expected_revision=task_of(a, task_id)["revision"],
                     binding_id=binding, lease_ms=1000)
    time.sleep(1.1)
    start = {"task_id": task_id, "expected_revision": claimed["revision"],
             "assignment_id": claimed["assignment"]["assignment_id"]}
    refusal("stale", lambda: a.call("run.start", **start))
    after = task_of(a, task_id)
    assert after["status"] == "open" and after["revision"] == claimed["revision"] + 1
    # Materialised once: the next command is not stuck on the same expiry.
    refused = refusal("revision-conflict", lambda: a.call("run.start", **start))
    assert refused.data["current_revision"] == after["revision"]
    refusal("invalid-state", lambda: a.call("run.start", **{**start, "expected_revision": after["revision"]}))
    assert task_of(a, task_id)["revision"] == after["revision"]


def test_v04_a_lease_that_expires_before_submit_leaves_no_submission(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = published(owner, ("A", ["claim", "read"]))
    _, run_id, revision = claim_and_start(a, task_id, lease_ms=1000)
    time.sleep(1.1)
    refusal("stale", lambda: a.call("run.submit", task_id=task_id, expected_revision=revision, run_id=run_id,
                                     result={"summary": "late"}))
    shown = a.call("task.get", task_id=task_id)
    assert shown["submissions"] == [] and shown["task"]["status"] == "open"
    assert a.call("run.get", run_id=run_id)["run"]["status"] == "ended"


def test_v05_v06_an_idempotency_key_returns_its_receipt_and_refuses_other_params(bridge: Bridge) -> None:
    owner = bridge.client("owner")
    first = owner.call("task.create", title="once", idempotency_key="key-create-0001")
    again = owner.call("task.create", title="once", idempotency_key="key-create-0001")
    assert again == first, "a retry gets the committed receipt as it was"
    assert len(owner.call("snapshot.get")["tasks"]) == 1, "and no second task"
    refusal("idempotency-conflict",
             lambda: owner.call("task.create", title="other", idempotency_key="key-create-0001"))
    # Keys are per principal: another caller's same key is its own.
    bridge.client("A").call("task.create", title="mine", idempotency_key="key-create-0001")


def test_v07_a_grant_revoked_mid_run_ends_the_assignment_and_refuses_the_submit(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = published(owner, ("A", ["claim", "read"]))
    _, run_id, revision = claim_and_start(a, task_id)
    grant_id = owner.call("grant.list", task_id=task_id)["grants"][0]["grant_id"]
    revoked = owner.call("grant.revoke", task_id=task_id, expected_revision=revision, grant_id=grant_id,
                         reason="changed my mind")
    assert revoked["auth_epoch"] >= 1
    task = task_of(owner, task_id)
    assert task["status"] == "open"
    refused = refusal("invalid-state", lambda: a.call("run.submit", task_id=task_id,
                                                       expected_revision=task["revision"], run_id=run_id,
                                                       result={"summary": "too late"}))
    assert refused.data["status"] == "revoked"
    assert owner.call("task.get", task_id=task_id)["assignments"][0]["status"] == "revoked"


def test_v08_a_disabled_binding_stays_dead_and_re_enabling_makes_a_new_one(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = published(owner, ("A", ["claim", "read"]))
    assignment_id, run_id, _ = claim_and_start(a, task_id)
    old = a.call("assignment.get", assignment_id=assignment_id)["assignment"]["binding_id"]
    disabled = a.call("binding.disable", binding_id=old, reason="rotating")
    assert disabled["ended_assignments"] == [assignment_id]
    fresh = a.call("binding.enable")["binding"]["binding_id"]
    assert fresh != old
    assert a.call("assignment.get", assignment_id=assignment_id)["assignment"]["status"] == "revoked"
    revision = task_of(a, task_id)["revision"]
    refusal("forbidden", lambda: a.call("assignment.claim", task_id=task_id, expected_revision=revision,
                                         binding_id=old))
    refusal("invalid-state", lambda: a.call("run.submit", task_id=task_id, expected_revision=revision,
                                             run_id=run_id, result={"summary": "x"}))
    a.call("assignment.claim", task_id=task_id, expected_revision=revision, binding_id=fresh)


def test_v09_a_submission_is_decided_once_and_a_rejection_opens_a_redo(bridge: Bridge) -> None:
    owner, a, decider = bridge.client("owner"), bridge.client("A"), bridge.client("D")
    task_id = published(owner, ("A", ["claim", "read"]))
    _, run_id, revision = claim_and_start(a, task_id)
    submitted = a.call("run.submit", task_id=task_id, expected_revision=revision, run_id=run_id,
                       result={"summary": "first try"})
    sub_id = submitted["submission"]["submission_id"]
    refusal("forbidden", lambda: a.call("decision.make", task_id=task_id, expected_revision=submitted["revision"],
                                         submission_id=sub_id, verdict="accept", reason="self-approval"))
    rejected = decider.call("decision.make", task_id=task_id, expected_revision=submitted["revision"],
                            submission_id=sub_id, verdict="reject", reason="missing tests")
    refusal("invalid-state", lambda: decider.call("decision.make", task_id=task_id,
                                                   expected_revision=rejected["revision"], submission_id=sub_id,
                                                   verdict="accept", reason="changed"))
    # The redo: a new assignment, run and submission.
    _, second_run, revision = claim_and_start(a, task_id)
    assert second_run != run_id
    a.call("run.submit", task_id=task_id, expected_revision=revision, run_id=second_run,
           result={"summary": "second try"})
    assert len(a.call("task.get", task_id=task_id)["submissions"]) == 2


def test_v10_create_child_needs_the_owner_or_the_live_assignee(bridge: Bridge) -> None:
    owner, a, x = bridge.client("owner"), bridge.client("A"), bridge.client("X")
    task_id = published(owner, ("A", ["claim", "read"]), ("X", ["read"]))
    revision = task_of(owner, task_id)["revision"]
    for outsider in (x, a):  # A holds a claim grant but no live assignment yet
        refusal("forbidden", lambda who=outsider: who.call("task.createChild", parent_id=task_id,
                                                            expected_revision=revision, title="not mine"))
    assert owner.call("task.get", task_id=task_id)["children"] == []
    _, _, revision = claim_and_start(a, task_id)
    a.call("task.createChild", parent_id=task_id, expected_revision=revision, title="mine now")
    assert len(owner.call("task.get", task_id=task_id)["children"]) == 1


def test_v11_parent_grants_give_nothing_on_a_child_and_a_child_timeout_spares_the_parent(bridge: Bridge) -> None:
    owner, a, b = bridge.client("owner"), bridge.client("A"), bridge.client("B")
    parent = published(owner, ("A", ["claim", "read"]), ("B", ["claim", "read"]))
    _, parent_run, revision = claim_and_start(a, parent)
    child = a.call("task.createChild", parent_id=parent, expected_revision=revision, title="C", publish=True,
                   grants=[{"principal": "B", "permissions": ["claim", "read"]}])["task"]["task_id"]
    # A's claim grant on P does not make C claimable by A.
    assert child not in [t["task_id"] for t in a.call("task.discover")["tasks"]]
    refusal("forbidden", lambda: task_of(bridge.client("X"), child))
    _, child_run, child_revision = claim_and_start(b, child, lease_ms=1000)
    time.sleep(1.1)
    refusal("stale", lambda: b.call("run.report", task_id=child, expected_revision=child_revision,
                                     run_id=child_run, body={"late": True}))
    # Only C's assignment ended; P's run goes on.
    assert task_of(owner, child)["status"] == "open"
    parent_task = task_of(owner, parent)
    assert parent_task["status"] == "running" and parent_task["revision"] == revision
    a.call("run.report", task_id=parent, expected_revision=revision, run_id=parent_run, body={"child": "timed out"})


def test_v12_a_re_claim_by_the_other_agent_after_release(bridge: Bridge) -> None:
    owner, a, b = bridge.client("owner"), bridge.client("A"), bridge.client("B")
    q = published(owner, ("A", ["claim", "read"]), ("B", ["claim", "read"]))
    assignment_id, _, revision = claim_and_start(a, q)
    released = a.call("assignment.release", task_id=q, expected_revision=revision, assignment_id=assignment_id,
                      reason="handing over")
    assert [t["task_id"] for t in b.call("task.discover")["tasks"]] == [q]
    claim_and_start(b, q)
    assert task_of(owner, q)["revision"] > released["revision"]
    # The re-claim does not widen a child's candidates: B, now Q's holder, creates C
    # for X alone; neither A (allowed on Q) nor B itself may claim C.
    revision = task_of(owner, q)["revision"]
    child = b.call("task.createChild", parent_id=q, expected_revision=revision, title="C", publish=True,
                   grants=[{"principal": "X", "permissions": ["claim"]}])["task"]["task_id"]
    assert child not in [t["task_id"] for t in a.call("task.discover")["tasks"]]
    assert child not in [t["task_id"] for t in b.call("task.discover")["tasks"]]
    assert [t["task_id"] for t in bridge.client("X").call("task.discover")["tasks"]] == [child]


def test_v13_leases_are_capped_by_the_grant_and_the_binding(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = owner.call("task.create", title="capped", lease_ms=600_000, publish=True)["task"]["task_id"]
    owner.call("grant.create", task_id=task_id, expected_revision=1, principal="A", permissions=["claim"],
               lease_cap_ms=120_000)
    binding = a.call("binding.enable", lease_cap_ms=30_000)["binding"]["binding_id"]
    claimed = a.call("assignment.claim", task_id=task_id, expected_revision=2, binding_id=binding)
    deadline = time.mktime(time.strptime(claimed["assignment"]["lease_deadline"][:19], "%Y-%m-%dT%H:%M:%S"))
    assert deadline - time.mktime(time.gmtime()) <= 31


def test_v14_history_needs_current_read_permission(bridge: Bridge) -> None:
    owner, a, reader = bridge.client("owner"), bridge.client("A"), bridge.client("R")
    task_id = published(owner, ("A", ["claim", "read"]), ("R", ["read"]))
    _, run_id, revision = claim_and_start(a, task_id)
    submitted = a.call("run.submit", task_id=task_id, expected_revision=revision, run_id=run_id,
                       result={"summary": "secret result"})
    sub_id = submitted["submission"]["submission_id"]
    assert reader.call("submission.get", submission_id=sub_id)["submission"]["result"]["summary"] == "secret result"
    grant = next(g for g in owner.call("grant.list", task_id=task_id)["grants"] if g["principal"] == "R")
    owner.call("grant.revoke", task_id=task_id, expected_revision=submitted["revision"], grant_id=grant["grant_id"],
               reason="no longer a reader")
    refusal("forbidden", lambda: reader.call("submission.get", submission_id=sub_id))
    assert reader.call("events.read", cursor=0)["events"] == [], "past events are not a right to read"


def test_v15_bad_requests_get_a_clear_error_and_change_nothing(bridge: Bridge) -> None:
    owner = bridge.client("owner")
    port = int(bridge.url.rsplit(":", 1)[1])
    before = owner.call("events.open")["watermark"]

    def raw(body: bytes, token: str | None = bridge.tokens["owner"]) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        try:
            headers = {"Content-Type": "application/json"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            conn.request("POST", "/rpc", body=body, headers=headers)
            reply = conn.getresponse()
            text = reply.read()
            return reply.status, json.loads(text) if text.startswith((b"{", b"[")) else text
        finally:
            conn.close()

    request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "bridge.info"}).encode()
    assert raw(request, None)[0] == 401 and raw(request, "wrong-token-123456789")[0] == 401
    cases = {
        b"{not json": -32700,
        b'{"jsonrpc": "2.0", "id": 1, "id": 2, "method": "bridge.info"}': -32700,
        b'{"jsonrpc": "2.0", "id": 1, "method": "task.create", "params": {"title": "\\ud800"}}': -32700,
        b'{"jsonrpc": "2.0", "id": 1, "method": "task.create", "params": {"title": "t", "lease_ms": 1.5}}': -32700,
        b'{"jsonrpc": "2.0", "id": 9007199254740993, "method": "bridge.info"}': -32700,
        b'{"jsonrpc": "1.0", "id": 1, "method": "bridge.info"}': -32600,
        b'{"jsonrpc": "2.0", "id": null, "method": "bridge.info"}': -32600,
        b"[]": -32600,
        b'{"jsonrpc": "2.0", "id": 1, "method": "task.drop"}': -32601,
        b'{"jsonrpc": "2.0", "id": 1, "method": "task.create", "params": {"title": ""}}': -32602,
        b'{"jsonrpc": "2.0", "id": 1, "method": "task.create", "params": {"title": "t", "evil": 1,'
        b' "idempotency_key": "abcdefgh1"}}': -32602,
        b'{"jsonrpc": "2.0", "id": 1, "method": "task.create", "params": {"title": "t", "idempotency_key":'
        b' "abcdefgh1", "body": {"extensions": {"nonamespace": 1}}}}': -32602,
    }
    for body, code in cases.items():
        status, reply = raw(body)
        assert status == 200 and reply["error"]["code"] == code, (body, reply)
    # A body declared past the cap is refused on its headers, before a byte of it is
    # read: only the headers are sent (sending the megabyte would race the server's
    # answer and close against the client's writes: a broken pipe, not a finding).
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.putrequest("POST", "/rpc")
        for name, value in (("Content-Type", "application/json"), ("Authorization", f"Bearer {bridge.tokens['owner']}"),
                            ("Content-Length", str((1 << 20) + 64))):
            conn.putheader(name, value)
        conn.endheaders()
        too_large = conn.getresponse()
        assert too_large.status == 413 and json.loads(too_large.read())["error"]["data"]["reason"] == "too-large"
    finally:
        conn.close()
    whoami = [{"jsonrpc": "2.0", "id": n, "method": "principal.whoami"} for n in (1, 2)]
    status, batch = raw(json.dumps(whoami).encode())
    assert status == 200 and [r["result"]["principal"] for r in batch] == ["owner", "owner"]
    assert owner.call("events.open")["watermark"] == before, "nothing changed"
    assert owner.call("snapshot.get")["tasks"] == []


@pytest.mark.parametrize("failpoint", ["bridge.before-commit", "bridge.after-commit"])
def test_v16_sigkill_around_the_commit_then_a_retry_applies_the_command_once(short_tmp: Path, failpoint: str) -> None:
    daemon = Bridge(short_tmp)
    daemon.start(env={"CORRAL_FAILPOINTS": f"{failpoint}=kill@once", "CORRAL_FAILPOINT_DIR": str(short_tmp)})
    try:
        owner = daemon.client("owner")
        with pytest.raises((BridgeCallError, OSError, http.client.HTTPException)):
            owner.call("task.create", title="survives", idempotency_key="key-kill-00001")
        assert daemon.process is not None and daemon.process.wait(timeout=20) == -signal.SIGKILL
        daemon.start()
        owner = daemon.client("owner")
        first = owner.call("task.create", title="survives", idempotency_key="key-kill-00001")
        again = owner.call("task.create", title="survives", idempotency_key="key-kill-00001")
        assert first == again
        tasks = owner.call("snapshot.get")["tasks"]
        assert [t["task"]["title"] for t in tasks] == ["survives"], "exactly one task, whatever the kill"
        assert [e["revision"] for e in owner.call("events.read", cursor=0)["events"]] == [1]
    finally:
        daemon.stop()


def test_v17_snapshot_under_concurrent_writes_is_consistent_with_its_watermark(bridge: Bridge) -> None:
    owner, reader = bridge.client("owner"), bridge.client("R")
    task_ids = [published(owner, ("R", ["read"])) for _ in range(3)]
    stop = threading.Event()

    def write() -> None:
        while not stop.is_set():
            for task_id in task_ids:
                task = task_of(owner, task_id)
                owner.call("grant.create", task_id=task_id, expected_revision=task["revision"], principal="X",
                           permissions=["read"])

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(5):
            snapshot = reader.call("snapshot.get")
            history = reader.call("events.read", cursor=0, limit=1000)["events"]
            for entry in snapshot["tasks"]:
                upto = [e["revision"] for e in history
                        if e["task_id"] == entry["task"]["task_id"] and e["seq"] <= snapshot["watermark"]]
                assert max(upto) == entry["task"]["revision"], "the snapshot is exactly the history up to W"
    finally:
        stop.set()
        writer.join()


def test_v18_the_registration_file_is_checked(short_tmp: Path) -> None:
    bad = short_tmp / "bad.json"
    for text in ('{"principals": {}}', '{"principals": {"a": {"token": "short"}}}', "{not json",
                 '{"principals": {"a": {"token": "same-token-1234567"}, "b": {"token": "same-token-1234567"}}}'):
        bad.write_text(text)
        bad.chmod(0o600)
        result = subprocess.run([*CORRAL, "bridge", "serve", "--db", str(short_tmp / "x.db"), "--listen",
                                 "127.0.0.1:0", "--principals", str(bad)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "bad --principals" in result.stderr, (text, result.stderr)
        assert "same-token" not in result.stderr, "a token never reaches an error message"


DIGEST_VECTORS: list[dict[str, Any]] = [
    # G01 key order; G02 Unicode (NFC vs NFD, astral, escapes); G03 numbers at the
    # safe-integer edge; G04 nesting; G05 the idempotency key is not part of it; G06 empty.
    {"method": "task.create", "params": {"title": "t", "lease_ms": 60000, "body": {"b": 1, "a": 2}}},
    {"method": "task.create", "params": {"title": "caf\u00e9 / cafe\u0301 \U0001f600 \"q\" \\ \n \u2028"}},
    {"method": "run.report", "params": {"task_id": "task-0123456789abcdef", "expected_revision": 9007199254740991,
                                        "run_id": "run-0123456789abcdef", "body": {"n": -9007199254740991, "z": 0}}},
    {"method": "task.createChild", "params": {"parent_id": "task-0123456789abcdef", "expected_revision": 3,
                                              "title": "c", "grants": [{"principal": "B",
                                                                        "permissions": ["read", "claim"]}]}},
    {"method": "task.create", "params": {"title": "t", "idempotency_key": "k-ignored-123"}},
    {"method": "binding.enable", "params": {}},
]


def test_python_and_node_compute_the_same_request_digests() -> None:
    from corral.bridge.store import request_digest
    from corral.core import strict_json

    node = shutil.which("node")
    assert node is not None, "Node is needed for the cross-language check (apt-get install nodejs)"
    result = subprocess.run([node, str(NODE_CLIENT), "--digest"], input=json.dumps(DIGEST_VECTORS),
                            capture_output=True, text=True, check=True, timeout=30)
    python = [request_digest(v["method"], v["params"]) for v in DIGEST_VECTORS]
    assert json.loads(result.stdout) == python
    assert python[0] != python[1] and python[4] == strict_json.sha256({"method": "task.create",
                                                                       "params": {"title": "t"}})


def test_v19_renew_moves_the_deadline_and_adds_one_revision(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = published(owner, ("A", ["claim", "read"]))
    assignment_id, _, revision = claim_and_start(a, task_id, lease_ms=5000)
    before = a.call("assignment.get", assignment_id=assignment_id)["assignment"]["lease_deadline"]
    renewed = a.call("assignment.renew", task_id=task_id, expected_revision=revision, assignment_id=assignment_id,
                     lease_ms=60_000)
    assert renewed["revision"] == revision + 1 and renewed["assignment"]["lease_deadline"] > before


def test_v20_only_the_holder_may_release_report_or_submit(bridge: Bridge) -> None:
    owner, a, b = bridge.client("owner"), bridge.client("A"), bridge.client("B")
    task_id = published(owner, ("A", ["claim", "read"]), ("B", ["claim", "read"]))
    assignment_id, run_id, revision = claim_and_start(a, task_id)
    refusal("forbidden", lambda: b.call("assignment.release", task_id=task_id, expected_revision=revision,
                                         assignment_id=assignment_id, reason="not mine"))
    refusal("forbidden", lambda: b.call("run.submit", task_id=task_id, expected_revision=revision, run_id=run_id,
                                         result={"summary": "stolen"}))
    assert task_of(owner, task_id)["revision"] == revision


def test_v21_an_assignment_has_exactly_one_run(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = published(owner, ("A", ["claim", "read"]))
    assignment_id, _, revision = claim_and_start(a, task_id)
    refusal("invalid-state", lambda: a.call("run.start", task_id=task_id, expected_revision=revision,
                                             assignment_id=assignment_id))


def test_v22_a_claim_needs_a_claim_grant_and_an_open_task(bridge: Bridge) -> None:
    owner, a, x = bridge.client("owner"), bridge.client("A"), bridge.client("X")
    draft = owner.call("task.create", title="not yet")["task"]["task_id"]
    owner.call("grant.create", task_id=draft, expected_revision=1, principal="A", permissions=["claim"])
    binding = a.call("binding.enable")["binding"]["binding_id"]
    refusal("invalid-state", lambda: a.call("assignment.claim", task_id=draft, expected_revision=2,
                                             binding_id=binding))
    task_id = published(owner, ("X", ["read"]))
    x_binding = x.call("binding.enable")["binding"]["binding_id"]
    refusal("forbidden", lambda: x.call("assignment.claim", task_id=task_id,
                                         expected_revision=task_of(x, task_id)["revision"], binding_id=x_binding))
    refusal("forbidden", lambda: a.call("assignment.claim", task_id=task_id,
                                         expected_revision=task_of(owner, task_id)["revision"], binding_id=x_binding))


def test_v23_nothing_reports_into_a_submitted_run(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = published(owner, ("A", ["claim", "read"]))
    _, run_id, revision = claim_and_start(a, task_id)
    submitted = a.call("run.submit", task_id=task_id, expected_revision=revision, run_id=run_id,
                       result={"summary": "done"})
    refusal("invalid-state", lambda: a.call("run.report", task_id=task_id, expected_revision=submitted["revision"],
                                             run_id=run_id, body={"after": "submit"}))


def test_v24_only_the_owner_or_issuer_cancels_and_a_cancel_ends_the_assignment(bridge: Bridge) -> None:
    owner, a = bridge.client("owner"), bridge.client("A")
    task_id = published(owner, ("A", ["claim", "read"]))
    assignment_id, run_id, revision = claim_and_start(a, task_id)
    refusal("forbidden", lambda: a.call("task.cancel", task_id=task_id, expected_revision=revision, reason="no"))
    owner.call("task.cancel", task_id=task_id, expected_revision=revision, reason="not needed any more")
    assert task_of(owner, task_id)["status"] == "cancelled"
    assert a.call("assignment.get", assignment_id=assignment_id)["assignment"]["status"] == "cancelled"
    assert a.call("run.get", run_id=run_id)["run"]["status"] == "ended"


def test_v25_a_publish_happens_once(bridge: Bridge) -> None:
    owner = bridge.client("owner")
    task_id = owner.call("task.create", title="draft")["task"]["task_id"]
    owner.call("task.publish", task_id=task_id, expected_revision=1)
    refusal("invalid-state", lambda: owner.call("task.publish", task_id=task_id, expected_revision=2))


def test_v26_the_audit_log_keeps_the_action_request_id_and_reason(bridge: Bridge) -> None:
    owner = bridge.client("owner")
    task_id = owner.call("task.create", title="audited", publish=True)["task"]["task_id"]
    refusal("revision-conflict", lambda: owner.call("task.cancel", task_id=task_id, expected_revision=7,
                                                     reason="wrong view"))
    owner.call("task.cancel", task_id=task_id, expected_revision=1, reason="done with it")
    rows = owner.call("audit.read")["audit"]
    assert [(r["method"], r["outcome"]) for r in rows] == [
        ("task.create", "ok"), ("task.cancel", "revision-conflict"), ("task.cancel", "ok")]
    assert rows[2]["reason"] == "done with it" and "revision 1" in rows[1]["reason"]
    assert len({r["request_id"] for r in rows}) == 3
    assert bridge.client("A").call("audit.read")["audit"] == [], "each principal reads its own audit"


def test_v27_events_after_the_snapshot_continue_from_its_cursor(bridge: Bridge) -> None:
    owner = bridge.client("owner")
    first = owner.call("task.create", title="before")["task"]["task_id"]
    snapshot = owner.call("snapshot.get")
    second = owner.call("task.create", title="after")["task"]["task_id"]
    owner.call("task.publish", task_id=first, expected_revision=1)
    later = owner.call("events.read", cursor=snapshot["cursor"])["events"]
    assert [(e["task_id"], e["kind"]) for e in later] == [(second, "task.created"), (first, "task.published")]
    assert [t["task"]["task_id"] for t in snapshot["tasks"]] == [first]


def test_docs_list_every_method_and_every_v_vector() -> None:
    from corral.bridge.methods import METHODS

    doc = (Path(__file__).resolve().parent.parent / "docs" / "bridge.md").read_text()
    assert all(f"| `{name}` |" in doc for name in METHODS)
    names = {line.split("_")[1] for line in Path(__file__).read_text().splitlines()
             if line.startswith("def test_v")}
    listed = {f"v{int(n):02d}" for n in range(1, 28)}
    assert {f"| {v.upper()} |" for v in listed} <= {line[:7] for line in doc.splitlines()}
    assert len(names) >= 25

"""One run per bridge task and per idempotency key, across the cluster (issue 51
§1, last sentence), on a real PostgreSQL with two real nodes.

- An idempotency key a user passes (``run(idempotency_key=...)``, ``corral run
  --idempotency-key``) names one run: given again to another node, or to the
  cluster's front door, it answers that run; its effect happens once.
- A bridge task worked on by one node, then claimed by another node's worker
  (the first one's assignment ended while its run still runs): the second node
  answers the task with the same corral run, never a second one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import corral
from tests.harness import Daemon, cli, effects, one_effect_spec, wait_for
from tests.test_cluster import _up
from tests.test_pg_front_door import remote

LEASE_S = 1.5
TASK = "record one effect"


@pytest.fixture
def two(short_tmp: Path, pg_url: str) -> Iterator[dict[str, Any]]:
    from corral.supervisor.ledger.ledger_spec import URL_ENV

    (short_tmp / "project").mkdir()
    spec = short_tmp / "keys.toml"
    spec.write_text(one_effect_spec(f"lease_s = {LEASE_S}\nqueue_poll_s = 0.1"))
    env = {URL_ENV: pg_url}
    nodes = {name: Daemon(short_tmp / name, spec, env) for name in ("a", "b")}
    try:
        yield {"nodes": nodes, "url": pg_url, "tmp": short_tmp}
    finally:
        for daemon in nodes.values():
            daemon.shutdown()


def _runs_in_cluster(url: str) -> list[str]:
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster

    conn = connect_cluster(url)
    try:
        found = []
        for (schema,) in conn.execute("SELECT schema_name FROM corral_cluster.partitions ORDER BY name").fetchall():
            found += [str(row[0]) for row in conn.execute(f"SELECT run_id FROM {schema}.runs").fetchall()]
        return found
    finally:
        conn.close()


def test_an_idempotency_key_given_to_another_node_and_to_the_front_door_is_one_run(two: dict[str, Any]) -> None:
    a, b = two["nodes"]["a"], two["nodes"]["b"]
    _up(a, "node-a")
    _up(b, "node-b")
    with corral.Client(a.home) as client:
        first = client.run("writer", TASK, idempotency_key="charge-order-42", timeout=60)
    assert first.status == "completed", first.raw
    with corral.Client(b.home) as client:
        again = client.run("writer", TASK, idempotency_key="charge-order-42", timeout=60)
    assert again.run_id == first.run_id and again.status == "completed", again.raw
    done = cli(b.home, "run", "--agent", "writer", "--task", TASK, "--idempotency-key", "charge-order-42", env=b.env)
    assert done.returncode == 0 and done.stdout.strip() == first.run_id, done.stderr + done.stdout
    door = remote(two["tmp"], two["url"], "run", "--agent", "writer", "--task", TASK,
                  "--idempotency-key", "charge-order-42", "--wait", "--json")
    assert door.returncode == 0 and json.loads(door.stdout)["run"]["run_id"] == first.run_id, door.stderr
    assert Counter(e["run_id"] for e in effects(two["tmp"] / "effects.log")) == Counter([first.run_id])
    assert _runs_in_cluster(two["url"]) == [first.run_id]
    other = cli(b.home, "run", "--agent", "writer", "--task", TASK, "--idempotency-key", "charge-order-43", env=b.env)
    assert other.returncode == 0 and other.stdout.strip() != first.run_id, "another key, another run"
    both = cli(b.home, "run", "--agent", "writer", "--task", TASK, "--idempotency-key", "k", "--run-id", "run-abcdef",
               env=b.env)
    assert both.returncode != 0


BRIDGE_SPEC = """
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
[bridge]
url = "{url}"
agent = "writer"
titles = ["write *"]
lease_ms = 60000
poll_s = 0.2
[ledger]
lease_s = {lease}
[[agents]]
id = "writer"
[[agents.steps]]
actions = [{{ tool = "effect.record", input = {{ label = "e1" }} }}]
[[agents.steps]]
final = "notes written by corral"
"""


def test_a_bridge_task_claimed_by_another_node_answers_with_the_same_run(two: dict[str, Any], bridge: Any) -> None:
    """Node a's worker claims the task and starts its run, whose effect is held
    (a failpoint); the owner revokes a's grant (its assignment ends, the run goes
    on) and grants node b's principal: b's worker claims the task and gets a's
    run, not a second one. Once the effect is let go, b submits that run's reply."""
    from corral.core import failpoints

    a, b, tmp = two["nodes"]["a"], two["nodes"]["b"], two["tmp"]
    (tmp / "ws").mkdir()
    spec = tmp / "bridged.toml"
    spec.write_text(BRIDGE_SPEC.format(url=bridge.url, lease=LEASE_S))
    a.spec = b.spec = spec
    _up(a, "node-a", {"CORRAL_BRIDGE_TOKEN": bridge.tokens["A"], "CORRAL_FAILPOINTS": "agent.before-effect=block@once"})
    owner = bridge.client("owner")
    task_id = owner.call("task.create", title="write the notes", publish=True)["task"]["task_id"]
    owner.call("grant.create", task_id=task_id, expected_revision=1, principal="A", permissions=["claim", "read"])
    wait_for("node a's agent at its effect", (a.home / "failpoints" / "agent.before-effect.fired").exists)
    (run_id,) = _runs_in_cluster(two["url"])
    revision = owner.call("task.get", task_id=task_id)["task"]["revision"]
    grant_id = owner.call("grant.list", task_id=task_id)["grants"][0]["grant_id"]
    revoked = owner.call("grant.revoke", task_id=task_id, expected_revision=revision, grant_id=grant_id,
                         reason="moved to node b")
    owner.call("grant.create", task_id=task_id, expected_revision=revoked["revision"], principal="B",
               permissions=["claim", "read"])
    _up(b, "node-b", {"CORRAL_BRIDGE_TOKEN": bridge.tokens["B"]})

    def b_job_started() -> bool:
        jobs = b.call("status").get("bridge") or {}
        return any(jobs.get(phase) for phase in ("running", "submitting", "submitted", "releasing", "released"))

    wait_for("node b's job for the task to start its run", b_job_started)
    assert _runs_in_cluster(two["url"]) == [run_id], "node b answers the task with node a's run"
    failpoints.release_path("agent.before-effect", a.home / "failpoints").touch()
    shown = wait_for("the submission", lambda: (t := owner.call("task.get", task_id=task_id))["submissions"] and t)
    assert [s["result"]["summary"] for s in shown["submissions"]] == ["notes written by corral"]
    assert _runs_in_cluster(two["url"]) == [run_id]
    assert Counter(e["run_id"] for e in effects(tmp / "effects.log")) == Counter([run_id]), "its effect once"

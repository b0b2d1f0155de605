"""The front door: a client on a host with no node talks to the cluster's
PostgreSQL directly (``corral --ledger postgresql://... run|wait|show|pending|
approve|deny|cancel|status``), as DBOS's client does. It queues a root run into
the shared queue, a node takes it; it reads any partition; an approval or a
cancel goes to the partition's holder through ``corral_cluster.requests`` (the
rows a node honours), never written into a partition behind its holder's back.

Every client command here runs in its own process, with a home where no
supervisor ever ran: the client needs nothing on a node's host.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import CORRAL, Daemon, agent_spec, effects, wait_for
from tests.test_cluster import _up

LEASE_S = 1.5
TASK = "record one effect"
STEPS = """
[[agents.steps]]
actions = [{ tool = "effect.record", input = { label = "e1" } }]
[[agents.steps]]
final = "done"
"""


def _spec(path: Path, ledger: str) -> None:
    """``writer`` records one effect unattended; ``careful`` asks a person first."""
    text = agent_spec(
        workspace="project", steps=STEPS, extra=f"[ledger]\nlease_s = {LEASE_S}\nqueue_poll_s = 0.1\n" + ledger
    )
    text += '\n[[agents]]\nid = "careful"\n[agents.policy]\n"effect.record" = "confirm"\n' + STEPS
    path.write_text(text)


@pytest.fixture
def door(short_tmp: Path, pg_url: str) -> Iterator[dict[str, Any]]:
    """Two nodes (a, b) on one spec; a client home where nothing ever ran."""
    from corral.supervisor.ledger.ledger_spec import URL_ENV

    (short_tmp / "project").mkdir()
    spec = short_tmp / "door.toml"
    _spec(spec, "")
    env = {URL_ENV: pg_url}
    daemons = {name: Daemon(short_tmp / name, spec, env) for name in ("a", "b")}
    try:
        yield {"nodes": daemons, "url": pg_url, "tmp": short_tmp, "spec": spec}
    finally:
        for daemon in daemons.values():
            daemon.shutdown()


def remote(tmp: Path, url: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``corral --ledger URL ...`` from a process with an empty home of its own and
    no ledger in its environment: nothing of a node's host."""
    import os

    from corral.supervisor.ledger.ledger_spec import URL_ENV

    env = {k: v for k, v in os.environ.items() if k not in (URL_ENV, "CORRAL_HOME")}
    client_home = tmp / "client-host"
    client_home.mkdir(exist_ok=True)
    return subprocess.run(
        [*CORRAL, "--home", str(client_home / "never"), "--ledger", url, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
        cwd=client_home,
    )


def _json(done: subprocess.CompletedProcess[str], code: int = 0) -> Any:
    """The command's JSON; ``code`` 1: a run that did not complete (it waits for a person)."""
    assert done.returncode == code, done.stderr + done.stdout
    return json.loads(done.stdout)


def _partition_of(url: str, run_id: str) -> str | None:
    from corral.supervisor.ledger.ledger_pg_wire import connect

    conn = connect(url)
    try:
        row = conn.execute("SELECT partition FROM corral_cluster.run_ids WHERE run_id = %s", (run_id,)).fetchone()
        return None if row is None else str(row[0])
    finally:
        conn.close()


def test_a_client_with_no_node_submits_waits_shows_and_reads_status(door: dict[str, Any]) -> None:
    nodes, url, tmp = door["nodes"], door["url"], door["tmp"]
    _up(nodes["a"], "node-a")
    _up(nodes["b"], "node-b")
    shown = _json(remote(tmp, url, "run", "--agent", "writer", "--task", TASK, "--wait", "--json"))
    run_id = shown["run"]["run_id"]
    assert shown["run"]["status"] == "completed", shown["run"]
    assert shown["final_reply"] == "done"
    assert _partition_of(url, run_id) in ("node-a", "node-b"), "a node took it and ran it in its partition"
    assert Counter(e["run_id"] for e in effects(tmp / "effects.log")) == Counter([run_id]), "its effect once"

    again = _json(remote(tmp, url, "show", run_id, "--json"))
    assert again["run"]["status"] == "completed" and again["partition"] in ("node-a", "node-b"), again
    waited = _json(remote(tmp, url, "wait", run_id, "--json"))
    assert waited["run"]["status"] == "completed"

    # Without --wait: the run id at once, and the client's id is its idempotency key.
    started = remote(tmp, url, "run", "--agent", "writer", "--task", TASK)
    assert started.returncode == 0, started.stderr
    second = started.stdout.strip()
    assert _json(remote(tmp, url, "wait", second, "--json"))["run"]["status"] == "completed"

    status = remote(tmp, url, "status")
    assert status.returncode == 0, status.stderr
    assert "node-a" in status.stdout and "node-b" in status.stdout, status.stdout
    assert "shared queue: 0 run(s) waiting" in status.stdout, status.stdout
    load = _json(remote(tmp, url, "status", "--json"))["cluster"]["load"]
    assert {n["node"] for n in load["nodes"]} == {"node-a", "node-b"}, load
    assert load["totals"]["unfinished"] == 0 and load["queue_depth"] == 0, load


def test_a_remote_approval_and_a_remote_cancel_reach_the_node_holding_the_run(door: dict[str, Any]) -> None:
    nodes, url, tmp = door["nodes"], door["url"], door["tmp"]
    _up(nodes["a"], "node-a")
    _up(nodes["b"], "node-b")
    # A run that waits for a person: the client approves it from afar, and the
    # holder runs the effect (once) and finishes the run.
    first = _json(remote(tmp, url, "run", "--agent", "careful", "--task", TASK, "--wait", "--json"), 1)
    run_id = first["run"]["run_id"]
    assert first["run"]["status"] == "waiting-confirmation", first["run"]
    pending = _json(remote(tmp, url, "pending", "--json"))
    waiting = [a for a in pending["actions"] if a["run_id"] == run_id]
    assert [a["phase"] for a in waiting] == ["waiting-confirmation"], pending
    action_id = waiting[0]["action_id"]
    approved = remote(tmp, url, "approve", action_id)
    assert approved.returncode == 0, approved.stderr + approved.stdout
    assert f"approved {action_id} (run {run_id})" in approved.stdout
    done = _json(remote(tmp, url, "wait", run_id, "--json"))
    assert done["run"]["status"] == "completed", done["run"]
    assert Counter(e["run_id"] for e in effects(tmp / "effects.log")) == Counter([run_id])
    holder = _partition_of(url, run_id)
    assert holder is not None
    node = nodes["a" if holder == "node-a" else "b"]
    assert node.call("show", run_id=run_id)["run"]["status"] == "completed", "the holder's own ledger says so"

    # Another waits for a person: cancelled from afar, on its holder's ledger.
    parked = _json(remote(tmp, url, "run", "--agent", "careful", "--task", TASK, "--wait", "--json"), 1)
    parked = parked["run"]["run_id"]
    cancelled = remote(tmp, url, "cancel", parked)
    assert cancelled.returncode == 0, cancelled.stderr + cancelled.stdout
    holder = _partition_of(url, parked)
    node = nodes["a" if holder == "node-a" else "b"]
    assert node.call("show", run_id=parked)["run"]["status"] == "cancelled"
    assert _json(remote(tmp, url, "show", parked, "--json"))["run"]["status"] == "cancelled"
    again = remote(tmp, url, "cancel", parked)
    assert again.returncode == 1 and "already ended" in again.stderr, again.stderr
    assert Counter(e["run_id"] for e in effects(tmp / "effects.log")) == Counter([run_id]), "no effect of the cancelled"


def test_a_run_cancelled_while_queued_is_never_taken_and_its_id_stays_its_own(door: dict[str, Any]) -> None:
    nodes, url, tmp = door["nodes"], door["url"], door["tmp"]
    full = tmp / "full.toml"
    _spec(full, "max_runs = 0\n")  # no room: every run waits in the shared queue
    nodes["a"].spec = full
    _up(nodes["a"], "node-a")
    run_id = remote(tmp, url, "run", "--agent", "writer", "--task", TASK).stdout.strip()
    assert _partition_of(url, run_id) == "~queued"
    shown = _json(remote(tmp, url, "show", run_id, "--json"))
    assert shown["run"]["status"] == "pending" and shown["queued"] is True, shown
    cancelled = remote(tmp, url, "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    # A node with room now: it takes nothing, and the cancelled id stays that run.
    _up(nodes["b"], "node-b")
    assert _json(remote(tmp, url, "show", run_id, "--json"))["run"]["status"] == "cancelled"
    resubmit = nodes["b"].call("run", agent_id="writer", task=TASK, run_id=run_id)
    assert resubmit.get("existing") and resubmit["status"] == "cancelled", resubmit
    status = _json(remote(tmp, url, "status", "--json"))["cluster"]["load"]
    assert status["queue_depth"] == 0, status
    assert not (tmp / "effects.log").exists() or not effects(tmp / "effects.log")


def test_bad_input_gets_one_line_and_exit_2_and_the_password_is_never_said(
    door: dict[str, Any], postgres_server: Any
) -> None:
    url, tmp = door["url"], door["tmp"]
    secret = "s3cret-pass-9f2c"
    cases = {
        "not a URL": "mysql://corral@db/corral",
        "unreachable": f"postgresql://corral:{secret}@127.0.0.1:1/corral?connect_timeout=2",
        "no cluster there": url,
    }
    for what, bad in cases.items():
        done = remote(tmp, bad, "run", "--agent", "writer", "--task", TASK)
        assert done.returncode == 2, (what, done.returncode, done.stderr, done.stdout)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("corral: "), (what, done.stderr)
        assert "Traceback" not in done.stderr and secret not in done.stderr + done.stdout, (what, done.stderr)

    # A wrong password, on a role that must give one.
    from corral.supervisor.ledger.ledger_pg_wire import connect

    conn = connect(url)
    conn.execute(f"CREATE ROLE door_user LOGIN PASSWORD 'right-{secret}'")
    conn.close()
    hba = Path(postgres_server.data) / "pg_hba.conf"
    original = hba.read_text()
    wrong = _with_user(url, "door_user", secret)
    hba.write_text("local all door_user scram-sha-256\n" + original)
    try:
        _reload(url)
        wait_for("the server to ask door_user for a password", lambda: not _connects(wrong))
        done = remote(tmp, wrong, "show", "run-abc123abc123")
        assert done.returncode == 2, done.stderr
        assert "password" in done.stderr and secret not in done.stderr + done.stdout, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    finally:
        hba.write_text(original)
        _reload(url)
    # Nothing the client did left a file with the password behind.
    for path in (tmp / "client-host").rglob("*"):
        assert not path.is_file() or secret not in path.read_text(errors="replace"), path


def test_a_command_that_needs_a_node_says_so(door: dict[str, Any]) -> None:
    _up(door["nodes"]["a"], "node-a")
    done = remote(door["tmp"], door["url"], "steer", "run-abc123abc123", "go on")
    assert done.returncode == 2 and "needs a node" in done.stderr, done.stderr


def _with_user(url: str, user: str, password: str) -> str:
    """``url`` for another role, its password in the URL's user part."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "user"], safe="/")
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname or ''}", query=query))


def _connects(url: str) -> bool:
    from corral.supervisor.ledger.ledger_pg_wire import PostgresUnavailable, connect

    try:
        connect(url, timeout=2).close()
    except PostgresUnavailable:
        return False
    return True


def _reload(url: str) -> None:
    from corral.supervisor.ledger.ledger_pg_wire import connect

    conn = connect(url)
    try:
        conn.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()


def test_the_url_is_said_without_its_password() -> None:
    from corral.supervisor.cluster.front_door import safe_url

    assert safe_url("postgresql:///db?host=/tmp/s&user=corral") == "postgresql:///db?host=/tmp/s&user=corral"
    assert (
        safe_url("postgresql://u:hunter2@h:5432/db?sslmode=require") == "postgresql://u:***@h:5432/db?sslmode=require"
    )
    assert safe_url("postgresql://u@h/db?password=hunter2") == "postgresql://u@h/db?password=***"


def test_a_database_lost_after_the_door_opened_is_lost_not_bad_input(pg_url: str, postgres_server: Any) -> None:
    """The door opened; then its database goes away (dropped, its connections
    ended): a call says the ledger is lost (ask again), not that the input was
    bad, both on the connection that broke and on the one it fails to make."""
    from urllib.parse import urlsplit

    import corral
    from corral.core.errors import LedgerLost
    from corral.supervisor.ledger.ledger_pg_cluster import connect_cluster
    from corral.supervisor.ledger.ledger_pg_wire import connect

    connect_cluster(pg_url).close()  # the cluster's tables, as a node's first boot makes them
    with corral.Client.cluster(pg_url) as client:
        with pytest.raises(corral.ControlError, match="no run"):
            client.show("run-abc123abc123")
        admin = connect(postgres_server.url())
        try:
            admin.execute(f'DROP DATABASE "{urlsplit(pg_url).path.lstrip("/")}" WITH (FORCE)')
        finally:
            admin.close()
        for _ in range(2):
            with pytest.raises(LedgerLost):
                client.show("run-abc123abc123")

"""A corral swarm working for the task bridge (``[bridge]``): it claims a task,
runs it as an ordinary durable run, and submits the final reply, exactly once even
when its worker is SIGKILLed between sending the submit and recording it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bridge_harness import Bridge
from tests.harness import Daemon, ledger_rows, wait_for

SPEC = """
[project]
root = "ws"
[bridge]
url = "{url}"
agent = "writer"
titles = ["write *"]
lease_ms = 5000
poll_s = 0.2
[[agents]]
id = "writer"
[[agents.steps]]
actions = [{{ tool = "fs.list", input = {{ path = "." }} }}]
[[agents.steps]]
final = "notes written by corral"
"""


def _swarm(tmp: Path, bridge: Bridge) -> Daemon:
    (tmp / "ws").mkdir()
    spec = tmp / "swarm.toml"
    spec.write_text(SPEC.format(url=bridge.url))
    return Daemon(tmp / "h", spec, env={"CORRAL_BRIDGE_TOKEN": bridge.tokens["A"]})


def _post(bridge: Bridge, title: str) -> str:
    owner = bridge.client("owner")
    task_id = owner.call("task.create", title=title, publish=True)["task"]["task_id"]
    owner.call("grant.create", task_id=task_id, expected_revision=1, principal="A", permissions=["claim", "read"])
    return str(task_id)


def test_the_swarm_claims_runs_and_submits_a_matching_task(short_tmp: Path, bridge: Bridge) -> None:
    owner = bridge.client("owner")
    wanted, ignored = _post(bridge, "write the notes"), _post(bridge, "review the notes")
    swarm = _swarm(short_tmp, bridge)
    try:
        swarm.up()
        shown = wait_for("the submission", lambda: (t := owner.call("task.get", task_id=wanted))["submissions"] and t)
        assert shown["task"]["status"] == "submitted"
        assert [s["result"]["summary"] for s in shown["submissions"]] == ["notes written by corral"]
        # The bridge holds the submission before the worker's own ledger moves the job
        # past `submitting` (its next step after the bridge answered): wait for that move.
        jobs = wait_for("the job recorded as submitted", lambda: (rows := ledger_rows(
            swarm.home, "SELECT task_id, phase, run_id FROM bridge_jobs")) and all(
            row["phase"] != "submitting" for row in rows) and rows)
        assert [(j["task_id"], j["phase"]) for j in jobs] == [(wanted, "submitted")]
        runs = ledger_rows(swarm.home, "SELECT status FROM runs WHERE run_id = ?", jobs[0]["run_id"])
        assert runs == [{"status": "completed"}], "the task ran as an ordinary durable corral run"
        assert owner.call("task.get", task_id=ignored)["task"]["status"] == "open", "titles decide what is taken"
        assert swarm.call("status")["bridge"] == {"submitted": 1}
    finally:
        swarm.shutdown()


def test_a_worker_killed_after_sending_the_submit_never_submits_twice(short_tmp: Path, bridge: Bridge) -> None:
    owner = bridge.client("owner")
    task_id = _post(bridge, "write once")
    swarm = _swarm(short_tmp, bridge)
    try:
        swarm.up(env={"CORRAL_FAILPOINTS": "bridge.after-submit-sent=kill@once"})
        wait_for("the job to finish", lambda: ledger_rows(
            swarm.home, "SELECT 1 FROM bridge_jobs WHERE phase = 'submitted'"))
        assert (swarm.home / "failpoints" / "bridge.after-submit-sent.fired").exists()
        assert swarm.actor("bridge-worker")["restarts"] >= 1, "the worker was killed and restarted"
        shown = owner.call("task.get", task_id=task_id)
        assert len(shown["submissions"]) == 1, "the re-sent submit got its receipt, not a second submission"
        assert len(shown["assignments"]) == 1 and shown["assignments"][0]["status"] == "completed"
    finally:
        swarm.shutdown()


def test_a_bad_bridge_table_stops_corral_up_with_its_place(short_tmp: Path) -> None:
    from corral.supervisor.spec.swarm_spec import SpecError, load_spec

    (short_tmp / "ws").mkdir()
    for table, message in (
        ('url = "https://x:1"\nagent = "writer"', "bridge.url"),
        ('url = "http://127.0.0.1:9"\nagent = "nobody"', "bridge.agent"),
        ('url = "http://127.0.0.1:9"\nagent = "writer"\ntoken_env = "lower"', "bridge.token_env"),
        ('url = "http://127.0.0.1:9"\nagent = "writer"\ntitles = []', "bridge.titles"),
        ('url = "http://127.0.0.1:9"\nagent = "writer"\nsurprise = 1', "bridge: unknown key 'surprise'"),
    ):
        spec = short_tmp / "s.toml"
        agent = '[[agents]]\nid = "writer"\n[[agents.steps]]\nfinal = "x"\n'
        spec.write_text(f'[project]\nroot = "ws"\n[bridge]\n{table}\n{agent}')
        with pytest.raises(SpecError, match=message):
            load_spec(spec)

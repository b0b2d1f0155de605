"""Fewer round trips per action (supervisor/runs/step_piggyback.py) without a weaker
proof: read batches keep one lifecycle per action, a kill mid-batch re-runs the
reads and nothing else, and ``wait`` answers from the supervisor."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from corral.actors.agent import Lane
from corral.mailbox.control import ControlError
from corral.mailbox.protocol import ActionFinishBatch, ActionResult, NextStep, ProtocolError, decode
from corral.mailbox.steps import ProviderStep
from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.runs import action_store, run_store
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.spec.swarm_spec import empty_spec
from tests.harness import Daemon, agent_spec, effects, ledger_rows, running, wait_run

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

READS_THEN_EFFECT = """
[[agents.steps]]
actions = [{ tool = "fs.list", input = { path = "." } }, { tool = "fs.list", input = { path = "." } },
           { tool = "effect.record", input = { label = "after the reads" } }]
[[agents.steps]]
final = "done"
"""

TWO_READS = """
[[agents.steps]]
actions = [{ tool = "fs.list", input = { path = "." } }, { tool = "fs.list", input = { path = "." } }]
[[agents.steps]]
final = "done"
"""


#: Four turns; the last decides on an observation of the first, which the step
#: of that turn does not carry (it carries only what is new since the third).
REMEMBERS_THE_FIRST_TURN = """
[[agents.steps]]
actions = [{ tool = "effect.record", input = { label = "alpha" } }]
[[agents.steps]]
actions = [{ tool = "fs.list", input = { path = "." } }]
[[agents.steps]]
actions = [{ tool = "fs.list", input = { path = "." } }]
[[agents.steps]]
when_observed = "alpha"
final = "saw alpha"
[[agents.steps]]
final = "lost alpha"
"""


def _daemon(tmp: Path, steps: str) -> Daemon:
    (tmp / "ws").mkdir()
    spec = tmp / "spec.toml"
    spec.write_text(agent_spec(steps=steps))
    return Daemon(tmp / "h", spec)


def _actions(daemon: Daemon, run_id: str) -> list[dict[str, object]]:
    return ledger_rows(
        daemon.home,
        "SELECT action_id, tool, phase, attempts, executing_at, finished_at FROM actions"
        " WHERE run_id = ? ORDER BY action_index",
        run_id,
    )


def test_consecutive_reads_begin_together_and_an_external_action_waits_its_turn(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, READS_THEN_EFFECT)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="two reads, then an effect")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        first, second, external = _actions(daemon, run_id)
        # One batch: the second read was executing before the first had finished.
        assert second["executing_at"] < first["finished_at"]
        # The external action began only after both reads were done and recorded.
        assert external["executing_at"] > second["finished_at"]
        assert [a["phase"] for a in (first, second, external)] == ["ok", "ok", "ok"]
        receipts = ledger_rows(daemon.home, "SELECT action_id FROM receipts WHERE run_id = ?", run_id)
        assert sorted(r["action_id"] for r in receipts) == sorted(
            str(a["action_id"]) for a in (first, second, external)
        )
        observations = ledger_rows(daemon.home, "SELECT source FROM observations WHERE run_id = ?", run_id)
        assert len(observations) == 3 == len({o["source"] for o in observations})
        assert len(effects(short_tmp / "effects.log")) == 1
    finally:
        daemon.shutdown()


def test_an_agent_killed_mid_batch_runs_the_reads_again_and_records_each_once(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, TWO_READS)
    try:
        # The agent dies after the batch's first read ran, before any result was sent.
        daemon.up(env={"CORRAL_FAILPOINTS": "agent.after-effect=kill@once"})
        run_id = daemon.call("run", agent_id="writer", task="two reads")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "needs-reconciliation"})
        assert shown["run"]["status"] == "completed", shown["run"]
        assert (daemon.home / "failpoints" / "agent.after-effect.fired").exists()
        actions = _actions(daemon, run_id)
        # Both reads were begun by the batch and both ran again after the restart:
        # recovery may re-run a read; it never guesses at an external effect.
        assert [(a["phase"], a["attempts"]) for a in actions] == [("ok", 2), ("ok", 2)]
        # One terminal event each (it announces the receipt committed with it), none repeated.
        events = ledger_rows(daemon.home, "SELECT subject FROM events WHERE kind = 'action-ok' ORDER BY cursor")
        assert sorted(e["subject"] for e in events) == sorted(str(a["action_id"]) for a in actions)
        assert shown["final_reply"] == "done"
    finally:
        daemon.shutdown()


def test_wait_answers_when_runs_settle_and_refuses_bad_input(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, TWO_READS)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="wait for me")["run_id"]
        reply = daemon.call("wait", timeout=40, run_ids=[run_id], until="done", wait_ms=30_000)
        assert reply == {"runs": {run_id: "completed"}, "reached": True}
        # Already there: answered at once, whatever wait_ms says.
        assert daemon.call("wait", run_ids=[run_id], wait_ms=0)["reached"] is True
        before = daemon.call("status")["cursor"]
        for params, message in (
            ({"run_ids": run_id}, r"wait: .*\$\.run_ids"),
            ({"run_ids": []}, "list of 1 to"),
            ({"run_ids": ["../etc"]}, "not a run id"),
            ({"run_ids": [run_id], "until": "soon"}, r"wait: .*\$\.until"),
            ({"run_ids": [run_id], "wait_ms": -1}, "wait_ms"),
            ({"run_ids": ["run-000000000000"]}, "no run"),
        ):
            with pytest.raises(ControlError, match=message):
                daemon.call("wait", **params)
        assert daemon.call("status")["cursor"] == before, "a refused wait changes nothing"
    finally:
        daemon.shutdown()


def test_wait_returns_unreached_when_its_time_is_up(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(agent_spec(steps=READS_THEN_EFFECT, policy='[agents.policy]\n"effect.record" = "confirm"'))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="park")["run_id"]
        settled = daemon.call("wait", timeout=40, run_ids=[run_id], wait_ms=30_000)
        assert settled == {"runs": {run_id: "waiting-confirmation"}, "reached": True}
        # Waiting for a person is not done: the same run, until="done", times out.
        reply = daemon.call("wait", run_ids=[run_id], until="done", wait_ms=200)
        assert reply == {"runs": {run_id: "waiting-confirmation"}, "reached": False}
    finally:
        daemon.shutdown()


@pytest.mark.parametrize("disk", ["fast", "slow"])
async def test_group_commit_makes_every_commit_durable_before_its_barrier_returns(
    tmp_path: Path, disk: str
) -> None:
    import trio

    from corral.supervisor.ledger.group_commit import INLINE_SYNC_S, GroupCommit
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger

    ledger = SqliteLedger(tmp_path / "l.db", synchronous="full", group_commit=True)
    commits = GroupCommit(ledger)
    if disk == "slow":
        commits.recent_sync_s = 1.0  # as after a slow fsync: the next ones go to a thread
    synced: list[tuple[int, int]] = []

    async def writer(n: int) -> None:
        ledger.event("test", f"w{n}")
        mine = ledger.durable_commits
        await commits.barrier()
        synced.append((mine, ledger.synced_commits))

    try:
        async with trio.open_nursery() as nursery:
            for n in range(8):
                nursery.start_soon(writer, n)
        assert len(synced) == 8
        # No barrier returned before an fsync covered the commit its writer made.
        assert all(synced_count >= mine for mine, synced_count in synced)
        assert ledger.synced_commits == ledger.durable_commits == ledger.commits
        assert commits.batched_commits == 8
        if disk == "slow":
            # The writers that committed while the first fsync ran shared the next one.
            assert commits.syncs < 8
            assert commits.recent_sync_s < 1.0, "a fast fsync moves the next ones back inline"
        else:
            assert commits.recent_sync_s < INLINE_SYNC_S * 100
        syncs = commits.syncs
        await commits.barrier()  # nothing new: no fsync
        assert commits.syncs == syncs
        ledger.event("test", "one more")
        await commits.barrier()
        assert commits.syncs == syncs + 1 and ledger.synced_commits == ledger.commits
    finally:
        ledger.close()


async def test_a_busy_event_loop_does_not_make_a_fast_disk_look_slow(tmp_path: Path) -> None:
    import time

    import trio

    from corral.supervisor.ledger.group_commit import INLINE_SYNC_S, GroupCommit

    ledger = SqliteLedger(tmp_path / "l.db", synchronous="full", group_commit=True)
    ledger.sync = lambda: ledger.commits  # type: ignore[method-assign]  # a disk that syncs at once
    commits = GroupCommit(ledger)
    commits.recent_sync_s = 2 * INLINE_SYNC_S  # as after a slow fsync: the next ones go to a thread

    async def hog() -> None:
        while not commits._syncing.locked():  # the fsync is under way in its thread
            await trio.lowlevel.checkpoint()
        time.sleep(0.02)  # and the loop is busy while the thread finishes

    try:
        for _ in range(10):
            if commits.recent_sync_s < INLINE_SYNC_S:
                break
            ledger.event("test", "x")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(commits.barrier)
                nursery.start_soon(hog)
        # Timed around the await, each fsync looked 20 ms long and stayed in a thread.
        assert commits.recent_sync_s < INLINE_SYNC_S
    finally:
        ledger.close()


PARALLEL = """
[[agents.steps]]
actions = [{ tool = "fs.read", input = { path = "a.txt" } }, { tool = "fs.list", input = { path = "." } },
           { tool = "fs.read", input = { path = "b.txt" } }]
[[agents.steps]]
final = "read"
"""


def _parallel_daemon(tmp: Path, allow: str) -> Daemon:
    (tmp / "ws").mkdir()
    (tmp / "ws" / "a.txt").write_text("alpha")
    (tmp / "ws" / "b.txt").write_text("beta")
    spec = tmp / "spec.toml"
    spec.write_text(agent_spec(steps=PARALLEL, policy=f"parallel_reads = {allow}"))
    return Daemon(tmp / "h", spec)


def test_allow_listed_parallel_reads_commit_once_each_and_a_kill_reruns_only_the_uncommitted(short_tmp: Path) -> None:
    daemon = _parallel_daemon(short_tmp, '["fs.read", "fs.list"]')
    try:
        # The supervisor kills the agent right after the first read's result commits.
        daemon.up(env={"CORRAL_FAILPOINTS": "action.after-terminal=kill-caller@once"})
        run_id = daemon.call("run", agent_id="writer", task="three reads at once")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed"
        assert (daemon.home / "failpoints" / "action.after-terminal.fired").exists()
        actions = _actions(daemon, run_id)
        assert [a["phase"] for a in actions] == ["ok", "ok", "ok"]
        attempts = sorted(int(str(a["attempts"])) for a in actions)
        assert attempts[0] == 1 and attempts[-1] <= 2, "a committed read is never run again"
        receipts = ledger_rows(daemon.home, "SELECT action_id FROM receipts WHERE run_id = ?", run_id)
        assert len(receipts) == 3 == len({r["action_id"] for r in receipts})
        outputs = [o["data"] for o in ledger_rows(daemon.home, "SELECT data FROM observations WHERE run_id = ?"
                                                  " ORDER BY seq", run_id)]
        assert any("alpha" in o for o in outputs) and any("beta" in o for o in outputs)
    finally:
        daemon.shutdown()


def test_parallel_reads_is_a_strict_list_of_read_tools(short_tmp: Path) -> None:
    from corral.supervisor.spec.swarm_spec import SpecError, load_spec

    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    for allow in ('["fs.write"]', '["fs.*"]', '["effect.record"]'):
        spec.write_text(agent_spec(steps=PARALLEL, policy=f"parallel_reads = {allow}"))
        with pytest.raises(SpecError, match="not a read-only tool"):
            load_spec(spec)


def test_each_turn_sends_only_new_observations_and_the_model_still_sees_them_all(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    with running(short_tmp / "h", agent_spec(steps=REMEMBERS_THE_FIRST_TURN)) as daemon:
        run_id = daemon.call("run", agent_id="writer", task="remember")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed", shown["run"]
    assert shown["final_reply"] == "saw alpha"


def test_a_lane_adds_each_turns_new_observations_and_refuses_a_gap() -> None:
    lane = Lane.__new__(Lane)  # only its history: no actor context needed
    lane.history = []
    first, second, third = {"n": 1}, {"n": 2}, {"n": 3}
    assert lane.provider_history(ProviderStep(loop=0, history=[first], history_from=0)) == (first,)
    later = ProviderStep(loop=0, history=[second, third], history_from=1)
    assert lane.provider_history(later) == (first, second, third)
    # A shaped view (compaction) is shown as sent and leaves the lane's copy alone.
    assert lane.provider_history(ProviderStep(loop=0, history=[{"summary": "s"}])) == ({"summary": "s"},)
    with pytest.raises(RuntimeError, match="starts at 1"):
        lane.provider_history(ProviderStep(loop=0, history=[third], history_from=1))
    assert lane.history == [first, second, third]


@pytest.mark.parametrize("have", [-1, "2", True, 1.5, 10**10])
def test_a_bad_history_count_is_refused(have: object) -> None:
    with pytest.raises(ProtocolError, match="history_have"):
        decode({"method": "run.next_step", "params": {"run_id": "r", "history_have": have}})
    assert decode({"method": "run.next_step", "params": {"run_id": "r"}}) == NextStep("r", 0)
    assert decode({"method": "run.next_step", "params": {"run_id": "r", "history_have": 7}}) == NextStep("r", 7)


async def test_a_batch_naming_an_action_twice_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.begin_boot("b1", 1, 1)
    service = RunService(ledger, NO_FEATURES, spec=empty_spec(), home=tmp_path, tree=None,  # type: ignore[arg-type]
                         boot_id="b1")
    slot = SimpleNamespace(id="writer", spec=SimpleNamespace(params={"agent_id": "writer"}))
    run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="writer", task="t", provider="scripted",
                                  provider_config={"script": {"steps": []}})
    ids = []
    for index in range(2):
        row = action_store.prepare_action(ledger, run_id, 0, index, "fs.list", {"path": "."}, NO_FEATURES,
                                          rerunnable=True,
                                       policy="auto")
        action_store.begin_action(ledger, row["action_id"], NO_FEATURES)
        ids.append(row["action_id"])
    cursor = ledger.last_cursor()
    twice = [ActionResult(ids[0], True, {"n": n}) for n in (1, 2)]
    with pytest.raises(BadRequest, match="more than once"):
        await service.action_finish_batch(slot, ActionFinishBatch(run_id, twice))  # type: ignore[arg-type]
    assert ledger.last_cursor() == cursor
    both = [ActionResult(the_id, True, {"n": n}) for n, the_id in enumerate(ids)]
    commits = ledger.commits
    await service.action_finish_batch(slot, ActionFinishBatch(run_id, both))  # type: ignore[arg-type]
    assert ledger.commits == commits + 1, "a batch's outcomes, receipts and observations: one commit"
    rows = ledger.all("SELECT a.phase, a.result, r.status FROM actions a JOIN receipts r USING (action_id)"
                      " ORDER BY a.action_index")
    assert [(row["phase"], json.loads(row["result"])["output"], row["status"]) for row in rows] == [
        ("ok", {"n": 0}, "ok"), ("ok", {"n": 1}, "ok")]
    ledger.close()

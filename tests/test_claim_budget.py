"""Seed 004, V1.35: "Runtime 只认领能够完整放入本轮 readyIsolatedJoins 私有观察预算的有序
前缀，剩余 ready group 保持未认领并由后续 action 继续取得 ... 单个 group 已超过完整观察上限时
在任何 claim mutation 前失败关闭."

Real supervisor and agents. The parent's ``agent.run_status`` waits for a person
(its policy is ``confirm``) until every join is ready, so what one claim sees does
not depend on which child finished first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.supervisor.swarm.claim_store import CLAIM_OBSERVATION_CHARS
from tests.harness import Daemon, ledger_rows, wait_for, wait_run

OUTPUT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def _spec(sizes: list[int]) -> str:
    """A parent that spawns one group per size (a child whose typed output is that many
    characters), then claims twice."""
    templates = "".join(
        f"""
[[templates]]
id = "big{n}"
output = {{ type = "object", properties = {{ text = {{ type = "string" }} }}, required = ["text"] }}
  [[templates.steps]]
  final = {{ text = "{"x" * size}" }}
"""
        for n, size in enumerate(sizes)
    )
    spawns = "".join(
        f"""
  [[agents.steps]]
  actions = [{{ tool = "agent.spawn_isolated", input = {{ children = [
      {{ template = "big{n}", task = "answer", write_scopes = ["s{n}"] }} ] }} }}]"""
        for n in range(len(sizes))
    )
    return f"""
[project]
root = "ws"
[policy]
"agent.run_status" = "confirm"
{templates}
[[agents]]
id = "parent"
{spawns}
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  actions = [{{ tool = "agent.run_status", input = {{}} }}]
  [[agents.steps]]
  final = "joined"
"""


def _start(short_tmp: Path, sizes: list[int]) -> tuple[Daemon, str]:
    (short_tmp / "ws").mkdir()
    spec = short_tmp / "spec.toml"
    spec.write_text(_spec(sizes))
    daemon = Daemon(short_tmp / "h", spec)
    daemon.up()
    run_id = daemon.call("run", agent_id="parent", task="fan out")["run_id"]
    wait_for(
        "every join ready",
        lambda: (
            len(
                ledger_rows(
                    daemon.home, "SELECT 1 FROM deliveries WHERE parent_run_id = ? AND status = 'dispatched'", run_id
                )
            )
            == len(sizes)
            or None
        ),
    )
    return daemon, run_id


def _approve_claim(daemon: Daemon, run_id: str) -> dict[str, Any]:
    wait_run(daemon, run_id, {"waiting-confirmation"})
    (action,) = [a for a in daemon.call("pending")["actions"] if a["run_id"] == run_id]
    daemon.call("continue_action", action_id=action["action_id"], decision="approve")
    wait_for(
        "the claim's outcome",
        lambda: (
            ledger_rows(
                daemon.home,
                "SELECT phase, result, error FROM actions WHERE action_id = ? AND phase IN ('ok', 'failed')",
                action["action_id"],
            )
            or None
        ),
    )
    (row,) = ledger_rows(
        daemon.home, "SELECT phase, result, error FROM actions WHERE action_id = ?", action["action_id"]
    )
    return dict(row)


def _deliveries(daemon: Daemon, run_id: str) -> list[Any]:
    return ledger_rows(
        daemon.home,
        "SELECT delivery_id, status FROM deliveries WHERE parent_run_id = ? ORDER BY created_at, delivery_id",
        run_id,
    )


def test_only_the_ordered_prefix_that_fits_the_observation_is_claimed_and_the_rest_waits(short_tmp: Path) -> None:
    size = CLAIM_OBSERVATION_CHARS * 3 // 5  # one fits, two do not
    daemon, run_id = _start(short_tmp, [size, size])
    try:
        first_in_order = _deliveries(daemon, run_id)[0]["delivery_id"]
        first = _approve_claim(daemon, run_id)
        assert first["phase"] == "ok", first
        claimed = json.loads(first["result"])["output"]["claimed"]
        assert [d["delivery_id"] for d in claimed] == [first_in_order]
        assert [d["status"] for d in _deliveries(daemon, run_id)] == ["claimed-by-parent", "dispatched"]
        # The observation the model sees holds the claimed join whole, not a cut preview.
        observations = ledger_rows(daemon.home, "SELECT data FROM observations WHERE run_id = ?", run_id)
        assert not any('"truncated"' in row["data"][:40] for row in observations)
        second = _approve_claim(daemon, run_id)
        assert second["phase"] == "ok", second
        assert [d["status"] for d in _deliveries(daemon, run_id)] == ["claimed-by-parent", "claimed-by-parent"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
    finally:
        daemon.shutdown()


def test_a_group_larger_than_a_whole_observation_fails_before_any_claim_mutation(short_tmp: Path) -> None:
    daemon, run_id = _start(short_tmp, [CLAIM_OBSERVATION_CHARS + 1000])
    try:
        refused = _approve_claim(daemon, run_id)
        assert refused["phase"] == "failed", refused
        assert "observation" in str(refused["error"]), refused
        assert ledger_rows(daemon.home, "SELECT * FROM claim_journal") == []
        assert [d["status"] for d in _deliveries(daemon, run_id)] == ["dispatched"]
        daemon.call("cancel", run_id=run_id)
    finally:
        daemon.shutdown()

"""A parent's claim of its delegations' receipts is bound by the delivery and claim
journals, not by the repository's fingerprint (seed 004 V1.16: "该工具的 claim 身份由
delivery/claim journal 约束，不受专业 Agent 写黑板或项目文件导致的全局 project revision /
repository fingerprint 漂移误伤").

Live (the strict re-audit's trial): the parent's plan delegates, reads AGENTS.md
(waiting for a person) and claims; the specialist rewrites AGENTS.md meanwhile
(once approved). The
read, planned on the old rules, fails as stale (it reads the project); the claim,
which reads only the ledger, runs and claims the specialist's receipt."""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness import Daemon, ledger_rows, wait_for, wait_run

SPEC = """
[project]
root = "ws"

[[agents]]
id = "boss"
role = "root"
[agents.policy]
"fs.read" = "confirm"
[[agents.steps]]
actions = [{ tool = "agent.delegate", input = { agent_id = "w", task = "update the rules" } },
           { tool = "fs.read", input = { path = "AGENTS.md" } },
           { tool = "agent.run_status", input = {} }]
[[agents.steps]]
final = "boss done"

[[agents]]
id = "w"
role = "specialist"
[agents.policy]
"fs.write" = "confirm"
[[agents.steps]]
actions = [{ tool = "fs.write", input = { path = "AGENTS.md", content = "# rules v2" } }]
[[agents.steps]]
final = "w done"
"""


def test_a_specialists_write_to_agents_md_does_not_make_the_parents_claim_stale(short_tmp: Path) -> None:
    ws = short_tmp / "ws"
    ws.mkdir()
    (ws / "AGENTS.md").write_text("# rules v1\n")
    spec = short_tmp / "spec.toml"
    spec.write_text(SPEC)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        boss = daemon.call("run", agent_id="boss", task="get the rules updated")["run_id"]
        (parked,) = wait_for(
            "the boss's read parked",
            lambda: ledger_rows(
                daemon.home, "SELECT action_id FROM actions WHERE run_id = ? AND phase = 'waiting-confirmation'", boss
            ),
        )
        (worker,) = wait_for(
            "the specialist's run",
            lambda: ledger_rows(daemon.home, "SELECT run_id FROM runs WHERE parent_run_id = ?", boss),
        )
        # The specialist's write waits for its person too, so it lands only once the
        # boss's read is parked (prepared and checked on the old rules), under load too.
        (write,) = wait_for(
            "the specialist's write parked",
            lambda: ledger_rows(
                daemon.home,
                "SELECT action_id FROM actions WHERE run_id = ? AND phase = 'waiting-confirmation'",
                worker["run_id"],
            ),
        )
        daemon.call("continue_action", action_id=write["action_id"], decision="approve")
        wait_run(daemon, str(worker["run_id"]), {"completed", "failed"})
        assert (ws / "AGENTS.md").read_text() == "# rules v2"  # the context moved under the boss's plan
        daemon.call("continue_action", action_id=parked["action_id"], decision="approve")
        shown = wait_run(daemon, boss, {"completed", "failed"})
        actions = [(a["loop_index"], a["action_index"], a["tool"], a["phase"], a["reason"]) for a in shown["actions"]]
        read, claim = actions[1], actions[2]
        assert read[2:4] == ("fs.read", "failed") and "stale:" in str(read[4]), actions  # it reads the project
        assert claim[2:4] == ("agent.run_status", "ok"), actions  # it reads the ledger
        (receipt,) = ledger_rows(
            daemon.home, "SELECT result FROM actions WHERE run_id = ? AND tool = ?", boss, "agent.run_status"
        )
        assert str(worker["run_id"]) in json.dumps(json.loads(receipt["result"])), receipt["result"]
        assert shown["run"]["status"] == "completed", shown["run"]
    finally:
        daemon.shutdown()

"""The agent builds an action's receipt and observation (issue 50 §4); the
supervisor checks them against the action's record, redacts them through its one
redaction path and stores them in the terminal move's transaction. A forged or
inconsistent receipt is refused with a clear error and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corral.actors.action_receipt import build_receipt
from corral.mailbox.protocol import ActionFinish, ActionFinishBatch, ActionResult, Receipt, decode
from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.runs import action_store, run_store
from corral.supervisor.runs.action_state import fingerprint
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.spec.swarm_spec import empty_spec

SECRET = "sk-ant-api03-" + "Zq7" * 12


class _Run:
    def __init__(self, tmp: Path) -> None:
        self.ledger = SqliteLedger(tmp / "ledger.db")
        self.ledger.begin_boot("b1", 1, 1)
        #: A supervisor with no features.
        self.features = RunFeatures()
        self.service = RunService(
            self.ledger,
            self.features,
            spec=empty_spec(),
            home=tmp,
            tree=None,  # type: ignore[arg-type]
            boot_id="b1",
        )
        self.slot: Any = SimpleNamespace(id="writer", spec=SimpleNamespace(params={"agent_id": "writer"}))
        self.run_id = run_store.create_run(
            self.ledger, self.features,
            agent_id="writer", task="t", provider="scripted", provider_config={"script": {"steps": []}}
        )

    def executing(self, index: int, tool_input: dict[str, Any], tool: str = "fs.list") -> str:
        row = action_store.prepare_action(
            self.ledger, self.run_id, 0, index, tool, tool_input, self.features, rerunnable=True, policy="auto"
        )
        action_store.begin_action(self.ledger, row["action_id"], self.features)
        return str(row["action_id"])

    def stored(self, the_id: str) -> tuple[Any, Any, Any]:
        action = self.ledger.one("SELECT phase, result FROM actions WHERE action_id = ?", the_id)
        receipt = self.ledger.one("SELECT * FROM receipts WHERE action_id = ?", the_id)
        observation = self.ledger.one("SELECT data FROM observations WHERE source = ?", the_id)
        return action, receipt, observation


def test_the_receipt_the_agent_built_is_stored_with_the_terminal_move(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    tool_input = {"path": "src", "pattern": "x" * 300}
    the_id = run.executing(0, tool_input)
    receipt = build_receipt("fs.list", tool_input)
    assert receipt.fingerprint == fingerprint("fs.list", tool_input)
    commits = run.ledger.commits
    result = ActionResult(the_id, True, {"entries": ["a"]}, "1 entry", receipt=receipt)
    _finish(run, ActionFinish.of(result, run.run_id))
    assert run.ledger.commits == commits + 1, "the outcome, its receipt and its observation: one commit"
    action, stored, observation = run.stored(the_id)
    assert action["phase"] == "ok"
    assert stored["status"] == "ok" and stored["input_summary"] == receipt.call
    assert stored["input_summary"] == "fs.list(path=src, pattern=<300 chars>)"
    data = json.loads(observation["data"])
    assert data["call"] == receipt.call and data["input"] == receipt.echo
    assert data["input"]["pattern"] == "x" * 200 + "…"
    assert data["output"] == {"entries": ["a"]} and data["status"] == "ok"


def test_a_secret_in_the_agents_receipt_is_redacted_before_it_is_stored(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    the_id = run.executing(0, {"path": "."})
    honest = build_receipt("fs.list", {"path": "."})
    # An agent (a bug, a tool's output echoed back) puts a secret in what it built.
    leaky = Receipt(honest.tool, honest.fingerprint, f"fs.list(path={SECRET})", {"path": SECRET})
    _finish(run, ActionFinish.of(ActionResult(the_id, True, {}, "ok", receipt=leaky), run.run_id))
    _, stored, observation = run.stored(the_id)
    assert SECRET not in stored["input_summary"] and "[redacted]" in stored["input_summary"]
    assert SECRET not in observation["data"]


def _forged(the_id: str, tool_input: dict[str, Any]) -> list[tuple[Receipt, str]]:
    honest = build_receipt("fs.list", tool_input)
    return [
        (Receipt("fs.write", honest.fingerprint, honest.call, honest.echo), "tool"),
        (Receipt(honest.tool, fingerprint("fs.list", {"path": "/etc"}), honest.call, honest.echo), "fingerprint"),
        (Receipt(honest.tool, honest.fingerprint, "c" * 5000, honest.echo), "call"),
        (Receipt(honest.tool, honest.fingerprint, honest.call, {"k": "v" * 100_000}), "input"),
    ]


@pytest.mark.parametrize("which", range(4))
async def test_a_forged_or_inconsistent_receipt_is_refused_and_changes_nothing(tmp_path: Path, which: int) -> None:
    run = _Run(tmp_path)
    tool_input = {"path": "."}
    the_id = run.executing(0, tool_input)
    forged, named = _forged(the_id, tool_input)[which]
    cursor, commits = run.ledger.last_cursor(), run.ledger.commits
    with pytest.raises(BadRequest, match=named):
        await run.service.action_finish(
            run.slot, ActionFinish.of(ActionResult(the_id, True, {}, "ok", receipt=forged), run.run_id)
        )
    assert (run.ledger.last_cursor(), run.ledger.commits) == (cursor, commits)
    action, stored, observation = run.stored(the_id)
    assert action["phase"] == "executing" and stored is None and observation is None


async def test_a_batch_with_one_forged_receipt_is_refused_whole(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    first, second = run.executing(0, {"path": "."}), run.executing(1, {"path": "."})
    good = build_receipt("fs.list", {"path": "."})
    bad = Receipt("fs.list", "0" * 64, good.call, good.echo)
    cursor = run.ledger.last_cursor()
    with pytest.raises(BadRequest, match="fingerprint"):
        await run.service.action_finish_batch(
            run.slot,
            ActionFinishBatch(
                run.run_id,
                [ActionResult(first, True, {}, "ok", receipt=good), ActionResult(second, True, {}, "ok", receipt=bad)],
            ),
        )
    assert run.ledger.last_cursor() == cursor
    assert [run.stored(the_id)[0]["phase"] for the_id in (first, second)] == ["executing", "executing"]


def test_a_receipt_on_the_wire_is_decoded_at_the_boundary() -> None:
    receipt = build_receipt("fs.list", {"path": "."})
    wire = {
        "action_id": "a",
        "ok": True,
        "receipt": {"tool": "fs.list", "fingerprint": receipt.fingerprint, "call": receipt.call, "echo": receipt.echo},
    }
    decoded = decode({"method": "action.finish", "params": wire})
    assert isinstance(decoded, ActionFinish) and decoded.result().receipt == receipt


def _finish(run: _Run, request: ActionFinish) -> None:
    import trio

    trio.run(run.service.action_finish, run.slot, request)

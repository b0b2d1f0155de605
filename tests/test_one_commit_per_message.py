"""One agent message, one commit (issue 50 §4): the step an agent reports and the
writes of the next step its reply carries (a loop's advance, the next actions
prepared and begun) are committed together, so a durable action pays for fewer
transactions. What the reply may only learn after an await (a provider turn
shaped by compaction, then begun) stays after that commit, and when the next
step fails, the step itself still commits alone, as when they were two."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from corral.mailbox.protocol import ActionFinishBatch, ActionResult, ProviderHandoff
from corral.mailbox.steps import ExecuteStep, ProviderStep
from corral.supervisor.errors import Conflict, NotFound
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.runs import provider_store, run_store
from corral.supervisor.runs.run_feature import RunFeature, RunFeatures
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.step_piggyback import StepPiggyback
from corral.supervisor.spec.swarm_spec import empty_spec

THREE_READS = {"actions": [{"tool": "fs.list", "input": {"path": "."}}] * 3}


class _BrokenBlocker(RunFeature):
    """A loop blocker that fails: the next step cannot be decided."""

    def loop_blocker(self, ledger: Any, run_id: str) -> Any:
        raise RuntimeError("the blocker broke")


def _service(tmp_path: Path, *features: RunFeature) -> tuple[SqliteLedger, RunService, Any, str]:
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.begin_boot("b1", 1, 1)
    installed = RunFeatures()
    installed.install(list(features))
    service = RunService(ledger, installed, spec=empty_spec(), home=tmp_path, tree=None,  # type: ignore[arg-type]
                         boot_id="b1")
    service.steps = StepPiggyback(ledger, service)  # as run_service.install does
    slot = SimpleNamespace(id="writer", spec=SimpleNamespace(params={"agent_id": "writer"}))
    run_id = run_store.create_run(ledger, installed, agent_id="writer", task="t", provider="scripted",
                                  provider_config={"script": {"steps": []}})
    assert run_store.claim_run(ledger, "writer", installed) is not None  # running, as the agent's claim leaves it
    return ledger, service, slot, run_id


def _turn(service: RunService, run_id: str) -> ProviderHandoff:
    """Loop 0's provider turn, begun; the handoff of its response, with its plan."""
    begun = provider_store.begin_provider_request(service.ledger, run_id, 0, service.features)
    return ProviderHandoff(run_id, begun["slot"], "three reads", plan=THREE_READS, want_next=True)


async def _handoff(service: RunService, slot: Any, run_id: str) -> ExecuteStep:
    step = (await service.steps.handoff(slot, _turn(service, run_id))).next  # type: ignore[arg-type]
    assert isinstance(step, ExecuteStep)
    return step


def _ids(step: ExecuteStep) -> list[str]:
    return [step.action_id, *(entry.action_id for entry in step.batch or ())]


async def test_a_handoff_its_plan_and_the_reads_it_begins_are_one_commit(tmp_path: Path) -> None:
    ledger, service, slot, run_id = _service(tmp_path)
    handoff = _turn(service, run_id)
    commits = ledger.commits
    reply = await service.steps.handoff(slot, handoff)  # type: ignore[arg-type]
    assert ledger.commits == commits + 1, "the response, the plan and the begun reads: one commit"
    step = reply.next
    assert isinstance(step, ExecuteStep) and step.begun and len(step.batch or ()) == 2
    phases = [row["phase"] for row in ledger.all("SELECT phase FROM actions ORDER BY action_index")]
    assert phases == ["executing"] * 3
    request = ledger.one("SELECT status, consumed FROM provider_requests WHERE run_id = ?", run_id)
    assert (request["status"], request["consumed"]) == ("completed", 1)
    kinds = [e["kind"] for e in ledger.events_since(0, limit=100)]
    assert kinds.index("provider-response-committed") < kinds.index("plan-committed") < kinds.index(
        "action-executing"
    ), "the events keep the order of the writes"
    ledger.close()


async def test_a_batchs_results_and_the_loops_advance_are_one_commit(tmp_path: Path) -> None:
    ledger, service, slot, run_id = _service(tmp_path)
    ids = _ids(await _handoff(service, slot, run_id))
    results = [ActionResult(the_id, True, {"n": n}) for n, the_id in enumerate(ids)]
    commits = ledger.commits
    reply = await service.steps.finish(  # type: ignore[arg-type]
        slot, ActionFinishBatch(run_id, results, want_next=True)
    )
    # The outcomes with the loop's advance; the next provider turn, begun once shaped.
    assert ledger.commits == commits + 2
    step = reply.next
    assert isinstance(step, ProviderStep) and step.loop == 1 and step.begun is not None
    assert run_store.get_run(ledger, run_id)["loop_index"] == 1
    assert [r["phase"] for r in ledger.all("SELECT phase FROM actions")] == ["ok"] * 3
    ledger.close()


async def test_when_the_next_step_fails_the_step_itself_still_commits(tmp_path: Path) -> None:
    ledger, service, slot, run_id = _service(tmp_path, _BrokenBlocker())
    ids = _ids(await _handoff(service, slot, run_id))
    results = [ActionResult(the_id, True, {"n": n}) for n, the_id in enumerate(ids)]
    with pytest.raises(RuntimeError, match="the blocker broke"):
        await service.steps.finish(slot, ActionFinishBatch(run_id, results, want_next=True))  # type: ignore[arg-type]
    rows = ledger.all("SELECT a.phase, r.status FROM actions a JOIN receipts r USING (action_id)")
    assert [(row["phase"], row["status"]) for row in rows] == [("ok", "ok")] * 3, "the results are kept"
    assert run_store.get_run(ledger, run_id)["loop_index"] == 0
    ledger.close()


def _statements(ledger: SqliteLedger) -> list[str]:
    statements: list[str] = []
    ledger.db.set_trace_callback(statements.append)
    return statements


async def test_a_batchs_actions_are_read_in_one_statement(tmp_path: Path) -> None:
    ledger, service, slot, run_id = _service(tmp_path)
    ids = _ids(await _handoff(service, slot, run_id))
    statements = _statements(ledger)
    results = [ActionResult(the_id, True, {"n": n}) for n, the_id in enumerate(ids)]
    await service.steps.finish(slot, ActionFinishBatch(run_id, results))  # type: ignore[arg-type]
    reads = [sql for sql in statements if sql.startswith("SELECT") and "FROM actions WHERE action_id" in sql]
    assert len(reads) == 1, reads
    # One that does not exist is refused by name, and nothing is written.
    with pytest.raises(NotFound, match="act-missing"):
        await service.steps.finish(  # type: ignore[arg-type]
            slot, ActionFinishBatch(run_id, [ActionResult(ids[0], True), ActionResult("act-missing", True)])
        )
    ledger.close()


async def test_a_handoff_completes_its_request_without_reading_it_first(tmp_path: Path) -> None:
    ledger, service, slot, run_id = _service(tmp_path)
    handoff = _turn(service, run_id)
    statements = _statements(ledger)
    await service.steps.handoff(slot, handoff)  # type: ignore[arg-type]
    assert not [sql for sql in statements if sql.startswith("SELECT status FROM provider_requests")]
    # A request that is no longer started: refused, and the response it had stands.
    cursor = ledger.last_cursor()
    again = ProviderHandoff(run_id, handoff.slot, "another response")
    with pytest.raises(Conflict, match="is completed, not started"):
        await service.steps.handoff(slot, again)  # type: ignore[arg-type]
    with pytest.raises(NotFound, match="no provider request"):
        await service.steps.handoff(slot, ProviderHandoff(run_id, f"{run_id}:9", "x"))  # type: ignore[arg-type]
    assert ledger.last_cursor() == cursor
    row = ledger.one("SELECT response FROM provider_requests WHERE slot = ?", handoff.slot)
    assert row["response"] == "three reads"
    ledger.close()

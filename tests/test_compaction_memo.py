"""Compaction's per-run memo (supervisor/longtask/compaction_memo.py): a run past its
token limits gets exactly the view and the compaction decisions that planning afresh
from the ledger gives, turn after turn, while each turn reads only the new rows."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
import trio

from corral.mailbox.steps import CompactStep, ProviderStep
from corral.supervisor.longtask import compaction, compaction_requests
from corral.supervisor.longtask.compaction_service import (
    CompactionFeature,
    CompactionService,
    _observations,
    _surely_within,
    fixed_tokens,
    latest,
)
from corral.supervisor.runs import run_store
from corral.supervisor.runs.run_feature import RunFeatures

#: The run layer's calls as on a supervisor with no features (nothing is installed).
NO_FEATURES = RunFeatures()

LIMITS = {"auto_compact": 900, "tool_output": 60}


class Tokenizer:
    """A local model's counts (not the estimate's), and the texts it was asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def count_tokens(self, model: str, texts: list[str]) -> list[int] | None:
        self.asked.extend(texts)
        return [len(text) // 3 + 2 for text in texts]


class Counting:
    """The ledger, with the statements compaction sends it counted (what it reads)."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.reads: list[tuple[str, tuple[Any, ...]]] = []

    def all(self, sql: str, *args: Any) -> Any:
        self.reads.append((sql, args))
        return self.ledger.all(sql, *args)

    def one(self, sql: str, *args: Any) -> Any:
        self.reads.append((sql, args))
        return self.ledger.one(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledger, name)


async def _afresh(ledger: Any, run_id: str, step: ProviderStep, models: Tokenizer | None) -> Any:
    """Today's shaping without a memo: every observation read, parsed and counted."""
    limits = LIMITS
    requested = ledger.one("SELECT 1 FROM compaction_requests WHERE run_id = ?", run_id) is not None
    previous = latest(ledger, run_id)
    fixed = fixed_tokens(ledger, run_id)
    if previous is None and not requested and _surely_within(ledger, run_id, limits, fixed):
        return step
    observations = _observations(ledger, run_id)
    count: compaction.Count = compaction.estimate_tokens
    if models is not None:
        texts = [t for _, e in observations for t in ([compaction.text_of(e)]
                 + ([compaction.text_of(e["output"])] if "output" in e else []))]
        if previous is not None:
            texts.append(compaction.text_of({"role": "summary", "text": previous["summary"],
                                             "covers": [int(previous["from_seq"]), int(previous["to_seq"])]}))
        known = dict(zip(texts, [len(t) // 3 + 2 for t in texts], strict=True))

        def count(value: Any) -> int:
            text = compaction.text_of(value)
            return known[text] if text in known else compaction.estimate_tokens(value)

    todo = compaction.plan(observations, previous, limits, requested=requested, count=count, overhead=fixed)
    if todo is not None:
        return CompactStep(loop=step.loop, from_seq=todo["from_seq"], to_seq=todo["to_seq"], entries=todo["entries"],
                           tokens_before=todo["tokens_before"])
    return msgspec.structs.replace(step, history=compaction.view(observations, previous, limits.get("tool_output"),
                                                                 count))


def _entry(i: int) -> dict[str, Any]:
    if i % 7 == 3:  # a content diff: the newest is protected
        return {"tool": "project.diff", "status": "ok", "action_id": f"a{i}", "output": f"diff {i} " + "+" * 300}
    if i % 5 == 0:  # a big output: cut at the tool-output limit
        return {"tool": "fs.read", "status": "ok", "action_id": f"a{i}", "output": {"text": "x" * (200 + i)}}
    return {"tool": "fs.list", "status": "ok", "action_id": f"a{i}", "output": [f"f{i}"]}


@pytest.mark.parametrize("local", [False, True], ids=["estimate", "local-tokenizer"])
def test_the_memo_gives_the_same_views_and_compactions_as_reading_everything(open_ledger: Any,
                                                                            local: bool) -> None:
    ledger = open_ledger()
    ledger.begin_boot("b", 1, 1)
    run_id = run_store.create_run(ledger, NO_FEATURES,
                                  agent_id="a", task="t", provider="local" if local else "scripted",
                                  provider_config={"model": "m"}, options={"context": LIMITS})
    tokenizer = Tokenizer()
    runs = SimpleNamespace(features=NO_FEATURES)  # what the service reads of the run layer
    service = CompactionService(ledger, runs, tokenizer if local else None)  # type: ignore[arg-type]
    kinds: list[str] = []
    afresh_asked = [0]

    async def main() -> None:
        for i in range(80):
            run_store.add_observation(ledger, run_id, f"s{i}", i, _entry(i))
            if i == 55:  # a person asks: planned afresh, the memo dropped
                with ledger.tx() as db:
                    db.execute("INSERT INTO compaction_requests (run_id, created_at) VALUES (?, ?)",
                               (run_id, time.time()))
            step = ProviderStep(loop=i)
            got = await service.shape_provider_step(run_id, step)
            want = await _afresh(ledger, run_id, step, tokenizer if local else None)
            slot = got.slot if isinstance(got, CompactStep) else None
            if isinstance(got, CompactStep):  # its request's lifecycle was begun (compaction_requests.py)
                assert slot == f"{run_id}:compact-{got.to_seq}"
                got = msgspec.structs.replace(got, slot=None)
            afresh_asked[0] += 2 * (i + 1)  # each observation's entry and its output
            assert got == want, f"turn {i}"
            kinds.append("bare" if isinstance(got, ProviderStep) and got.history is None else
                         "compact" if isinstance(got, CompactStep) else "view")
            if isinstance(got, CompactStep):  # the agent's summary lands (as context.compacted stores it)
                with ledger.tx() as db:
                    db.execute("INSERT INTO compactions (run_id, from_seq, to_seq, summary, tokens_before,"
                               " tokens_after, created_at) VALUES (?, 1, ?, ?, 0, 0, ?)",
                               (run_id, got.to_seq, f"summary up to {got.to_seq}", time.time()))
                    db.execute("DELETE FROM compaction_requests WHERE run_id = ?", (run_id,))
                    assert slot is not None
                    compaction_requests.complete(ledger, db, run_id, slot)

    trio.run(main)
    # The run went through every case: past the limits, cut, compacted several times.
    assert kinds.count("compact") >= 3 and kinds.count("view") > 40
    if local:  # each text was counted once per compaction's memo, not once per turn
        assert len(tokenizer.asked) * 4 < afresh_asked[0]


def test_a_turn_reads_only_the_rows_appended_since_the_last_and_an_ended_run_is_forgotten(
        open_ledger: Any) -> None:
    ledger = open_ledger()
    ledger.begin_boot("b", 1, 1)
    run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="a", task="t", provider="scripted", provider_config={},
                                  options={"context": {"auto_compact": 10**6, "tool_output": 60}})
    counting = Counting(ledger)
    service = CompactionService(counting, None, None)  # type: ignore[arg-type]
    seen: list[int] = []

    async def main() -> None:
        for i in range(1, 41):
            run_store.add_observation(ledger, run_id, f"s{i}", i, {"tool": "fs.read", "status": "ok",
                                                                  "output": "y" * 1000})
            counting.reads.clear()
            got = await service.shape_provider_step(run_id, ProviderStep(loop=i))
            assert isinstance(got, ProviderStep)
            reads = [args for sql, args in counting.reads if "FROM observations" in sql and "seq >" in sql]
            if got.history is not None:
                assert len(got.history) == i
                assert len(reads) == 1 and reads[0][1] == i - 1, reads  # from the last seq seen on
                seen.append(i)
                if i > 1:  # nor the aggregate read: the memo's existence answers it
                    assert not any("FROM observations" in sql and "seq >" not in sql for sql, _ in counting.reads)

    trio.run(main)
    assert len(seen) > 20  # most turns were past the limits
    # The run ends: its memo goes (after the commit of the status change).
    features = RunFeatures()
    features.install([CompactionFeature(service)])
    assert run_id in service._memos
    run_store.set_run_status(ledger, run_id, run_store.RunStatus.RUNNING, features)
    assert run_id in service._memos  # a status that is not an end keeps it
    run_store.set_run_status(ledger, run_id, run_store.RunStatus.COMPLETED, features)
    assert run_id not in service._memos

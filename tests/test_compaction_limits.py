"""Seed 004 V1.21, as a strict re-audit read it: a turn still over the auto limit with
nothing left to fold fails closed ("重建后仍超阈值或没有新的可压缩 prefix 时失败关闭并给出配置/新
Session 建议，不能继续发送已知超限请求"), and delegated and isolated runs carry token limits
(a specialist its own, a child its parent's), so their turns compact too."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import trio

from corral.mailbox.steps import CompactStep, ProviderStep
from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
from corral.supervisor.longtask import compaction, compaction_service
from corral.supervisor.longtask.compaction_service import CompactionService
from corral.supervisor.runs import action_store, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.spec.swarm_spec import parse_spec
from corral.supervisor.swarm import children_store, delegation_store
from tests.harness import Daemon, agent_spec, ledger_rows, wait_run

NO_FEATURES = RunFeatures()


def test_a_turn_over_the_limit_with_nothing_to_fold_fails_closed_and_is_never_sent(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    for n in range(40):
        (short_tmp / "ws" / f"file-with-a-long-name-{n:02}.txt").write_text("x")
    steps = '[[agents.steps]]\nactions = [{ tool = "fs.list", input = { path = "." } }]\n' * 6
    spec = short_tmp / "spec.toml"
    # Each listing is cut at 60 tokens; two of them with their envelopes pass 100 while
    # only the newest four (never folded) follow: nothing to fold.
    spec.write_text(agent_spec(steps=steps + '[[agents.steps]]\nfinal = "too long"\n',
                               policy="auto_compact_token_limit = 100\ntool_output_token_limit = 60"))
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="list")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "failed", "a request known to be over the limit is not sent"
        reason = shown["run"]["reason"] or ""
        assert "auto_compact_token_limit 100" in reason and "start a new run" in reason, reason
        observations = ledger_rows(daemon.home, "SELECT seq FROM observations WHERE run_id = ?", run_id)
        requests = ledger_rows(daemon.home, "SELECT slot FROM provider_requests WHERE run_id = ?", run_id)
        assert 0 < len(observations) <= 4, "it stopped while nothing was foldable"
        assert len(requests) == len(observations), "one request per turn before the limit, none past it"
        assert ledger_rows(daemon.home, "SELECT * FROM compactions WHERE run_id = ?", run_id) == []
    finally:
        daemon.shutdown()


def test_delegated_and_isolated_runs_carry_token_limits(tmp_path: Path) -> None:
    spec = parse_spec({
        "project": {"root": str(tmp_path)},
        "templates": [{"id": "writer", "steps": [{"final": "x"}]}],
        "agents": [
            {"id": "boss", "steps": [{"final": "x"}], "context_window": 32_000, "auto_compact_token_limit": 20_000},
            {"id": "helper", "role": "specialist", "steps": [{"final": "x"}], "context_window": 16_000},
        ],
    }, str(tmp_path / "spec.toml"))
    ledger = SqliteLedger(tmp_path / "ledger.db")
    boss = {"window": 32_000, "auto_compact": 20_000, "tool_output": 12_000}
    try:
        ledger.begin_boot("b", 1, 1)
        root = run_store.create_run(ledger, NO_FEATURES, agent_id="boss", task="t", provider="scripted",
                                    provider_config={}, options={"workspace": str(tmp_path), "context": boss})
        run_store.set_run_status(ledger, root, run_store.RunStatus.RUNNING, NO_FEATURES)
        made = []
        for index, tool in enumerate(("agent.delegate", "agent.spawn_isolated")):
            action = action_store.prepare_action(ledger, root, 0, index, tool, {"n": index}, NO_FEATURES,
                                                 rerunnable=True, policy="auto")
            action_store.move_action(ledger, action["action_id"], ActionPhase.EXECUTING)
            parent = run_store.get_run(ledger, root)
            if tool == "agent.delegate":
                made.append(delegation_store.delegate(ledger, spec, parent, action["action_id"],
                                                      {"agent_id": "helper", "task": "write the notes"},
                                                      NO_FEATURES)["run_id"])
            else:
                group = children_store.spawn_group(
                    ledger, spec, parent, action["action_id"],
                    [{"template": "writer", "task": "work in a", "write_scopes": ["a"],
                      "expected_artifacts": ["a/out.md"]}], "all", NO_FEATURES)
                made.append(group["children"][0]["run_id"])
        contexts = [json.loads(run_store.get_run(ledger, run_id)["options"]).get("context") for run_id in made]
    finally:
        ledger.close()
    assert contexts == [{"window": 16_000, "auto_compact": 12_000, "tool_output": 12_000}, boss]


def test_the_estimate_counts_the_task_the_system_prompt_and_the_tool_schemas(tmp_path: Path) -> None:
    """"按消息、multimodal 文本和 function schema 的规范序列化字符数做保守 token 估算": a run whose
    observations alone are far below the auto limit compacts once what its turns carry
    besides them (the system prompt and the tool catalog its last turn was sent) passes it."""
    ledger = SqliteLedger(tmp_path / "ledger.db")
    try:
        ledger.begin_boot("b", 1, 1)
        run_id = run_store.create_run(ledger, NO_FEATURES, agent_id="a", task="list the files", provider="scripted",
                                      provider_config={}, options={"context": {"auto_compact": 1000,
                                                                               "tool_output": 60}})
        for seq in range(1, 9):
            run_store.add_observation(ledger, run_id, f"s{seq}", seq, {"tool": "fs.list", "status": "ok",
                                                                       "action_id": f"a{seq}", "output": [f"f{seq}"]})
        system, catalog = "You are corral's agent. " * 150, json.dumps([{"name": "fs.list", "schema": "x" * 900}])
        with ledger.tx() as db:
            db.execute("INSERT INTO provider_requests (slot, run_id, loop_index, attempt, status, boot_id, started_at,"
                       " system_sha256, catalog_sha256) VALUES (?, ?, 7, 0, 'completed', 'b', 0, ?, ?)",
                       (f"{run_id}:7", run_id, _sha(system), _sha(catalog)))
            for kind, text in (("system", system), ("catalog", catalog)):
                db.execute("INSERT INTO transcript_blobs (sha256, kind, text, created_at) VALUES (?, ?, ?, 0)",
                           (_sha(text), kind, text))
        service = CompactionService(ledger, SimpleNamespace(features=NO_FEATURES), None)  # type: ignore[arg-type]
        shaped = trio.run(service.shape_provider_step, run_id, ProviderStep(loop=8))
        history = sum(compaction.estimate_tokens(entry) for _, entry in compaction_service._observations(ledger,
                                                                                                      run_id))
    finally:
        ledger.close()
    assert history < 1000 / 2, "the observations alone are far below the limit"
    assert isinstance(shaped, CompactStep), "the system prompt and the tool schemas count too"
    assert shaped.to_seq == 4 and shaped.tokens_before > 1000
    assert shaped.tokens_before >= history + (len(system) + len(catalog)) // compaction.CHARS_PER_TOKEN


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()

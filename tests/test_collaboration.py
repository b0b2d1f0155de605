"""The collaboration policy (seed 004 V1.32, V1.37, V1.38): a root run's first wave
is preflighted whole against the project's policy, every collaboration batch that
passes becomes a v2 batch with a contract fingerprint (the first binds the run's
policy snapshot), a delegation or spawn takes effect only as a member of its
batch's contract, a root that delegated only orchestrates, the first claim waits
for ``minIsolatedGroupsBeforeClaim`` groups, and only the CLI writes the file."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from corral.core import strict_json
from corral.core.fingerprint import fingerprint
from corral.core.procs import wait_exit
from corral.supervisor.context import collaboration
from corral.supervisor.context.collaboration import Policy
from corral.supervisor.home.home_dir import LEDGER
from tests.harness import Daemon, cli, ledger_rows, wait_for, wait_run

DEMO = Path(__file__).resolve().parent.parent / "corral" / "defaults" / "demo.toml"


def _delegate(agent: str, repair_of: str | None = None) -> dict[str, Any]:
    extra = {"repair_of": repair_of} if repair_of else {}
    return {"tool": "agent.delegate", "input": {"agent_id": agent, "task": f"work for {agent}", **extra}}


def _spawn(children: int) -> dict[str, Any]:
    return {"tool": "agent.spawn_isolated", "input": {"join_mode": "all", "children": [
        {"template": "writer", "task": f"draft {n}", "expected_artifacts": [f"draft/c{n}/d.md"],
         "write_scopes": [f"draft/c{n}"]} for n in range(children)]}}


# -- the pure rules, table-driven ---------------------------------------------------


def test_without_a_policy_file_the_seeds_defaults_hold() -> None:
    # "缺失时使用 requiredInitialWave=auto、minStaticDelegates=0、requiredStaticAgentIds=[]、
    # minIsolatedChildren=0、orchestratorOnlyAfterDelegation=true"
    assert collaboration.parse("{}") == Policy()
    assert Policy().as_json() == {"requiredInitialWave": "auto", "minStaticDelegates": 0,
                                  "requiredStaticAgentIds": [], "minIsolatedChildren": 0,
                                  "orchestratorOnlyAfterDelegation": True}
    assert not collaboration.wants_a_wave(Policy())


@pytest.mark.parametrize(("text", "message"), [
    # "requiredInitialWave 只接受 auto / static / isolated / mixed"
    ('{"requiredInitialWave": true}', "requiredInitialWave: True is not one of auto, static, isolated, mixed"),
    ('{"requiredInitialWave": "yes"}', "requiredInitialWave: 'yes' is not one of auto, static, isolated, mixed"),
    # "三项必须在单个最多 3 action 的 native Provider 批次内可满足"
    ('{"requiredInitialWave": "mixed", "minStaticDelegates": 3}', "one provider batch holds at most 3"),
    ('{"requiredStaticAgentIds": ["a", "b"], "minIsolatedChildren": 2, "minStaticDelegates": 3}',
     "one provider batch holds at most 3"),
    # "拒绝 project-supervisor 与 child-* 冒充静态专业 Agent"
    ('{"requiredStaticAgentIds": ["project-supervisor"]}', "is not a static specialist"),
    ('{"requiredStaticAgentIds": ["child-1"]}', "is not a static specialist"),
    # V1.37: "默认值为 0，上限为 16"
    ('{"minIsolatedGroupsBeforeClaim": 17}', "minIsolatedGroupsBeforeClaim: must be a finite number between 0 and 16"),
    ('{"minIsolatedGroupsBeforeClaim": -1}', "between 0 and 16"),
    ('{"surprise": 1}', "unknown key 'surprise'"),
    ('{"a": 1, "a": 2}', "duplicate"),
    ("[]", "expected dict, got list"),
])
def test_a_policy_the_seed_does_not_allow_is_refused(text: str, message: str) -> None:
    with pytest.raises(collaboration.PolicyError, match=message):
        collaboration.parse(text)


@pytest.mark.parametrize("mode", ["auto", "static", "isolated", "mixed"])
def test_each_of_the_four_modes_is_a_policy(mode: str) -> None:
    assert collaboration.parse(json.dumps({"requiredInitialWave": mode})).requiredInitialWave == mode


def test_min_isolated_groups_before_claim_is_left_out_at_zero_so_old_fingerprints_hold() -> None:
    # "零值序列化时省略，因此旧 policy fingerprint ... 保持不变"
    old = {"requiredInitialWave": "auto", "minStaticDelegates": 0, "requiredStaticAgentIds": [],
           "minIsolatedChildren": 0, "orchestratorOnlyAfterDelegation": True}
    assert collaboration.parse(json.dumps({**old, "minIsolatedGroupsBeforeClaim": 0})).digest == strict_json.sha256(old)
    sixteen = collaboration.parse('{"minIsolatedGroupsBeforeClaim": 16}')
    assert sixteen.as_json()["minIsolatedGroupsBeforeClaim"] == 16
    assert collaboration.from_snapshot(sixteen.as_json()) == sixteen


MIXED: dict[str, Any] = {"requiredInitialWave": "mixed", "requiredStaticAgentIds": ("researcher",),
                         "minIsolatedChildren": 3}


@pytest.mark.parametrize(("policy", "actions", "short"), [
    (MIXED, [_delegate("researcher"), _spawn(3)], []),
    # "mixed 同时要求两类"
    (MIXED, [_delegate("researcher")], ["one group of 3+ isolated children (this plan's has 0)"]),
    # "isolated 最低数量必须由同一个 ... group 的 children 满足，不能把多个 ... 小 group 相加，
    # 单个 Provider 批次也最多包含一个 spawn"
    (MIXED, [_delegate("researcher"), _spawn(2), _spawn(1)], ["one agent.spawn_isolated per batch at most"
                                                              " (this plan has 2)"]),
    (MIXED, [_delegate("researcher"), _spawn(2)], ["one group of 3+ isolated children (this plan's has 2)"]),
    # "required Agent ID 只匹配非 repair 的 initial agent.delegate"
    (MIXED, [_delegate("researcher", repair_of="dlg-1"), _spawn(3)],
     ["1 initial agent.delegate (this plan has 0)", "a delegation to researcher"]),
    # "static 与 isolated 模式分别至少要求一项对应协作"
    ({"requiredInitialWave": "static"}, [_spawn(1)],
     ["1 initial agent.delegate (this plan has 0)"]),
    ({"requiredInitialWave": "isolated"}, [_delegate("reviewer")],
     ["one group of 1+ isolated children (this plan's has 0)"]),
    ({"requiredInitialWave": "isolated"}, [_spawn(1)], []),
    ({"minStaticDelegates": 2}, [_delegate("reviewer"), _delegate("researcher")], []),
])
def test_the_first_wave_rules(policy: dict[str, Any], actions: list[dict[str, Any]], short: list[str]) -> None:
    assert collaboration.wave_shortfalls(Policy(**policy), actions) == short


@pytest.mark.parametrize(("plan", "checked"), [
    # "首波要求尚未满足时，普通读取、project.verify、agent.run_status 和计划更新仍可进行；
    # 一旦 Supervisor 请求项目 mutation 或开始任何一类协作，Runtime 必须整批预检"
    ({"actions": [{"tool": "fs.read", "input": {}}, {"tool": "project.verify", "input": {}},
                  {"tool": "agent.run_status", "input": {}}]}, False),
    ({"actions": [{"tool": "fs.write", "input": {}}]}, True),
    ({"actions": [{"tool": "command.exec", "input": {}}]}, True),
    ({"actions": [_delegate("reviewer")]}, True),
    ({"final": "done"}, True),
])
def test_what_an_unbound_root_plan_is_preflighted_for(plan: dict[str, Any], checked: bool) -> None:
    assert collaboration.needs_preflight(Policy(**MIXED), plan) is checked
    # Without a policy asking for a wave, only a collaboration is a batch to check.
    assert collaboration.needs_preflight(Policy(), plan) is ("actions" in plan and "agent.delegate" in json.dumps(plan))


@pytest.mark.parametrize(("tool", "allowed"), [
    # "总控只编排门禁继续允许读取、checkpoint/diff、project.verify、受限静态验证、进程观察与收束
    # （command.poll / command.terminate）、任务编排、黑板/消息、agent.run_status、新的合法
    # isolated 检查，以及继承原合同的唯一 repair agent.delegate"
    *[(tool, True) for tool in ("fs.read", "fs.list", "project.diff", "project.git_snapshot", "project.git_diff",
                                "project.verify", "process.poll", "process.terminate", "agent.run_status",
                                "goal.verdict", "agent.spawn_isolated", "agent.delegate", "command.output_read")],
    # "不得执行 file.write / file.patch / file.delete / project.patchset / project.restore /
    # project.git_commit / command.exec / command.start / command.stdin"
    *[(tool, False) for tool in ("fs.write", "fs.patch", "project.changeset", "project.restore", "project.git_commit",
                                 "command.exec", "process.start", "process.stdin", "effect.record", "mcp.github.push")],
])
def test_the_orchestration_allow_list(tool: str, allowed: bool) -> None:
    assert (collaboration.action_refusal(Policy(), tool, delegated=True) is None) is allowed
    assert collaboration.action_refusal(Policy(), tool, delegated=False) is None
    assert collaboration.action_refusal(Policy(orchestratorOnlyAfterDelegation=False), tool, delegated=True) is None
    # "或者当前原子批次正在创建协作": a batch that delegates and works alone is refused whole.
    refused = collaboration.orchestration_refusal(Policy(), ["agent.delegate", tool])
    assert (refused is None) is allowed


@pytest.mark.parametrize(("hints", "effect", "read_only"), [
    ({"read_only": True, "destructive": False}, None, True),
    ({"read_only": True, "destructive": None}, None, False),  # incomplete: fails closed
    ({"read_only": True, "destructive": True}, None, False),
    ({"read_only": None, "destructive": False}, None, False),
    ({"read_only": True, "destructive": False}, "external", False),  # the user's spec says otherwise
])
def test_an_mcp_tool_declaring_read_only_and_not_destructive_is_a_read_after_delegation(
    tmp_path: Path, hints: dict[str, Any], effect: str | None, read_only: bool
) -> None:
    """V1.32: "MCP 只有同时声明 readOnlyHint=true 与 destructiveHint=false 才视为只读，破坏性或注解不完整的
    MCP 在首批原子预检和委派后执行阶段都失败关闭" (a strict re-audit found every MCP tool refused)."""
    from corral.supervisor.context.collaboration_service import CollaborationService
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger
    from corral.supervisor.mcp.mcp_catalog import build_catalog, pin, read_only_tools
    from corral.supervisor.mcp.mcp_spec import parse_server

    server = parse_server("s", {"id": "docs", "command": ["x"], **({"effect": effect} if effect else {})})
    entry = {"name": "search", "description": "", "input_schema": {"type": "object"}, "annotations": hints}
    ledger = SqliteLedger(tmp_path / "ledger.db")
    ledger.boot_id = "boot"
    try:
        pin(ledger, "run-1", "docs", build_catalog(server, [entry]))
        reads = read_only_tools(ledger, "run-1")
        assert ("mcp.docs.search" in reads) is read_only
        after = collaboration.action_refusal(Policy(), "mcp.docs.search", delegated=True, reads=reads)
        assert (after is None) is read_only
        batch = collaboration.orchestration_refusal(Policy(), ["agent.delegate", "mcp.docs.search"], reads)
        assert (batch is None) is read_only
        # Before a wave the policy asks for, a read-only MCP tool is a read, not a wave to preflight.
        plan = {"actions": [{"tool": "mcp.docs.search", "input": {}}]}
        assert collaboration.needs_preflight(Policy(**MIXED), plan, reads) is not read_only
        # A service reads the same from the run's pin.
        service = CollaborationService(ledger, tmp_path / "project")
        assert service.mcp_reads("run-1", ["mcp.docs.search"]) == reads
    finally:
        ledger.close()


def _stored(policy: Policy, actions: list[dict[str, Any]], run_id: str = "run-1", loop: int = 0) -> dict[str, Any]:
    contract = collaboration.batch_contract(policy, actions)
    digest = collaboration.contract_fingerprint(contract)
    return {"batch_id": collaboration.batch_id(run_id, loop, digest), "contract": json.dumps(contract),
            "contract_fingerprint": digest, "policy_fingerprint": policy.digest}


def test_the_v2_batch_contract_binds_policy_specialists_children_and_members() -> None:
    actions = [_delegate("researcher"), {"tool": "fs.read", "input": {"path": "a"}}, _spawn(3)]
    mixed = Policy(**MIXED)
    contract = collaboration.batch_contract(mixed, actions)
    assert contract["version"] == 2 and contract["policyFingerprint"] == mixed.digest
    assert contract["policy"] == mixed.as_json()
    assert contract["staticAgentIds"] == ["researcher"] and contract["isolatedChildren"] == [3]
    assert [m["index"] for m in contract["members"]] == [0, 2]
    # The batch id binds the contract: another contract is another batch.
    other = collaboration.batch_contract(mixed, [_delegate("reviewer"), _spawn(3)])
    assert collaboration.batch_id("run-1", 0, collaboration.contract_fingerprint(contract)) != collaboration.batch_id(
        "run-1", 0, collaboration.contract_fingerprint(other))


def _member(action: dict[str, Any]) -> str:
    return fingerprint(action["tool"], action["input"])


@pytest.mark.parametrize(("case", "refusal"), [
    ("member", None),
    ("v1", "no v2 collaboration batch holds this action"),
    ("tampered", "does not bind its contract"),
    ("drifted", "is not the run's bound snapshot"),
    ("not-a-member", "is not one of its members"),
    ("other-input", "is not one of its members"),
])
def test_a_collaboration_action_takes_effect_only_as_a_member_of_its_contract(case: str, refusal: str | None) -> None:
    actions = [_delegate("researcher"), _spawn(3)]
    stored: dict[str, Any] | None = _stored(Policy(**MIXED), actions)
    bound, index, tool, digest = Policy(**MIXED), 0, "agent.delegate", _member(actions[0])
    if case == "v1":
        stored = None
    elif case == "tampered":
        assert stored is not None
        stored["contract"] = json.dumps({**json.loads(stored["contract"]), "staticAgentIds": ["reviewer"]})
    elif case == "drifted":
        bound = Policy()
    elif case == "not-a-member":
        index = 1
    elif case == "other-input":
        digest = _member(_delegate("reviewer"))
    why = collaboration.member_refusal(stored, bound, "run-1", 0, index, tool, digest)
    assert (why is None) if refusal is None else (why is not None and refusal in why)


@pytest.mark.parametrize(("need", "groups", "ready", "waits"), [
    (0, 0, 0, False), (2, 1, 1, True), (2, 2, 1, True), (2, 1, 2, True), (2, 2, 2, False), (16, 16, 16, False),
])
def test_the_first_claim_waits_for_the_groups_the_policy_names(need: int, groups: int, ready: int, waits: bool) -> None:
    # "同时校验已建立的 durable isolated group 数和该批 ready group 数均达到 minIsolatedGroupsBeforeClaim"
    policy = Policy(minIsolatedGroupsBeforeClaim=need)
    assert (collaboration.claim_shortfall(policy, groups, ready) is not None) is waits


@pytest.mark.parametrize(("policy", "delegated_to", "groups", "short"), [
    ({}, [], [], 0),
    (MIXED, ["researcher"], [3], 0),
    (MIXED, ["reviewer"], [3], 1),
    (MIXED, ["researcher"], [2, 2], 1),
    ({"minIsolatedGroupsBeforeClaim": 2}, [], [1], 1),
    ({"minIsolatedGroupsBeforeClaim": 2}, [], [1, 1], 0),
])
def test_a_final_reply_waits_for_the_durable_facts(policy: dict[str, Any], delegated_to: list[str],
                                                    groups: list[int], short: int) -> None:
    # "配置要求的 initial static/isolated 事实缺失 ... 原 Supervisor run 必须回到 planning"
    assert len(collaboration.completion_shortfalls(Policy(**policy), delegated_to, groups)) == short


# -- end to end, on a real supervisor -------------------------------------------------

WAVE_POLICY = {"requiredInitialWave": "mixed", "requiredStaticAgentIds": ["researcher"], "minIsolatedChildren": 2}
# Each refusal keeps the run in loop 0 until a wave passes; the conditions read them.
WAVE_SCRIPT = {"steps": [
    {"unless_observed": "the first wave needs", "actions": [
        {"tool": "fs.write", "input": {"path": "notes.md", "content": "alone"}}]},
    {"when_observed": "this plan's has 0", "unless_observed": "per batch at most",
     "actions": [_delegate("researcher"), _spawn(1), _spawn(1)]},
    {"when_observed": "per batch at most", "actions": [_delegate("researcher"), _spawn(2)]},
    {"actions": [{"tool": "fs.write", "input": {"path": "notes.md", "content": "after the wave"}}]},
    {"final": "done"},
]}


def _demo(short_tmp: Path, policy: dict[str, Any] | None = None) -> Daemon:
    (short_tmp / "project").mkdir()
    if policy is not None:
        (short_tmp / "project" / ".corral").mkdir()
        (short_tmp / "project" / ".corral" / "collaboration-policy.json").write_text(json.dumps(policy))
    spec = short_tmp / "swarm.toml"
    spec.write_text(DEMO.read_text())
    return Daemon(short_tmp / "h", spec)


def _refusals(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    """Each refusal's public event, with the detail the model was told (its repair
    observation; the event keeps only the detail's hash and length)."""
    events = [json.loads(e["data"]) for e in ledger_rows(
        daemon.home, "SELECT data FROM events WHERE kind = 'plan-invalid' AND subject = ? ORDER BY cursor", run_id)]
    told = [json.loads(o["data"]) for o in ledger_rows(
        daemon.home, "SELECT data FROM observations WHERE run_id = ? AND source LIKE 'repair:%' ORDER BY seq", run_id)]
    assert all("detail" not in event for event in events), events
    return [{**event, "detail": repair["detail"]} for event, repair in zip(events, told, strict=False)]


def test_a_mixed_first_wave_is_preflighted_whole_and_the_passing_one_is_a_v2_batch(short_tmp: Path) -> None:
    daemon = _demo(short_tmp, WAVE_POLICY)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="project-supervisor", task="plan the launch",
                             script=json.dumps(WAVE_SCRIPT))["run_id"]
        write = wait_for("the write after the wave", lambda: ledger_rows(
            daemon.home, "SELECT phase, reason, loop_index FROM actions WHERE run_id = ? AND tool = 'fs.write'"
            " AND phase IN ('denied', 'ok', 'failed')", run_id) or None)
        refusals = _refusals(daemon, run_id)
        assert [(r["category"], r["rule"]) for r in refusals] == [("batch-constraint", "collaboration-policy")] * 2
        # A mutation before the wave: the whole plan is checked, and it lacks both kinds.
        assert "a delegation to researcher" in refusals[0]["detail"]
        assert "one group of 2+ isolated children (this plan's has 0)" in refusals[0]["detail"]
        # Two groups of one child do not add up to the two one group must hold.
        assert "one agent.spawn_isolated per batch at most (this plan has 2)" in refusals[1]["detail"]
        # The refused batches created nothing: one delegation, one group of two children.
        delegations = ledger_rows(daemon.home, "SELECT target_agent, parent_action_id FROM delegations"
                                  " WHERE parent_run_id = ?", run_id)
        assert [d["target_agent"] for d in delegations] == ["researcher"]
        groups = ledger_rows(daemon.home, "SELECT g.group_id, COUNT(c.delegation_id) AS n FROM isolated_groups g"
                             " JOIN children c ON c.group_id = g.group_id WHERE g.parent_run_id = ?"
                             " GROUP BY g.group_id", run_id)
        assert [g["n"] for g in groups] == [2]
        assert not (short_tmp / "project" / "notes.md").exists(), "the refused first plan wrote nothing"
        # The passing batch is one v2 batch: its contract, its SHA-256, an id binding both.
        (batch,) = ledger_rows(daemon.home, "SELECT * FROM collaboration_batches WHERE run_id = ?", run_id)
        contract = json.loads(batch["contract"])
        policy = collaboration.parse(json.dumps(WAVE_POLICY))
        assert batch["version"] == 2 and contract["version"] == 2
        assert contract["policy"] == policy.as_json() and batch["policy_fingerprint"] == policy.digest
        assert contract["staticAgentIds"] == ["researcher"] and contract["isolatedChildren"] == [2]
        assert batch["contract_fingerprint"] == collaboration.contract_fingerprint(contract)
        assert batch["batch_id"] == collaboration.batch_id(run_id, batch["loop_index"], batch["contract_fingerprint"])
        members = ledger_rows(daemon.home, "SELECT action_id, action_index, fingerprint FROM actions WHERE run_id = ?"
                              " AND loop_index = ? AND tool IN ('agent.delegate', 'agent.spawn_isolated')"
                              " ORDER BY action_index", run_id, batch["loop_index"])
        assert [(m["action_index"], m["fingerprint"]) for m in members] == [
            (m["index"], m["fingerprint"]) for m in contract["members"]]
        (binding,) = ledger_rows(daemon.home, "SELECT digest, loop_index FROM collaboration_bindings"
                                 " WHERE run_id = ?", run_id)
        assert binding == {"digest": policy.digest, "loop_index": batch["loop_index"]}
        # orchestratorOnlyAfterDelegation is true by default: the write after the wave is denied.
        assert [w["phase"] for w in write] == ["denied"] and "only orchestrates" in write[0]["reason"]
        assert not (short_tmp / "project" / "notes.md").exists()
    finally:
        daemon.shutdown()


def test_a_replayed_delegation_whose_batch_contract_no_longer_holds_is_left_to_a_person(short_tmp: Path) -> None:
    # "恢复 ... 都必须先重新校验项目策略、合同和 batch 身份，再考虑 pending action 恢复或 replay；
    # ... 合同/动作不一致或旧 v1 协作批次统一进入 needs-reconciliation"
    daemon = _demo(short_tmp)
    try:
        first = daemon.up(env={"CORRAL_FAILPOINTS": "action.after-executing=kill@once"})
        script = {"steps": [{"actions": [_delegate("researcher")]}, {"final": "done"}]}
        run_id = daemon.call("run", agent_id="project-supervisor", task="survey", script=json.dumps(script))["run_id"]
        assert wait_exit(first.pid, 60), "the failpoint did not kill the supervisor"
        (executing,) = ledger_rows(daemon.home, "SELECT action_id, phase FROM actions WHERE run_id = ?", run_id)
        assert executing["phase"] == "executing"
        with sqlite3.connect(daemon.home / LEDGER) as db:  # the batch's contract, changed while it was down
            changed = db.execute("UPDATE collaboration_batches SET contract = replace(contract, 'researcher',"
                                 " 'reviewer') WHERE run_id = ?", (run_id,)).rowcount
        assert changed == 1
        daemon.up()
        shown = wait_run(daemon, run_id, {"needs-reconciliation", "completed", "failed"})
        assert shown["run"]["status"] == "needs-reconciliation", shown["run"]
        (action,) = ledger_rows(daemon.home, "SELECT phase, reason FROM actions WHERE run_id = ?", run_id)
        assert action["phase"] == "needs-reconciliation" and "does not bind its contract" in action["reason"]
        # Zero replay: no delegation, no specialist run, no delivery.
        assert ledger_rows(daemon.home, "SELECT * FROM delegations") == []
        assert ledger_rows(daemon.home, "SELECT * FROM deliveries") == []
    finally:
        daemon.shutdown()


GROUPS_SPEC = """
[project]
root = "ws"
[policy]
"agent.run_status" = "confirm"
[[templates]]
id = "quick"
  [[templates.steps]]
  final = "checked"
[[agents]]
id = "parent"
  [[agents.steps]]
  actions = [{ tool = "agent.spawn_isolated", input = { children = [
      { template = "quick", task = "check a", write_scopes = ["a"] } ] } }]
  [[agents.steps]]
  actions = [{ tool = "agent.run_status", input = {} }]
  [[agents.steps]]
  actions = [{ tool = "agent.spawn_isolated", input = { children = [
      { template = "quick", task = "check b", write_scopes = ["b"] } ] } }]
  [[agents.steps]]
  actions = [{ tool = "agent.run_status", input = {} }]
  [[agents.steps]]
  final = "joined"
"""


def _claim_when_ready(daemon: Daemon, run_id: str, ready: int) -> dict[str, Any]:
    """Approve the parent's next claim once ``ready`` joins wait for it: its outcome."""
    wait_for(f"{ready} ready join(s)", lambda: len(ledger_rows(
        daemon.home, "SELECT 1 FROM deliveries WHERE parent_run_id = ? AND status = 'dispatched'", run_id)) == ready
        or None)
    wait_run(daemon, run_id, {"waiting-confirmation"})
    (action,) = [a for a in daemon.call("pending")["actions"] if a["run_id"] == run_id]
    daemon.call("continue_action", action_id=action["action_id"], decision="approve")
    return dict(wait_for("the claim's outcome", lambda: ledger_rows(
        daemon.home, "SELECT phase, result, error FROM actions WHERE action_id = ? AND phase IN ('ok', 'failed')",
        action["action_id"]) or None)[0])


def test_the_first_claim_waits_until_the_policys_isolated_groups_exist(short_tmp: Path) -> None:
    # V1.37: "首次新 claim ... 同时校验已建立的 durable isolated group 数和该批 ready group 数均达到
    # minIsolatedGroupsBeforeClaim。任一不足都必须在 claim journal 创建和 delivery mutation 前失败关闭。"
    (short_tmp / "ws" / ".corral").mkdir(parents=True)
    (short_tmp / "ws" / ".corral" / "collaboration-policy.json").write_text('{"minIsolatedGroupsBeforeClaim": 2}')
    spec = short_tmp / "spec.toml"
    spec.write_text(GROUPS_SPEC)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out in stages")["run_id"]
        early = _claim_when_ready(daemon, run_id, 1)
        assert early["phase"] == "failed" and "minIsolatedGroupsBeforeClaim" in str(early["error"]), early
        assert "1 established, 1 ready" in str(early["error"])
        assert ledger_rows(daemon.home, "SELECT * FROM claim_journal") == [], "no journal before the gate passes"
        # The refused claim moved no delivery (the run goes on to its second group meanwhile,
        # so the count is not fixed here: every delivery there is still unclaimed).
        statuses = [d["status"] for d in ledger_rows(daemon.home, "SELECT status FROM deliveries")]
        assert statuses and set(statuses) == {"dispatched"}, statuses
        claimed = _claim_when_ready(daemon, run_id, 2)
        assert claimed["phase"] == "ok", claimed
        assert len(json.loads(claimed["result"])["output"]["claimed"]) == 2
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed", shown["run"]
    finally:
        daemon.shutdown()


def test_a_short_first_wave_is_refused_and_the_first_valid_one_binds_a_snapshot(short_tmp: Path) -> None:
    daemon = _demo(short_tmp)
    try:
        daemon.up()
        policy_file = short_tmp / "policy.json"
        policy_file.write_text(json.dumps(WAVE_POLICY))
        done = cli(daemon.home, "collaboration", "set", str(policy_file), "--json")
        assert done.returncode == 0, done.stderr
        digest = json.loads(done.stdout)["digest"]
        installed = short_tmp / "project" / ".corral" / "collaboration-policy.json"
        assert collaboration.parse(installed.read_text()).digest == digest
        run_id = daemon.call("run", agent_id="project-supervisor", task="plan the launch",
                             script=json.dumps(WAVE_SCRIPT))["run_id"]
        daemon.wait_until(lambda st: ledger_rows(daemon.home, "SELECT 1 FROM collaboration_bindings"),
                          what="the binding")
        # Editing the live file now changes nothing for the bound run.
        policy_file.write_text(json.dumps({**WAVE_POLICY, "orchestratorOnlyAfterDelegation": False}))
        assert cli(daemon.home, "collaboration", "set", str(policy_file)).returncode == 0
        write = wait_for("the write after the wave", lambda: ledger_rows(
            daemon.home, "SELECT phase FROM actions WHERE run_id = ? AND tool = 'fs.write'"
            " AND phase IN ('denied', 'ok', 'failed')", run_id) or None)
        assert [w["phase"] for w in write] == ["denied"], "the bound snapshot still says orchestrator-only"
        (binding,) = ledger_rows(daemon.home, "SELECT run_id, digest FROM collaboration_bindings")
        assert binding == {"run_id": run_id, "digest": digest}
        shown_policy = json.loads(cli(daemon.home, "collaboration", "show", "--json").stdout)
        assert shown_policy["policy"]["orchestratorOnlyAfterDelegation"] is False
        assert shown_policy["bindings"][0]["run_id"] == run_id
        # V1.38: "只允许报告 matched / drifted / unreadable": a report, in show and in the run's view.
        assert shown_policy["bindings"][0]["policy_status"] == "drifted"
        shown_run = daemon.call("show", run_id=run_id)
        assert shown_run["collaboration"] == {"digest": digest, "policy_status": "drifted"}, shown_run
        bad = short_tmp / "bad.json"
        bad.write_text('{"requiredInitialWave": true}')
        refused = cli(daemon.home, "collaboration", "set", str(bad))
        assert refused.returncode != 0 and "requiredInitialWave" in refused.stderr
        kept = collaboration.parse(installed.read_text())
        assert kept.orchestratorOnlyAfterDelegation is False, "a bad policy changes nothing"
    finally:
        daemon.shutdown()


def test_the_spawn_tool_tells_every_supervisor_the_narrowest_scope_rule() -> None:
    # V1.37: "只读 isolated task 也必须提供 expected artifact 对应的最小目录 scope ... 不得为了只读检查扩大到
    # sibling scope 或共同父目录；通用 Supervisor 提示必须明确这一边界"
    from corral.actors.tools.registry import builtin_tools

    description = builtin_tools()["agent.spawn_isolated"].schema.description
    for words in ("read-only", "narrowest directory", "expected_artifacts", "sibling", "shared parent"):
        assert words in description, words


FINAL_SPEC = """
[project]
root = "ws"
[policy]
"agent.run_status" = "confirm"
[[templates]]
id = "quick"
  [[templates.steps]]
  final = "checked"
[[agents]]
id = "parent"
  [[agents.steps]]
  actions = [{ tool = "agent.spawn_isolated", input = { children = [
      { template = "quick", task = "check a", write_scopes = ["a"] } ] } }]
  # A blocked final reply moves the run to its next loop, as any plan does.
  [[agents.steps]]
  final = "too early"
  [[agents.steps]]
  when_observed = "isolated group(s); this run has 1"
  actions = [{ tool = "agent.spawn_isolated", input = { children = [
      { template = "quick", task = "check b", write_scopes = ["b"] } ] } }]
  [[agents.steps]]
  when_observed = "isolated group(s); this run has 1"
  actions = [{ tool = "agent.run_status", input = {} }]
  [[agents.steps]]
  when_observed = "isolated group(s); this run has 1"
  final = "joined"
"""


def test_the_final_reply_waits_for_the_policys_groups(short_tmp: Path) -> None:
    # V1.37: "finalization completion 在既有门禁之外，再校验同一父 run 已建立的 isolated group 总数达到 policy";
    # V1.32: "配置要求的 ... 事实缺失 ... 原 Supervisor run 必须回到 planning，不能提交最终回复"
    (short_tmp / "ws" / ".corral").mkdir(parents=True)
    (short_tmp / "ws" / ".corral" / "collaboration-policy.json").write_text('{"minIsolatedGroupsBeforeClaim": 2}')
    spec = short_tmp / "spec.toml"
    spec.write_text(FINAL_SPEC)
    daemon = Daemon(short_tmp / "h", spec)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="parent", task="fan out, then answer")["run_id"]
        claimed = _claim_when_ready(daemon, run_id, 2)
        assert claimed["phase"] == "ok" and len(json.loads(claimed["result"])["output"]["claimed"]) == 2, claimed
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "joined", shown["run"]
        blocked = [json.loads(e["data"]) for e in ledger_rows(
            daemon.home, "SELECT data FROM events WHERE kind = 'final-blocked' AND subject = ?", run_id)]
        assert blocked and all("the collaboration policy wants 2 isolated group(s); this run has 1" in json.dumps(b)
                               for b in blocked), blocked
        assert len(ledger_rows(daemon.home, "SELECT * FROM replies WHERE run_id = ?", run_id)) == 1
    finally:
        daemon.shutdown()


def test_a_wave_whose_plan_never_committed_binds_nothing(tmp_path: Path) -> None:
    # V1.38: "首个有效 durable collaboration batch 为父 run 固化策略": a wave that passed this
    # guard but whose plan a later check refused (a secret in it) is no durable batch.
    from corral.supervisor.context.collaboration_service import CollaborationService
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger

    (tmp_path / "project" / ".corral").mkdir(parents=True)
    (tmp_path / "project" / ".corral" / "collaboration-policy.json").write_text('{"requiredInitialWave": "static"}')
    ledger = SqliteLedger(tmp_path / "ledger.db")
    try:
        service = CollaborationService(ledger, tmp_path / "project")
        run = {"kind": "root", "run_id": "run-1"}
        wave = {"actions": [_delegate("researcher")]}
        assert service.plan_guard(run, 0, wave) is None
        assert service.binding("run-1") is not None
        # The same loop is planned again: its first plan did not commit.
        refused = service.plan_guard(run, 0, {"actions": [{"tool": "fs.write", "input": {"path": "a"}}]})
        assert refused is not None and "the first wave needs 1 initial agent.delegate" in refused
        assert service.binding("run-1") is None
        assert ledger.all("SELECT * FROM collaboration_batches") == []
        # A fresh service (a restart) finds the same from the ledger alone.
        assert service.plan_guard(run, 0, wave) is None
        again = CollaborationService(ledger, tmp_path / "project")
        assert again.plan_guard(run, 0, {"final": "done"}) is not None and again.binding("run-1") is None
    finally:
        ledger.close()


def test_the_prompt_renders_the_bound_snapshot_and_the_drift_is_only_reported(tmp_path: Path) -> None:
    """Seed 004 V1.38: "planning prompt 继续渲染 snapshot 中的规范 policy 本体，不改变现有 JSON 外形", and
    the live file against the snapshot is "matched / drifted / unreadable" only."""
    from corral.supervisor.context.collaboration_service import CollaborationService
    from corral.supervisor.ledger.ledger_sqlite import SqliteLedger

    live_file = tmp_path / "project" / ".corral" / "collaboration-policy.json"
    live_file.parent.mkdir(parents=True)
    ledger = SqliteLedger(tmp_path / "ledger.db")
    try:
        service = CollaborationService(ledger, tmp_path / "project")
        assert service.prompt_section("run-1") is None  # no file, nothing bound: the defaults go unsaid
        live_file.write_text('{"requiredInitialWave": "static"}')
        from corral.supervisor.runs import run_store
        from corral.supervisor.runs.run_feature import RunFeatures

        run_id = run_store.create_run(ledger, RunFeatures(), agent_id="a", task="t", provider="scripted",
                                      provider_config={"script": {"steps": []}})
        before = service.prompt_section(run_id)
        assert before is not None and "until this run binds it" in before
        assert service.drift(run_id) is None
        snapshot = Policy(requiredInitialWave="static").as_json()
        assert service.plan_guard({"kind": "root", "run_id": run_id}, 0, {"actions": [_delegate("researcher")]}) is None
        rendered = json.dumps(snapshot, sort_keys=True, separators=(",", ":"))
        assert service.drift(run_id) == "matched"
        live_file.write_text('{"requiredInitialWave": "static", "orchestratorOnlyAfterDelegation": false}')
        after = service.prompt_section(run_id)
        assert after is not None and "bound to this run" in after and after.endswith(rendered), after
        assert service.drift(run_id) == "drifted"
        live_file.write_text('{"requiredInitialWave": tru')
        assert service.drift(run_id) == "unreadable"
        assert service.prompt_section(run_id) == after, "the bound snapshot is what the model reads, drift or not"
    finally:
        ledger.close()


@pytest.mark.parametrize(("tools", "refused"), [
    (["agent.spawn_isolated"], False),
    (["agent.delegate", "agent.spawn_isolated"], False),
    (["agent.spawn_isolated", "agent.spawn_isolated"], True),
    (["agent.delegate", "agent.delegate"], False),
])
def test_a_batch_holds_one_spawn_at_most_whatever_the_policy(tools: list[str], refused: bool) -> None:
    """V1.32: "单个 Provider 批次也最多包含一个 spawn", with or without a wave to plan
    (a strict re-audit found two spawns passing under the default policy)."""
    assert (collaboration.spawn_refusal(tools) is not None) is refused

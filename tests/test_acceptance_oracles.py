"""The acceptance oracles assert the facts seed 004 lists (issue 52, gap 5), from
recorded evidence built by hand: each case is a fact set an older, looser oracle
passed while the seed's gate fails it (children that never overlapped, a victim
that is not the final reply, a mixed chat without its approval batch, repair and
kill, ...). Each must now FAIL, naming the missing fact, and report its counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.acceptance import oracle, oracle_flows
from corral.acceptance.chat_flow import ChatFacts
from corral.acceptance.coder_flow import CoderFacts
from corral.acceptance.overlap import any_pair_overlaps, intervals_of, max_concurrent
from corral.acceptance.report import Verdict
from corral.acceptance.retry_flow import Backoff, RetryFacts
from corral.acceptance.swarm_flow import SwarmFacts
from corral.acceptance.verify_flow import VerifyFacts

NOWHERE = Path("/nonexistent")


def _with(facts: Any, **fields: object) -> Any:
    for key, value in fields.items():
        setattr(facts, key, value)
    return facts


# -- overlap in time -------------------------------------------------------------------


def test_overlap_counts_runs_in_flight_at_one_instant_from_provider_intervals() -> None:
    rows = [("a", 0.0, 10.0), ("b", 5.0, 15.0), ("c", 9.0, 20.0), ("c", 30.0, 31.0), ("d", 1.0, None)]
    spans = intervals_of(rows)
    assert "d" not in spans, "a request never answered has no known interval"
    assert max_concurrent(spans) == 3
    # One after the other, touching at the ends: never two at once.
    assert max_concurrent(intervals_of([("a", 0.0, 5.0), ("b", 5.0, 9.0), ("c", 9.0, 12.0)])) == 1
    assert any_pair_overlaps({"s": [(0.0, 4.0)]}, {"i": [(3.0, 6.0)]})
    assert not any_pair_overlaps({"s": [(0.0, 3.0)]}, {"i": [(3.0, 6.0)]})


# -- V1.1 §5.6: three children of two templates, in parallel -----------------------------


def _swarm(**fields: object) -> SwarmFacts:
    facts = SwarmFacts(NOWHERE, NOWHERE, run_id="run-1", final_status="completed", delegates=2, delegate_agents=2,
                       groups=1, children=3, child_templates=2, joins=1, joins_claimed=1, replies=1)
    return _with(facts, **{"templates": {"writer": 2, "checker": 1}, "children_overlap": 3, **fields})


def test_the_swarm_oracle_wants_three_children_of_two_templates_that_really_overlapped() -> None:
    good = oracle_flows.swarm(_swarm())
    assert good.verdict is Verdict.PASS, good.reason
    assert good.facts["children_overlap"] == 3 and good.facts["children"] == 3
    # Three children of two templates that ran one after the other: the seed fails it.
    serial = oracle_flows.swarm(_swarm(children_overlap=1))
    assert serial.verdict is Verdict.FAIL_RUNTIME and "children_overlap" in serial.reason, serial.reason
    # One instance of each template: not "two of one template and one of another".
    pair = oracle_flows.swarm(_swarm(children=2, templates={"writer": 1, "checker": 1}, children_overlap=2))
    assert pair.verdict is Verdict.FAIL_MODEL and "2 of one template" in pair.reason, pair.reason
    three_of_one = oracle_flows.swarm(_swarm(child_templates=1, templates={"writer": 3}))
    assert three_of_one.verdict is Verdict.FAIL_MODEL


# -- V1.1 §5.3 and §5.4: a checkpoint and a changeset --------------------------------------


def _coder(actions: list[dict[str, Any]], **fields: object) -> CoderFacts:
    facts = CoderFacts(NOWHERE, NOWHERE, "startup-abc", run_id="run-1", status_at_cli_exit="waiting-confirmation",
                       approve_exit=0, notes_after="status: final\n", final_status="completed",
                       killed_at_failpoint=True, replies=1, first_system_prompt="Project rule startup-abc")
    facts.actions = actions
    return _with(facts, **fields)


CHANGE = json.dumps({"changes": [{"path": "notes.txt", "operation": "update", "old_text": "status: draft",
                                  "new_text": "status: final"}]})
READ = {"action_id": "a0", "tool": "fs.read", "phase": "ok", "input": '{"path": "notes.txt"}', "policy": "auto"}


def test_the_coder_oracle_wants_a_changeset_and_its_checkpoint() -> None:
    changeset = {"action_id": "a1", "tool": "project.changeset", "phase": "ok", "policy": "confirm", "input": CHANGE}
    good = _coder([READ, changeset], waiting_tool="project.changeset", checkpoints=1)
    for judge in (oracle.tool_plan, oracle.read_patch_confirm, oracle.confirm_after_cli_exit):
        judged = judge(good)
        assert judged.verdict is Verdict.PASS, (judge.__name__, judged.reason)
    assert oracle.confirm_after_cli_exit(good).facts == {"changesets": 1, "checkpoints": 1}
    # The old flow: an fs.patch parked, approved and applied; no changeset, no checkpoint.
    patch = {"action_id": "a1", "tool": "fs.patch", "phase": "ok", "policy": "confirm", "input": json.dumps(
        {"path": "notes.txt", "old_text": "status: draft", "new_text": "status: final"})}
    old = _coder([READ, patch], waiting_tool="fs.patch", checkpoints=0)
    judged = oracle.read_patch_confirm(old)
    assert judged.verdict is not Verdict.PASS and "project.changeset" in judged.reason, judged.reason
    # A changeset that ran ok with no checkpoint kept: the runtime broke its promise.
    lost = oracle.confirm_after_cli_exit(_coder([READ, changeset], waiting_tool="project.changeset", checkpoints=0))
    assert lost.verdict is Verdict.FAIL_RUNTIME and "checkpoint" in lost.reason, lost.reason


# -- V1.1 §5.5: something changed before project.verify ------------------------------------


def _verify(**fields: object) -> VerifyFacts:
    facts = VerifyFacts(NOWHERE, NOWHERE, run_id="run-1", final_status="completed",
                        tools={"process.start": ("ok", ""), "preview.validate": ("ok", ""),
                               "project.verify": ("ok", "")},
                        screenshots=[NOWHERE / "d.png", NOWHERE / "m.png"])
    return _with(facts, **{"changed_before_verify": 1, "verified_revision": 1, **fields})


def test_the_verify_oracle_wants_a_change_before_the_verification() -> None:
    good = oracle_flows.verify_preview(_verify())
    assert good.verdict is Verdict.PASS, good.reason
    assert good.facts["changed_before_verify"] == 1 and good.facts["verified_revision"] == 1
    unchanged = oracle_flows.verify_preview(_verify(changed_before_verify=0, verified_revision=0))
    assert unchanged.verdict is Verdict.FAIL_MODEL and "changed nothing" in unchanged.reason, unchanged.reason
    # A change committed before the verification, yet it verified revision 0: the revision lied.
    stale = oracle_flows.verify_preview(_verify(verified_revision=0))
    assert stale.verdict is Verdict.FAIL_RUNTIME and "revision" in stale.reason, stale.reason


# -- V1.29: a specialist's call dropped, its retry held at a forwarding gate, then a repair ----


def _retry(**fields: object) -> RetryFacts:
    facts = RetryFacts(NOWHERE, run_id="root-1", final_status="completed", replies=1, claimed=True,
                       retries={"spec-1:0": 1, "root-1:3": 1})
    facts.plan = Backoff("spec-1:0", 1, 100.0, survived=True, killed_in_backoff=True)
    facts.final = Backoff("root-1:3", 1, 200.0, survived=True, killed_in_backoff=True)
    defaults: dict[str, object] = {
        "first_victim_run": "spec-1", "first_victim_specialist": True, "gate_held": True, "gate_checked": True,
        "gate_drift": 0, "specialists": 2, "specialists_same_batch": True, "specialists_overlap": 2,
        "repairs": 1, "final_victim_root": True, "final_victim_base": True, "final_victim_loop": 3,
        "reply_loop": 3, "claimed_at_injection": 3, "repairs_claimed_at_injection": 1,
        "replies_at_injection": 0, "host_marker": True, "tool_plans_at_injection": 3, "tool_plans_at_end": 3,
        "proxy_posts": 12, "lifecycles": 12, "deliveries_claimed": 3, "claims": 2, "contract_reads": 1}
    return _with(facts, **{**defaults, **fields})


def test_the_planning_retry_oracle_wants_a_specialists_call_a_gate_and_a_repair() -> None:
    good = oracle_flows.retry_plan(_retry())
    assert good.verdict is Verdict.PASS, good.reason
    assert good.facts["repairs"] == 1 and good.facts["gate_drift"] == 0 and good.facts["specialists_overlap"] == 2
    # The supervisor's own first call dropped (V1.39's scenario): not V1.29's victim.
    root = oracle_flows.retry_plan(_retry(first_victim_run="root-1", first_victim_specialist=False))
    assert root.verdict is not Verdict.PASS and "specialist" in root.reason, root.reason
    ungated = oracle_flows.retry_plan(_retry(gate_held=False, gate_checked=False))
    assert ungated.verdict is Verdict.FAIL_RUNTIME and "forwarding gate" in ungated.reason, ungated.reason
    drifted = oracle_flows.retry_plan(_retry(gate_drift=2))
    assert drifted.verdict is Verdict.FAIL_RUNTIME and "gate" in drifted.reason, drifted.reason
    unrepaired = oracle_flows.retry_plan(_retry(repairs=0))
    assert unrepaired.verdict is Verdict.FAIL_MODEL and "repair" in unrepaired.reason, unrepaired.reason
    unread = oracle_flows.retry_plan(_retry(contract_reads=0))
    assert unread.verdict is Verdict.FAIL_MODEL and "contract read" in unread.reason, unread.reason
    one_claim = oracle_flows.retry_plan(_retry(deliveries_claimed=2, claims=1))
    assert one_claim.verdict is Verdict.FAIL_MODEL and "2 initial + 1 repair" in one_claim.reason
    alone = oracle_flows.retry_plan(_retry(specialists=1, specialists_overlap=1))
    assert alone.verdict is Verdict.FAIL_MODEL and "specialist" in alone.reason, alone.reason
    unrecorded = oracle_flows.retry_plan(_retry(proxy_posts=13))
    assert unrecorded.verdict is Verdict.FAIL_RUNTIME and "no durable record" in unrecorded.reason
    serial = oracle_flows.retry_plan(_retry(specialists_overlap=1))
    assert serial.verdict is Verdict.FAIL_RUNTIME and "overlap" in serial.reason, serial.reason


# -- V1.42: the victim is exactly the base final reply ---------------------------------------


def test_the_final_reply_retry_oracle_wants_exactly_the_base_final_reply() -> None:
    good = oracle_flows.retry_final(_retry())
    assert good.verdict is Verdict.PASS, good.reason
    assert good.facts["tool_plans_at_injection"] == good.facts["tool_plans_at_end"] == 3
    # The dropped request after the claims turned out a tool plan: the reply came a turn later.
    planned = oracle_flows.retry_final(_retry(reply_loop=4, tool_plans_at_end=4))
    assert planned.verdict is not Verdict.PASS and "base final reply" in planned.reason, planned.reason
    not_root = oracle_flows.retry_final(_retry(final_victim_root=False))
    assert not_root.verdict is not Verdict.PASS and "base final reply" in not_root.reason
    successor = oracle_flows.retry_final(_retry(final_victim_base=False))
    assert successor.verdict is not Verdict.PASS and "base final reply" in successor.reason
    unverified = oracle_flows.retry_final(_retry(host_marker=False))
    assert unverified.verdict is Verdict.FAIL_RUNTIME and "host" in unverified.reason, unverified.reason
    early = oracle_flows.retry_final(_retry(claimed_at_injection=1, repairs_claimed_at_injection=0))
    assert early.verdict is Verdict.FAIL_MODEL and "2 initial + 1 repair" in early.reason, early.reason


# -- V1.31: the mixed chat's approval batch, repair and kill ----------------------------------


def _chat(**fields: object) -> ChatFacts:
    report = {"outcome": "settled", "new_assistant_messages": 1}
    facts = ChatFacts(NOWHERE, NOWHERE, reports=[report], run_id="run-1", final_status="completed",
                      delegate_agents=2, delegates=2, repairs={"dlg-1": 1}, groups=1, children=1, joins_claimed=1,
                      replies=1, artifacts={"research": 1, "review": 1})
    defaults: dict[str, object] = {
        "batch_delegates": 2, "batch_spawns": 1, "batch_parked_first": True, "batch_approvals": 1,
        "static_overlap": 2, "mixed_overlap": True, "killed_at_repair": True, "identity_stable": True}
    return _with(facts, **{**defaults, **fields})


def test_the_mixed_chat_oracle_wants_its_approval_batch_overlaps_repair_and_kill() -> None:
    good = oracle_flows.chat_static_isolated(_chat())
    assert good.verdict is Verdict.PASS, good.reason
    assert good.facts["batch_approvals"] == 1 and good.facts["repairs"] == 1 and good.facts["killed_at_repair"]
    # What the older oracle passed: 2 specialists, 1 group, 1 claim; none of the rest.
    bare = oracle_flows.chat_static_isolated(_chat(batch_delegates=0, batch_spawns=0, batch_parked_first=False,
                                                   batch_approvals=0, static_overlap=1, mixed_overlap=False,
                                                   repairs={}, killed_at_repair=False))
    assert bare.verdict is Verdict.FAIL_MODEL and "first batch" in bare.reason, bare.reason
    per_action = oracle_flows.chat_static_isolated(_chat(batch_approvals=3))
    assert per_action.verdict is Verdict.FAIL_RUNTIME and "approval" in per_action.reason, per_action.reason
    ran_first = oracle_flows.chat_static_isolated(_chat(batch_parked_first=False))
    assert ran_first.verdict is Verdict.FAIL_RUNTIME and "index 0" in ran_first.reason, ran_first.reason
    unmixed = oracle_flows.chat_static_isolated(_chat(mixed_overlap=False))
    assert unmixed.verdict is Verdict.FAIL_RUNTIME and "overlap" in unmixed.reason, unmixed.reason
    unrepaired = oracle_flows.chat_static_isolated(_chat(repairs={}, killed_at_repair=False))
    assert unrepaired.verdict is Verdict.FAIL_MODEL and "repair" in unrepaired.reason, unrepaired.reason
    unkilled = oracle_flows.chat_static_isolated(_chat(killed_at_repair=False))
    assert unkilled.verdict is Verdict.FAIL_RUNTIME and "kill" in unkilled.reason, unkilled.reason
    drifted = oracle_flows.chat_static_isolated(_chat(identity_stable=False))
    assert drifted.verdict is Verdict.FAIL_RUNTIME and "restart" in drifted.reason, drifted.reason


# -- the retry flow's selector: its victims and its gate, on a real ledger's rows --------------


class _Tree:
    """A root run and two delegated specialists, written as the supervisor writes them."""

    def __init__(self, home: Path) -> None:
        from corral.supervisor.home.home_dir import LEDGER
        from corral.supervisor.ledger.ledger_sqlite import SqliteLedger

        home.mkdir()
        self.ledger = SqliteLedger(home / LEDGER)
        self.clock = 100.0
        self.run("root", "root", None)
        for name in ("s1", "s2", "fix"):
            self.run(name, "delegation", "root")

    def sql(self, statement: str, *args: object) -> None:
        with self.ledger.tx() as db:
            db.execute(statement, args)

    def run(self, run_id: str, kind: str, parent: str | None) -> None:
        self.sql("INSERT INTO runs (run_id, agent_id, session_id, kind, parent_run_id, root_run_id, task, status,"
                 " provider, provider_config, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'root', 't', 'running',"
                 " 'p', '{}', 0, 0)", run_id, run_id, run_id, kind, parent)

    def begin(self, slot: str, run_id: str, loop: int = 0) -> None:
        self.clock += 1
        self.sql("INSERT INTO provider_requests (slot, run_id, loop_index, attempt, status, boot_id, started_at)"
                 " VALUES (?, ?, ?, 0, 'started', 'b', ?)", slot, run_id, loop, self.clock)


def test_the_retry_selector_drops_a_specialists_first_call_gates_its_retry_and_drops_the_final_reply(
        tmp_path: Path) -> None:
    from corral.acceptance.retry_flow import HOST_CHECK_SOURCE
    from corral.acceptance.retry_selector import HOST_CHECK, RetryVictims

    tree = _Tree(tmp_path / "home")
    project = tmp_path / "project"
    project.mkdir()
    (project / HOST_CHECK).write_text(HOST_CHECK_SOURCE)
    victims = RetryVictims(tmp_path / "home", project)  # it finds the root itself: no run id is given
    tree.begin("root:0", "root")
    assert victims(1) is None, "the supervisor's own first call is not V1.29's victim"
    tree.begin("s1:0", "s1")
    tree.begin("s2:0", "s2")
    dropped = victims(2)
    assert dropped is not None and dropped.action == "drop"
    assert victims.first_candidates == {"s1:0", "s2:0"}, "both rows are specialists' first calls: either qualifies"
    assert victims(3) is None, "one drop only"
    tree.sql("UPDATE provider_requests SET status = 'failed', finished_at = 104 WHERE slot = 's1:0'")
    tree.begin("s1:0-transient-1", "s1")
    assert victims(4) is None and victims.gate is not None, "the retry is read at the gate, then forwarded"
    assert victims.gate.retry_slot == "s1:0-transient-1" and victims.gate.drift() == 0
    # The root asks again while a delivery is still dispatched: no final-reply drop yet.
    tree.sql("INSERT INTO delegations (delegation_id, parent_run_id, parent_action_id, target_agent, task,"
             " acceptance_criteria, expected_artifacts, repair_of, run_id, status, created_at) VALUES"
             " ('d-fix', 'root', 'a-fix', 'fix', 't', '[]', '[]', 'd-s1', 'fix', 'completed', 0)")
    for source, status in (("d-s1", "claimed-by-parent"), ("d-s2", "claimed-by-parent"), ("d-fix", "dispatched")):
        tree.sql("INSERT INTO deliveries (delivery_id, kind, source_id, target, parent_run_id, status, payload,"
                 " created_at) VALUES (?, 'delegation', ?, 'root', 'root', ?, '{}', 0)", "v-" + source, source, status)
    tree.sql("UPDATE runs SET status = 'completed' WHERE kind = 'delegation'")
    tree.begin("root:1", "root", 1)
    assert victims(5) is None and victims.final is None
    tree.sql("UPDATE deliveries SET status = 'claimed-by-parent' WHERE delivery_id = 'v-d-fix'")
    tree.begin("root:2", "root", 2)
    assert victims(6) is None and victims.host_refusals == 1, "the host's own check fails: the files are missing"
    for folder, name in (("research", "facts.md"), ("review", "check.md")):
        (project / folder).mkdir()
        (project / folder / name).write_text("done\n")
    tree.begin("root:3", "root", 3)
    final = victims(7)
    assert final is not None and final.action == "drop"
    assert victims.final is not None
    assert (victims.final.slot, victims.final.claimed, victims.final.repairs_claimed, victims.final.tool_plans) == (
        "root:3", 3, 1, 3)
    tree.ledger.close()


def test_the_retry_selector_never_falls_back_when_the_new_rows_are_not_all_candidates(tmp_path: Path) -> None:
    from corral.acceptance.retry_selector import RetryVictims

    tree = _Tree(tmp_path / "home")
    victims = RetryVictims(tmp_path / "home", tmp_path)
    tree.begin("root:0", "root")
    tree.begin("s1:0", "s1")
    assert victims(1) is None and victims.first_seq == 0, "a root row among the new ones: which is this? no fault"
    tree.begin("s2:0-transient-1", "s2")
    assert victims(2) is None and victims.first_seq == 0, "a retry is not a first call"
    tree.ledger.close()
    broken = RetryVictims(tmp_path / "no-home", tmp_path)
    assert broken(1) is None and broken.error.startswith("the selector failed at request 1"), "never hidden"


def test_the_chat_flow_reads_the_first_batch_and_its_approvals_from_the_action_events() -> None:
    from corral.acceptance.chat_flow import first_batch, read_batch_approvals

    actions = [("a-read", "fs.read", 0, 0), ("a-d1", "agent.delegate", 1, 0), ("a-d2", "agent.delegate", 1, 1),
               ("a-sp", "agent.spawn_isolated", 1, 2), ("a-fix", "agent.delegate", 3, 0)]
    batch = first_batch(actions, {"a-fix"})
    assert [row[0] for row in batch] == ["a-d1", "a-d2", "a-sp"]
    # corral today: each action waits and is approved on its own, one after the other.
    per_action = [(kind, a) for a in ("a-d1", "a-d2", "a-sp")
                  for kind in ("action-waiting-confirmation", "action-approved", "action-executing", "action-ok")]
    facts = ChatFacts(NOWHERE, NOWHERE)
    read_batch_approvals(facts, batch, per_action)
    assert facts.batch_parked_first and facts.batch_approvals == 3
    # Action 0 ran before anything waited: the batch did not stop first.
    ran_first = [("action-executing", "a-d1"), ("action-waiting-confirmation", "a-sp"), ("action-approved", "a-sp")]
    facts = ChatFacts(NOWHERE, NOWHERE)
    read_batch_approvals(facts, batch, ran_first)
    assert not facts.batch_parked_first and facts.batch_approvals == 1
    assert first_batch([("a-fix", "agent.delegate", 0, 0)], {"a-fix"}) == [], "a repair is not a first batch"

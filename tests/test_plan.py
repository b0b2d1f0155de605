"""The durable plan (seed 004 V1.17), with real processes: the update is the
answer's ``planUpdate`` beside its ``actions`` (``update_agent_plan`` with native
function calls), not a tool action ("planUpdate 是 Runtime 控制面元数据，不是白名单工具
action"); an explanation and 1 to 8 distinct steps, each pending, in_progress or
completed, at most one in_progress; an identical update keeps the revision, a refused
one changes nothing, a completed step never goes back and is kept when an update
leaves it out; unfinished steps hold the final reply; and the plan is control-plane
metadata: no approval, no project revision."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from corral.actors.providers.base import PlanError, RepairCategory
from corral.actors.providers.openai import OpenAIConfig, build_chat_payload
from corral.actors.providers.plan_parse import parse_chat_completion
from corral.supervisor.longtask.plan_store import MAX_STEPS, PlanRefused, merge
from fake_openai import completion, tool_call
from tests.harness import Daemon, agent_spec, cli, ledger_rows, wait_run, wait_supervisor_gone
from tests.openai_provider_support import TOOLS, make_request


def _update(explanation: str, *steps: tuple[str, str], beside: str = "") -> str:
    """One scripted answer whose ``planUpdate`` is this (TOML), with ``beside`` (an
    ``actions = [...]`` or ``final = ...`` line) or alone."""
    listed = ", ".join(f'{{ step = "{title}", status = "{status}" }}' for title, status in steps)
    line = f'planUpdate = {{ explanation = "{explanation}", steps = [{listed}] }}\n'
    return f"[[agents.steps]]\n{line}{beside}\n" if beside else f"[[agents.steps]]\n{line}"


START = _update(
    "survey first", ("read the notes", "completed"), ("write the draft", "in_progress"), ("check it", "pending")
)
FINISH = _update("all done", ("write the draft", "completed"), ("check it", "completed"))
STEPS = (
    START + START + '[[agents.steps]]\nfinal = "finished too early"\n' + FINISH + '[[agents.steps]]\nfinal = "done"\n'
)


def test_an_update_is_an_explanation_and_one_to_eight_distinct_steps_with_one_in_progress() -> None:
    """The seed: "steps 必须包含 1 到 8 个标题互不重复的步骤", "只允许提交 pending / in_progress /
    completed，同一更新至多一个 in_progress", "planUpdate.explanation 必须是非空有界文本"."""
    ok = merge([], "why", [{"step": "a", "status": "completed"}, {"step": "b", "status": "in_progress"}])
    assert ok == [{"step": "a", "status": "completed"}, {"step": "b", "status": "in_progress"}]
    nine = [{"step": f"s{n}", "status": "pending"} for n in range(MAX_STEPS + 1)]
    for explanation, steps, why in [
        ("why", [], "1 to 8 steps"),
        ("why", nine, "1 to 8 steps"),
        ("why", [{"step": "a", "status": "pending"}, {"step": "a", "status": "completed"}], "twice"),
        (
            "why",
            [{"step": "a", "status": "in_progress"}, {"step": "b", "status": "in_progress"}],
            "at most one step in_progress",
        ),
        ("why", [{"step": "a", "status": "done"}], "pending, in_progress or completed"),
        ("why", [{"step": "a", "status": "failed"}], "pending, in_progress or completed"),
        ("why", [{"step": " ", "status": "pending"}], "a title"),
        ("why", [{"step": "x" * 201, "status": "pending"}], "a title"),
        ("  ", [{"step": "a", "status": "pending"}], "explanation"),
        ("x" * 1001, [{"step": "a", "status": "pending"}], "explanation"),
    ]:
        with pytest.raises(PlanRefused, match=why):
            merge([], explanation, steps)


def test_completed_steps_never_go_back_and_are_merged_back_when_left_out() -> None:
    """The seed: "completed 不得回退"; "后续更新即使省略它们，Runtime 也会把终态步骤并回快照";
    "合并后仍受 8 步上限约束，超限整次拒绝"."""
    plan = merge([], "go", [{"step": "a", "status": "completed"}, {"step": "b", "status": "in_progress"}])
    with pytest.raises(PlanRefused, match="completed"):
        merge(plan, "go", [{"step": "a", "status": "pending"}, {"step": "b", "status": "in_progress"}])
    # Left out, "a" comes back where it was; the unfinished "b" may be renamed or dropped.
    assert merge(plan, "go", [{"step": "c", "status": "in_progress"}]) == [
        {"step": "a", "status": "completed"},
        {"step": "c", "status": "in_progress"},
    ]
    eight_more = [{"step": f"s{n}", "status": "pending"} for n in range(MAX_STEPS)]
    with pytest.raises(PlanRefused, match="1 to 8 steps"):
        merge(plan, "go", eight_more)


def _daemon(tmp: Path, steps: str, policy: str = "") -> Daemon:
    (tmp / "ws").mkdir()
    spec = tmp / "spec.toml"
    spec.write_text(agent_spec(steps=steps, policy=policy))
    return Daemon(tmp / "h", spec)


def _revisions(daemon: Daemon, run_id: str) -> list[int]:
    """The revision each accepted update left, in order (one row per answer)."""
    rows = ledger_rows(daemon.home, "SELECT revision FROM plan_updates WHERE run_id = ? ORDER BY created_at", run_id)
    return [int(row["revision"]) for row in rows]


def _check_finished_plan(daemon: Daemon, run_id: str) -> None:
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "done"
    plan = shown["plan"]
    assert plan["revision"] == 2, "the identical second update kept revision 1; the finish made 2"
    assert plan["explanation"] == "all done"
    assert plan["steps"] == [
        {"step": "read the notes", "status": "completed"},
        {"step": "write the draft", "status": "completed"},
        {"step": "check it", "status": "completed"},
    ], "the left-out completed step is kept"
    assert plan["active_index"] is None
    blocked = ledger_rows(daemon.home, "SELECT data FROM events WHERE kind = 'final-blocked' AND subject = ?", run_id)
    assert len(blocked) == 1 and "plan step 2 of 3 is in_progress" in blocked[0]["data"]
    assert "write the draft" not in blocked[0]["data"], "a public event names no step's title (V1.17)"
    assert _revisions(daemon, run_id) == [1, 1, 2], "an identical update does not add a revision"
    assert ledger_rows(daemon.home, "SELECT 1 FROM actions WHERE run_id = ?", run_id) == [], "no update is an action"


def test_an_identical_update_keeps_the_revision_and_unfinished_steps_hold_the_final_reply(short_tmp: Path) -> None:
    """The seed: "完全相同的幂等更新不增加 revision"; "只要结构化计划中仍有非 completed 步骤，…非空
    response…都不能写 assistant"."""
    daemon = _daemon(short_tmp, STEPS)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        _check_finished_plan(daemon, run_id)
    finally:
        daemon.shutdown()


#: Each refused answer is repaired on the same loop: the script's next answer for it
#: is the step after, once the refusal is in the run's context.
REFUSED = (
    START
    + _update("two at once", ("write the draft", "in_progress"), ("check it", "in_progress"))
    + 'unless_observed = "at most one step in_progress"\n'
    + _update("back", ("read the notes", "pending"), ("write the draft", "in_progress"))
    + 'unless_observed = "cannot go back"\n'
    + _update("old words", ("read the notes", "done"))
    + 'unless_observed = "is not one of"\n'
    + FINISH
    + '[[agents.steps]]\nfinal = "done"\n'
)


def test_a_refused_update_changes_nothing_and_the_model_sees_why(short_tmp: Path) -> None:
    """The seed: "拒绝的更新也不改变现有快照"."""
    daemon = _daemon(short_tmp, REFUSED, policy="max_repairs = 4")  # each refusal is a repair of the answer
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["plan"]["revision"] == 2
        refusals = [json.loads(row["data"]) for row in ledger_rows(
            daemon.home, "SELECT data FROM events WHERE kind = 'plan-invalid' AND subject = ? ORDER BY cursor", run_id)]
        assert [r["category"] for r in refusals] == ["plan-semantics", "plan-semantics", "arguments-schema"]
        # The model sees why in its private repair context; the public event keeps no text (V1.17, V1.33).
        seen = [json.loads(row["data"]) for row in ledger_rows(
            daemon.home, "SELECT data FROM observations WHERE run_id = ? ORDER BY seq", run_id)]
        why = [entry["detail"] for entry in seen if entry.get("role") == "repair"]
        assert len(why) == 3 and "at most one step in_progress" in why[0]
        assert "completed" in why[1] and "cannot go back" in why[1]
        assert "is not one of" in why[2], "refused by the update's schema, as the parse reads it"
        for refusal, detail in zip(refusals, why, strict=True):
            assert "detail" not in refusal and refusal["detail_chars"] == len(detail)
            assert refusal["detail_sha256"] == hashlib.sha256(detail.encode()).hexdigest()
        assert _revisions(daemon, run_id) == [1, 2], "a refused update writes nothing"
    finally:
        daemon.shutdown()


#: A title and an explanation only the model wrote: no public record may hold them.
MARKED = "zq-marked-title"


def test_a_refusal_and_a_failed_runs_reason_keep_only_the_category_counts_and_hashes(short_tmp: Path) -> None:
    """The seed (V1.17): "结构化 plan_update 的 Agent DB 投影同样只保存 explanation 的 SHA-256 与字符数，
    以及步骤标题的 SHA-256、状态和数量"; "原始模型正文、解析错误、function arguments 或调用体不得进入
    event、task 或 Agent DB 公共审计"; (V1.33) "Agent DB 与 E2E 报告只保存类别、计数和既有哈希"."""
    steps = (
        _update(f"{MARKED} why", (f"{MARKED} one", "completed"), (f"{MARKED} two", "in_progress"))
        + _update(f"{MARKED} back", (f"{MARKED} one", "pending"))  # refused: completed never goes back
        + 'unless_observed = "cannot go back"\n'
        + _update(f"{MARKED} back", (f"{MARKED} one", "done"))  # refused at the parse: no such status
    )
    daemon = _daemon(short_tmp, steps, policy="max_repairs = 1")
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "failed", shown["run"]
        reason = shown["run"]["reason"]
        assert "arguments-schema" in reason and MARKED not in reason and "is not one of" not in reason, reason
        public = ledger_rows(daemon.home, "SELECT kind, data FROM events WHERE subject = ?", run_id)
        assert [row["kind"] for row in public].count("plan-invalid") == 2
        leaked = [row["kind"] for row in public if MARKED in row["data"] or "cannot go back" in row["data"]]
        assert leaked == [], f"public events holding the model's text or its parse error: {leaked}"
    finally:
        daemon.shutdown()


def test_the_plan_is_control_plane_metadata_no_approval_and_no_project_revision(short_tmp: Path) -> None:
    """The seed: "planUpdate 是 Runtime 控制面元数据…不触发 confirm/deny，不推进 project revision"."""
    daemon = _daemon(
        short_tmp,
        START + FINISH + '[[agents.steps]]\nfinal = "done"\n',
        policy='[agents.policy]\ndefault = "confirm"\n',
    )
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed", "waiting-confirmation"})
        assert shown["run"]["status"] == "completed", "a plan update never waits for a person, nor is denied"
        assert shown["plan"]["revision"] == 2
        assert ledger_rows(daemon.home, "SELECT 1 FROM actions WHERE run_id = ?", run_id) == [], "no action at all"
        assert ledger_rows(daemon.home, "SELECT 1 FROM project_revisions") == []
    finally:
        daemon.shutdown()


def test_a_kill_after_a_plan_update_keeps_it_and_never_applies_it_twice(short_tmp: Path) -> None:
    daemon = _daemon(short_tmp, STEPS)
    try:
        first = daemon.up(env={"CORRAL_FAILPOINTS": "durable-plan.after-update=kill@once"})
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        wait_supervisor_gone(daemon, first.pid)
        assert (daemon.home / "failpoints" / "durable-plan.after-update.fired").exists()
        kept = ledger_rows(daemon.home, "SELECT revision FROM run_plans WHERE run_id = ?", run_id)
        assert kept == [{"revision": 1}], "the committed plan survived the kill"
        daemon.up()
        _check_finished_plan(daemon, run_id)
    finally:
        daemon.shutdown()


def test_the_update_rides_beside_the_actions_and_is_no_tool(short_tmp: Path) -> None:
    """The seed: "planUpdate 是 Runtime 控制面元数据，不是白名单工具 action"; "计划更新既可单独作为
    持久进度 checkpoint，也可与 action 或最终回复同批返回"."""
    steps = (
        _update("list first", ("list the workspace", "in_progress"), ("report", "pending"),
                beside='actions = [{ tool = "fs.list", input = { path = "." } }]')
        + _update("listed and reported", ("list the workspace", "completed"), ("report", "completed"),
                  beside='final = "reported"')
    )
    daemon = _daemon(short_tmp, steps)
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "completed" and shown["final_reply"] == "reported"
        assert [a["tool"] for a in shown["actions"]] == ["fs.list"], "the update is no action"
        assert shown["plan"]["revision"] == 2 and shown["plan"]["unfinished"] == []
        seen = ledger_rows(daemon.home, "SELECT data FROM observations WHERE run_id = ? ORDER BY seq", run_id)
        plans = [json.loads(row["data"]) for row in seen if json.loads(row["data"]).get("role") == "plan"]
        assert plans and plans[0]["revision"] == 1, "the model sees its plan as it now stands"
    finally:
        daemon.shutdown()
    spec = short_tmp / "old.toml"
    spec.write_text(agent_spec(steps='[[agents.steps]]\nfinal = "x"\n', policy='tools = ["fs.*", "plan.update"]'))
    try:
        refused = cli(short_tmp / "h2", "up", "--spec", str(spec))
    finally:
        cli(short_tmp / "h2", "down")
    assert refused.returncode != 0 and "plan.update" in refused.stderr and "planUpdate" in refused.stderr


def test_native_calls_carry_the_update_as_update_agent_plan() -> None:
    """The seed (V1.26): "请求必须提供 update_agent_plan…一次 Provider 响应最多包含 1 个
    update_agent_plan、最多 3 个 action function call"."""
    payload = build_chat_payload(OpenAIConfig(base_url="http://localhost/v1", model="m", structured="tools"),
                                 make_request())
    [offered] = [spec["function"] for spec in payload["tools"] if spec["function"]["name"] == "update_agent_plan"]
    assert offered["parameters"]["required"] == ["explanation", "steps"]
    update = {"explanation": "read first", "steps": [{"step": "read", "status": "in_progress"}]}
    calls = [tool_call("update_agent_plan", json.dumps(update)), *(tool_call("read_file", {"path": f"{n}"})
                                                                   for n in range(3))]
    plan = parse_chat_completion(json.dumps(completion(tool_calls=calls)), TOOLS)
    assert plan.plan_update == update and len(plan.actions) == 3, "the update is not one of the three actions"
    alone = parse_chat_completion(json.dumps(completion(tool_calls=calls[:1])), TOOLS)
    assert alone.plan_update == update and alone.actions == () and alone.final_reply is None
    for bad, category in [
        ([calls[0], calls[0]], RepairCategory.BATCH_CONSTRAINT),
        ([tool_call("update_agent_plan", json.dumps({"explanation": "x", "steps": []}))],
         RepairCategory.ARGUMENTS_SCHEMA),
        ([tool_call("update_agent_plan", json.dumps({"explanation": "x", "steps": [{"step": "a", "status": "done"}]}))],
         RepairCategory.ARGUMENTS_SCHEMA),
    ]:
        with pytest.raises(PlanError) as caught:
            parse_chat_completion(json.dumps(completion(tool_calls=bad)), TOOLS)
        assert caught.value.category is category
    text = '{"planUpdate": ' + json.dumps(update) + ', "actions": [{"tool": "read_file", "input": {"path": "a"}}]}'
    beside = parse_chat_completion(json.dumps(completion(text)), TOOLS, text_json=True)
    assert beside.plan_update == update and [a.tool for a in beside.actions] == ["read_file"]
    omitted = parse_chat_completion(json.dumps(completion('{"final": "ok"}')), TOOLS, text_json=True)
    assert omitted.plan_update is None, "text JSON may leave it out"


def test_a_failed_run_keeps_its_last_plan_as_it_was_and_a_tool_result_moves_no_step(short_tmp: Path) -> None:
    """The seed: "外层 run 进入 failed … 必须原样保留最后一次可信的 planRevision / … 不得把当时的
    pending / in_progress 机械改写为 failed"; "工具成功、失败或 action 序号都不能替模型改写结构化进度"."""
    steps = (
        _update("list first", ("list the workspace", "in_progress"), ("report", "pending"),
                beside='actions = [{ tool = "fs.list", input = { path = "." } }]')
        + '[[agents.steps]]\nactions = [{ tool = "fs.list", input = { path = "." } }]\n'
        + '[[agents.steps]]\nraw = "not a plan"\n'
    )
    daemon = _daemon(short_tmp, steps, policy="max_repairs = 1")
    try:
        daemon.up()
        run_id = daemon.call("run", agent_id="writer", task="a planned task")["run_id"]
        shown = wait_run(daemon, run_id, {"completed", "failed"})
        assert shown["run"]["status"] == "failed"
        assert [a["phase"] for a in shown["actions"]] == ["ok", "ok"], "two tool results came in"
        plan = shown["plan"]
        assert plan["revision"] == 1 and plan["active_index"] == 0
        assert plan["steps"] == [{"step": "list the workspace", "status": "in_progress"},
                                 {"step": "report", "status": "pending"}], "as the model left it"
    finally:
        daemon.shutdown()


@pytest.mark.parametrize("structured", ["json_schema", "json_object"])
def test_a_schema_the_server_enforces_requires_plan_update_and_lets_it_be_null(structured: str) -> None:
    """The seed: "strict function schema 顶层固定为 thinkingSummary / planUpdate / plan / actions /
    response，其中 planUpdate 是必填但可为 null 的字段"; "没有变化时传 null". A server that enforces
    corral's plan schema lets the model keep a plan beside its actions or its final reply."""
    import jsonschema

    payload = build_chat_payload(OpenAIConfig(base_url="http://localhost/v1", model="m", structured=structured),
                                 make_request())
    fmt = payload["response_format"]
    schema = fmt["json_schema"]["schema"] if structured == "json_schema" else fmt["schema"]
    valid = jsonschema.Draft202012Validator(schema).is_valid
    update = {"explanation": "read first", "steps": [{"step": "read", "status": "in_progress"}]}
    act = [{"tool": "read_file", "input": {"path": "n.txt"}}]
    assert valid({"actions": act, "planUpdate": update}) and valid({"actions": act, "planUpdate": None})
    assert valid({"final": "done", "planUpdate": update}) and valid({"final": "done", "planUpdate": None})
    assert not valid({"actions": act}) and not valid({"final": "done"}), "required, if only as null"
    assert not valid({"final": "done", "planUpdate": {"explanation": "x", "steps": []}}), "1 to 8 steps"
    assert not valid({"final": "done", "planUpdate": {"explanation": "x", "steps": [{"step": "a", "status": "done"}]}})
    assert "planUpdate" in payload["messages"][0]["content"] and "null" in payload["messages"][0]["content"]
    text = json.dumps({"actions": act, "planUpdate": None})
    read = parse_chat_completion(json.dumps(completion(text)), TOOLS, text_json=True)
    assert read.plan_update is None and [a.tool for a in read.actions] == ["read_file"]


def test_plan_update_false_offers_no_plan_for_a_model_too_small_to_finish_one() -> None:
    """``plan_update = false`` (tests/test_openai_structured.py's 135M model): no ``planUpdate``
    in the schema or the prompt, no ``update_agent_plan`` among the functions."""
    import jsonschema

    config = OpenAIConfig(base_url="http://localhost/v1", model="m", plan_update=False)
    payload = build_chat_payload(config, make_request())
    assert jsonschema.Draft202012Validator(payload["response_format"]["json_schema"]["schema"]).is_valid(
        {"final": "done"})
    assert "planUpdate" not in json.dumps(payload)
    native = build_chat_payload(OpenAIConfig(base_url="http://localhost/v1", model="m", structured="tools",
                                             plan_update=False), make_request())
    assert "update_agent_plan" not in json.dumps(native)


def test_leaving_plan_update_out_under_a_schema_that_requires_it_is_a_protocol_error() -> None:
    """The seed: "省略字段属于协议错误并进入既有格式修复或失败路径。只有兼容旧实现的文本 JSON 可以省略该字段":
    under ``json_schema`` or ``json_object`` (the schema requires it) an answer without it is
    repaired; plain text JSON (``none``) may leave it out."""
    from corral.actors.providers.base import ProviderResponse
    from corral.actors.providers.openai import OpenAIProvider

    text = json.dumps(completion('{"actions": [{"tool": "read_file", "input": {"path": "n.txt"}}]}'))
    for structured, mode in (("json_schema", "json-schema"), ("json_object", "json-object")):
        provider = OpenAIProvider(OpenAIConfig(base_url="http://localhost/v1", model="m", structured=structured))
        with pytest.raises(PlanError) as caught:
            provider.parse(ProviderResponse(text, {"mode": mode}), TOOLS)
        assert caught.value.category is RepairCategory.RESPONSE_SHAPE and "planUpdate" in caught.value.detail
        answer = '{"planUpdate": null, "actions": [{"tool": "read_file", "input": {"path": "n"}}]}'
        with_null = json.dumps(completion(answer))
        assert [a.tool for a in provider.parse(ProviderResponse(with_null, {"mode": mode}), TOOLS).actions] == [
            "read_file"]
    plain = OpenAIProvider(OpenAIConfig(base_url="http://localhost/v1", model="m", structured="none"))
    assert plain.parse(ProviderResponse(text, {"mode": "text-json"}), TOOLS).plan_update is None
    small = OpenAIProvider(OpenAIConfig(base_url="http://localhost/v1", model="m", plan_update=False))
    assert small.parse(ProviderResponse(text, {"mode": "json-schema"}), TOOLS).actions, "not offered, not required"

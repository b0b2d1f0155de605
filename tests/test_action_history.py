"""The model's own history (seed 004 V1.6, V1.8, V1.9; issue 36): ``agent.action_history``
returns receipts of the calling agent's own actions (its own call excluded, at most
10, newest first, redacted), and ``command.output_read`` pages the agent's commands
of earlier runs too, with the seed's fields, never another agent's. One supervisor
for the module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from corral.mailbox.protocol import ActionReceipts
from corral.sandbox.bwrap import bwrap_available
from corral.supervisor.errors import Refused
from corral.supervisor.interactive import own_history
from tests.harness import Daemon, ledger_rows, module_daemon, wait_run

SANDBOX_TABLE = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'
SECRET = "supersecretvalue123"

SPEC = f"""
name = "history"
[project]
root = "ws"
{SANDBOX_TABLE}
[[agents]]
id = "writer"
  [[agents.steps]]
  final = "nothing scripted"
[[agents]]
id = "other"
  [[agents.steps]]
  final = "nothing scripted"
"""


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with module_daemon(SPEC) as running_daemon:
        yield running_daemon


def _act(name: str, **tool_input: Any) -> dict[str, Any]:
    return {"tool": name, "input": tool_input}


def _run(daemon: Daemon, agent: str, *plans: list[dict[str, Any]]) -> dict[str, Any]:
    script = {"steps": [*({"actions": plan} for plan in plans), {"final": "done"}]}
    run_id = daemon.call("run", agent_id=agent, task="look back", script=json.dumps(script))["run_id"]
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed", shown["run"]
    return shown


def test_the_agent_reads_its_own_history_and_pages_its_earlier_commands(daemon: Daemon) -> None:
    # The command makes the secret as it runs: a plan holding it would fail its handoff
    # closed (seed 004 V1.43), so only the output carries it.
    command = f"seq -f 'line%g' 1 300; echo api_key=$(echo {SECRET[:11]}){SECRET[11:]}; exit 3"
    first = _run(daemon, "writer", [_act("command.exec", program="sh", args=["-c", command])])
    (exec_,) = first["actions"]
    source = exec_["action_id"]
    out = json.loads(_result(daemon, source))["output"]
    # The observation names the action to page by, with the digest and size of its transcript.
    assert out["sourceActionId"] == source and out["totalLines"] == 301 and out["captureTruncated"] is False
    assert len(out["outputSha256"]) == 64 and out["exit_code"] == 3

    second = _run(
        daemon, "writer",
        [_act("command.output_read", action_id=source, start_line=1, max_lines=200)],
        [_act("command.output_read", action_id=source, start_line=201, max_lines=200)],
        [_act("agent.action_history")],
        [_act("agent.action_history", run_id="all", tool="command.exec"),
         _act("agent.action_history", tool="agent.action_history", limit=1)],
        [_act("agent.action_history", limit=11), _act("agent.action_history", status="weird"),
         _act("agent.action_history", run_id="run-nope")],
    )
    _page, early, history, commands, recursive, *refused = [
        _result_or_error(daemon, a["action_id"]) for a in second["actions"]]
    first_page = json.loads(_result(daemon, second["actions"][0]["action_id"]))["output"]
    assert first_page["run_id"] == first["run"]["run_id"] and first_page["lines"][0] == "1: line1"
    assert (first_page["startLine"], first_page["nextLine"], first_page["totalLines"]) == (1, 201, 301)
    assert first_page["hasMore"] is True and first_page["exitCode"] == 3 and first_page["captureTruncated"] is False
    assert first_page["outputSha256"] == out["outputSha256"]
    last_page = early["output"]
    assert last_page["nextLine"] is None and last_page["hasMore"] is False and len(last_page["lines"]) == 101
    assert SECRET not in json.dumps(last_page) and "[redacted]" in last_page["lines"][-1]

    # This run's receipts, newest first; its own call left out.
    listed = history["output"]["receipts"]
    own = second["actions"][2]["action_id"]
    assert [r["tool"] for r in listed] == ["command.output_read", "command.output_read"]
    assert [r["action_id"] for r in listed] == [a["action_id"] for a in second["actions"][1::-1]]
    assert own not in json.dumps(history["output"])
    # Each bound to its run's session, with the mode it ran under (V1.6).
    (run_row,) = ledger_rows(daemon.home, "SELECT session_id FROM runs WHERE run_id = ?", second["run"]["run_id"])
    assert all(r["session_id"] == run_row["session_id"] and r["execution_mode"] == "auto" for r in listed), listed
    (earlier,) = commands["output"]["receipts"]
    assert earlier["action_id"] == source and earlier["run_id"] == first["run"]["run_id"]
    assert earlier["status"] == "failed" and SECRET not in json.dumps(commands)
    # Named, the tool's own earlier calls are listed (never the calling one).
    (asked,) = recursive["output"]["receipts"]
    assert asked["tool"] == "agent.action_history"
    assert asked["action_id"] in {a["action_id"] for a in second["actions"][2:4]}
    too_many, weird, foreign = refused
    assert "limit" in too_many["error"] and "status" in weird["error"] and "weird" in weird["error"]
    assert "not one of your runs" in foreign["error"]

    # Another agent reaches neither the command's transcript nor the writer's runs.
    other = _run(daemon, "other",
                 [_act("command.output_read", action_id=source),
                  _act("agent.action_history", run_id=first["run"]["run_id"])],
                 [_act("agent.action_history", run_id="all")])
    transcript, history_of_writer, everything = [_result_or_error(daemon, a["action_id"]) for a in other["actions"]]
    assert "no command transcript" in transcript["error"] and "not one of your runs" in history_of_writer["error"]
    (only,) = everything["output"]["receipts"]
    assert (only["tool"], only["run_id"], only["status"]) == ("command.output_read", other["run"]["run_id"], "failed")


def _result(daemon: Daemon, action_id: str) -> str:
    (row,) = ledger_rows(daemon.home, "SELECT result FROM actions WHERE action_id = ?", action_id)
    return str(row["result"])


def _result_or_error(daemon: Daemon, action_id: str) -> dict[str, Any]:
    (row,) = ledger_rows(daemon.home, "SELECT phase, result, error, reason FROM actions WHERE action_id = ?", action_id)
    result = json.loads(row["result"]) if row["result"] else {}
    return {"phase": row["phase"], "output": result.get("output", {}),
            "error": row["error"] or row["reason"] or ""}


def test_the_seeds_page_and_history_sizes_hold(daemon: Daemon) -> None:
    """V1.6 and V1.8: ``command.output_read`` pages 160 lines unless asked (at most
    240); ``agent.action_history`` lists 5 receipts unless asked (at most 10)."""
    first = _run(daemon, "writer", [_act("command.exec", program="seq", args=["1", "300"])])
    source = first["actions"][0]["action_id"]
    read = _act("command.output_read", action_id=source)
    second = _run(
        daemon, "writer",
        [read, _act("command.output_read", action_id=source, max_lines=241),
         _act("command.output_read", action_id=source, max_lines=240)],
        [read, read, read],
        [_act("agent.action_history")],
        [_act("agent.action_history", limit=10)],
    )
    default_page, too_long, longest, *_more, history, ten = [
        _result_or_error(daemon, a["action_id"]) for a in second["actions"]]
    assert len(default_page["output"]["lines"]) == 160 and default_page["output"]["nextLine"] == 161
    assert "max_lines" in too_long["error"] and "240" in too_long["error"]
    assert len(longest["output"]["lines"]) == 240 and longest["output"]["nextLine"] == 241
    assert len(history["output"]["receipts"]) == 5 and history["output"]["more"] is True
    # Its own earlier calls are not listed unless named: the six reads, all of them.
    assert len(ten["output"]["receipts"]) == 6 and ten["output"]["more"] is False


def _receipted(ledger: Any, run_id: str, n: int, tool: str, summaries: tuple[str, str, str | None]) -> str:
    """A finished action ``n`` of ``run_id`` and its receipt, written straight to the
    ledger (rows longer than any the supervisor writes), consistent with each other."""
    from corral.supervisor.runs.action_state import action_id

    the_id = action_id(run_id, 0, n)
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO actions (action_id, run_id, agent_id, loop_index, action_index, tool, input, fingerprint,"
            " phase, rerunnable, policy, boot_id, created_at, updated_at)"
            " VALUES (?, ?, 'writer', 0, ?, ?, '{}', ?, 'ok', 0, 'auto', 'b', ?, ?)",
            (the_id, run_id, n, tool, f"{n:064x}", float(n), float(n)),
        )
        db.execute(
            "INSERT INTO receipts (action_id, run_id, agent_id, fingerprint, tool, status, input_summary,"
            " result_summary, note, started_at, finished_at, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (the_id, run_id, "writer", f"{n:064x}", tool, "ok", *summaries, float(n), float(n) + 0.5, float(n)),
        )
    return the_id


def test_the_history_keeps_to_7200_characters_of_detail_whole_and_without_absolute_paths(open_ledger: Any) -> None:
    """V1.6: "agent.action_history 结构化 detail 上限 7,200 字符；超预算时先移除可选字段，
    再删除完整最旧项，禁止用字符截断破坏 JSON，禁止清空 runId / actionFingerprint。
    上下文清洗覆盖 Unix、Windows 盘符 ... 绝对路径统一替换为 <absolute-path>"."""
    from corral.supervisor.runs import run_store
    from corral.supervisor.runs.run_feature import RunFeatures

    ledger = open_ledger()
    ledger.begin_boot("b", 1, 1)
    run_id = run_store.create_run(ledger, RunFeatures(), agent_id="writer", task="t", provider="scripted",
                                  provider_config={})
    ids = [
        _receipted(ledger, run_id, n, "fs.read", ("fs.read path=/home/ana/shop/src/app.py " + "i" * 120,
                                                  r"read C:\\Users\\ana\\x.txt " + "r" * 130, "n" * 200))
        for n in range(10)
    ]
    caller = {"agent_id": "writer", "run_id": run_id}
    reply = own_history.action_history(ledger, caller, "act-calling", {"limit": 10})
    receipts = reply["receipts"]
    assert len(json.dumps(receipts)) <= own_history.DETAIL_BUDGET == 7200
    assert reply["truncated"] is True
    # The ids and fingerprints never emptied, every receipt whole JSON, newest first.
    assert [r["action_id"] for r in receipts] == ids[::-1][: len(receipts)]
    assert all(r["run_id"] == run_id and len(r["fingerprint"]) == 64 for r in receipts)
    # Optional fields went first, the oldest receipts' first: all ten stay, the newest
    # keeps its note, the oldest lost its own.
    assert len(receipts) == 10 and reply["more"] is False
    noted = [("note" in r) for r in receipts]
    assert noted[0] and not noted[-1] and noted == sorted(noted, reverse=True)
    small = own_history.action_history(ledger, caller, "act-calling", {"limit": 2})
    assert small["truncated"] is False and small["receipts"][0]["note"] == "n" * 200
    # Past what optional fields can give (required fields this long are not real,
    # but the rule holds), whole receipts go, the oldest first.
    crowd = [_receipted(ledger, run_id, n, "x" * 2000, ("", "", None)) for n in range(10, 30)]
    crowded = own_history.action_history(ledger, caller, "act-calling", {"limit": 10})
    assert len(json.dumps(crowded["receipts"])) <= 7200 and crowded["truncated"] and crowded["more"]
    assert [r["action_id"] for r in crowded["receipts"]] == crowd[:-4:-1]
    text = json.dumps(reply)
    assert "/home/ana" not in text and "Users" not in text and "<absolute-path>" in text


def test_the_catalog_tells_the_model_to_pass_source_action_id_straight_to_output_read() -> None:
    """V1.9: "Runtime prompt 明确要求直接把 sourceActionId 传给 command.output_read，不得
    为了取得刚完成命令的 ID 先查询 agent.action_history"."""
    from corral.actors.tools.process import CommandOutputRead

    description = CommandOutputRead.schema.description
    assert "sourceActionId" in description
    assert "not call agent.action_history" in description


@pytest.mark.parametrize("echo_calls", [False, True], ids=["server-model", "local-model"])
@pytest.mark.parametrize("status", ["ok", "failed", "timed-out"])
def test_the_next_prompt_names_a_commands_source_action_id_at_the_front_whatever_its_end(
        echo_calls: bool, status: str) -> None:
    """Seed 004 V1.9: every terminal observation of a command gives its sourceActionId
    at the front of its short detail, on success, a non-zero exit and a timeout alike,
    and the next planning prompt carries it exactly (a strict re-audit found the local
    model's failed command showed the error alone)."""
    from corral.actors.providers.chat_history import history_messages

    output = {"exit_code": 3, "lines": 301, "stdout_tail": "x" * 3000, "sourceActionId": "act-7f3e"}
    entry = {"action_id": "act-7f3e", "tool": "command.exec", "input": {"program": "sh", "args": ["-c", "make"]},
             "status": status, "output": output, "error": "sh exited (exit 3), 301 lines [launch=bwrap]"}
    messages = history_messages((entry,), 2000, echo_calls=echo_calls)
    result = messages[-1]["content"]
    assert "sourceActionId act-7f3e" in result[:120], result[:200]


def test_a_steer_asks_the_model_to_review_its_unfinished_steps() -> None:
    """Seed 004 V1.17: "steer observation 明确要求重审未完成步骤" (a strict re-audit found
    the steer rendered as the user's words alone)."""
    from corral.actors.providers.chat_history import history_messages

    (message,) = history_messages(({"role": "user", "text": "use blue, not red"},))
    assert "use blue, not red" in message["content"]
    assert "review the unfinished steps of your plan" in message["content"].lower()


def _history_ledger(open_ledger: Any) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """A ledger holding one run of ``writer`` with three finished actions, made the
    way the supervisor makes them: a read, an applied changeset and a failed one."""
    from corral.supervisor.runs import action_store, run_store
    from corral.supervisor.runs.run_feature import RunFeatures

    features = RunFeatures()
    ledger = open_ledger()
    ledger.begin_boot("b", 1, 1)
    run_id = run_store.create_run(ledger, features, agent_id="writer", task="t", provider="scripted",
                                  provider_config={})
    ids = {}
    done = [
        ("fs.read", {"path": "src/app.py"}, True, {"content": "print(1)"}, "read 8 bytes"),
        ("project.changeset", {"changes": []}, True,
         {"files": [{"path": "a.py", "diff": "+secret body"}, {"path": "b.py", "diff": "-x"}],
          "checkpoint": "cp-0123456789abcdef0123", "revision": 3, "sources_changed": True},
         "changeset of 2 files applied"),
        ("project.changeset", {"changes": [1]}, False, {}, "stale content"),
    ]
    for index, (tool, tool_input, ok, output, summary) in enumerate(done):
        row = action_store.prepare_action(ledger, run_id, 0, index, tool, tool_input, features,
                                          rerunnable=False, policy="auto")
        action_store.begin_action(ledger, row["action_id"], features)
        action_store.finish_action(ledger, row["action_id"], ok, output, summary, None if ok else summary, features)
        ids[tool if ok else "failed"] = row["action_id"]
    (run,) = ledger.all("SELECT * FROM runs WHERE run_id = ?", run_id)
    return ledger, dict(run), ids


def test_each_receipt_is_checked_again_against_its_action_and_run_when_read(open_ledger: Any) -> None:
    """V1.6: "agent.action_history 不能把 Agent DB 中已有 receipt 当成已经可信的展示 DTO。
    读取时必须再次验证终态 status、actionId、64 位 fingerprint、executionMode、tool，并把
    receipt 的 task / session 与同 run 的 task ledger 绑定": each receipt read names its
    run's session and its execution mode, and a receipt that its action's record or its
    run no longer bears out fails the read closed, naming the action and the field."""
    ledger, run, ids = _history_ledger(open_ledger)
    caller = {"agent_id": "writer", "run_id": run["run_id"]}
    reply = own_history.action_history(ledger, caller, "act-calling", {"limit": 10})
    receipts = {r["action_id"]: r for r in reply["receipts"]}
    assert set(receipts) == set(ids.values())
    for receipt in receipts.values():
        assert receipt["session_id"] == run["session_id"] and receipt["execution_mode"] == "auto"
        assert receipt["run_id"] == run["run_id"]

    tampered = [
        ("UPDATE receipts SET status = 'ok' WHERE action_id = ?", ids["failed"], "status"),
        ("UPDATE receipts SET status = 'executing' WHERE action_id = ?", ids["failed"], "status"),
        ("UPDATE receipts SET fingerprint = '" + "0" * 64 + "' WHERE action_id = ?", ids["fs.read"], "fingerprint"),
        ("UPDATE receipts SET fingerprint = 'abc' WHERE action_id = ?", ids["fs.read"], "fingerprint"),
        ("UPDATE receipts SET tool = 'fs.write' WHERE action_id = ?", ids["fs.read"], "tool"),
        ("UPDATE actions SET action_index = 9 WHERE action_id = ?", ids["fs.read"], "action id"),
        ("UPDATE actions SET policy = 'sideways' WHERE action_id = ?", ids["fs.read"], "execution mode"),
        ("UPDATE actions SET agent_id = 'other' WHERE action_id = ?", ids["fs.read"], "agent"),
    ]
    for statement, action_id, field in tampered:
        table = statement.split()[1]
        (before,) = ledger.all(f"SELECT * FROM {table} WHERE action_id = ?", action_id)
        with ledger.tx() as db:
            db.execute(statement, (action_id,))
        with pytest.raises(Refused) as refused:
            own_history.action_history(ledger, caller, "act-calling", {"limit": 10})
        assert refused.value.code == "receipt-invalid", refused.value
        assert action_id in str(refused.value) and field in str(refused.value), (field, str(refused.value))
        restored = dict(before)
        with ledger.tx() as db:
            columns = ", ".join(f"{name} = ?" for name in restored)
            db.execute(f"UPDATE {table} SET {columns} WHERE action_id = ?", (*restored.values(), action_id))
    assert len(own_history.action_history(ledger, caller, "act-calling", {"limit": 10})["receipts"]) == 3
    # A receipt whose action is gone is no receipt of a ledger's action.
    with ledger.tx() as db:
        db.execute("UPDATE actions SET action_id = 'act-gone' WHERE action_id = ?", (ids["fs.read"],))
    with pytest.raises(Refused, match="no action of the ledger") as gone:
        own_history.action_history(ledger, caller, "act-calling", {"limit": 10})
    assert ids["fs.read"] in str(gone.value)


def test_a_changesets_receipt_carries_its_safe_detail_and_nothing_else_of_its_result(open_ledger: Any) -> None:
    """V1.6: "safeDetail 必须按工具类型和字段名双重白名单抽取 ... 首版只保留 project.patchset 的
    checkpointId / revision / changeCount / revisionAdvanced 等结构化字段"; "safeDetail 还要按
    当前工具白名单重新解析，无法通过时只返回 detailUnavailable，不得回显伪造或旧版本遗留的
    原始 detail"."""
    ledger, run, ids = _history_ledger(open_ledger)
    caller = {"agent_id": "writer", "run_id": run["run_id"]}

    def read() -> dict[str, Any]:
        reply = own_history.action_history(ledger, caller, "act-calling", {"limit": 10})
        return {r["action_id"]: r for r in reply["receipts"]}

    receipts = read()
    applied = receipts[ids["project.changeset"]]
    assert applied["detail"] == {"checkpoint_id": "cp-0123456789abcdef0123", "revision": 3, "change_count": 2,
                                 "revision_advanced": True}
    assert "detail_unavailable" not in applied and "secret body" not in json.dumps(receipts)
    # The agent gets what the supervisor read, every field (the protocol's typed reply).
    whole = own_history.action_history(ledger, caller, "act-calling", {"limit": 10})
    assert msgspec.to_builtins(msgspec.convert(whole, ActionReceipts)) == whole
    # A failed changeset has no safe detail to give: it says so.
    assert receipts[ids["failed"]]["detail_unavailable"] is True and "detail" not in receipts[ids["failed"]]
    # A read has no detail in the first version of the whitelist.
    assert "detail" not in receipts[ids["fs.read"]] and "detail_unavailable" not in receipts[ids["fs.read"]]
    # A result that no longer parses under the whitelist is never echoed.
    forged = {"output": {"files": "all", "checkpoint": "/home/ana/.ssh/id_rsa", "revision": "3"}, "summary": "x"}
    with ledger.tx() as db:
        db.execute("UPDATE actions SET result = ? WHERE action_id = ?", (json.dumps(forged), ids["project.changeset"]))
    applied = read()[ids["project.changeset"]]
    assert applied["detail_unavailable"] is True and "detail" not in applied
    assert "id_rsa" not in json.dumps(applied)


def test_a_receipt_is_stored_naming_no_absolute_path(open_ledger: Any) -> None:
    """V1.6: "safeDetail ... 不得写入 file.read 读取的源码、命令完整输出、diff 正文、消息 /
    记忆 / 委派正文、密钥或绝对路径": a receipt is stored with its call's and its result's
    summaries and its note path-filtered, not only cleaned when read."""
    from corral.supervisor.runs import action_store, run_store
    from corral.supervisor.runs.run_feature import RunFeatures

    features = RunFeatures()
    ledger = open_ledger()
    ledger.begin_boot("b", 1, 1)
    run_id = run_store.create_run(ledger, features, agent_id="writer", task="t", provider="scripted",
                                  provider_config={})
    row = action_store.prepare_action(ledger, run_id, 0, 0, "fs.read", {"path": "src/app.py"}, features,
                                      rerunnable=False, policy="auto")
    action_store.begin_action(ledger, row["action_id"], features)
    why = "[Errno 2] No such file or directory: '/home/ana/shop/src/app.py' (C:\\Users\\ana\\x)"
    action_store.finish_action(ledger, row["action_id"], False, {}, why, why, features)
    (stored,) = ledger.all("SELECT input_summary, result_summary, note FROM receipts")
    text = json.dumps(dict(stored))
    assert "/home/ana" not in text and "Users" not in text and "<absolute-path>" in text, text


def test_a_receipt_written_again_must_match_the_one_stored(open_ledger: Any) -> None:
    """V1.6: "receipt 幂等 ... 命中旧记录后必须继续全等复核 taskId / sessionId /
    actionFingerprint / tool / executionMode / status 和结果摘要，任何冲突都失败关闭": the
    same receipt again is a no-op; one that differs from the stored receipt fails
    closed and writes nothing."""
    from corral.supervisor.errors import Conflict
    from corral.supervisor.runs import action_store
    from corral.supervisor.runs.run_feature import RunFeatures

    ledger, _run, ids = _history_ledger(open_ledger)
    the_id = ids["fs.read"]
    assert action_store.write_receipt(ledger, the_id, RunFeatures()) is False  # the same: nothing to do
    for column, value in (("status", "failed"), ("fingerprint", "0" * 64), ("result_summary", "forged"),
                          ("run_id", "run-other")):
        (before,) = ledger.all(f"SELECT {column} FROM receipts WHERE action_id = ?", the_id)
        with ledger.tx() as db:
            db.execute(f"UPDATE receipts SET {column} = ? WHERE action_id = ?", (value, the_id))
        with pytest.raises(Conflict, match=column.replace("_", " ")):
            action_store.write_receipt(ledger, the_id, RunFeatures())
        with ledger.tx() as db:
            db.execute(f"UPDATE receipts SET {column} = ? WHERE action_id = ?", (before[0], the_id))

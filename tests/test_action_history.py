"""The model's own history (seed 004 V1.6, V1.8, V1.9; issue 36): ``agent.action_history``
returns receipts of the calling agent's own actions (its own call excluded, at most
10, newest first, redacted), and ``command.output_read`` pages the agent's commands
of earlier runs too, with the seed's fields, never another agent's. One supervisor
for the module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from corral.sandbox.bwrap import bwrap_available
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
    assert first_page["run_id"] == first["run"]["run_id"] and first_page["lines"][0] == "line1"
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


def test_the_history_keeps_to_7200_characters_of_detail_whole_and_without_absolute_paths(open_ledger: Any) -> None:
    """V1.6: "agent.action_history 结构化 detail 上限 7,200 字符；超预算时先移除可选字段，
    再删除完整最旧项，禁止用字符截断破坏 JSON，禁止清空 runId / actionFingerprint。
    上下文清洗覆盖 Unix、Windows 盘符 ... 绝对路径统一替换为 <absolute-path>"."""
    ledger = open_ledger()
    ledger.begin_boot("b", 1, 1)
    run_id = "run-budget"
    for n in range(10):
        with ledger.tx() as db:
            db.execute(
                "INSERT INTO receipts (action_id, run_id, agent_id, fingerprint, tool, status, input_summary,"
                " result_summary, note, started_at, finished_at, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (f"act-{n:024x}", run_id, "writer", f"{n:064x}", "fs.read", "ok",
                 "fs.read path=/home/ana/shop/src/app.py " + "i" * 160, r"read C:\\Users\\ana\\x.txt " + "r" * 170,
                 "n" * 200, float(n), float(n) + 0.5, float(n)),
            )
    caller = {"agent_id": "writer", "run_id": run_id}
    reply = own_history.action_history(ledger, caller, "act-calling", {"limit": 10})
    receipts = reply["receipts"]
    assert len(json.dumps(receipts)) <= own_history.DETAIL_BUDGET == 7200
    assert reply["truncated"] is True
    # The ids and fingerprints never emptied, every receipt whole JSON, newest first.
    assert [r["action_id"] for r in receipts] == [f"act-{n:024x}" for n in range(9, 9 - len(receipts), -1)]
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
    for n in range(10, 30):
        with ledger.tx() as db:
            db.execute(
                "INSERT INTO receipts (action_id, run_id, agent_id, fingerprint, tool, status, input_summary,"
                " result_summary, note, started_at, finished_at, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (f"act-{n:024x}", run_id, "writer", f"{n:064x}", "x" * 2000, "ok", "", "", None, None, None, float(n)),
            )
    crowded = own_history.action_history(ledger, caller, "act-calling", {"limit": 10})
    assert len(json.dumps(crowded["receipts"])) <= 7200 and crowded["truncated"] and crowded["more"]
    assert [r["action_id"] for r in crowded["receipts"]] == [f"act-{n:024x}" for n in (29, 28, 27)]
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

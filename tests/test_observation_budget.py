"""What the model is sent of a tool's observation (seed 004 V1.3, V1.8, V1.10).

A strict re-audit (aud1, 2026-12-07) found every observation cut at 8,000 characters
before the provider request: the newest content diff kept whole up to 24,256
characters by compaction reached the model cut (V1.3), a default ``command.output_read``
page lost ``nextLine``/``totalLines`` (V1.8), and a ``process.poll`` page lost
``next_cursor``/``status``/``more`` (V1.10). These build the provider's request body
(``build_chat_payload``, what goes over HTTP) from a history and read what a model
would read. The live end-to-end check is tests/test_observation_budget_live.py.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from corral.actors.providers.base import ProviderRequest
from corral.actors.providers.chat_history import history_messages
from corral.actors.providers.observation_budget import CONTEXT_BUNDLE_CHARS, PROTECTED_DIFF_CHARS
from corral.actors.providers.openai import OpenAIConfig, build_chat_payload
from corral.supervisor.longtask import compaction


def _body(history: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    config = OpenAIConfig.from_mapping({"base_url": "http://127.0.0.1:9/v1", "model": "m", "structured": "tools"})
    request = ProviderRequest(
        run_id="run-1", agent_id="a", task="t", loop_index=len(history), history=history, tools=(), slot="run-1:0"
    )
    # What goes over the wire, as the server decodes it.
    return json.loads(json.dumps(build_chat_payload(config, request), ensure_ascii=False))


def _observation(body: dict[str, Any], action_id: str) -> str:
    (content,) = [m["content"] for m in body["messages"] if f"Observation for action {action_id} " in m["content"]]
    return str(content)


def _output(content: str) -> dict[str, Any]:
    """The tool output a model reads after the observation's head line."""
    decoded: dict[str, Any] = json.loads(content.split("\n", 1)[1])
    return decoded


def _diff_entry(action_id: str, sizes: tuple[int, ...]) -> dict[str, Any]:
    files = [
        {
            "path": f"src/f{n}.js",
            "status": "added",
            "sha256_before": None,
            "sha256_after": "a" * 64,
            "binary": False,
            "truncated": False,
            "diff": f"--- a/src/f{n}.js\n+++ b/src/f{n}.js\n"
            + "".join(f'+const line{i} = "{n}-{i}";\n' for i in range(size // 24)),
        }
        for n, size in enumerate(sizes)
    ]
    return {
        "action_id": action_id,
        "tool": "project.diff",
        "status": "ok",
        "output": {
            "checkpoint": "cp-1",
            "files": files,
            "files_changed": len(files),
            "truncated": False,
            "binary": False,
        },
    }


def test_the_newest_content_diff_reaches_the_model_whole_up_to_24256_characters() -> None:
    """V1.3: "最新内容 diff 不走普通 observation detail 的 …压缩，而是在 128 KiB context
    bundle 内最多保留 24,256 字符" / "为让下一轮 planning 真正看到 hunks"."""
    entry = _diff_entry("act-diff", (10_000, 9_000))
    assert 20_000 < sum(len(f["diff"]) for f in entry["output"]["files"]) < 24_000
    sent = _output(_observation(_body((entry,)), "act-diff"))
    assert [f["diff"] for f in sent["files"]] == [f["diff"] for f in entry["output"]["files"]]
    assert sent["truncated"] is False

    # An older diff is an ordinary observation: cut inside its hunks, its files and
    # checksums whole, and it says it was cut.
    newer = _diff_entry("act-newer", (100,))
    older = _output(_observation(_body((entry, newer)), "act-diff"))
    assert [f["path"] for f in older["files"]] == ["src/f0.js", "src/f1.js"]
    assert older["truncated"] is True and older["files"][0]["truncated"] is True
    assert "more characters cut" in older["files"][0]["diff"]
    assert sum(len(f["diff"]) for f in older["files"]) < 8_100


def test_a_diff_past_the_protected_size_is_cut_in_its_hunks_not_its_fields() -> None:
    entry = _diff_entry("act-diff", (20_000, 20_000))
    sent = _output(_observation(_body((entry,)), "act-diff"))
    first, second = sent["files"]
    assert first["diff"] == entry["output"]["files"][0]["diff"] and first["truncated"] is False
    assert second["truncated"] is True and second["sha256_after"] == "a" * 64 and second["path"] == "src/f1.js"
    assert PROTECTED_DIFF_CHARS < len(first["diff"]) + len(second["diff"]) < PROTECTED_DIFF_CHARS + 100


def _page(first: int, count: int, total: int, width: int) -> dict[str, Any]:
    lines = [f"{n}: " + f"{n:0{width}d}" for n in range(first, first + count)]
    following = first + count
    return {
        "action_id": "act-read",
        "tool": "command.output_read",
        "status": "ok",
        "output": {
            "action_id": "act-src",
            "run_id": "run-0",
            "lines": lines,
            "startLine": first,
            "nextLine": following if following <= total else None,
            "totalLines": total,
            "hasMore": following <= total,
            "captureTruncated": False,
            "outputSha256": "b" * 64,
            "exitCode": 1,
            "timedOut": False,
            "sourceChanged": False,
        },
    }


def test_a_default_output_page_reaches_the_model_with_every_line_and_its_next_line() -> None:
    """V1.8: "maxLines 默认 160" and "按 nextLine 继续分页，找到根错误": a 160-line page
    of 80-character lines (the audit's live page was cut inside line 129)."""
    entry = _page(1, 160, 400, 80)
    sent = _output(_observation(_body((entry,)), "act-read"))
    assert sent["lines"] == entry["output"]["lines"]
    assert (sent["startLine"], sent["nextLine"], sent["totalLines"], sent["hasMore"]) == (1, 161, 400, True)


def _poll(chunk: str) -> dict[str, Any]:
    return {
        "action_id": "act-poll",
        "tool": "process.poll",
        "status": "ok",
        "output": {
            "process_id": "proc-1",
            "chunk": chunk,
            "next_cursor": "v1:proc-1:16000",
            "status": "running",
            "exit_code": None,
            "more": True,
            "live": True,
        },
    }


@pytest.mark.parametrize(
    "chunk", ["x" * 16_000, '"quoted"\n' * 1_777, "日志行\n" * 4_000], ids=["plain", "escapes", "non-ascii"]
)
def test_a_poll_page_reaches_the_model_whole_with_its_cursor(chunk: str) -> None:
    """V1.10: "maxChars 默认 8,000、最大 16,000" and "后续必须原样传回上一页 nextCursor"."""
    sent = _output(_observation(_body((_poll(chunk),)), "act-poll"))
    assert sent["chunk"] == chunk
    assert (sent["next_cursor"], sent["status"], sent["more"]) == ("v1:proc-1:16000", "running", True)


def test_a_small_context_cuts_inside_the_text_and_keeps_the_navigation_fields() -> None:
    """The ``local`` provider's cap (1,500 characters): the cut falls in the chunk or
    the lines, never on the cursor, the status or the line numbers."""
    for echo in (False, True):
        (poll,) = [
            m["content"]
            for m in history_messages((_poll("y" * 16_000),), 1500, echo_calls=echo)
            if "proc-1" in m["content"]
        ]
        sent = json.loads(poll[poll.index("{") :])
        assert (sent["next_cursor"], sent["status"], sent["more"]) == ("v1:proc-1:16000", "running", True)
        assert sent["chunk"].startswith("y" * 1500) and "14500 more characters cut" in sent["chunk"]
    (page,) = history_messages((_page(1, 160, 400, 80),), 1500)
    sent = _output(page["content"])
    assert (sent["nextLine"], sent["totalLines"], sent["hasMore"]) == (161, 400, True)
    assert sent["lines"][-1] == "[… 143 more lines of this page cut]"
    assert re.match(r"^17: ", sent["lines"][-2])


def test_no_observation_is_longer_than_the_128_kib_bundle() -> None:
    """Whatever a tool put in its output, the bundle's bound holds (seed V1.3: "128
    KiB context bundle")."""
    huge = _poll("\\" * 16_000)
    huge["output"]["extra"] = "z" * 300_000
    content = _observation(_body((huge,)), "act-poll")
    assert len(content) < CONTEXT_BUNDLE_CHARS + 200


def test_compaction_keeps_a_protected_diff_a_structure() -> None:
    """The compaction view cuts a protected diff past its size inside its hunks too,
    so the provider still has its files and flags (it was cut into a plain string)."""
    entry = _diff_entry("act-diff", (20_000, 20_000))
    (shown,) = compaction.view([(1, entry)], None, 12_000)
    assert isinstance(shown["output"], dict) and shown["output"]["truncated"] is True
    assert [f["path"] for f in shown["output"]["files"]] == ["src/f0.js", "src/f1.js"]
    poll = _poll("日志行\n" * 4_000)
    (cut,) = compaction.view([(1, poll)], None, 1_000)
    assert cut["output"]["next_cursor"] == "v1:proc-1:16000" and "more characters cut" in cut["output"]["chunk"]


def test_a_page_line_carries_its_stable_number_and_is_bounded() -> None:
    """V1.8: "lines 是带稳定行号的有界字符串"."""
    from corral.actors.tools.process import MAX_PAGE_LINE_CHARS, numbered_line

    assert numbered_line(129, "Error: boom") == "129: Error: boom"
    long = numbered_line(7, "z" * (MAX_PAGE_LINE_CHARS + 500))
    assert long.startswith("7: " + "z" * MAX_PAGE_LINE_CHARS) and long.endswith(
        "[… 500 more characters of this line cut]"
    )


def test_the_tools_tell_the_model_how_to_review_page_and_end() -> None:
    """The seed's prompt rules, in the descriptions the model is given with each tool:
    V1.3 "project.patchset 成功后使用其 checkpointId 调用 project.diff(includeContent=true)
    审查整体变更，再执行验证型命令"; V1.8 "短命令摘要不足以定位失败时先调用
    command.output_read，按 nextLine 继续分页，找到根错误后再修改；不得仅凭输出尾部猜测";
    V1.10 "在收束前 poll 到终态或调用 terminate"."""
    from corral.actors.tools.process import CommandOutputRead, ProcessPoll, ProcessStart
    from corral.actors.tools.project_changeset import Changeset

    review = Changeset.schema.description
    assert "project.diff" in review and "include_content=true" in review and "before you run" in review
    paging = CommandOutputRead.schema.description
    assert "root error" in paging and "nextLine" in paging and "never guess from the tail" in paging
    for description in (ProcessStart.schema.description, ProcessPoll.schema.description):
        assert "before your final reply" in description.lower() and "process.terminate" in description


def test_a_claim_reaches_the_model_whole_up_to_the_result_bound() -> None:
    """A claim's deliveries (up to 48 KiB of the 64 KiB observation, seed 004 V1.35)
    are marked observed once the observation is stored: the model must be sent them
    all ("完整 observation 必须实际包含被标记 observed 的全部 delegationGroupId"), not 8,000
    characters of them."""
    from corral.actors.providers.observation_budget import CLAIM_RESULT_CHARS
    from corral.supervisor.runs.run_store import MAX_RESULT_CHARS
    from corral.supervisor.swarm.claim_store import CLAIM_OBSERVATION_CHARS

    assert CLAIM_RESULT_CHARS == MAX_RESULT_CHARS
    claimed = [{"delegation_group_id": f"grp-{n:02d}", "summary": f"child {n} found " + "x" * 1500} for n in range(28)]
    output = {"claim_id": "clm-1", "claimed": claimed, "open": 0}
    assert 40_000 < len(json.dumps(output)) < CLAIM_OBSERVATION_CHARS
    entry = {"action_id": "act-status", "tool": "agent.run_status", "status": "ok", "output": output}
    sent = _output(_observation(_body((entry,)), "act-status"))
    assert [c["delegation_group_id"] for c in sent["claimed"]] == [f"grp-{n:02d}" for n in range(28)]


def test_an_undecodable_name_in_an_output_still_makes_a_request() -> None:
    """A file name that is not UTF-8 is a lone surrogate once listed (Python's
    surrogateescape): the request body is UTF-8, so it is sent escaped, never raised on."""
    entry = {
        "action_id": "act-list",
        "tool": "fs.list",
        "status": "ok",
        "output": {"entries": ["ok.txt", "bad-\udcff.txt"]},
    }
    body = _body((entry,))
    sent = json.dumps(body, ensure_ascii=False).encode()
    assert b"ok.txt" in sent and b"bad-" in sent


def test_a_status_only_git_review_does_not_displace_the_newest_git_diff() -> None:
    """As in the compaction's slots (V1.5: "两个独立保护槽"): a later review without a
    diff leaves the earlier git diff the newest, kept at 24,256 characters."""
    diff = "".join(f"+line {i} of the change\n" for i in range(700))
    assert 10_000 < len(diff) < 24_000
    review = {
        "action_id": "act-git",
        "tool": "project.git_inspect",
        "status": "ok",
        "output": {"head": "a" * 40, "diff": {"staged": "", "unstaged": diff}, "truncated": False},
    }
    status_only = {
        "action_id": "act-status",
        "tool": "project.git_inspect",
        "status": "ok",
        "output": {"head": "a" * 40, "unstaged": ["a.py"], "truncated": False},
    }
    sent = _output(_observation(_body((review, status_only)), "act-git"))
    assert sent["diff"]["unstaged"] == diff and sent["truncated"] is False

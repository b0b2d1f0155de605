"""An answer names its request and carries a stable response id, and the question
and its answer join the owning conversation once (seed 004 V1.23), on a real
supervisor with its agent, answered through ``corral answer`` processes and the
chat's ``conversation.send``.

* "回答必须带 requestId、全量 answers map 和客户端稳定 responseId": an answer without the
  request id or without a response id is refused and changes nothing; the same
  answer sent again (the same response id) is a repeat, never the answer to the
  next question.
* "问题消息使用稳定 messageId 幂等追加到 owning Agent Session" / "再幂等追加 user
  conversation": the question is the conversation's assistant message and the
  answer its user message, each once however often the answer is sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from corral.mailbox.control import ControlError
from tests.harness import Daemon, cli, ledger_rows, module_daemon, wait_run

SPEC = """
[project]
root = "ws"
[[agents]]
id = "root"
  [[agents.steps]]
  final = "nothing scripted"
"""
COLOUR = {"id": "colour", "header": "Colour", "question": "Which colour should the fence be?",
          "options": [{"label": "red", "description": "warm, like the barn"},
                      {"label": "blue", "description": "cool, like the sky"}]}
FINISH = {"id": "finish", "header": "Finish", "question": "Which finish?",
          "options": [{"label": "matte", "description": "no shine"},
                      {"label": "gloss", "description": "shiny, easy to wipe"}]}


def _ask(*questions: dict[str, Any]) -> dict[str, Any]:
    return {"actions": [{"tool": "user.input_request", "input": {"questions": list(questions)}}]}


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with module_daemon(SPEC) as running_daemon:
        yield running_daemon


def _open_request(daemon: Daemon, run_id: str) -> str:
    (request,) = [q for q in daemon.call("pending")["questions"] if q["run_id"] == run_id]
    return str(request["request_id"])


def _answered(daemon: Daemon, request_id: str) -> bool:
    (row,) = ledger_rows(daemon.home, "SELECT answer FROM input_requests WHERE request_id = ?", request_id)
    return row["answer"] is not None


def _refused_call(daemon: Daemon, method: str, **params: Any) -> str:
    with pytest.raises(ControlError) as refused:
        daemon.call(method, **params)
    return refused.value.message


def test_an_answer_names_its_request_and_a_repeat_is_never_the_answer_to_the_next_question(daemon: Daemon) -> None:
    script = json.dumps({"steps": [_ask(COLOUR), _ask(FINISH), {"final": "painted"}]})
    run_id: str = daemon.call("run", agent_id="root", task="paint the fence", script=script)["run_id"]
    wait_run(daemon, run_id, {"needs-input"})
    first = _open_request(daemon, run_id)

    # Without the request named (and no terminal to show it and ask): refused, naming it.
    unnamed = cli(daemon.home, "answer", run_id, "red")
    assert unnamed.returncode != 0 and first in unnamed.stderr and "--request" in unnamed.stderr, unnamed.stderr
    assert "request_id" in _refused_call(daemon, "answer", run_id=run_id, text="red")
    assert "response_id" in _refused_call(daemon, "answer", run_id=run_id, request_id=first, text="red")
    assert not _answered(daemon, first), "a refused answer changes nothing"

    named = cli(daemon.home, "answer", run_id, "red", "--request", first, "--json")
    assert named.returncode == 0, named.stderr
    response_id = json.loads(named.stdout)["response_id"]
    daemon.wait_until(lambda _: any(q["run_id"] == run_id and q["request_id"] != first
                                    for q in daemon.call("pending")["questions"]), what="the second question")
    second = _open_request(daemon, run_id)

    # The same command again: the same response (its id stable), a repeat; the next question stays open.
    again = cli(daemon.home, "answer", run_id, "red", "--request", first, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {**json.loads(named.stdout), "repeated": True}
    assert json.loads(again.stdout)["response_id"] == response_id
    assert not _answered(daemon, second), "a repeat never answers the next question"
    other = cli(daemon.home, "answer", run_id, "blue", "--request", first)
    assert other.returncode != 0 and "already answered" in other.stderr, other.stderr
    assert not _answered(daemon, second)

    done = cli(daemon.home, "answer", run_id, "--request", second, "--response-id", "mine-2", "--answer",
               "finish=gloss")
    assert done.returncode == 0, done.stderr
    shown = wait_run(daemon, run_id, {"completed", "failed"})
    assert shown["run"]["status"] == "completed" and shown["final_reply"] == "painted"
    rows = ledger_rows(daemon.home, "SELECT request_id, response_id, answers FROM input_requests WHERE run_id = ?"
                       " ORDER BY created_at", run_id)
    assert [(r["request_id"], r["response_id"]) for r in rows] == [(first, response_id), (second, "mine-2")]
    assert [json.loads(r["answers"]) for r in rows] == [{"colour": "red"}, {"finish": "gloss"}]


def test_the_question_and_its_answer_join_the_owning_conversation_once(daemon: Daemon) -> None:
    conversation = daemon.call("conversation.new", agent_id="root")["conversation_id"]
    script = json.dumps({"steps": [_ask(COLOUR), {"final": "painted it blue"}]})
    asked = daemon.call("conversation.send", conversation_id=conversation, text="paint it", script=script)
    run_id = asked["run_id"]
    wait_run(daemon, run_id, {"needs-input"})
    request_id = _open_request(daemon, run_id)
    (turn,) = daemon.call("conversation.show", conversation_id=conversation)["turns"]
    (question,) = turn["messages"]
    assert (question["role"], question["kind"], question["request_id"]) == ("assistant", "question", request_id)
    assert "Which colour should the fence be?" in question["text"] and "blue - cool, like the sky" in question["text"]

    # A line that does not name the request the chat showed is refused, naming it; nothing changes.
    refusal = _refused_call(daemon, "conversation.send", conversation_id=conversation, text="blue")
    assert request_id in refusal and not _answered(daemon, request_id)
    line = {"conversation_id": conversation, "text": "blue", "request_id": request_id, "response_id": "chat-1"}
    sent = daemon.call("conversation.send", **line)
    assert sent["as"] == "answer" and sent["request_id"] == request_id
    assert daemon.call("conversation.send", **line) == {**sent, "repeated": True}
    wait_run(daemon, run_id, {"completed"})
    assert daemon.call("conversation.send", **line) == {**sent, "repeated": True}, "after the run ended too"

    (turn,) = daemon.call("conversation.show", conversation_id=conversation)["turns"]
    assert [(m["role"], m["kind"]) for m in turn["messages"]] == [("assistant", "question"), ("user", "answer")]
    assert turn["messages"][0] == question and turn["messages"][1]["text"] == "Colour: blue"
    stored = ledger_rows(daemon.home, "SELECT message_id, conversation_id FROM conversation_messages WHERE run_id = ?",
                         run_id)
    assert len(stored) == 2 and {row["conversation_id"] for row in stored} == {conversation}
    # The next turn sees them as the conversation so far.
    following = daemon.call("conversation.send", conversation_id=conversation, text="and the gate?",
                            script=json.dumps({"steps": [{"final": "ok"}]}))
    wait_run(daemon, following["run_id"], {"completed"})
    (task,) = ledger_rows(daemon.home, "SELECT task FROM runs WHERE run_id = ?", following["run_id"])
    assert "You asked: [Colour] Which colour should the fence be?" in task["task"]
    assert "User answered: Colour: blue" in task["task"]
    # Public records keep counts and digests, never the text.
    public = json.dumps(ledger_rows(daemon.home, "SELECT data FROM events WHERE subject = ?", run_id))
    assert "Which colour" not in public and "like the sky" not in public

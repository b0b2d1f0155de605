"""Structured questions (``user.input_request``, seed 004 V1.23, issue 36) and forks
refused while a run is live (V1.14), on one supervisor for the module: the shape,
the sole-action rule, the denial to delegated specialists, idempotent answers
injected once, the displays, and SIGKILLs of the supervisor inside and right after
the answer's transaction (failpoints), which lose nothing and repeat no provider call."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.client_types import Pending
from corral.core.procs import wait_exit
from corral.mailbox.control import ControlError, SupervisorGone
from corral.question_text import render_question
from corral.supervisor.errors import BadRequest
from corral.supervisor.interactive import question_shape as shape
from corral.supervisor.interactive import question_store
from corral.ui import pages
from tests.conftest import OrphanCheck
from tests.harness import Daemon, cli, ledger_rows, module_daemon, wait_run

SPEC = """
name = "questions"
[project]
root = "ws"
[chaos]
effects_file = "effects.log"
[[agents]]
id = "root"
  [agents.policy]
  "fs.write" = "confirm"
  [[agents.steps]]
  final = "nothing scripted"
[[agents]]
id = "open"
  [[agents.steps]]
  final = "nothing scripted"
[[agents]]
id = "plain"
  [[agents.steps]]
  final = "nothing scripted"
[[agents]]
id = "helper"
role = "specialist"
  [[agents.steps]]
  actions = [{ tool = "user.input_request", input = { questions = [
    { id = "scope", header = "Scope", question = "How far?", options = [
      { label = "small", description = "one file" }, { label = "large", description = "the project" } ] } ] } }]
  [[agents.steps]]
  final = "told my parent instead"
"""

COLOUR = {"id": "colour", "header": "Colour", "question": "Which colour should the fence be?",
          "options": [{"label": "red", "description": "warm, like the barn"},
                      {"label": "blue", "description": "cool, like the sky"}]}
FINISH = {"id": "finish", "header": "Finish", "question": "Which finish?",
          "options": [{"label": "matte", "description": "no shine"},
                      {"label": "gloss", "description": "shiny, easy to wipe"},
                      {"label": "satin", "description": "in between"}]}


def _ask_script(tag: str, *questions: dict[str, Any]) -> str:
    """Ask, then paint what was answered (the answer is observed once; the effect's
    label carries ``tag``, so each test counts its own), then finish."""
    return json.dumps({"steps": [
        {"actions": [{"tool": "user.input_request", "input": {"questions": list(questions)}}]},
        *({"when_observed": f'"answer": "{colour}"',
           "actions": [{"tool": "effect.record", "input": {"label": f"paint-{colour}-{tag}"}}]}
          for colour in ("blue", "teal")),
        {"final": "painted"},
    ]})


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with module_daemon(SPEC) as running_daemon:
        yield running_daemon


def _effects(daemon: Daemon) -> list[str]:
    path = daemon.home.parent / "effects.log"
    if not path.exists():
        return []
    return [json.loads(line)["label"] for line in path.read_text().splitlines() if line.strip()]


def _run(daemon: Daemon, script: str, agent: str = "root", task: str = "paint the fence") -> str:
    run_id: str = daemon.call("run", agent_id=agent, task=task, script=script)["run_id"]
    return run_id


def _request_of(daemon: Daemon, run_id: str) -> dict[str, Any]:
    (request,) = [q for q in daemon.call("pending")["questions"] if q["run_id"] == run_id]
    return dict(request)


def _provider_calls(daemon: Daemon, run_id: str) -> list[dict[str, Any]]:
    return ledger_rows(daemon.home, "SELECT loop_index, attempt, status FROM provider_requests WHERE run_id = ?"
                       " ORDER BY loop_index, attempt", run_id)


def _refused(daemon: Daemon, *args: str) -> str:
    """A refusal through the CLI (a process each: used where the CLI is the subject)."""
    done = cli(daemon.home, *args)
    assert done.returncode != 0, done.stdout
    return done.stderr


def _refused_call(daemon: Daemon, method: str, **params: Any) -> str:
    with pytest.raises(ControlError) as refused:
        daemon.call(method, **params)
    return refused.value.message


# -- the shape, judged without a supervisor --------------------------------------------


def test_the_shape_of_a_request_and_of_its_answers() -> None:
    assert shape.check_questions([COLOUR, FINISH]) == [COLOUR, FINISH]
    bad_requests = [
        [], [COLOUR] * 4, [COLOUR, COLOUR], [{**COLOUR, "id": "Colour"}], [{**COLOUR, "header": "A header too long"}],
        [{**COLOUR, "options": COLOUR["options"][:1]}], [{**COLOUR, "options": FINISH["options"] * 2}],
        [{**COLOUR, "options": [{"label": "red"}, {"label": "blue", "description": "b"}]}],
        [{**COLOUR, "question": "two\nlines"}], [{**COLOUR, "extra": 1}], "colour?",
    ]
    for bad in bad_requests:
        with pytest.raises(BadRequest):
            shape.check_questions(bad)
    assert shape.check_answers([COLOUR, FINISH], {"colour": "red", "finish": "satin"}, False) == {
        "colour": "red", "finish": "satin"}
    for answers, why in (({"colour": "teal", "finish": "satin"}, "must be one of: red, blue"),
                         ({"colour": "red"}, "missing: finish"),
                         ({"colour": "red", "finish": "satin", "size": "xl"}, "no question 'size'")):
        with pytest.raises(BadRequest, match=why):
            shape.check_answers([COLOUR, FINISH], answers, False)
    assert shape.check_answers([COLOUR], {"colour": "teal"}, True) == {"colour": "teal"}
    for response_id in ("", "a b", "x" * 101, 7):
        with pytest.raises(BadRequest):
            shape.check_response_id(response_id)
    # A plan whose one action is the question passes the guard, a crowded one does
    # not; a run that is a child or a delegation is denied the tool.
    alone = {"actions": [{"tool": "user.input_request", "input": {}}], "final": None}
    assert question_store.plan_guard({}, 0, alone) is None
    crowded = {"actions": [*alone["actions"], {"tool": "effect.record", "input": {}}], "final": None}
    refusal = question_store.plan_guard({}, 0, crowded)
    assert refusal is not None and (refusal.category, refusal.rule) == ("batch-constraint", "question-not-alone")
    for kind, verdict in (("root", "continue"), ("child", "block"), ("delegation", "block")):
        assert question_store.action_guard({"kind": kind}, "act-x", "user.input_request", {})[0] == verdict
    lines = render_question({"run_id": "run-1", "request_id": "req-1", "questions": [COLOUR], "free_text": True})
    assert "  [Colour] Which colour should the fence be?  (id colour)" in lines
    assert "    2. blue - cool, like the sky" in lines and "free text" in lines[-2]
    assert lines[-1] == "  answer: corral answer run-1 --request req-1 --answer colour=red"
    waiting = Pending.from_reply({"questions": [{"run_id": "run-1", "questions": [COLOUR]}]})
    assert waiting and waiting.questions[0]["questions"] == [COLOUR]  # Client.pending().questions
    # The dashboard's Pending page: each question, its options, a choice each, one button.
    html = pages.pending({"questions": [{"run_id": "run-1", "request_id": "req-1", "questions": [COLOUR, FINISH]}]})
    assert "<b>[Colour]</b> Which colour should the fence be?" in html and "cool, like the sky" in html
    assert html.count('<select data-answer-of="req-1"') == 2 and 'data-qid="finish"' in html
    assert 'data-post="/api/answer" data-run="run-1" data-request="req-1"' in html


# -- on the supervisor -------------------------------------------------------------------


def test_a_structured_question_is_shown_answered_once_and_observed_once(daemon: Daemon) -> None:
    run_id = _run(daemon, _ask_script("shown", COLOUR, FINISH))
    wait_run(daemon, run_id, {"needs-input"})
    request = _request_of(daemon, run_id)
    request_id = request["request_id"]
    assert request_id.startswith("req-") and request["questions"] == [COLOUR, FINISH]
    assert request["free_text"] is True
    shown = cli(daemon.home, "pending").stdout
    assert "[Colour] Which colour should the fence be?" in shown and "3. satin - in between" in shown
    assert f"--request {request_id}" in shown
    parked_calls = len(_provider_calls(daemon, run_id))

    # Bad answers change nothing, each with a clear error; bad usage exits 2.
    assert "must be one line" in _refused(daemon, "answer", run_id, "--request", request_id, "--answer",
                                          "colour=green\nand red", "--answer", "finish=matte")
    usage = cli(daemon.home, "answer", run_id)
    assert usage.returncode == 2 and "either TEXT" in usage.stderr
    base = {"run_id": run_id, "request_id": request_id}
    assert "missing: finish" in _refused_call(daemon, "answer", **base, response_id="r0", answers={"colour": "red"})
    assert "2 questions" in _refused_call(daemon, "answer", **base, response_id="r0", text="blue")
    assert "no request" in _refused_call(daemon, "answer", run_id=run_id, request_id="req-" + "0" * 24,
                                         response_id="r0", answers={"colour": "red", "finish": "matte"})
    assert "response_id must be" in _refused_call(daemon, "answer", **base, response_id="a b",
                                                  answers={"colour": "red", "finish": "matte"})
    assert len(_provider_calls(daemon, run_id)) == parked_calls, "no provider call while it waits"

    answers = {"colour": "blue", "finish": "gloss"}
    first = daemon.call("answer", run_id=run_id, request_id=request_id, response_id="resp-1", answers=answers)
    again = daemon.call("answer", run_id=run_id, request_id=request_id, response_id="resp-1", answers=answers)
    assert again == {**first, "repeated": True}
    other = {"colour": "red", "finish": "gloss"}
    assert "other answers" in _refused_call(daemon, "answer", **base, response_id="resp-1", answers=other)
    assert "already answered" in _refused_call(daemon, "answer", **base, response_id="resp-2", answers=other)
    done = wait_run(daemon, run_id, {"completed", "failed"})
    assert done["run"]["status"] == "completed" and done["final_reply"] == "painted"
    assert _effects(daemon).count("paint-blue-shown") == 1
    # Injected exactly once: one observation of the question's action, with the answers.
    observed = ledger_rows(daemon.home, "SELECT data FROM observations WHERE source = ?", first["action_id"])
    assert len(observed) == 1
    output = json.loads(observed[0]["data"])["output"]
    assert output["request_id"] == request_id
    assert [(a["id"], a["answer"]) for a in output["answers"]] == [("colour", "blue"), ("finish", "gloss")]
    (row,) = ledger_rows(daemon.home, "SELECT response_id, answers FROM input_requests WHERE run_id = ?", run_id)
    assert row["response_id"] == "resp-1" and json.loads(row["answers"]) == answers
    # Public records carry ids, counts and a digest: no question or answer text.
    public = json.dumps(ledger_rows(daemon.home, "SELECT kind, data FROM events WHERE subject = ?", run_id))
    public += json.dumps([r for r in done["receipts"] if r["tool"] == "user.input_request"])
    assert "Which colour" not in public and "gloss" not in public and "input-answered" in public


def test_a_question_must_ask_alone_and_a_delegated_specialist_may_not_ask(daemon: Daemon) -> None:
    crowded = json.dumps({"steps": [
        {"unless_observed": "only action", "actions": [
            {"tool": "user.input_request", "input": {"questions": [COLOUR]}},
            {"tool": "effect.record", "input": {"label": "beside-the-question"}}]},
        {"when_observed": "only action", "final": "asked nothing"},
    ]})
    run_id = _run(daemon, crowded)
    done = wait_run(daemon, run_id, {"completed", "failed", "needs-input"})
    assert done["run"]["status"] == "completed" and done["final_reply"] == "asked nothing"
    refusals = [json.loads(row["data"]) for row in ledger_rows(
        daemon.home, "SELECT data FROM events WHERE kind = 'plan-invalid' AND subject = ?", run_id)]
    assert [(r["category"], r["rule"]) for r in refusals] == [("batch-constraint", "question-not-alone")]
    assert not done["actions"] and "beside-the-question" not in _effects(daemon)

    delegating = json.dumps({"steps": [
        {"actions": [{"tool": "agent.delegate", "input": {"agent_id": "helper", "task": "decide the scope"}}]},
        {"final": "delegated"},
    ]})
    parent = _run(daemon, delegating)

    def delegated() -> list[dict[str, Any]]:
        return ledger_rows(daemon.home, "SELECT run_id, status FROM runs WHERE parent_run_id = ?", parent)

    daemon.wait_until(lambda _: any(r["status"] == "completed" for r in delegated()), what="the delegated run")
    (child,) = delegated()
    shown = daemon.call("show", run_id=child["run_id"])
    (asked,) = shown["actions"]
    assert asked["tool"] == "user.input_request" and asked["phase"] == "denied"
    assert "delegated specialist reports" in asked["reason"]
    assert not ledger_rows(daemon.home, "SELECT 1 FROM input_requests WHERE run_id = ?", child["run_id"])
    # The parent ends on its own (its script's next step is its reply): waited for, so
    # nothing of it is live when the module's next test runs on this supervisor.
    wait_run(daemon, parent, {"completed", "failed", "cancelled"})


def test_a_fork_is_refused_while_its_conversation_has_a_live_run(daemon: Daemon) -> None:
    conversation = daemon.call("conversation.new", agent_id="root")["conversation_id"]
    asked = daemon.call("conversation.send", conversation_id=conversation, text="paint it",
                        script=_ask_script("fork", COLOUR))
    wait_run(daemon, asked["run_id"], {"needs-input"})
    request_id = _request_of(daemon, asked["run_id"])["request_id"]
    refusal = _refused(daemon, "fork", conversation)
    assert f"run {asked['run_id']} waits for the user's answer to request {request_id}" in refusal
    # The chat answers a one-question request with the line: a label or free text.
    assert daemon.call("conversation.send", conversation_id=conversation, text="blue",
                       request_id=request_id, response_id="chat-fork")["as"] == "answer"
    wait_run(daemon, asked["run_id"], {"completed"})

    writing = json.dumps({"steps": [{"actions": [{"tool": "fs.write", "input": {"path": "a.md", "content": "a"}}]},
                                    {"final": "wrote"}]})
    pending = daemon.call("conversation.send", conversation_id=conversation, text="write it", script=writing)
    shown = wait_run(daemon, pending["run_id"], {"waiting-confirmation"})
    waiting = shown["actions"][0]["action_id"]
    refusal = _refused_call(daemon, "conversation.fork", conversation_id=conversation)
    assert f"run {pending['run_id']} waits for confirmation of {waiting}" in refusal
    daemon.call("cancel", run_id=pending["run_id"])
    wait_run(daemon, pending["run_id"], {"cancelled"})
    forked = daemon.call("conversation.fork", conversation_id=conversation)
    assert forked["turns"] == 2


def test_free_text_is_always_allowed_and_no_spec_turns_it_off(daemon: Daemon, tmp_path: Path) -> None:
    """V1.23: "自由输入始终允许，模型不能关闭'其他'答案": every agent takes a free answer as
    well as one of the options, and a spec that tries to turn that off is refused
    at load with a clear error, not silently obeyed."""
    from corral.supervisor.spec.swarm_spec import SpecError, load_spec

    run_id = _run(daemon, _ask_script("plain", COLOUR), agent="plain")
    wait_run(daemon, run_id, {"needs-input"})
    request_id = _request_of(daemon, run_id)["request_id"]
    assert _request_of(daemon, run_id)["free_text"] is True
    assert cli(daemon.home, "answer", run_id, "teal", "--request", request_id).returncode == 0
    assert wait_run(daemon, run_id, {"completed", "failed"})["final_reply"] == "painted"
    assert _effects(daemon).count("paint-teal-plain") == 1

    spec = tmp_path / "off.toml"
    spec.write_text('[[agents]]\nid = "closed"\nallow_free_text = false\n[[agents.steps]]\nfinal = "x"\n')
    with pytest.raises(SpecError, match=r"allow_free_text.*free text is always allowed"):
        load_spec(spec)


def test_a_steer_is_refused_while_a_question_waits_for_its_answer(daemon: Daemon) -> None:
    """V1.23: "普通 steer 在该状态被拒绝，回答只能走精确 request API" (a plain steer is refused
    while the run waits for the user's answer; the answer goes only through the
    request's own API). Nothing is recorded, and the answer still works."""
    run_id = _run(daemon, _ask_script("steered", COLOUR))
    wait_run(daemon, run_id, {"needs-input"})
    request_id = _request_of(daemon, run_id)["request_id"]
    refused = cli(daemon.home, "steer", run_id, "--stdin", stdin="make it green")
    assert refused.returncode != 0
    assert f"waits for the answer to request {request_id}" in refused.stderr, refused.stderr
    assert "corral answer" in refused.stderr
    assert ledger_rows(daemon.home, "SELECT * FROM steers WHERE run_id = ?", run_id) == []
    assert cli(daemon.home, "answer", run_id, "red", "--request", request_id).returncode == 0
    assert wait_run(daemon, run_id, {"completed", "failed"})["final_reply"] == "painted"


def test_free_text_where_the_spec_allows_it_and_a_cancel_closes_the_question(daemon: Daemon) -> None:
    run_id = _run(daemon, _ask_script("open", COLOUR), agent="open")
    wait_run(daemon, run_id, {"needs-input"})
    request_id = _request_of(daemon, run_id)["request_id"]
    assert _request_of(daemon, run_id)["free_text"] is True
    assert cli(daemon.home, "answer", run_id, "teal", "--request", request_id).returncode == 0
    assert wait_run(daemon, run_id, {"completed", "failed"})["final_reply"] == "painted"
    assert _effects(daemon).count("paint-teal-open") == 1

    cancelled = _run(daemon, _ask_script("cancel", COLOUR))
    wait_run(daemon, cancelled, {"needs-input"})
    closed = _request_of(daemon, cancelled)["request_id"]
    daemon.call("cancel", run_id=cancelled)
    assert wait_run(daemon, cancelled, {"cancelled"})["actions"][0]["phase"] == "failed"
    assert "cancelled and takes no answer" in _refused_call(daemon, "answer", run_id=cancelled, text="blue",
                                                            request_id=closed, response_id="late")
    assert all(q["run_id"] != cancelled for q in daemon.call("pending")["questions"])


def test_kills_of_the_agent_and_inside_and_after_the_answer_lose_nothing_and_repeat_no_call(
    daemon: Daemon, no_orphans: OrphanCheck
) -> None:
    try:
        _kill_inside_and_after_the_answer(daemon)
    finally:
        # The restarted supervisor and its actors are the module's: its fixture stops them.
        no_orphans.before |= daemon.tree_pids()


def _kill_inside_and_after_the_answer(daemon: Daemon) -> None:
    run_id = _run(daemon, _ask_script("kill", COLOUR))
    wait_run(daemon, run_id, {"needs-input"})
    request_id = _request_of(daemon, run_id)["request_id"]
    pid = daemon.actor("root")["pid"]
    os.kill(pid, signal.SIGKILL)
    assert wait_exit(pid, 10)
    assert wait_run(daemon, run_id, {"needs-input"})["run"]["status"] == "needs-input"
    asked_calls = _provider_calls(daemon, run_id)
    answer = {"run_id": run_id, "request_id": request_id, "response_id": "resp-k", "answers": {"colour": "blue"}}

    # Both windows armed once each: the first answer dies inside its transaction, the
    # second right after its commit; a third boot runs on.
    armed = {"CORRAL_FAILPOINTS": "input.mid-answer=kill@once,input.after-answer=kill@once"}
    daemon.kill_supervisor()
    for committed in (False, True):
        daemon.up(env=armed)
        supervisor = daemon.endpoint.pid
        with pytest.raises(SupervisorGone):  # the reply died with the supervisor
            daemon.call("answer", **answer)
        assert wait_exit(supervisor, 10)
        (row,) = ledger_rows(daemon.home, "SELECT answer, response_id FROM input_requests WHERE run_id = ?", run_id)
        assert (row["response_id"] == "resp-k") is committed and (row["answer"] is not None) is committed
        if not committed:
            # Nothing of the answer survived: the run still waits, with no provider call meanwhile.
            (run,) = ledger_rows(daemon.home, "SELECT status FROM runs WHERE run_id = ?", run_id)
            (asked,) = ledger_rows(daemon.home, "SELECT phase FROM actions WHERE run_id = ?", run_id)
            assert (run["status"], asked["phase"]) == ("needs-input", "executing")
            assert _provider_calls(daemon, run_id) == asked_calls
    daemon.up()

    # The caller sends its response again: the same result, nothing recorded twice.
    assert daemon.call("answer", **answer)["repeated"] is True
    done = wait_run(daemon, run_id, {"completed", "failed"})
    assert done["run"]["status"] == "completed" and done["final_reply"] == "painted"
    calls = _provider_calls(daemon, run_id)
    assert calls[: len(asked_calls)] == asked_calls
    assert sorted({c["loop_index"] for c in calls}) == [c["loop_index"] for c in calls], "one call per turn"
    assert all(c["status"] == "completed" for c in calls)
    action_id = done["actions"][0]["action_id"]
    assert len(ledger_rows(daemon.home, "SELECT 1 FROM observations WHERE source = ?", action_id)) == 1
    assert len(ledger_rows(daemon.home, "SELECT 1 FROM receipts WHERE action_id = ?", action_id)) == 1
    assert _effects(daemon).count("paint-blue-kill") == 1

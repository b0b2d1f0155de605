"""Issue 50 §1: the replies are typed records too, checked once as they arrive.

"The claimed run, the action result and the step are typed records, not dicts and
tuples. Decoding checks the shape at the boundary, once, so a malformed frame is a
clear protocol error." The supervisor builds a reply record and encodes it once
(supervisor/actor_dispatch.py); ``ActorContext.ask`` checks it back into the
request's ``REPLY`` (mailbox/protocol/ ``reply``). A reply of the wrong shape is a
``BadReply`` naming the method and the field, never a ``KeyError`` inside the lane,
and the lane fails its run over it and lives on.

And, read from the source (``ast``): no actor-method handler in supervisor/ answers
a map (``dict[str, Any]``): ``MAP_REPLIES``, the methods that may, is empty.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from corral.actors.agent import Lane
from corral.actors.runtime import ActorContext
from corral.mailbox import protocol
from corral.mailbox.protocol import (
    ActionBegin,
    ActionBegun,
    ActionFinish,
    BadReply,
    ChatMessage,
    ClaimedRun,
    Code,
    GoalVerdict,
    HistoryActions,
    McpCall,
    ModelGenerate,
    NextStep,
    RunClaim,
    RunFail,
    SessionPoll,
    SessionStart,
    SessionStdin,
    SessionTerminate,
    Stepped,
    SwarmClaim,
    SwarmContract,
    SwarmDelegate,
    SwarmSpawn,
)
from corral.mailbox.steps import (
    BatchEntry,
    Begin,
    CompactStep,
    DoneStep,
    ExecuteStep,
    FinalizeStep,
    ParkStep,
    ParseStep,
    PrepareStep,
    ProviderBegun,
    ProviderStep,
)

ROOT = Path(__file__).resolve().parent.parent


class Channel:
    """A supervisor that answers each request with what ``answers`` holds for its
    method (a stand-in for the link: only the reply's shape is under test)."""

    def __init__(self, answers: dict[str, dict[str, Any]]) -> None:
        self.answers = answers
        self.asked: list[dict[str, Any]] = []

    async def request(self, recipient: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        self.asked.append(body)
        return self.answers[body["method"]]


def _ctx(channel: Channel, home: Path | None = None) -> ActorContext:
    config: Any = {"params": {}, "home": str(home or "."), "max_frame": 1 << 20}
    return ActorContext("agent", 1, "agent", channel, config, trio.Event())  # type: ignore[arg-type]


#: Every kind of step, as the supervisor builds it.
STEPS = [
    DoneStep(status="completed"),
    ParkStep(status="waiting-for-join"),
    FinalizeStep(reply="done"),
    FinalizeStep(reply=None),
    ParseStep(slot="r:0:1", response="{}", loop=0),
    ProviderStep(loop=2, task="t", history=[{"role": "tool"}], history_from=3,
                 begun=ProviderBegun(slot="r:2:1", attempt=1)),
    ProviderStep(loop=0),
    PrepareStep(loop=1, index=0, tool="fs.list", input={"path": "."}),
    ExecuteStep(action_id="r/1/0", tool="fs.list", input={"path": "."}, phase="prepared", begun=True,
                batch=[BatchEntry(action_id="r/1/1", tool="fs.read", input={"path": "a"})], parallel=True),
    CompactStep(loop=4, from_seq=1, to_seq=9, entries=[{"role": "tool"}], tokens_before=900),
]


@pytest.mark.parametrize("step", STEPS, ids=lambda step: type(step).__name__)
def test_each_step_crosses_the_wire_as_its_record(step: Any) -> None:
    """What the supervisor encodes (actor_dispatch.py) the agent decodes into the same record."""
    wire = msgspec.to_builtins(step)
    assert wire["do"] == type(step).DO.value
    answer = trio.run(_ctx(Channel({"run.next_step": wire})).ask, NextStep("r"))
    assert answer == step and type(answer) is type(step)


#: (method, request, a reply of the wrong shape, words the error must name)
MALFORMED = [
    ("run.next_step", NextStep("r"), {"do": "execute", "tool": "fs.list"}, "action_id"),
    ("run.next_step", NextStep("r"), {"do": "dance"}, "$.do"),
    ("run.next_step", NextStep("r"), {"status": "completed"}, "do"),
    ("run.next_step", NextStep("r"), {"do": "provider", "loop": "zero"}, "$.loop"),
    ("action.finish", ActionFinish("r/0/0", True), {"next": {"do": "provider"}}, "$.next"),
    ("action.begin", ActionBegin("r/0/0"), {"begin": "maybe", "phase": "executing"}, "$.begin"),
    ("action.begin", ActionBegin("r/0/0"), {"phase": "executing"}, "begin"),
    ("run.claim", RunClaim(), {"run": {"run_id": "r"}}, "$.run"),
    ("swarm.spawn", SwarmSpawn(run_id="r", action_id="a", children=[]), {"group_id": "g", "children": [{}]},
     "delegation_id"),
    ("swarm.delegate", SwarmDelegate(run_id="r", action_id="a", agent_id="x", task="t"), {"delegation_id": "d"},
     "run_id"),
    ("swarm.claim", SwarmClaim(run_id="r", action_id="a"), {"claim_id": None, "claimed": [], "open": "2",
                                                            "claimed_isolated_joins": []}, "$.open"),
    ("swarm.contract", SwarmContract(run_id="r", delegation_id="d"), {"delegation_id": "d"}, "target_agent"),
    ("mcp.call", McpCall(action_id="a", arguments={}), {"ok": "yes"}, "$.ok"),
    ("mcp.call", McpCall(action_id="a", arguments={}), {"ok": True, "result": {"text": "x"}}, "is_error"),
    ("model.generate", ModelGenerate(model="m", messages=[ChatMessage("hi")], schema={}, max_tokens=8),
     {"id": "c", "object": "chat.completion", "model": "m", "choices": []}, "usage"),
]


@pytest.mark.parametrize(("method", "request_", "reply", "named"), MALFORMED, ids=lambda x: str(x)[:40])
def test_a_malformed_reply_is_a_clear_protocol_error(method: str, request_: Any, reply: Any, named: str) -> None:
    ctx = _ctx(Channel({method: reply}))
    with pytest.raises(BadReply) as caught:
        trio.run(ctx.ask, request_)
    assert caught.value.code is Code.BAD_REPLY
    assert method in str(caught.value) and named in str(caught.value), str(caught.value)


def test_a_well_formed_reply_is_its_record() -> None:
    begun = trio.run(_ctx(Channel({"action.begin": {"begin": "execute", "phase": "executing"}})).ask,
                     ActionBegin("r/0/0"))
    assert begun == ActionBegun(begin=Begin.EXECUTE, phase="executing") and begun.begin is Begin.EXECUTE
    finished = trio.run(_ctx(Channel({"action.finish": {"next": {"do": "park", "status": "x"}}})).ask,
                        ActionFinish("r/0/0", True))
    assert finished == Stepped(next=ParkStep(status="x"))


def test_the_lane_fails_its_run_over_a_malformed_step_and_lives_on(tmp_path: Path) -> None:
    """A step the agent cannot read (a supervisor bug) fails that run by name; the
    lane returns, so the agent goes on to claim its next run, rather than dying on
    a ``KeyError`` in every incarnation."""
    channel = Channel({"run.next_step": {"do": "execute", "tool": "fs.list"}, "run.fail": {}})
    run = ClaimedRun(run_id="r", task="t", kind="root", provider="scripted", provider_config={}, home=str(tmp_path))
    trio.run(Lane(_ctx(channel, tmp_path), run).drive)
    assert [body["method"] for body in channel.asked] == ["run.next_step", "run.fail"]
    failed = protocol.decode(channel.asked[-1])
    assert isinstance(failed, RunFail) and "protocol error" in failed.reason and "action_id" in failed.reason


# -- the source ---------------------------------------------------------------------

#: The methods whose handlers still answer a map (``dict[str, Any]``): none now
#: (the last six, the swarm's views, mcp.call's and model.generate's relayed
#: answers, have their reply records). It stays empty: a method answers its record
#: (``Request[X]``), and its handler says so.
MAP_REPLIES: set[str] = set()

RECORDS = {kind.__name__: kind for kind in protocol._TYPED.values()}


def _map_handlers(root: Path) -> dict[str, list[str]]:
    """Each request record whose handler in supervisor/ (it takes the calling
    ``slot`` and the record) answers ``dict[str, Any]``: where."""
    found: dict[str, list[str]] = {}
    for path in sorted((root / "supervisor").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) or node.returns is None:
                continue
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            typed = [ast.unparse(a.annotation) for a in args if a.annotation is not None]
            record = next((name for name in typed if name in RECORDS), None)
            if any(a.arg == "slot" for a in args) and record and ast.unparse(node.returns) == "dict[str, Any]":
                found.setdefault(record, []).append(f"{path.relative_to(root)}:{node.lineno}: {node.name}")
    return found


def test_no_handler_answers_a_map_but_the_listed_ones() -> None:
    found = _map_handlers(ROOT)
    newly = {name: where for name, where in found.items() if name not in MAP_REPLIES}
    assert not newly, f"handlers answering dict[str, Any] (give the method a reply record): {newly}"
    typed_since = MAP_REPLIES - set(found)
    assert not typed_since, f"typed now: take them off MAP_REPLIES: {sorted(typed_since)}"
    # The record agrees with its handler: a map reply has no REPLY, a typed one has.
    assert {name for name, kind in RECORDS.items() if kind.REPLY is None} == MAP_REPLIES


def test_the_check_finds_a_handler_answering_a_map(tmp_path: Path) -> None:
    (tmp_path / "supervisor").mkdir()
    (tmp_path / "supervisor" / "x_service.py").write_text(
        "from typing import Any\n"
        "class X:\n"
        "    async def begin(self, slot, request: ActionBegin) -> dict[str, Any]:\n"
        "        return {}\n"
        "    async def fine(self, slot, request: NextStep) -> Step:\n"
        "        return {}\n"
        "    def helper(self, request: ActionBegin) -> dict[str, Any]:  # no slot: not a handler\n"
        "        return {}\n"
    )
    assert _map_handlers(tmp_path) == {"ActionBegin": ["supervisor/x_service.py:3: begin"]}


#: The views a tool hands the model whole: each crosses the wire as its record and
#: the tool encodes it back (``msgspec.to_builtins``) to the same JSON the handler's
#: map was. A receipt the detail budget trimmed keeps its optional fields absent,
#: not null (supervisor/interactive/own_history.py ``_within_budget``).
VIEWS = [
    (HistoryActions(run_id="r", action_id="a"), {
        "agent_id": "agent-1",
        "receipts": [
            {"action_id": "r/2/0", "run_id": "r", "session_id": "s", "tool": "project.changeset", "status": "ok",
             "execution_mode": "confirm", "fingerprint": "f2", "finished_at": 3.0,
             "detail": {"checkpoint_id": "cp-1", "revision": 3, "change_count": 2, "revision_advanced": True}},
            {"action_id": "r/1/0", "run_id": "r", "session_id": "s", "tool": "fs.read", "status": "ok",
             "execution_mode": "auto", "fingerprint": "f1", "input_summary": "read a", "result_summary": "3 lines",
             "note": None, "started_at": 1.5, "finished_at": 2.0},
            {"action_id": "r/0/0", "run_id": "r", "session_id": "s", "tool": "project.changeset",
             "status": "failed", "execution_mode": "auto", "fingerprint": "f0", "finished_at": None,
             "detail_unavailable": True},
        ],
        "more": True,
        "truncated": True,
    }),
    (GoalVerdict(run_id="r", action_id="a", met=True, evidence="tests pass"), {
        "action_id": "a", "met": True, "evidence": "tests pass", "at": 1.25, "goal_revision": 2,
        "plan_revision": None, "verification_id": None,
    }),
    (SessionStart(run_id="r", action_id="a", program="sh"), {
        "process_id": "proc-1", "status": "failed", "launch_mode": None, "exit_code": None,
        "cursor": "c0", "error": "no sandbox", "code": "launch-failed",
    }),
    (SessionTerminate(run_id="r", process_id="proc-1"), {
        "process_id": "proc-1", "status": "terminated", "launch_mode": "bwrap", "exit_code": -15,
        "cursor": "c0", "error": None, "code": None,
    }),
    (SessionPoll(run_id="r", process_id="proc-1"), {
        "process_id": "proc-1", "chunk": "hi\n", "next_cursor": "c3", "status": "running", "exit_code": None,
        "more": False, "live": True, "listening": [4173],
        "stdin_open": True, "signal": None, "output_bytes": 3, "output_sha256": "ab", "needs_reconciliation": False,
        "source_changed": False,
    }),
    (SessionStdin(run_id="r", process_id="proc-1", data="x"), {
        "process_id": "proc-1", "bytes_written": 2, "sha256": "ab", "eof": False, "complete": True,
        "status": "running",
    }),
    (SwarmSpawn(run_id="r", action_id="a", children=[]), {
        "group_id": "grp-1",
        "children": [{"delegation_id": "dlg-1", "instance_id": "child-1", "run_id": "run-child-1",
                      "template": "worker", "status": "running"}],
    }),
    (SwarmDelegate(run_id="r", action_id="a", agent_id="reviewer", task="t"), {
        "delegation_id": "dlg-2", "run_id": "run-2", "target": "reviewer",
    }),
    (SwarmClaim(run_id="r", action_id="a"), {
        "claim_id": "clm-1",
        "claimed": [{"delivery_id": "dlv-1", "kind": "receipt", "status": "evidence-ready", "summary": "done",
                     "output": {"files": 2}, "artifacts": [{"path": "a", "sha256": "f"}]}],
        "open": 1,
        "claimed_delegate_contracts": [{"delegation_id": "dlg-2", "target_agent": "reviewer", "repair_of": None,
                                        "contract_status": "evidence-ready", "acceptance_criteria_count": 2,
                                        "expected_artifacts_count": 0}],
        "claimed_isolated_joins": [{"group_id": "grp-1", "delivery_id": "dlv-0", "claimed_by_action_id": "r/1/0",
                                    "children": [{"instance_id": "child-1", "template": "worker", "status": "ok",
                                                  "summary": "wrote a"}],
                                    "more_children": 0, "note": "claimed already"}],
    }),
    # Nothing ready: no directory of contracts (absent, not empty: the same JSON as before).
    (SwarmClaim(run_id="r", action_id="a"), {
        "claim_id": None, "claimed": [], "open": 0, "claimed_isolated_joins": [],
    }),
    (SwarmContract(run_id="r", delegation_id="dlg-2"), {
        "delegation_id": "dlg-2", "target_agent": "reviewer", "acceptance_criteria": ["tests pass"],
        "expected_artifacts": ["review.md"], "repair_of": None, "repaired_by": None, "delivery_id": "dlv-1",
        "delivery_status": "claimed-by-parent", "terminal_status": "completed", "contract_status": "needs-repair",
        "delivery": {"status": "needs-repair", "missing_artifacts": ["review.md"], "output": None},
    }),
    (McpCall(action_id="a", arguments={"q": 1}), {
        "ok": True,
        "result": {"is_error": False, "text": "3 rows", "structured": {"rows": [1, 2, 3]},
                   "other_content": [{"type": "image"}]},
    }),
    (McpCall(action_id="a", arguments={}), {
        "ok": True,
        "result": {"is_error": False, "text": "head", "structured": None, "other_content": []},
        "sidecar": "/h/transcripts/r/a.mcp.json", "bytes": 900000, "truncated": True,
    }),
    (McpCall(action_id="a", arguments={}), {"ok": False, "code": "mcp-unavailable", "error": "not ready"}),
    (ModelGenerate(model="m", messages=[ChatMessage("hi")], schema={}, max_tokens=8), {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "{}"}, "logprobs": None,
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 2},
        "timings": {"model_ms": 12.5, "ttft_ms": 3.25, "tokens_per_s": 160.0},
    }),
]


@pytest.mark.parametrize(("request_", "view"), VIEWS, ids=lambda x: type(x).__name__)
def test_a_view_reaches_the_model_as_the_same_json(request_: Any, view: dict[str, Any]) -> None:
    assert request_.REPLY is not None
    sent = msgspec.to_builtins(msgspec.convert(view, request_.REPLY))
    answer = trio.run(_ctx(Channel({request_.METHOD.value: sent})).ask, request_)
    assert type(answer) is request_.REPLY
    assert msgspec.to_builtins(answer) == view


def test_a_request_whose_reply_is_a_map_is_refused_as_it_is_made() -> None:
    """No new method may answer a map again: ``Request[dict[str, Any]]`` is refused
    when the class is made, before any handler could answer it."""
    with pytest.raises(TypeError, match="a reply is a record"):

        class MapReply(protocol.Request[dict[str, Any]], frozen=True):  # type: ignore[misc]
            METHOD = protocol.Method.PING

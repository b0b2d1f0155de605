"""Issue 50 §1: a malformed agent->supervisor frame is refused at the boundary, once.

A user actor sends raw bodies over its real link to a live supervisor: an unknown
method, a field of the wrong type, a missing field, a field no method has, a
non-map ``params``. Each must come back as a protocol error with a clear code
(``unknown-method`` / ``bad-request``) naming what is wrong, never an internal
error from deep inside a handler (a ``KeyError``, an ``AttributeError``), and
both the actor and the supervisor keep serving: the same incarnation answers a
well-formed ``ping`` afterwards.
"""

from __future__ import annotations

from pathlib import Path

import corral
from corral.mailbox.control import ControlError
from corral.mailbox.protocol import BenchSinkCount, BenchSinkReset, Ping, encode
from tests.harness import actor_running, running

ACTOR = """
import corral
from corral.mailbox.errors import RemoteError


class Prober(corral.Actor):
    async def handle_ask(self, message: dict) -> dict:
        try:
            answer = await self.ctx.channel.request("supervisor", message["body"], 10)
        except RemoteError as exc:
            return {"code": exc.code, "message": exc.message, "incarnation": self.ctx.incarnation}
        return {"answer": answer, "incarnation": self.ctx.incarnation}
"""

SPEC = '[[actors]]\nid = "prober"\ntemplate = "prober_actor:Prober"\n'

#: (body sent, code expected, words the message must hold)
MALFORMED = [
    ({"method": "no.such.method", "params": {}}, "unknown-method", "no.such.method"),
    ({"method": 7, "params": {}}, "bad-request", "method"),
    ({"method": "action.begin", "params": []}, "bad-request", "params"),
    ({"method": "action.begin", "params": {}}, "bad-request", "action_id"),
    ({"method": "action.begin", "params": {"action_id": 12}}, "bad-request", "action_id"),
    ({"method": "action.finish", "params": {"action_id": "a", "ok": "yes"}}, "bad-request", "ok"),
    ({"method": "action.finish_batch", "params": {"run_id": "r", "results": [1, 2]}}, "bad-request", "results"),
    ({"method": "run.next_step", "params": {"run_id": "r", "history_have": "many"}}, "bad-request", "history_have"),
    ({"method": "run.next_step", "params": {"run_id": "r", "histroy_have": 3}}, "bad-request", "histroy_have"),
    ({"method": "run.finalize", "params": {"run_id": "r", "reply": {"not": "text"}}}, "bad-request", "reply"),
    # the project: a bound the handler checked by hand is the record's now
    (
        {
            "method": "project.verify.record",
            "params": {"run_id": "r", "action_id": "a", "revision": -1, "fingerprint": "f", "outputs": []},
        },
        "bad-request",
        "revision",
    ),
    (
        {
            "method": "project.verify.record",
            "params": {"run_id": "r", "action_id": "a", "revision": 1, "fingerprint": "f" * 129, "outputs": []},
        },
        "bad-request",
        "fingerprint",
    ),
    ({"method": "project.verify.begin", "params": {"run_id": "r", "action_id": "a" * 65}}, "bad-request", "action_id"),
    # local models
    (
        {"method": "model.generate", "params": {"model": "m", "messages": [], "schema": {}, "max_tokens": 8}},
        "bad-request",
        "messages",
    ),
    (
        {
            "method": "model.generate",
            "params": {"model": "m", "messages": [{"content": "hi"}], "schema": {}, "max_tokens": 8, "temperature": 3},
        },
        "bad-request",
        "temperature",
    ),
    # MCP servers
    ({"method": "mcp.call", "params": {"action_id": "a", "arguments": ["x"]}}, "bad-request", "arguments"),
    ({"method": "mcp.ready", "params": {"server": "s", "tools": "all"}}, "bad-request", "tools"),
    # the swarm
    (
        {
            "method": "swarm.spawn",
            "params": {
                "run_id": "r",
                "action_id": "a",
                "children": [{"template": "t", "task": "x", "write_scopes": ["out"], "colour": "red"}],
            },
        },
        "bad-request",
        "colour",
    ),
    (
        {"method": "swarm.claim", "params": {"run_id": "r", "action_id": "a", "delivery_ids": "all"}},
        "bad-request",
        "delivery_ids",
    ),
    # the bridge worker's jobs
    ({"method": "bridge.job_open", "params": {"task_id": "t", "title": "x", "revision": 0}}, "bad-request", "revision"),
    (
        {"method": "bridge.job_advance", "params": {"job_id": "j", "phase": "lost", "reason": ""}},
        "bad-request",
        "reason",
    ),
    # sessions and commands
    (
        {"method": "session.poll", "params": {"run_id": "r", "process_id": "proc-1", "max_chars": 16_001}},
        "bad-request",
        "max_chars",
    ),
    ({"method": "session.stdin", "params": {"run_id": "r", "process_id": "proc-1", "data": 5}}, "bad-request", "data"),
    (
        {"method": "session.state", "params": {"process_id": "proc-1", "state": "exited", "exit_code": "x"}},
        "bad-request",
        "exit_code",
    ),
    ({"method": "command.launched", "params": {"run_id": "r", "action_id": "a"}}, "bad-request", "launch_mode"),
    # the provider and plan steps, long tasks, people (typed as each family moved)
    ({"method": "provider.begin", "params": {"run_id": "r", "loop": -1}}, "bad-request", "loop"),
    (
        {"method": "provider.handoff", "params": {"run_id": "r", "slot": "s", "text": "t", "system": "flat"}},
        "bad-request",
        "system",
    ),
    (
        {"method": "provider.handoff", "params": {"run_id": "r", "slot": "s", "text": "t", "notes": {"seen": -1}}},
        "bad-request",
        "seen",
    ),
    ({"method": "plan.commit", "params": {"run_id": "r", "loop": 0, "slot": "s", "plan": []}}, "bad-request", "plan"),
    (
        {"method": "action.prepare", "params": {"run_id": "r", "loop": 0, "index": 0, "tool": "", "input": {}}},
        "bad-request",
        "tool",
    ),
    ({"method": "context.compacted", "params": {"run_id": "r", "to_seq": 0, "summary": "s"}}, "bad-request", "to_seq"),
    (
        {"method": "goal.verdict", "params": {"run_id": "r", "action_id": "a", "met": "yes", "evidence": "e"}},
        "bad-request",
        "met",
    ),
    ({"method": "input.request", "params": {"run_id": "r", "action_id": "a"}}, "bad-request", "questions"),
    ({"method": "reply.delta", "params": {"run_id": "r", "slot": "s", "seq": 1, "text": 5}}, "bad-request", "text"),
]


def test_malformed_frames_get_protocol_errors_and_nothing_goes_down(short_tmp: Path) -> None:
    (short_tmp / "prober_actor.py").write_text(ACTOR)
    with running(short_tmp / "home", SPEC) as daemon:
        daemon.wait_until(actor_running("prober"), what="the prober actor running")
        boot_id = daemon.endpoint.boot_id
        with corral.Client.connect(daemon.home) as client:
            seen: list[tuple[object, object, object]] = []
            for body, code, words in MALFORMED:
                try:
                    answer = client.ask("prober", {"body": body})
                except ControlError as exc:  # the actor itself failed: never acceptable
                    raise AssertionError(f"{body}: the actor failed: {exc}") from None
                seen.append((body, answer.get("code"), answer.get("message", "")))
                assert answer.get("code") == code, (body, answer)
                assert words in answer["message"], (body, answer)
            pong = client.ask("prober", {"body": {"method": "ping", "params": {}}})
            assert pong["answer"] == {"pong": True, "actor": "prober"}
            assert pong["incarnation"] == 1
            # The bench's link probe: a ping that carries a payload of the size it measures.
            sized = client.ask("prober", {"body": encode(Ping(payload="x" * 4096))})
            assert sized["answer"] == {"pong": True, "actor": "prober"}, sized
        assert daemon.actor("prober")["restarts"] == 0
        assert daemon.endpoint.boot_id == boot_id
        assert len(seen) == len(MALFORMED)


PROBES_SPEC = '[supervisor]\nprobes = true\n[[actors]]\nid = "e-1"\ntemplate = "echo"\n' + SPEC


def test_a_family_is_served_typed_and_only_where_it_is_built(short_tmp: Path) -> None:
    """The bench's probes (one family, supervisor/actor_methods.py): with
    ``probes = true`` their records are checked at the boundary (a field the
    record lacks is refused) and served; the echo actor's tells reach the sink
    and are counted. Without it, the same records are ``unknown-method``."""
    for where in ("with", "without"):  # beside each home, where its actors import from
        (short_tmp / where).mkdir()
        (short_tmp / where / "prober_actor.py").write_text(ACTOR)
    with running(short_tmp / "with" / "home", PROBES_SPEC) as daemon:
        daemon.wait_until(actor_running("prober"), what="the prober actor running")
        daemon.wait_until(actor_running("e-1"), what="the echo actor running")
        with corral.Client.connect(daemon.home) as client:
            stray = client.ask("prober", {"body": {"method": "bench.sink_count", "params": {"n": 1}}})
            assert stray.get("code") == "bad-request" and "n" in stray["message"], stray
            told = client.ask("e-1", {"op": "bench_tells", "n": 50, "batch": 7, "size": 16})
            assert told["n"] == 50, told
            count = client.ask("prober", {"body": encode(BenchSinkCount())})
            assert count["answer"] == {"count": 50}, count
            assert client.ask("prober", {"body": encode(BenchSinkReset())})["answer"] == {}
            assert client.ask("prober", {"body": encode(BenchSinkCount())})["answer"] == {"count": 0}
    with running(short_tmp / "without" / "home", SPEC) as daemon:
        daemon.wait_until(actor_running("prober"), what="the prober actor running")
        with corral.Client.connect(daemon.home) as client:
            absent = client.ask("prober", {"body": encode(BenchSinkCount())})
            assert absent.get("code") == "unknown-method" and "bench.sink_count" in absent["message"], absent
            assert client.ask("prober", {"body": encode(Ping())})["answer"] == {"pong": True, "actor": "prober"}
        assert daemon.actor("prober")["restarts"] == 0

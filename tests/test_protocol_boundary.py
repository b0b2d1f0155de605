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
from corral.mailbox.protocol import Ping, encode
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

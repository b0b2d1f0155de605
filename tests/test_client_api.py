"""``corral.Client`` and ``corral.AsyncClient`` against real supervisors."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import trio

import corral
from corral.core.procs import is_alive
from tests.harness import agent_spec, effects, ledger_rows, running

STEPS = """
[[agents.steps]]
actions = [{ tool = "effect.record", input = { label = "e1" } }]
[[agents.steps]]
final = "done: ${ok.action_id}"
"""


def _spec(tmp: Path, *, confirm: bool = False) -> Path:
    (tmp / "ws").mkdir(exist_ok=True)
    spec = tmp / "swarm.toml"
    policy = '[agents.policy]\n"effect.record" = "confirm"' if confirm else ""
    spec.write_text(agent_spec(steps=STEPS, policy=policy))
    return spec


def test_start_runs_waits_and_stops_the_supervisor_it_started(short_tmp: Path) -> None:
    home = short_tmp / "h"
    with corral.Client.start(spec=_spec(short_tmp), home=home) as client:
        pid = client.ping()["pid"]
        result = client.run("writer", "record once")
        assert isinstance(result, corral.RunResult)
        assert result.status == "completed" and result.ok and result.done
        assert result.final_reply is not None and result.final_reply.startswith("done")
        assert [(a.tool, a.phase) for a in result.actions] == [("effect.record", "ok")]
        assert result.run_id.startswith("run-c")
        kinds = [event.kind for event in client.events()]
        assert "run-completed" in kinds
        assert {a["id"] for a in client.status()["actors"]} == {"writer"}
        assert [r["run_id"] for r in client.runs()] == [result.run_id]
    assert not is_alive(pid), "the supervisor stops when the block ends"
    assert not (home / "endpoint.json").exists()
    assert len(effects(short_tmp / "effects.log")) == 1


def test_a_retried_run_with_the_same_id_is_the_same_run(short_tmp: Path) -> None:
    with corral.Client.start(spec=_spec(short_tmp), home=short_tmp / "h") as client:
        first = client.run("writer", "once", wait=False, run_id="run-retry-0001")
        again = client.run("writer", "once", wait=True, run_id="run-retry-0001")
        assert first.run_id == again.run_id == "run-retry-0001"
        assert again.status == "completed"
        assert len(client.runs()) == 1
    assert len(ledger_rows(short_tmp / "h", "SELECT run_id FROM runs")) == 1
    assert len(effects(short_tmp / "effects.log")) == 1


def test_pending_approve_deny_and_cancel(short_tmp: Path) -> None:
    with corral.Client.start(spec=_spec(short_tmp, confirm=True), home=short_tmp / "h") as client:
        parked = client.run("writer", "approve me")
        assert parked.status == "waiting-confirmation" and parked.parked
        pending = client.pending()
        assert pending and [a["action_id"] for a in pending.actions] == [parked.actions[0].action_id]
        with pytest.raises(corral.ControlError) as wrong:
            client.approve(parked.actions[0].action_id, fingerprint="0" * 64)
        assert "fingerprint" in wrong.value.message
        client.approve(parked.actions[0].action_id)
        assert client.wait(parked.run_id).status == "completed"
        assert len(effects(short_tmp / "effects.log")) == 1
        with pytest.raises(corral.ControlError, match="not waiting"):
            client.approve(parked.actions[0].action_id)

        denied = client.run("writer", "deny me")
        client.deny(denied.actions[0].action_id)
        done = client.wait(denied.run_id)
        assert [r["status"] for r in done.raw["receipts"]] == ["denied"]
        assert len(effects(short_tmp / "effects.log")) == 1

        cancelled = client.run("writer", "cancel me")
        assert cancelled.parked
        with pytest.raises(corral.RunTimeout):
            client.wait(cancelled.run_id, timeout=0.3, until_parked=False)
        client.cancel(cancelled.run_id)
        shown = client.show(cancelled.run_id)
        assert shown.status == "cancelled"
        with pytest.raises(corral.RunFailed, match="cancelled"):
            shown.check()
        # Its action never started: denied with a receipt, no longer waiting for a person.
        assert [a.phase for a in shown.actions] == ["denied"]
        assert [r["status"] for r in shown.raw["receipts"]] == ["denied"]
        assert cancelled.run_id not in [a["run_id"] for a in client.pending().actions]
        assert len(effects(short_tmp / "effects.log")) == 1


def test_reconcile_resolves_a_lost_provider_response(short_tmp: Path) -> None:
    from tests.userpkg import write_package

    write_package(short_tmp)
    spec = short_tmp / "swarm.toml"
    (short_tmp / "ws").mkdir()
    spec.write_text('[project]\nroot = "ws"\n[[agents]]\nid = "llm"\nprovider = "userpkg.llm:EchoLLM"\n')
    import os

    os.environ["CORRAL_FAILPOINTS"] = "provider.before-handoff=kill@once"
    try:
        starting = corral.Client.start(spec=spec, home=short_tmp / "h")
        client = starting.__enter__()
    finally:
        del os.environ["CORRAL_FAILPOINTS"]
    try:
        result = client.run("llm", "lose it")
        assert result.status == "needs-reconciliation"
        slots = [r["slot"] for r in client.pending().provider_requests]
        assert slots == [f"{result.run_id}:0"]
        answer = client.reconcile(slots[0], "failed", "checked: no answer was used")
        assert answer["run_id"] == result.run_id
        assert not client.pending().provider_requests
    finally:
        starting.__exit__(None, None, None)


def test_follow_yields_new_events_as_they_happen(short_tmp: Path) -> None:
    with corral.Client.start(spec=_spec(short_tmp), home=short_tmp / "h") as client:
        cursor = max((event.cursor for event in client.events()), default=0)
        run = client.run("writer", "follow me", wait=False)
        seen = []
        with corral.Client.connect(short_tmp / "h") as watcher:
            for event in watcher.events(cursor, follow=True):
                seen.append(event)
                if event.kind == "run-completed" and event.subject == run.run_id:
                    break
        assert all(event.cursor > cursor for event in seen)
        assert [e.cursor for e in seen] == sorted(e.cursor for e in seen)


def test_errors_are_corral_errors(short_tmp: Path) -> None:
    with pytest.raises(corral.NotRunning) as gone:
        corral.Client.connect(short_tmp / "nothing")
    assert isinstance(gone.value, corral.CorralError)
    bad = short_tmp / "bad.toml"
    bad.write_text('[[actors]]\nid = "a"\ntemplate = "nope"\n')
    with (
        pytest.raises(corral.SpecError, match="unknown template 'nope'"),
        corral.Client.start(spec=bad, home=short_tmp / "h2"),
    ):
        pass
    assert not (short_tmp / "h2" / "endpoint.json").exists()
    with corral.Client.start(spec=_spec(short_tmp), home=short_tmp / "h") as client:
        with pytest.raises(corral.ControlError) as refused:
            client.run("nobody", "x", wait=False)
        assert isinstance(refused.value, corral.CorralError) and refused.value.code


def test_client_and_async_client_have_the_same_methods_and_parameters() -> None:
    # Client is AsyncClient run to completion: a parameter one of them lacks (as
    # ledger= and node= were missing from AsyncClient.start) is drift.
    def surface(cls: type) -> dict[str, list[tuple[str, object, object]]]:
        methods = {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}
        return {
            name: [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]
            for name, method in methods.items()
            if callable(method)
        }

    sync, asynchronous = surface(corral.Client), surface(corral.AsyncClient)
    # aclose is close awaited: asynchronous by nature, as __aenter__ is.
    assert asynchronous.pop("aclose") == [("self", inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty)]
    assert sorted(sync) == sorted(asynchronous)
    assert {"start", "connect", "run", "wait", "events", "call", "down"} <= set(sync)
    for name in sync:
        assert sync[name] == asynchronous[name], name


async def test_async_client_runs_follows_and_approves(short_tmp: Path) -> None:
    home = short_tmp / "h"
    with pytest.raises(corral.CorralError, match=r"use corral\.AsyncClient"):
        corral.Client.start(spec=_spec(short_tmp), home=home).__enter__()
    async with corral.AsyncClient.start(spec=_spec(short_tmp, confirm=True), home=home) as started:
        async with corral.AsyncClient.connect(home) as client:
            assert (await client.ping())["pong"] is True
            parked = await client.run("writer", "async approve")
            assert parked.status == "waiting-confirmation"
            pending = await client.pending()
            await client.approve(pending.actions[0]["action_id"])
            done = await client.wait(parked.run_id)
            assert done.status == "completed" and done.final_reply is not None
            history = [event async for event in client.events()]
            assert "run-completed" in [event.kind for event in history]

            async with corral.AsyncClient.connect(home) as watcher:
                second = await client.run("writer", "async two", wait=False)
                seen: list[str] = []
                with trio.fail_after(60):  # a safety net, not a timing assertion
                    async for event in watcher.events(history[-1].cursor, follow=True):
                        seen.append(event.kind)
                        if event.kind == "run-waiting-confirmation" and event.subject == second.run_id:
                            break
                assert "run-waiting-confirmation" in seen
        pid = (await started.ping())["pid"]
    assert not is_alive(pid)


def test_a_run_whose_reply_was_lost_is_found_again_by_the_retry(short_tmp: Path) -> None:
    # The supervisor commits the run, then is SIGKILLed before it can answer. The
    # client keeps sending the same request (same client-chosen run id) until a
    # restarted supervisor answers: one run, one side effect.
    import threading

    from corral.core.procs import wait_exit
    from corral.supervisor.home import home_dir as homes
    from tests.harness import Daemon

    daemon = Daemon(short_tmp / "h", _spec(short_tmp))
    try:
        first = daemon.up(env={"CORRAL_FAILPOINTS": "run.after-create=kill@once"})
        problems: list[BaseException] = []

        def restart_when_dead() -> None:
            try:
                assert wait_exit(first.pid, 60), "the failpoint did not kill the supervisor"
                daemon.up()
            except BaseException as exc:  # reported by the test thread below
                problems.append(exc)

        restarter = threading.Thread(target=restart_when_dead)
        restarter.start()
        try:
            with corral.Client.connect(daemon.home) as client:
                result = client.run("writer", "lost reply", run_id="run-lost-reply-1", retry_s=90, timeout=90)
        finally:
            restarter.join()
        assert problems == []
        assert homes.read_endpoint(daemon.home).pid != first.pid, "the answer came from the restarted supervisor"
        assert (result.run_id, result.status) == ("run-lost-reply-1", "completed")
        assert ledger_rows(daemon.home, "SELECT run_id FROM runs") == [{"run_id": "run-lost-reply-1"}]
        assert len(effects(short_tmp / "effects.log")) == 1
    finally:
        daemon.shutdown()


def test_a_connection_made_with_a_stale_token_is_not_kept(short_tmp: Path) -> None:
    """A restarted supervisor listens before it writes its endpoint file: a client
    that connects in between holds the old token. It must not keep that connection
    (the chat kept answering 'bad-token' after a restart): once the file is current,
    the same client works. The stale file is made by hand, and the heartbeat that
    rewrites the file is an hour away, so nothing races the test."""
    with running(short_tmp / "h", "[supervisor]\nheartbeat_s = 3600.0\n") as daemon:
        endpoint_file = daemon.home / "endpoint.json"
        current = endpoint_file.read_text()
        endpoint_file.write_text(json.dumps({**json.loads(current), "token": "0" * 64}))
        client = corral.Client(daemon.home)
        try:
            with pytest.raises(corral.ControlError) as refused:
                client.status()
            assert refused.value.code == "bad-token"
            endpoint_file.write_text(current)
            assert client.status()["boot_id"] == daemon.status()["boot_id"]
        finally:
            client.close()

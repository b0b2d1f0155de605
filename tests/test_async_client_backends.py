"""``corral.AsyncClient`` under both event loops a Python user may live in.

Each test is one plain function run twice: by ``asyncio.run(main())`` (FastAPI,
LangGraph, Pydantic AI) and by ``trio.run(main)``. A real supervisor each time;
every process started is stopped and reaped by the client or here.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread
import pytest
import sniffio
import trio

import corral
from corral.client_start import start_supervisor
from corral.core.procs import is_alive
from corral.mailbox.control import ControlClient
from tests.harness import agent_spec, effects

T = TypeVar("T")

STEPS = """
[[agents.steps]]
actions = [{ tool = "effect.record", input = { label = "e1" } }]
[[agents.steps]]
final = "done: ${ok.action_id}"
"""

#: A safety net for a hang, never a timing assertion: each wait below ends on state.
HANG_S = 120

backends = pytest.mark.parametrize("backend", ["asyncio", "trio"])


def _spec(tmp: Path, *, confirm: bool = False) -> Path:
    (tmp / "ws").mkdir(exist_ok=True)
    spec = tmp / "swarm.toml"
    policy = '[agents.policy]\n"effect.record" = "confirm"' if confirm else ""
    spec.write_text(agent_spec(steps=STEPS, policy=policy))
    return spec


def _run_on(backend: str, main: Callable[[], Awaitable[T]]) -> T:
    async def checked() -> T:
        assert sniffio.current_async_library() == backend, "the test runs on the loop it names"
        with anyio.fail_after(HANG_S):
            return await main()

    if backend == "asyncio":
        return asyncio.run(checked())
    return trio.run(checked)


async def _until_long_polls(home: Path, count: int) -> None:
    """Until the supervisor holds ``count`` long polls (its control pool's counter)."""
    async with corral.AsyncClient.connect(home) as probe:
        while (await probe.status())["control"]["long_polls"] < count:
            await anyio.sleep(0.01)


@backends
def test_start_run_wait_stream_events_and_cancel_a_call(short_tmp: Path, backend: str) -> None:
    home = short_tmp / "h"

    async def main() -> tuple[int, corral.RunResult, list[corral.Event], list[corral.Event], corral.RunResult]:
        async with corral.AsyncClient.start(spec=_spec(short_tmp), home=home) as client:
            pid = int((await client.ping())["pid"])
            streamed: list[corral.Event] = []
            async with corral.AsyncClient.connect(home) as watcher, anyio.create_task_group() as group:

                async def follow() -> None:
                    # Started before the run exists: a long poll that the run's events end.
                    async for event in watcher.events(follow=True):
                        streamed.append(event)
                        if event.kind == "run-completed" and event.subject == "run-both-loops-1":
                            return

                group.start_soon(follow)
                result = await client.run("writer", "record once", run_id="run-both-loops-1")
            history = [event async for event in client.events()]

            # A call cancelled by its caller leaves the client usable: its request is
            # abandoned, and the late answer (the next run's events end the long
            # poll) never passes for the answer to a later call.
            async with anyio.create_task_group() as group:
                group.start_soon(functools.partial(client.call, "events", since=history[-1].cursor, wait_ms=60_000))
                await _until_long_polls(home, 1)
                group.cancel_scope.cancel()
            again = await client.run("writer", "record again")
            assert (await client.ping())["pid"] == pid
        return pid, result, streamed, history, again

    pid, result, streamed, history, again = _run_on(backend, main)
    assert again.status == "completed"
    assert (result.run_id, result.status) == ("run-both-loops-1", "completed")
    assert result.final_reply is not None and result.final_reply.startswith("done")
    assert [(a.tool, a.phase) for a in result.actions] == [("effect.record", "ok")]
    assert "run-completed" in [event.kind for event in history]
    assert [e.cursor for e in streamed] == sorted({e.cursor for e in streamed}), "in order, each once"
    assert streamed[-1].subject == "run-both-loops-1"
    assert len(effects(short_tmp / "effects.log")) == 2
    assert not is_alive(pid), "the supervisor stops when the block ends"
    assert not (home / "endpoint.json").exists()


@backends
def test_a_wait_in_flight_when_the_supervisor_is_killed_fails_clearly_and_the_client_reconnects(
    short_tmp: Path, backend: str
) -> None:
    home = short_tmp / "h"
    spec = _spec(short_tmp, confirm=True)
    restarted: list[subprocess.Popen[bytes]] = []

    async def main() -> tuple[list[BaseException], corral.RunResult, list[str]]:
        async with corral.AsyncClient.start(spec=spec, home=home) as client:
            parked = await client.run("writer", "approve me after a restart")
            assert parked.status == "waiting-confirmation"
            first_pid = int((await client.ping())["pid"])
            failures: list[BaseException] = []
            async with anyio.create_task_group() as group:

                async def waiting() -> None:
                    try:
                        await client.wait(parked.run_id, until_parked=False)
                    except corral.SupervisorGone as exc:
                        failures.append(exc)

                group.start_soon(waiting)
                await _until_long_polls(home, 1)  # kill only once the supervisor holds the wait
                os.kill(first_pid, signal.SIGKILL)
            restarted.append(await anyio.to_thread.run_sync(start_supervisor, home, spec))
            # The same client finds the new supervisor (new address, new token).
            assert (await client.ping())["pid"] == restarted[0].pid != first_pid
            await client.approve(parked.actions[0].action_id)
            done = await client.wait(parked.run_id)
            history = [event.kind async for event in client.events()]
        # The block's end stopped the supervisor on the home: the restarted one.
        return failures, done, history

    try:
        failures, done, history = _run_on(backend, main)
        assert restarted[0].wait(timeout=30) == 0, "stopped gracefully by the start block"
    finally:
        for process in restarted:
            if process.poll() is None:  # only when the test failed before the stop
                process.kill()
                process.wait()
    assert len(failures) == 1, "the wait in flight failed, once"
    assert "exited before answering" in str(failures[0]) or "lost the connection" in str(failures[0])
    assert done.status == "completed"
    assert history.count("run-completed") == 1
    assert len(effects(short_tmp / "effects.log")) == 1, "approved once, run once across the restart"


@backends
def test_start_refuses_a_bad_spec_ledger_or_node_as_client_start_does(short_tmp: Path, backend: str) -> None:
    # ledger= and node= reach the supervisor's start; a bad one is refused there and nothing runs.
    async def main(ledger: str | None, node: str | None) -> None:
        async with corral.AsyncClient.start(spec=_spec(short_tmp), home=short_tmp / "h", ledger=ledger, node=node):
            raise AssertionError("started with a bad ledger or node")

    bad = short_tmp / "bad.toml"
    bad.write_text('[[actors]]\nid = "a"\ntemplate = "nope"\n')

    async def bad_spec() -> None:
        async with corral.AsyncClient.start(spec=bad, home=short_tmp / "h"):
            raise AssertionError("started with a bad spec")

    with pytest.raises(corral.SpecError, match="unknown template 'nope'"):  # the error itself, not a group
        _run_on(backend, bad_spec)
    with pytest.raises(ValueError, match=r"ledger url: must be postgresql://"):
        _run_on(backend, lambda: main("sqlite:///elsewhere.db", None))
    with pytest.raises(ValueError, match=r"node id 'Not A Node'"):
        _run_on(backend, lambda: main(None, "Not A Node"))
    assert not (short_tmp / "h" / "endpoint.json").exists()


# A stand-in supervisor: takes one request, then dies (argv[2] == "die") or keeps
# silent until it is killed.
TAKES_ONE_REQUEST = """
import os, sys, time, pynng
with pynng.Rep0() as socket:
    socket.listen(sys.argv[1])
    print("listening", flush=True)
    socket.recv()
    print("received", flush=True)
    if sys.argv[2] == "die":
        os._exit(9)
    time.sleep(3600)
"""


@backends
@pytest.mark.parametrize("then", ["die", "keep-silent"])
def test_the_control_exchange_reports_a_dead_or_silent_supervisor_on_both_loops(
    short_tmp: Path, backend: str, then: str
) -> None:
    address = f"ipc://{short_tmp}/control.ipc"
    server = subprocess.Popen([sys.executable, "-c", TAKES_ONE_REQUEST, address, then], stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"listening"
        # A silent one is waited for 0.5 s: the deadline is what is tested, and
        # nothing else can answer in its place.
        deadline = 0.5 if then == "keep-silent" else HANG_S

        async def main() -> None:
            with ControlClient(address, "t" * 64, timeout=deadline, pid=server.pid) as control:
                await control.acall("status")

        expected = corral.SupervisorGone if then == "die" else corral.DeadlineExceeded
        with pytest.raises(expected):  # the error itself, not an ExceptionGroup
            _run_on(backend, main)
        assert server.stdout.readline().strip() == b"received", "the request was in flight"
    finally:
        server.kill()
        server.wait()


#: A wait that never ends on its own while the test runs: only the run's end answers it.
FOREVER_S = 24 * 3600.0


@backends
def test_one_client_waits_follows_lists_and_approves_at_once(short_tmp: Path, backend: str) -> None:
    # Three tasks, one client: `wait` and `events(follow=True)` hold their calls while a
    # third lists `pending` and approves. The approver starts only once the supervisor
    # holds both long polls of the client at once, so it cannot go through between two
    # of them: a client that takes one call at a time never gets there and the test
    # hangs until its fail-safe. What ends each task is state (the run's end), no clock.
    home = short_tmp / "h"

    async def main() -> tuple[corral.RunResult, list[corral.Event], dict[str, object], str]:
        async with corral.AsyncClient.start(spec=_spec(short_tmp, confirm=True), home=home) as client:
            run_id = (await client.run("writer", "approve me while others wait", wait=False)).run_id
            done: list[corral.RunResult] = []
            streamed: list[corral.Event] = []
            approved: list[dict[str, object]] = []
            async with anyio.create_task_group() as group:

                async def waiting() -> None:
                    done.append(await client.wait(run_id, timeout=FOREVER_S, until_parked=False))

                async def following() -> None:
                    async for event in client.events(follow=True):
                        streamed.append(event)
                        if event.kind == "run-completed" and event.subject == run_id:
                            return

                async def approving() -> None:
                    await _until_long_polls(home, 2)
                    while True:  # the run parks when its action asks for confirmation
                        waiting_ids = [action["action_id"] for action in (await client.pending()).actions
                                       if action["run_id"] == run_id and action["phase"] == "waiting-confirmation"]
                        if waiting_ids:
                            break
                        await anyio.sleep(0.01)
                    approved.append(await client.approve(waiting_ids[0]))

                group.start_soon(waiting)
                group.start_soon(following)
                group.start_soon(approving)
            pid = str((await client.ping())["pid"])
        return done[0], streamed, approved[0], pid

    done, streamed, approved, pid = _run_on(backend, main)
    assert (done.status, done.final_reply is not None) == ("completed", True)
    assert [(a.tool, a.phase) for a in done.actions] == [("effect.record", "ok")]
    assert approved, "the approve answered"
    assert streamed[-1].kind == "run-completed" and "run-waiting-confirmation" in [e.kind for e in streamed]
    assert [e.cursor for e in streamed] == sorted({e.cursor for e in streamed}), "in order, each once"
    assert len(effects(short_tmp / "effects.log")) == 1, "approved once, run once"
    assert not is_alive(int(pid))


@backends
def test_aclose_is_awaited_and_ends_a_call_in_flight_at_once(short_tmp: Path, backend: str) -> None:
    # `await client.aclose()` as asyncio code writes it. A wait in flight on the
    # client (for a run that only an approve would end) fails at once with
    # ClientClosed instead of holding on, and `async with` still closes.
    home = short_tmp / "h"

    async def main() -> list[BaseException]:
        failures: list[BaseException] = []
        async with corral.AsyncClient.start(spec=_spec(short_tmp, confirm=True), home=home) as owner:
            parked = await owner.run("writer", "park until approved")
            assert parked.status == "waiting-confirmation"
            client = corral.AsyncClient.connect(home)
            async with anyio.create_task_group() as group:

                async def waiting() -> None:
                    try:
                        await client.wait(parked.run_id, timeout=FOREVER_S, until_parked=False)
                    except corral.CorralError as exc:
                        failures.append(exc)

                group.start_soon(waiting)
                await _until_long_polls(home, 1)
                await client.aclose()
            await client.aclose()  # twice is no error
            async with corral.AsyncClient.connect(home) as other:
                assert (await other.show(parked.run_id)).status == "waiting-confirmation", "closing changed nothing"
        return failures

    failures = _run_on(backend, main)
    assert len(failures) == 1 and isinstance(failures[0], corral.ClientClosed), failures
    assert "closed while this call" in str(failures[0])


@backends
def test_a_call_cut_by_its_deadline_leaves_the_other_calls_on_the_client_alone(short_tmp: Path, backend: str) -> None:
    # The client drops a connection on which a call timed out, but a follow in flight
    # on it goes on (it is closed when that follow's call ends), and the next calls
    # go on a new one. The deadline is what is tested: 0.5 s of a wait that only an
    # approve can end.
    home = short_tmp / "h"

    async def main() -> tuple[str, list[corral.Event]]:
        seen: list[corral.Event] = []
        async with (
            corral.AsyncClient.start(spec=_spec(short_tmp, confirm=True), home=home) as client,
            anyio.create_task_group() as group,
        ):
            parked = await client.run("writer", "park until approved")
            assert parked.status == "waiting-confirmation"

            async def following() -> None:
                async for event in client.events(follow=True):
                    seen.append(event)
                    if event.kind == "run-completed" and event.subject == parked.run_id:
                        return

            group.start_soon(following)
            await _until_long_polls(home, 1)
            with pytest.raises(corral.DeadlineExceeded):
                await client.call("wait", run_ids=[parked.run_id], until="done", wait_ms=60_000, timeout=0.5)
            await client.approve(parked.actions[0].action_id)
        return parked.run_id, seen

    run_id, seen = _run_on(backend, main)
    assert (seen[-1].kind, seen[-1].subject) == ("run-completed", run_id)
    assert [e.cursor for e in seen] == sorted({e.cursor for e in seen}), "in order, each once"


@backends
def test_calls_in_flight_past_the_descriptor_limit_are_answered(short_tmp: Path, backend: str) -> None:
    # Each call in flight watches the supervisor's pidfd; past the process's limit on
    # open files a call goes unwatched (its deadline still bounds it) instead of failing.
    home = short_tmp / "h"
    calls = 200

    async def main() -> list[object]:
        answers: list[object] = []
        async with corral.AsyncClient.start(spec=_spec(short_tmp), home=home) as client:
            await client.ping()
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            open_fds = {int(fd) for fd in os.listdir("/proc/self/fd")}
            limit = free = 0
            while free < 16:  # a limit that leaves 16 descriptor numbers free, far fewer than the calls
                free += limit not in open_fds
                limit += 1
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
            try:
                async with anyio.create_task_group() as group:

                    async def poll() -> None:
                        answers.append(await client.call("events", since=2**62, wait_ms=500))

                    for _ in range(calls):
                        group.start_soon(poll)
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        return answers

    answers = _run_on(backend, main)
    assert len(answers) == calls

"""Issue 32, items 18-19: the control plane of a supervisor stays its own.

A supervisor on its way out removes only the files it made in its own home, never
those of a new supervisor started on a new home at the same path; and long polls
have their own bounded pool, refused clearly past it, so ``status`` and ``ping``
always answer."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path

import psutil
import pynng
import pytest
import trio

from corral.core.procs import wait_exit
from corral.mailbox.codec import decode, encode
from corral.mailbox.control import ControlError, configure_socket
from corral.mailbox.envelope import Envelope, Kind
from corral.supervisor.home import home_dir as homes
from tests.harness import Daemon, cli, running, wait_for

ECHO = '[[actors]]\nid = "echo"\ntemplate = "echo"\n'

# -- item 18: a new home at the same path ------------------------------------------------


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def _kill_tree(pid: int) -> None:
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        wait_exit(proc.pid, 5)


def test_a_supervisor_on_its_way_out_leaves_a_new_home_at_its_path_alone(short_tmp: Path) -> None:
    home = short_tmp / "home"
    # A's own heartbeat never comes round during the test: A stops when the test
    # says so, after B is up (the order in which the issue saw B's socket unlinked).
    (short_tmp / "a.toml").write_text("[supervisor]\nheartbeat_s = 3600\n" + ECHO)
    (short_tmp / "b.toml").write_text(ECHO)
    a, b = Daemon(home, short_tmp / "a.toml"), Daemon(home, short_tmp / "b.toml")
    a_pid = a.up().pid
    try:
        shutil.rmtree(home)
        b_pid = b.up().pid
        assert b_pid != a_pid
        b_files = ["endpoint.json", "supervisor.lock", "s/control.ipc", "ledger.db", "ledger.db-wal"]
        made = {name: _identity(home / name) for name in b_files}
        assert None not in made.values(), made

        os.kill(a_pid, signal.SIGTERM)  # A goes, through its whole shutdown
        assert wait_exit(a_pid, 30), "supervisor A did not stop"

        assert {name: _identity(home / name) for name in b_files} == made, "A removed or replaced B's files"
        status = cli(home, "status")
        assert status.returncode == 0, status.stderr
        assert f"pid {b_pid}" in status.stdout
        assert b.call("ping")["pid"] == b_pid
        assert b.call("request_actor", actor_id="echo", body={"n": 1})["echo"] == {"n": 1}
    finally:
        b.shutdown()
        _kill_tree(a_pid)


async def test_an_actor_listener_removes_only_its_own_socket_file(short_tmp: Path) -> None:
    """The other socket files a supervisor makes (one per actor start) are removed,
    once the actor dialled in, only if the name still holds that very socket."""
    from corral.mailbox import link

    path = short_tmp / "a0.ipc"
    listener = link.Listener(f"ipc://{path}", 1 << 20)
    path.unlink()  # the home went; a new supervisor made its own a0.ipc there
    path.write_bytes(b"another supervisor's")
    listener.close()
    assert path.read_bytes() == b"another supervisor's"
    mine = link.Listener(f"ipc://{path.with_name('a1.ipc')}", 1 << 20)
    mine.close()
    assert not path.with_name("a1.ipc").exists()


# -- item 19: long polls past the pool ---------------------------------------------------


class LongPolls:
    """``count`` long polls of ``events`` held open at once by one token holder (this
    process), each on its own connection, from a thread so the test can go on."""

    def __init__(self, home: Path, count: int, since: int) -> None:
        self.endpoint = homes.read_endpoint(home)
        self.count = count
        self.since = since
        self.answered = 0
        self.refused: list[tuple[str, str]] = []
        self.failed: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=trio.run, args=(self._all,), daemon=True)

    def __enter__(self) -> LongPolls:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(timeout=90)
        assert not self._thread.is_alive(), "long polls still open after their deadline"

    def settled(self) -> int:
        with self._lock:
            return self.answered + len(self.refused) + len(self.failed)

    async def _all(self) -> None:
        with trio.move_on_after(60):  # a safety net: every poll ends before, one way or the other
            async with trio.open_nursery() as nursery:
                for _ in range(self.count):
                    nursery.start_soon(self._one)

    async def _one(self) -> None:
        request = Envelope(
            Kind.REQUEST,
            "test",
            "supervisor",
            {"method": "events", "params": {"since": self.since, "wait_ms": 30_000}},
            token=self.endpoint.token,
        )
        with pynng.Req0() as socket:
            configure_socket(socket, 1 << 20)
            try:
                socket.dial(self.endpoint.control, block=True)
                await socket.asend(encode(request))
                reply = decode(await socket.arecv())
            except pynng.NNGException as exc:
                with self._lock:
                    self.failed.append(str(exc))
                return
        with self._lock:
            if reply.kind is Kind.ERROR:
                self.refused.append((str(reply.body.get("code")), str(reply.body.get("message"))))
            else:
                self.answered += 1


def _hold_polls_past_the_pool(daemon: Daemon, count: int, pool: int) -> None:
    cursor = daemon.status()["cursor"]
    with LongPolls(daemon.home, count, since=cursor) as polls:
        # Every poll is in: the pool is full and the rest were refused at once.
        wait_for("the polls past the pool refused", lambda: len(polls.refused) == count - pool)
        assert {code for code, _ in polls.refused} == {"too-many-long-polls"}
        message = polls.refused[0][1]
        assert f"{pool} long polls" in message and "max_long_polls" in message
        for _ in range(5):  # and the control API answers all the while
            status = daemon.call("status", timeout=10)
            assert status["control"]["long_polls"] == pool
            assert status["control"]["long_polls_refused"] == count - pool
            assert daemon.call("ping", timeout=10)["pong"] is True
        assert polls.answered == 0 and polls.failed == []
        daemon.call("bench.emit_events", n=1)  # one commit: every waiting poll answers
        wait_for("every poll answered", lambda: polls.settled() == count)
    assert polls.answered == pool and polls.failed == []
    # A poll leaves the pool just after its answer is sent: the client may read the
    # answer first, so the count is waited for, not read once.
    wait_for("the pool empty again", lambda: daemon.call("status")["control"]["long_polls"] == 0)


def test_long_polls_past_a_small_pool_are_refused_clearly_and_status_answers(short_tmp: Path) -> None:
    with running(short_tmp / "home", "[supervisor]\nmax_long_polls = 32\nprobes = true\n") as daemon:
        _hold_polls_past_the_pool(daemon, 40, 32)


def test_1100_long_polls_from_one_holder_do_not_starve_status(short_tmp: Path) -> None:
    """The issue's load against the default pool (past the old 1,024-worker cap)."""
    with running(short_tmp / "home", "[supervisor]\nprobes = true\n") as daemon:
        assert daemon.status()["control"]["max_long_polls"] == 1024
        _hold_polls_past_the_pool(daemon, 1100, 1024)


def test_the_long_poll_pool_is_a_checked_spec_setting(short_tmp: Path) -> None:
    spec = short_tmp / "spec.toml"
    spec.write_text("[supervisor]\nmax_long_polls = 0\n")
    result = cli(short_tmp / "home", "up", "--spec", str(spec))
    assert result.returncode == 2 and "supervisor.max_long_polls" in result.stderr, result.stderr
    assert not (short_tmp / "home" / homes.ENDPOINT).exists()


@pytest.mark.parametrize("method", ["ping", "status"])
def test_ping_and_status_never_count_as_long_polls(short_tmp: Path, method: str) -> None:
    with running(short_tmp / "home", "[supervisor]\nmax_long_polls = 1\nprobes = true\n") as daemon:
        cursor = daemon.status()["cursor"]
        with LongPolls(daemon.home, 1, since=cursor) as polls:
            wait_for("the one poll held", lambda: daemon.status()["control"]["long_polls"] == 1)
            # A wait parameter does not make them long polls: they answer, not refused.
            assert daemon.call(method, timeout=10, wait_ms=30_000)["pid" if method == "status" else "pong"]
            with pytest.raises(ControlError) as refused:
                daemon.call("events", timeout=10, since=cursor, wait_ms=30_000)
            assert refused.value.code == "too-many-long-polls"
            daemon.call("bench.emit_events", n=1)
        assert polls.answered == 1


def test_the_load_probes_exist_only_when_a_spec_asks_for_them(short_tmp: Path) -> None:
    with running(short_tmp / "home") as daemon:
        with pytest.raises(ControlError) as refused:
            daemon.call("bench.emit_events", n=1)
        assert refused.value.code == "unknown-method"

"""Issue 48 D.14: an actor's link over loopback tcp is taken only by a peer that
proves the secret its supervisor handed that actor (through the boot channel).

Another local user can connect to a loopback port; before the fix the stream
listener took the first connection as the actor's link (``listen(1)``), so an
impostor that connected first got the real actor refused, killed and restarted at
each start. Here an impostor connects first (the actor is held before it dials, at
the failpoint ``link.before-dial``, and let go only once the impostors are in): one
stays silent, one sends garbage. The real actor must still be linked on its first
incarnation, the run must complete, and both impostors must be cut off.

Over ``ipc://`` (the nng default and ``transport = "unix"``) the socket file lives
in the home's ``s/`` directory, mode 700: no other user can reach it (the last test).
"""

from __future__ import annotations

import socket
import stat
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from corral.core import failpoints
from corral.mailbox import link
from corral.sandbox.bwrap import bwrap_available
from corral.supervisor.home import home_dir as homes
from tests.harness import Daemon, running, wait_for, wait_run
from tests.test_intent import act, script

SANDBOX = "" if bwrap_available() else '[sandbox]\nmode = "allow-unsandboxed"\n'

SPEC = f"""
[supervisor]
transport = "tcp"
[project]
root = "ws"
{SANDBOX}
[chaos]
effects_file = "effects.log"
[[agents]]
id = "writer"
  [[agents.steps]]
  final = "each run brings its own script"
"""

HOLD = "link.before-dial"


def _link_listeners(daemon: Daemon) -> list[int]:
    """The supervisor's loopback tcp ports that are listening, but its control port."""
    endpoint = daemon.endpoint
    control_port = int(endpoint.control.rsplit(":", 1)[1])
    found = []
    for conn in psutil.Process(endpoint.pid).net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port != control_port:
            assert conn.laddr.ip == "127.0.0.1", conn
            found.append(conn.laddr.port)
    return found


def _read_to_the_end(sock: socket.socket) -> bytes:
    """What the supervisor sent before it closed this connection. The timeout is
    a safety net only: the close is what the test waits for."""
    sock.settimeout(60)
    received = b""
    while True:
        try:
            data = sock.recv(4096)
        except ConnectionResetError:
            return received  # closed with our garbage unread: a reset, still a close
        except TimeoutError:
            raise AssertionError(f"the impostor's connection is still open ({received!r} read)") from None
        if not data:
            return received
        received += data


def _events(daemon: Daemon, kind: str, subject: str) -> list[dict[str, Any]]:
    return [e for e in daemon.events() if e["kind"] == kind and e["subject"] == subject]


def test_an_impostor_that_connects_first_does_not_take_the_actors_link(short_tmp: Path) -> None:
    (short_tmp / "ws").mkdir()
    home = short_tmp / "home"
    env = {"CORRAL_FAILPOINTS": f"{HOLD}=block@once"}
    impostors: list[socket.socket] = []
    try:
        with running(home, SPEC, env=env) as daemon:
            # The actor is held before it dials: its listener is the one open link port.
            wait_for("the actor to reach link.before-dial", lambda: (home / "failpoints" / f"{HOLD}.fired").exists())
            ports = wait_for("the actor's link listener", lambda: _link_listeners(daemon))
            assert len(ports) == 1, ports
            silent = socket.create_connection(("127.0.0.1", ports[0]), timeout=30)
            impostors.append(silent)
            noisy = socket.create_connection(("127.0.0.1", ports[0]), timeout=30)
            impostors.append(noisy)
            noisy.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"\xff" * 200)
            failpoints.release_path(HOLD, home / "failpoints").touch()

            run_id = daemon.call("run", agent_id="writer", task="record", script=script(
                [act("effect.record", label="linked")], "done",
            ))["run_id"]
            assert wait_run(daemon, run_id, {"completed", "failed"})["run"]["status"] == "completed"
            writer = daemon.actor("writer")
            assert writer["status"] == "running" and writer["incarnation"] == 1, writer
            assert _events(daemon, "actor-exited", "writer") == []
            # Both impostors were cut off, having been sent no frame (a short challenge at most).
            for impostor in impostors:
                assert len(_read_to_the_end(impostor)) < 64
            log = (home / "logs" / "supervisor.log").read_text()
            assert log.count("did not prove the actor's link secret") == 2, log[-3000:]
    finally:
        for impostor in impostors:
            impostor.close()


def test_ipc_link_sockets_live_where_no_other_user_can_reach_them(short_tmp: Path) -> None:
    """The nng default and ``transport = "unix"`` link over ``ipc://`` sockets in
    the home's ``s/``: mode 700 directories, the owner's alone."""
    home = short_tmp / "home"
    homes.ensure_home(home)
    for directory in (home, home / "s"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert directory.stat().st_uid == psutil.Process().uids().real


# -- the stream listener itself ----------------------------------------------------------

SECRET = b"s" * 32


async def test_only_a_dialer_that_proves_the_secret_becomes_the_link() -> None:
    listener = link.Listener("tcp://127.0.0.1:0", 1 << 20, SECRET)
    host, port = listener.address.removeprefix("tcp://").rsplit(":", 1)
    # Silent connections that fill the whole queue before anyone is accepted.
    flood = [socket.create_connection((host, int(port))) for _ in range(link.MAX_CANDIDATES)]
    accepted: list[Any] = []
    try:
        with trio.fail_after(30):  # a safety net: nothing here waits on time
            async with trio.open_nursery() as nursery:

                async def accept() -> None:
                    accepted.append(await listener.accept())

                nursery.start_soon(accept)
                # Answered its challenge (wrongly) before the real peer dials.
                wrong = await link.dial(listener.address, 1 << 20, b"w" * 32)
                client = await link.dial(listener.address, 1 << 20, SECRET)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.run_writer)
                await client.send(b"mine", 5)
                assert await accepted[0].receive() == b"mine"
                # The wrong dialer got a connection, and then its close.
                assert await wrong.receive() is None
                nursery.cancel_scope.cancel()
            for made in (accepted[0], client, wrong):
                made.close()
        with pytest.raises(ConnectionError):  # the listener is gone once its peer came
            await link.dial(listener.address, 1 << 20, SECRET)
    finally:
        for sock in flood:
            sock.close()


async def test_a_dialer_without_a_challenge_gives_up_with_a_clear_error() -> None:
    plain = link.Listener("tcp://127.0.0.1:0", 1 << 20)  # no secret: sends no challenge

    async def dial() -> None:
        with pytest.raises(ConnectionError, match="no link challenge"):
            await link.dial(plain.address, 1 << 20, SECRET)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dial)
        accepted = await plain.accept()
        accepted.close()  # the dialer learns there is no challenge from the close

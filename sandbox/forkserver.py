"""The fork server: a pre-imported process that forks actors in ~ms.

Starting ``python -m corral.actors`` costs ~180 ms of interpreter start and imports;
forking this process (which imported everything once and never started a thread,
so fork is safe; nor opened an nng socket: nng is not fork-safe, and each actor
opens its own link socket after the fork, in a process where nng never ran) costs
a few ms. The supervisor talks to it over a SOCK_SEQPACKET
pair: spawn requests in, ``spawned`` (with a pidfd passed by SCM_RIGHTS, opened
before the child can be reaped, so pid reuse cannot fool anyone) and ``exited``
reports out. It dies with the supervisor (PDEATHSIG), and its children die with it.

It is watched like an actor: ``ready`` once it serves, then a ``pong`` for every
``ping``. One that stops answering (stopped, wedged) is killed and replaced by the
supervisor (sandbox/launcher.py, supervisor/tree/supervision_tree.py).

It forks without knowing what an actor is: the actors' side starts it
(``python -m corral.actors.fork_host``) and hands ``serve`` an :class:`ActorEntry`,
what to import once before forking and what each child runs.
"""

from __future__ import annotations

import errno
import gc
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import prctl

from corral.core import redact
from corral.core.process_name import name_process
from corral.mailbox.actor_config import ActorConfig
from corral.sandbox import child_setup

MAX_MESSAGE = 1024 * 1024


@dataclass(frozen=True)
class ActorEntry:
    """What the fork server serves: ``preload`` imports what every child shares,
    once, before the first fork (it may start no thread); ``main(config, token)``
    is a child's whole life, its exit code."""

    preload: Callable[[], None]
    main: Callable[[ActorConfig, str], int]


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = msgpack.packb(message, use_bin_type=True)
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def _child(
    sock: socket.socket, wake_r: int, wake_w: int, request: dict[str, Any], init: dict[str, Any], entry: ActorEntry
) -> None:
    code = 1
    try:
        sock.close()
        os.close(wake_r)
        os.close(wake_w)
        child_setup.reset_signals()
        from corral.mailbox.envelope import reseed_msg_ids

        reseed_msg_ids()
        child_setup.become_actor(request["actor_id"], init["forkserver_pid"], request["env"])
        child_setup.redirect_output(request["log_path"])
        child_setup.apply_rlimits(request.get("rlimits", {}))
        code = entry.main(request["config"], init["token"])
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(sock: socket.socket, supervisor_pid: int, entry: ActorEntry) -> None:
    prctl.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != supervisor_pid:
        return
    name_process("corral:forkserver", "corral:forksrv")
    # Before the init message, so the imports overlap the supervisor's own boot.
    entry.preload()
    init = msgpack.unpackb(sock.recv(MAX_MESSAGE), raw=False)
    init["forkserver_pid"] = os.getpid()
    # The redaction rules the supervisor built, for every actor forked from here.
    redact.adopt(init.get("redaction"))
    # Move everything imported and built so far out of the collector's reach: a
    # child's first full collection would otherwise write to every object header and
    # copy the shared pages into each actor (USS). Actors forked from here collect
    # as usual.
    gc.freeze()
    gc.enable()
    _send(sock, {"op": "ready"})

    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, "sock")
    selector.register(wake_r, selectors.EVENT_READ, "chld")
    while True:
        for key, _ in selector.select():
            if key.data == "chld":
                _drain(wake_r)
                _reap(sock)
                continue
            try:
                data = sock.recv(MAX_MESSAGE)
            except InterruptedError:
                continue
            if not data:
                return  # supervisor closed the pair
            request = msgpack.unpackb(data, raw=False)
            if request.get("op") == "exit":
                return
            if request.get("op") == "ping":
                _answer(sock, {"op": "pong"})
                continue
            _spawn(sock, wake_r, wake_w, request, init, entry)
        _reap(sock)


def _spawn(
    sock: socket.socket, wake_r: int, wake_w: int, request: dict[str, Any], init: dict[str, Any], entry: ActorEntry
) -> None:
    try:
        pid = os.fork()
    except OSError as exc:
        _send(sock, {"op": "spawn-failed", "spawn_id": request["spawn_id"], "error": str(exc)})
        return
    if pid == 0:
        _child(sock, wake_r, wake_w, request, init, entry)
    pidfd = os.pidfd_open(pid)
    try:
        _send(sock, {"op": "spawned", "spawn_id": request["spawn_id"], "pid": pid}, [pidfd])
    finally:
        os.close(pidfd)


def _answer(sock: socket.socket, message: dict[str, Any]) -> None:
    """A reply the supervisor may no longer read (it is replacing this process)."""
    try:
        _send(sock, message)
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.EAGAIN):
            raise


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        try:
            _send(sock, {"op": "exited", "pid": pid, "code": code})
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.ECONNRESET):
                return
            raise


def main(entry: ActorEntry) -> None:
    """``python -m corral.actors.fork_host FD SUPERVISOR_PID``: serve on the pair's end ``FD``."""
    fd = int(sys.argv[1])
    supervisor_pid = int(sys.argv[2])
    sock = socket.socket(fileno=fd)
    serve(sock, supervisor_pid, entry)

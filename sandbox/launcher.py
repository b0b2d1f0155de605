"""Starting actor processes, from the supervisor's side.

Two launch modes share one handle type. ``forkserver`` (the default: a few ms per
actor) forks from a warm pre-imported process; ``exec`` runs ``python -m
corral.actors`` (~180 ms of imports per actor) and is kept for comparison in bench/
and for platforms where the fork server is not wanted. Either way the token reaches
the child through memory or an inherited pipe, never argv or the environment.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import trio

from corral.core import redact
from corral.core.child_python import python_argv
from corral.sandbox import child_setup

MAX_MESSAGE = 1024 * 1024

_log = logging.getLogger("corral.launcher")


class LaunchMode(enum.StrEnum):
    FORKSERVER = "forkserver"
    EXEC = "exec"


class LaunchError(RuntimeError):
    pass


#: Generous: on a loaded 2-core machine a fork can queue behind other work.
LAUNCH_TIMEOUT_S = 30.0
#: How long an exited actor's reaper gets to report the exit code before the
#: supervisor stops waiting for it (a stopped fork server never would).
EXIT_CODE_GRACE_S = 0.5
#: How long to wait for the report of a reaper that did reap the actor.
REAPED_REPORT_S = 10.0
#: The exit code of an actor that died while nobody could tell how (never 0, so
#: a transient actor is restarted: a clean exit was not proven).
EXIT_UNKNOWN = -255
#: The exit code of an actor that died because its fork server was replaced (it
#: dies with it): not the actor's own crash, so its group does not count it.
EXIT_FORKSERVER_LOST = -254


def _zombie_exit_code(pid: int) -> int | None:
    """The exit status of an unreaped child of another process, from /proc;
    None once it is reaped (the pid may then belong to someone else)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3 of proc(5)); exit_code is field 52.
    if fields[:1] != [b"Z"] or len(fields) < 50:
        return None
    try:
        return os.waitstatus_to_exitcode(int(fields[49]))
    except ValueError:
        return EXIT_UNKNOWN


@dataclass
class LaunchRequest:
    actor_id: str
    config: dict[str, Any]
    log_path: Path
    env_extra: dict[str, str] = field(default_factory=dict)
    rlimits: dict[str, int] = field(default_factory=dict)


class ActorProcess:
    """A launched actor: its pid, a pidfd for race-free signals and exit detection."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.exit_code: int | None = None
        self._code_known = trio.Event()
        self._closed = False

    def set_exit_code(self, code: int) -> None:
        if self.exit_code is None:
            self.exit_code = code
        self._code_known.set()

    async def wait(self) -> int:
        """Wait for exit: the pidfd turns readable when the process is gone.

        The exit code normally comes from whoever reaps the child (the fork
        server). A death must not go unnoticed while that reaper is stopped or
        busy, so after a short grace the code is read from the zombie's
        ``/proc/<pid>/stat`` (it cannot be reused while unreaped), else reported
        as ``EXIT_UNKNOWN``."""
        if not self._closed:
            await trio.lowlevel.wait_readable(self.pidfd)
        with trio.move_on_after(EXIT_CODE_GRACE_S):
            await self._code_known.wait()
        if self.exit_code is None:
            code = _zombie_exit_code(self.pid)
            if code is None:
                # Already reaped: the reaper has the code and its report is on the way.
                with trio.move_on_after(REAPED_REPORT_S):
                    await self._code_known.wait()
            if self.exit_code is None:
                self.exit_code = EXIT_UNKNOWN if code is None else code
        return self.exit_code

    def send_signal(self, sig: int) -> None:
        if self._closed:
            return
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except ProcessLookupError:
            pass

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the actor's whole process group (it is its group's leader)."""
        self.send_signal(sig)
        if self.exit_code is None:
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            trio.lowlevel.notify_closing(self.pidfd)
            os.close(self.pidfd)


class _Lost:
    """The answer to a spawn whose fork server went away first: try the next one."""


_LOST = _Lost()


class _ForkServer:
    """One fork server process, its socket, and what it owes the supervisor."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.proc = proc
        self.sock = sock
        self.pending: dict[int, tuple[trio.Event, list[Any]]] = {}
        self.by_pid: dict[int, ActorProcess] = {}
        self.early_exits: dict[int, int] = {}
        self.started = trio.current_time()
        #: Whether it said it serves (imports done, init taken).
        self.ready = False
        #: trio time of the last word from it (a pong, a report).
        self.last_answer = self.started
        self.gone = trio.Event()


class ForkServerLauncher:
    """Forks actors from a fork server, and replaces the fork server when it dies or
    stops answering (``replace``: the supervision tree watches it like an actor).
    Its actors die with it (PDEATHSIG); they are reported with
    ``EXIT_FORKSERVER_LOST`` and started again from the new one."""

    mode = LaunchMode.FORKSERVER

    def __init__(self, token: str, log_path: Path) -> None:
        self._token = token
        self._log_path = log_path
        self._spawn_ids = itertools.count(1)
        self._lock = trio.Lock()
        self._server: _ForkServer | None = None
        #: Set while a fork server serves; a fresh one while it is being replaced.
        self._serving = trio.Event()
        self._scope: trio.CancelScope | None = None
        self._replace_reason = ""
        #: Why new actors cannot start right now (the tree sets it), or "".
        self.degraded = ""
        #: Fork servers started after the first.
        self.replacements = 0

    @property
    def forkserver_pid(self) -> int | None:
        return self._server.proc.pid if self._server is not None else None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the fork server and pump its reports until cancelled; one that
        exits, or is replaced, is followed by a new one."""
        first = True
        failures = 0
        while True:
            server = self._start()
            self._server = server
            self._replace_reason = ""
            why = ""
            try:
                with trio.CancelScope() as scope:
                    self._scope = scope
                    if first:
                        task_status.started()
                        first = False
                    why = await self._pump(server)
                why = self._replace_reason or why
            finally:
                self._scope = None
                self._server = None
                self._serving = trio.Event()
                with trio.CancelScope(shield=True):
                    await self._retire(server)
            self.replacements += 1
            _log.error("the fork server (pid %d) %s; starting a new one", server.proc.pid, why)
            # A fork server that dies as it starts is not restarted in a tight loop.
            failures = failures + 1 if trio.current_time() - server.started < LAUNCH_TIMEOUT_S else 0
            await trio.sleep(min(5.0, 0.1 * (2 ** min(failures, 6))) if failures > 1 else 0)

    def _start(self) -> _ForkServer:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(self._log_path, "ab") as log:
            try:
                # Popen from the trio thread: PDEATHSIG follows the thread that forked,
                # and this thread lives as long as the supervisor.
                proc = subprocess.Popen(
                    python_argv("-m", "corral.actors.fork_host", str(theirs.fileno()), str(os.getpid())),
                    pass_fds=[theirs.fileno()],
                    env=child_setup.scrubbed_env(os.environ),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            finally:
                theirs.close()
        # Its redaction rules come with its token: built here (while it imports), not
        # by importing detect-secrets a second time there.
        init = {"token": self._token, "redaction": redact.exported()}
        ours.send(msgpack.packb(init, use_bin_type=True))
        ours.setblocking(False)
        server = _ForkServer(proc, ours)
        self._serving.set()
        return server

    def replace(self, reason: str) -> None:
        """Stop the current fork server (it does not answer) and start a new one."""
        if self._scope is not None and not self._replace_reason:
            self._replace_reason = reason
            self._scope.cancel()

    def probe(self) -> None:
        """Ask the fork server for a sign of life; its ``pong`` moves ``silence``."""
        server = self._server
        if server is None:
            return
        try:
            server.sock.send(msgpack.packb({"op": "ping"}))
        except OSError:
            pass  # a full socket is a fork server that does not read: its silence tells

    def silence(self) -> float | None:
        """Seconds since the fork server last answered; None while one is starting
        (its imports may take a while), unless that start took past the launch timeout."""
        server = self._server
        if server is None:
            return None
        now = trio.current_time()
        if not server.ready:
            late = now - server.started - LAUNCH_TIMEOUT_S
            return late if late > 0 else None
        return now - server.last_answer

    async def _retire(self, server: _ForkServer) -> None:
        """Stop a fork server (ask, then SIGKILL) and reap it. Its actors die with
        it: their exits are reported as lost with it, and spawns still waiting on it
        go to the next one."""
        for proc in list(server.by_pid.values()):
            proc.set_exit_code(EXIT_FORKSERVER_LOST)
        server.by_pid.clear()
        for done, answer in server.pending.values():
            answer.append(_LOST)
            done.set()
        server.pending.clear()
        server.gone.set()
        try:
            server.sock.send(msgpack.packb({"op": "exit"}))
        except OSError:
            pass
        trio.lowlevel.notify_closing(server.sock)
        server.sock.close()
        if not self._replace_reason:
            with trio.move_on_after(2):
                while server.proc.poll() is None:
                    await trio.sleep(0.01)
        if server.proc.poll() is None:
            server.proc.kill()  # SIGKILL ends a stopped process too
            server.proc.wait()

    async def _pump(self, server: _ForkServer) -> str:
        """Its reports, until it closes its end; returns why it stopped."""
        sock = server.sock
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 4)
            except BlockingIOError:
                continue
            except OSError as exc:
                return f"broke its socket ({exc.strerror})"
            if not data:
                return "exited"
            server.last_answer = trio.current_time()
            message = msgpack.unpackb(data, raw=False)
            op = message.get("op")
            if op == "ready":
                server.ready = True
            elif op == "spawned":
                self._resolve(server, message["spawn_id"], (message["pid"], fds[0]))
            elif op == "spawn-failed":
                self._resolve(server, message["spawn_id"], LaunchError(message["error"]))
            elif op == "exited":
                proc = server.by_pid.pop(message["pid"], None)
                if proc is None:
                    server.early_exits[message["pid"]] = message["code"]
                else:
                    proc.set_exit_code(message["code"])
            for fd in fds[1:] if op == "spawned" else fds:
                os.close(fd)

    def _resolve(self, server: _ForkServer, spawn_id: int, value: Any) -> None:
        waiter = server.pending.pop(spawn_id, None)
        if waiter is None:
            if isinstance(value, tuple):
                # A spawn its requester gave up on: it must not run unsupervised.
                try:
                    signal.pidfd_send_signal(value[1], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.close(value[1])
            return
        waiter[1].append(value)
        waiter[0].set()

    async def launch(self, request: LaunchRequest) -> ActorProcess:
        message = {
            "op": "spawn",
            "actor_id": request.actor_id,
            "config": request.config,
            "env": child_setup.scrubbed_env(os.environ, request.env_extra),
            "log_path": str(request.log_path),
            "rlimits": request.rlimits,
        }
        server: _ForkServer | None = None
        spawn_id = 0
        value: Any = _LOST
        with trio.move_on_after(LAUNCH_TIMEOUT_S):
            while value is _LOST:
                await self._serving.wait()
                server = self._server
                if server is None:
                    await trio.sleep(0)  # between two fork servers
                    continue
                spawn_id = next(self._spawn_ids)
                value = await self._spawn_on(server, spawn_id, message)
                if value is _LOST:
                    await server.gone.wait()  # then ask the one that follows it
        if value is _LOST or server is None:
            if server is not None:
                # Forget it: if the fork server forks it later, _resolve kills it.
                server.pending.pop(spawn_id, None)
            raise LaunchError(f"the fork server did not start {request.actor_id} within {LAUNCH_TIMEOUT_S:.0f}s")
        if isinstance(value, Exception):
            raise value
        pid, pidfd = value
        proc = ActorProcess(pid, pidfd)
        if pid in server.early_exits:
            proc.set_exit_code(server.early_exits.pop(pid))
        elif server.gone.is_set():
            proc.set_exit_code(EXIT_FORKSERVER_LOST)  # forked just before its fork server went
        else:
            server.by_pid[pid] = proc
        return proc

    async def _spawn_on(self, server: _ForkServer, spawn_id: int, message: dict[str, Any]) -> Any:
        done = trio.Event()
        answer: list[Any] = []
        server.pending[spawn_id] = (done, answer)
        try:
            async with self._lock:
                await trio.lowlevel.wait_writable(server.sock)
                server.sock.send(msgpack.packb({**message, "spawn_id": spawn_id}, use_bin_type=True))
        except (OSError, trio.ClosedResourceError):
            server.pending.pop(spawn_id, None)
            return _LOST  # it went away under the request
        await done.wait()
        return answer[0]


class ExecLauncher:
    """``python -m corral.actors``: a fresh interpreter per actor."""

    mode = LaunchMode.EXEC
    #: No fork server here: nothing to watch, replace or report.
    degraded = ""
    replacements = 0
    forkserver_pid: int | None = None

    def __init__(self, token: str, log_path: Path) -> None:
        self._token = token
        self._log_path = log_path
        self._nursery: trio.Nursery | None = None

    def probe(self) -> None:
        pass

    def silence(self) -> float | None:
        return None

    def replace(self, reason: str) -> None:
        pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def launch(self, request: LaunchRequest) -> ActorProcess:
        assert self._nursery is not None
        read_fd, write_fd = os.pipe()
        boot = {
            "actor_id": request.actor_id,
            "config": request.config,
            "token": self._token,
            "parent": os.getpid(),
            "log_path": str(request.log_path),
            "rlimits": request.rlimits,
        }
        # Popen from the trio thread, never trio.lowlevel.open_process: trio spawns
        # from a worker thread, and PDEATHSIG fires when *that thread* exits.
        with open(request.log_path, "ab") as log:
            try:
                process = subprocess.Popen(
                    python_argv("-m", "corral.actors", "--boot-fd", str(read_fd)),
                    pass_fds=[read_fd],
                    env=child_setup.scrubbed_env(os.environ, request.env_extra),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            finally:
                os.close(read_fd)
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(msgpack.packb(boot, use_bin_type=True))
        proc = ActorProcess(process.pid, os.pidfd_open(process.pid))

        reap_fd = os.pidfd_open(process.pid)  # trio allows one waiter per fd

        async def reap() -> None:
            try:
                await trio.lowlevel.wait_readable(reap_fd)
            finally:
                trio.lowlevel.notify_closing(reap_fd)
                os.close(reap_fd)
            proc.set_exit_code(process.wait())

        self._nursery.start_soon(reap)
        return proc


Launcher = ForkServerLauncher | ExecLauncher


def make_launcher(mode: LaunchMode, token: str, log_path: Path) -> Launcher:
    if mode is LaunchMode.EXEC:
        return ExecLauncher(token, log_path)
    return ForkServerLauncher(token, log_path)

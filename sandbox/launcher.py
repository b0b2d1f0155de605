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
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import trio

from corral.sandbox import child_setup

MAX_MESSAGE = 1024 * 1024


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


class ForkServerLauncher:
    mode = LaunchMode.FORKSERVER

    def __init__(self, token: str, log_path: Path) -> None:
        self._token = token
        self._log_path = log_path
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._spawn_ids = itertools.count(1)
        self._pending: dict[int, tuple[trio.Event, list[Any]]] = {}
        self._by_pid: dict[int, ActorProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._lock = trio.Lock()
        self.forkserver_pid: int | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the fork server and pump its reports until cancelled."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = open(self._log_path, "ab")  # noqa: SIM115 - owned by the fork server
        try:
            # Popen from the trio thread: PDEATHSIG follows the thread that forked,
            # and this thread lives as long as the supervisor.
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "corral.sandbox.forkserver", str(theirs.fileno()), str(os.getpid())],
                pass_fds=[theirs.fileno()],
                env=child_setup.scrubbed_env(os.environ),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
            theirs.close()
            self.forkserver_pid = self._proc.pid
            ours.send(msgpack.packb({"token": self._token}, use_bin_type=True))
            ours.setblocking(False)
            self._sock = ours
            task_status.started()
            await self._pump(ours)
        finally:
            log.close()
            with trio.CancelScope(shield=True):
                await self._stop_forkserver(ours)

    async def _stop_forkserver(self, sock: socket.socket) -> None:
        try:
            sock.send(msgpack.packb({"op": "exit"}))
        except OSError:
            pass
        trio.lowlevel.notify_closing(sock)
        sock.close()
        if self._proc is not None:
            with trio.move_on_after(2):
                while self._proc.poll() is None:
                    await trio.sleep(0.01)
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()

    async def _pump(self, sock: socket.socket) -> None:
        while True:
            await trio.lowlevel.wait_readable(sock)
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 4)
            except BlockingIOError:
                continue
            if not data:
                raise LaunchError("the fork server exited")
            message = msgpack.unpackb(data, raw=False)
            op = message.get("op")
            if op == "spawned":
                self._resolve(message["spawn_id"], (message["pid"], fds[0]))
            elif op == "spawn-failed":
                self._resolve(message["spawn_id"], LaunchError(message["error"]))
            elif op == "exited":
                proc = self._by_pid.pop(message["pid"], None)
                if proc is None:
                    self._early_exits[message["pid"]] = message["code"]
                else:
                    proc.set_exit_code(message["code"])
            for fd in fds[1:] if op == "spawned" else fds:
                os.close(fd)

    def _resolve(self, spawn_id: int, value: Any) -> None:
        waiter = self._pending.pop(spawn_id, None)
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
        if self._sock is None:
            raise LaunchError("fork server is not running")
        spawn_id = next(self._spawn_ids)
        done = trio.Event()
        slot: list[Any] = []
        self._pending[spawn_id] = (done, slot)
        message = {
            "op": "spawn",
            "spawn_id": spawn_id,
            "actor_id": request.actor_id,
            "config": request.config,
            "env": child_setup.scrubbed_env(os.environ, request.env_extra),
            "log_path": str(request.log_path),
            "rlimits": request.rlimits,
        }
        async with self._lock:
            await trio.lowlevel.wait_writable(self._sock)
            self._sock.send(msgpack.packb(message, use_bin_type=True))
        with trio.move_on_after(LAUNCH_TIMEOUT_S):
            await done.wait()
        if not done.is_set():
            # Forget it: if the fork server forks it later, _resolve kills it.
            self._pending.pop(spawn_id, None)
            raise LaunchError(f"the fork server did not start {request.actor_id} within {LAUNCH_TIMEOUT_S:.0f}s")
        value = slot[0]
        if isinstance(value, Exception):
            raise value
        pid, pidfd = value
        proc = ActorProcess(pid, pidfd)
        if pid in self._early_exits:
            proc.set_exit_code(self._early_exits.pop(pid))
        else:
            self._by_pid[pid] = proc
        return proc


class ExecLauncher:
    """``python -m corral.actors``: a fresh interpreter per actor."""

    mode = LaunchMode.EXEC

    def __init__(self, token: str, log_path: Path) -> None:
        self._token = token
        self._log_path = log_path
        self._nursery: trio.Nursery | None = None

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
                    [sys.executable, "-m", "corral.actors", "--boot-fd", str(read_fd)],
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

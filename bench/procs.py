"""Process hygiene for workloads: helper children, leftover detection, reaping.

The runner makes the benchmark process a child subreaper, so a process that a
workload starts and that double-forks or loses its parent (a detached daemon, an
actor system's admin) is reparented to us instead of to init, and the leftover check
after each workload still sees it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants() -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def describe(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())[:80] or proc.name()
    except psutil.Error:
        cmd = "?"
    return f"{proc.pid} {cmd}"


def reap_zombies() -> None:
    """Collect exit statuses of our own zombie children (e.g. reparented orphans)."""
    try:
        kids = psutil.Process().children()
    except psutil.Error:
        return
    for kid in kids:
        try:
            if kid.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(kid.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, OSError):
            continue


def kill_leftovers(before: Iterable[int], grace_s: float = 3.0) -> list[str]:
    """Wait ``grace_s`` for processes started since ``before`` to exit; kill the rest.

    Returns a description of each process that was still alive after the grace
    period (and was then SIGKILLed). Zombies are reaped, not reported.
    """
    old = set(before)
    deadline = time.monotonic() + grace_s
    alive: list[psutil.Process] = []
    while True:
        reap_zombies()
        alive = []
        for pid, proc in descendants().items():
            if pid in old:
                continue
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(proc)
            except psutil.Error:
                continue
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    report = [describe(p) for p in alive]
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=3)
    reap_zombies()
    return report


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive (zombies count as gone); return survivors."""
    pending = set(pids)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        reap_zombies()
        for pid in list(pending):
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    pending.discard(pid)
            except psutil.NoSuchProcess:
                pending.discard(pid)
            except psutil.Error:
                continue
        if pending:
            time.sleep(0.02)
    return sorted(pending)


def uss_mib(pids: Sequence[int]) -> float:
    """Summed USS (unique set size) of ``pids``, in MiB; gone processes count 0."""
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_full_info().uss
    return total / 2**20


def stop_multiprocessing_helpers() -> None:
    """Stop multiprocessing's fork server and resource tracker, if this process has
    started them (they are long-lived helpers that would otherwise outlive the
    workload that caused them)."""
    from multiprocessing import forkserver, resource_tracker

    for module, attr in ((forkserver, "_forkserver"), (resource_tracker, "_resource_tracker")):
        stop = getattr(getattr(module, attr, None), "_stop", None)
        if callable(stop):
            with contextlib.suppress(OSError, ChildProcessError):
                stop()


def free_tcp_port() -> int:
    """A free TCP port on 127.0.0.1 (for peers that insist on TCP)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Child:
    """A helper process ``python -m bench._child MODE ARGS...``.

    It prints ``ready`` when it listens and exits when its stdin closes (and with
    PDEATHSIG when we die). Use as a context manager; ``stop()`` always reaps it.
    """

    def __init__(self, *args: str, ready_timeout: float = 30.0) -> None:
        self.args = list(args)
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._buf = b""

    def start(self) -> Child:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench._child", *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO_ROOT,
            bufsize=0,
        )
        line = self.readline(self.ready_timeout)
        if line != "ready":
            self.stop()
            raise RuntimeError(f"bench._child {self.args[0]} did not start (said {line!r})")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def readline(self, timeout: float) -> str:
        """The next line the child prints, or '' on EOF; TimeoutError after ``timeout``."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"bench._child {self.args[0]} said nothing in {timeout}s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return ""
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode().strip()

    def send_line(self, text: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")

    def stop(self, timeout: float = 3.0) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout)
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> Child:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

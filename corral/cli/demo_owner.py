"""``corral demo`` owns what it starts: stopping the demo (SIGTERM, Ctrl-C) stops
its supervisor, and with it every actor and the model process, before the demo
ends; the demo then ends by that signal, as its caller expects.

The supervisor runs in its own session (``corral up`` detaches it), so neither a
terminal's Ctrl-C nor a SIGTERM to the demo reaches it: the demo must stop it. It
asks gracefully (``corral down``, which stops the actors by their shutdown specs);
a supervisor still alive after that is killed with its process group (its actors
are in it: they are forked by it and never leave it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import psutil

from corral.core.child_python import python_argv, python_env
from corral.supervisor.home import home_dir as homes

#: How long ``corral down`` may take before the supervisor's group is killed.
DOWN_TIMEOUT_S = 60.0
_STOPPING = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
    """The demo was told to stop (``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def signals_stop_the_demo() -> Iterator[None]:
    """While inside: SIGTERM and SIGINT raise ``Stopped`` in the main thread (so
    the ``finally`` that stops the supervisor runs); the handlers before are put back."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise Stopped(signum)

    previous = {signum: signal.signal(signum, stop) for signum in _STOPPING}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_supervisor(home: Path) -> None:
    """Stop the supervisor on ``home`` and everything it runs. A second Ctrl-C while
    this runs is ignored: leaving a half-stopped swarm behind is what this prevents."""
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in _STOPPING}
    try:
        pid = _supervisor_pid(home)
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(python_argv("-m", "corral", "--home", str(home), "down"), env=python_env(),
                           capture_output=True, check=False, timeout=DOWN_TIMEOUT_S)
        if pid is not None:
            _kill_group_if_alive(pid)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def die_by(signum: int) -> None:
    """End this process by ``signum``, as it would have without the cleanup."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _supervisor_pid(home: Path) -> int | None:
    try:
        return homes.read_endpoint(home).pid
    except (homes.NotRunning, homes.HomeError):
        return None


def _kill_group_if_alive(pid: int) -> None:
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE or "corral" not in " ".join([*process.cmdline(), process.name()]):
            return  # gone, or the pid now belongs to something else
        os.killpg(pid, signal.SIGKILL)
        process.wait(timeout=10)
    except (psutil.NoSuchProcess, ProcessLookupError, PermissionError, psutil.TimeoutExpired):
        pass

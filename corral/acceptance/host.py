"""The processes the suite starts: supervisors (``start_supervisor``, as ``corral up``
does) and CLI commands (``python -m corral``, separate processes, as a person runs
them). Every one is this process's child and is reaped before the suite ends."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

from corral import client
from corral.client_start import SupervisorStartError, start_supervisor
from corral.core import failpoints
from corral.core.child_python import python_argv, python_env
from corral.core.errors import CorralError
from corral.core.procs import wait_exit
from corral.supervisor.home import home_dir as homes

UP_TIMEOUT_S = 60.0
DONE = ("completed", "failed", "cancelled")


class HostError(RuntimeError):
    """A process the suite needs did not start or answer: a runtime failure."""


class Host:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        #: The supervisors' and CLIs' environment (decoys in it, no failpoints armed).
        self.env = {k: v for k, v in env.items()
                    if k not in (failpoints.ENV_VAR, failpoints.MARKER_DIR_ENV, "CORRAL_HOME")}
        self.logs = logs
        self._started: list[subprocess.Popen[bytes]] = []
        self._pids: set[int] = set()
        self._cli_count = 0

    # -- supervisors ------------------------------------------------------------------

    def up(self, home: Path, spec: Path | None, failpoint: str = "") -> subprocess.Popen[bytes]:
        env = dict(self.env)
        if failpoint:
            env[failpoints.ENV_VAR] = failpoint
        try:
            process = start_supervisor(home, spec, UP_TIMEOUT_S, env=env)
        except SupervisorStartError as exc:
            # The last lines name the error (a traceback's head names only the entry point).
            raise HostError(f"the supervisor did not start: {' | '.join(str(exc).splitlines()[-3:])[:400]}") from None
        self._started.append(process)
        self._pids.add(process.pid)
        return process

    def down(self, home: Path) -> None:
        self._pids |= self.tree(home)
        with contextlib.suppress(CorralError, OSError), client.Client.connect(home) as connected:
            connected.down(30.0)

    def tree(self, home: Path) -> set[int]:
        try:
            sup = psutil.Process(homes.read_endpoint(home).pid)
            return {sup.pid, *(p.pid for p in sup.children(recursive=True))}
        except (homes.HomeError, psutil.Error):
            return set()

    def wait_dead(self, process: subprocess.Popen[bytes], timeout: float) -> bool:
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def close(self) -> list[int]:
        """Stop everything still running; the pids that outlived a grace (none, normally)."""
        for process in self._started:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
        for pid in list(self._pids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if psutil.pid_exists(pid) and not _is_zombie(pid):
                    os.kill(pid, signal.SIGKILL)
        for process in self._started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)
        return sorted(pid for pid in self._pids if not wait_exit(pid, 2))

    # -- the CLI ----------------------------------------------------------------------

    def cli(self, home: Path, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """``corral --home HOME ARGS`` as its own process; its output is kept in the logs."""
        self._cli_count += 1
        argv = python_argv("-m", "corral", "--home", str(home), *args)
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, env=python_env(self.env), timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise HostError(f"`corral {args[0]}` did not end within {timeout:.0f} s") from exc
        log = self.logs / f"cli-{self._cli_count:02d}-{args[0]}.log"
        log.write_text(f"$ corral {' '.join(args)}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}")
        return done

    # -- waiting on the ledger's facts ------------------------------------------------

    def wait_run(self, home: Path, run_id: str, statuses: tuple[str, ...], timeout: float) -> dict[str, Any]:
        """The run's ``show`` once its status is one of ``statuses`` (woken by the
        event stream); ``HostError`` past ``timeout``."""
        deadline = time.monotonic() + timeout
        cursor = 0
        with client.Client.connect(home) as connected:
            while True:
                shown: dict[str, Any] = connected.call("show", run_id=run_id)
                if shown["run"]["status"] in statuses:
                    return shown
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise HostError(f"run {run_id} still {shown['run']['status']} after {timeout:.0f} s:"
                                    f" {json.dumps(shown['run'])[:300]}")
                reply = connected.call("events", timeout=remaining + 5, since=cursor,
                                       wait_ms=int(min(remaining, 5) * 1000))
                cursor = reply["cursor"]


def _is_zombie(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return True

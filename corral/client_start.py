"""Starting a detached supervisor for a home and waiting until it is ready.

``corral up`` and ``Client.start`` share this: the supervisor reports ``ready`` or
``error <message>`` on a pipe, so a bad spec or a busy home is a clear error here
instead of a silent timeout.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
import warnings
from collections.abc import Mapping
from pathlib import Path

from corral.core.child_python import python_argv, python_env
from corral.core.errors import CorralError
from corral.supervisor.home import home_dir as homes
from corral.supervisor.spec.swarm_spec import load_spec


class SupervisorStartError(CorralError):
    """The supervisor did not become ready. ``busy`` is True when another supervisor
    owns the home."""

    def __init__(self, message: str, *, busy: bool = False) -> None:
        super().__init__(message)
        self.busy = busy


def supervisor_argv(home: Path, spec: Path | None, node: str | None = None) -> list[str]:
    argv = python_argv("-m", "corral.supervisor", "--home", str(home))
    if spec is not None:
        argv += ["--spec", str(spec.absolute())]
    if node is not None:
        argv += ["--node", node]
    return argv


def ledger_env(ledger: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ledger URL travels in the environment (argv is visible to every user);
    ``base``: the environment it joins (default: this process's)."""
    env = dict(os.environ if base is None else base)
    if ledger is not None:
        from corral.supervisor.ledger.ledger_spec import URL_ENV, check_url

        env[URL_ENV] = check_url(ledger)
    return env


def start_supervisor(
    home: Path,
    spec: Path | None,
    timeout: float = 30.0,
    *,
    ledger: str | None = None,
    node: str | None = None,
    env: Mapping[str, str] | None = None,
    checked: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a detached supervisor (its own session) and return once it is ready.

    The spec is checked here first (``SpecError`` with the exact message, nothing
    started). The returned process is the caller's child: reap it after it exits.
    ``ledger`` (a postgresql:// URL) and ``node`` place it in a shared ledger
    (supervisor/ledger/ledger_spec.py); the home remembers both. ``env``: the
    supervisor's environment (default: this process's; chaos arms failpoints there).
    ``checked``: ``spec`` is not parsed here: the caller has just loaded it
    (``corral up``), or leaves it to the supervisor, which parses it anyway and
    reports a bad one on its ready pipe (a ``SupervisorStartError``)."""
    loaded = load_spec(spec) if spec is not None and not checked else None  # before the home: a bad spec
    homes.ensure_home(home)  # leaves nothing behind
    environment = ledger_env(ledger, env)
    if loaded is not None:
        from corral.supervisor.spec.provider_keys import key_warnings

        for warning in key_warnings(loaded, environment):  # said before the 401 would say it worse
            warnings.warn(warning, UserWarning, stacklevel=2)
    if node is not None:
        from corral.supervisor.ledger.ledger_spec import check_node

        check_node(node)
    if homes.is_locked(home):
        raise SupervisorStartError(f"a supervisor is already running on {home} (`corral status`)", busy=True)
    read_fd, write_fd = os.pipe()
    log_path = home / "logs" / "supervisor.log"
    log_path.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [*supervisor_argv(home, spec, node), "--ready-fd", str(write_fd)],
                pass_fds=[write_fd],
                env=python_env(environment),
                # A directory corral owns: never the project's (issue 48 A.1).
                cwd=home,
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
    finally:
        os.close(write_fd)
    line = _read_line(read_fd, timeout)
    if line.startswith("ready "):
        if spec is not None:
            _wait_for_deps(home, spec, proc, timeout)
        return proc
    if proc.poll() is None and not line:
        proc.kill()
    proc.wait()
    if line.startswith("error "):
        message = line[len("error ") :]
        raise SupervisorStartError(message, busy="owns" in message)
    tail = log_path.read_text(errors="replace").splitlines()[-15:]
    raise SupervisorStartError("supervisor did not become ready:\n  " + "\n  ".join(tail))


def _wait_for_deps(home: Path, spec: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """The agents that build tools' deps at start are ready, or the supervisor just
    started is stopped and the start fails with the factory's traceback
    (corral/deps_start.py)."""
    from corral.deps_start import DepsStartError, agents_with_deps, wait_for_deps

    agents = agents_with_deps(spec)
    if not agents:
        return
    try:
        wait_for_deps(home, agents, timeout)
    except (DepsStartError, TimeoutError) as exc:
        from corral import client

        with contextlib.suppress(CorralError, OSError):
            client.call(home, "down", timeout=5)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise SupervisorStartError(f"the supervisor stopped: {exc}") from None


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select([pipe], [], [], remaining)
            if not ready:
                break
            chunk = pipe.read(4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace").strip()


# -- a spec and tools given as Python objects (``Client.start(spec=..., tools=...)``) ----------

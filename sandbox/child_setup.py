"""What every actor process does to itself before running any actor code."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Mapping

import prctl

from corral.core.process_name import name_process

#: Variables an actor keeps; everything else (API keys included) is scrubbed.
ENV_ALLOWLIST = (
    "PATH",
    "LANG",
    "LC_ALL",
    "TZ",
    "CORRAL_FAILPOINT_DIR",
    # The spec's [tools] modules (the names they import by, no secrets): every actor imports them.
    "CORRAL_TOOL_MODULES",
    # The user code `corral up` pinned (paths and hashes): the only user code an actor runs.
    "CORRAL_USER_CODE",
    # The templates and providers the spec starts (names only): the fork server preloads them.
    "CORRAL_PRELOAD",
    # A cap on a local model's CPU threads (a number; corral/core/model_threads.py).
    "CORRAL_MODEL_THREADS",
)

RLIMITS = {
    "cpu_s": resource.RLIMIT_CPU,
    "address_space_bytes": resource.RLIMIT_AS,
    "open_files": resource.RLIMIT_NOFILE,
    "processes": resource.RLIMIT_NPROC,
}


def scrubbed_env(source: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {name: source[name] for name in ENV_ALLOWLIST if name in source}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(extra or {})
    return env


def become_actor(actor_id: str, expected_parent: int, env: Mapping[str, str]) -> None:
    """Own session and process group, die with the parent, named corral:<id>."""
    os.setsid()
    prctl.set_pdeathsig(signal.SIGKILL)
    # The parent may have died between fork and prctl; then nobody would kill us.
    if os.getppid() != expected_parent:
        os._exit(70)
    name = f"corral:{actor_id}"
    name_process(name)
    os.environ.clear()
    os.environ.update(env)


def apply_rlimits(limits: Mapping[str, int]) -> None:
    for key, value in limits.items():
        resource.setrlimit(RLIMITS[key], (value, value))


def redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(devnull)


def reset_signals() -> None:
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)

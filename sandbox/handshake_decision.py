"""The launch handshake's judgements, as pure functions: what the trampoline (or
bubblewrap) reported in, go on or a refusal out. No pipes, no processes.

sandbox/exec_handshake.py's ``launch_with_handshake`` does the reading, the waiting
and the killing; every "may the target run yet?" is answered here, so each answer
is a row of tests/test_handshake_decision.py.
"""

from __future__ import annotations

import errno
import hmac
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .launched_process import HandshakeError
from .trampoline import MSG_EXEC_ATTEMPT, MSG_EXEC_FAILED, MSG_READY, MSG_SETUP_FAILED


def launch_refusal(argv: Sequence[str], cwd: Path, root: Path, *, cwd_is_dir: bool) -> str | None:
    """Why ``argv`` may not be launched in ``cwd`` (resolved) under ``root``, or None."""
    if not argv:
        return "empty argv"
    if cwd != root and root not in cwd.parents:
        return f"cwd {cwd} is outside the project root {root}"
    if not cwd_is_dir:
        return f"cwd {cwd} is not a directory"
    return None


def bwrap_report(raw: bytes) -> tuple[int, int | None]:
    """Bubblewrap's info report: the sandbox's init pid and its pid namespace. Empty
    or malformed means bubblewrap failed before it started the sandbox."""
    try:
        report = json.loads(raw) if raw else {}
        return int(report["child-pid"]), int(report["pid-namespace"]) if "pid-namespace" in report else None
    except (ValueError, KeyError, TypeError):
        raise HandshakeError("bubblewrap failed before starting the sandbox") from None


def readiness(line: str | None, nonce: str) -> None:
    """The trampoline's first report must be SANDBOX_READY with this launch's nonce
    (None: the channel closed first). Raises otherwise: the target never runs."""
    if line is None:
        raise HandshakeError("report channel closed before SANDBOX_READY")
    kind, _, payload = line.partition(" ")
    if kind == MSG_SETUP_FAILED:
        raise HandshakeError(f"sandbox setup failed in the trampoline: {payload}")
    if kind != MSG_READY:
        raise HandshakeError(f"unexpected message before readiness: {kind[:40]!r}")
    if not hmac.compare_digest(payload.encode(), nonce.encode()):
        raise HandshakeError("SANDBOX_READY carried the wrong nonce")


def before_commit(pending: str | None) -> None:
    """After the durable launch record, before COMMIT_EXEC: the report channel must
    be silent ('eof': the trampoline died meanwhile, which is no successful exec;
    'data': it spoke out of turn)."""
    if pending == "eof":
        raise HandshakeError("report channel closed before COMMIT_EXEC")
    if pending == "data":
        raise HandshakeError("unexpected message before COMMIT_EXEC")


@dataclass(frozen=True, slots=True)
class ExecEstablished:
    """execve succeeded: the report channel closed on exec after EXEC_ATTEMPT."""


@dataclass(frozen=True, slots=True)
class ExecFailed:
    """execve was tried and failed with ``errno``; the trampoline exits 127."""

    errno: int


ExecOutcome = ExecEstablished | ExecFailed


def exec_outcome(lines: Sequence[str]) -> ExecOutcome:
    """What the lines after COMMIT_EXEC (up to EOF) say of the exec."""
    if MSG_EXEC_ATTEMPT not in lines:
        raise HandshakeError("trampoline exited after COMMIT_EXEC without exec")
    for line in lines:
        kind, _, payload = line.partition(" ")
        if kind == MSG_EXEC_FAILED:
            return ExecFailed(int(payload) if payload.isdigit() else errno.EIO)
    return ExecEstablished()

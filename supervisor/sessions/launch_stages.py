"""What a process record keeps of its launch handshake (seed 004, V1.11.1:
"process record v3 增加 sandboxEstablishment / targetExec / launchFailureKind /
sandboxReadyAt / execEstablishedAt"). A pure decision; session_store.py writes it.

The handshake's stages as the supervisor sees them (sandbox/exec_handshake.py):

- the launch record commits while the trampoline waits for COMMIT_EXEC: the
  sandbox is ready (``sandbox_ready_at``; ``sandbox_establishment`` is ``ready``,
  or ``unsandboxed`` for an allowed unsandboxed launch) and the target is
  ``pending``;
- the session reports ``running`` only after EXEC_ESTABLISHED: the target is
  ``established`` (``exec_established_at``);
- a launch that fails before that names how (``launch_failure_kind``: the agent's
  error code, e.g. ``sandbox-unavailable``, ``handshake-failed``): before the
  sandbox was ready, the sandbox ``failed`` and the target was ``not-executed``;
  after it, the target ``failed`` (or is ``unknown`` when the outcome is).
"""

from __future__ import annotations

import enum
from typing import Any

from corral.actors.session_state import SessionState
from corral.sandbox.bwrap import LaunchMode


class TargetExec(enum.StrEnum):
    PENDING = "pending"
    ESTABLISHED = "established"
    NOT_EXECUTED = "not-executed"
    FAILED = "failed"
    UNKNOWN = "unknown"


def establishment(mode: LaunchMode) -> str:
    """``sandbox_establishment`` once the launch record commits."""
    return "ready" if mode is LaunchMode.SANDBOXED else "unsandboxed"


#: The states a launch may still fail from (before ``running``).
_LAUNCHING = frozenset({SessionState.PREPARED, SessionState.LAUNCHING})


def launch_stages(
    old: SessionState, new: SessionState, sandbox_ready: bool, code: str | None, now: float
) -> dict[str, Any]:
    """The columns a transition ``old`` -> ``new`` sets ({} for most)."""
    if old not in _LAUNCHING:
        return {}
    if new is SessionState.RUNNING:
        return {"target_exec": TargetExec.ESTABLISHED.value, "exec_established_at": now}
    if new not in (SessionState.FAILED, SessionState.NEEDS_RECONCILIATION):
        return {}
    kind = code or "launch-failed"
    if not sandbox_ready:
        return {
            "sandbox_establishment": "failed",
            "target_exec": TargetExec.NOT_EXECUTED.value,
            "launch_failure_kind": kind,
        }
    outcome = TargetExec.FAILED if new is SessionState.FAILED else TargetExec.UNKNOWN
    return {"target_exec": outcome.value, "launch_failure_kind": kind}

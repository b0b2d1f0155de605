"""Running a launched process tree to its confirmed end, as both a PTY session
(:mod:`corral.actors.pty_session`) and a one-shot command
(:mod:`corral.actors.one_shot_command`) do.

The first stop reason wins (the leader exited, a terminate or kill was asked for,
the output cap or the deadline was reached); the tree is then ended accordingly,
in two phases (SIGTERM to the group, the full grace, SIGKILL) where that is asked
for, and reaped. :func:`run_to_end` says whether the whole tree was confirmed
dead: what could not be confirmed ends as ``needs-reconciliation``. Both also
write their sanitized transcript to a private file opened by :func:`open_private`.
"""

from __future__ import annotations

import enum
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

from corral.sandbox.launched_process import LaunchedProcess

from .session_state import SessionState

S = SessionState

#: Default grace between SIGTERM and SIGKILL of a two-phase stop.
GRACE_S = 0.8
REAP_TIMEOUT_S = 5.0
#: How long the output may still flow after the tree is dead before reading stops.
DRAIN_TIMEOUT_S = 2.0


class Stop(enum.Enum):
    """Why a launched tree is to be ended; the first one received decides."""

    EXIT = "exit"
    TERMINATE = "terminate"
    KILL = "kill"
    CAP = "cap"
    TIMEOUT = "timeout"


async def watch_exit(proc: LaunchedProcess, stops: trio.MemorySendChannel[Stop]) -> None:
    await proc.wait_exit()
    stops.send_nowait(Stop.EXIT)


async def run_to_end(
    proc: LaunchedProcess,
    stops: trio.MemoryReceiveChannel[Stop],
    deadline: float,
    grace_s: float,
    on_terminating: Callable[[], Awaitable[None]],
) -> tuple[SessionState, bool]:
    """Wait for the first stop reason, end the tree accordingly, confirm it is dead.

    Returns the outcome and whether the whole tree was confirmed dead.
    """
    reason = Stop.TIMEOUT
    with trio.move_on_at(deadline):
        reason = await stops.receive()
    if reason is Stop.EXIT:
        outcome = S.EXITED
        # The leader is gone; what is left of its group (unsandboxed: background
        # jobs) has no session to belong to any more.
        proc.kill_tree()
    else:
        await on_terminating()
        if reason is Stop.CAP or reason is Stop.KILL:
            outcome = S.OUTPUT_LIMIT_EXCEEDED if reason is Stop.CAP else S.TERMINATED
            proc.kill_tree()
        else:
            outcome = S.TIMED_OUT if reason is Stop.TIMEOUT else S.TERMINATED
            proc.signal_group(signal.SIGTERM)
            # The full grace even if the leader exits first: its children may still be
            # flushing or cleaning up, and they are why the group gets the signal.
            with trio.move_on_after(grace_s):
                while True:
                    late = await stops.receive()
                    if late is Stop.CAP:
                        outcome = S.OUTPUT_LIMIT_EXCEEDED
                        break
                    if late is Stop.KILL:
                        break
            proc.kill_tree()
    confirmed = await proc.wait_tree_dead(REAP_TIMEOUT_S)
    return outcome, confirmed


def open_private(path: Path) -> int:
    """A new transcript file (it must not exist yet) that only its owner can read."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)

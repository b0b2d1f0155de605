"""Named failpoints in crash windows, driven by ``CORRAL_FAILPOINTS``.

Syntax: ``name=action[,name=action...]`` where action is one of ``kill`` (SIGKILL
this process), ``kill-supervisor`` (SIGKILL the supervisor, from an actor),
``kill-caller`` (in the supervisor: SIGKILL the actor whose request is being handled),
``raise``, ``disk-full`` (raise the error SQLite gives on a full disk,
``sqlite3.OperationalError: database or disk is full``: inside a ledger transaction
the commit is refused exactly as a full disk refuses it), ``sleep(MS)``, ``block``
(wait until the file ``<marker dir>/<name>.release`` exists: a test holds a process
inside a window, does something, then releases it; at most two minutes), optionally
suffixed ``@once`` so that it fires once per home directory (a marker file records
that it fired, which lets a restarted process carry on past it), or ``@N`` so that
it fires the first N times.

A broken build (:data:`BROKEN_BUILDS`) is armed the same way with the action ``on``
(``agent.effect-before-executing=on``): the code asks :func:`armed` and takes a
deliberately wrong path, so that a test can show the checker it exists for fails.

When the variable is unset ``hit()`` is one dict lookup on an empty dict.
"""

from __future__ import annotations

import contextvars
import os
import re
import signal
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "CORRAL_FAILPOINTS"
MARKER_DIR_ENV = "CORRAL_FAILPOINT_DIR"

#: Every failpoint name in the code base, so specs with typos fail loudly and chaos
#: can enumerate the schedule. Keep in sync with the ``hit()`` calls (a test checks).
KNOWN: dict[str, str] = {
    "action.after-prepared": "supervisor: action row prepared, reply not yet sent",
    "action.after-executing": "supervisor: executing committed, agent not yet told",
    "queue.claiming": "cluster node: a queued run taken off the shared queue, its creation not yet committed",
    "agent.before-effect": "agent: executing acknowledged, side effect not started",
    "control.bind-any": "supervisor: its control socket is about to bind a loopback port 0 (raise: no ephemeral port"
    " was free, AddrInUse)",
    "git.inspect-read": "agent: a project.git_inspect read its status and diff, the status not yet re-read",
    "changeset.diff-read": "agent: a project.diff made its hunks, the checkpoints' files not yet read again",
    "agent.after-effect": "agent: side effect done, terminal record not requested",
    "action.before-terminal": "supervisor: an action's outcome is in hand, its terminal phase not yet committed",
    "action.after-terminal": "supervisor: terminal phase committed (its receipt in the same commit)",
    "action.after-receipt": "supervisor: receipt written, agent not yet told",
    "plan.after-commit": "supervisor: plan committed, agent not yet told",
    "finalize.after-prepared": "supervisor: finalization prepared, reply not appended",
    "finalize.after-reply": "supervisor: reply appended, finalization not completed",
    "join.after-delivery": "supervisor: join delivery written, parent not yet woken",
    "claim.after-prepared": "supervisor: claim journal prepared, not committed",
    "claim.after-commit": "supervisor: claims committed, observation not yet recorded",
    "spawn.after-commit": "supervisor: isolated group committed, children not launched",
    "delegate.after-commit": "supervisor: delegation committed, specialist not woken",
    "run.creating": "supervisor: a run's row written in its creating transaction, not yet committed",
    "run.after-create": "supervisor: run committed, reply to the client not yet sent",
    "provider.before-handoff": "agent: provider response received, handoff not yet committed",
    "provider.after-handoff": "agent: provider response committed (with the plan parsed from it), reply not yet read",
    "session.after-prepared": "supervisor: a session recorded prepared, its actor not yet started",
    "session.after-launch": "session: process launched, running not yet recorded",
    "preview.after-check": "agent: a preview check's browser evidence taken, the revision and preview not yet re-read",
    "link.before-dial": "actor: its link's address and secret in hand (any actor kind), not yet dialled",
    "ledger.after-staging": "supervisor: a new ledger is built beside its name, not yet renamed into place",
    "ledger.before-sync": "supervisor: a batch of commits is in the WAL, its fsync not yet done, no reply sent",
    "ledger.after-sync": "supervisor: a batch of commits is fsync'd, the replies waiting on it not yet sent",
    "mcp.before-call": "mcp actor: call received (executing committed), request not yet sent to the server",
    "mcp.after-call": "mcp actor: the server answered, the result not yet relayed",
    "model.mid-generation": "model actor: a generation is under way (third token sampled), no answer sent",
    "model.mid-reply": "model actor: words of a final reply are on the event stream, the rest not yet generated",
    "steer.after-record": "supervisor: a steer is committed, the client not yet answered",
    "steer.after-interrupt": "supervisor: a provider turn interrupted by a steer or a goal pause is recorded,"
    " the control not yet applied",
    "goal.after-pause-request": "supervisor: a goal's pause request is committed, the provider turn in flight"
    " not yet interrupted",
    "steer.after-apply": "supervisor: a steer is applied (history, stale plan discarded), the agent not yet told",
    "input.after-ask": "supervisor: a question is committed and its run parked, the agent not yet told",
    "input.mid-answer": "supervisor: an answer, its action's end and the run's resumption are written, not committed",
    "input.after-answer": "supervisor: an answer is committed and its action finished, the client not yet answered",
    "durable-plan.after-update": "supervisor: an answer's plan update is applied, its plan not yet committed",
    "context.mid-compaction": "agent: a summary of older turns is written, not yet recorded",
    "context.after-compact": "supervisor: a compaction is committed, the agent not yet told",
    "bridge.before-commit": "bridge: a command's facts, receipt and audit are written, not committed",
    "bridge.after-commit": "bridge: a command is committed, its reply not yet sent",
    "bridge.after-submit-sent": "bridge worker: the submit was answered, the job not yet marked submitted",
    "changeset.after-checkpoint": "agent: a changeset's or restore's checkpoint is written, no file changed yet",
    "changeset.before-deletes": "agent: a changeset's writes are committed, its deletes not done (raise: an I/O"
    " failure there)",
    "commit.after-ref": "agent: project.git_commit moved the branch and its safe fields are recorded; its index"
    " and result are not",
    "command.after-exit": "agent: a command.exec's program exited (its sandbox was ready, its revision made);"
    " its sources are not re-read nor its result recorded",
    "changeset.rollback": "agent: a failed changeset puts one file back (raise: that file cannot be put back)",
    "verify.after-record": "a project.verify's verification is recorded, its action not yet finished",
}


#: Deliberately broken builds, armed with the action ``on`` and asked with
#: :func:`armed`. Each exists only to prove that a checker catches what it breaks.
#: None is a crash window, so chaos never schedules one; an armed one travels with
#: the failpoint spec, from the supervisor's environment to its actors' launch config.
BROKEN_BUILDS: dict[str, str] = {
    "agent.effect-before-executing": "agent: the side effect runs first, executing is committed after it",
}


#: Failpoints hit inside actor processes; all others are hit inside the supervisor.
ACTOR_SIDE = frozenset(
    name
    for name in KNOWN
    if name.split(".")[0] in ("agent", "provider", "session", "mcp", "model", "changeset", "link", "git", "command")
)


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is ``raise``."""


class FailpointSpecError(ValueError):
    """A ``CORRAL_FAILPOINTS`` value that cannot be parsed."""


@dataclass(frozen=True)
class Action:
    kind: str  # kill | kill-supervisor | kill-caller | raise | disk-full | block | sleep | on (a broken build)
    sleep_ms: int = 0
    once: bool = False
    #: With ``@N``: fires the first N times per home directory (0: every time).
    times: int = 0


_ACTION = re.compile(
    r"^(kill|kill-supervisor|kill-caller|raise|disk-full|block|sleep\((\d+)\))(@once|@([1-9]\d{0,5}))?$"
)
#: The longest a ``block`` failpoint holds its process.
BLOCK_MAX_S = 120.0

#: The pid of the actor whose request the supervisor is handling (for kill-caller).
caller_pid: contextvars.ContextVar[int | None] = contextvars.ContextVar("caller_pid", default=None)


def parse(spec: str) -> dict[str, Action]:
    table: dict[str, Action] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, action = part.partition("=")
        if not sep:
            raise FailpointSpecError(f"failpoint {part!r}: expected name=action")
        if name in BROKEN_BUILDS:
            if action != "on":
                raise FailpointSpecError(f"broken build {name}: bad action {action!r} (on)")
            table[name] = Action("on")
            continue
        if name not in KNOWN:
            raise FailpointSpecError(f"unknown failpoint {name!r}; known: {', '.join([*KNOWN, *BROKEN_BUILDS])}")
        match = _ACTION.match(action)
        if not match:
            raise FailpointSpecError(
                f"failpoint {name}: bad action {action!r}"
                " (kill|kill-supervisor|kill-caller|raise|disk-full|block|sleep(MS), then @once or @N)"
            )
        kind = "sleep" if match.group(2) else match.group(1)
        times = 1 if match.group(3) == "@once" else int(match.group(4) or 0)
        table[name] = Action(kind, int(match.group(2) or 0), times == 1, times)
    return table


_table: dict[str, Action] = parse(os.environ.get(ENV_VAR, ""))
_supervisor_pid: int | None = None


def configure(spec: str, supervisor_pid: int | None = None) -> None:
    """Reload the table (actors get the spec from their launch config, not the env)."""
    global _table, _supervisor_pid
    _table = parse(spec)
    _supervisor_pid = supervisor_pid


def active_spec() -> str:
    return os.environ.get(ENV_VAR, "")


def armed(name: str) -> bool:
    """Whether the broken build ``name`` is switched on in this process."""
    action = _table.get(name)
    return action is not None and action.kind == "on"


def with_broken_builds(spec: str) -> str:
    """``spec`` and the broken builds armed in this process's environment: chaos
    gives each episode its own failpoints, and a broken build armed for a whole
    chaos run stays armed in every one of them."""
    parts = [part.strip() for part in active_spec().split(",")]
    kept = [part for part in parts if part.partition("=")[0] in BROKEN_BUILDS]
    return ",".join(filter(None, [*kept, spec]))


def hit(name: str) -> None:
    if not _table:
        return
    action = _table.get(name)
    if action is None:
        return
    if action.kind == "kill-caller" and caller_pid.get() is None:
        return  # no actor's request in hand (a control call, a timer): stay armed for one
    if action.times and not _claim(name, action.times):
        return
    if action.kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.kind == "kill-supervisor":
        target = _supervisor_pid or os.getppid()
        os.kill(target, signal.SIGKILL)
        # PDEATHSIG follows; never run past the window meanwhile.
        time.sleep(5)
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.kind == "kill-caller":
        pid = caller_pid.get()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
    elif action.kind == "raise":
        raise FailpointError(f"failpoint {name}")
    elif action.kind == "disk-full":
        raise sqlite3.OperationalError("database or disk is full")
    elif action.kind == "sleep":
        time.sleep(action.sleep_ms / 1000)
    elif action.kind == "block":
        _block(name)


def release_path(name: str, directory: str | Path | None = None) -> Path:
    """The file whose creation releases a ``block`` failpoint."""
    return Path(directory or os.environ.get(MARKER_DIR_ENV) or ".") / f"{name}.release"


def _block(name: str) -> None:
    release = release_path(name)
    deadline = time.monotonic() + BLOCK_MAX_S
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def _claim(name: str, times: int) -> bool:
    """One of the first ``times`` firings of ``name`` in this home: a marker file
    per firing (``<name>.fired``, then ``<name>.fired.2`` ...), created exclusively."""
    directory = os.environ.get(MARKER_DIR_ENV)
    if not directory:
        return True
    for index in range(1, times + 1):
        path = Path(directory) / (f"{name}.fired" if index == 1 else f"{name}.fired.{index}")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            continue
        os.close(fd)
        return True
    return False

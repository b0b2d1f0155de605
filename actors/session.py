"""The ``session`` template: one actor per process session.

The actor owns one :class:`PtySession` (the PTY, its output pump and the child
tree) and is the only place the process can be reached from. The supervisor
starts it with the session's parameters, and the actor

* commits through the supervisor before each step it protects: ``launching`` is on
  disk before anything is spawned, the launch record (``session.launched``) before
  the trampoline gets COMMIT_EXEC, ``running`` once the target runs, and every
  later transition (the terminal one only after the tree is confirmed dead and the
  PTY drained);
* answers ``poll``, ``stdin`` and ``terminate`` requests from the supervisor, which
  has already checked that the caller owns the session;
* stays up after the process ended so that polls keep working, until the
  supervisor shuts it down (when the run ends). A shutdown while the process lives
  ends it in two phases first.

If this actor dies, PDEATHSIG (actors) and ``--die-with-parent`` (bubblewrap) take
the process tree with it; the supervisor then records ``needs-reconciliation``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from corral.actors.pty_session import PtySession, StateChange
from corral.actors.runtime import ActorContext, is_shutdown
from corral.actors.session_state import (
    BadSessionInput,
    SessionError,
    SessionState,
    decode_cursor,
    is_terminal,
    signal_of,
)
from corral.actors.tools.source_fingerprint import SourceFingerprint, fingerprint
from corral.core import failpoints
from corral.core.redact import summarize
from corral.core.transitions import IllegalTransition
from corral.mailbox.envelope import Envelope, Kind
from corral.mailbox.protocol import SessionLaunched, SessionStateReport
from corral.sandbox.bwrap import Rlimits, SandboxError, SandboxMode, SandboxProfile
from corral.sandbox.exec_handshake import ReadyInfo

log = logging.getLogger("corral.session")

#: Bound on one commit request to the supervisor (a commit is one fsync'd transaction).
CALL_TIMEOUT_S = 15.0
#: How long a reply waits for the terminal record to reach the ledger, so that an
#: answer saying "exited" never runs ahead of what the ledger says.
REPORT_WAIT_S = 5.0

S = SessionState


def sandbox_profile(project_root: Path, settings: Mapping[str, Any]) -> SandboxProfile:
    """The profile of a swarm spec's ``[sandbox]`` settings (as the supervisor sends
    them, a plain map) over one project root. Shared with ``command.exec``."""
    limits = Rlimits(
        cpu_s=settings.get("cpu_s"),
        address_space_bytes=settings.get("address_space_bytes"),
        open_files=settings.get("open_files"),
        processes=settings.get("processes"),
    )
    return SandboxProfile(
        project_root=project_root,
        network=bool(settings.get("network", False)),
        rlimits=limits if limits.as_dict() else None,
        mode=SandboxMode.parse(str(settings.get("mode", SandboxMode.REQUIRED.value))),
        masked=tuple(Path(str(path)) for path in settings.get("masked", ())),
        # An intent contract's path scope (supervisor/intent/intent_service.py): the only writable binds.
        writable=None if settings.get("writable") is None else tuple(Path(str(p)) for p in settings["writable"]),
    )


def private_dirs(path: Path) -> None:
    """``home/transcripts/<run>``, every level 0700 (``mkdir(parents=True)`` would
    create the missing parents with the default mode)."""
    for directory in (path.parent, path):
        directory.mkdir(mode=0o700, exist_ok=True)


class _Reporter:
    """The session's commits to the supervisor, in the engine's order."""

    def __init__(self, ctx: ActorContext, process_id: str) -> None:
        self.ctx = ctx
        self.process_id = process_id
        #: While start() runs, a failure is held back and reported with its cause.
        self.starting = False
        self.deferred: StateChange | None = None
        self.terminal_reported = trio.Event()

    async def on_ready(self, info: ReadyInfo) -> None:
        # The pid goes to this actor's log only: nobody may ever signal a stored pid.
        log.info("%s: sandbox ready (%s, pid %d); committing the launch", self.process_id, info.launch_mode, info.pid)
        await self.ctx.ask(
            SessionLaunched(process_id=self.process_id, launch_mode=info.launch_mode.value), timeout=CALL_TIMEOUT_S
        )

    async def on_state(self, change: StateChange) -> None:
        if self.starting and change.new in (S.FAILED, S.NEEDS_RECONCILIATION):
            self.deferred = change
            return
        if change.new is S.RUNNING:
            failpoints.hit("session.after-launch")
        # launching and running guard what follows them (spawning, leaving the
        # process running): if they cannot be committed, the engine must stop.
        await self.report(change, strict=change.new in (S.LAUNCHING, S.RUNNING))

    async def report_failure(self, exc: BaseException) -> None:
        change, self.deferred = self.deferred, None
        if change is None:
            return
        code = getattr(exc, "code", None)
        await self.report(
            change,
            reason=summarize(f"{type(exc).__name__}: {exc}", 300),
            code=code if isinstance(code, str) else "launch-failed",
        )

    async def report(
        self, change: StateChange, *, reason: str | None = None, code: str | None = None, strict: bool = False
    ) -> None:
        try:
            report = SessionStateReport(
                process_id=self.process_id,
                state=change.new.value,
                exit_code=change.exit_code,
                output_bytes=change.output_bytes,
                launch_mode=change.launch_mode.value if change.launch_mode else None,
                reason=reason,
                code=code,
            )
            await self.ctx.ask(report, timeout=CALL_TIMEOUT_S)
        except Exception as exc:
            if strict:
                raise
            # The ledger keeps the last state it has; when this actor exits the
            # supervisor turns an unfinished session into needs-reconciliation.
            log.warning("%s: could not record %s: %s", self.process_id, change.new, exc)
        finally:
            if is_terminal(change.new):
                self.terminal_reported.set()

    async def settled(self, state: SessionState) -> None:
        if is_terminal(state):
            with trio.move_on_after(REPORT_WAIT_S):
                await self.terminal_reported.wait()


@dataclass(frozen=True)
class _SourceWatch:
    """The project's sources as they were before the launch, to say in each poll
    whether they have changed since (seed 004 V1.10 ``sourceChanged``), by the
    fingerprint ``command.exec`` takes (actors/tools/source_fingerprint.py)."""

    root: Path
    home: Path
    before: SourceFingerprint

    async def changed(self) -> bool:
        now = await trio.to_thread.run_sync(fingerprint, self.root, self.home)
        return not self.before.same_as(now)


async def _watch(params: Mapping[str, Any]) -> _SourceWatch | None:
    """The watch of the project's sources, or None when the supervisor named no home."""
    home = params.get("home")
    if not isinstance(home, str):
        return None
    root = Path(str(params["project_root"]))
    return _SourceWatch(root, Path(home), await trio.to_thread.run_sync(fingerprint, root, Path(home)))


async def run(ctx: ActorContext) -> int:
    params = ctx.params
    process_id = str(params.get("process_id", ctx.actor_id))
    reporter = _Reporter(ctx, process_id)
    try:
        session = _build_session(params, process_id, reporter)
    except (KeyError, TypeError, ValueError, SandboxError, SessionError) as exc:
        # Nothing was spawned; the supervisor validated these, so this is a bug.
        log.error("%s: bad session parameters: %s", process_id, exc)
        await reporter.report(
            StateChange(process_id, S.PREPARED, S.FAILED, None, None, 0),
            reason=summarize(f"bad session parameters: {exc}", 300),
            code=getattr(exc, "code", "bad-input"),
        )
        await _wait_for_shutdown(ctx)
        return 0
    watch = await _watch(params)
    async with session:
        reporter.starting = True
        try:
            await session.start()
        except Exception as exc:
            # The engine has already killed and reaped whatever was spawned.
            log.warning("%s: launch failed: %s", process_id, exc)
            reporter.starting = False
            await reporter.report_failure(exc)
        finally:
            reporter.starting = False
        await _serve(ctx, session, reporter, watch)
        if not is_terminal(session.state):
            await session.terminate()
        await reporter.settled(session.state)
    # Only now: the runtime cancels the template shortly after this is set, and the
    # two-phase terminate above must not be cut short.
    ctx.shutdown.set()
    return 0


def _build_session(params: Mapping[str, Any], process_id: str, reporter: _Reporter) -> PtySession:
    argv = params["argv"]
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise BadSessionInput("argv must be a list of strings")
    timeout = params.get("timeout_s")
    transcript = Path(str(params["transcript"]))
    private_dirs(transcript.parent)
    return PtySession(
        argv,
        cwd=Path(str(params["cwd"])),
        profile=sandbox_profile(Path(str(params["project_root"])), params.get("sandbox", {})),
        process_id=process_id,
        timeout_s=float(timeout) if timeout is not None else None,
        on_ready=reporter.on_ready,
        on_state=reporter.on_state,
        transcript_path=transcript,
    )


async def _wait_for_shutdown(ctx: ActorContext) -> None:
    async for envelope in ctx.channel.inbox:
        if is_shutdown(envelope):
            break
        if envelope.kind is Kind.REQUEST:
            await _reply_error(ctx, envelope, "process-not-running", "the session never started")
    ctx.shutdown.set()


async def _serve(ctx: ActorContext, session: PtySession, reporter: _Reporter, watch: _SourceWatch | None) -> None:
    """Answer requests (each in its own task: a waiting poll must not hold up a
    terminate) until shutdown or until the supervisor is gone."""
    async with trio.open_nursery() as nursery:
        async for envelope in ctx.channel.inbox:
            if is_shutdown(envelope):
                break
            if envelope.kind is Kind.REQUEST:
                nursery.start_soon(_answer, ctx, session, reporter, envelope, watch)
        nursery.cancel_scope.cancel()


async def _answer(
    ctx: ActorContext, session: PtySession, reporter: _Reporter, envelope: Envelope, watch: _SourceWatch | None
) -> None:
    body = envelope.body
    op = body.get("op")
    try:
        if op == "poll":
            reply = await _poll(session, reporter, body, watch)
        elif op == "stdin":
            reply = await _stdin(session, body)
        elif op == "terminate":
            state = await session.terminate()
            await reporter.settled(state)
            reply = {"status": state.value, "exit_code": session.exit_code}
        else:
            raise BadSessionInput(f"unknown session request {str(op)[:40]!r}")
    except (SessionError, IllegalTransition) as exc:
        await _reply_error(ctx, envelope, exc.code, str(exc))
        return
    except OSError as exc:
        await _reply_error(ctx, envelope, "session-io-error", exc.strerror or str(exc))
        return
    try:
        await ctx.channel.reply(envelope, reply)
    except Exception as exc:  # the supervisor went away; nothing to answer to
        log.warning("%s: reply failed: %s", session.process_id, exc)


async def _poll(
    session: PtySession, reporter: _Reporter, body: Mapping[str, Any], watch: _SourceWatch | None
) -> dict[str, Any]:
    cursor = body.get("cursor")
    max_chars = body.get("max_chars", 8192)
    wait_ms = body.get("wait_ms", 0)
    if cursor is not None and not isinstance(cursor, str):
        raise BadSessionInput("cursor must be a string")
    if not _is_int(max_chars) or not _is_int(wait_ms):
        raise BadSessionInput("max_chars and wait_ms must be integers")
    result = await session.poll(cursor, max_chars=max_chars, wait_ms=wait_ms)
    await reporter.settled(result.state)
    end = decode_cursor(result.next_cursor, session.process_id)
    return {
        "chunk": result.chunk,
        "next_cursor": result.next_cursor,
        "status": result.state.value,
        "exit_code": result.exit_code,
        "more": end < session.output_bytes,
        "live": True,
        "listening": await session.listening_ports(),
        # The seed's status facts (V1.10): counts and a digest, never more text.
        "stdin_open": session.stdin_open,
        "signal": signal_of(result.state, result.exit_code),
        "output_bytes": session.output_bytes,
        "output_sha256": session.output_sha256,
        "needs_reconciliation": result.state is SessionState.NEEDS_RECONCILIATION,
        "source_changed": None if watch is None else await watch.changed(),
    }


async def _stdin(session: PtySession, body: Mapping[str, Any]) -> dict[str, Any]:
    data = body.get("data", "")
    if not isinstance(data, str):
        raise BadSessionInput("data must be a string")
    receipt = await session.write_stdin(
        data, append_newline=bool(body.get("append_newline")), eof=bool(body.get("eof"))
    )
    # Byte count and digest only: the content itself goes no further than the PTY.
    return {
        "bytes_written": receipt.bytes_written,
        "sha256": receipt.sha256,
        "eof": receipt.eof,
        "complete": receipt.complete,
        "status": session.state.value,
    }


async def _reply_error(ctx: ActorContext, envelope: Envelope, code: str, message: str) -> None:
    try:
        await ctx.channel.reply_error(envelope, code, message)
    except Exception as exc:
        log.warning("error reply failed: %s", exc)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and math.isfinite(value)

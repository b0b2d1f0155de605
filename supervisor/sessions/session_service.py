"""The process-session layer on the supervisor: session actors, ownership, and
what sessions add to finalization, recovery and shutdown. Their durable records
are supervisor/sessions/session_store.py.

A session is one row in ``sessions`` whose ``state`` follows the engine's
:data:`corral.actors.session_state.TRANSITIONS` table, one ledger event per change.
The opaque process id is derived from the start action (one session per start
action, however often the request is repeated) and bound to that action's run and
agent: only that run may poll, write to or terminate it.

The session actor commits each step before it takes it (``launching`` before any
spawn, the launch record before COMMIT_EXEC, the terminal state only after the tree
is confirmed dead). What cannot be confirmed ends as ``needs-reconciliation``:
a session actor that exits while its session is unfinished, and at boot every
unfinished session of an older boot. Recovery never relaunches, never reconnects
to a pid and never signals one: no pid is stored at all. The processes of a dead
supervisor died with it (PDEATHSIG through the session actor).

stdin content passes through this process in memory only; the ledger keeps byte
counts and sha256 digests.

Sessions' part in runs and in the supervisor's life (finalization, recovery,
``status``) is supervisor/sessions/session_parts.py; the actor methods' records,
with the bounds each field holds to, are mailbox/protocol/sessions.py.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from corral.actors.session_state import MAX_STDIN_BYTES, TERMINAL_STATES, SessionState, signal_of
from corral.actors.tools.base import ToolError
from corral.actors.tools.paths import resolve_in_workspace
from corral.core import failpoints
from corral.mailbox.errors import ChannelClosed, DeadlineExceeded, MailboxFull, RemoteError
from corral.mailbox.protocol import (
    Ack,
    CommandLaunched,
    CommandSandbox,
    SandboxGrant,
    SealedValue,
    SessionLaunched,
    SessionOutput,
    SessionPoll,
    SessionStart,
    SessionStateReport,
    SessionStdin,
    SessionTerminate,
    SessionView,
    StdinWritten,
)
from corral.sandbox.bwrap import LaunchMode
from corral.supervisor.errors import BadRequest, Conflict, Refused, SupervisorError
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.params import param_str
from corral.supervisor.project import revision_store
from corral.supervisor.runs import action_store, run_store, sealed_input
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import TERMINAL as RUN_TERMINAL
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.sessions import session_store
from corral.supervisor.spec.swarm_spec import ActorSpec, GroupSpec, SandboxSettings
from corral.supervisor.tree.actor_state import ActorState
from corral.supervisor.tree.restart_policy import RestartType, Strategy
from corral.supervisor.tree.supervision_tree import ActorSlot, SupervisionTree

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

log = logging.getLogger("corral.sessions")

S = SessionState
#: The sandbox of a run's session or command, narrowed by its intent contract:
#: (run, the spec's sandbox settings) -> the settings it runs under.
SandboxScope = Callable[[Any, dict[str, Any]], dict[str, Any]]

#: session.start answers once the session runs (or failed); the handshake itself
#: gives up after 10 s, so this only bounds a session actor that never reports.
START_WAIT_S = 30.0
#: A final reply blocked only by sessions waits this long inside run.finalize
#: before it is refused, so an agent retrying its finalization long-polls instead
#: of spinning (below the agent's 30 s request timeout).
FINALIZE_HOLD_S = 10.0
POLL_SLACK_S = 10.0
STDIN_TIMEOUT_S = 15.0
#: Two-phase terminate: 0.8 s grace, up to 5 s to reap, 2 s to drain, and margin.
TERMINATE_TIMEOUT_S = 20.0
SESSION_SHUTDOWN_MS = 12_000
DEFAULT_SESSION_TIMEOUT_S = 600.0
#: The arguments' bound the records cannot state (theirs: mailbox/protocol/sessions.py).
MAX_ARGV_BYTES = 64 * 1024


def sandbox_settings(settings: SandboxSettings, home: Path | None = None) -> dict[str, Any]:
    return {
        # The home is never visible inside, whatever its name or place.
        "masked": [str(home)] if home is not None else [],
        "mode": settings.mode,
        "network": settings.network,
        "cpu_s": settings.cpu_s,
        "address_space_bytes": settings.address_space_bytes,
        "open_files": settings.open_files,
        "processes": settings.processes,
    }


# -- checks the records cannot state -------------------------------------------------


def _argv(request: SessionStart) -> list[str]:
    argv = [request.program, *request.args]
    if any("\0" in a for a in argv) or sum(len(a.encode()) for a in argv) > MAX_ARGV_BYTES:
        raise BadRequest(f"arguments must not contain NUL and stay under {MAX_ARGV_BYTES} bytes")
    return argv


def _launch_mode(name: str) -> LaunchMode:
    try:
        return LaunchMode(name)
    except ValueError:
        raise BadRequest("launch_mode must be 'sandboxed' or 'unsandboxed'") from None


def _cwd(workspace: Path, raw: str) -> tuple[str, Path]:
    raw = raw or "."
    try:
        # The tool checked it in the agent already; the supervisor does not trust that.
        target = workspace if raw in (".", "./") else resolve_in_workspace(workspace, raw)
    except ToolError as exc:
        raise Refused(str(exc), code=exc.code) from None
    if not target.is_dir():
        raise BadRequest(f"cwd {raw!r} is not a directory in the workspace")
    return raw, target


# -- the service -----------------------------------------------------------------------


class SessionService:
    def __init__(
        self,
        ledger: Ledger,
        tree: SupervisionTree,
        runs: RunService,
        home: Path,
        sandbox: SandboxSettings,
        scope_sandbox: SandboxScope,
    ) -> None:
        self.ledger = ledger
        #: The session actors: started, asked (poll, stdin, terminate), watched, stopped.
        self.tree = tree
        #: Which run a caller owns, and waking an agent whose final reply may proceed.
        self.runs = runs
        #: The supervisor's home: transcripts and sealed input live there, and no
        #: sandbox ever sees it.
        self.home = home
        #: The spec's sandbox, the base of every session's and command's sandbox.
        self.sandbox = sandbox
        #: Narrows that sandbox by the run's intent contract, when it has one.
        self.scope_sandbox = scope_sandbox
        self._changed = trio.Event()
        # Ledger hooks run inside transactions (sync); process work they imply is
        # queued here and done by one background task, as in the swarm layer.
        self._send, self._receive = trio.open_memory_channel[tuple[str, str]](math.inf)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_until(self, done: Callable[[], bool], deadline: float) -> bool:
        while True:
            changed = self._changed
            if done():
                return True
            if trio.current_time() >= deadline:
                return False
            with trio.move_on_at(deadline):
                await changed.wait()

    # -- ownership ------------------------------------------------------------------

    def _owned_session(self, slot: ActorSlot, run_id: str, process_id: str) -> sqlite3.Row:
        run = self.runs.run_of(slot, run_id)
        row = session_store.get_session(self.ledger, process_id)
        # One answer for "unknown" and "someone else's": no probing for live ids.
        if row is None or row["run_id"] != run["run_id"] or row["agent_id"] != run["agent_id"]:
            raise Refused(
                f"process {process_id} is not a process session of run {run['run_id']};"
                " only the run that started a process may poll, write to or terminate it"
            )
        return row

    def _actor_session(self, slot: ActorSlot, process_id: str) -> sqlite3.Row:
        row = session_store.get_session(self.ledger, process_id)
        if row is None or row["actor_id"] != slot.id:
            raise Refused(f"actor {slot.id} does not own process session {process_id}")
        return row

    def _executing_action(self, run: Any, action_id: str, tool: str) -> sqlite3.Row:
        action = action_store.get_action(self.ledger, action_id)
        if action["run_id"] != run["run_id"] or action["phase"] != "executing" or action["tool"] != tool:
            raise BadRequest(f"action {action['action_id']} is not an executing {tool} action of this run")
        return action

    @staticmethod
    def _workspace(run: Any) -> Path:
        workspace = json.loads(run["options"]).get("workspace")
        if not isinstance(workspace, str):
            raise BadRequest(f"run {run['run_id']} has no workspace")
        return Path(workspace).resolve()

    # -- agent-facing methods --------------------------------------------------------

    async def start(self, slot: ActorSlot, request: SessionStart) -> SessionView:
        run = self.runs.run_of(slot, request.run_id)
        if RunStatus(run["status"]) in RUN_TERMINAL:
            raise Refused(f"run {run['run_id']} already ended ({run['status']})")
        action = self._executing_action(run, request.action_id, "process.start")
        argv = _argv(request)
        workspace = self._workspace(run)
        cwd_raw, cwd = _cwd(workspace, request.cwd)
        timeout_s = request.timeout_s if request.timeout_s is not None else DEFAULT_SESSION_TIMEOUT_S
        process_id = session_store.process_id_for(action["action_id"])
        if session_store.get_session(self.ledger, process_id) is None:
            # Capacity before anything is recorded or launched (no await in between:
            # two starts cannot both pass it). A refusal is the action's plain failure.
            full = session_store.capacity_refusal(self.ledger, run["agent_id"])
            if full is not None:
                raise Refused(full, code="session-capacity")
            session_store.insert_session(self.ledger, process_id, run, action["action_id"], argv, cwd_raw)
            failpoints.hit("session.after-prepared")
            await self._launch_actor(
                process_id,
                {
                    "process_id": process_id,
                    "run_id": run["run_id"],
                    "argv": argv,
                    "cwd": str(cwd),
                    "timeout_s": timeout_s,
                    "project_root": str(workspace),
                    "sandbox": self._run_sandbox(run),
                    "transcript": str(session_store.transcript_path(self.home, run["run_id"], process_id)),
                    # The source fingerprint skips the home (seed 004 V1.10 sourceChanged).
                    "home": str(self.home),
                },
            )
        # else: the same start action asked again (a lost reply): report, never relaunch.
        await self._wait_until(
            lambda: self._state(process_id) not in (S.PREPARED, S.LAUNCHING),
            trio.current_time() + START_WAIT_S,
        )
        row = session_store.get_session(self.ledger, process_id)
        assert row is not None
        return session_store.session_view(row)

    async def _launch_actor(self, process_id: str, params: dict[str, Any]) -> None:
        group = GroupSpec(f"g-{process_id}", Strategy.ONE_FOR_ONE, 0, 1.0)
        self.tree.declare_group(group)
        spec = ActorSpec(
            id=process_id,
            template="session",
            group=group.id,
            restart=RestartType.TEMPORARY,
            shutdown_timeout_ms=SESSION_SHUTDOWN_MS,
            params=params,
        )
        try:
            await self.tree.add_actor(spec)
        except Exception as exc:
            session_store.move_session(
                self.ledger,
                process_id,
                S.FAILED,
                self.runs.features,
                reason=f"the session actor could not be started: {exc}",
                code="launch-failed",
            )
            self._notify()
            return
        self._send.send_nowait(("watch", process_id))

    def _state(self, process_id: str) -> SessionState:
        row = session_store.get_session(self.ledger, process_id)
        assert row is not None
        return SessionState(row["state"])

    async def _ask(self, row: sqlite3.Row, body: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """A request to the session's actor, or None when it is not there to answer."""
        slot = self.tree.slots.get(row["actor_id"])
        if slot is None or slot.state is not ActorState.RUNNING or slot.channel is None:
            return None
        try:
            return await self.tree.request(row["actor_id"], body, timeout)
        except RemoteError as exc:
            raise SupervisorError(exc.message, code=exc.code) from None
        except (ChannelClosed, MailboxFull, DeadlineExceeded):
            return None

    async def poll(self, slot: ActorSlot, request: SessionPoll) -> SessionOutput:
        row = self._owned_session(slot, request.run_id, request.process_id)
        cursor, max_chars, wait_ms = request.cursor, request.max_chars, request.wait_ms
        body = {"op": "poll", "cursor": cursor, "max_chars": max_chars, "wait_ms": wait_ms}
        reply = await self._ask(row, body, wait_ms / 1000 + POLL_SLACK_S)
        if reply is None:
            fresh = session_store.get_session(self.ledger, row["process_id"]) or row
            path = session_store.transcript_path(self.home, row["run_id"], row["process_id"])
            chunk, next_cursor, more = session_store.poll_transcript(path, row["process_id"], cursor, max_chars)
            size, digest = session_store.transcript_facts(path)
            state = SessionState(fresh["state"])
            return SessionOutput(
                process_id=row["process_id"],
                chunk=chunk,
                next_cursor=next_cursor,
                status=state.value,
                exit_code=fresh["exit_code"],
                more=more,
                live=False,
                signal=signal_of(state, fresh["exit_code"]),
                output_bytes=size,
                output_sha256=digest,
                needs_reconciliation=state is SessionState.NEEDS_RECONCILIATION,
            )
        # The session actor's answer (actors/session.py ``_poll``), checked into the record.
        return msgspec.convert({"process_id": row["process_id"], **reply}, SessionOutput)

    async def stdin(self, slot: ActorSlot, request: SessionStdin) -> StdinWritten:
        row = self._owned_session(slot, request.run_id, request.process_id)
        data = request.data
        if isinstance(data, SealedValue):
            spool = sealed_input.spool_dir(self.home)
            sealed_by = self._stdin_action(row, request.action_id)
            try:
                data = sealed_input.unseal(spool, row["run_id"], sealed_by, "data", data.marker())
            except sealed_input.SealedInputError as exc:
                raise Refused(str(exc), code="sealed-input") from None
            # From here the value lives in memory only; the action is never re-run,
            # so whatever happens next, nothing will ask for it again.
            sealed_input.discard(spool, row["run_id"], sealed_by)
        newline = 1 if request.append_newline else 0
        if len(data.encode()) + newline > MAX_STDIN_BYTES:
            raise BadRequest(f"data must be a string of at most {MAX_STDIN_BYTES} bytes (with its newline)")
        if row["state"] != S.RUNNING:
            raise Refused(f"process {row['process_id']} is {row['state']}, not running", code="process-not-running")
        body = {
            "op": "stdin",
            "data": data,
            "append_newline": request.append_newline,
            "eof": request.eof,
        }
        reply = await self._ask(row, body, STDIN_TIMEOUT_S)
        if reply is None:
            raise Refused(f"process {row['process_id']} cannot be reached any more", code="process-not-running")
        written = int(reply.get("bytes_written", 0))
        digest = str(reply.get("sha256", ""))
        eof, complete = bool(reply.get("eof")), bool(reply.get("complete"))
        session_store.record_stdin(self.ledger, row, written, digest, eof=eof, complete=complete)
        return StdinWritten(
            process_id=row["process_id"],
            bytes_written=written,
            sha256=digest,
            eof=eof,
            complete=complete,
            status=str(reply.get("status", row["state"])),
        )

    async def terminate(self, slot: ActorSlot, request: SessionTerminate) -> SessionView:
        row = self._owned_session(slot, request.run_id, request.process_id)
        if SessionState(row["state"]) not in TERMINAL_STATES:
            # The actor answers once the terminal state is on disk (or could not be).
            await self._ask(row, {"op": "terminate"}, TERMINATE_TIMEOUT_S)
        fresh = session_store.get_session(self.ledger, row["process_id"])
        assert fresh is not None
        return session_store.session_view(fresh)

    def live_sessions(self, run_id: str) -> list[str]:
        """The process ids of the run's sessions whose process may still be there."""
        return [row["process_id"] for row in session_store.live_sessions(self.ledger, run_id)]

    async def end_run_sessions(self, run_id: str) -> list[str]:
        """Terminates every live session of the run and waits until each one's
        terminal state is on disk (a goal's pause: seed 004 V1.18 ends them before
        the pause commits). A session still being launched is asked again once its
        actor is up. Returns the ids it asked to end; any left live after
        ``TERMINATE_TIMEOUT_S`` are still in :meth:`live_sessions`."""
        ended: list[str] = []
        deadline = trio.current_time() + TERMINATE_TIMEOUT_S
        while True:
            live = session_store.live_sessions(self.ledger, run_id)
            if not live or trio.current_time() >= deadline:
                return ended
            before = [(row["process_id"], row["state"]) for row in live]
            for row in live:
                if row["process_id"] not in ended:
                    ended.append(row["process_id"])
                if row["state"] != S.TERMINATING:
                    # The actor answers once the terminal state is on disk (None: not up yet).
                    try:
                        await self._ask(row, {"op": "terminate"}, max(0.1, deadline - trio.current_time()))
                    except SupervisorError as exc:
                        log.warning("session %s: terminate for run %s: %s", row["process_id"], run_id, exc)

            await self._wait_until(functools.partial(self._sessions_moved, run_id, before), deadline)

    def _sessions_moved(self, run_id: str, before: list[tuple[str, str]]) -> bool:
        now = session_store.live_sessions(self.ledger, run_id)
        return [(row["process_id"], row["state"]) for row in now] != before

    def _stdin_action(self, session: Any, the_id: str | None) -> str:
        """The executing process.stdin action of the session's run that sealed the data."""
        if the_id is None:
            raise BadRequest("sealed stdin data needs the action_id that sealed it")
        action = action_store.get_action(self.ledger, the_id)
        if action["run_id"] != session["run_id"] or action["tool"] != "process.stdin" or action["phase"] != "executing":
            raise BadRequest(f"action {the_id} is not an executing process.stdin action of this run")
        return the_id

    async def hold_finalize(self, run: Any) -> None:
        """Before run.finalize judges its blockers: wait a while for the run's
        sessions, so a process about to exit does not cost the run a repair turn."""
        run_id = run["run_id"]
        started = self.ledger.one("SELECT 1 FROM finalizations WHERE run_id = ?", run_id)
        if run["kind"] == "root" and started is None and session_store.blockers(self.ledger, run_id):
            self.ledger.event("finalize-held", run_id, reasons=session_store.blockers(self.ledger, run_id))
            deadline = trio.current_time() + FINALIZE_HOLD_S
            await self._wait_until(lambda: not session_store.blockers(self.ledger, run_id), deadline)

    # -- command.exec bookkeeping (the command itself runs in the agent) ---------------

    async def command_sandbox(self, slot: ActorSlot, request: CommandSandbox) -> SandboxGrant:
        run = self.runs.run_of(slot, request.run_id)
        self._executing_action(run, request.action_id, "command.exec")
        return SandboxGrant(project_root=str(self._workspace(run)), sandbox=self._run_sandbox(run))

    def _run_sandbox(self, run: Any) -> dict[str, Any]:
        """The spec's sandbox, narrowed by the run's intent contract (its path scope:
        supervisor/intent/intent_service.py) when it has one."""
        return self.scope_sandbox(run, sandbox_settings(self.sandbox, self.home))

    async def command_launched(self, slot: ActorSlot, request: CommandLaunched) -> Ack:
        """The durable launch record of a command, committed before COMMIT_EXEC."""
        run = self.runs.run_of(slot, request.run_id)
        if RunStatus(run["status"]) in RUN_TERMINAL:
            raise Refused(f"run {run['run_id']} already ended; not launching")
        action = self._executing_action(run, request.action_id, "command.exec")
        mode = _launch_mode(request.launch_mode)
        transcript = session_store.transcript_path(self.home, run["run_id"], action["action_id"])
        with self.ledger.tx():
            session_store.record_command_launch(self.ledger, run["run_id"], action["action_id"], mode, transcript)
            # Seed 004 V1.11.1: "command.exec 只在 SANDBOX_READY 后推进 revision 和清除旧验证凭证".
            # In the launch record's commit, before COMMIT_EXEC: whatever the command
            # does, and whether or not its outcome is ever reported (a crash, then a
            # person's reconciliation), no verification made before it speaks for the
            # tree after it. Its receipt keeps this one revision (revision_store.record).
            revision_store.record(self.ledger, action)
        return Ack()

    def on_receipt(self, ledger: Ledger, action: Any) -> None:
        if sealed_input.sealed_fields(self.runs.tools, action["tool"]):
            # Ended without reaching the terminal (refused, denied, failed early):
            # its sealed input will never be read, so it goes now.
            sealed_input.discard(sealed_input.spool_dir(self.home), action["run_id"], action["action_id"])
        if action["tool"] != "command.exec" or not action["result"]:
            return
        # Inside the receipt's transaction: a surprise here must not cost the receipt.
        result = json.loads(action["result"])
        output = result.get("output") if isinstance(result, dict) else None
        code = output.get("exit_code") if isinstance(output, dict) else None
        if isinstance(code, int) and not isinstance(code, bool):
            session_store.record_command_exit(ledger, action["action_id"], code)

    # -- session-actor methods -------------------------------------------------------

    async def launched(self, slot: ActorSlot, request: SessionLaunched) -> Ack:
        """The launch record: committed while the trampoline waits for COMMIT_EXEC."""
        row = self._actor_session(slot, request.process_id)
        if row["state"] != S.LAUNCHING:
            raise Conflict(f"process {row['process_id']} is {row['state']}, not launching; not committing a launch")
        run = run_store.get_run(self.ledger, row["run_id"])
        if RunStatus(run["status"]) in RUN_TERMINAL:
            raise Refused(f"run {run['run_id']} already ended; not launching")
        with self.ledger.tx():
            session_store.record_launch(self.ledger, row, _launch_mode(request.launch_mode))
            # As command.exec's (command_launched): a process may change sources at any
            # time while it lives, and its start action reports none of it.
            revision_store.record(self.ledger, action_store.get_action(self.ledger, row["start_action_id"]))
        self._notify()
        return Ack()

    async def state(self, slot: ActorSlot, request: SessionStateReport) -> Ack:
        row = self._actor_session(slot, request.process_id)
        try:
            new = SessionState(request.state)
        except ValueError:
            raise BadRequest("state must be a session state") from None
        if row["state"] == new:
            return Ack()  # a repeated report after a lost reply
        session_store.move_session(
            self.ledger,
            row["process_id"],
            new,
            self.runs.features,
            reason=request.reason[:1000] if request.reason else None,
            code=request.code[:60] if request.code else None,
            exit_code=request.exit_code,
            output_bytes=request.output_bytes,
        )
        self._notify()
        if new in TERMINAL_STATES:
            # The run's final reply may be unblocked now.
            self._send.send_nowait(("wake", row["agent_id"]))
        return Ack()

    # -- hooks, background, control ----------------------------------------------------

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        if status not in RUN_TERMINAL:
            return
        for row in ledger.all("SELECT actor_id FROM sessions WHERE run_id = ?", run_id):
            self._send.send_nowait(("stop", row["actor_id"]))

    def _actor_gone(self, process_id: str, exit_code: int | None) -> None:
        row = session_store.get_session(self.ledger, process_id)
        if row is None or SessionState(row["state"]) not in session_store.LIVE_STATES:
            return
        if row["state"] == S.PREPARED:
            session_store.move_session(
                self.ledger,
                process_id,
                S.FAILED,
                self.runs.features,
                reason=f"the session actor exited ({exit_code}) before launching",
                code="session-actor-exited",
            )
        else:
            session_store.move_session(
                self.ledger,
                process_id,
                S.NEEDS_RECONCILIATION,
                self.runs.features,
                reason=(
                    f"the session actor exited ({exit_code}) while the session was {row['state']};"
                    " the end of its process tree was not confirmed"
                ),
                code="session-actor-exited",
            )
        self._notify()

    async def _watch(self, process_id: str) -> None:
        slot = self.tree.slots.get(process_id)
        if slot is None:
            return
        await slot.exited.wait()
        try:
            self._actor_gone(process_id, slot.last_exit)
        except SupervisorError as exc:
            # A lost race with the actor's own last report; never let it take the
            # worker (and with it the supervisor) down.
            log.warning("session %s: after its actor exited: %s", process_id, exc)

    async def worker(self) -> None:
        async with trio.open_nursery() as nursery:
            async for op, target in self._receive:
                if op == "watch":
                    nursery.start_soon(self._watch, target)
                elif op == "stop":
                    slot = self.tree.slots.get(target)
                    if slot is not None:
                        # Each in its own task: a two-phase terminate takes a second.
                        nursery.start_soon(self.tree.stop_actor, slot, "run ended")
                elif op == "wake":
                    await self.runs.wake(target)

    async def reconcile(self, params: dict[str, Any]) -> dict[str, Any]:
        """``reconcile`` of a process id (``proc-…``): resolves its session."""
        run_id = session_store.resolve_session(
            self.ledger, param_str(params, "action_id", limit=300), param_str(params, "outcome", limit=20),
            str(params.get("note", ""))[:1000],
            self.runs.features,
        )
        self._notify()
        await self.runs.wake_run(run_id)
        return {"run_id": run_id}


def install(sup: Supervisor) -> SessionService:
    # The intent service is built after this one (its hooks run after these), so
    # the sandbox scope finds it when a session or command first asks.
    def scope_sandbox(run: Any, settings: dict[str, Any]) -> dict[str, Any]:
        return sup.intent.scoped_sandbox(run, settings)

    service = SessionService(sup.ledger, sup.tree, sup.runs, sup.home, sup.spec.sandbox, scope_sandbox)
    sup.methods.sessions = service
    return service

"""The ledger side of process sessions and commands: each function is one read or
one transaction over ``sessions`` and ``command_launches``, synchronous, so the
service, the run layer's hooks (inside their transactions), recovery and the
finalization blockers all use the same rules.

A session's ``state`` follows the engine's :data:`corral.actors.session_state.TRANSITIONS`
table, one ledger event per change (:func:`move_session`). No pid is ever stored;
stdin is kept as byte counts and sha256 digests only.
"""

from __future__ import annotations

import hashlib
import shlex
import sqlite3
import time
from pathlib import Path
from typing import Any

from corral.actors.session_state import (
    InvalidCursor,
    SessionState,
    check_transition,
    decode_cursor,
    encode_cursor,
)
from corral.core.redact import redact_text, summarize
from corral.core.transitions import IllegalTransition
from corral.mailbox.protocol import SessionView
from corral.sandbox.bwrap import LaunchMode
from corral.sandbox.facts import sandbox_facts
from corral.supervisor.errors import BadRequest, Conflict, NotFound, SupervisorError
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import resolutions, run_store
from corral.supervisor.runs.recovery import RecoveryReport
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.sessions.launch_stages import TargetExec, establishment, launch_stages

S = SessionState
LIVE_STATES = frozenset({S.PREPARED, S.LAUNCHING, S.RUNNING, S.TERMINATING})
_LIVE_SQL = ", ".join(f"'{state.value}'" for state in sorted(LIVE_STATES))


def process_id_for(action_id: str) -> str:
    """One opaque process id per start action: a replayed start finds its session."""
    return "proc-" + hashlib.sha256(action_id.encode()).hexdigest()[:20]


def transcript_path(home: Path, run_id: str, name: str) -> Path:
    """The private transcript of a session or command (home is 0700, files 0600)."""
    return home / "transcripts" / run_id / f"{name}.log"


# -- sessions -------------------------------------------------------------------------


def get_session(ledger: Ledger, process_id: str) -> sqlite3.Row | None:
    return ledger.one("SELECT * FROM sessions WHERE process_id = ?", process_id)


def insert_session(ledger: Ledger, process_id: str, run: Any, action_id: str, argv: list[str], cwd: str) -> None:
    """A new session, ``prepared``: committed before its actor is started."""
    now = time.time()
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO sessions (process_id, run_id, agent_id, start_action_id, actor_id, program,"
            " argv_summary, cwd, state, boot_id, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'prepared', ?, ?, ?)",
            (
                process_id,
                run["run_id"],
                run["agent_id"],
                action_id,
                process_id,
                summarize(argv[0], 200),
                summarize(shlex.join(argv), 300),
                cwd,
                ledger.boot_id,
                now,
                now,
            ),
        )
        ledger.event("session-prepared", process_id, run=run["run_id"], action=action_id)


def move_session(
    ledger: Ledger,
    process_id: str,
    new: SessionState,
    features: RunFeatures,
    *,
    reason: str | None = None,
    code: str | None = None,
    exit_code: int | None = None,
    output_bytes: int | None = None,
) -> sqlite3.Row:
    """One transition by the engine's table, with its event, in one transaction.

    A session that becomes ``needs-reconciliation`` parks its running run, like an
    action with an unknown outcome: it waits for a person, not for the agent.
    """
    with ledger.tx() as db:
        row = get_session(ledger, process_id)
        if row is None:
            raise NotFound(f"no process session {process_id!r}")
        old = SessionState(row["state"])
        try:
            check_transition(old, new)
        except IllegalTransition as exc:
            raise Conflict(f"process {process_id}: {exc}") from None
        now = time.time()
        stages = launch_stages(old, new, row["sandbox_ready_at"] is not None, code, now)
        if stages:
            db.execute(
                f"UPDATE sessions SET {', '.join(f'{key} = ?' for key in stages)} WHERE process_id = ?",
                (*stages.values(), process_id),
            )
        db.execute(
            "UPDATE sessions SET state = ?, reason = COALESCE(?, reason), error_code = COALESCE(?, error_code),"
            " exit_code = COALESCE(?, exit_code), output_bytes = COALESCE(?, output_bytes), updated_at = ?"
            " WHERE process_id = ?",
            (
                new.value,
                summarize(reason, 300) if reason else None,
                code,
                exit_code,
                output_bytes,
                now,
                process_id,
            ),
        )
        ledger.event(
            "session-" + new.value,
            process_id,
            run=row["run_id"],
            previous=old.value,
            exit_code=exit_code,
            reason=summarize(reason, 300) if reason else "",
            code=code or "",
        )
        if new is S.NEEDS_RECONCILIATION:
            run = run_store.get_run(ledger, row["run_id"])
            if run["status"] == RunStatus.RUNNING:
                run_store.set_run_status(
                    ledger,
                    row["run_id"],
                    RunStatus.NEEDS_RECONCILIATION,
                    features,
                    f"process session {process_id} needs reconciliation: {reason or 'outcome unknown'}",
                )
        updated = get_session(ledger, process_id)
        assert updated is not None
    return updated


def record_launch(ledger: Ledger, row: sqlite3.Row, mode: LaunchMode) -> None:
    """A session's launch record: committed while the trampoline waits for COMMIT_EXEC,
    so the sandbox is ready (SANDBOX_READY) and the target not executed yet (seed 004
    V1.11.1); with the launch's sandbox facts (V1.11)."""
    facts = sandbox_facts(mode)
    now = time.time()
    with ledger.tx() as db:
        db.execute(
            "UPDATE sessions SET launch_mode = ?, sandbox_mode = ?, network_access = ?, sandbox_backend = ?,"
            " sandbox_profile_version = ?, sandbox_establishment = ?, target_exec = ?, sandbox_ready_at = ?,"
            " updated_at = ? WHERE process_id = ?",
            (
                mode.value,
                facts["sandboxMode"],
                int(facts["networkAccess"]),
                facts["sandboxBackend"],
                facts["sandboxProfileVersion"],
                establishment(mode),
                TargetExec.PENDING.value,
                now,
                now,
                row["process_id"],
            ),
        )
        ledger.event("session-launched", row["process_id"], run=row["run_id"], launch_mode=mode.value)


def record_stdin(ledger: Ledger, row: sqlite3.Row, written: int, digest: str, *, eof: bool, complete: bool) -> None:
    """What was written to a session's stdin: its size and digest, never its content."""
    with ledger.tx() as db:
        db.execute(
            "UPDATE sessions SET stdin_bytes = stdin_bytes + ?, updated_at = ? WHERE process_id = ?",
            (written, time.time(), row["process_id"]),
        )
        ledger.event(
            "session-stdin",
            row["process_id"],
            run=row["run_id"],
            bytes=written,
            sha256=digest,
            eof=eof,
            complete=complete,
        )


def live_sessions(ledger: Ledger, run_id: str) -> list[sqlite3.Row]:
    """The run's sessions whose process may still be there, oldest first."""
    return ledger.all(
        f"SELECT * FROM sessions WHERE run_id = ? AND state IN ({_LIVE_SQL}) ORDER BY created_at", run_id
    )


def blockers(ledger: Ledger, run_id: str) -> list[str]:
    """Sessions that keep a run from writing its final reply."""
    rows = ledger.all(
        f"SELECT process_id, state FROM sessions WHERE run_id = ? AND (state IN ({_LIVE_SQL})"
        " OR (state = 'needs-reconciliation' AND resolved_at IS NULL)) ORDER BY created_at",
        run_id,
    )
    return [
        f"{'unresolved reconciliation of' if row['state'] == S.NEEDS_RECONCILIATION else 'live'}"
        f" process session {row['process_id']} ({row['state']})"
        for row in rows
    ]


#: The seed's capacity (V1.10): unresolved sessions per project (one home drives one
#: project: supervisor/home/project_lock.py) and per agent.
MAX_UNRESOLVED_PER_PROJECT = 4
MAX_UNRESOLVED_PER_AGENT = 2
_UNRESOLVED_SQL = f"(state IN ({_LIVE_SQL}) OR (state = 'needs-reconciliation' AND resolved_at IS NULL))"


def capacity_refusal(ledger: Ledger, agent_id: str) -> str | None:
    """Why a new session may not start now (None: it may), checked before anything
    is recorded or launched. Unresolved means live, or needing a reconciliation no
    person has settled yet; one left by an earlier boot stops every start until it is."""
    rows = ledger.all(f"SELECT process_id, agent_id, boot_id FROM sessions WHERE {_UNRESOLVED_SQL}")
    older = [row["process_id"] for row in rows if row["boot_id"] != ledger.boot_id]
    if older:
        return (f"an earlier boot left unresolved process session(s) {', '.join(older)}: settle them first"
                " (corral reconcile PROCESS_ID)")
    if len(rows) >= MAX_UNRESOLVED_PER_PROJECT:
        return f"at most {MAX_UNRESOLVED_PER_PROJECT} unresolved process sessions per project ({len(rows)} now)"
    mine = sum(1 for row in rows if row["agent_id"] == agent_id)
    if mine >= MAX_UNRESOLVED_PER_AGENT:
        return (f"at most {MAX_UNRESOLVED_PER_AGENT} unresolved process sessions per agent ({agent_id} has {mine});"
                " terminate one first")
    return None


def busy_reasons(ledger: Ledger) -> list[str]:
    rows = ledger.all(
        f"SELECT state, COUNT(*) AS n FROM sessions WHERE state IN ({_LIVE_SQL})"
        " OR (state = 'needs-reconciliation' AND resolved_at IS NULL) GROUP BY state ORDER BY state"
    )
    return [f"{row['n']} process session(s) {row['state']}" for row in rows]


def recover(ledger: Ledger, report: RecoveryReport, features: RunFeatures) -> None:
    """Unfinished sessions of older boots: reconciliation only.

    Their processes died with the old supervisor; nothing is relaunched, reconnected
    or signalled. A session still ``prepared`` waits for a person too: the actor
    commits ``launching`` before it spawns anything, but the seed asks for the
    conservative check all the same (004 V1.10: "对旧 boot 的 prepared 也采取保守核对，不用
    '理论上尚未 spawn' 作为自动重试依据").
    """
    rows = ledger.all(
        f"SELECT process_id, state, boot_id FROM sessions WHERE boot_id != ? AND state IN ({_LIVE_SQL})",
        ledger.boot_id,
    )
    for row in rows:
        move_session(
            ledger,
            row["process_id"],
            S.NEEDS_RECONCILIATION,
            features,
            reason=(
                f"the supervisor (boot {row['boot_id']}) stopped while this session was {row['state']};"
                " whatever it had started died with it and is not relaunched, reconnected or signalled"
            ),
            code="supervisor-restarted",
        )
        report.reconciliations.append(row["process_id"])


def resolve_session(ledger: Ledger, process_id: str, outcome: str, note: str, features: RunFeatures) -> str:
    """A person's verdict on a session that needs reconciliation; returns its run id."""
    if outcome not in ("ok", "failed"):
        raise BadRequest("outcome must be 'ok' or 'failed'")
    if not note.strip():
        raise BadRequest("a reconciliation needs a note saying what was checked")
    with ledger.tx() as db:
        row = get_session(ledger, process_id)
        if row is None:
            raise NotFound(f"no process session {process_id!r}")
        if row["state"] != S.NEEDS_RECONCILIATION:
            raise Conflict(f"process {process_id} is {row['state']}; only needs-reconciliation sessions are reconciled")
        if row["resolved_at"] is not None:
            raise Conflict(f"process {process_id} was already reconciled as {row['resolution']}")
        db.execute(
            "UPDATE sessions SET resolution = ?, resolution_note = ?, resolved_at = ?, updated_at = ?"
            " WHERE process_id = ?",
            (outcome, redact_text(note[:1000]), time.time(), time.time(), process_id),
        )
        ledger.event("session-reconciled", process_id, run=row["run_id"], outcome=outcome, note=summarize(note, 200))
        run_id = str(row["run_id"])
        unresolved = db.execute(
            "SELECT COUNT(*) FROM sessions WHERE run_id = ? AND state = 'needs-reconciliation' AND resolved_at IS NULL",
            (run_id,),
        ).fetchone()[0]
        if unresolved == 0:
            # Same rule as actions: the run goes back to running once nothing it waits
            # for a person on is open (reopen_run checks actions and provider requests).
            resolutions.reopen_run(ledger, run_id, features)
    return run_id


def session_view(row: sqlite3.Row) -> SessionView:
    """What the agent is answered about its session."""
    return SessionView(
        process_id=row["process_id"],
        status=row["state"],
        launch_mode=row["launch_mode"],
        exit_code=row["exit_code"],
        cursor=encode_cursor(row["process_id"], 0),
        error=row["reason"] if row["state"] in (S.FAILED, S.NEEDS_RECONCILIATION) else None,
        code=row["error_code"],
    )


def poll_transcript(path: Path, process_id: str, cursor: str | None, max_chars: int) -> tuple[str, str, bool]:
    """A poll answered from the private transcript once the actor is gone. The
    actor appended exactly the bytes its cursors count, so a cursor names the same
    chunk here as it did live."""
    try:
        offset = 0 if cursor is None else decode_cursor(cursor, process_id)
    except InvalidCursor as exc:
        raise SupervisorError(str(exc), code=exc.code) from None
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    if offset > len(data) or (offset < len(data) and data[offset] & 0xC0 == 0x80):
        raise SupervisorError("cursor is beyond the output or not on a character boundary", code=InvalidCursor.code)
    text = data[offset : offset + 4 * max_chars].decode("utf-8", errors="ignore")[:max_chars]
    end = offset + len(text.encode())
    return text, encode_cursor(process_id, end), end < len(data)


def transcript_facts(path: Path) -> tuple[int, str]:
    """The size and sha256 of a session's private transcript (its sanitized output)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    return len(data), hashlib.sha256(data).hexdigest()


# -- commands (command.exec runs in the agent; its launch record is kept here) ---------


def record_command_launch(ledger: Ledger, run_id: str, action_id: str, mode: LaunchMode, transcript: Path) -> None:
    """The durable launch record of a command, committed before COMMIT_EXEC."""
    with ledger.tx() as db:
        if db.execute("SELECT 1 FROM command_launches WHERE action_id = ?", (action_id,)).fetchone():
            # A second launch for one action would run the command twice.
            raise Conflict(f"action {action_id} already launched its command once")
        facts = sandbox_facts(mode)
        db.execute(
            "INSERT INTO command_launches (action_id, launch_mode, sandbox_mode, network_access, sandbox_backend,"
            " sandbox_profile_version, transcript, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (action_id, mode.value, facts["sandboxMode"], int(facts["networkAccess"]), facts["sandboxBackend"],
             facts["sandboxProfileVersion"], str(transcript), time.time()),
        )
        ledger.event("command-launched", action_id, run=run_id, launch_mode=mode.value)


def record_command_exit(ledger: Ledger, action_id: str, exit_code: int) -> None:
    """Inside the receipt's transaction: the command's exit code, from its result."""
    ledger.db.execute("UPDATE command_launches SET exit_code = ? WHERE action_id = ?", (exit_code, action_id))


# -- what ``show``, ``pending`` and ``status`` read ------------------------------------


def run_sessions(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    rows = ledger.all(
        "SELECT process_id, start_action_id, program, argv_summary, cwd, state, launch_mode, exit_code, reason,"
        " error_code, output_bytes, stdin_bytes, resolution, resolved_at, created_at, updated_at"
        " FROM sessions WHERE run_id = ? ORDER BY created_at",
        run_id,
    )
    return [dict(row) for row in rows]


def run_commands(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    rows = ledger.all(
        "SELECT c.action_id, c.launch_mode, c.exit_code, c.created_at FROM command_launches c"
        " JOIN actions a ON a.action_id = c.action_id WHERE a.run_id = ? ORDER BY c.created_at",
        run_id,
    )
    return [dict(row) for row in rows]


def unresolved_sessions(ledger: Ledger) -> list[dict[str, Any]]:
    """Sessions whose outcome a person must settle (``corral reconcile proc-…``)."""
    rows = ledger.all(
        "SELECT process_id, run_id, program, reason FROM sessions"
        " WHERE state = 'needs-reconciliation' AND resolved_at IS NULL ORDER BY created_at"
    )
    return [dict(row) for row in rows]


def session_counts(ledger: Ledger) -> dict[str, Any]:
    rows = ledger.all("SELECT state, COUNT(*) AS n FROM sessions GROUP BY state")
    live = ledger.all(f"SELECT process_id FROM sessions WHERE state IN ({_LIVE_SQL})")
    return {"by_state": {row["state"]: row["n"] for row in rows}, "live": [row["process_id"] for row in live]}

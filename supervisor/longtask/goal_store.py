"""Goal mode (seed 004 V1.18) in the ledger: a run bound to a goal, finished only on
the model's own verdict that the goal is met, with evidence.

The goal is the run's first task and has one row in ``goals``: its text, a
revision (bumped only by an edit of the text) and its lifecycle
(supervisor/longtask/goal_lifecycle.py). A conversation holds at most one goal
that is not terminal. Before the final reply the run needs a ``goal.verdict``
(recorded once per action id) that says *met*, gives evidence, and binds to the
goal's current revision, the run's durable plan revision and the latest
verification, and is newer than the last steer. Otherwise the final reply is
blocked and the refusal, a repair on the next loop, asks the model for that
verdict: the same runner, the same run.

A paused goal parks its run at the next safe boundary (``needs-input``) and no
provider turn of it is begun while the goal is pausing, paused or clearing (a
``provider_guards`` entry), across restarts too: the state is in the ledger.
Every function here is one transaction (or a read).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from corral.supervisor.errors import BadRequest, Conflict, NotFound, SupervisorError
from corral.supervisor.interactive import steer_store
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.longtask import goal_completion, goal_shape
from corral.supervisor.longtask.goal_lifecycle import (
    EDITABLE,
    HOLDING,
    TERMINAL,
    GoalStatus,
    check_goal_transition,
)
from corral.supervisor.runs import action_store, resolutions, run_store
from corral.supervisor.runs.action_state import ActionPhase
from corral.supervisor.runs.run_feature import RunFeatures
from corral.supervisor.runs.run_state import TERMINAL as RUN_TERMINAL
from corral.supervisor.runs.run_state import RunStatus

MAX_GOAL_CHARS = 4000
#: An edited goal reaches its run as a steer, whose text is capped at 4 KiB.
MAX_EDIT_BYTES = 3800
MAX_EVIDENCE_CHARS = 4000
PAUSED_REASON = "goal paused: corral goal resume RUN to go on"


def _now() -> float:
    return time.time()


def _goal_option(ledger: Ledger, run_id: str) -> tuple[dict[str, Any] | None, Any]:
    row = ledger.one("SELECT options, conversation_id FROM runs WHERE run_id = ?", run_id)
    if row is None:
        return None, None
    goal = json.loads(row["options"]).get("goal")
    return (goal if isinstance(goal, dict) and "text" in goal else None), row["conversation_id"]


def goal_row(ledger: Ledger, run_id: str) -> Any:
    """The run's goal row, made from the run's options the first time (a run created
    just before a crash has its goal in its options only)."""
    row = ledger.one("SELECT * FROM goals WHERE run_id = ?", run_id)
    if row is not None:
        return row
    option, conversation_id = _goal_option(ledger, run_id)
    if option is None:
        return None
    now = _now()
    goal_id = "goal-" + hashlib.sha256(run_id.encode()).hexdigest()[:20]
    with ledger.tx() as db:
        db.execute(
            "INSERT INTO goals (goal_id, run_id, conversation_id, text, revision, status, created_at, updated_at,"
            " constraints, verification) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (goal_id, run_id, conversation_id, str(option["text"]), GoalStatus.ACTIVE.value, now, now,
             json.dumps(option.get("constraints") or []), json.dumps(option.get("verification") or [])),
        )
    return ledger.one("SELECT * FROM goals WHERE run_id = ?", run_id)


def first_task(ledger: Ledger, run_id: str) -> tuple[str | None, Any]:
    """The task a goal run started with when its goal gave it (revision 1 of the
    goal, in words), else None; and the run's conversation."""
    option, conversation_id = _goal_option(ledger, run_id)
    if option is None:
        return None, conversation_id
    words = goal_shape.task_text(str(option["text"]), [str(item) for item in option.get("constraints") or []],
                                 [str(item) for item in option.get("verification") or []])
    task = ledger.one("SELECT task FROM runs WHERE run_id = ?", run_id)
    return (words if task is not None and task["task"] == words else None), conversation_id


def require_goal(ledger: Ledger, run_id: str) -> Any:
    if ledger.one("SELECT 1 FROM runs WHERE run_id = ?", run_id) is None:
        raise NotFound(f"no run {run_id!r}")
    row = goal_row(ledger, run_id)
    if row is None:
        raise Conflict(f"run {run_id} has no goal (start one with: corral run --agent AGENT --goal TEXT)")
    return row


def refuse_second_goal(ledger: Ledger, conversation_id: str | None, *, goal: bool = True) -> None:
    """One goal that is not terminal per conversation (its run still live), and no
    other run in that conversation while it is (seed 004 V1.18: the session starts
    no unrelated run; a chat line steers the goal's run; an independent task goes
    to another conversation)."""
    if conversation_id is None:
        return
    live = ledger.one(
        "SELECT g.run_id, g.status FROM goals g JOIN runs r ON r.run_id = g.run_id WHERE g.conversation_id = ?"
        " AND g.status NOT IN ('cleared', 'completed') AND r.status NOT IN ('completed', 'failed', 'cancelled')",
        conversation_id,
    )
    if live is None:
        return
    if goal:
        raise Conflict(
            f"conversation {conversation_id} already has a {live['status']} goal (run {live['run_id']});"
            f" clear it first (corral goal clear {live['run_id']}) or use another conversation"
        )
    raise Conflict(
        f"conversation {conversation_id} has a {live['status']} goal (run {live['run_id']}): no other run starts"
        f" there until it ends; steer that run (a chat line does), or start this task in another conversation"
    )


def _move(ledger: Ledger, goal: Any, new: GoalStatus, why: str) -> None:
    """One step of the lifecycle (joins the caller's transaction, if any)."""
    check_goal_transition(GoalStatus(goal["status"]), new)
    with ledger.tx() as db:
        db.execute("UPDATE goals SET status = ?, updated_at = ? WHERE goal_id = ?", (new.value, _now(),
                                                                                     goal["goal_id"]))
        ledger.event("goal-" + new.value, goal["run_id"], goal=goal["goal_id"], revision=int(goal["revision"]),
                     why=why)


def view(row: Any) -> dict[str, Any]:
    return {"goal_id": row["goal_id"], "run_id": row["run_id"], "conversation_id": row["conversation_id"],
            "text": row["text"], "constraints": goal_shape.stored_list(row["constraints"]),
            "verification": goal_shape.stored_list(row["verification"]), "revision": int(row["revision"]),
            "status": row["status"], "completion": json.loads(row["completion"]) if row["completion"] else None}


# -- the lifecycle -----------------------------------------------------------------------


def request_pause(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """``active -> pause-requested`` (a repeated request changes nothing). The
    pause commits (``paused``) only in :func:`settle_pause` or at the run's next
    boundary, each only once the run's process sessions have ended."""
    goal = require_goal(ledger, run_id)
    status = GoalStatus(goal["status"])
    if status in (GoalStatus.PAUSE_REQUESTED, GoalStatus.PAUSED):
        return view(goal)
    if status is not GoalStatus.ACTIVE:
        raise Conflict(f"the goal of run {run_id} is {status.value}; only an active goal is paused")
    with ledger.tx():
        _move(ledger, goal, GoalStatus.PAUSE_REQUESTED, "pause requested")
    ledger.failpoint("goal.after-pause-request")
    return view(goal_row(ledger, run_id))


def settle_pause(ledger: Ledger, run_id: str, *, sessions_live: bool) -> dict[str, Any]:
    """``pause-requested -> paused`` at once when the run holds no lane (parked for
    a person or a join) and none of its process sessions is live (seed 004 V1.18:
    they end before the pause commits); otherwise the run's next boundary does it."""
    goal = require_goal(ledger, run_id)
    run = ledger.one("SELECT status FROM runs WHERE run_id = ?", run_id)
    idle = run is not None and RunStatus(run["status"]) not in (RunStatus.RUNNING, RunStatus.PENDING)
    if goal["status"] == GoalStatus.PAUSE_REQUESTED and idle and not sessions_live:
        with ledger.tx():
            _move(ledger, goal, GoalStatus.PAUSED, "the run held no lane")
    return view(goal_row(ledger, run_id))


def park_at_boundary(ledger: Ledger, run_id: str, features: RunFeatures, *, sessions_live: bool) -> None:
    """A boundary hook: a pausing or paused goal parks its running run (no provider
    turn, no new action) until ``goal.resume``; a clearing one cancels it. A pause
    commits here only when no process session of the run is live; else the run
    parks and the goal stays ``pause-requested`` (``goal.pause`` again ends them)."""
    goal = ledger.one("SELECT * FROM goals WHERE run_id = ?", run_id)
    if goal is None or GoalStatus(goal["status"]) not in HOLDING:
        return
    with ledger.tx():
        if goal["status"] == GoalStatus.CLEARING:
            action_store.deny_unstarted_actions(ledger, run_id, "run cancelled: goal cleared", features)
            run_store.set_run_status(ledger, run_id, RunStatus.CANCELLED, features, "goal cleared")
            return
        if goal["status"] == GoalStatus.PAUSE_REQUESTED and not sessions_live:
            _move(ledger, goal, GoalStatus.PAUSED, "parked at a safe boundary")
        run_store.set_run_status(ledger, run_id, RunStatus.NEEDS_INPUT, features, PAUSED_REASON.replace("RUN", run_id))


def holds_provider(ledger: Ledger, run_id: str) -> str | None:
    """A provider guard: no turn of a run whose goal is pausing, paused or clearing."""
    goal = ledger.one("SELECT status FROM goals WHERE run_id = ?", run_id)
    if goal is not None and GoalStatus(goal["status"]) in HOLDING:
        return f"the run's goal is {goal['status']}: no provider turn until corral goal resume"
    return None


def resume(ledger: Ledger, run_id: str, features: RunFeatures) -> dict[str, Any]:
    """``paused -> active``; the parked run runs again (resume again is a no-op)."""
    goal = require_goal(ledger, run_id)
    status = GoalStatus(goal["status"])
    if status is GoalStatus.PAUSE_REQUESTED:
        raise Conflict(f"the goal of run {run_id} is still pausing (its run stops at its next safe boundary);"
                       " resume it once it is paused")
    if status not in (GoalStatus.PAUSED, GoalStatus.ACTIVE):
        raise Conflict(f"the goal of run {run_id} is {status.value}; only a paused goal is resumed")
    with ledger.tx() as db:
        if status is GoalStatus.PAUSED:
            _move(ledger, goal, GoalStatus.ACTIVE, "resumed")
        run = run_store.get_run(ledger, run_id)
        question = db.execute("SELECT 1 FROM input_requests WHERE run_id = ? AND answer IS NULL",
                              (run_id,)).fetchone()
        # A repeated resume completes a half-done one: the run parked by the pause moves again.
        if run["status"] == RunStatus.NEEDS_INPUT and question is None:
            run_store.set_run_status(ledger, run_id, RunStatus.RUNNING, features, "goal resumed")
    return view(goal_row(ledger, run_id))


def edit(ledger: Ledger, run_id: str, text: Any, features: RunFeatures, expected_revision: Any = None, *,
         constraints: Any = None, verification: Any = None) -> dict[str, Any]:
    """A new outcome, constraints or verification list (None: kept) bumps the revision;
    the same goal again changes nothing. ``expected_revision``: the revision the edit
    was made on; the same edit sent again after it applied changes nothing, any other
    stale revision is refused, naming the current one.

    In the transaction that bumps the revision, every action of the run that has not
    started (waiting for a person, approved, or prepared) was made for the old goal:
    it is blocked with a receipt the agent sees, never run, and the run plans again
    (a finalization prepared for the old goal is voided). The new goal is recorded
    as the run's steer (its id names the revision) in that same transaction: a
    steer refused (the run's 16 KiB of steers) refuses the whole edit. The caller
    then wakes the run."""
    goal = require_goal(ledger, run_id)
    if expected_revision is not None and (isinstance(expected_revision, bool)
                                          or not isinstance(expected_revision, int) or expected_revision < 1):
        raise BadRequest("expected_revision must be a revision number (1 or more)")
    new_text = goal["text"] if text is None else goal_shape.goal_text(text)
    new_constraints = (goal_shape.stored_list(goal["constraints"]) if constraints is None
                       else goal_shape.goal_list(constraints, "constraints"))
    new_verification = (goal_shape.stored_list(goal["verification"]) if verification is None
                        else goal_shape.goal_list(verification, "verification"))
    words = goal_shape.task_text(new_text, new_constraints, new_verification)
    if len(words.encode("utf-8", "surrogatepass")) > MAX_EDIT_BYTES:
        raise BadRequest(f"the goal with its constraints and verification is over {MAX_EDIT_BYTES} bytes (UTF-8)")
    revision = int(goal["revision"])
    same = (new_text, new_constraints, new_verification) == (
        goal["text"], goal_shape.stored_list(goal["constraints"]), goal_shape.stored_list(goal["verification"]))
    if same and expected_revision in (None, revision, revision - 1):
        # A retry of an edit that applied (its steer committed with it).
        steer = edit_steer_id(goal["goal_id"], revision) if revision > 1 else None
        return {**view(goal), "changed": False, "blocked": [], "steer_id": steer}
    if GoalStatus(goal["status"]) not in EDITABLE:
        raise Conflict(f"the goal of run {run_id} is {goal['status']}; it can no longer be edited")
    if expected_revision is not None and expected_revision != revision:
        raise Conflict(f"the goal of run {run_id} is at revision {revision}, not {expected_revision}; read it"
                       f" again (corral goal status {run_id}) and edit revision {revision}")
    final = ledger.one("SELECT phase FROM finalizations WHERE run_id = ?", run_id)
    if final is not None and final["phase"] != "prepared":
        raise Conflict(f"run {run_id} has written its final reply; its goal can no longer be edited")
    new_revision = revision + 1
    with ledger.tx() as db:
        moved = db.execute(
            "UPDATE goals SET text = ?, constraints = ?, verification = ?, revision = ?, updated_at = ?"
            " WHERE goal_id = ? AND revision = ?",
            (new_text, json.dumps(new_constraints), json.dumps(new_verification), new_revision, _now(),
             goal["goal_id"], revision),
        ).rowcount
        if not moved:  # another edit committed since the read: this one was made on a stale revision
            raise Conflict(f"the goal of run {run_id} was edited meanwhile; read it again (corral goal status"
                           f" {run_id})")
        if final is not None:
            db.execute("DELETE FROM finalizations WHERE run_id = ? AND phase = 'prepared'", (run_id,))
            ledger.event("finalization-invalidated", run_id, why="goal edited")
        blocked = _block_unstarted(ledger, run_id, revision, new_revision, features)
        resolutions.reopen_run(ledger, run_id, features)  # nothing of the old goal waits for a person now
        ledger.event("goal-edited", run_id, goal=goal["goal_id"], revision=new_revision, blocked=len(blocked),
                     sha256=hashlib.sha256(words.encode()).hexdigest(), chars=len(words))
        # The run's re-planning signal commits with the revision, or neither does
        # (seed 004 V1.18): never a revision the run was not told of.
        steer = _edit_steer(ledger, goal["goal_id"], run_id, new_revision, words, features)
    return {**view(goal_row(ledger, run_id)), "changed": True, "blocked": blocked, "steer_id": steer}


def edit_steer_id(goal_id: str, revision: int) -> str:
    """The id of the steer that tells the run of ``revision``: an edit sent again finds it."""
    return f"goal-{hashlib.sha256(goal_id.encode()).hexdigest()[:16]}-r{revision}"


def _edit_steer(ledger: Ledger, goal_id: str, run_id: str, revision: int, words: str, features: RunFeatures) -> str:
    """Records the edit's steer in the caller's transaction; a refusal (the run's
    steer budget, say) refuses the whole edit, so nothing of it commits."""
    text = f"The goal was edited (revision {revision}); it is now: {words}"
    try:
        steer_store.record_steer(ledger, run_id, text, features, edit_steer_id(goal_id, revision))
    except SupervisorError as exc:
        raise Conflict(f"the goal edit was refused whole, nothing was changed (the goal stays at revision"
                       f" {revision - 1}): {exc}") from None
    return edit_steer_id(goal_id, revision)


def _block_unstarted(ledger: Ledger, run_id: str, old: int, new: int, features: RunFeatures) -> list[str]:
    """The run's actions not started and not bound to revision ``new`` (all of them,
    as that revision is being written; an unbound one too: a missing binding is never
    guessed) end with a receipt saying the goal changed. Joins the caller's transaction."""
    rows = ledger.all(
        "SELECT * FROM actions WHERE run_id = ? AND phase IN ('prepared', 'waiting-confirmation', 'approved')"
        " ORDER BY loop_index, action_index",
        run_id,
    )
    why = goal_shape.blocked_reason(old, new)
    for row in rows:
        # An approved action may only fail (the action table has no approved -> denied).
        ending = ActionPhase.FAILED if row["phase"] == ActionPhase.APPROVED else ActionPhase.DENIED
        written = action_store.move_action(ledger, row["action_id"], ending, current=row, reason=why, error=why)
        action_store.write_receipt(ledger, row["action_id"], features,
                                   note=f"blocked: goal edited to revision {new}", current={**dict(row), **written})
    return [str(row["action_id"]) for row in rows]


def begin_clear(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """``-> clearing``; the caller cancels the run, whose end settles it ``cleared``."""
    goal = require_goal(ledger, run_id)
    status = GoalStatus(goal["status"])
    if status in TERMINAL or status is GoalStatus.CLEARING:
        return view(goal)
    with ledger.tx():
        _move(ledger, goal, GoalStatus.CLEARING, "cleared by the user")
    return view(goal_row(ledger, run_id))


def on_run_status(ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
    """A status hook: a completed run completes its active goal; a run that ends
    otherwise clears it (a clearing goal is cleared once its run is cancelled)."""
    if status not in RUN_TERMINAL:
        return
    goal = ledger.one("SELECT * FROM goals WHERE run_id = ?", run_id)
    if goal is None or GoalStatus(goal["status"]) in TERMINAL:
        return
    current = GoalStatus(goal["status"])
    if status is RunStatus.COMPLETED and current is GoalStatus.ACTIVE:
        # From the run's finalization record (its goal snapshot and the system's
        # evidence), in the transaction that completes the run.
        completion = goal_completion.evidence(ledger, run_id, _now())
        with ledger.tx() as db:
            db.execute("UPDATE goals SET completion = ? WHERE goal_id = ?", (json.dumps(completion, sort_keys=True),
                                                                            goal["goal_id"]))
            _move(ledger, goal, GoalStatus.COMPLETED, "its run's finalization record")
        return
    if current is not GoalStatus.CLEARING:
        _move(ledger, goal, GoalStatus.CLEARING, f"its run ended {status.value}")
        goal = ledger.one("SELECT * FROM goals WHERE run_id = ?", run_id)
    _move(ledger, goal, GoalStatus.CLEARED, f"its run ended {status.value}")


# -- verdicts and the completion gate ------------------------------------------------------


def goal_of(ledger: Ledger, run_id: str) -> str | None:
    row = goal_row(ledger, run_id)
    return str(row["text"]) if row is not None else None


def evidence_binding(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """What a verdict binds to now: the goal revision, the durable plan revision and
    the latest verification (none: None)."""
    from corral.supervisor.longtask import plan_store
    from corral.supervisor.project import verification_store

    goal = goal_row(ledger, run_id)
    latest = verification_store.latest(ledger)
    return {
        "goal_revision": int(goal["revision"]) if goal is not None else None,
        "plan_revision": int(plan_store.current(ledger, run_id)["revision"]),
        "verification_id": latest["action_id"] if latest is not None else None,
    }


def record_verdict(ledger: Ledger, run_id: str, action_id: str, met: bool, evidence: str) -> dict[str, Any]:
    binding = evidence_binding(ledger, run_id)
    with ledger.tx() as db:
        done = db.execute("SELECT * FROM goal_verdicts WHERE action_id = ?", (action_id,)).fetchone()
        if done is None:
            db.execute(
                "INSERT INTO goal_verdicts (action_id, run_id, met, evidence, created_at, goal_revision,"
                " plan_revision, verification_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (action_id, run_id, int(met), evidence, _now(), binding["goal_revision"], binding["plan_revision"],
                 binding["verification_id"]),
            )
            ledger.event("goal-verdict", run_id, met=met, revision=binding["goal_revision"] or 0)
            done = db.execute("SELECT * FROM goal_verdicts WHERE action_id = ?", (action_id,)).fetchone()
    return _verdict(done)


def _verdict(row: Any) -> dict[str, Any]:
    return {"action_id": row["action_id"], "met": bool(row["met"]), "evidence": row["evidence"],
            "at": row["created_at"], "goal_revision": row["goal_revision"], "plan_revision": row["plan_revision"],
            "verification_id": row["verification_id"]}


def verdicts(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    rows = ledger.all("SELECT * FROM goal_verdicts WHERE run_id = ? ORDER BY created_at, rowid", run_id)
    return [_verdict(row) for row in rows]


def refinements(ledger: Ledger, run_id: str) -> list[dict[str, Any]]:
    """The user's steers of a goal run (an edit of the goal is one too): they refine it."""
    rows = ledger.all("SELECT text, created_at, applied_at FROM steers WHERE run_id = ? ORDER BY created_at", run_id)
    return [dict(row) for row in rows]


def blockers(ledger: Ledger, run_id: str) -> list[str]:
    goal = goal_row(ledger, run_id)
    if goal is None:
        return []
    if goal["status"] == GoalStatus.COMPLETED:
        return []
    if goal["status"] != GoalStatus.ACTIVE:
        return [f"the goal is {goal['status']}: no final reply until it is active again"]
    found = verdicts(ledger, run_id)
    if not found:
        return [f"this run has a goal ({goal['text'][:120]!r}): judge it first with goal.verdict (met, evidence)"]
    latest = found[-1]
    now = evidence_binding(ledger, run_id)
    if latest["goal_revision"] is not None and latest["goal_revision"] != now["goal_revision"]:
        return [f"the goal was edited (revision {now['goal_revision']}) after your verdict on revision"
                f" {latest['goal_revision']}: judge the current goal with goal.verdict"]
    refined = [r for r in refinements(ledger, run_id) if r["created_at"] > latest["at"]]
    if refined:
        return ["the user refined the goal after your last verdict: judge it again with goal.verdict"]
    if not latest["met"]:
        return [f"your last goal verdict says the goal is not met ({latest['evidence'][:120]!r})"]
    if latest["plan_revision"] is not None and latest["plan_revision"] != now["plan_revision"]:
        return ["the plan changed after your verdict: judge the goal again with goal.verdict"]
    if latest["verification_id"] != now["verification_id"] and now["verification_id"] is not None:
        return ["a verification ran after your verdict: judge the goal again with goal.verdict"]
    return []


def status(ledger: Ledger, run_id: str) -> dict[str, Any]:
    from corral.supervisor.longtask import plan_store

    row = ledger.one("SELECT status FROM runs WHERE run_id = ?", run_id)
    goal = goal_row(ledger, run_id)
    return {
        "run_id": run_id,
        "status": row["status"] if row else None,
        "goal": goal["text"] if goal is not None else None,
        "lifecycle": view(goal) if goal is not None else None,
        "refinements": refinements(ledger, run_id),
        "plan": plan_store.current(ledger, run_id),
        "verdicts": verdicts(ledger, run_id),
        "blockers": blockers(ledger, run_id),
    }

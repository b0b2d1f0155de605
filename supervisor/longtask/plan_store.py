"""A run's durable plan (seed 004 V1.17): an explanation and 1 to 8 steps, each a
distinct title with a status (pending, in_progress or completed, at most one
in_progress), and a revision.

Updates come from the model's answers (``planUpdate`` beside the actions, or
``update_agent_plan`` with native calls: actors/providers/plan_update.py), applied
when the answer's plan commits, once per loop, so a replay after a crash returns
the same revision. It is no tool action. An update lists
the plan as it should now be: a completed step never goes back, and one the update
leaves out is merged back where it stood; unfinished steps may be renamed,
reordered or left out. An update that changes nothing keeps the revision; a refused
one changes nothing. A run whose plan has a step not completed cannot finalize.
"""

from __future__ import annotations

import enum
import json
import time
from typing import Any

from corral.actors.providers.plan_update import MAX_EXPLANATION_CHARS, MAX_STEPS, MAX_TITLE_CHARS
from corral.supervisor.errors import BadRequest
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.run_store import add_observation


class StepStatus(enum.StrEnum):
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


#: The statuses of plans written before the seed's rules (read back, never accepted).
_LEGACY_STATUS = {"done": StepStatus.COMPLETED, "in_progress": StepStatus.IN_PROGRESS}


class PlanRefused(BadRequest):
    """An update that breaks the plan's rules (the model sees why, as the tool's error)."""


def _checked(changes: Any) -> list[dict[str, str]]:
    """The update's steps, each checked on its own (pure)."""
    if not isinstance(changes, list) or not 1 <= len(changes) <= MAX_STEPS:
        raise PlanRefused(f"a plan has 1 to {MAX_STEPS} steps")
    steps: list[dict[str, str]] = []
    for n, change in enumerate(changes, 1):
        title = change.get("step") if isinstance(change, dict) else None
        if not isinstance(title, str) or not title.strip() or len(title) > MAX_TITLE_CHARS:
            raise PlanRefused(f"step {n} needs a title of 1 to {MAX_TITLE_CHARS} characters")
        status = change.get("status", StepStatus.PENDING.value)
        if status not in StepStatus.__members__.values():
            raise PlanRefused(f"step {n} ({title}): the status is pending, in_progress or completed, not {status!r}")
        steps.append({"step": title.strip(), "status": str(status)})
    return steps


def merge(steps: list[dict[str, str]], explanation: Any, changes: Any) -> list[dict[str, str]]:
    """The plan after an update (pure): the update's steps, with each completed step
    it leaves out merged back where it stood. Raises ``PlanRefused`` on a rule broken."""
    if not isinstance(explanation, str) or not explanation.strip() or len(explanation) > MAX_EXPLANATION_CHARS:
        raise PlanRefused(f"the update needs an explanation of 1 to {MAX_EXPLANATION_CHARS} characters")
    update = _checked(changes)
    titles = [step["step"] for step in update]
    twice = sorted({title for title in titles if titles.count(title) > 1})
    if twice:
        raise PlanRefused(f"a step title is given twice: {twice[0]!r}")
    if sum(step["status"] == StepStatus.IN_PROGRESS for step in update) > 1:
        raise PlanRefused("at most one step in_progress at a time")
    given = {step["step"]: step for step in update}
    merged = list(update)
    for index, old in enumerate(steps):
        if old["status"] != StepStatus.COMPLETED:
            continue
        now = given.get(old["step"])
        if now is None:
            merged.insert(min(index, len(merged)), dict(old))
        elif now["status"] != StepStatus.COMPLETED:
            raise PlanRefused(f"step {old['step']!r} is completed and cannot go back to {now['status']}")
    if len(merged) > MAX_STEPS:
        raise PlanRefused(f"a plan has 1 to {MAX_STEPS} steps ({len(merged)} with the completed steps kept)")
    return merged


def active_index(steps: list[dict[str, str]]) -> int | None:
    """The index of the one in_progress step, if any."""
    return next((n for n, step in enumerate(steps) if step["status"] == StepStatus.IN_PROGRESS), None)


def _legacy(steps: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The steps as stored. A plan stored before the seed's rules (an id, a text and
    five statuses) reads as titles and the seed's statuses; a dropped step is left out."""
    read: list[dict[str, str]] = []
    for step in steps:
        if "step" in step:
            read.append({"step": str(step["step"]), "status": str(step["status"])})
        elif step.get("status") != "dropped":
            status = _LEGACY_STATUS.get(str(step.get("status")), StepStatus.PENDING)
            read.append({"step": str(step.get("text") or step.get("id")), "status": str(status)})
    return read


def _view(revision: int, explanation: str, steps: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "revision": revision,
        "explanation": explanation,
        "steps": steps,
        "active_index": active_index(steps),
        "unfinished": [n for n, step in enumerate(steps, 1) if step["status"] != StepStatus.COMPLETED],
    }


def current(ledger: Ledger, run_id: str) -> dict[str, Any]:
    row = ledger.one("SELECT revision, explanation, steps FROM run_plans WHERE run_id = ?", run_id)
    if row is None:
        return _view(0, "", [])
    return _view(int(row["revision"]), row["explanation"] or "", _legacy(json.loads(row["steps"])))


def check(ledger: Ledger, run_id: str, loop: int, explanation: Any, changes: Any) -> None:
    """Raises ``PlanRefused`` when the update of loop ``loop`` breaks a rule against
    the plan as it stands (pure but for the read). Applied already (a replay after a
    crash), it passes: the stored result stands."""
    if ledger.one("SELECT 1 FROM plan_updates WHERE action_id = ?", update_key(run_id, loop)) is None:
        merge(current(ledger, run_id)["steps"], explanation, changes)


def update_key(run_id: str, loop: int) -> str:
    """The once-only key of a loop's update (the table's ``action_id`` column: the
    key was the ``plan.update`` action's id when the update was a tool)."""
    return f"{run_id}:plan:{loop}"


def apply(ledger: Ledger, run_id: str, loop: int, explanation: Any, changes: Any) -> dict[str, Any]:
    """Apply loop ``loop``'s update once: a replay returns the stored result. An
    update that leaves the plan as it was keeps its revision; a refused one raises
    before anything is written. The plan as it now stands goes into the run's
    context in the same transaction (the model's next turn sees it)."""
    action_id = update_key(run_id, loop)
    with ledger.tx() as db:
        done = db.execute("SELECT result FROM plan_updates WHERE action_id = ?", (action_id,)).fetchone()
        if done is not None:
            result: dict[str, Any] = json.loads(done["result"])
            return result
        plan = current(ledger, run_id)
        steps = merge(plan["steps"], explanation, changes)
        explanation = explanation.strip()
        same = steps == plan["steps"] and explanation == plan["explanation"]
        revision = plan["revision"] if same else plan["revision"] + 1
        now = time.time()
        if not same:
            db.execute(
                "INSERT INTO run_plans (run_id, revision, explanation, steps, updated_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (run_id) DO UPDATE SET revision = excluded.revision,"
                " explanation = excluded.explanation, steps = excluded.steps, updated_at = excluded.updated_at",
                (run_id, revision, explanation, json.dumps(steps), now),
            )
        result = _view(revision, explanation, steps)
        db.execute(
            "INSERT INTO plan_updates (action_id, run_id, revision, result, created_at) VALUES (?, ?, ?, ?, ?)",
            (action_id, run_id, revision, json.dumps(result), now),
        )
        if not same:
            # Counts and step numbers only: the public record keeps no title (V1.17).
            upcoming = next((n for n, step in enumerate(steps, 1) if step["status"] == StepStatus.PENDING), None)
            active = result["active_index"]
            ledger.event("plan-updated", run_id, revision=revision, unfinished=len(result["unfinished"]),
                         steps=len(steps), completed=len(steps) - len(result["unfinished"]),
                         active=None if active is None else active + 1, next=upcoming)
        add_observation(ledger, run_id, action_id, loop, {"role": "plan", **result})
    return result


def blockers(ledger: Ledger, run_id: str) -> list[str]:
    """A final reply waits for every step to be completed. Steps go by number, never
    by title: the reasons reach the public ``final-blocked`` event, where the seed
    keeps no title (V1.17: "步骤标题的 SHA-256、状态和数量"); the model reads the
    titles in its plan, which is in its context."""
    steps = current(ledger, run_id)["steps"]
    return [
        f"plan step {n} of {len(steps)} is {step['status']} (complete it, or plan again without it)"
        for n, step in enumerate(steps, 1)
        if step["status"] != StepStatus.COMPLETED
    ]

"""Goal mode on the supervisor (supervisor/longtask/goal_store.py, seed 004 V1.18):
``goal.verdict`` for the agent's tool, the completion gate, and the goal's
lifecycle for people: ``goal.status``, ``goal.pause``, ``goal.resume``,
``goal.edit`` and ``goal.clear``.

A pause interrupts the provider turn in flight the way a steer does
(supervisor/interactive/steer_control.py); an edit bumps the goal's revision and
reaches the run as a steer whose id names the revision, recorded in the edit's
own transaction (an edit the steer budget refuses is refused whole); a clear
cancels the run. Every provider turn of a goal run carries the current goal from
the goal store (goal_shape.durable_context), so compaction folding the edit's
steer never leaves the model an older revision.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from corral.mailbox.protocol import GoalVerdict, Verdict
from corral.mailbox.steps import CompactStep, ProviderStep
from corral.supervisor.errors import BadRequest, NotFound
from corral.supervisor.interactive.steer_control import SteerControl
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.longtask import goal_completion, goal_shape, goal_store
from corral.supervisor.longtask.goal_lifecycle import GoalStatus
from corral.supervisor.params import param_str
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.runs.run_state import TERMINAL, RunStatus

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree.supervision_tree import ActorSlot


class RunSessions(Protocol):
    """The run's process sessions, as a pause needs them (supervisor/sessions/)."""

    def live_sessions(self, run_id: str) -> list[str]: ...

    async def end_run_sessions(self, run_id: str) -> list[str]: ...


class GoalService:
    def __init__(self, ledger: Ledger, runs: RunService, sessions: RunSessions) -> None:
        self.ledger = ledger
        #: A pause ends the run's process sessions before it commits (seed 004 V1.18).
        self.sessions = sessions
        #: Finds the run and the ``goal.verdict`` action a verdict is for; cancels, wakes.
        self.runs = runs
        #: The steer path: an edit is a steer, a pause interrupts like one.
        self.steers = SteerControl(ledger, runs)

    async def verdict(self, slot: ActorSlot, request: GoalVerdict) -> Verdict:
        run_id = request.run_id
        action = self.runs.tool_action(slot, run_id, request.action_id, "goal.verdict")
        if goal_store.goal_of(self.ledger, run_id) is None:
            raise BadRequest(f"run {run_id} has no goal (start it with corral run --goal)")
        met, evidence = request.met, request.evidence
        if not evidence.strip() or len(evidence) > goal_store.MAX_EVIDENCE_CHARS:
            raise BadRequest(f"evidence must be 1 to {goal_store.MAX_EVIDENCE_CHARS} characters")
        return Verdict(**goal_store.record_verdict(self.ledger, run_id, action["action_id"], met, evidence.strip()))

    async def status(self, params: dict[str, Any]) -> dict[str, Any]:
        run_id = param_str(params, "run_id", limit=64)
        if self.ledger.one("SELECT 1 FROM runs WHERE run_id = ?", run_id) is None:
            raise NotFound(f"no run {run_id!r}")  # a run without a goal answers, with goal None
        return goal_store.status(self.ledger, run_id)

    async def pause(self, params: dict[str, Any]) -> dict[str, Any]:
        """Pause requested (committed), then the provider turn in flight interrupted
        and the run's process sessions terminated; only then does the pause commit
        (``paused``): at once when the run holds no lane, else at its next safe
        boundary. It makes no provider call until resumed. Asked again while
        ``pause-requested``, it ends what is still live and settles again."""
        run_id = param_str(params, "run_id", limit=64)
        goal = goal_store.request_pause(self.ledger, run_id)
        interrupted = None
        terminated: list[str] = []
        if goal["status"] == GoalStatus.PAUSE_REQUESTED:
            interrupted = await self.steers.interrupt_in_flight(run_id)
            terminated = await self.sessions.end_run_sessions(run_id)
            goal = goal_store.settle_pause(self.ledger, run_id,
                                           sessions_live=bool(self.sessions.live_sessions(run_id)))
            if goal["status"] == GoalStatus.PAUSE_REQUESTED:
                await self.runs.wake_run(run_id)
        return {**goal, "interrupted": interrupted, "terminated_sessions": terminated}

    async def resume(self, params: dict[str, Any]) -> dict[str, Any]:
        run_id = param_str(params, "run_id", limit=64)
        goal = goal_store.resume(self.ledger, run_id, self.runs.features)
        await self.runs.wake_run(run_id)
        return goal

    async def edit(self, params: dict[str, Any]) -> dict[str, Any]:
        """A new goal text: the revision and its steer (the new goal, its id derived
        from the goal and revision) commit in one transaction, or the edit is refused
        whole; then the provider turn in flight is interrupted and the run woken (an
        edit sent again, after a crash, wakes it too)."""
        run_id = param_str(params, "run_id", limit=64)
        if all(params.get(key) is None for key in ("text", "constraints", "verification")):
            raise BadRequest("an edit gives the goal's new text, constraints or verification")
        goal = goal_store.edit(self.ledger, run_id, params.get("text"), self.runs.features,
                               params.get("expected_revision"), constraints=params.get("constraints"),
                               verification=params.get("verification"))
        if goal["changed"]:
            await self.steers.interrupt_in_flight(run_id)
        await self.runs.wake_run(run_id)
        return goal

    async def clear(self, params: dict[str, Any]) -> dict[str, Any]:
        """``-> clearing``, then the run is cancelled (its end settles the goal
        ``cleared``); conversations, runs and events are kept."""
        run_id = param_str(params, "run_id", limit=64)
        goal = goal_store.begin_clear(self.ledger, run_id)
        run = self.ledger.one("SELECT status FROM runs WHERE run_id = ?", run_id)
        if goal["status"] == GoalStatus.CLEARING and run is not None and RunStatus(run["status"]) not in TERMINAL:
            await self.steers.interrupt_in_flight(run_id)
            await self.runs.cancel({"run_id": run_id, "reason": "goal cleared"})
        return goal_store.view(goal_store.require_goal(self.ledger, run_id))

    def show_section(self, run_id: str) -> dict[str, Any]:
        row = goal_store.goal_row(self.ledger, run_id)
        return {"goal": row["text"] if row is not None else None,
                "lifecycle": goal_store.view(row) if row is not None else None,
                "verdicts": goal_store.verdicts(self.ledger, run_id)}


class GoalFeature(RunFeature):
    """Goal mode in runs: a goal starts a run as its first task and its lifecycle
    row; a paused goal parks the run at the boundary and holds its provider turns;
    an action or a final reply made for an older revision never takes effect; the
    goal holds the final reply until it is met; ``show`` shows it."""

    def __init__(self, service: GoalService) -> None:
        self.service = service

    def start_task(self, params: Mapping[str, Any]) -> str | None:
        goal = params.get("goal")
        return None if goal is None else goal_shape.task_text(*goal_shape.goal_param(goal))

    def start_check(self, ledger: Ledger, params: Mapping[str, Any]) -> None:
        conversation_id = params.get("conversation_id")
        # One live goal per conversation, and no other run beside it there.
        goal_store.refuse_second_goal(ledger, conversation_id if isinstance(conversation_id, str) else None,
                                      goal=params.get("goal") is not None)

    def start_options(self, ledger: Ledger, params: Mapping[str, Any]) -> dict[str, Any]:
        if params.get("goal") is None:
            return {}
        text, constraints, verification = goal_shape.goal_param(params["goal"])
        return {"goal": {"text": text, "constraints": constraints, "verification": verification}}

    async def shape_provider(self, run_id: str, step: ProviderStep) -> ProviderStep | CompactStep:
        """Every provider turn of a goal run (its planning and its final reply) leads
        with the current goal as the goal store holds it (seed 004 V1.18: "Goal 内容进入
        每轮 planning/final reply 的显式'持久目标'上下文"). It is the task, which compaction
        never folds; the revision-1 text the run started with gives way to it."""
        ledger = self.service.ledger
        goal = goal_store.goal_row(ledger, run_id)
        if goal is None:
            return step
        first, _ = goal_store.first_task(ledger, run_id)
        rest = step.task[len(first):] if first is not None and step.task.startswith(first) else step.task
        context = goal_shape.durable_context(goal_store.view(goal))
        return msgspec.structs.replace(step, task=context + ("\n\n" + rest.strip("\n") if rest.strip() else ""))

    def started(self, ledger: Ledger, run_id: str, options: Mapping[str, Any]) -> None:
        if "goal" in options:
            goal_store.goal_row(ledger, run_id)  # its lifecycle row (made from the options if lost here)

    def stale_action(self, ledger: Ledger, row: Any) -> tuple[str, str] | None:
        goal = ledger.one("SELECT revision FROM goals WHERE goal_id = ?", row["goal_id"])
        if goal is None or int(goal["revision"]) == int(row["goal_revision"] or 0):
            return None
        why = goal_shape.blocked_reason(int(row["goal_revision"] or 0), int(goal["revision"]))
        return why, f"blocked: goal edited to revision {goal['revision']}"

    def final_snapshot(self, ledger: Ledger, run_id: str, reply: str) -> str | None:
        return goal_completion.snapshot(ledger, run_id, reply)

    def final_stale(self, ledger: Ledger, run_id: str, snapshot: str | None) -> str | None:
        return goal_completion.stale(ledger, run_id, snapshot)

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        return goal_store.blockers(ledger, run_id)

    def at_boundary(self, ledger: Ledger, run_id: str) -> None:
        goal_store.park_at_boundary(ledger, run_id, self.service.runs.features,
                                    sessions_live=bool(self.service.sessions.live_sessions(run_id)))

    def provider_guard(self, ledger: Ledger, run_id: str) -> str | None:
        return goal_store.holds_provider(ledger, run_id)

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        goal_store.on_run_status(ledger, run_id, status, reason)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"goal": self.service.show_section(run_id)}


def install(sup: Supervisor) -> GoalService:
    service = GoalService(sup.ledger, sup.runs, sup.sessions)
    sup.methods.goals = service
    sup.control_methods.update(
        {
            "goal.status": service.status,
            "goal.pause": service.pause,
            "goal.resume": service.resume,
            "goal.edit": service.edit,
            "goal.clear": service.clear,
        }
    )
    return service

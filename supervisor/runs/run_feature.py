"""What a feature may add to a run, as one object per feature, and the one order
in which the run layer asks them.

A feature (swarm, sessions, intent, MCP, a goal, ...) is a :class:`RunFeature`:
it overrides the methods that apply to it, and every other one is the base's
no-op. The supervisor builds one :class:`RunFeatures` from a list of them, once
(supervisor/daemon.py ``_assemble`` writes the list and why it is in that order),
and the run layer calls each method on every feature that overrides it, in the
list's order. Nothing registers itself anywhere: reading the list is reading
what runs, and in which order.

Most methods run inside the run store's own transactions (a status change, a
receipt, a step boundary): they take the ledger and commit nothing of their own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from corral.mailbox.protocol import ActionPrepare, ClaimedRun
    from corral.mailbox.steps import CompactStep, DoneStep, ParkStep, ProviderStep
    from corral.supervisor.ledger.port import Ledger
    from corral.supervisor.runs.recovery import RecoveryReport
    from corral.supervisor.runs.run_state import RunStatus
    from corral.supervisor.tree.supervision_tree import ActorSlot


class ClaimRefused(Exception):
    """A run that may not plan at all (a required MCP server it cannot have): its
    claim fails it, before any provider turn, with this reason."""


class PlanRefusal(NamedTuple):
    """A plan guard's refusal: one of seed 004's repair categories (V1.33) and the
    guard's own rule, which the refusal's event and observation name too (a bare
    reason is the collaboration policy's: ``batch-constraint``,
    ``collaboration-policy``)."""

    category: str
    reason: str
    rule: str = ""


class Placed(NamedTuple):
    """Where a new root run goes: ``reply`` when it waits in the cluster's shared
    queue (None: this node creates it now, keeping ``options`` with it)."""

    reply: dict[str, Any] | None
    options: dict[str, Any]


class RunFeature:
    """A feature's part in runs. Every method here does nothing (or lets be): a
    feature overrides those that apply to it, and only those are called."""

    # -- starting a run ---------------------------------------------------------

    def start_task(self, params: Mapping[str, Any]) -> str | None:
        """Checked first when a run is asked for: the task the run starts with
        when the caller gave none (a goal's text), else None. May refuse (BadRequest)."""
        return None

    def start_check(self, ledger: Ledger, params: Mapping[str, Any]) -> None:
        """Before a new run is placed anywhere: may refuse it (a second live goal
        in one conversation)."""

    def place_run(self, run_id: str | None, agent_id: str, params: dict[str, Any]) -> Placed | None:
        """Where a new root run goes (a cluster's shared queue), or None: not this
        feature's to say. At most one feature places runs."""
        return None

    def start_options(self, ledger: Ledger, params: Mapping[str, Any]) -> dict[str, Any]:
        """Just before a new run is written on this node: what this feature keeps
        with its options (an intent's binding, a goal)."""
        return {}

    def started(self, ledger: Ledger, run_id: str, options: Mapping[str, Any]) -> None:
        """Just after a new run was written, with the options it was written with."""

    async def on_claim(self, claimed: ClaimedRun) -> None:
        """Adds to the run an agent just claimed (an MCP catalog): mutates ``claimed``;
        raises ``ClaimRefused`` when the run cannot plan at all (then it fails, unplanned)."""

    # -- each step ----------------------------------------------------------------

    def at_boundary(self, ledger: Ledger, run_id: str) -> None:
        """At the top of every step of a running run, before the plan is read. It
        may change the loop (a user's steer discards a stale plan)."""

    def loop_blocker(self, ledger: Ledger, run_id: str) -> ParkStep | None:
        """May hold a loop whose plan is done (a join to wait for): the park step."""
        return None

    def provider_guard(self, ledger: Ledger, run_id: str) -> str | None:
        """Checked before a provider turn is begun (a steer to apply first, a goal
        pausing): a reason, or None. A lost turn with a reason is interrupted."""
        return None

    async def shape_provider(
        self, run_id: str, step: ProviderStep
    ) -> ProviderStep | CompactStep | DoneStep | ParkStep:
        """Shapes a provider step: its view of the history, or a compaction first (or
        the run's end, when it failed closed: a request known to be over its limit; or
        a park, when a compaction request was lost unsure)."""
        return step

    def plan_guard(self, run: Any, loop: int, plan: dict[str, Any]) -> str | PlanRefusal | None:
        """A plan before it commits: a reason to refuse it, or None."""
        return None

    def plan_committing(self, ledger: Ledger, run_id: str, loop: int, plan: dict[str, Any]) -> PlanRefusal | None:
        """A fresh plan passed every guard and is about to commit, as the ledger keeps
        it (redacted): what it carries beside its actions is applied now (the model's
        plan update), once per loop, or the plan is refused and nothing is applied."""
        return None

    def prepare_route(self, slot: ActorSlot, request: ActionPrepare) -> Any:
        """Prepares a tool corral's registry does not hold (an MCP server's): the
        action's row, or None (not this feature's tool)."""
        return None

    def action_guard(self, run: Any, action_id: str, tool: str, tool_input: dict[str, Any]) -> tuple[str, str]:
        """Every proposed action, before it is prepared: ("continue" | "ask" |
        "block", reason). A guard may only tighten."""
        return "continue", ""

    def tool_effect(self, ledger: Ledger, run_id: str, tool: str) -> str | None:
        """The effect class of a tool this feature provides to the run (an MCP
        server's, from the run's pinned catalog), or None: not its tool."""
        return None

    def stale_action(self, ledger: Ledger, row: Any) -> tuple[str, str] | None:
        """Checked as an action begins: (why, receipt note) when it was made for a
        state this feature has moved on from (an older goal) and must never start."""
        return None

    # -- inside the run store's transactions --------------------------------------

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        """Inside the transaction of every run status change."""

    def on_receipt(self, ledger: Ledger, row: Any) -> None:
        """Inside the transaction that writes a receipt and its observation: the action's row."""

    # -- the final reply ----------------------------------------------------------

    def final_guard(self, ledger: Ledger, run_id: str) -> str | None:
        """Checked before a final reply is even staged (a pending steer): a reason, or None."""
        return None

    async def finalize_hold(self, run: Any) -> None:
        """Before ``run.finalize`` judges the blockers: may wait a while (a session about to exit)."""

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        """Why the run may not finalize yet (none: it may)."""
        return []

    def finalize_park(self, ledger: Ledger, run_id: str, reasons: list[str]) -> str | None:
        """A blocked finalization that should park for a person rather than cost a
        repair turn: why, or None."""
        return None

    def final_snapshot(self, ledger: Ledger, run_id: str, reply: str) -> str | None:
        """What a prepared final reply is bound to (a goal and its evidence), kept
        with its journal; None: nothing. At most one feature binds it."""
        return None

    def final_stale(self, ledger: Ledger, run_id: str, snapshot: str | None) -> str | None:
        """Why a prepared final reply bound to ``snapshot`` must not be written now
        (its goal changed since), or None."""
        return None

    # -- people, recovery, views ----------------------------------------------------

    def on_decision(self, params: dict[str, Any]) -> None:
        """After a person's decision on an action (``continue_action``)."""

    async def reconcile(self, target: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """``reconcile`` of ``target``: this feature's answer when the id is its own
        (a process session's, another partition's), else None."""
        return None

    def recover(self, ledger: Ledger, report: RecoveryReport) -> None:
        """One more step of recovery at boot, after the run layer's own."""

    def show(self, run_id: str) -> Mapping[str, Any]:
        """This feature's sections of ``corral show`` for one run, by name."""
        return {}

    def pending(self) -> Mapping[str, Any]:
        """This feature's sections of ``corral pending``, by name."""
        return {}


def _overriding(features: Sequence[RunFeature], base: Callable[..., Any]) -> tuple[Any, ...]:
    """The bound ``base`` method of each feature that overrides it, in order: the
    base's no-ops are never called (a step passes a dozen of these points)."""
    name = base.__name__
    return tuple(getattr(feature, name) for feature in features if getattr(type(feature), name) is not base)


# What the run layer calls, as bound to one feature (the methods above, less ``self``).
StartTask = Callable[[Mapping[str, Any]], "str | None"]
StartCheck = Callable[["Ledger", Mapping[str, Any]], None]
RunPlacer = Callable[["str | None", str, dict[str, Any]], "Placed | None"]
StartOptions = Callable[["Ledger", Mapping[str, Any]], dict[str, Any]]
Started = Callable[["Ledger", str, Mapping[str, Any]], None]
ClaimHook = Callable[["ClaimedRun"], Awaitable[None]]
BoundaryCheck = Callable[["Ledger", str], None]
LoopBlocker = Callable[["Ledger", str], "ParkStep | None"]
RunCheck = Callable[["Ledger", str], "str | None"]
ProviderShaper = Callable[[str, "ProviderStep"], Awaitable["ProviderStep | CompactStep | DoneStep | ParkStep"]]
PlanGuard = Callable[[Any, int, dict[str, Any]], "str | PlanRefusal | None"]
PlanCommitting = Callable[["Ledger", str, int, dict[str, Any]], "PlanRefusal | None"]
PrepareRoute = Callable[["ActorSlot", "ActionPrepare"], Any]
ActionGuard = Callable[[Any, str, str, dict[str, Any]], tuple[str, str]]
ToolEffect = Callable[["Ledger", str, str], "str | None"]
StaleAction = Callable[["Ledger", Any], "tuple[str, str] | None"]
StatusHook = Callable[["Ledger", str, "RunStatus", "str | None"], None]
ReceiptHook = Callable[["Ledger", Any], None]
FinalizeHold = Callable[[Any], Awaitable[None]]
FinalizeBlocker = Callable[["Ledger", str], list[str]]
FinalizeParker = Callable[["Ledger", str, list[str]], "str | None"]
FinalSnapshot = Callable[["Ledger", str, str], "str | None"]
FinalStale = Callable[["Ledger", str, "str | None"], "str | None"]
DecisionHook = Callable[[dict[str, Any]], None]
Reconciler = Callable[[str, dict[str, Any]], Awaitable["dict[str, Any] | None"]]
RecoveryStep = Callable[["Ledger", "RecoveryReport"], None]
ShowSections = Callable[[str], Mapping[str, Any]]
PendingSections = Callable[[], Mapping[str, Any]]


def _no_raw_copies(run_id: str, kind: str, key: str, raw: Any, shown: Any) -> str | None:
    return None


def _never_idempotent(provider: str) -> bool:
    return False


#: Keeps a raw copy where redaction changed what the ledger stores; its digest, or None.
RawCopier = Callable[[str, str, str, Any, Any], "str | None"]


class RunFeatures:
    """The features of one supervisor, in their one order, and the run layer's
    calls on them. Built empty with the supervisor and given its list once
    (``install``); two supervisors in one process keep two."""

    def __init__(self) -> None:
        self.features: tuple[RunFeature, ...] = ()
        self.installed = False
        #: Set by the run service, which owns the private spool.
        self.keep_raw_copy: RawCopier = _no_raw_copies
        #: Whether a provider's requests may be re-sent after a crash.
        self.idempotent_provider: Callable[[str], bool] = _never_idempotent
        self._bind(())

    def install(self, features: Sequence[RunFeature | None]) -> None:
        """The supervisor's features, in the order every call below follows (None:
        a feature this supervisor does not have, e.g. a cluster node's)."""
        if self.installed:
            raise RuntimeError("a supervisor's features are installed once")
        self.installed = True
        self._bind(tuple(feature for feature in features if feature is not None))

    def _bind(self, features: tuple[RunFeature, ...]) -> None:
        self.features = features
        base = RunFeature
        self.start_tasks: tuple[StartTask, ...] = _overriding(features, base.start_task)
        self.start_checks: tuple[StartCheck, ...] = _overriding(features, base.start_check)
        self.placers: tuple[RunPlacer, ...] = _overriding(features, base.place_run)
        self.start_option_hooks: tuple[StartOptions, ...] = _overriding(features, base.start_options)
        self.started_hooks: tuple[Started, ...] = _overriding(features, base.started)
        self.claim_hooks: tuple[ClaimHook, ...] = _overriding(features, base.on_claim)
        self.boundary: tuple[BoundaryCheck, ...] = _overriding(features, base.at_boundary)
        self.loop_blockers: tuple[LoopBlocker, ...] = _overriding(features, base.loop_blocker)
        self.provider_guards: tuple[RunCheck, ...] = _overriding(features, base.provider_guard)
        self.provider_shapers: tuple[ProviderShaper, ...] = _overriding(features, base.shape_provider)
        self.plan_guards: tuple[PlanGuard, ...] = _overriding(features, base.plan_guard)
        self.plan_committing: tuple[PlanCommitting, ...] = _overriding(features, base.plan_committing)
        self.prepare_routes: tuple[PrepareRoute, ...] = _overriding(features, base.prepare_route)
        self.action_guards: tuple[ActionGuard, ...] = _overriding(features, base.action_guard)
        self.tool_effects: tuple[ToolEffect, ...] = _overriding(features, base.tool_effect)
        self.stale_actions: tuple[StaleAction, ...] = _overriding(features, base.stale_action)
        self.on_status: tuple[StatusHook, ...] = _overriding(features, base.on_status)
        self.on_receipt: tuple[ReceiptHook, ...] = _overriding(features, base.on_receipt)
        self.final_guards: tuple[RunCheck, ...] = _overriding(features, base.final_guard)
        self.finalize_holds: tuple[FinalizeHold, ...] = _overriding(features, base.finalize_hold)
        self.finalize_blocker_hooks: tuple[FinalizeBlocker, ...] = _overriding(features, base.finalize_blockers)
        self.finalize_parkers: tuple[FinalizeParker, ...] = _overriding(features, base.finalize_park)
        self.final_snapshots: tuple[FinalSnapshot, ...] = _overriding(features, base.final_snapshot)
        self.final_stale_checks: tuple[FinalStale, ...] = _overriding(features, base.final_stale)
        self.decision_hooks: tuple[DecisionHook, ...] = _overriding(features, base.on_decision)
        self.reconcilers: tuple[Reconciler, ...] = _overriding(features, base.reconcile)
        self.recovery_steps: tuple[RecoveryStep, ...] = _overriding(features, base.recover)
        self.show_sections: tuple[ShowSections, ...] = _overriding(features, base.show)
        self.pending_sections: tuple[PendingSections, ...] = _overriding(features, base.pending)

    # -- the calls that gather every feature's answer --------------------------------

    def start_task(self, params: Mapping[str, Any]) -> str | None:
        task = None
        for hook in self.start_tasks:
            task = hook(params) or task
        return task

    def start_check(self, ledger: Ledger, params: Mapping[str, Any]) -> None:
        for check in self.start_checks:
            check(ledger, params)

    def place_run(self, run_id: str | None, agent_id: str, params: dict[str, Any]) -> Placed | None:
        for place in self.placers:
            placed = place(run_id, agent_id, params)
            if placed is not None:
                return placed
        return None

    def start_options(self, ledger: Ledger, params: Mapping[str, Any]) -> dict[str, Any]:
        options: dict[str, Any] = {}
        for hook in self.start_option_hooks:
            options.update(hook(ledger, params))
        return options

    def started(self, ledger: Ledger, run_id: str, options: Mapping[str, Any]) -> None:
        for hook in self.started_hooks:
            hook(ledger, run_id, options)

    def tool_effect(self, ledger: Ledger, run_id: str, tool: str) -> str | None:
        for lookup in self.tool_effects:
            effect = lookup(ledger, run_id, tool)
            if effect is not None:
                return effect
        return None

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        reasons: list[str] = []
        for check in self.finalize_blocker_hooks:
            reasons.extend(check(ledger, run_id))
        return reasons

    def final_snapshot(self, ledger: Ledger, run_id: str, reply: str) -> str | None:
        for hook in self.final_snapshots:
            snapshot = hook(ledger, run_id, reply)
            if snapshot is not None:
                return snapshot
        return None

    def final_stale(self, ledger: Ledger, run_id: str, snapshot: str | None) -> str | None:
        for check in self.final_stale_checks:
            why = check(ledger, run_id, snapshot)
            if why is not None:
                return why
        return None

    def on_decision(self, params: dict[str, Any]) -> None:
        for hook in self.decision_hooks:
            hook(params)

    async def reconcile(self, target: str, params: dict[str, Any]) -> dict[str, Any] | None:
        for reconcile in self.reconcilers:
            answer = await reconcile(target, params)
            if answer is not None:
                return answer
        return None

    def show(self, run_id: str) -> dict[str, Any]:
        return {name: value for section in self.show_sections for name, value in section(run_id).items()}

    def pending(self) -> dict[str, Any]:
        return {name: value for section in self.pending_sections for name, value in section().items()}


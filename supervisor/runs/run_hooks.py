"""The run layer's extension points, one typed list (or table) each.

One ``RunHooks`` belongs to one supervisor: the daemon builds it, every feature
(swarm, sessions, intent, MCP, ...) adds to it once, in the order written in
supervisor/daemon.py, and the run layer calls it where the hook applies. Its
ledger carries it (``Ledger.hooks``) because the hooks fire inside the run
store's own transactions (a status change, a receipt, a step boundary), which
take the ledger and nothing else. Two supervisors in one process keep two sets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from corral.supervisor.errors import BadRequest

if TYPE_CHECKING:
    from corral.mailbox.steps import CompactStep, ParkStep, ProviderStep
    from corral.supervisor.ledger.port import Ledger
    from corral.supervisor.runs.recovery import RecoveryReport
    from corral.supervisor.runs.run_state import RunStatus
    from corral.supervisor.tree.supervision_tree import ActorSlot

#: At the top of every step of a running run, before the plan is read: (ledger,
#: run_id). It may change the loop (a user's steer discards a stale plan).
BoundaryHook = Callable[["Ledger", str], object]
#: May hold a loop whose plan is done (a join to wait for): the park step, or None.
LoopBlocker = Callable[["Ledger", str], "ParkStep | None"]
#: Inside the transaction of every run status change: (ledger, run_id, status, reason).
StatusHook = Callable[["Ledger", str, "RunStatus", "str | None"], None]
#: Inside the transaction that writes a receipt and its observation: (ledger, action row).
ReceiptHook = Callable[["Ledger", Any], None]
#: Why a run may not finalize yet: (ledger, run_id) -> reasons (none: it may).
FinalizeBlocker = Callable[["Ledger", str], list[str]]
#: A blocked finalization that should park rather than cost a repair turn: the reason, or None.
FinalizeParker = Callable[["Ledger", str, list[str]], "str | None"]
#: Checked before a final reply is even staged (a pending steer): a reason, or None.
FinalGuard = Callable[["Ledger", str], "str | None"]
#: Checked before a provider turn is begun (a steer to apply first, a goal pausing):
#: (ledger, run_id) -> a reason, or None. A lost turn with a reason is interrupted.
ProviderGuard = Callable[["Ledger", str], "str | None"]
#: Every proposed action, before it is prepared: (run, action_id, tool, input) ->
#: ("continue" | "ask" | "block", reason). Each may only tighten.
ActionGuard = Callable[[Any, str, str, dict[str, Any]], tuple[str, str]]
class PlanRefusal(NamedTuple):
    """A plan guard's refusal with its own repair category (a bare reason is the
    collaboration policy's, ``collaboration-policy``)."""

    category: str
    reason: str


#: A plan before it commits: (run, loop, plan) -> a reason to refuse it, or None.
PlanGuard = Callable[[Any, int, dict[str, Any]], "str | PlanRefusal | None"]
#: Shapes a provider step: its view of the history, or a compaction first.
ProviderShaper = Callable[[str, "ProviderStep"], Awaitable["ProviderStep | CompactStep"]]
#: Prepares a tool corral's registry does not hold (an MCP server's): the action's row, or None.
PrepareRoute = Callable[["ActorSlot", dict[str, Any]], Any]
#: Adds to the run an agent just claimed (an MCP catalog): mutates the claimed run's map.
ClaimHook = Callable[[dict[str, Any]], Awaitable[None]]
#: Before ``run.finalize`` judges the blockers: may wait a while (a session about to exit).
FinalizeHold = Callable[[Any], Awaitable[None]]
#: ``reconcile`` of a target that is not an action or a provider request (``proc-…``).
Reconciler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
#: ``reconcile`` of an id another partition of the cluster holds: its holder's
#: answer; None: the id is this ledger's to handle (supervisor/cluster/forwarding.py).
ElsewhereReconciler = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]


class Placed(NamedTuple):
    """Where a new root run goes: ``reply`` when it waits in the cluster's shared
    queue (None: this node creates it now, keeping ``options`` with it)."""

    reply: dict[str, Any] | None
    options: dict[str, Any]


#: A cluster node's shared queue (supervisor/cluster/run_queue.py): (run id or
#: None, agent id, the submit's parameters) -> where the new root run goes.
RunQueuer = Callable[[str | None, str, dict[str, Any]], Placed]
#: After a person's decision on an action (``continue_action``): (params).
DecisionHook = Callable[[dict[str, Any]], None]
#: One more step of recovery at boot, after the run layer's own.
RecoveryStep = Callable[["Ledger", "RecoveryReport"], None]
#: A section of ``corral show`` for one run, and of ``corral pending``.
ShowSection = Callable[[str], Any]
PendingSection = Callable[[], Any]
#: Keeps a raw copy where redaction changed what the ledger stores; its digest, or None.
RawCopier = Callable[[str, str, str, Any, Any], "str | None"]
#: A new run's intent contract (the document, or its JSON text) -> its binding, kept
#: with the run's options (bound, or unbound and why).
IntentBinder = Callable[[Any], dict[str, Any]]


def _no_raw_copies(run_id: str, kind: str, key: str, raw: Any, shown: Any) -> str | None:
    return None


def _never_idempotent(provider: str) -> bool:
    return False


def _no_intent_binding(intent: Any) -> dict[str, Any]:
    raise BadRequest("this supervisor binds no intent contracts")


@dataclass
class RunHooks:
    boundary: list[BoundaryHook] = field(default_factory=list)
    loop_blockers: list[LoopBlocker] = field(default_factory=list)
    on_status: list[StatusHook] = field(default_factory=list)
    on_receipt: list[ReceiptHook] = field(default_factory=list)
    finalize_blockers: list[FinalizeBlocker] = field(default_factory=list)
    finalize_parkers: list[FinalizeParker] = field(default_factory=list)
    final_guards: list[FinalGuard] = field(default_factory=list)
    provider_guards: list[ProviderGuard] = field(default_factory=list)
    finalize_holds: list[FinalizeHold] = field(default_factory=list)
    action_guards: list[ActionGuard] = field(default_factory=list)
    plan_guards: list[PlanGuard] = field(default_factory=list)
    provider_shapers: list[ProviderShaper] = field(default_factory=list)
    prepare_routes: list[PrepareRoute] = field(default_factory=list)
    on_claim: list[ClaimHook] = field(default_factory=list)
    reconcilers: dict[str, Reconciler] = field(default_factory=dict)
    #: Set on a cluster node: where ``reconcile`` goes for another partition's id.
    reconcile_elsewhere: ElsewhereReconciler | None = None
    queue_run: RunQueuer | None = None
    on_decision: list[DecisionHook] = field(default_factory=list)
    recovery_steps: list[RecoveryStep] = field(default_factory=list)
    show_sections: dict[str, ShowSection] = field(default_factory=dict)
    pending_sections: dict[str, PendingSection] = field(default_factory=dict)
    #: Set by the run service, which owns the private spool.
    keep_raw_copy: RawCopier = _no_raw_copies
    #: Whether a provider's requests may be re-sent after a crash.
    idempotent_provider: Callable[[str], bool] = _never_idempotent
    #: Set by the intent service (built after the run layer, which starts runs with it).
    bind_intent: IntentBinder = _no_intent_binding

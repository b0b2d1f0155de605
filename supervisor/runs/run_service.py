"""The run layer on the supervisor: RunService, and ``install``, the one place
that reads the Supervisor to build it and register its methods; ``RunLayerFeature``,
the run layer's own part in every run (supervisor/runs/run_feature.py).

RunService is its shared part (run_core.py: collaborators, ownership checks,
policy, wake-ups, raw copies) with three kinds of methods: the agents' actor
methods (run_actor_methods.py), the control methods people call
(run_control.py), and recovery, retry timers and crash accounting at boot and in
the background (run_upkeep.py). What people read of runs is run_views.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from corral.actors.providers.registry import is_idempotent
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import poison, transcript_view
from corral.supervisor.runs.run_actor_methods import RunActorMethods
from corral.supervisor.runs.run_control import RunControlMethods
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.runs.run_upkeep import RunUpkeep
from corral.supervisor.runs.run_views import RunViews, ShowElsewhere
from corral.supervisor.runs.step_piggyback import StepPiggyback
from corral.supervisor.service_part import ServicePart, Task

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor


class RunService(RunActorMethods, RunControlMethods, RunUpkeep):
    """The run layer's service (``Supervisor.runs``); built by ``install``."""

    #: The typed step methods' next step, carried in their replies (supervisor/actor_dispatch.py).
    steps: StepPiggyback


class RunLayerFeature(RunFeature):
    """The run layer's own part, first of the features: its views hear every
    status change (a ``wait`` wakes), and ``show`` lists a run's crashes."""

    def __init__(self, ledger: Ledger, views: RunViews) -> None:
        self.ledger = ledger
        self.views = views

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        self.views.on_status(ledger, run_id, status, reason)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {"crashes": poison.show_section(self.ledger, run_id)}


class RunLayerPart(ServicePart):
    """The run layer's part in the supervisor's life: recovery first at boot, the
    retry timer, the runs that keep it busy, its ``status`` section."""

    status_name = "runs"

    def __init__(self, service: RunService) -> None:
        self.service = service

    async def recover(self) -> None:
        await self.service.recover()

    def tasks(self) -> Sequence[Task]:
        return (self.service.retry_timer,)

    def busy(self) -> list[str]:
        return self.service.busy()

    def status(self) -> Any:
        return self.service.status_section()


def install(sup: Supervisor, show_elsewhere: ShowElsewhere | None = None) -> tuple[RunService, RunViews]:
    """The run layer: its actor and control methods and background tasks (its
    part in each run is ``RunLayerFeature``, which the daemon lists first).
    The step methods' replies carry the next step (supervisor/runs/step_piggyback.py).
    ``show_elsewhere``: where ``show`` looks for a run this ledger does not hold
    (another partition of a cluster, supervisor/cluster/node_service.py)."""
    service = RunService(sup.ledger, sup.features, spec=sup.spec, home=sup.home, tree=sup.tree, boot_id=sup.boot_id)
    views = RunViews(
        sup.ledger,
        sup.features,
        sup.next_commit,
        show_elsewhere,
        home=sup.home,
        tools=service.tools,
        policy=service.effective_policy,
    )
    sup.features.idempotent_provider = is_idempotent
    sup.features.keep_raw_copy = service.keep_raw
    sup.tree.on_exit.append(service.on_actor_exit)
    # Its actor methods are served by supervisor/actor_dispatch.py's ``match``.
    service.steps = StepPiggyback(sup.ledger, service)
    sup.control_methods.update(
        {
            "run": service.create,
            "show": views.show,
            "transcript": partial(transcript_view.control, sup.ledger),
            "runs": views.runs,
            "wait": views.wait,
            "pending": views.pending,
            "approval.show": views.approval,
            "continue_action": service.continue_action,
            "reconcile": service.reconcile,
            "resume": service.resume,
            "wake_pending": service.wake_pending,
            "cancel": service.cancel,
        }
    )
    return service, views

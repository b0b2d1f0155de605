"""Fewer round trips per action: a step's reply carries the run's next step.

An agent used to ask ``run.next_step`` after every step, and ``action.begin`` and
``provider.begin`` before the effect and the request: about twelve round trips
per loop of one action. With ``want_next`` in a step's params, the reply holds
``next``: the step the agent would have asked for, computed after the step's own
commit. When that next step is an action to execute, ``executing`` is committed
here first (``begun``: the agent starts the effect without asking again); when it
is a provider turn, the request lifecycle is begun here. Every reply still leaves
only after the group commit made it durable, so no effect starts before its
``executing`` record is on disk: the same order. The next action of a plan is
also prepared here (through the same ``action.prepare`` method), so a read action
costs one round trip: its result, whose reply carries the next one, begun.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from corral.supervisor import run_store
from corral.supervisor.errors import SupervisorError

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree import ActorSlot

ActorMethod = Callable[["ActorSlot", dict[str, Any]], Awaitable[dict[str, Any]]]

#: Steps after which the agent asks for its next step at once.
PIGGYBACKED = ("provider.handoff", "plan.commit", "plan.invalid", "action.prepare", "action.begin", "action.finish")


def wrap(sup: Supervisor, method: str, handler: ActorMethod) -> ActorMethod:
    async def with_next(slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        answer = await handler(slot, params)
        run_id = params.get("run_id")
        if params.get("want_next") is True and isinstance(run_id, str):
            answer = {**answer, "next": await next_step_begun(sup, slot, run_id)}
        return answer

    return with_next


async def next_step_begun(sup: Supervisor, slot: ActorSlot, run_id: str) -> dict[str, Any]:
    runs = sup.services["runs"]
    step: dict[str, Any] = await runs.next_step(slot, {"run_id": run_id})
    if step["do"] == "prepare":
        # The next action of a committed plan: prepared here, through the same
        # method (and checks) as when the agent asks, one round trip fewer.
        try:
            await sup.actor_methods["action.prepare"](
                slot,
                {k: step[k] for k in ("loop", "index", "tool", "input")} | {"run_id": run_id, "want_next": False},
            )
        except SupervisorError:
            return step  # the agent asks itself and gets the refusal as the answer to its own step
        step = await runs.next_step(slot, {"run_id": run_id})
    if step["do"] == "execute" and step.get("phase") in ("prepared", "approved") and _rerunnable(sup, step):
        begun = run_store.begin_action(sup.ledger, step["action_id"])
        if begun["do"] != "execute":
            # Denied, or parked for approval: the ledger now says what comes next.
            step = await runs.next_step(slot, {"run_id": run_id})
        else:
            step["begun"] = True
    elif step["do"] == "provider":
        step["begun"] = run_store.begin_provider_request(sup.ledger, run_id, int(step["loop"]))
    return step


def _rerunnable(sup: Supervisor, step: dict[str, Any]) -> bool:
    """Only an action that recovery may run again is begun for the agent: if the
    agent died before it read the reply, the action is simply run again. An
    external one is begun by the agent itself (``action.begin``), as it is about to
    act, so a dead agent never leaves an ``executing`` record nobody acted on."""
    row = sup.ledger.one("SELECT rerunnable FROM actions WHERE action_id = ?", step["action_id"])
    return row is not None and bool(row["rerunnable"])


def install(sup: Supervisor) -> None:
    """Wrap the step methods as the last layer, over every other layer's wrappers."""
    for method in PIGGYBACKED:
        if method in sup.actor_methods:
            sup.actor_methods[method] = wrap(sup, method, sup.actor_methods[method])

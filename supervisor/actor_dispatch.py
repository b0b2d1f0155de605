"""Where each agent->supervisor request goes: one ``match`` on its typed record.

The request was decoded and its shape checked once, at the boundary
(mailbox/protocol.py ``decode``); each case hands the typed record to the one
handler that serves it. A method with no typed record yet arrives as ``Untyped``
and goes through the services' table (``Supervisor.actor_methods``, keyed by
``Method``) until its family is converted. A new typed request that no case
serves fails type checking here (``assert_never``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, assert_never

import msgspec

from corral.mailbox.protocol import (
    ActionBegin,
    ActionFinish,
    ActionFinishBatch,
    Code,
    NextStep,
    Ping,
    RunClaim,
    RunFail,
    RunFinalize,
    TypedRequest,
    Untyped,
)
from corral.supervisor.errors import SupervisorError

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor
    from corral.supervisor.tree.supervision_tree import ActorSlot


async def dispatch(sup: Supervisor, slot: ActorSlot, request: TypedRequest | Untyped) -> Mapping[str, object]:
    """The answer to one decoded request (committed; the caller waits for the barrier)."""
    runs = sup.runs
    steps = runs.steps
    match request:
        case Ping():
            return {"pong": True, "actor": slot.id}
        case RunClaim():
            claim: dict[str, object] = msgspec.to_builtins(await runs.claim(slot, request))
            return claim
        case NextStep():
            return await runs.next_step(slot, request)
        case RunFinalize():
            return await runs.finalize(slot, request)
        case RunFail():
            return await runs.fail(slot, request)
        case ActionBegin():
            return await steps.carry_next(slot, request, await runs.action_begin(slot, request))
        case ActionFinish():
            return await steps.carry_next(slot, request, await runs.action_finish(slot, request))
        case ActionFinishBatch():
            return await steps.carry_next(slot, request, await runs.action_finish_batch(slot, request))
        case Untyped():
            handler = sup.actor_methods.get(request.method)
            if handler is None:  # a method of a feature this supervisor was built without
                raise SupervisorError(f"no actor method {request.method.value!r}", code=Code.UNKNOWN_METHOD)
            return await handler(slot, request.params)
        case _:
            assert_never(request)

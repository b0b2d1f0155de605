"""The actor methods behind ``agent.action_history`` and ``command.output_read``'s
lookup (supervisor/interactive/own_history.py): read-only, for the calling agent's
own actions only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corral.mailbox.protocol import Method
from corral.supervisor.errors import BadRequest
from corral.supervisor.interactive import own_history
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.tree.supervision_tree import ActorSlot

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

_FILTERS = ("of_run", "of_action", "tool", "status", "limit")


class OwnHistoryService:
    def __init__(self, ledger: Ledger, runs: RunService) -> None:
        self.ledger = ledger
        self.runs = runs

    async def actions(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        caller = self.runs.owned_run(slot, params)
        action_id = params.get("action_id")
        if not isinstance(action_id, str):
            raise BadRequest("action_id must be a string")
        given = {key: params[key] for key in _FILTERS if params.get(key) is not None}
        filters = {"run_id" if key == "of_run" else "action_id" if key == "of_action" else key: value
                   for key, value in given.items()}
        return own_history.action_history(self.ledger, caller, action_id, filters)

    async def command(self, slot: ActorSlot, params: dict[str, Any]) -> dict[str, Any]:
        caller = self.runs.owned_run(slot, params)
        source = params.get("source")
        if not isinstance(source, str):
            raise BadRequest("source must be an action id")
        return own_history.command_source(self.ledger, caller, source)


def install(sup: Supervisor) -> OwnHistoryService:
    service = OwnHistoryService(sup.ledger, sup.runs)
    sup.actor_methods[Method.HISTORY_ACTIONS] = service.actions
    sup.actor_methods[Method.HISTORY_COMMAND] = service.command
    return service

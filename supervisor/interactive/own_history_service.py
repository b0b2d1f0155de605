"""The actor methods behind ``agent.action_history`` and ``command.output_read``'s
lookup (supervisor/interactive/own_history.py): read-only, for the calling agent's
own actions only."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from corral.mailbox.protocol import ActionReceipts, CommandSource, HistoryActions, HistoryCommand
from corral.supervisor.interactive import own_history
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.run_service import RunService
from corral.supervisor.tree.supervision_tree import ActorSlot

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor


class OwnHistoryService:
    def __init__(self, ledger: Ledger, runs: RunService) -> None:
        self.ledger = ledger
        self.runs = runs

    async def actions(self, slot: ActorSlot, request: HistoryActions) -> ActionReceipts:
        caller = self.runs.run_of(slot, request.run_id)
        given = {
            "run_id": request.of_run,
            "action_id": request.of_action,
            "tool": request.tool,
            "status": request.status,
            "limit": request.limit,
        }
        filters = {key: value for key, value in given.items() if value is not None}
        # convert, not **: the receipts are nested records (a receipt the budget
        # trimmed lacks its optional fields, which stay UNSET).
        return msgspec.convert(
            own_history.action_history(self.ledger, caller, request.action_id, filters), ActionReceipts
        )

    async def command(self, slot: ActorSlot, request: HistoryCommand) -> CommandSource:
        caller = self.runs.run_of(slot, request.run_id)
        return CommandSource(**own_history.command_source(self.ledger, caller, request.source))


def install(sup: Supervisor) -> OwnHistoryService:
    service = OwnHistoryService(sup.ledger, sup.runs)
    sup.methods.own_history = service
    return service

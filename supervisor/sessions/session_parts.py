"""Process sessions' part in runs and in the supervisor's life, apart from the
service that serves their actor methods (supervisor/sessions/session_service.py):
what a run's finalization, status, receipts, recovery and ``show`` see of them,
and what keeps the supervisor busy and shows in ``corral status``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs.recovery import RecoveryReport
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_state import RunStatus
from corral.supervisor.service_part import ServicePart, Task
from corral.supervisor.sessions import session_store
from corral.supervisor.sessions.session_service import SessionService


class SessionFeature(RunFeature):
    """Process sessions' and commands' part in runs: a run finalizes after its
    sessions (a moment's hold for one about to exit), they follow its status and
    receipts, ``reconcile`` of a ``proc-`` id is theirs, recovery settles them."""

    def __init__(self, ledger: Ledger, service: SessionService) -> None:
        self.ledger = ledger
        self.service = service

    async def finalize_hold(self, run: Any) -> None:
        await self.service.hold_finalize(run)

    async def reconcile(self, target: str, params: dict[str, Any]) -> dict[str, Any] | None:
        return await self.service.reconcile(params) if target.startswith("proc-") else None

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        self.service.on_status(ledger, run_id, status, reason)

    def on_receipt(self, ledger: Ledger, row: Any) -> None:
        self.service.on_receipt(ledger, row)

    def finalize_blockers(self, ledger: Ledger, run_id: str) -> list[str]:
        return session_store.blockers(ledger, run_id)

    def recover(self, ledger: Ledger, report: RecoveryReport) -> None:
        session_store.recover(ledger, report, self.service.runs.features)

    def show(self, run_id: str) -> Mapping[str, Any]:
        return {
            "sessions": session_store.run_sessions(self.ledger, run_id),
            "commands": session_store.run_commands(self.ledger, run_id),
        }

    def pending(self) -> Mapping[str, Any]:
        return {"sessions": session_store.unresolved_sessions(self.ledger)}


class SessionPart(ServicePart):
    """Sessions' part in the supervisor's life: live ones keep it busy, its worker,
    its ``status`` counts."""

    status_name = "sessions"

    def __init__(self, ledger: Ledger, service: SessionService) -> None:
        self.ledger = ledger
        self.service = service

    def tasks(self) -> Sequence[Task]:
        return (self.service.worker,)

    def busy(self) -> list[str]:
        return session_store.busy_reasons(self.ledger)

    def status(self) -> Any:
        return session_store.session_counts(self.ledger)

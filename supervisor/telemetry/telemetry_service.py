"""Traces of finished run trees: when a root run reaches a final status, its tree
is read from the ledger, projected into spans (span_projection.py) and handed to
a ``SpanSink``, whose own thread exports them.

Nothing is tracked while runs are open, so a crash loses no span bookkeeping: a
tree is exported from what the ledger holds (a tree whose root ended in the last
moment before a crash is not exported again; docs/telemetry.md). With telemetry
off this service is not built, its status hook is not added and OpenTelemetry is
never imported.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import trio

from corral.core.redact import redact_text, register_secret
from corral.supervisor.ledger.port import Ledger
from corral.supervisor.runs import approval_view
from corral.supervisor.runs.run_feature import RunFeature
from corral.supervisor.runs.run_state import TERMINAL, RunStatus
from corral.supervisor.service_part import ServicePart, Task
from corral.supervisor.telemetry.span_projection import EffectOf, SpanRecord, project
from corral.supervisor.telemetry.telemetry_config import TelemetryConfig
from corral.supervisor.telemetry.tree_rows import read_tree

if TYPE_CHECKING:
    from corral.supervisor.daemon import Supervisor

log = logging.getLogger("corral.telemetry")
#: How long ``corral down`` waits for the last spans to leave (a dead collector must
#: not hold a supervisor's shutdown).
FLUSH_AT_SHUTDOWN_S = 5.0


class SpanSink(Protocol):
    """Where finished spans go: ``emit`` must not block (it queues); ``close`` sends
    what is queued and stops (it may block: it is called in a worker thread)."""

    def emit(self, spans: Sequence[SpanRecord]) -> None: ...

    def close(self) -> None: ...


class TelemetryService:
    def __init__(self, ledger: Ledger, sink: SpanSink, effect_of: EffectOf) -> None:
        self.ledger = ledger
        self.sink = sink
        self.effect_of = effect_of
        #: Runs that reached a final status in a committed transaction, not yet looked at.
        self.pending: list[str] = []
        self._wake = trio.Event()
        self.exported = 0

    def on_status(self, ledger: Any, run_id: str, status: RunStatus, reason: str | None) -> None:
        """Its ``RunFeature.on_status`` (supervisor/runs/run_feature.py): only notes a final run, after
        its commit (never if it rolls back); the export runs outside the transaction."""
        if status in TERMINAL:
            ledger.after_commit(partial(self._note, run_id))

    def _note(self, run_id: str) -> None:
        self.pending.append(run_id)
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self.export_pending()

    def export_pending(self) -> None:
        pending, self.pending = self.pending, []
        for run_id in pending:
            self.export(run_id)

    def export(self, run_id: str) -> bool:
        """The tree of ``run_id`` if it is a root run that is final (a child's run is
        exported with its root's tree): True when spans were handed to the sink."""
        try:
            tree = read_tree(self.ledger, run_id)
            if tree is None or RunStatus(tree.runs[0]["status"]) not in TERMINAL:
                return False
            self.sink.emit(project(tree, self.effect_of))
        except Exception as exc:  # telemetry never takes a supervisor down
            log.warning("no trace for run %s: %s", run_id, redact_text(f"{type(exc).__name__}: {exc}"))
            return False
        self.exported += 1
        return True

    async def shutdown(self) -> None:
        self.export_pending()
        with trio.move_on_after(FLUSH_AT_SHUTDOWN_S):
            await trio.to_thread.run_sync(self.sink.close, abandon_on_cancel=True)


def effect_lookup(sup: Supervisor) -> EffectOf:
    """An action's effect class as ``corral pending`` shows it: corral's and the
    user's tools from the registry, an MCP tool from the catalog its run pinned."""
    return partial(approval_view.effect_class, sup.ledger, tools=sup.runs.tools, features=sup.features)


class TelemetryFeature(RunFeature):
    """Telemetry's part in runs: a run's final status exports its spans."""

    def __init__(self, service: TelemetryService) -> None:
        self.service = service

    def on_status(self, ledger: Ledger, run_id: str, status: RunStatus, reason: str | None) -> None:
        self.service.on_status(ledger, run_id, status, reason)


class TelemetryPart(ServicePart):
    """Telemetry's exporter, and its flush at shutdown."""

    def __init__(self, service: TelemetryService) -> None:
        self.service = service

    def tasks(self) -> Sequence[Task]:
        return (self.service.run,)

    async def shutdown(self) -> None:
        await self.service.shutdown()


def install(sup: Supervisor, config: TelemetryConfig | None) -> TelemetryService | None:
    """Telemetry for ``sup`` when ``config`` says it is on (telemetry_config.py); off,
    nothing is added and nothing is imported."""
    if config is None:
        return None
    for value in config.headers.values():
        register_secret(value)
    from corral.supervisor.telemetry.otel_sink import otlp_sink  # the extra, only when on

    service = TelemetryService(sup.ledger, otlp_sink(config, sup.spec.name), effect_lookup(sup))
    return service

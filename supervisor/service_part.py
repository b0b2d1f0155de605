"""A service's part in the supervisor's own life (not a run's: that is
supervisor/runs/run_feature.py): recovery at boot, background tasks, what keeps
it busy, its section of ``corral status``, what degrades it, the events page it
fills in, and what it does at shutdown.

A service has one :class:`ServicePart` and overrides what applies; every other
method is the base's no-op. ``Supervisor._assemble`` (supervisor/daemon.py)
writes the one list of parts, and each is asked in the list's order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

Task = Callable[[], Awaitable[None]]


class ServicePart:
    #: Its section of ``corral status`` ("": none); ``status`` reads it.
    status_name: str = ""

    async def recover(self) -> None:
        """At boot, after the actors are declared and before any starts."""

    def tasks(self) -> Sequence[Task]:
        """Its background tasks, started once the supervisor serves."""
        return ()

    def busy(self) -> list[str]:
        """Why the supervisor should not stop now (``shutdown_if_idle``)."""
        return []

    def status(self) -> Any:
        """Its section of ``corral status`` (named ``status_name``)."""
        return None

    def degraded(self) -> str:
        """What else makes the supervisor degraded, in ``status`` ("": nothing)."""
        return ""

    def fill_events(self, page: list[dict[str, Any]]) -> None:
        """Fills in a page of ``events`` before it leaves (text kept in memory only)."""

    async def shutdown(self) -> None:
        """After the actors stopped, before the boot ends."""

"""The client's second transport: a cluster's PostgreSQL, for a host with no
node (``AsyncClient.cluster``, ``corral --ledger URL ...``).

``AsyncClient`` keeps its one body: each of its methods makes the same control
call, which goes to a node's control socket on the node's host, or here, to the
cluster's front door (supervisor/cluster/front_door.py), which answers it by
reading the ledger and queueing into it. Its refusals reach the caller as a
node's do (``ControlError`` with the same codes).
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread

from corral.mailbox.control import ControlError


class LedgerTransport:
    """Control calls answered through the cluster's database (one call at a time
    on its connection; a ``wait`` lets others in between its reads)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        from corral.supervisor.cluster.front_door import Door

        #: Opened now: a bad URL, an unreachable database or a refused login is
        #: ``DoorError`` here, before any call.
        self.door = Door(url, timeout)

    @property
    def where(self) -> str:
        """The database, as it may be said (no password)."""
        return self.door.where

    async def acall(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        from corral.supervisor.errors import SupervisorError

        try:
            return await anyio.to_thread.run_sync(self.door.call, method, params)
        except SupervisorError as exc:
            raise ControlError(str(exc.code), str(exc)) from None

    def close(self) -> None:
        self.door.close()

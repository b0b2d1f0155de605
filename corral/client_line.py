"""``ControlLine``: the one connection a client's calls share, and what it does when
the supervisor behind it restarts.

Calls of several tasks run at once on it, each on its own nng context. A call that
finds the supervisor gone, or silent, retires the connection: the next call makes a
new one from the home's endpoint as it is then (a restarted supervisor has a new
address and token). A client of a cluster's database has no connection: its calls
go to the front door (``door``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from corral.client_requests import connect
from corral.mailbox.control import ControlClient, ControlError, SupervisorGone
from corral.mailbox.errors import DeadlineExceeded

if TYPE_CHECKING:
    from corral.ledger_transport import LedgerTransport


class ControlLine:
    """The connection to one home's supervisor, made on first use."""

    def __init__(self, home: Path, timeout: float) -> None:
        self.home = home
        self.timeout = timeout
        #: The cluster's database, when the client talks to no node (``AsyncClient.cluster``).
        self.door: LedgerTransport | None = None
        self._control: ControlClient | None = None
        #: Connections replaced (found stale) while other calls were still running on them.
        self._retiring: list[ControlClient] = []

    async def call(self, method: str, timeout: float | None, /, **params: Any) -> Any:
        if self.door is not None:
            return await self.door.acall(method, timeout, **params)
        for attempt in range(2):
            control = self._connection()
            try:
                return await control.acall(method, timeout, **params)
            except (SupervisorGone, DeadlineExceeded):
                self._retire(control)
                raise
            except ControlError as exc:
                if exc.code != "bad-token":
                    raise
                # A restarted supervisor listens on the same path before it writes
                # its endpoint file: a connection made in between holds the old
                # token. The request was refused before anything ran, so it is
                # sent once more on a connection made from the endpoint as it is now.
                self._retire(control)
                if attempt == 1:
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def close(self) -> None:
        """Close every connection now: calls in flight fail with ``ClientClosed``."""
        for control in (self._control, *self._retiring):
            if control is not None:
                control.close()
        self._control = None
        self._retiring = []
        if self.door is not None:
            self.door.close()

    def _connection(self) -> ControlClient:
        """The connection calls share. No await between the look and the set, so
        tasks that start calls together share one connection."""
        if self._control is None:
            self._control = connect(self.home, self.timeout)  # re-reads the endpoint: a restart is found
        return self._control

    def _retire(self, control: ControlClient) -> None:
        """Stop handing ``control`` out; it closes once the calls other tasks still
        have on it end (closing it now would fail them with ``ClientClosed``)."""
        if self._control is control:
            self._control = None
        control.retire()
        self._retiring = [old for old in (*self._retiring, control) if not old.closed]

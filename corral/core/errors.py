"""The exceptions a user of corral catches. Standard library only: cheap to import.

Every error corral raises at a user (a bad spec, a supervisor that is gone, a
control call the supervisor refused, a run that failed or timed out) is a
``CorralError``, so ``except corral.CorralError`` catches them all.
"""

from __future__ import annotations


class CorralError(Exception):
    """Base of every error corral raises at its user."""


class UserCodeError(CorralError):
    """A ``module:attribute`` reference (actor template, provider) that cannot be
    resolved: bad syntax, a module that fails to import, a missing attribute, or an
    object that does not implement the protocol. The message names all of them."""


class RunFailed(CorralError):
    """A run ended ``failed`` or ``cancelled`` (raised by ``RunResult.check()``)."""

    def __init__(self, run_id: str, status: str, reason: str | None) -> None:
        super().__init__(f"run {run_id} {status}" + (f": {reason}" if reason else ""))
        self.run_id = run_id
        self.status = status
        self.reason = reason


class RunTimeout(CorralError, TimeoutError):
    """``run(wait=True)`` or ``wait()`` gave up before the run ended or parked.
    The run goes on; ask again with its id."""

    def __init__(self, run_id: str, status: str, timeout: float) -> None:
        super().__init__(f"run {run_id} still {status} after {timeout}s")
        self.run_id = run_id
        self.status = status


class LedgerDoorError(CorralError):
    """A client of a cluster's database (``corral.Client.cluster``, ``corral
    --ledger URL``) could not open it: a bad URL, an unreachable database, a
    refused login, no cluster there. The message never holds the password."""


class LedgerLost(CorralError, ConnectionError):
    """A cluster's database went away during a client's call: nothing more is
    known of the call; ask again (a ``run`` with its id is safe to repeat)."""

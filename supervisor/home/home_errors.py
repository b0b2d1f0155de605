"""The errors of a home (re-exported by supervisor/home/home_dir.py, where callers find them)."""

from __future__ import annotations

from corral.core.errors import CorralError


class HomeError(CorralError, RuntimeError):
    """A home that cannot be used; the message says what to do."""


class HomeBusy(HomeError):
    pass


class NotRunning(HomeError):
    """No supervisor runs on this home (start one with ``corral up`` or ``Client.start``)."""

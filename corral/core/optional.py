"""Importing a layer that may not be installed, without hiding its own errors."""

from __future__ import annotations

import importlib
from types import ModuleType


def import_optional(name: str) -> ModuleType | None:
    """The module, or None when *it* does not exist. An ImportError raised from
    inside an existing module (a real bug) still propagates."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None

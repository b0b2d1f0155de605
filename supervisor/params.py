"""Checking the parameters of control and actor methods: one small set of helpers.

Every value crosses a process boundary, so each is checked for type and range
before it reaches SQLite (integers are int64 there) or trio (a NaN deadline is an
internal ValueError): bad input gets a ``bad-request`` naming the parameter.
"""

from __future__ import annotations

import math
from typing import Any

from corral.supervisor.errors import BadRequest

#: SQLite's integers are signed 64-bit.
MAX_INT = 2**63 - 1


def param_str(params: dict[str, Any], key: str, *, limit: int = 200) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise BadRequest(f"{key} must be a non-empty string of at most {limit} characters")
    return value


def param_text(params: dict[str, Any], key: str, default: str | None = "", *, limit: int = 1000) -> str:
    """A string that may be empty (a task, a reason, a note), never longer than limit:
    whatever is stored is shown again, and a reply must still fit in one frame."""
    value = params.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, str) or len(value) > limit:
        raise BadRequest(f"{key} must be a string of at most {limit} characters")
    return value


def param_int(params: dict[str, Any], key: str, default: int | None = None, *, low: int = 0,
              high: int = MAX_INT) -> int:
    value = params.get(key)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"{key} must be an integer between {low} and {high}")
    return value


def param_seconds(params: dict[str, Any], key: str, default: float, *, low: float = 0.0,
                  high: float = 24 * 3600.0) -> float:
    value = params.get(key)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"{key} must be a finite number of seconds")
    if not low <= value <= high:
        raise BadRequest(f"{key} must be between {low:g} and {high:g} seconds")
    return float(value)

"""The suite's verdicts and its report (the ``--json`` file).

A point is PASS, FAIL-model ("the model did not do the task": every runtime
invariant held, the produced result is wrong or missing), FAIL-runtime (an
invariant broke, a secret leaked, something ran twice, a process crashed) or
BLOCKED (what is missing is named: no model configured, no Chromium, ...). BLOCKED
is never a pass: the exit code says 2.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from corral.supervisor.runs.repair_histogram import histogram


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL_MODEL = "FAIL-model"
    FAIL_RUNTIME = "FAIL-runtime"
    BLOCKED = "BLOCKED"


EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_BLOCKED = 2


class Evidence(BaseModel):
    """A file the verdict rests on, and its sha256 when it was judged."""

    path: str
    sha256: str
    bytes: int

    @classmethod
    def of(cls, path: Path) -> Evidence:
        data = path.read_bytes() if path.is_file() else b""
        return cls(path=str(path), sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))


class PointResult(BaseModel):
    name: str
    title: str
    #: The seed slice it implements ("V1.1 §5.3", "V1.29", ...).
    seed: str
    verdict: Verdict
    reason: str
    evidence: list[Evidence] = Field(default_factory=list)
    #: Counts the verdict was computed from (runs, actions, replies, leaks, ...).
    facts: dict[str, int | str | bool] = Field(default_factory=dict)
    wall_s: float = 0.0


class Report(BaseModel):
    suite: str
    #: Why this suite and not the full one, when it is a reduced set.
    suite_note: str = ""
    provider: str
    verdict: Verdict
    exit_code: int
    secret_leak_count: int | None = None
    points: list[PointResult]
    #: Seed 004 V1.33: the suite's runs' repairs, every point's alike: the loops
    #: repaired, the second repairs, the eight categories zero-filled (counts only).
    repair_histogram: dict[str, Any] = Field(default_factory=lambda: histogram({}, {}))
    #: Where the disposable project was (kept with --keep, else removed).
    workdir: str
    kept: bool
    wall_s: float


def overall(results: list[PointResult]) -> tuple[Verdict, int]:
    """Any failure is exit 1 (FAIL-runtime named first); else any BLOCKED is exit 2."""
    verdicts = {result.verdict for result in results}
    if Verdict.FAIL_RUNTIME in verdicts:
        return Verdict.FAIL_RUNTIME, EXIT_FAIL
    if Verdict.FAIL_MODEL in verdicts:
        return Verdict.FAIL_MODEL, EXIT_FAIL
    if Verdict.BLOCKED in verdicts or not results:
        return Verdict.BLOCKED, EXIT_BLOCKED
    return Verdict.PASS, EXIT_PASS

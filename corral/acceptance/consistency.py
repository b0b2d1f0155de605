"""Ledger consistency (seed 004 V1.1 §5.8): the chaos invariants (corral/chaos/
invariants.py: effects at most once, one receipt per terminal action, claims, one
final reply, no run lost, no duplicates), read from each flow's ledger."""

from __future__ import annotations

import contextlib
from pathlib import Path

from corral.chaos.invariants import Check, check_all
from corral.supervisor.ledger.ledger_spec import open_for_reading


def ledger_checks(home: Path, effects: Path) -> list[Check]:
    with contextlib.closing(open_for_reading(home)) as ledger:
        return check_all(ledger, effects)

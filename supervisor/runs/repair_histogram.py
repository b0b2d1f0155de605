"""A run's repairs as seed 004 V1.33 reports them: the loops that needed a repair,
the second repairs, and the histogram of the eight fixed categories, zero-filled
("发生过 repair 的 loop 数、第二次 repair 数和按上述固定类别补零后的直方图；分类总和必须等于
repair 总数"). ``corral show`` and the acceptance report print it through this one
aggregator, which names no error, detail, preview or argument: counts only."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from corral.actors.providers.base import RepairCategory
from corral.supervisor.ledger.port import Ledger


def histogram(repairs: Mapping[str, int], per_loop: Mapping[int, int]) -> dict[str, Any]:
    """Pure: ``repairs`` by category (an older ledger's names read as the seed's),
    ``per_loop`` repairs by loop index. The categories sum to ``total``."""
    categories = {category.value: 0 for category in RepairCategory}
    for name, n in repairs.items():
        try:
            categories[RepairCategory(name).value] += int(n)
        except ValueError:
            continue  # not a repair category (nothing else is ever written there)
    return {
        "total": sum(categories.values()),
        "loops": sum(1 for n in per_loop.values() if n >= 1),
        "second_repairs": sum(1 for n in per_loop.values() if n >= 2),
        "categories": categories,
    }


def merged(histograms: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Several runs' histograms as one (a suite's report, a partial one alike)."""
    total = histogram({}, {})
    for one in histograms:
        for key in ("total", "loops", "second_repairs"):
            total[key] += int(one[key])
        for name, n in one["categories"].items():
            total["categories"][name] += int(n)
    return total


def of_run(ledger: Ledger, run: Any) -> dict[str, Any]:
    """The histogram of the run whose row is ``run``. A repair of a response that
    did not parse marks its request consumed = 2; a refused final reply leaves a
    ``final-blocked`` observation on its loop; the last repair of a run that failed
    on its budget left none and belongs to the loop the run stopped at."""
    run_id = run["run_id"]
    per_loop: dict[int, int] = {}
    for row in ledger.all(
        "SELECT loop_index, COUNT(*) AS n FROM provider_requests WHERE run_id = ? AND consumed = 2"
        " GROUP BY loop_index", run_id,
    ):
        per_loop[int(row["loop_index"])] = int(row["n"])
    for row in ledger.all(
        "SELECT loop_index FROM observations WHERE run_id = ? AND source LIKE 'final-blocked:%'", run_id
    ):
        per_loop[int(row["loop_index"])] = per_loop.get(int(row["loop_index"]), 0) + 1
    shown = histogram(json.loads(run["repairs"] or "{}"), per_loop)
    missing = shown["total"] - sum(per_loop.values())
    if missing > 0:
        per_loop[int(run["loop_index"])] = per_loop.get(int(run["loop_index"]), 0) + missing
        shown = histogram(json.loads(run["repairs"] or "{}"), per_loop)
    return shown


def line(shown: Mapping[str, Any]) -> str:
    """One line of text: the counts, then every category with its count."""
    categories = ", ".join(f"{name} {n}" for name, n in shown["categories"].items())
    return (f"repairs: {shown['total']} in {shown['loops']} loop(s), {shown['second_repairs']} second repair(s)"
            f" ({categories})")

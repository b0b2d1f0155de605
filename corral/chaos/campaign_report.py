"""The report of a chaos campaign (``corral chaos``): kills by target and point,
restarts, reconciliations, how the runs ended, and each invariant over every
episode that ended, with how many things it checked. Pure: episodes in, report out."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.chaos.runner import Episode


def campaign_report(episodes: list[Episode], *, scenario: str, seed: int, targets: tuple[str, ...], wall_s: float,
                    workdir: Path, stopped: str | None, interrupted_at: int | None,
                    interrupted: bool = False) -> dict[str, Any]:
    """``stopped``: why the campaign did not go on; ``interrupted_at``/``interrupted``:
    the episode Ctrl-C ended, or that Ctrl-C cut the campaign short (the report so far)."""
    interrupted = interrupted or interrupted_at is not None
    kills = [k for e in episodes for k in e.kills]
    by_target = Counter(k.target for k in kills)
    by_point = Counter(k.point if not k.point.startswith("random@") else "random" for k in kills)
    invariants: dict[str, dict[str, Any]] = {}
    for episode in episodes:
        for check in episode.checks:
            entry = invariants.setdefault(
                check.name, {"passed": True, "count": 0, "unit": check.unit, "breakdown": {}, "failures": []}
            )
            entry["count"] += check.count
            for source, n in check.breakdown.items():
                entry["breakdown"][source] = entry["breakdown"].get(source, 0) + n
            if not check.passed:
                entry["passed"] = False
                for failure in check.failures[:3]:
                    entry["failures"].append(
                        {
                            "episode": episode.index,
                            "seed": episode.seed,
                            "failpoint": episode.failpoint,
                            "detail": failure,
                        }
                    )
    leftovers = [p for e in episodes for p in e.leftovers]
    invariants["no process left alive"] = {
        "passed": not leftovers,
        "count": sum(e.processes_checked for e in episodes),
        "unit": "processes",
        "failures": [{"detail": f"pid {p} alive"} for p in leftovers],
    }
    errors = [
        {"episode": e.index, "seed": e.seed, "failpoint": e.failpoint, "detail": e.error}
        for e in episodes
        if e.error
    ]
    invariants["every episode ran to its end"] = {
        "passed": not errors,
        "count": len(episodes),
        "unit": "episodes",
        "failures": errors,
    }
    # ``passed``: no failure found. A row that checked nothing found none, yet
    # proves nothing: its status says "not exercised", never a pass.
    for entry in invariants.values():
        entry["exercised"] = entry["count"] > 0
        entry["status"] = "fail" if not entry["passed"] else "pass" if entry["exercised"] else "not exercised"
    # A campaign cut short (stopped, or interrupted) did not run what was asked: no pass.
    passed = all(entry["passed"] for entry in invariants.values()) and not (stopped or interrupted)
    return {
        "scenario": scenario,
        "seed": seed,
        "targets": list(targets),
        "episodes": len(episodes),
        "kills": len(kills),
        "kills_by_target": dict(by_target),
        "kills_by_point": dict(sorted(by_point.items())),
        "supervisor_restarts": sum(max(0, e.boots - 1) for e in episodes),
        "actor_restarts": sum(e.restarts for e in episodes),
        "recoveries": sum(max(0, e.boots - 1) for e in episodes),
        "reconciliations": sum(e.reconciliations for e in episodes),
        "runs": Counter(e.status or "error" for e in episodes),
        "invariants": invariants,
        "passed": passed,
        "not_exercised": [name for name, entry in invariants.items() if not entry["exercised"]],
        "stopped": stopped,
        "interrupted": interrupted,
        "wall_s": round(wall_s, 2),
        "workdir": str(workdir),
    }

"""Real overlap in time (seed 004 V1.1 §5.6, V1.29, V1.31): whose provider requests
were in flight at the same instant, from the ledger's ``provider_requests.started_at``
and ``finished_at`` of each run. Action times or a run's own span do not count: the
seed asks for the physical provider intervals. Pure: intervals in, counts out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Interval = tuple[float, float]


def max_concurrent(intervals: Mapping[str, Sequence[Interval]]) -> int:
    """The largest number of distinct keys (runs) with a request in flight at one
    instant. Touching ends (one finishes as the next starts) are no overlap."""
    edges: list[tuple[float, int, str]] = []
    for key, spans in intervals.items():
        for start, end in spans:
            if end > start:
                # At one instant an end sorts before a start: touching is not overlapping.
                edges += [(start, 1, key), (end, 0, key)]
    open_by_key: dict[str, int] = {}
    best = 0
    for _, is_start, key in sorted(edges):
        open_by_key[key] = open_by_key.get(key, 0) + (1 if is_start else -1)
        best = max(best, sum(1 for n in open_by_key.values() if n > 0))
    return best


def overlapping(a: Sequence[Interval], b: Sequence[Interval]) -> bool:
    """Whether some request of ``a`` and some request of ``b`` were in flight at once."""
    return any(max(s1, s2) < min(e1, e2) for s1, e1 in a for s2, e2 in b)


def any_pair_overlaps(left: Mapping[str, Sequence[Interval]], right: Mapping[str, Sequence[Interval]]) -> bool:
    """Whether a run of ``left`` overlapped a run of ``right`` (static and isolated, say)."""
    return any(overlapping(a, b) for a in left.values() for b in right.values())


def intervals_of(rows: Sequence[tuple[str, float, float | None]]) -> dict[str, list[Interval]]:
    """(run_id, started_at, finished_at) rows to intervals per run; a request with no
    finish (never answered) has no known interval and counts for nothing."""
    found: dict[str, list[Interval]] = {}
    for run_id, started, finished in rows:
        if finished is not None:
            found.setdefault(run_id, []).append((float(started), float(finished)))
    return found

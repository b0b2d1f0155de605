"""The cost floor of a disabled failpoint check: a Python call and a dict lookup."""

from __future__ import annotations

import os
import timeit
from typing import Any

from bench.harness import Context, Metrics, Stats, workload

_ACTIVE: dict[str, str] = {}


def _noop(name: str) -> None:
    return None


def _guarded(name: str) -> None:
    """The shape of a cheap ``hit(name)``: one test of an empty registry."""
    if _ACTIVE:
        _ACTIVE.get(name)


@workload("pycall", group="limits", budget_s=30, quick_budget_s=6)
def pycall(ctx: Context) -> Metrics:
    """ns per operation: empty call, guarded call, dict.get, os.environ.get."""
    number = ctx.reps(200_000, 1_000_000)
    rounds = ctx.reps(3, 7)
    cases: dict[str, tuple[str, dict[str, Any]]] = {
        "empty_call_ns": ("f('agent.before-effect')", {"f": _noop}),
        "guarded_call_ns": ("f('agent.before-effect')", {"f": _guarded}),
        "dict_get_ns": ("d.get('agent.before-effect')", {"d": {}}),
        "environ_get_ns": ("e.get('CORRAL_FAILPOINTS')", {"e": os.environ}),
    }
    out: Metrics = ctx.metrics
    for key, (stmt, env) in cases.items():
        timer = timeit.Timer(stmt, globals=env)
        per_op = [t / number * 1e9 for t in timer.repeat(rounds, number)]
        out[key] = Stats.of(per_op, "ns")
        ctx.check(key)
    ctx.note("timeit loop overhead included (~10 ns)")
    return out

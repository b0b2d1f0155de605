"""``wait``'s request is a typed record (issue 50: no ``dict[str, Any]`` at a seam).

A node's ``wait`` and the cluster front door's read the same ``WaitRequest``,
decoded once from the control call's parameters (``WaitRequest.decode``): a
parameter of the wrong shape is a ``bad-request`` naming it, before anything is
read. ``wait_request`` then checks what the shape cannot (the caller's bound on
how many runs, each a run id) and answers the runs, the statuses that end the
wait and how long it may take. Pure: no ledger, no process.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from corral.supervisor.errors import BadRequest
from corral.supervisor.runs.run_state import NEEDS_PERSON, TERMINAL
from corral.supervisor.runs.run_views import WaitRequest, wait_request

ROOT = Path(__file__).resolve().parent.parent
A, B = "run-aaaaaaaa", "run-bbbbbbbb"


def test_a_wait_reads_its_record() -> None:
    wanted, stop, wait_ms = wait_request(WaitRequest(run_ids=[B, A, B], until="done", wait_ms=250), 10)
    assert wanted == [A, B]  # sorted, once each
    assert stop == frozenset(str(s) for s in TERMINAL)
    assert wait_ms == 250


def test_settled_is_the_default_and_stops_on_a_person_too() -> None:
    request = WaitRequest.decode({"run_ids": [A]})
    assert request == WaitRequest(run_ids=[A], until="settled", wait_ms=0)
    assert wait_request(WaitRequest.decode({"run_ids": [A], "wait_ms": None}), 10)[2] == 0  # null: the default
    _, stop, _ = wait_request(request, 10)
    assert stop == frozenset(str(s) for s in TERMINAL | NEEDS_PERSON)


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({}, "run_ids"),
        ({"run_ids": A}, "$.run_ids"),
        ({"run_ids": [A, 7]}, "$.run_ids[1]"),
        ({"run_ids": [A], "until": "soon"}, "$.until"),
        ({"run_ids": [A], "wait_ms": -1}, "$.wait_ms"),
        ({"run_ids": [A], "wait_ms": 3_600_001}, "$.wait_ms"),
        ({"run_ids": [A], "wait_ms": "5"}, "$.wait_ms"),
        ({"run_ids": [A], "wait_ms": True}, "$.wait_ms"),
    ],
)
def test_a_malformed_wait_is_refused_naming_the_parameter(params: dict[str, Any], named: str) -> None:
    with pytest.raises(BadRequest, match=r"^wait: ") as caught:
        WaitRequest.decode(params)
    assert named in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("run_ids", "message"),
    [([], "list of 1 to 2 run ids"), ([A, B, "run-cccccccc"], "list of 1 to 2 run ids"), (["../etc"], "not a run id")],
)
def test_what_the_shape_cannot_say_is_checked_against_the_callers_bound(run_ids: list[str], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        wait_request(WaitRequest(run_ids=run_ids), 2)


def test_both_waits_decode_the_record_and_hand_it_on() -> None:
    """Read from the source: ``wait_request`` takes the record, and each caller
    (the node's ``wait``, the front door's ``_wait``) hands it one it decoded."""
    views = ast.parse((ROOT / "supervisor" / "runs" / "run_views.py").read_text())
    (function,) = [n for n in ast.walk(views) if isinstance(n, ast.FunctionDef) and n.name == "wait_request"]
    first = function.args.args[0]
    assert first.annotation is not None and ast.unparse(first.annotation) == "WaitRequest"
    for path in ("supervisor/runs/run_views.py", "supervisor/cluster/front_door.py"):
        calls = [
            n
            for n in ast.walk(ast.parse((ROOT / path).read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "wait_request"
        ]
        assert calls, path
        for call in calls:
            assert ast.unparse(call.args[0]).startswith("WaitRequest.decode("), f"{path}: {ast.unparse(call)}"

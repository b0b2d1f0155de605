"""Restart decisions as pure functions, checked without processes."""

from __future__ import annotations

import random

import pytest

from corral.core.transitions import IllegalTransition
from corral.supervisor.tree.actor_state import ActorState, check_transition
from corral.supervisor.tree.restart_policy import (
    Intensity,
    RestartType,
    Strategy,
    backoff_delay,
    plan_restart,
    should_restart,
)

ORDER = ["a", "b", "c", "d"]


def test_one_for_one_restarts_only_the_failed_child() -> None:
    plan = plan_restart(Strategy.ONE_FOR_ONE, ORDER, "b")
    assert plan.stop == ()
    assert plan.start == ("b",)


def test_one_for_all_stops_siblings_in_reverse_and_restarts_all_in_order() -> None:
    plan = plan_restart(Strategy.ONE_FOR_ALL, ORDER, "b")
    assert plan.stop == ("d", "c", "a")
    assert plan.start == ("a", "b", "c", "d")


def test_rest_for_one_takes_the_later_children_only() -> None:
    plan = plan_restart(Strategy.REST_FOR_ONE, ORDER, "b")
    assert plan.stop == ("d", "c")
    assert plan.start == ("b", "c", "d")


def test_unknown_child_is_an_error() -> None:
    with pytest.raises(ValueError):
        plan_restart(Strategy.ONE_FOR_ONE, ORDER, "zz")


@pytest.mark.parametrize(
    ("restart", "code", "expected"),
    [
        (RestartType.PERMANENT, 0, True),
        (RestartType.PERMANENT, -9, True),
        (RestartType.TRANSIENT, 0, False),
        (RestartType.TRANSIENT, 1, True),
        (RestartType.TRANSIENT, -9, True),
        (RestartType.TEMPORARY, -9, False),
    ],
)
def test_restart_types(restart: RestartType, code: int, expected: bool) -> None:
    assert should_restart(restart, code) is expected


def test_intensity_allows_max_then_escalates_and_forgets_after_the_period() -> None:
    intensity = Intensity(max_restarts=2, period_s=10)
    assert intensity.record(0.0) is False
    assert intensity.record(1.0) is False
    assert intensity.record(2.0) is True
    fresh = Intensity(max_restarts=2, period_s=10)
    fresh.record(0.0)
    fresh.record(1.0)
    assert fresh.record(11.5) is False  # the first two fell out of the window


def test_zero_intensity_escalates_on_first_restart() -> None:
    assert Intensity(0, 5).record(0.0) is True


def test_backoff_is_immediate_first_then_exponential_capped_with_bounded_jitter() -> None:
    rng = random.Random(7)
    assert backoff_delay(1, 0.1, 5, 0.2, rng) == 0.0
    delays = [backoff_delay(n, 0.1, 1.0, 0.0, rng) for n in range(2, 8)]
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    for _ in range(100):
        value = backoff_delay(3, 0.1, 5, 0.25, rng)
        assert 0.15 <= value <= 0.25


def test_actor_state_table_rejects_illegal_moves() -> None:
    assert check_transition(ActorState.STARTING, ActorState.RUNNING) is ActorState.RUNNING
    with pytest.raises(IllegalTransition):
        check_transition(ActorState.STOPPED, ActorState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(ActorState.STOPPING, ActorState.RESTARTING)

"""Table tests of the pure restart decision; the clock is a number, nothing sleeps."""

from __future__ import annotations

import pytest

from xpulaunch.errors import UsageError
from xpulaunch.supervisor.restart import (
    Action,
    Outcome,
    RestartMode,
    RestartPolicy,
    RestartState,
    decide,
)

FAST = RestartPolicy(
    max_restarts=3, backoff_initial_s=1.0, backoff_factor=2.0, backoff_max_s=5.0,
    stable_window_s=60.0,
)  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "outcome", "action"),
    [
        (RestartMode.NO, Outcome.SUCCEEDED, Action.DONE),
        (RestartMode.NO, Outcome.FAILED, Action.GIVE_UP),
        (RestartMode.ON_FAILURE, Outcome.SUCCEEDED, Action.DONE),
        (RestartMode.ON_FAILURE, Outcome.FAILED, Action.RESTART),
        (RestartMode.ALWAYS, Outcome.SUCCEEDED, Action.RESTART),
        (RestartMode.ALWAYS, Outcome.FAILED, Action.RESTART),
        (RestartMode.NO, Outcome.STOPPED, Action.DONE),
        (RestartMode.ON_FAILURE, Outcome.STOPPED, Action.DONE),
        (RestartMode.ALWAYS, Outcome.STOPPED, Action.DONE),
    ],
)
def test_mode_table(mode: RestartMode, outcome: Outcome, action: Action) -> None:
    policy = RestartPolicy(mode=mode)
    assert decide(RestartState().started(0.0), outcome, policy, 1.0).action is action


def test_backoff_grows_and_is_capped_then_gives_up() -> None:
    state, now, delays = RestartState().started(0.0), 0.0, []
    for _ in range(3):
        now += 2.0  # each run lasts 2 s: far from the 60 s stability window
        decision = decide(state, Outcome.FAILED, FAST, now)
        assert decision.action is Action.RESTART
        delays.append(decision.delay_s)
        now += decision.delay_s
        state = decision.state.started(now)
    assert delays == [1.0, 2.0, 4.0]
    final = decide(state, Outcome.FAILED, FAST, now + 2.0)
    assert final.action is Action.GIVE_UP
    assert "3 allowed" in final.reason
    assert final.state.total_restarts == 3


def test_backoff_cap() -> None:
    policy = RestartPolicy(max_restarts=None, backoff_initial_s=1, backoff_max_s=5)
    assert [policy.backoff_s(k) for k in range(5)] == [1, 2, 4, 5, 5]
    assert policy.backoff_s(10_000) == 5  # no float overflow for huge counts


def test_stability_window_resets_the_count() -> None:
    state = RestartState(restarts=3, total_restarts=3, started_at_s=100.0)
    crash_loop = decide(state, Outcome.FAILED, FAST, 100.0 + 59.9)
    assert crash_loop.action is Action.GIVE_UP
    stable = decide(state, Outcome.FAILED, FAST, 100.0 + 60.0)
    assert stable.action is Action.RESTART
    assert stable.delay_s == 1.0  # back to the first delay
    assert stable.state.restarts == 1
    assert stable.state.total_restarts == 4  # the total keeps counting


def test_unlimited_restarts_and_zero_backoff() -> None:
    policy = RestartPolicy(max_restarts=None, backoff_initial_s=0.0)
    state = RestartState(restarts=500, total_restarts=500, started_at_s=0.0)
    decision = decide(state, Outcome.FAILED, policy, 0.1)
    assert (decision.action, decision.delay_s) == (Action.RESTART, 0.0)
    assert "unlimited" in decision.reason


def test_zero_restarts_gives_up_at_once() -> None:
    policy = RestartPolicy(max_restarts=0)
    decision = decide(RestartState().started(0.0), Outcome.FAILED, policy, 1.0)
    assert decision.action is Action.GIVE_UP


def test_always_with_exhausted_budget_is_done_not_failed() -> None:
    policy = RestartPolicy(mode=RestartMode.ALWAYS, max_restarts=1)
    state = RestartState(restarts=1, total_restarts=1, started_at_s=0.0)
    assert decide(state, Outcome.SUCCEEDED, policy, 1.0).action is Action.DONE
    assert decide(state, Outcome.FAILED, policy, 1.0).action is Action.GIVE_UP


def test_never_started_state_counts_without_window() -> None:
    # A run that never started (a failed spawn) has no uptime: no reset, normal backoff.
    state = RestartState(restarts=2, total_restarts=2, started_at_s=None)
    decision = decide(state, Outcome.FAILED, FAST, 1000.0)
    assert (decision.action, decision.delay_s) == (Action.RESTART, 4.0)


def test_decide_is_pure() -> None:
    state = RestartState().started(0.0)
    first = decide(state, Outcome.FAILED, FAST, 3.0)
    assert decide(state, Outcome.FAILED, FAST, 3.0) == first
    assert state == RestartState().started(0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_restarts": -1},
        {"backoff_initial_s": -1.0},
        {"backoff_max_s": float("nan")},
        {"backoff_factor": 0.5},
        {"stable_window_s": float("inf")},
        {"backoff_factor": float("nan")},
        {"backoff_factor": float("inf")},
        {"backoff_initial_s": float("-inf")},
    ],
)
def test_bad_policy_values_are_usage_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(UsageError):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


def test_finite_edges_are_accepted() -> None:
    policy = RestartPolicy(backoff_initial_s=0.0, backoff_factor=1.0, backoff_max_s=1e300)
    assert policy.backoff_s(3) == 0.0

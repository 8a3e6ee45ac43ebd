"""A gang's phase: the transition table, and a gang that follows it."""

from __future__ import annotations

import itertools

import pytest

from xpulaunch.supervisor.gang import FINAL_PHASES, TRANSITIONS, Gang, GangEvent, Phase

P, E = Phase, GangEvent

EXPECTED = {
    (P.RUNNING, E.ENDED): P.STOPPING,  # a worker failed, or all exited cleanly
    (P.RUNNING, E.STOP): P.STOPPING,
    (P.STOPPING, E.STOP): P.STOPPING,  # a stop while going down keeps going down
    (P.BACKOFF, E.STOP): P.STOPPING,  # a stop cancels a pending restart
    (P.SETTLING, E.STOP): P.STOPPING,
    (P.STOPPING, E.DOWN_RESTART): P.BACKOFF,
    (P.STOPPING, E.DOWN_DONE): P.DONE,
    (P.STOPPING, E.DOWN_GIVE_UP): P.FAILED,
    (P.BACKOFF, E.SETTLE): P.SETTLING,
    (P.BACKOFF, E.START): P.RUNNING,
    (P.SETTLING, E.START): P.RUNNING,
    (P.SETTLING, E.REFUSED): P.FAILED,  # the settle hook refused: the other nodes are gone
}


@pytest.mark.parametrize(("phase", "event"), list(itertools.product(Phase, GangEvent)))
def test_transition_table(phase: Phase, event: GangEvent) -> None:
    assert TRANSITIONS.get((phase, event)) == EXPECTED.get((phase, event))


def test_final_phases_have_no_way_out() -> None:
    assert {p for p, _ in TRANSITIONS}.isdisjoint(FINAL_PHASES)


def test_only_a_running_gang_can_end() -> None:
    assert [p for p in Phase if (p, E.ENDED) in TRANSITIONS] == [P.RUNNING]


def test_a_gang_follows_the_table() -> None:
    gang = Gang([])
    assert gang.phase is P.RUNNING
    for event, phase in [
        (E.ENDED, P.STOPPING),
        (E.DOWN_RESTART, P.BACKOFF),
        (E.SETTLE, P.SETTLING),
        (E.START, P.RUNNING),
        (E.STOP, P.STOPPING),
        (E.DOWN_DONE, P.DONE),
    ]:
        assert gang.can(event)
        gang.advance(event)
        assert gang.phase is phase
    assert not gang.can(E.STOP)


def test_a_transition_outside_the_table_is_a_bug() -> None:
    gang = Gang([])
    with pytest.raises(RuntimeError, match="no transition from"):
        gang.advance(E.START)
    assert gang.phase is P.RUNNING

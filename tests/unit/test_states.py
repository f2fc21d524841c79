"""The state machines: terminal states are final and no transition skips the declared table."""

import pytest

from gridbot.model.states import (
    BAG_REOPEN,
    BAG_TERMINAL,
    BAG_TRANSITIONS,
    INSTANCE_TERMINAL,
    INSTANCE_TRANSITIONS,
    JOB_RETRY,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    BagState,
    InstanceState,
    JobState,
    TransitionError,
    check_transition,
)


@pytest.mark.parametrize(("table", "terminal"), [(BAG_TRANSITIONS, BAG_TERMINAL), (JOB_TRANSITIONS, JOB_TERMINAL),
                                                 (INSTANCE_TRANSITIONS, INSTANCE_TERMINAL)])
def test_terminal_states_have_no_way_out(table, terminal):
    for state, targets in table.items():
        assert (not targets) == (state in terminal), state
    assert set(table) == set(type(next(iter(table)))), "every member has a row"


def test_a_terminal_state_cannot_move():
    with pytest.raises(TransitionError, match="cannot move from done to queued"):
        check_transition(JOB_TRANSITIONS, JobState.DONE, JobState.QUEUED)
    assert check_transition(INSTANCE_TRANSITIONS, InstanceState.OVERDUE, InstanceState.DONE) is InstanceState.DONE


@pytest.mark.parametrize(("table", "terminal"), [(JOB_RETRY, JOB_TERMINAL), (BAG_REOPEN, BAG_TERMINAL)])
def test_the_owners_ways_back_lead_only_out_of_terminal_states(table, terminal):
    """Issue 12: a retry is the only way out of a terminal state, and only into a live one."""
    assert set(table) == set(type(next(iter(table)))), "every member has a row"
    for state, targets in table.items():
        assert not targets or state in terminal, state
        assert not targets & terminal, state
    assert JOB_RETRY[JobState.FAILED] == {JobState.QUEUED} and not JOB_RETRY[JobState.DONE]
    assert not BAG_REOPEN[BagState.CANCELLED]
    with pytest.raises(TransitionError, match="cannot move from cancelled to queued"):
        check_transition(JOB_RETRY, JobState.CANCELLED, JobState.QUEUED)


"""The state machines: terminal states are final and no transition skips the declared table."""

import pytest

from gridbot.model.states import (
    BAG_TERMINAL,
    BAG_TRANSITIONS,
    INSTANCE_TERMINAL,
    INSTANCE_TRANSITIONS,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
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

"""A pilot that reaches its walltime has ended normally (PSI/J and Parsl treat it so); others map plainly."""

from pathlib import Path

import psij
import pytest

from gridbot.model.pools import parse_pools
from gridbot.model.states import PilotState
from gridbot.pools.adapters import BatchAdapter
from gridbot.pools.base import LIFETIME_MARGIN, PilotRequest


class FakeJob:
    def __init__(self, state, message=None):
        self.status = psij.JobStatus(state, message=message)


@pytest.fixture
def adapter(tmp_path: Path):
    [spec] = parse_pools('[pools.c]\nkind = "slurm"\npartition = "fast"\nwalltime = "1h"\n', "p.toml")
    return BatchAdapter(spec, tmp_path)


@pytest.mark.parametrize(("state", "message", "expected"), [
    (psij.JobState.QUEUED, None, PilotState.QUEUED),
    (psij.JobState.ACTIVE, None, PilotState.RUNNING),
    (psij.JobState.COMPLETED, None, PilotState.COMPLETED),
    (psij.JobState.CANCELED, None, PilotState.CANCELLED),
    (psij.JobState.FAILED, "TimeLimit", PilotState.COMPLETED),
    (psij.JobState.FAILED, "NodeFail", PilotState.FAILED),
])
def test_batch_states(adapter, state, message, expected):
    assert adapter._state(FakeJob(state, message)) is expected


def test_a_pilot_leaves_before_its_walltime(adapter):
    args = PilotRequest("http://s:1").worker_args(adapter.spec)
    assert args[args.index("--lifetime") + 1] == f"{3600 * LIFETIME_MARGIN:g}"
    assert adapter._state(None) is PilotState.COMPLETED, "a pilot gone from the queue has ended"


def test_pilots_move_only_forward_along_their_table():
    """Issue 13: every pilot state change goes through check_transition on PILOT_TRANSITIONS."""
    from gridbot.model.states import PILOT_TERMINAL, PILOT_TRANSITIONS, TransitionError, check_transition

    assert set(PILOT_TRANSITIONS) == set(PilotState)
    for state, targets in PILOT_TRANSITIONS.items():
        assert (not targets) == (state in PILOT_TERMINAL), state
        assert PilotState.QUEUED not in targets, "nothing goes back to the queue"
    assert check_transition(PILOT_TRANSITIONS, PilotState.QUEUED, PilotState.COMPLETED) is PilotState.COMPLETED
    with pytest.raises(TransitionError, match="cannot move from running to queued"):
        check_transition(PILOT_TRANSITIONS, PilotState.RUNNING, PilotState.QUEUED)


def test_an_attached_job_keeps_its_recorded_state_until_psij_has_polled_it(adapter):
    """After a restart a running pilot's job is NEW to psij until its first poll: not queued again."""
    adapter.jobs["77"] = FakeJob(psij.JobState.NEW)
    adapter.recorded["77"] = PilotState.RUNNING
    assert adapter.status(["77"]) == {"77": PilotState.RUNNING}
    adapter.jobs["77"] = FakeJob(psij.JobState.COMPLETED)
    assert adapter.status(["77"]) == {"77": PilotState.COMPLETED}

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

"""Issue 12 in the core: failed jobs queued again by their owner, ended bags re-opened, revisions."""

import msgspec
import pytest

from gridbot.core.changes import BagSnapshot, QueuedJob
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.states import BagState, JobState, TransitionError
from tests.unit.core_harness import CoreSim

H = HostInfo("h1", "host-1", "Linux", 4, 1024, 8, "local")


def _retry(sim: CoreSim, bag_id: int, now: float) -> None:
    """As the service does it: the failed jobs as stored, the bag as stored."""
    row = sim.store.bag(bag_id)
    failed = [QueuedJob(j.job_id, j.index, j.line, 0, j.attempts) for j in sim.store.jobs(bag_id, JobState.FAILED)]
    snapshot = BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at, row.revision)
    sim.store.apply(sim.d.retry(snapshot, row.state, failed, now))


def test_a_job_retried_behind_the_window_cursor_is_sent_again():
    sim = CoreSim(buffer_size=4)
    bag = sim.bag("b", 10, max_failures=1)
    first = sim.ask(H, 2, 1.0)
    assert [a.index for a in first] == [0, 1]
    sim.ask(H, 5, 2.0, [InstanceReport(first[0].instance_id, Outcome.FAILURE, 3, reason="exit code 3"),
                        InstanceReport(first[1].instance_id, Outcome.SUCCESS, 0)])
    assert sim.store.bag(bag).counts.failed == 1 and sim.d._s.bags[bag].window.cursor > first[0].job_id
    _retry(sim, bag, 3.0)
    counts = sim.store.bag(bag).counts
    assert (counts.failed, counts.queued, counts.running, counts.done) == (0, 7, 2, 1)
    again = sim.ask(H, 10, 4.0)
    assert [a.index for a in again] == [0, 4, 5, 6], "the window read again: no running job twice"
    job0 = sim.store.jobs(bag)[0]
    assert (job0.state, job0.failures, job0.attempts) == (JobState.RUNNING, 0, 2)


def test_an_ended_bag_is_reopened_and_a_cancelled_one_is_not():
    sim = CoreSim()
    bag = sim.bag("b", 2, max_failures=1)
    sim.ask(H, 2, 1.0)
    sim.finish_all(H, 2.0, Outcome.FAILURE)
    assert sim.store.bag(bag).state is BagState.FAILED and bag not in sim.d.view
    _retry(sim, bag, 3.0)
    assert sim.store.bag(bag).state is BagState.ACTIVE and sim.d.view.bag(bag).queued == 2
    assert sorted(a.index for a in sim.ask(H, 2, 4.0)) == [0, 1]
    sim.finish_all(H, 5.0)
    assert sim.store.bag(bag).state is BagState.COMPLETED
    other = sim.bag("c", 1)
    sim.store.apply(sim.d.cancel_bag(other, 6.0))
    row = sim.store.bag(other)
    with pytest.raises(TransitionError, match="cannot move from cancelled to active"):
        sim.d.retry(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at), row.state, [], 7.0)


def test_a_revision_withdraws_running_instances_without_counting_a_failure():
    sim = CoreSim()
    bag = sim.bag("b", 3, max_failures=1)
    out = sim.ask(H, 2, 1.0)
    spec = msgspec.structs.replace(sim.store.bag(bag).spec, command="new {i}")
    changes = sim.d.revise(bag, spec, 2, None, 2.0)
    sim.store.apply(changes)
    assert {u.reason for u in changes.instances} == {"the bag was revised (revision 2)"}
    answer = sim.exchange(H, 3, 3.0)
    assert sorted(answer.cancel) == sorted(a.instance_id for a in out), "the host is told to kill them"
    assert sorted((a.index, a.command, a.revision) for a in answer.assignments) == [
        (0, "new 0", 2), (1, "new 1", 2), (2, "new 2", 2)]
    assert [j.failures for j in sim.store.jobs(bag)] == [0, 0, 0]

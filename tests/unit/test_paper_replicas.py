"""The ways GridBot's BOINC server handled replicas, which gridbot does differently by default and keeps as
options for reproducing the paper (issue 14, experiments/replication): replicas sent before the jobs not yet
run (`replicas_first`) or drawn among them (`replicas_mixed`), and replicas left to run after the job's first
result, their results discarded (`let_replicas_finish`)."""

from gridbot.model.records import HostInfo, InstanceReport, Outcome
from tests.unit.core_harness import CoreSim

PERMISSIVE = {"Concurrency": "1", "ReplicationRequirements": "NumberOfReplicas < 2"}


def host(name: str) -> HostInfo:
    return HostInfo(name, name, "Linux-x86_64", 1, 1024, 1, "grid")


def ok(instance_id: int) -> InstanceReport:
    return InstanceReport(instance_id, Outcome.SUCCESS, 0, 100.0, 100.0)


def test_replicas_wait_for_the_queued_jobs_unless_replicas_first():
    for first in (False, True):
        sim = CoreSim(replicate_below=10, replicas_first=first)
        sim.bag("b", 3, PERMISSIVE)
        running = sim.ask(host("a"), 1, 1)[0]
        sim.tick(2)  # 2 queued, below 10: the running job gets a replica
        got = sim.ask(host("b"), 1, 3)[0]
        assert (got.job_id == running.job_id) is first


def test_mixed_replicas_are_drawn_among_the_queued_jobs_in_proportion():
    """`replicas_mixed`: with 20 replicas waiting beside 100 queued jobs, about a sixth of what hosts get are
    replicas (the 20 first with `replicas_first`, none without either), and every job still runs."""
    got = {}
    for order in ("after", "first", "mixed"):
        sim = CoreSim(replicate_below=1000, replica_queue=1000, replicas_first=order == "first",
                      replicas_mixed=order == "mixed")
        bag = sim.bag("b", 120, PERMISSIVE)
        running = {sim.ask(host(f"r{i}"), 1, 1)[0].job_id for i in range(20)}
        sim.tick(2)  # 100 queued, below 1000: each running job gets a replica
        sent = [sim.ask(host(f"n{i}"), 1, 3)[0].job_id for i in range(40)]
        got[order] = sum(1 for j in sent if j in running)
        for i in range(40, 200):
            sim.ask(host(f"n{i}"), 1, 4)
        assert sim.store.bag(bag).counts.queued == 0
    assert (got["after"], got["first"]) == (0, 20)
    assert 3 <= got["mixed"] <= 12, got  # (40 draws at 1/6 and falling as replicas go: about 6)


def test_a_replica_is_cancelled_after_the_first_result_unless_let_finish():
    for finish in (False, True):
        sim = CoreSim(let_replicas_finish=finish)
        bag = sim.bag("b", 2, PERMISSIVE)
        a, b, c = host("a"), host("b"), host("c")
        first = sim.ask(a, 1, 1)[0]
        sim.ask(c, 1, 1)  # the other job, so the bag stays open
        sim.tick(2)
        replica = sim.ask(b, 1, 3)[0]
        assert replica.job_id == first.job_id
        sim.ask(a, 0, 4, [ok(first.instance_id)])
        assert (sim.exchange(b, 0, 5).cancel == []) is finish
        if finish:
            sim.ask(b, 0, 6, [ok(replica.instance_id)])
            assert sim.store.bag(bag).counts.wasted == 1, "the late result is discarded"


def test_a_bag_that_ends_while_a_replica_runs_on_cancels_it_on_its_host():
    """A replica left to run after its job's result (`let_replicas_finish`) was dropped with its bag but kept in
    its host's list of what it runs: the host's next exchange that did not list it crashed the dispatcher
    (found by the Figure 9 experiment)."""
    sim = CoreSim(let_replicas_finish=True)
    bag = sim.bag("b", 1, PERMISSIVE)
    a, b = host("a"), host("b")
    first = sim.ask(a, 1, 1)[0]
    sim.tick(2)
    replica = sim.ask(b, 1, 3)[0]
    assert replica.job_id == first.job_id
    sim.ask(a, 0, 4, [ok(first.instance_id)])
    assert sim.store.bag(bag).state.value == "completed"
    assert sim.exchange(b, 0, 5).cancel == [replica.instance_id], "the bag ended: its replica is cancelled"
    assert sim.exchange(b, 0, 6).cancel == []  # and the host, no longer listing it, is not blamed for it
    assert sim.d.view.host("b") is not None and sim.d.view.host("b").running == 0

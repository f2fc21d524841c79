"""Issue 13 on the pure core: a policy changed on a running bag steers the next decision, whatever cache held
the old one's answers; and a Rank that depends on the host (the paper's motivating case).

The real-server versions are in tests/integration/test_policy_changes.py. Three of these found bugs of the
dispatcher (replicas chosen under the old ReplicationRequirements were still sent, a parked window stayed
parked, a GridPolicy reading the bag's attributes was judged before the bag had any)."""

import msgspec
import pytest

from gridbot.model.records import HostInfo
from gridbot.policy.policies import validate_policies
from gridbot.schedulers.overlay import bag_demands
from tests.unit.core_harness import CoreSim


def host(name: str, pool: str = "osg", slots: int = 1) -> HostInfo:
    return HostInfo(name, name, "Linux-x86_64", slots, 1024, slots, pool)


class Sim(CoreSim):
    """The core harness with what the server does around a policy: pools and their ads, the owner's change,
    and the overlay's question (which pools each bag's GridPolicy accepts)."""

    def pools(self, *names: str) -> None:
        self.d.pool_ads = {n: {"Name": n, "Kind": "local"} for n in names}

    def policy(self, bag_id: int, name: str, text: str, now: float = 0.0) -> None:
        """The owner changes one policy, as the service does: validated, stored, then used."""
        spec = self.store.bag(bag_id).spec
        written = {**spec.policy, name: text}
        validate_policies(written, spec.instance_deadline)
        spec = msgspec.structs.replace(spec, policy=written)
        self.store.set_spec(bag_id, spec)
        self.d.set_policy(bag_id, spec, now)

    def demand(self, now: float) -> dict[int, set[str]]:
        """The pools the overlay would plan pilots in for each bag with queued jobs."""
        return {d.bag_id: set(d.pools) for d in bag_demands(self.d.view, list(self.d.pool_ads), now)}


def bags(got) -> list[str]:
    return [a.bag_name for a in got]


def test_a_rank_that_depends_on_the_host_serves_the_owners_bag_first_on_its_cluster():
    """Bag home ranks 10 on its owner's cluster (pool technion) and 0 elsewhere; bag away ranks 5 everywhere.
    The cluster's host serves home first, then away; the grid's host serves away, never home."""
    sim = Sim()
    sim.bag("home", 3, {"Rank": 'Host.Pool == "technion" ? 10 : 0', "Concurrency": "1"})
    sim.bag("away", 9, {"Rank": "5", "Concurrency": "1"})
    served: dict[str, list[str]] = {"t": [], "g": []}
    for t in range(6):
        for h in (host("t", "technion"), host("g", "grid")):
            sim.finish_all(h, t)
            served[h.host_id] += bags(sim.ask(h, 1, t + 0.5))
    assert served == {"t": ["home"] * 3 + ["away"] * 3, "g": ["away"] * 6}


def test_grid_policy_changed_on_a_running_bag_applies_to_its_hosts_and_to_the_overlays_plan():
    """Issue 13: GridPolicy's answer is kept per pool; a change must drop it, or the bag keeps going to the pool
    it now excludes, and the overlay keeps planning pilots there."""
    sim = Sim()
    sim.pools("a", "b")
    g = sim.bag("g", 20, {"GridPolicy": 'Pool.Name == "a"', "Concurrency": "1"})
    ha, hb = host("ha", "a"), host("hb", "b")
    assert bags(sim.ask(ha, 1, 0)) == ["g"] and sim.ask(hb, 1, 0) == []
    assert sim.demand(0) == {g: {"a"}}
    sim.policy(g, "GridPolicy", 'Pool.Name == "b"')
    sim.finish_all(ha, 1)
    assert sim.ask(ha, 1, 1) == [] and bags(sim.ask(hb, 1, 1)) == ["g"]
    assert sim.demand(1) == {g: {"b"}}


def test_a_static_rank_changed_on_a_running_bag_reorders_it():
    """A Rank that reads neither host nor job is computed once per bag ad: a change must drop that value."""
    sim = Sim()
    sim.bag("x", 5, {"Rank": "2", "Concurrency": "1"})
    y = sim.bag("y", 5, {"Rank": "1", "Concurrency": "1"})
    h = host("h")
    assert bags(sim.ask(h, 1, 0)) == ["x"]
    sim.policy(y, "Rank", "3")
    sim.finish_all(h, 1)
    assert bags(sim.ask(h, 1, 1)) == ["y"]


def test_a_deadline_changed_on_a_running_bag_applies_to_the_instances_sent_after():
    sim = Sim()
    d = sim.bag("d", 5, {"Deadline": "60", "Concurrency": "2"})
    h = host("h", slots=2)
    [first] = sim.ask(h, 1, 0)
    sim.policy(d, "Deadline", "5")
    [second] = sim.ask(h, 1, 1)
    assert (first.instance_deadline, second.instance_deadline) == (60, 6)
    sim.tick(7)
    assert sim.store.bag(d).counts.overdue == 1, "the second is lost; the first keeps the deadline it was sent with"


def test_replication_turned_on_for_a_running_bag_replicates_at_the_next_tick():
    sim = Sim()
    r = sim.bag("r", 2, {"ReplicationRequirements": "false", "Concurrency": "1"})
    sim.ask(host("h1"), 1, 0)
    sim.ask(host("h2"), 1, 0)
    sim.tick(1)
    assert sim.ask(host("h3"), 1, 1.5) == []
    sim.policy(r, "ReplicationRequirements", "NumberOfReplicas < 2")
    sim.tick(2)
    assert bags(sim.ask(host("h3"), 1, 2.5)) == ["r"] and sim.store.bag(r).counts.replicas == 1


def test_replication_turned_off_for_a_running_bag_sends_no_replica_it_had_chosen():
    sim = Sim()
    r = sim.bag("r", 2, {"ReplicationRequirements": "NumberOfReplicas < 2", "Concurrency": "1"})
    sim.ask(host("h1"), 1, 0)
    sim.ask(host("h2"), 1, 0)
    sim.tick(1)  # both jobs chosen for a replica; no host free to take one
    sim.policy(r, "ReplicationRequirements", "false")
    assert sim.ask(host("h3"), 1, 2) == []


def test_a_bag_parked_for_matching_nobody_is_served_at_once_when_its_policy_now_matches():
    sim = Sim(buffer_size=100, buffer_ttl=600)
    stuck = sim.bag("stuck", 100, {"JobRequirements": 'Host.Pool == "nowhere"'})
    sim.bag("busy", 100, {"Concurrency": "1"})
    sim.ask(host("h"), 1, 0)
    sim.tick(601)  # stuck matched nobody for buffer_ttl while busy wanted room: its window is given up
    sim.policy(stuck, "JobRequirements", "true")
    assert bags(sim.ask(host("h2"), 1, 602)) == ["stuck"], "the oldest bag, matching now, comes first"


@pytest.mark.parametrize("when", ["submitted", "changed"])
def test_a_grid_policy_that_reads_the_bag_is_judged_with_the_bags_attributes(when):
    """No host asks after the bag is submitted (or after its GridPolicy changed, its one host gone with nothing
    running); the server's tick runs (every second), then the overlay asks which pools the bag may have
    pilots in."""
    sim = Sim()
    sim.pools("a", "b")
    grid = 'Bag.JobsQueued > 0 && Pool.Name == "b"'
    g = sim.bag("g", 20, {"GridPolicy": grid if when == "submitted" else 'Pool.Name == "a"'})
    if when == "changed":
        sim.ask(host("ha", "a"), 1, 0)
        sim.finish_all(host("ha", "a"), 0.5)
        sim.policy(g, "GridPolicy", grid)
    sim.tick(1)
    assert sim.demand(1.5) == {g: {"b"}}


def test_a_policy_changed_on_an_ended_bag_steers_its_retry():
    """`gridbot policy` is accepted on an ended bag (qos is not): its owner fixes what made it fail, then
    retries it. The failed job ran on the grid's bad host; JobRequirements now keep it to the cluster, and
    the retried job goes there and nowhere else."""
    from gridbot.core.changes import BagSnapshot, QueuedJob
    from gridbot.model.records import Outcome
    from gridbot.model.states import JobState

    sim = Sim()
    bag = sim.bag("b", 1, max_failures=1)
    grid, cluster = host("g", "grid"), host("c", "cluster")
    assert len(sim.ask(grid, 1, 1.0)) == 1
    sim.finish_all(grid, 2.0, Outcome.FAILURE)
    row = sim.store.bag(bag)
    assert row is not None and row.state.value == "failed"
    written = {**row.spec.policy, "JobRequirements": 'Host.Pool == "cluster"'}  # as Service.set_policy does
    validate_policies(written, row.spec.instance_deadline)
    spec = msgspec.structs.replace(row.spec, policy=written)
    sim.store.set_spec(bag, spec)
    assert bag not in sim.d.view  # an ended bag has left the dispatcher: only the stored spec changes
    row = sim.store.bag(bag)
    assert row is not None
    queued = [QueuedJob(j.job_id, j.index, j.line, 0, j.attempts) for j in sim.store.jobs(bag, JobState.FAILED, 10, 0)]
    sim.store.apply(sim.d.retry(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at, row.revision),
                                row.state, queued, 4.0))
    assert sim.ask(grid, 1, 5.0) == []
    got = sim.ask(cluster, 1, 5.1)
    assert [a.bag_name for a in got] == ["b"]

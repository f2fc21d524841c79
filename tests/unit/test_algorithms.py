"""GridBot's Algorithms 1 and 2 with policies, on the pure core and a fake clock.

Policies come from the paper: Figure 3, Figure 8(b) (B1-B5) and section 7's Permissive and
Restrictive scheduling and replication policies; the 50-bag rank test is Figure 7's.
"""


import msgspec
import pytest

from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.states import BagState, InstanceState
from tests.unit.core_harness import CoreSim

GRIDS = 'Host.Pool != "community"'
RESTRICTIVE_SCHEDULING = "!Tail || (Host.ErrorRate <= 0.01 && Host.RecentGoodCpuTime > 0)"
PERMISSIVE_REPLICATION = "NumberOfReplicas < 5"
RESTRICTIVE_REPLICATION = ("Job.Replica1.Host.ErrorRate > 0.01 || Job.Replica1.Host.RecentGoodCpuTime == 0 "
                           "|| Job.Replica1.RunTime > 1800")


def host(name, pool="osg", slots=4):
    return HostInfo(name, name, "Linux-x86_64", slots, 1024, slots, pool)


class Sim(CoreSim):
    pass


def ok(a, wall=100.0):
    return InstanceReport(a.instance_id, Outcome.SUCCESS, 0, wall, wall)


def test_50_bags_with_distinct_ranks_complete_in_rank_order():
    """Figure 7: equal bags submitted at once on shared hosts finish highest Rank first."""
    sim = Sim(buffer_size=5000)
    ranks = list(range(50))
    ids = {sim.bag(f"b{r}", 20, {"Rank": str(r)}): r for r in reversed(ranks)}
    hosts = [host(f"h{i}") for i in range(10)]
    t = 0.0
    while any(sim.store.bag(b).state is BagState.ACTIVE for b in ids):
        t += 1
        for h in hosts:
            sim.finish_all(h, t)
            sim.ask(h, 4, t)
    finished = sorted(ids, key=lambda b: (sim.store.bag(b).finished_at, -ids[b]))
    assert [ids[b] for b in finished] == sorted(ranks, reverse=True)


def test_concurrency_of_the_highest_ranked_bag_bounds_the_request():
    sim = Sim()
    sim.bag("low", 20, {"Rank": "1", "Concurrency": "8"})
    sim.bag("high", 20, {"Rank": "10", "Concurrency": "1"})
    got = sim.ask(host("h", slots=8), 8, 1)
    assert [a.bag_name for a in got] == ["high"]
    assert sim.ask(host("h", slots=8), 8, 2) == [], "the host already holds Concurrency instances"


def test_lower_ranked_bags_fill_what_the_top_bag_cannot():
    sim = Sim()
    sim.bag("top", 2, {"Rank": "10", "Concurrency": "6"})
    sim.bag("next", 20, {"Rank": "1", "Concurrency": "6"})
    got = sim.ask(host("h", slots=8), 6, 1)
    assert [a.bag_name for a in got] == ["top", "top", "next", "next", "next", "next"]


def test_deadline_policy_stamps_each_instance():
    sim = Sim()
    sim.bag("b", 4, {"Concurrency": "2", "Deadline": "Concurrency * 2000"})
    got = sim.ask(host("h"), 4, 100)
    assert len(got) == 2 and {a.instance_deadline for a in got} == {100 + 4000}


def test_figure_8b_policies():
    sim = Sim(tail_threshold=10)
    b2 = sim.bag("B2", 50, {"Concurrency": "Host.ErrorRate < 0.01 ? 10 : 1", "JobRequirements": GRIDS})
    good, flaky, volunteer = host("good", slots=10), host("flaky", slots=10), host("vol", "community", 10)
    assert len(sim.ask(good, 10, 1)) == 10
    a = sim.ask(flaky, 10, 1)
    sim.ask(flaky, 0, 2, [InstanceReport(x.instance_id, Outcome.FAILURE, 1, 100.0, reason="x") for x in a])
    assert len(sim.ask(flaky, 10, 3)) == 1, "a host with failures gets one job at a time"
    assert sim.ask(volunteer, 10, 3) == [], "B1-B4 run on the grids only"
    sim.store.apply(sim.d.cancel_bag(b2, 4))
    sim.bag("B5", 6, {"Concurrency": "1", "JobRequirements": f'Tail ? Host.Pool == "technion" : {GRIDS}'},
            deadline=10_000)
    technion = host("t", "technion")
    assert sim.ask(host("osg1"), 1, 5) == [], "6 queued jobs are below the tail threshold: technion only"
    assert len(sim.ask(technion, 1, 5)) == 1


def test_a_bag_smaller_than_its_buffer_share_is_not_in_its_tail_from_the_start():
    """Issue 14: 5 bags share a buffer of 20,000, so each bag's share (4,000) exceeded its 1,200 jobs and
    a tail-only policy held from the first moment. By default the tail now begins when fewer jobs are
    queued than the bag has had running at once."""
    sim = Sim()
    tail_only = {"Concurrency": "1", "JobRequirements": f'Tail ? Host.Pool == "technion" : {GRIDS}'}
    sim.bag("B5", 6, tail_only)
    for i in range(4):
        assert len(sim.ask(host(f"osg{i}"), 1, 1)) == 1, "as many queued as running, or more: throughput phase"
    assert sim.ask(host("osg4"), 1, 2) == [], "2 queued, fewer than the 4 that ran at once: the tail"
    assert len(sim.ask(host("t", "technion"), 1, 2)) == 1


def test_restrictive_scheduling_keeps_the_tail_on_reliable_hosts():
    sim = Sim(tail_threshold=6)
    sim.bag("b", 8, {"JobRequirements": RESTRICTIVE_SCHEDULING, "Concurrency": "1"})
    new, proven = host("new"), host("proven")
    assert len(sim.ask(new, 1, 1)) == 1, "not in the tail yet: any host"
    a = sim.ask(proven, 1, 1)
    sim.ask(proven, 0, 2, [ok(a[0])])
    sim.ask(host("x"), 1, 2)  # 5 left queued: below 6, the tail
    assert sim.ask(host("fresh"), 1, 3) == [], "no recent good results: not in the tail"
    assert len(sim.ask(proven, 1, 3)) == 1


def test_tail_flips_back_unless_sticky():
    for sticky in (False, True):
        sim = Sim(tail_threshold=3, tail_sticky=sticky)
        sim.bag("b", 4, {"Concurrency": "4", "JobRequirements": '!Tail || Host.Pool == "reliable"'}, max_failures=5)
        h, y = host("h"), host("y")
        first = sim.ask(h, 1, 1)
        assert len(sim.ask(y, 1, 2)) == 1, "3 queued: not yet below the threshold"
        assert sim.ask(y, 1, 3) == [], "2 queued: the tail, reliable hosts only"
        sim.ask(h, 0, 4, [InstanceReport(first[0].instance_id, Outcome.FAILURE, 1, 100.0, reason="x")])
        sim.finish_all(y, 5, Outcome.FAILURE)
        assert len(sim.ask(y, 1, 6)) == (0 if sticky else 1), "4 queued again: the tail ends unless sticky"


def test_black_hole_is_detected_and_starved_by_the_default_policy():
    sim = Sim()
    sim.bag("b", 40, {"Concurrency": "1"})
    hole, good = host("hole"), host("good")
    for t in range(3):
        a = sim.ask(hole, 1, 10 * t + 1)[0]
        sim.ask(hole, 0, 10 * t + 2, [InstanceReport(a.instance_id, Outcome.FAILURE, 1, 0.5, reason="segfault")])
        b = sim.ask(good, 1, 10 * t + 3)[0]
        assert b.job_id == a.job_id, "the failed job goes to the next host"
        sim.ask(good, 0, 10 * t + 4, [ok(b)])
    assert sim.d.view.host_attrs("hole", 100)["BlackHole"]
    assert sim.ask(hole, 1, 100) == [], "a black hole gets no work"
    assert len(sim.ask(good, 1, 100)) == 1


def test_jobs_that_fail_everywhere_blame_no_host():
    sim = Sim()
    sim.bag("bad", 10, {"Concurrency": "1"}, max_failures=2)
    hosts = [host("a"), host("b")]
    for t in range(12):
        for h in hosts:
            got = sim.ask(h, 1, t)
            if got:
                sim.ask(h, 0, t + 0.5, [InstanceReport(got[0].instance_id, Outcome.FAILURE, 1, 0.1, reason="bug")])
    assert not any(sim.d.view.host_attrs(h.host_id, 12)["BlackHole"] for h in hosts)


def test_permissive_replication_in_the_tail():
    sim = Sim()
    b = sim.bag("b", 2, {"ReplicationRequirements": PERMISSIVE_REPLICATION, "Concurrency": "2"})
    slow, idle = host("slow"), host("idle")
    first = sim.ask(slow, 2, 0)
    sim.tick(1)
    replicas = sim.ask(idle, 2, 2)
    assert sorted(a.job_id for a in replicas) == sorted(a.job_id for a in first)
    assert sim.ask(slow, 2, 3) == [], "no replica goes to a host that already runs the job"
    sim.ask(idle, 0, 4, [ok(a) for a in replicas])
    info = sim.store.bag(b)
    assert info.state is BagState.COMPLETED and info.counts.replicas == 2 and info.counts.instances == 4
    states = sorted(i.state for j in sim.store.jobs(b) for i in sim.store.instances_of(j.job_id))
    assert states.count(InstanceState.CANCELLED) == 2


def test_no_speculative_replication_while_jobs_are_queued():
    sim = Sim()
    b = sim.bag("b", 10, {"ReplicationRequirements": PERMISSIVE_REPLICATION, "Concurrency": "2"})
    sim.ask(host("a"), 2, 0)
    sim.tick(1)
    assert not sim.d.view.bag(b).waiting_replicas


def test_max_replicas_is_never_exceeded():
    sim = Sim(max_replicas=3)
    b = sim.bag("b", 1, {"ReplicationRequirements": "true", "Concurrency": "1"})
    for t in range(10):
        sim.tick(t)
        sim.ask(host(f"h{t}"), 1, t + 0.5)
    assert sim.store.bag(b).counts.instances == 3


def test_restrictive_replication_waits_for_a_reason():
    sim = Sim(host_timeout=10_000)
    warm = sim.bag("warm", 1, {"Concurrency": "1"})
    b = sim.bag("b", 1, {"ReplicationRequirements": RESTRICTIVE_REPLICATION, "Concurrency": "1"})
    proven = host("proven")
    a = sim.ask(proven, 1, 0)
    sim.ask(proven, 0, 1, [ok(a[0])])
    assert sim.store.bag(warm).state is BagState.COMPLETED
    sim.ask(proven, 1, 2)
    sim.tick(3)
    assert not sim.d.view.bag(b).waiting_replicas, "a reliable host that just started: no replica"
    sim.tick(2 + 1801)
    assert sim.d.view.bag(b).waiting_replicas, "running longer than 30 minutes: replicate"


def test_replication_samples_jobs_with_fewer_replicas_first():
    """Candidates are drawn with weight 1/replicas (section 6.2): one with 1 replica is 3x as likely as one with 3."""
    from gridbot.core.records import SplitMix
    from gridbot.schedulers.replication import weighted_sample

    picks = {"one": 0, "three": 0}
    rng = SplitMix(7)
    for _ in range(3000):
        [chosen] = weighted_sample(rng, ["one", "three"], [1.0, 1.0 / 3], 1)
        picks[chosen] += 1
    assert 2.5 < picks["one"] / picks["three"] < 3.5
    assert weighted_sample(rng, ["a", "b"], [1.0, 1.0], 5) == ["a", "b"]


def test_a_policy_changed_while_the_bag_runs_applies_to_the_next_decision():
    sim = Sim()
    b = sim.bag("b", 10, {"Concurrency": "1"})
    assert len(sim.ask(host("a"), 1, 0)) == 1
    row = sim.store.bag(b)
    sim.d.set_policy(b, msgspec.structs.replace(row.spec, policy={"JobRequirements": 'Host.Pool == "nowhere"'}), 0.0)
    assert sim.ask(host("c"), 1, 1) == []
    sim.d.set_policy(b, msgspec.structs.replace(row.spec, policy={"JobRequirements": "Host.Memory > 0"}), 0.0)
    assert len(sim.ask(host("c"), 1, 2)) == 1


def test_undefined_policy_counts_as_no_match_and_the_owner_is_told():
    sim = Sim()
    b = sim.bag("b", 3, {"JobRequirements": "Host.Pool == \"osg\" && Job.Replica1.RunTime > 0"})
    assert sim.ask(host("a"), 1, 0) == []
    said = sim.d.diagnostics(b, 1.0)
    assert any("JobRequirements evaluated to UNDEFINED" in m for m in said), said


def test_a_bag_that_no_host_matches_says_why_with_the_closest_host_and_the_clause():
    """Issue 12: a bag that is not moving tells its owner why."""
    sim = Sim()
    b = sim.bag("b", 3, {"JobRequirements": "Host.Memory > 0 && Host.Pool == \"gpu\""})
    assert sim.d.diagnostics(b, 5.0) == [], "not stuck yet: just submitted"
    assert sim.d.diagnostics(b, 20.0)[0].startswith("no worker is connected")
    assert sim.ask(host("a"), 1, 20) == []
    [message] = [m for m in sim.d.diagnostics(b, 21.0) if "connected hosts" in m]
    assert "none of the 1 connected hosts matches" in message and '`Host.Pool == "gpu"`' in message
    starve = {"Concurrency": "Host.Slots - Host.Slots"}
    sim.d.set_policy(b, msgspec.structs.replace(sim.store.bag(b).spec, policy=starve), 0.0)
    assert sim.ask(host("a"), 1, 22) == []
    assert any("Concurrency evaluates to less than the 1 slot(s)" in m for m in sim.d.diagnostics(b, 23.0))
    sim.d.set_policy(b, msgspec.structs.replace(sim.store.bag(b).spec, policy={}), 0.0)
    assert len(sim.ask(host("a"), 1, 24)) == 1
    assert not [m for m in sim.d.diagnostics(b, 25.0) if "connected" in m or "Concurrency" in m]


@pytest.mark.parametrize("policy", [{"Rank": "ElapsedTime"}, {"Rank": "Queue.BagsInQueue + Bag.JobsLeft"}])
def test_time_and_queue_attributes_are_live(policy):
    sim = Sim()
    sim.bag("b", 3, policy)
    assert len(sim.ask(host("a"), 1, 5)) == 1


def test_a_fast_black_hole_is_caught_by_its_streak_while_others_succeed():
    sim = Sim(retry_same_host_after=0)
    sim.bag("b", 100, {"Concurrency": "1"})
    hole, good = host("hole"), host("good")
    a = sim.ask(good, 1, 0)[0]
    t = 1.0
    for _ in range(4):
        x = sim.ask(hole, 1, t)[0]
        sim.ask(hole, 0, t + 0.01, [InstanceReport(x.instance_id, Outcome.FAILURE, 1, 0.01, reason="x")])
        t += 0.02
    sim.ask(good, 0, t, [ok(a)])  # another host succeeds while the streak runs
    x = sim.ask(hole, 1, t + 0.1)[0]
    sim.ask(hole, 0, t + 0.11, [InstanceReport(x.instance_id, Outcome.FAILURE, 1, 0.01, reason="x")])
    assert sim.ask(hole, 1, t + 0.2) == [], "five quick failures while others succeed: starved"
    assert len(sim.ask(hole, 1, t + 700)) == 1, "paroled after ten minutes"


def test_paroled_black_hole_and_streak_need_others_succeeding():
    import math

    from gridbot.core.hosts import HostStats

    s = HostStats()
    for i in range(6):
        s.bad(1000.0 + i, True)
    assert not s.black_hole(1006.0, others_good_at=-math.inf), "nobody succeeds: the jobs are bad, not the host"
    assert not s.black_hole(1006.0, others_good_at=300.0), "others' successes long before the streak do not count"
    assert s.black_hole(1006.0, others_good_at=999.0)
    assert not s.black_hole(1006.0 + 601, others_good_at=999.0), "paroled"


def test_a_black_hole_is_caught_before_anyone_finishes_when_others_are_busy():
    """At a bag's start nobody has a result yet; a host failing jobs in seconds while another host has
    been running one for over a minute is a black hole all the same (the simulator found the gap)."""
    import math

    from gridbot.core.hosts import HostStats

    s = HostStats()
    for i in range(5):
        s.bad(10.0 + i, True)
    assert not s.black_hole(15.0, others_good_at=-math.inf, others_busy=False)
    assert s.black_hole(15.0, others_good_at=-math.inf, others_busy=True)

    sim = Sim()
    sim.bag("b", 100, {"Concurrency": "1"})
    worker, hole = host("worker", slots=1), host("hole", slots=1)
    assert len(sim.ask(worker, 1, 0.0)) == 1  # it runs its job for minutes
    t = 1.0
    for _ in range(5):
        x = sim.ask(hole, 1, t)[0]
        sim.ask(hole, 0, t + 0.5, [InstanceReport(x.instance_id, Outcome.FAILURE, 1, 0.5, reason="no disk")])
        t += 1
    sim.tick(30.0)
    assert len(sim.ask(hole, 1, 31.0)) == 1, "before a minute, the other host's job proves nothing yet"
    sim.ask(hole, 0, 31.5, [InstanceReport(sim.held["hole"].copy().pop(), Outcome.FAILURE, 1, 0.5, reason="x")])
    sim.tick(90.0)
    assert sim.ask(hole, 1, 91.0) == [], "another host busy for over a minute: the quick failer is held back"


def test_a_bag_that_matches_nobody_gives_its_window_up_after_its_time_to_live():
    sim = Sim(buffer_size=100, buffer_ttl=600)
    stuck = sim.bag("stuck", 1000, {"JobRequirements": 'Host.Pool == "nowhere"'})
    busy = sim.bag("busy", 1000, {"Concurrency": "1"})
    h = host("h")
    got = sim.ask(h, 1, 0)
    assert {sim.d.view.bag(b).window for b in (stuck, busy)} == {50, 49}
    sim.tick(601)
    assert sim.d.view.bag(stuck).window == 0 and sim.d.view.bag(stuck).parked_until == 1201
    sim.ask(h, 1, 602, [ok(got[0])])
    assert sim.d.view.bag(busy).window == 99, "the stuck bag's share went to the busy one"
    sim.tick(1202)
    sim.ask(h, 0, 1203)
    assert sim.d.view.bag(stuck).window == 50 and sim.d.view.bag(stuck).parked_until is None, "back after its parking"
    assert sim.store.bag(stuck).counts.queued == 1000, "nothing was lost from the store"


def test_a_window_is_stale_only_once_its_cursor_went_back_over_jobs_it_changed():
    sim = Sim(buffer_size=100, buffer_ttl=600)
    picky = sim.bag("picky", 1000, {"JobRequirements": 'Host.Pool == "a"'})
    busy = sim.bag("busy", 1000, {"Concurrency": "1"})
    sim.ask(host("ha", "a"), 1, 0)
    got = sim.ask(host("hb", "b"), 1, 0)
    assert sim.d.view.bag(picky).running == 1 and sim.d.view.bag(busy).running == 1
    sim.d._s.bags[busy].window.buffer.clear()  # as if 50 results had come back: the busy window wants a refill
    [req] = sim.d.needs_feed()
    assert req.bag_id == busy and not req.stale, "its cursor is past every job it sent: nothing to flush"
    sim.feed()
    sim.tick(601)
    assert sim.d.view.bag(picky).parked_until == 1201, "no pool-a host came back: the window was given up"
    sim.ask(host("hb", "b"), 1, 602, [ok(got[0])])
    sim.tick(1202)
    stale = {r.bag_id: r.stale for r in sim.d.needs_feed()}
    assert stale == {picky: True}, "read from the start again, over a job already sent: flush first"


def test_a_bag_alone_keeps_its_window_however_long_it_waits():
    sim = Sim(buffer_size=100, buffer_ttl=600)
    stuck = sim.bag("stuck", 1000, {"JobRequirements": 'Host.Pool == "nowhere"'})
    sim.ask(host("h"), 1, 0)
    sim.tick(5000)
    assert sim.d.view.bag(stuck).window == 100


def test_jobs_that_failed_k_times_go_to_the_reliable_pool():
    sim = Sim(failover_after=2, reliable_pools=frozenset({"cluster"}), retry_same_host_after=0)
    sim.bag("b", 1, {"Concurrency": "1"}, max_failures=5)
    grid, cluster = host("g", "osg"), host("c", "cluster")
    for t in range(2):
        a = sim.ask(grid, 1, t)[0]
        sim.ask(grid, 0, t + 0.5, [InstanceReport(a.instance_id, Outcome.FAILURE, 1, 100.0, reason="preempted")])
    assert sim.ask(grid, 1, 3) == [], "failed twice: the grid host may not have it again"
    [a] = sim.ask(cluster, 1, 4)
    assert a.index == 0


def test_reliable_is_an_attribute_policies_can_use():
    sim = Sim(reliable_pools=frozenset({"cluster"}))
    sim.bag("b", 4, {"JobRequirements": "Host.Reliable"})
    assert sim.ask(host("g", "osg"), 1, 0) == []
    assert len(sim.ask(host("c", "cluster"), 1, 0)) == 1


def test_grid_policy_keeps_a_bag_off_the_hosts_of_a_pool_it_excludes():
    sim = Sim()
    sim.d.pool_ads = {"big": {"Name": "big", "Kind": "slurm"}, "fast": {"Name": "fast", "Kind": "slurm"}}
    b = sim.bag("b", 4, {"GridPolicy": 'Pool.Name != "big"'})
    assert sim.ask(host("h1", "big"), 1, 0) == []
    assert len(sim.ask(host("h2", "fast"), 1, 0)) == 1
    assert len(sim.ask(host("h3", "unlisted"), 1, 0)) == 1, "hosts of pools outside the pools file are not judged"
    assert sim.d.view.accepts_pool(b, "fast") and not sim.d.view.accepts_pool(b, "big")


def test_a_host_a_parked_bag_would_take_is_not_told_it_is_refused():
    """A pilot leaves when the bags refuse it (`WorkAnswer.refused`); a bag whose window was parked for matching
    nobody still has its jobs queued, and the host it would take must stay, even while the only bag with work
    in its window refuses it."""
    sim = Sim(buffer_size=100, buffer_ttl=600)
    picky = sim.bag("picky", 1000, {"JobRequirements": 'Host.Pool == "a"'})
    sim.bag("elsewhere", 1000, {"JobRequirements": 'Host.Pool == "b"', "Concurrency": "1"})
    got = sim.ask(host("hb", "b"), 1, 0)
    sim.tick(601)
    assert sim.d.view.bag(picky).parked_until == 1201
    sim.ask(host("hb", "b"), 0, 602, [ok(got[0])])
    answer = sim.exchange(host("ha", "a"), 1, 603)
    assert answer.assignments == [] and not answer.refused, "the parked bag would take it"
    answer = sim.exchange(host("hc", "c"), 1, 604)
    assert answer.assignments == [] and answer.refused, "no bag takes a host of pool c"

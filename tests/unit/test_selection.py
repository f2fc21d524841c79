"""Stateful resource selection (issue 18): jobs of several CPUs, and the placements `stateful` and `naive` on the
core, with monitor readings that lag (RENCI TR-08-02, Protocols 1 and 2)."""

from __future__ import annotations

import msgspec
import pytest

from gridbot.core.changes import BagSnapshot
from gridbot.model.pools import PoolMonitor, PoolSpec
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import SpecError, parse_spec
from gridbot.schedulers import registry
from gridbot.schedulers.base import StrategyError
from gridbot.schedulers.overlay import bag_demands
from gridbot.schedulers.selection import NaivePlacement, Site, StatefulPlacement

from .core_harness import CoreSim


def spec_text(n: int, cpus: int = 1, strategy: str = "", policy: str = "") -> str:
    return (f'command = "job {{i}}"\ncpus = {cpus}\n[parameters]\ni = {{ from = 0, to = {n - 1} }}\n'
            + (f"[strategy]\n{strategy}\n" if strategy else "") + (f"[policy]\n{policy}\n" if policy else ""))


def add(sim: CoreSim, name: str, n: int, cpus: int = 1, strategy: str = "", policy: str = "", at: float = 0.0) -> int:
    spec = parse_spec(spec_text(n, cpus, strategy, policy), "t", name)
    row = sim.store.create_bag(spec, None, {}, at)
    sim.d.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
    return row.bag_id


def host(name: str, pool: str = "local", slots: int = 4) -> HostInfo:
    return HostInfo(f"{name:0<20}"[:20], name, "Linux-x86_64", slots, 16384, slots, pool)


# -- jobs of several CPUs --------------------------------------------------------------------------------

def test_cpus_is_read_from_the_spec_and_bad_values_name_the_fix():
    assert parse_spec(spec_text(2, 8), "t", "b").cpus == 8
    assert parse_spec('command = "x"', "t", "b").cpus == 1
    for bad in ("0", "-2", "1.5", '"8"', "true", "100000"):
        with pytest.raises(SpecError, match=r"'cpus' must be a whole number of CPUs one job needs.*cpus = 8"):
            parse_spec(f'command = "x"\ncpus = {bad}', "t", "b")


def test_a_host_gets_jobs_by_slots_and_never_more_than_its_free_slots_hold():
    sim = CoreSim()
    add(sim, "wide", 5, cpus=2)
    h = host("a", slots=4)
    got = sim.ask(h, 4, 1.0)
    assert [a.cpus for a in got] == [2, 2], "four slots hold two jobs of two CPUs"
    assert sim.ask(h, 1, 2.0) == [], "one free slot holds no job of two"
    assert sim.ask(host("b", slots=1), 1, 3.0) == [], "a one-slot host never gets one"
    sim.finish_all(h, 4.0)
    assert len(sim.ask(h, 3, 5.0)) == 1, "three free slots: one more job of two, not one and a half"


def test_a_narrow_bag_fills_the_slot_a_wide_one_leaves():
    sim = CoreSim()
    add(sim, "wide", 4, cpus=3)
    add(sim, "narrow", 4, cpus=1)
    got = sim.ask(host("a", slots=4), 4, 1.0)
    assert sorted(a.cpus for a in got) == [1, 3]


def test_job_cpus_and_memory_are_in_the_policies_ads():
    sim = CoreSim()
    add(sim, "wide", 2, cpus=4, policy='JobRequirements = "Host.NumCpus >= Job.Cpus * 2"')
    assert sim.ask(host("small", slots=4), 4, 1.0) == [], "4 CPUs is less than 2 x Job.Cpus"
    assert len(sim.ask(host("big", slots=8), 8, 1.0)) == 2


def test_the_overlay_asks_slots_for_a_wide_bag_only_from_pools_whose_pilots_hold_a_job():
    sim = CoreSim()
    add(sim, "wide", 3, cpus=4)
    sim.d.pool_ads = {"narrow": PoolSpec("narrow", "local", cpus=2).ad(),
                      "wide": PoolSpec("wide", "local", cpus=8).ad()}
    sim.feed()
    (demand,) = bag_demands(sim.d.view, ["narrow", "wide"], 0.0)
    assert demand.slots == 12 and demand.pools == frozenset({"wide"})


# -- stateful and naive ------------------------------------------------------------------------------------

def two_sites(sim: CoreSim, free: int = 4, at: float = 0.0, lag: float = 0.0) -> None:
    """Two sites of 4 CPUs, `fast` twice as fast as `slow`, with monitor readings taken at `at`."""
    sim.d.pool_ads = {
        "fast": {**PoolSpec("fast", "slurm", cpus=2, max_running=2).ad(), "Speed": 2.0},
        "slow": {**PoolSpec("slow", "slurm", cpus=2, max_running=2).ad(), "Speed": 1.0}}
    for name in ("fast", "slow"):
        sim.d.monitor(name, PoolMonitor(free, 4, observed_at=at, lag=lag, source="test"))


def routes(sim: CoreSim, bag_id: int) -> list[str]:
    view = sim.d.view.bag(bag_id)
    return [next(iter(j.pools)) for j in view.queued_jobs(100) if j.pools]


def test_stateful_spreads_a_burst_that_naive_sends_to_the_site_that_looked_free():
    for name, expect in (("stateful", ["fast", "fast", "slow", "slow"]), ("naive", ["fast"] * 4)):
        sim = CoreSim()
        two_sites(sim)
        bag = add(sim, "burst", 4, cpus=2, strategy=f'placement = "{name}"')
        sim.feed()
        sim.tick(1.0)
        assert routes(sim, bag) == expect, name


def test_placed_work_counts_until_a_reading_taken_after_it_started_shows_it():
    sim = CoreSim()
    two_sites(sim, at=0.0)
    bag = add(sim, "a", 2, cpus=2, strategy='placement = "stateful"')
    sim.feed()
    sim.tick(1.0)
    assert routes(sim, bag) == ["fast", "fast"]
    got = sim.ask(host("f1", "fast", slots=2), 2, 5.0) + sim.ask(host("f2", "fast", slots=2), 2, 5.0)
    assert len(got) == 2
    factory = sim.d._strategies
    selector = factory.selectors[("stateful", "")]
    assert len(selector.placed) == 2
    # a reading taken before they started does not show them: they still count
    sim.d.monitor("fast", PoolMonitor(4, 4, observed_at=4.0, source="test"))
    sim.tick(6.0)
    assert len(selector.placed) == 2
    # one taken after, but with a lag of 150 s (MDS), does not either
    sim.d.monitor("fast", PoolMonitor(0, 4, observed_at=60.0, lag=150.0, source="test"))
    sim.tick(61.0)
    assert len(selector.placed) == 2
    sim.d.monitor("fast", PoolMonitor(0, 4, observed_at=200.0, lag=150.0, source="test"))
    sim.tick(201.0)
    assert selector.placed == {}, "the monitor shows them now: they are no longer subtracted"
    # the next bag trusts that reading: fast is full, slow is not
    other = add(sim, "b", 1, cpus=2, strategy='placement = "stateful"', at=201.0)
    sim.feed()
    sim.tick(202.0)
    assert routes(sim, other) == ["slow"]


def test_the_fallback_when_no_site_fits_best_takes_the_most_free_random_any():
    sites = [Site("a", 1, 3, -2, 10.0, 0.0), Site("b", 2, 1, 1, 20.0, 0.0), Site("c", 0, 0, 0, 5.0, 0.0)]
    best = StatefulPlacement(1, 7, {"fallback": "best"})
    site, why = best.choose(sites, 2)
    assert site.pool == "b" and "fallback best" in why
    rnd = StatefulPlacement(1, 7, {"fallback": "random"})
    chosen = {rnd.choose(sites, 2)[0].pool for _ in range(60)}
    assert chosen == {"a", "b", "c"}
    fits = best.choose(sites, 1)
    assert fits[0].pool == "b" and "fastest of 1" in fits[1]
    assert best.choose([*sites, Site("d", 4, 0, 4, 5.0, None)], 2)[0].pool == "d", "the fastest that fits"


def test_streams_do_not_see_each_others_placements_and_one_stream_shares_them():
    for streams, expect in ((("x", "x"), ["fast", "slow"]), (("x", "y"), ["fast", "fast"])):
        sim = CoreSim()
        two_sites(sim, free=2)
        b1 = add(sim, "one", 1, cpus=2, strategy=f'placement = "stateful"\nstream = "{streams[0]}"')
        b2 = add(sim, "two", 1, cpus=2, strategy=f'placement = "stateful"\nstream = "{streams[1]}"')
        sim.feed()
        sim.tick(1.0)
        assert routes(sim, b1) + routes(sim, b2) == expect, streams


def test_the_story_says_why_and_the_overlay_gets_slots_where_jobs_were_placed():
    sim = CoreSim()
    two_sites(sim)
    add(sim, "s", 3, cpus=2, strategy='placement = "stateful"')
    sim.feed()
    sim.tick(1.0)
    demands = {next(iter(d.pools)): d.slots for d in bag_demands(sim.d.view, ["fast", "slow"], 1.0)}
    assert demands == {"fast": 4, "slow": 2}
    whys = [d.why for job_id in (1, 2, 3) for d in sim.store.story(job_id).decisions]
    assert whys[0].startswith("to fast: stateful: fastest of 2 site(s) with 2 CPU(s) free: fast 4 CPU(s) free "
                              "(4 by its monitor 1 s ago, less 0 placed and not yet shown)"), whys[0]
    assert "slow 4 CPU(s) free (4 by its monitor 1 s ago, less 0" in whys[2], whys[2]
    assert "others: slow 4" in whys[1] and "fast 0" in whys[2]


def test_a_site_with_no_monitor_is_counted_from_gridbots_own_records():
    sim = CoreSim()
    sim.d.pool_ads = {"own": {**PoolSpec("own", "local", cpus=2, max_running=1).ad(), "Speed": 2.0},
                      "other": PoolSpec("other", "local", cpus=2, max_running=4).ad()}
    bag = add(sim, "s", 3, cpus=2, strategy='placement = "stateful"')
    sim.feed()
    sim.tick(1.0)
    assert sorted(routes(sim, bag)) == ["other", "other", "own"]


def test_options_are_checked_with_a_message_naming_the_fix():
    with pytest.raises(StrategyError, match="fallback = 'nearest' is not one of random, best"):
        StatefulPlacement.validate({"fallback": "nearest"})
    with pytest.raises(StrategyError, match="runtime = -1"):
        StatefulPlacement.validate({"runtime": -1.0})
    registry.check(parse_spec(spec_text(1, 2, 'placement = "naive"\nstream = "a"'), "t", "b").strategy)
    assert NaivePlacement.options["fallback"] == "random", "the report's naive protocol picks at random"


def test_a_job_that_ends_before_any_reading_shows_it_is_forgotten():
    sim = CoreSim()
    two_sites(sim)
    add(sim, "s", 1, cpus=2, strategy='placement = "stateful"')
    sim.feed()
    sim.tick(1.0)
    h = host("f1", "fast", slots=2)
    (a,) = sim.ask(h, 2, 2.0)
    sim.exchange(h, 0, 3.0, [InstanceReport(a.instance_id, Outcome.SUCCESS, 0, 1.0, 1.0, "")])
    selector = sim.d._strategies.selectors[("stateful", "")]
    add(sim, "t", 1, cpus=2, strategy='placement = "stateful"', at=4.0)
    sim.feed()
    sim.tick(4.0)
    assert a.job_id not in selector.placed and len(selector.placed) == 1


def test_a_bag_whose_jobs_no_host_can_hold_says_so_and_how_to_fix_it():
    sim = CoreSim()
    bag = add(sim, "wide", 2, cpus=8)
    sim.ask(host("a", slots=4), 4, 0.0)
    sim.tick(20.0)
    (why,) = sim.d.diagnostics(bag, 20.0)
    assert why == ("its jobs need 8 CPUs each and the widest connected host has 4 slots: set cpus = 8 (or more) on "
                   "a pool of the pools file, or start `gridbot worker --slots 8`")


def test_a_pools_measured_bandwidth_weighs_in_when_inputs_are_large():
    sim = CoreSim()
    sim.d.pool_ads = {"near": PoolSpec("near", "local", cpus=2, max_running=2).ad(),
                      "far": {**PoolSpec("far", "local", cpus=2, max_running=2).ad(), "Speed": 1.5}}
    # hosts of each pool told what their input downloads took: 100 MB/s near, 1 MB/s far
    sim.d.request_work(host("n1", "near", slots=2), 0, [], 0.0, (), (200_000_000, 2.0))
    sim.d.request_work(host("f1", "far", slots=2), 0, [], 0.0, (), (2_000_000, 2.0))
    pools = sim.d.view.pools(1.0)
    assert pools["near"].bandwidth == pytest.approx(100.0) and pools["far"].bandwidth == pytest.approx(1.0)
    small = add(sim, "small", 1, cpus=2, strategy='placement = "stateful"\nruntime = 600.0')
    large = add(sim, "large", 1, cpus=2, strategy='placement = "stateful"\nruntime = 600.0\ninput_mb = 500.0')
    sim.feed()
    sim.tick(1.0)
    assert routes(sim, small) == ["far"], "no inputs: the faster CPUs win (400 s against 600 s)"
    assert routes(sim, large) == ["near"], "500 MB: 605 s near against 900 s far"


@pytest.mark.parametrize("fetched", [(1000, 1e-300), (1000, 5e-324), (2**63 - 1, 1e-9), (2**63 - 1, 999_999.0)])
def test_a_download_timed_at_no_time_or_of_2_to_the_63_bytes_makes_no_bandwidth_infinite(fetched):
    """Found by the bad-input hunt: a worker's report of 1000 bytes fetched in 1e-300 s made its pool's bandwidth
    inf, which `GET /v1/pools` sent as JSON's null (the client then refused the answer) and stateful selection
    planned with; 2^63 bytes made it absurd. A report counts at most at MAX_FETCH_RATE, and one that would take
    over MAX_FETCH_SECONDS even so is not counted."""
    from gridbot.core.records import MAX_FETCH_RATE
    from gridbot.protocol import PoolInfo

    sim = CoreSim()
    sim.d.request_work(host("n1", "near", slots=2), 0, [], 0.0, (), (200_000_000, 2.0))
    sim.d.request_work(host("n1", "near", slots=2), 0, [], 1.0, (), fetched)
    bandwidth = sim.d.view.pools(1.0)["near"].bandwidth
    assert 0 < bandwidth <= MAX_FETCH_RATE / 1e6, bandwidth
    if fetched[0] == 2**63 - 1:
        assert bandwidth == pytest.approx(100.0), "not counted: it would take years even at 100 GB/s"
    info = PoolInfo("near", "local", 0, 0, 0, 0, 0, 1, 0, 0.0, "", 1, 1, None, bandwidth)
    assert msgspec.json.decode(msgspec.json.encode(info), type=PoolInfo).bandwidth == bandwidth

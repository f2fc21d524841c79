"""Review findings on issues 18 and 19 (cpus, stateful/naive placement, quorum): each test is a strict xfail that
shows one bug; it passes once the bug is fixed."""

from __future__ import annotations

from gridbot.core.changes import BagSnapshot
from gridbot.model.pools import PoolMonitor, PoolSpec
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import parse_spec
from gridbot.schedulers.overlay import bag_demands

from .core_harness import CoreSim


def add(sim: CoreSim, name: str, n: int, extra: str = "", at: float = 0.0) -> int:
    spec = parse_spec(f'command = "job {{i}}"\n{extra}\n[parameters]\ni = {{ from = 0, to = {n - 1} }}\n', "t", name)
    row = sim.store.create_bag(spec, None, {}, at)
    sim.d.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
    return row.bag_id


def host(name: str, pool: str = "local", slots: int = 4, prefetch: int = 0, account: str = "") -> HostInfo:
    return HostInfo(f"{name:0<20}"[:20], name, "Linux-x86_64", slots, 16384, slots, pool, prefetch, account=account)


def ok(iid: int, out: str = "42\n", files: dict[str, bytes] | None = None) -> InstanceReport:
    return InstanceReport(iid, Outcome.SUCCESS, 0, 1.0, 1.0, "", out, "", files or {})


def routes(sim: CoreSim, bag_id: int) -> list[str]:
    view = sim.d.view.bag(bag_id)
    assert view is not None
    return [next(iter(j.pools)) for j in view.queued_jobs(1000) if j.pools]


# -- slots ------------------------------------------------------------------------------------------------------

def test_a_job_wider_than_the_host_never_goes_there_even_when_it_prefetches():
    sim = CoreSim()
    add(sim, "wide", 2, "cpus = 4")
    narrow = host("narrow", slots=2, prefetch=4)  # Concurrency = 2 + 4 = 6, want = 2 + 4 = 6
    got = sim.ask(narrow, 6, 1.0)
    assert got == [], [a.cpus for a in got]


def test_a_higher_ranked_wide_bag_is_not_starved_by_a_narrow_one_on_a_busy_host():
    sim = CoreSim()
    add(sim, "narrow", 200)
    h = host("a", slots=4)
    first = sim.ask(h, 4, 0.0)
    assert len(first) == 4
    wide = add(sim, "wide", 1, 'cpus = 4\n[policy]\nRank = "10"', at=1.0)
    held = list(first)
    sent_wide = False
    for t in range(1, 60):  # the narrow jobs end one at a time (staggered), and the host asks for its free slots
        done = held.pop(0)
        got = sim.ask(h, 4 - len(held), float(t), [ok(done.instance_id)])
        held.extend(got)
        sent_wide = sent_wide or any(a.bag_id == wide for a in got)
    assert sent_wide, "60 exchanges later the wide, higher-ranked bag has still not had its 4 slots"


# -- quorum -----------------------------------------------------------------------------------------------------

def test_one_host_never_makes_a_quorum_alone_by_changing_its_declared_account():
    sim = CoreSim()
    bag = add(sim, "q", 1, "quorum = 2")
    (i1,) = sim.ask(host("h", account="x"), 1, 1.0)
    sim.exchange(host("h", account="x"), 0, 2.0, [ok(i1.instance_id, "forged\n")])
    again = sim.ask(host("h", account="y"), 1, 3.0)  # the same host (same id and credential), another account
    if again:
        sim.exchange(host("h", account="y"), 0, 4.0, [ok(again[0].instance_id, "forged\n")])
    (row,) = sim.store.jobs(bag, None, 10, 0)
    assert row.state.value != "done", "a quorum of 2 accepted from a single host"


def test_a_job_that_failed_for_want_of_a_quorum_returns_no_unvalidated_result():
    sim = CoreSim()
    bag = add(sim, "q", 1, 'quorum = 2\nmax_instances = 2\noutputs = ["out.txt"]')
    a, b = host("a", account="alice"), host("b", account="bob")
    (i1,) = sim.ask(a, 1, 1.0)
    (i2,) = sim.ask(b, 1, 1.1)
    sim.exchange(a, 0, 2.0, [ok(i1.instance_id, "42\n", {"out.txt": b"42"})])
    sim.exchange(b, 0, 2.1, [ok(i2.instance_id, "corrupt\n", {"out.txt": b"corrupt"})])
    (r,) = sim.store.results(bag)
    assert r.job.state.value == "failed"
    shown = r.instance.stdout_tail if r.instance is not None else ""
    assert shown not in ("42\n", "corrupt\n") and not r.outputs, (shown, r.outputs)


# -- stateful placement -----------------------------------------------------------------------------------------

def two_sites(sim: CoreSim) -> None:
    """`fast` (Speed 2) and `slow` (Speed 1), each a 4-CPU partition of 2-CPU pilots."""
    sim.d.pool_ads = {
        "fast": {**PoolSpec("fast", "slurm", cpus=2, max_running=2).ad(), "Speed": 2.0},
        "slow": {**PoolSpec("slow", "slurm", cpus=2, max_running=2).ad(), "Speed": 1.0}}


def test_a_job_started_on_a_pilot_the_monitor_already_shows_is_not_subtracted_twice():
    sim = CoreSim()
    two_sites(sim)
    pilot = host("f1", "fast", slots=2)
    sim.ask(pilot, 0, 0.0)  # a pilot of `fast` is up (Slurm counts its 2 CPUs as allocated) and idle
    sim.d.monitor("fast", PoolMonitor(2, 4, observed_at=0.5, source="test"))  # the other 2 CPUs are free
    sim.d.monitor("slow", PoolMonitor(4, 4, observed_at=0.5, source="test"))
    first = add(sim, "a", 1, 'cpus = 2\n[strategy]\nplacement = "stateful"', at=1.0)
    sim.feed()
    sim.tick(1.0)
    assert routes(sim, first) == ["fast"], "4 free on fast (2 by the monitor, 2 idle on its pilot)"
    (a,) = sim.ask(pilot, 2, 2.0)  # it runs on the idle pilot: fast still has 2 CPUs free
    assert a.bag_id == first
    second = add(sim, "b", 1, 'cpus = 2\n[strategy]\nplacement = "stateful"', at=3.0)
    sim.feed()
    sim.tick(3.0)
    assert routes(sim, second) == ["fast"], "fast has 2 free CPUs and is twice as fast"


def test_stateful_never_routes_jobs_to_a_pool_that_has_no_host_and_cannot_start_one():
    sim = CoreSim()
    sim.d.pool_ads = {"desktops": PoolSpec("desktops", "static").ad(),
                      "cluster": PoolSpec("cluster", "slurm", cpus=2, max_running=1).ad()}
    pilot = host("c1", "cluster", slots=2)
    sim.ask(pilot, 0, 0.0)  # the cluster's one pilot is up and idle
    sim.d.monitor("cluster", PoolMonitor(0, 2, observed_at=0.5, source="test"))  # (its own 2 CPUs are the pilot's)
    bag = add(sim, "s", 2, '[strategy]\nplacement = "stateful"', at=1.0)
    sim.feed()
    sim.tick(1.0)
    assert "desktops" not in routes(sim, bag), routes(sim, bag)
    assert len(sim.ask(pilot, 2, 2.0)) == 2, "the idle pilot gets the jobs"


def test_an_invalid_result_does_not_count_as_a_good_one_for_its_host():
    sim = CoreSim()
    add(sim, "q", 1, "quorum = 2")
    a, b, c = host("a", account="alice"), host("b", account="bob"), host("c", account="carol")
    (i1,) = sim.ask(a, 1, 1.0)
    (i2,) = sim.ask(b, 1, 1.0)
    sim.exchange(a, 0, 2.0, [ok(i1.instance_id, "42\n")])
    sim.exchange(b, 0, 2.0, [ok(i2.instance_id, "garbage\n")])
    (i3,) = sim.ask(c, 1, 3.0)
    sim.exchange(c, 0, 4.0, [ok(i3.instance_id, "42\n")])
    attrs = sim.d.view.host_attrs(b.host_id, 5.0)
    assert attrs["InvalidRate"] == 1.0
    assert attrs["JobsDone"] == 0 and attrs["ErrorRate"] > 0, (attrs["JobsDone"], attrs["ErrorRate"])


# -- the overlay's demand for wide jobs -------------------------------------------------------------------------

def test_idle_fragments_of_pilots_are_no_capacity_for_a_job_wider_than_each():
    from gridbot.schedulers.overlay import bag_demands, host_slots, plan, pool_capacity

    sim = CoreSim()
    spec = PoolSpec("p", "local", cpus=4, max_running=8)
    sim.d.pool_ads = {"p": spec.ad()}
    add(sim, "narrow", 12)
    pilots = [host(f"p{i}", "p", slots=4) for i in range(4)]
    for h in pilots:
        assert len(sim.ask(h, 3, 1.0)) == 3  # each pilot runs three one-CPU jobs: one slot idle
    add(sim, "wide", 1, "cpus = 4", at=2.0)
    sim.feed()
    demands = bag_demands(sim.d.view, ["p"], 2.0)
    capacity = pool_capacity(spec, 0, 4, host_slots(sim.d.view, 2.0)["p"], True)
    assert plan(demands, [capacity]).submit == {"p": 1}, "one 4-slot pilot for the 4-CPU job"


def test_retrying_a_job_that_failed_for_want_of_a_quorum_can_complete_it():
    from gridbot.core.changes import QueuedJob
    from gridbot.model.states import JobState

    sim = CoreSim()
    bag = add(sim, "q", 1, "quorum = 2\nmax_instances = 2")
    a, b, c, d = (host(n, account=n) for n in ("a", "b", "c", "d"))
    (i1,) = sim.ask(a, 1, 1.0)
    (i2,) = sim.ask(b, 1, 1.1)
    sim.exchange(a, 0, 2.0, [ok(i1.instance_id, "1\n")])
    sim.exchange(b, 0, 2.1, [ok(i2.instance_id, "2\n")])
    row = sim.store.bag(bag)
    assert row is not None and row.state.value == "failed"
    failed = sim.store.jobs(bag, JobState.FAILED, 10, 0)
    queued = [QueuedJob(j.job_id, j.index, j.line, 0, j.attempts) for j in failed]
    sim.store.apply(sim.d.retry(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at, row.revision),
                                row.state, queued, 3.0))
    got = sim.ask(c, 1, 4.0) + sim.ask(d, 1, 4.1)
    assert len(got) == 2, "the retried job goes to two hosts for its quorum"
    for h, x in zip((c, d), got, strict=True):
        sim.exchange(h, 0, 5.0, [ok(x.instance_id, "1\n")])
    (job,) = sim.store.jobs(bag, None, 10, 0)
    assert job.state.value == "done", job.reason


def test_a_revision_forgets_the_quorum_votes_given_for_the_old_command():
    sim = CoreSim()
    bag = add(sim, "q", 1, "quorum = 2")
    a, b, c = host("a", account="alice"), host("b", account="bob"), host("c", account="carol")
    (i1,) = sim.ask(a, 1, 1.0)
    sim.exchange(a, 0, 2.0, [ok(i1.instance_id, "old\n")])  # a result of the first command: one vote of two
    new = parse_spec('command = "job2 {i}"\nquorum = 2\n[parameters]\ni = { from = 0, to = 0 }\n', "t", "q")
    revised = sim.store.revise(bag, new, None, {}, 3.0)
    sim.store.apply(sim.d.revise(bag, new, revised.revision, None, 3.0))
    for t, h in enumerate((b, c)):  # (the stale vote also keeps the new revision's second copy from going out)
        (x,) = sim.ask(h, 1, 4.0 + t)
        sim.exchange(h, 0, 4.5 + t, [ok(x.instance_id, "new\n")])
    (job,) = sim.store.jobs(bag, None, 10, 0)
    assert job.state.value == "done"
    assert sim.d.view.host_attrs(a.host_id, 6.0)["InvalidRate"] == 0.0, "alice ran the old command right"


# -- the hot path -----------------------------------------------------------------------------------------------

def test_jobs_routed_elsewhere_do_not_make_every_exchange_walk_them():
    """(Counted, not timed: an exchange walks the bag's re-queued jobs, where jobs routed elsewhere wait.)"""
    from gridbot.core.config import DispatchConfig
    from gridbot.core.dispatcher import Dispatcher
    from gridbot.schedulers.registry import factory

    sim = CoreSim()
    sim.d = Dispatcher(DispatchConfig(check_invariants=False), factory())  # (the checks walk every job)
    sim.d.pool_ads = {"fast": {**PoolSpec("fast", "local", max_running=100_000).ad(), "Speed": 2.0},
                      "slow": PoolSpec("slow", "local", max_running=10).ad()}
    bag = add(sim, "s", 20_000, '[strategy]\nplacement = "stateful"')  # (ahead: 100 placed and waiting at most)
    hosts = [host(f"s{i}", "slow", slots=1) for i in range(10)]
    for r in range(10):
        sim.feed()
        sim.tick(1.0 + r)
        for h in hosts:
            sim.d.request_work(h, 1, [], 1.5 + r)
    record = sim.d._s.bags[bag]
    assert len(record.retry) <= 100, f"{len(record.retry):,} jobs every exchange walks"


def test_stateful_routing_keeps_the_jobs_held_in_memory_within_the_buffer():
    from gridbot.core.config import DispatchConfig
    from gridbot.core.dispatcher import Dispatcher
    from gridbot.schedulers.registry import factory

    sim = CoreSim()
    sim.d = Dispatcher(DispatchConfig(check_invariants=False, buffer_size=1000), factory())
    sim.d.pool_ads = {"fast": {**PoolSpec("fast", "local", max_running=100_000).ad(), "Speed": 2.0},
                      "slow": PoolSpec("slow", "local", max_running=10).ad()}
    bag = add(sim, "s", 20_000, '[strategy]\nplacement = "stateful"')
    record = sim.d._s.bags[bag]
    h = host("s0", "slow", slots=1)
    for r in range(6):
        sim.feed()
        sim.tick(1.0 + r)
        sim.d.request_work(h, 1, [], 1.5 + r)
    held = len(record.window.buffer) + len(record.retry)
    assert held <= 1000, f"{held:,} queued jobs held for a buffer of 1,000"


def test_a_quorum_bag_that_only_one_account_can_run_says_why_it_waits():
    sim = CoreSim()
    bag = add(sim, "q", 3, "quorum = 2")
    a = host("a", slots=4)
    got = sim.ask(a, 4, 1.0)
    sim.exchange(a, 0, 2.0, [ok(x.instance_id) for x in got])
    assert sim.ask(a, 4, 3.0) == [], "its account voted on every job: nothing more for it"
    sim.tick(400.0)
    sim.ask(a, 4, 400.0)
    why = sim.d.diagnostics(bag, 400.0)
    assert any("quorum" in w or "account" in w for w in why), why


def test_a_trusted_hosts_result_counts_alone_even_for_a_copy():
    sim = CoreSim()
    sim.d.pool_ads = {"cluster": PoolSpec("cluster", "local", trusted=True).ad(),
                      "volunteers": PoolSpec("volunteers", "static").ad()}
    bag = add(sim, "q", 1, "quorum = 2")
    volunteer, own = host("v", "volunteers", account="vic"), host("own", "cluster")
    (first,) = sim.ask(volunteer, 1, 1.0)
    (copy,) = sim.ask(own, 1, 1.1)
    assert copy.job_id == first.job_id
    sim.exchange(own, 0, 2.0, [ok(copy.instance_id)])
    (row,) = sim.store.jobs(bag, None, 10, 0)
    assert row.state.value == "done", "the trusted cluster's result is a quorum of one"


def test_a_job_routed_to_a_pool_its_bag_no_longer_accepts_can_still_run():
    import msgspec

    sim = CoreSim()
    two_sites(sim)
    for name in ("fast", "slow"):
        sim.d.monitor(name, PoolMonitor(4, 4, observed_at=0.0, source="test"))
    bag = add(sim, "s", 2, '[strategy]\nplacement = "stateful"')
    sim.feed()
    sim.tick(1.0)
    assert routes(sim, bag) == ["fast", "fast"]
    spec = sim.d._s.bags[bag].spec
    sim.d.set_policy(bag, msgspec.structs.replace(spec, policy={"GridPolicy": 'Pool.Name == "slow"'}), 2.0)
    sim.tick(3.0)
    got = sim.ask(host("s1", "slow", slots=2), 2, 4.0)
    assert len(got) == 2, "the only pool the bag accepts now has a host asking"


def test_a_restart_keeps_the_quorum_votes_already_in():
    from gridbot.core.config import DispatchConfig
    from gridbot.core.dispatcher import Dispatcher
    from gridbot.schedulers.registry import factory

    sim = CoreSim()
    bag = add(sim, "q", 1, "quorum = 2")
    a, b = host("a", account="alice"), host("b", account="bob")
    (i1,) = sim.ask(a, 1, 1.0)
    (i2,) = sim.ask(b, 1, 1.1)
    sim.exchange(a, 0, 2.0, [ok(i1.instance_id)])
    restarted = Dispatcher(DispatchConfig(check_invariants=True), factory())
    restarted.restore(sim.store.snapshot())
    restarted.grace(3.0)
    sim.d = restarted
    sim.exchange(b, 0, 4.0, [ok(i2.instance_id)])
    (row,) = sim.store.jobs(bag, None, 10, 0)
    assert row.state.value == "done", "alice's result and bob's agree"


# -- policies ---------------------------------------------------------------------------------------------------

def test_a_wide_bag_whose_concurrency_is_below_its_cpus_runs_or_says_why():
    sim = CoreSim()
    bag = add(sim, "w", 2, 'cpus = 2\n[policy]\nConcurrency = "1"')
    h = host("a", slots=8)
    got = sim.ask(h, 8, 1.0)
    sim.tick(30.0)
    sim.ask(h, 8, 30.0)
    assert got or sim.d.diagnostics(bag, 30.0), "no instance, and no word why"


def test_a_tick_with_a_stateful_bag_whose_jobs_are_all_placed_is_cheap(monkeypatch):
    """(Counted, not timed: a tick used to build a view of every queued job, 40,000 a tick for 20,000 jobs.)"""
    from gridbot.core import view as view_module
    from gridbot.core.config import DispatchConfig
    from gridbot.core.dispatcher import Dispatcher
    from gridbot.schedulers.registry import factory

    sim = CoreSim()
    sim.d = Dispatcher(DispatchConfig(check_invariants=False), factory())
    sim.d.pool_ads = {"fast": {**PoolSpec("fast", "local", max_running=100_000).ad(), "Speed": 2.0},
                      "slow": PoolSpec("slow", "local", max_running=10).ad()}
    add(sim, "s", 20_000, '[strategy]\nplacement = "stateful"\nahead = 100000')
    sim.feed()
    sim.tick(1.0)  # places them all
    built = [0]
    real = view_module._job_view

    def counting(j):
        built[0] += 1
        return real(j)

    monkeypatch.setattr(view_module, "_job_view", counting)
    for r in range(3):
        sim.d.tick(2.0 + r)
        bag_demands(sim.d.view, ["fast", "slow"], 2.0 + r)
    assert built[0] <= 100, f"{built[0]:,} job views built by 3 ticks and overlay steps with nothing left to place"


def test_a_host_that_cheats_only_where_it_is_not_checked_is_caught():
    sim = CoreSim()
    sim.d.reseed(987654321)  # the server's secret seed
    add(sim, "q", 200, "quorum = 2\nspot_check = 0.25")
    a, b, c = host("a", account="alice"), host("b", account="bob"), host("c", account="carol")
    for t in range(10):  # a builds its record honestly
        (x,) = sim.ask(a, 1, 10.0 * t)
        (y,) = sim.ask(b, 1, 10.0 * t + 1)
        sim.exchange(a, 0, 10.0 * t + 2, [ok(x.instance_id)])
        sim.exchange(b, 0, 10.0 * t + 3, [ok(y.instance_id)])
    for t in range(60):
        now = 200.0 + 10 * t
        (x,) = sim.ask(a, 1, now)
        # what the host could work out from the job id alone (the old rule): it forges where that says no check
        checked = (x.job_id * 2654435761 % 4294967296) / 4294967296 < 0.25
        sim.exchange(a, 0, now + 1, [ok(x.instance_id, "42\n" if checked else "forged\n")])
        for h in (b, c):  # honest hosts take what they get (the copies first) and break a tie
            for g in sim.ask(h, 1, now + 2):
                sim.exchange(h, 0, now + 3, [ok(g.instance_id)])
    invalid = sim.d.view.host_attrs(a.host_id, 1000.0)["InvalidRate"]
    assert invalid > 0, "forged results returned as results, none caught"


def test_two_different_results_never_have_the_same_quorum_digest():
    from gridbot.model.records import result_digest as _digest

    with_file = InstanceReport(1, Outcome.SUCCESS, 0, 1.0, 1.0, "", "A", "", {"o": b"B"})
    spelled = InstanceReport(2, Outcome.SUCCESS, 0, 1.0, 1.0, "", "A\0o\0" + "1\0B", "", {})
    assert _digest(with_file) != _digest(spelled)


def test_the_deadline_heap_holds_no_more_than_the_running_instances_and_a_margin():
    """(Counted, not timed.) An ended instance left its deadline in the heap for a day: at 20,000 jobs/s the heap
    grew by every instance sent, in memory and in each push's cost."""
    sim = CoreSim()
    add(sim, "many", 30_000)
    h = host("a", slots=1000)
    held = sim.ask(h, 1000, 0.0)
    for t in range(1, 30):
        held = sim.ask(h, 1000, float(t), [ok(a.instance_id) for a in held])
    assert len(held) == 1000
    assert len(sim.d._k.deadlines) <= 2 * 1000 + 4096, len(sim.d._k.deadlines)
    sim.tick(10 * 86400.0)  # every deadline passed: only the 1,000 still running are found overdue
    assert sim.store.bag(1).counts.overdue == 1000

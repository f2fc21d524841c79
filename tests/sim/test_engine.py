"""The simulator runs the real dispatcher: runs are reproducible, conserve jobs, and react to what the
pools do (failures, black holes, late volunteers, GridPolicy) the way the server does."""

from __future__ import annotations

import dataclasses

import pytest

from gridbot.sim.batch import BatchSystem
from gridbot.sim.engine import Simulation, simulate
from gridbot.sim.scenario import parse_scenario

BASE = """
[simulation]
seed = 11

[server]
host_timeout = "30m"

[pools.grid]
kind = "grid"
size = 40
queue_wait = { dist = "exponential", mean = "2m" }
preemption = 0.2
failure_rate = 0.02
speed = { dist = "uniform", low = 0.5, high = 1.5 }

[pools.cluster]
kind = "cluster"
size = 10

[bags.a]
jobs = 400
runtime = { dist = "uniform", low = "5m", high = "10m" }
instance_deadline = "2h"
max_failures = 10
"""


def run(text: str, seed: int | None = None):
    return simulate(parse_scenario(text, "test.toml"), seed)


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    first, again, other = run(BASE), run(BASE), run(BASE, seed=12)
    assert first.to_json() == again.to_json()
    assert first.bags[0].makespan != other.bags[0].makespan


def test_every_job_ends_and_the_counts_add_up():
    r = run(BASE)
    b = r.bag("a")
    assert b.state == "completed" and b.done == 400 and b.failed == 0
    assert sum(b.jobs_per_pool.values()) == 400
    assert sum(p.done for p in r.pools) == 400
    assert b.instances == sum(p.instances for p in r.pools)
    assert b.instances >= 400 + b.replicas
    lost = sum(p.lost for p in r.pools)
    assert lost > 0, "preemption at 0.2/h over hours of pilots must lose some instances"
    assert b.milestones["0"] == b.finished
    assert r.incomplete["a"][0] == 400 and r.incomplete["a"][-1] == 0


def test_the_full_memory_store_and_the_compact_one_give_the_same_run():
    compact = run(BASE)
    memory = run(BASE.replace("seed = 11", 'seed = 11\nstore = "memory"'))
    assert compact.to_json() == memory.to_json()


def test_black_holes_are_held_back_from_the_start_and_then_paroled():
    """A black hole is held back once another host has been busy past the quick-failure window (seen at
    the next tick), before anybody has a result; later it gets one job per parole period
    (core.hosts.PAROLE). Without the 'others busy' signal, 10 black holes failed up to 92 jobs each in
    the first half hour here and 30 jobs failed for good."""
    from gridbot.core.hosts import PAROLE
    from gridbot.sim.engine import Simulation

    text = BASE.replace("preemption = 0.2", "preemption = 0\nblack_holes = 0.25").replace(
        "failure_rate = 0.02", "failure_rate = 0")
    sim = Simulation(parse_scenario(text, "t.toml"))
    holes = {m.info.host_id for m in sim.pools["grid"].machines if m.black_hole}
    assert holes
    early: dict[str, int] = dict.fromkeys(holes, 0)
    late: dict[str, int] = dict.fromkeys(holes, 0)
    settled = 1800.0  # every job takes at most 10 min / 0.5 speed: good results exist well before this
    request_work = sim.dispatcher.request_work

    def watch(info, want, held, now, reports=()):
        if info.host_id in holes:
            (late if now > settled else early)[info.host_id] += sum(1 for r in reports
                                                                    if r.outcome.value == "failure")
        return request_work(info, want, held, now, reports)

    sim.dispatcher.request_work = watch
    r = sim.run()
    bound = (r.end - settled) / PAROLE + 2
    assert max(late.values()) <= bound, (late, bound)
    assert sum(late.values()) > 0, "paroled black holes must be tried again"
    # two ticks (a minute each) pass before a job has run past the quick window and been seen doing so
    assert max(early.values()) < 50, early
    assert r.bag("a").state == "completed" and r.bag("a").failed == 0


def test_a_grid_policy_keeps_a_bag_off_a_pool():
    text = BASE + '\n[bags.a.policy]\nGridPolicy = "Pool.Name != \\"grid\\""\n'
    r = run(text)
    assert set(r.bag("a").jobs_per_pool) == {"cluster"}
    assert next(p for p in r.pools if p.name == "grid").pilots_peak == 0


def test_late_volunteers_stretch_the_tail_and_a_tail_policy_cures_it():
    community = BASE.replace("[bags.a]", """[pools.volunteers]
kind = "community"
size = 200
turnaround_ratio = { dist = "uniform", low = 0.01, high = 0.1 }

[bags.a]""")
    naive = run(community)
    cured = run(community + '\n[bags.a.policy]\nJobRequirements = "!Tail || Host.Pool != \\"volunteers\\""\n'
                'ReplicationRequirements = "Tail && NumberOfReplicas < 2"\n')
    assert naive.bag("a").state == cured.bag("a").state == "completed"
    assert cured.bag("a").makespan < naive.bag("a").makespan / 2


def test_a_pool_that_never_grows_leaves_the_bag_unfinished_at_the_horizon():
    text = BASE.replace("size = 40", "size = 0").replace("size = 10", "size = 0").replace(
        "seed = 11", 'seed = 11\nhorizon = "1d"')
    r = run(text)
    assert r.bag("a").state == "active" and r.bag("a").done == 0
    assert r.end == 86400


def test_pool_size_steps_are_followed():
    text = BASE.replace("size = 40", 'size = [[0, 5], ["1h", 40]]').replace("preemption = 0.2", "preemption = 0")
    sc = parse_scenario(text, "t.toml")
    sc = dataclasses.replace(sc, sample=600.0)
    r = simulate(sc)
    grid = r.pilots["grid"]
    early = [n for t, n in zip(r.times, grid, strict=True) if t < 3600]
    assert max(early) <= 5 and max(grid) > 5


def test_machines_fail_by_the_lanl_records_and_come_back_after_repair():
    failures = ('preemption = 0\navailability = { lanl = "between_failures", unit = 0.005 }\n'
                'unavailability = { lanl = "downtime" }\nhosts = 45')
    text = BASE.replace("preemption = 0.2", failures)
    r = run(text)
    grid = next(p for p in r.pools if p.name == "grid")
    assert r.bag("a").state == "completed"
    assert grid.lost > 0, "machines failing under their pilots lose what they ran"


def test_bags_replayed_from_an_swf_log_all_run():
    text = BASE.split("[bags.a]")[0] + '[swf_bags.nasa]\nswf = "NASA-iPSC"\ncount = 8\nmax_jobs = 32\n' \
        'time_scale = 0.01\nmax_failures = 10\n'
    r = run(text)
    assert len(r.bags) == 8 and all(b.state == "completed" for b in r.bags)
    assert all(b.arrival <= (b.finished or 0) for b in r.bags)


STALE_CANCELLATION = """
[pools.grid]
kind = "grid"
size = 20
queue_wait = { dist = "empirical", values = ["1m", "1m", "1m", "20h"] }

[bags.first]
jobs = 20
runtime = "10m"

[bags.second]
jobs = 1
runtime = "10m"
arrival = "3h"
"""


def test_a_cancellation_removes_the_newest_queued_pilot_not_the_next_to_start():
    """Issue 14: the pilots stuck 20 h in the queue were cancelled when the first bag no longer needed
    them, but the simulator cancelled whichever queued pilot started next. The fresh pilot sent at 3 h for
    the second bag was eaten by a stale cancellation, the stuck ones still counted as spare capacity, so
    nothing more was submitted and the second bag took 17 h instead of about 10 minutes."""
    r = run(STALE_CANCELLATION)
    assert r.bag("first").state == r.bag("second").state == "completed"
    assert r.bag("second").makespan <= 15 * 60, r.bag("second").makespan / 3600


def test_a_pilot_queued_past_the_pools_patience_no_longer_holds_the_demand_back():
    """The case the stale-cancellation fix left: over seeds 5-8 the one pilot sent for the second bag itself
    drew the 20 h queue wait, and counted as the bag's capacity all that time (the bag took 20 h). With
    `queue_patience = "30m"` that pilot stops counting after half an hour, a new one is sent (and, the bag
    done, the stuck one is cancelled): the bag takes 42 minutes where one redraw suffices, 73 where two do."""
    patient = STALE_CANCELLATION.replace("[bags.first]", 'queue_patience = "30m"\n\n[bags.first]')
    for seed in (5, 6, 7, 8):
        stuck, r = run(STALE_CANCELLATION, seed=seed), run(patient, seed=seed)
        assert stuck.bag("second").makespan > 19 * 3600, "the case: the second bag's pilot drew the 20 h wait"
        assert r.bag("second").state == "completed"
        assert 30 * 60 < r.bag("second").makespan < 80 * 60, (seed, r.bag("second").makespan / 60)
        assert r.bag("first").makespan == stuck.bag("first").makespan, "a bag whose pilots start in time: as before"


def test_the_simulator_cancels_the_pilots_the_servers_overlay_would():
    """Four pilots queued for a bag of one job: the overlay's plan cancels three, and the oldest stays, as
    `schedulers.overlay.pilots_to_cancel` (which the server's overlay also calls) chooses."""
    from gridbot.sim.engine import Simulation

    sim = Simulation(parse_scenario(STALE_CANCELLATION, "t.toml"))
    sim._arrive(sim.sc.bags[1], None)
    pool = sim.pools["grid"]
    for _ in range(4):
        sim._enqueue(pool, 3600.0)
    oldest = next(iter(pool.queue))
    sim._overlay(None, None)
    assert list(pool.queue) == [oldest]


STRAGGLER = """
[pools.a-slow]
kind = "cluster"
size = 1
speed = 0.02

[pools.b-fast]
kind = "cluster"
size = 1

[bags.one]
jobs = 1
runtime = "10m"
instance_deadline = "30m"
"""


def test_a_job_requeued_past_its_deadline_gets_a_pilot_while_the_straggler_still_runs():
    """The overlay took the slot of a host still running an overdue instance for an idle one: the job
    re-queued at its deadline waited for that very straggler (8.3 h on a host 50 times slower) while the
    fast pool stayed empty. Now the straggler's slot is busy until it ends, the fast pool gets a pilot at
    the deadline, and the job is done about 10 minutes later."""
    r = run(STRAGGLER)
    b = r.bag("one")
    assert b.state == "completed" and b.jobs_per_pool == {"b-fast": 1}
    assert 30 * 60 < b.makespan < 60 * 60, b.makespan / 3600
    assert {p.name: p.lost for p in r.pools} == {"a-slow": 1, "b-fast": 0}


def test_the_report_says_what_gridbot_status_would_of_a_policy_that_fell_back():
    """A Deadline that depends on the host passes the scenario's checks, yet is negative on every simulated
    host: the server counts the bag's instance_deadline instead and says so in the bag's diagnostics, and
    so must the simulator's report (it said nothing)."""
    policy = '[bags.one.policy]\nDeadline = "Host.Slots > 100 ? 60 : -5"\n'
    r = run(STRAGGLER.replace('instance_deadline = "30m"\n', 'instance_deadline = "30m"\n' + policy))
    [note] = r.bag("one").diagnostics
    assert note.startswith("Deadline evaluated to not a positive number of seconds: -5")
    assert "the bag's instance_deadline (1800 s) counted instead" in note
    assert run(STRAGGLER).bag("one").diagnostics == []


def test_preemption_draws_each_pilots_life_from_a_distribution():
    """Issue 14: `preemption` takes a lifetime distribution, as `availability` does. Every pilot here is
    preempted at 30 minutes of age: a 20-minute job started on a young pilot finishes, a 40-minute job
    never does."""
    text = """
[simulation]
horizon = "1d"

[pools.grid]
kind = "grid"
size = 5
preemption = { dist = "constant", value = "30m" }

[bags.short]
jobs = 10
runtime = "20m"

[bags.long]
jobs = 2
runtime = "40m"
"""
    r = run(text)
    assert r.bag("short").state == "completed" and r.bag("short").done == 10
    assert r.bag("long").done == 0 and r.bag("long").failed == 2
    assert r.pools[0].lost > 0


UNEVEN = """
[simulation]
seed = 5
horizon = "2d"

[pools.grid]
kind = "grid"
size = 40
failure_rate = 0.1
{spread}

[bags.a]
jobs = 2000
runtime = "1m"
max_failures = 100

[bags.a.policy]
JobRequirements = "{record}"
"""
RECORD = "Host.JobsDone + Host.JobsFailed < 10 || Host.ErrorRate < 0.2"


def test_a_failure_spread_makes_a_hosts_record_predict_its_next_job():
    """With machines alike a host's error rate is luck, and a policy that keeps jobs off hosts with a bad
    record fails as many of them as no policy; with `failure_spread` at Los Alamos' 0.75 a few machines
    fail most jobs, the record finds them, and the same policy halves the failed instances."""
    def failed(spread: str, policy: bool) -> int:
        text = UNEVEN.format(spread=spread, record=RECORD if policy else "true")
        sim = Simulation(parse_scenario(text, "t.toml"))
        factors = [m.unreliability for m in sim.pools["grid"].machines]
        assert factors == [1.0] * 40 if not spread else len(set(factors)) == 40 and min(factors) > 0
        bag = sim.run().bag("a")
        assert bag.state == "completed" and bag.done == 2000
        return bag.instances - bag.done

    alike, alike_kept_off = failed("", False), failed("", True)
    uneven, uneven_kept_off = failed("failure_spread = 0.75", False), failed("failure_spread = 0.75", True)
    assert 150 < alike < 300, "one instance in ten fails, on whichever host"
    assert alike_kept_off > 0.9 * alike, (alike, alike_kept_off)
    assert uneven_kept_off < 0.6 * uneven, (uneven, uneven_kept_off)
    batch = BatchSystem(parse_scenario(UNEVEN.format(spread="failure_spread = 0.75", record="true"), "t.toml"))
    assert len(batch.unreliability) == 40 and len(set(batch.unreliability)) == 40, "a plain batch system too"
    assert batch.run().bag("a").done == 2000


def test_a_burst_replayed_from_a_log_runs_each_jobs_own_run_time(tmp_path):
    """Issue 14: one user's burst of log jobs is one bag whose jobs run the log's run times, one by one
    (a job of 2 processors gives two), and a bag scaled down keeps evenly spaced ones."""
    from gridbot.sim.scenario import scaled

    (tmp_path / "log.swf").write_text("1 0 0 600 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1\n"
                                      "2 5 0 1800 2 -1 -1 2 -1 -1 1 7 1 1 1 1 -1 -1\n"
                                      "3 9 0 60 1 -1 -1 1 -1 -1 1 7 1 1 1 1 -1 -1\n")
    text = ('[pools.c]\nkind = "cluster"\nsize = 10\n[swf_bags.log]\nswf = "log.swf"\nburst = "1m"\n'
            '[swf_bags.log.policy]\nReplicationRequirements = "false"\n')
    sc = parse_scenario(text, str(tmp_path / "s.toml"))
    (bag,) = simulate(sc).bags
    assert (bag.name, bag.jobs, bag.state) == ("log-1", 4, "completed")
    assert abs(bag.cpu_hours - (600 + 2 * 1800 + 60) / 3600) < 0.01
    (half,) = simulate(scaled(sc, 0.5)).bags
    assert half.jobs == 2 and abs(half.cpu_hours - (600 + 1800) / 3600) < 0.01


FEW_ACCEPTED = """
[simulation]
seed = 3
horizon = "3d"

[pools.grid]
kind = "grid"
size = 4
hosts = 40
queue_wait = { dist = "exponential", mean = "1m" }
idle_timeout = "1h"

[bags.a]
jobs = 40
runtime = "10m"

[bags.a.policy]
JobRequirements = "member(Host.Name, {\\"grid-0\\", \\"grid-1\\", \\"grid-2\\", \\"grid-3\\", \\"grid-4\\"})"
"""


def test_a_pilot_its_bag_refuses_leaves_and_the_overlay_sends_another():
    """GridBot's pilot suicide (section 5) in the simulator, with the real worker's pacing: a pilot that lands on
    one of the 35 machines the bag refuses leaves at once, and the overlay sends the next pilot, until they
    hold machines the bag accepts. When they idled for their hour, each miss cost an hour of the pool's slot, and
    40 jobs of 10 minutes on 4 slots took 5.4-6.0 h (seeds 3-5); leaving, 2.0-2.2 h."""
    sim = Simulation(parse_scenario(FEW_ACCEPTED, "t.toml"))
    left = []
    kill = sim._kill

    def counted(pilot, repair=False):
        left.append(pilot.pacing.refused)
        kill(pilot, repair)

    sim._kill = counted
    r = sim.run()
    assert r.bag("a").state == "completed"
    assert sum(left) >= 10, f"{sum(left)} pilots left refused of {len(left)}"
    assert set(r.bag("a").jobs_per_pool) == {"grid"}
    assert r.bag("a").makespan < 3 * 3600, r.bag("a").makespan / 3600


ONLY_THE_CLUSTER = """
[simulation]
seed = 1
horizon = "3d"

[pools.cluster]
kind = "cluster"
size = 2
queue_wait = { dist = "exponential", mean = "1m" }

[pools.grid]
kind = "grid"
size = 20
hosts = 200
queue_wait = { dist = "exponential", mean = "1m" }
idle_timeout = "1h"

[bags.a]
jobs = 40
runtime = "30m"

[bags.a.policy]
JobRequirements = "Host.Pool == \\"cluster\\""
"""


@pytest.mark.parametrize("refused_pilots", [10, 0])
def test_a_pool_whose_pilots_the_bag_refuses_is_held_back(refused_pilots):
    """A bag kept to the cluster by its JobRequirements (not its GridPolicy, so the overlay still counts the grid
    as the bag's): every grid pilot is refused and leaves at once. Held back after 10 of them (the default), the
    grid got 33 pilots in the bag's 10 hours (seed 1); never held back (0), 5,546. The bag's own time is the
    same: the cluster does its work either way."""
    sim = Simulation(parse_scenario(ONLY_THE_CLUSTER + f"[server]\nrefused_pilots = {refused_pilots}\n", "t.toml"))
    started: dict[str, int] = {}
    submit = sim._submit

    def counted(pool):
        started[pool.model.name] = started.get(pool.model.name, 0) + 1
        return submit(pool)

    sim._submit = counted
    r = sim.run()
    assert r.bag("a").state == "completed" and set(r.bag("a").jobs_per_pool) == {"cluster"}
    assert 9.5 * 3600 < r.bag("a").makespan < 10.5 * 3600, r.bag("a").makespan / 3600
    if refused_pilots:
        assert 10 <= started["grid"] <= 60, started
    else:
        assert started["grid"] > 1000, started

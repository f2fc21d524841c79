"""Issue 13: the host side of the protocol is written once. A simulated pilot describes itself and paces
its exchanges as a worker started with the pool's options does (`model.pacing`), and the server's long poll
of idle hosts is simulated."""

from __future__ import annotations

from gridbot.model.pacing import Pacing, Step
from gridbot.sim.engine import Simulation, simulate
from gridbot.sim.scenario import parse_scenario
from gridbot.worker.worker import Worker, WorkerConfig

PREFETCHING = """
[pools.c]
kind = "cluster"
size = 1
cpus = 2
prefetch = 3
idle_timeout = "2m"

[bags.a]
jobs = 40
runtime = "10m"
"""


def drive(pacing: Pacing) -> list[Step]:
    """The steps of a host through one life: started, sent work, busy, reporting, empty answers, idle."""
    draws = iter([0.7, 1.3, 0.9])
    steps = []

    def uniform(a: float, b: float) -> float:
        return next(draws)

    pacing.begin(0.0)
    steps.append(pacing.step(0.0, 0, 0, None))
    pacing.answered(0.0, 5, 5, 0.0, 15.0, uniform)
    steps += [pacing.step(1.0, 2, 3, None), pacing.step(600.0, 2, 1, 600.0), pacing.step(600.5, 2, 1, 600.0)]
    pacing.ran(600.0)
    pacing.answered(601.0, 2, 0, 4.0, 15.0, uniform)
    steps += [pacing.step(601.0, 2, 0, None), pacing.step(1200.0, 0, 0, 1199.0)]
    pacing.answered(1200.0, 5, 0, 10.0, 15.0, uniform)
    pacing.answered(1213.0, 5, 0, 10.0, 15.0, uniform)
    steps += [pacing.step(1213.0, 0, 0, None), pacing.step(1400.0, 0, 0, None)]
    return steps


def test_a_worker_and_a_simulated_pilot_with_the_same_options_ask_the_same_at_the_same_times(tmp_path):
    worker = Worker(WorkerConfig("http://127.0.0.1:1", slots=2, prefetch=3, idle_timeout=120.0, state_dir=tmp_path,
                                 allow_root=True, leave_refused=True))  # as the overlay starts its pilots
    try:
        sim = Simulation(parse_scenario(PREFETCHING, "t.toml"))
        pool = sim.pools["c"]
        pool.size = 1
        sim._enqueue(pool, 0.0)
        sim._pilot_up(pool, next(iter(pool.queue)))
        pilot = next(iter(pool.pilots.values()))
        assert pilot.pacing.config == worker.pacing.config
        assert (pilot.info.slots, pilot.info.prefetch) == (worker.host.slots, worker.pacing.prefetch()) == (2, 3)
        steps = drive(worker.pacing)
        assert steps == drive(pilot.pacing)
        assert steps[0] == (5, 3, 0.0, False)
        assert steps[-1][3], "idle for more than two minutes: it leaves"
    finally:
        worker.identity.release()


def test_a_simulated_host_reports_its_prefetch_and_may_hold_slots_plus_prefetch():
    """It reported no prefetch, so the default Concurrency capped it at two per slot where a worker started
    with --prefetch 9 holds 1 + 9."""
    sim = Simulation(parse_scenario(PREFETCHING.replace("cpus = 2\nprefetch = 3", "cpus = 1\nprefetch = 9"), "t.toml"))
    request_work = sim.dispatcher.request_work
    most = 0

    def watch(info, want, held, now, reports=()):
        nonlocal most
        answer, changes = request_work(info, want, held, now, reports)
        assert info.prefetch == 9
        most = max(most, len(held) + len(answer.assignments))
        return answer, changes

    sim.dispatcher.request_work = watch
    assert sim.run().bag("a").state == "completed"
    assert most == 10


def test_an_idle_hosts_held_request_is_answered_when_work_comes():
    """The server holds an idle host's request until a bag comes: the second bag starts at once on the
    idle pilot, not when the pilot's backoff of five minutes has passed."""
    text = """
[server]
backoff_empty = "5m"

[pools.c]
kind = "cluster"
size = 1
idle_timeout = "1h"

[bags.first]
jobs = 1
runtime = "10m"

[bags.second]
jobs = 1
runtime = "10m"
arrival = "47m"
"""
    r = simulate(parse_scenario(text, "t.toml"))
    assert r.bag("second").state == "completed"
    assert r.bag("second").makespan == 600.0

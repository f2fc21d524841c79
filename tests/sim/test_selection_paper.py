"""Issue 18's proof in the simulator: the RENCI report's emulation (TR-08-02, Section 4; experiments/selection) at
reduced size, asserting the report's directions, and the simulator's cluster pools, monitors and jobs of several
CPUs that it rests on.

The report: naive selection is slower than both stateful variants (Figure 2); stateful with `best` leaves less
capacity unused before the clusters fill than naive under each level of external load (Figure 3). Here with 3
seeds for the random arms (the experiment runs 20) and one for the others."""

from __future__ import annotations

import dataclasses
import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from gridbot.model.pools import PoolMonitor
from gridbot.model.spec import SpecError
from gridbot.sim.distributions import constant
from gridbot.sim.engine import Simulation, simulate
from gridbot.sim.scenario import parse_scenario

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2, 3)


def _experiment() -> ModuleType:
    """experiments/selection/run.py, imported as a module (experiments are not a package)."""
    path = ROOT / "experiments" / "selection" / "run.py"
    spec = importlib.util.spec_from_file_location("selection_run", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["selection_run"] = module
    spec.loader.exec_module(module)
    return module


R = _experiment()


Runs = dict[tuple[str, int], list[Any]]
"""The experiment's runs by (arm, external load level)."""


@pytest.fixture(scope="module")
def figure2() -> Runs:
    base = R.load()
    runs: Runs = R.runs(base, ("naive", "stateful, random", "stateful, best"), (0,), SEEDS, log=lambda _: None)
    return runs


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs)


# -- the report's directions ------------------------------------------------------------------------------------


def test_naive_queues_longer_and_finishes_later_than_both_stateful_variants(figure2: Runs) -> None:
    naive, rnd, best = (figure2[(a, 0)] for a in ("naive", "stateful, random", "stateful, best"))
    for name, arm in (("random", rnd), ("best", best)):
        assert _mean([o.total_queued for o in naive]) > 2 * _mean([o.total_queued for o in arm]), name
        assert _mean([o.completion for o in naive]) > _mean([o.completion for o in arm]), name
    # what goes wrong: the burst piles on the clusters that looked free while the largest one idles
    assert all(o.jobs_per_cluster["mileva"] == 0 for o in naive)
    assert all(o.jobs_per_cluster["mileva"] >= 6 for o in best)
    # the same work was done (compute time differs only by where it ran)
    assert all(len(o.compute) == 20 for os_ in figure2.values() for o in os_)


def test_the_simulator_ran_the_selectors_own_code_once_per_job(figure2: Runs) -> None:
    for (arm, _), os_ in figure2.items():
        who = "placement=naive" if arm == "naive" else "placement=stateful"
        for o in os_:
            assert o.placed_by == {who: 20}, (arm, o.seed, o.placed_by)
            assert o.instances == 20, "no job was sent before it was placed (and moved after)"
            assert sum(o.pilots.values()) == 20, "each job ran in a batch job of its own"


def test_stateful_best_leaves_less_capacity_unused_than_naive_at_each_external_load() -> None:
    base = R.load()
    out = R.runs(base, ("naive", "stateful, best"), (1, 2, 3, 4), (1,), log=lambda _: None)
    for level in (1, 2, 3):
        best, naive = out[("stateful, best", level)][0], out[("naive", level)][0]
        assert best.total_latency < naive.total_latency, level
        assert all(s is not None for s in best.saturated.values()), f"level {level}: stateful fills every cluster"
    # at level 4 the external jobs fill every cluster from the start: nothing is lost before saturation, by anyone
    assert out[("stateful, best", 4)][0].total_latency <= out[("naive", 4)][0].total_latency
    assert out[("stateful, best", 4)][0].total_latency == 0
    # the report: the metric falls as external load rises, since the external jobs are already running
    lat = [out[("stateful, best", level)][0].total_latency for level in (1, 2, 3, 4)]
    assert lat == sorted(lat, reverse=True) and lat[0] > lat[-1]


def test_the_monitors_hysteresis_is_what_hurts_naive() -> None:
    base = R.load()
    prompt = dataclasses.replace(base, pools=[dataclasses.replace(p, monitor_lag=constant(0.0)) for p in base.pools])
    lagging = R.run(R.scenario(base, R.ARMS["naive"]), "naive", 0, 1)
    fresh = R.run(R.scenario(prompt, R.ARMS["naive"]), "naive", 0, 1)
    assert fresh.total_queued < lagging.total_queued / 3
    assert fresh.jobs_per_cluster["mileva"] > 0


def test_two_independent_streams_do_worse_than_one() -> None:
    base = R.load()
    one = R.run(R.scenario(base, R.ARMS["stateful, best"]), "one", 0, 1)
    for arm in ("two streams, run 1", "two streams, run 2"):
        two = R.run(R.scenario(base, R.ARMS[arm]), arm, 0, 1)
        assert two.total_queued > one.total_queued, arm


# -- the simulator's cluster pools, monitors and jobs of several CPUs ---------------------------------------------

CLUSTER = """
[simulation]
seed = 3
horizon = "1d"
tick = "1s"
overlay_interval = "1s"

[pools.c]
kind = "cluster"
cluster_cpus = 4
cpus = 2
max_queued = 10
idle_timeout = "1s"
jobs_per_pilot = 1
{extra}

[bags.b]
jobs = {jobs}
cpus = 2
runtime = "100s"
"""


def cluster(extra: str = "", jobs: int = 1) -> str:
    return CLUSTER.replace("{extra}", extra).replace("{jobs}", str(jobs))


def test_a_pilot_waits_first_come_first_served_behind_other_users_jobs_to_the_second() -> None:
    r = simulate(parse_scenario(cluster('[[pools.c.external]]\nat = "0s"\ncpus = 4\nruntime = "250s"', 1), "t"))
    b = r.bag("b")
    assert b.first_start == 250.0 and b.queue_time == 250.0, "it starts when the external job ends, not a tick later"
    (c,) = r.clusters
    assert (c.saturated_at, c.initial_latency, c.external_jobs, c.external_wait, c.pilots) == (0.0, 0.0, 1, 0.0, 1)
    assert c.cpu_seconds_external == 1000.0


def test_an_external_job_behind_ours_waits_for_our_cpus_and_ours_behind_it_waits_for_it() -> None:
    text = cluster('queue_wait = "5s"\n[[pools.c.external]]\nat = "6s"\ncpus = 4\nruntime = "10s"', 2)
    r = simulate(parse_scenario(text + '[bags.late]\njobs = 1\ncpus = 2\nruntime = "100s"\narrival = "20s"\n', "t"))
    (c,) = r.clusters
    assert r.bag("b").first_start == 5.0
    # (a pilot exits a millisecond after it reported its job's end)
    assert c.external_wait == pytest.approx(105.0 - 6.0, abs=0.01), "4 CPUs are free only when our first jobs ended"
    assert r.bag("late").first_start == pytest.approx(115.0, abs=0.01), "submitted after the external job, it waits"
    assert c.saturated_at == 5.0 and c.initial_latency == 4 * 5.0


SLOTS = """
[simulation]
horizon = "1d"
tick = "1s"
[pools.p]
kind = "cluster"
size = 1
cpus = 4
prefetch = 2
[bags.a]
jobs = 1
cpus = 2
runtime = "100s"
[bags.b]
jobs = 1
cpus = 2
runtime = "100s"
[bags.c]
jobs = 1
cpus = 2
runtime = "100s"
"""


def test_pilots_hold_their_jobs_cpus_in_slots() -> None:
    """One pilot of 4 slots asking for 2 more (prefetch): it is sent all three jobs of 2 CPUs at once, runs two and
    starts the third when one of them ended, as the worker does."""
    r = simulate(parse_scenario(SLOTS, "t"))
    starts = sorted(s for n in "abc" if (s := r.bag(n).first_start) is not None)
    assert starts[:2] == [0.0, 0.0]
    assert starts[2] == pytest.approx(100.0, abs=0.01), "two jobs of 2 CPUs fill 4 slots: the third waits on the host"
    assert all(r.bag(n).instances == 1 for n in "abc") and r.pools[0].pilots_peak == 1


def test_the_monitor_shows_work_only_once_it_has_run_for_the_lag() -> None:
    text = cluster('queue_wait = "10s"\nmonitor_interval = "20s"\nmonitor_lag = "35s"\n'
                   '[[pools.c.external]]\nat = "0s"\ncpus = 2\nruntime = "55s"', 1)
    sim = Simulation(parse_scenario(text, "t"))
    seen: list[tuple[float, PoolMonitor]] = []
    give = sim.dispatcher.monitor

    def record(pool: str, reading: PoolMonitor | None) -> None:
        assert reading is not None
        seen.append((reading.observed_at, reading))
        give(pool, reading)

    sim.dispatcher.monitor = record  # type: ignore[method-assign]
    sim.run()
    free = {t: m.free_cpus for t, m in seen}
    # external job 0-55 s; our pilot from about 10 s to 110 s
    assert free[0.0] == 4 and free[20.0] == 4, "nothing has run for 35 s yet"
    assert free[40.0] == 2, "the external job shows (started at 0), our pilot not yet (started at 10)"
    assert free[60.0] == 2, "the external job ended: it leaves at once; our pilot shows"
    assert free[100.0] == 2 and max(free) == 100.0, "our pilot runs until about 110 s, when the run ends"
    assert all(m.total_cpus == 4 and m.lag == 35.0 and m.source == "simulated monitor, lag 35 s" for _, m in seen)


def test_scenario_checks_name_the_fix() -> None:
    with pytest.raises(SpecError, match="needs 8 CPUs a job, but no pool's pilots have more than 2"):
        parse_scenario(cluster().replace("cpus = 2\nruntime", "cpus = 8\nruntime"), "t")
    with pytest.raises(SpecError, match="external load but no cluster_cpus"):
        parse_scenario(cluster().replace("cluster_cpus = 4", "size = 2")
                       + '[[pools.c.external]]\nruntime = "1s"\n', "t")
    with pytest.raises(SpecError, match="monitor_lag but no monitor_interval"):
        parse_scenario(cluster('monitor_lag = "2m"'), "t")
    with pytest.raises(SpecError, match="never fits in a cluster of 4"):
        parse_scenario(cluster().replace("cpus = 2\nmax_queued", "cpus = 8\nmax_queued"), "t")
    sc = parse_scenario(cluster(), "t")
    assert sc.pools[0].max_size == 2, "a cluster pool's size defaults to the pilots its CPUs hold"

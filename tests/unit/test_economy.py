"""DBC scheduling (issue 16): the four placements' plans, and a bag with a budget and a deadline on the core."""

from __future__ import annotations

import datetime as dt
import math
import re
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gridbot.core.changes import BagSnapshot
from gridbot.core.config import DispatchConfig
from gridbot.core.dispatcher import Dispatcher
from gridbot.core.ledger import Prices
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import BagSpec, SpecError, StrategyChoice, parse_bag_deadline, parse_duration, parse_spec
from gridbot.schedulers import registry
from gridbot.schedulers.base import Placement, StrategyError
from gridbot.schedulers.economy import (
    CONSERVATIVE,
    COST,
    COST_TIME,
    TIME,
    CostTimePlacement,
    PoolEstimate,
    plan_jobs,
)
from gridbot.schedulers.overlay import bag_demands
from gridbot.schedulers.registry import factory
from gridbot.store.sql import SQLiteStore

from .core_harness import CoreSim

STRATEGIES = (COST, TIME, COST_TIME, CONSERVATIVE)


def pool(name: str, price: float, speed: float, slots: int, base: float = 3600.0, busy: float = 0.0,
         pilot: float = 0.0, cpus: int = 1) -> PoolEstimate:
    """A pool whose job takes `base` seconds at speed 1 (so `base / speed` there), priced per CPU-hour."""
    return PoolEstimate(name, Prices(per_cpu_hour=price, per_pilot_hour=pilot), slots, speed, base / speed, True, 0,
                        busy, cpus)


def finish(plan) -> float:
    return max(plan.finish.values(), default=0.0)


# three pools of rising cost per job: 1, 2 and 4 (speeds 1, 1.5 and 2)
CHEAP, MID, DEAR = pool("cheap", 1.0, 1.0, 2), pool("mid", 3.0, 1.5, 2), pool("dear", 8.0, 2.0, 4)
# two pools of the same cost per unit of work (1), the second twice as fast; and a dear fast one (4 per job)
SLOW, FAST, PRICY = pool("slow", 1.0, 1.0, 2), pool("fast", 2.0, 2.0, 2), pool("pricy", 8.0, 2.0, 4)


def test_a_pools_cost_per_job_and_per_unit_of_work():
    assert (CHEAP.cost, MID.cost, DEAR.cost) == (1.0, 2.0, 4.0)
    assert (SLOW.unit_cost, FAST.unit_cost, PRICY.unit_cost) == (1.0, 1.0, 4.0)
    per_pilot = pool("cloud", 0.0, 1.0, 4, pilot=8.0, cpus=4)
    assert per_pilot.cost == pytest.approx(2.0), "a pilot-hour price is shared by the pilot's CPUs"
    assert PoolEstimate("x", Prices(per_cpu_hour=1.0), 1, 1.0, None, False, 0).cost == 0.0, "unknown time"


# -- plan_jobs: cost ------------------------------------------------------------------------------------

def test_cost_fills_the_cheapest_pool_up_to_what_it_finishes_by_the_deadline_then_the_next():
    plan = plan_jobs(COST, [DEAR, MID, CHEAP], 12, 7200.0, math.inf)
    # cheap: 2 waves of 3600 s on 2 slots; mid: 3 waves of 2400 s on 2 slots; dear the rest
    assert plan.assigned == {"cheap": 4, "mid": 6, "dear": 2}
    assert plan.finish == {"cheap": 7200.0, "mid": 7200.0, "dear": 1800.0}
    assert plan.unplanned == 0
    assert plan.cost == pytest.approx(4 * 1 + 6 * 2 + 2 * 4)


def test_cost_with_no_deadline_puts_every_job_on_the_cheapest_pool():
    plan = plan_jobs(COST, [DEAR, MID, CHEAP], 12, math.inf, math.inf)
    assert plan.assigned == {"cheap": 12}
    assert plan.finish == {"cheap": 6 * 3600.0}
    assert plan.cost == 12.0


def test_cost_stops_where_the_budget_ends_and_says_how_many_jobs_are_left():
    plan = plan_jobs(COST, [DEAR, MID, CHEAP], 12, 7200.0, 10.0)
    assert plan.assigned == {"cheap": 4, "mid": 3}, "4 at 1 and 3 at 2 spend the 10"
    assert (plan.unplanned, plan.cost) == (5, 10.0)


def test_cost_counts_a_pools_running_work_before_its_planned_jobs():
    busy = pool("cheap", 1.0, 1.0, 2, busy=1800.0)
    plan = plan_jobs(COST, [busy, MID], 6, 7200.0, math.inf)
    assert plan.assigned == {"cheap": 2, "mid": 4}, "cheap has room for one wave after its running work"
    assert plan.finish["cheap"] == 1800.0 + 3600.0


def test_cost_among_pools_of_the_same_cost_prefers_the_faster_one():
    assert plan_jobs(COST, [SLOW, FAST], 12, math.inf, math.inf).assigned == {"fast": 12}


# -- plan_jobs: cost-time -------------------------------------------------------------------------------

def test_cost_time_spreads_the_jobs_over_the_cheapest_group_and_finishes_before_cost_at_the_same_cost():
    cost = plan_jobs(COST, [SLOW, FAST, PRICY], 12, math.inf, math.inf)
    both = plan_jobs(COST_TIME, [SLOW, FAST, PRICY], 12, math.inf, math.inf)
    assert cost.assigned == {"fast": 12}
    assert both.assigned == {"fast": 8, "slow": 4}, "each wave where it completes first"
    assert "pricy" not in both.assigned
    assert finish(both) == 7200.0 < finish(cost) == 10800.0
    assert both.cost == cost.cost == 12.0


def test_cost_time_goes_to_a_dearer_group_only_for_what_the_cheapest_cannot_finish_by_the_deadline():
    plan = plan_jobs(COST_TIME, [SLOW, FAST, PRICY], 12, 3600.0, math.inf)
    assert plan.assigned == {"fast": 4, "slow": 2, "pricy": 6}
    assert finish(plan) <= 3600.0
    assert plan.cost == pytest.approx(6 * 1 + 6 * 4)
    relaxed = plan_jobs(COST_TIME, [SLOW, FAST, PRICY], 12, 7200.0, math.inf)
    assert "pricy" not in relaxed.assigned and relaxed.unplanned == 0


def test_cost_time_groups_pools_within_the_cost_tolerance():
    near = pool("near", 1.004, 1.0, 2)  # 0.4 % dearer per unit of work than `fast`
    fast = pool("fast", 2.0, 2.0, 2)
    assert set(plan_jobs(COST_TIME, [near, fast], 12, math.inf, math.inf, tolerance=0.01).assigned) == {
        "near", "fast"}
    assert plan_jobs(COST_TIME, [near, fast], 12, math.inf, math.inf, tolerance=0.0).assigned == {"fast": 12}


# -- plan_jobs: time and conservative-time --------------------------------------------------------------

def test_time_puts_each_wave_where_it_completes_first():
    plan = plan_jobs(TIME, [SLOW, PRICY], 8, math.inf, math.inf)
    assert plan.assigned == {"pricy": 8}, "pricy's 4 slots finish two waves by 3600, when slow finishes one"
    assert finish(plan) == 3600.0
    assert plan.cost == 32.0


def test_time_uses_the_expensive_fast_pool_while_the_budget_lasts():
    plan = plan_jobs(TIME, [SLOW, PRICY], 8, math.inf, 20.0)
    assert plan.assigned == {"pricy": 5}, "4 + 1 jobs at 4 spend the 20"
    assert (plan.unplanned, plan.cost) == (3, 20.0)
    cheap = plan_jobs(COST_TIME, [SLOW, PRICY], 8, math.inf, 20.0)
    assert (cheap.assigned, cheap.unplanned) == ({"slow": 8}, 0), "the same budget pays every job on slow"


def test_time_within_the_deadline_only():
    plan = plan_jobs(TIME, [SLOW, PRICY], 20, 3600.0, math.inf)
    assert plan.assigned == {"pricy": 8, "slow": 2}
    assert plan.unplanned == 10
    assert finish(plan) <= 3600.0


def test_conservative_time_is_time_when_the_budget_per_job_pays_the_fastest_pool():
    generous = plan_jobs(CONSERVATIVE, [SLOW, PRICY], 8, math.inf, 32.0)
    assert generous.assigned == plan_jobs(TIME, [SLOW, PRICY], 8, math.inf, 32.0).assigned == {"pricy": 8}


@pytest.mark.parametrize("budget", range(8, 11))
def test_conservative_time_never_plans_a_pool_dearer_than_the_budget_left_per_job(budget):
    """With a budget under jobs + 3, the budget left per job stays under pricy's 4 whatever is planned."""
    plan = plan_jobs(CONSERVATIVE, [SLOW, PRICY], 8, math.inf, float(budget))
    assert plan.assigned == {"slow": 8}
    assert plan.cost == 8.0 <= budget
    assert plan_jobs(TIME, [SLOW, PRICY], 8, math.inf, float(budget)).assigned.get("pricy", 0) > 0, (
        "time would have spent it on pricy")


def test_conservative_time_goes_on_with_the_cheapest_pool_when_the_budget_per_job_pays_no_pool():
    plan = plan_jobs(CONSERVATIVE, [SLOW, PRICY], 8, math.inf, 5.0)
    assert plan.assigned == {"slow": 5}
    assert (plan.unplanned, plan.cost) == (3, 5.0)


def test_conservative_time_reconsiders_a_dearer_pool_once_the_budget_left_per_job_pays_it():
    dearer = pool("dearer", 6.0, 3.0, 4)  # 1200 s and 2 per job
    plan = plan_jobs(CONSERVATIVE, [SLOW, dearer], 6, math.inf, 9.0)
    assert plan.cost <= 9.0
    assert plan.assigned.get("dearer", 0) > 0
    assert finish(plan) < plan_jobs(CONSERVATIVE, [SLOW], 6, math.inf, 9.0).finish["slow"] == 10800.0


# -- plan_jobs: every strategy --------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_pools_with_no_known_time_or_no_slot_are_not_planned(strategy):
    unknown = PoolEstimate("unknown", Prices(per_cpu_hour=1.0), 4, 1.0, None, False, 0)
    full = pool("full", 1.0, 1.0, 0)
    plan = plan_jobs(strategy, [unknown, full], 5, math.inf, math.inf)
    assert (plan.assigned, plan.unplanned, plan.cost) == ({}, 5, 0.0)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_nothing_to_plan_or_nothing_to_spend(strategy):
    assert plan_jobs(strategy, [SLOW, PRICY], 0, 3600.0, 10.0).assigned == {}
    plan = plan_jobs(strategy, [SLOW, PRICY], 4, math.inf, 0.0)
    assert (plan.assigned, plan.unplanned) == ({}, 4)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_free_pools_are_not_bounded_by_the_budget(strategy):
    free = pool("own", 0.0, 1.0, 3)
    plan = plan_jobs(strategy, [free, PRICY], 6, math.inf, 0.0)
    assert (plan.assigned, plan.unplanned, plan.cost) == ({"own": 6}, 0, 0.0)


def test_a_pool_measured_at_no_time_per_job_does_not_break_the_cost_plan():
    instant = PoolEstimate("instant", Prices(per_cpu_hour=1.0), 2, 1.0, 0.0, True, 0)
    plan = plan_jobs(COST, [instant], 5, 100.0, 10.0)
    assert plan.unplanned + sum(plan.assigned.values()) == 5


estimates = st.builds(
    lambda i, price, pilot, speed, slots, base, busy, cpus: pool(
        f"p{i}", price, speed, slots, base, busy, pilot, cpus),
    st.integers(0, 1000), st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 4.0, 8.0]),
    st.sampled_from([0.0, 0.0, 1.0, 6.0]), st.sampled_from([0.25, 0.5, 1.0, 2.0, 3.0]), st.integers(0, 8),
    st.floats(1.0, 7200.0), st.sampled_from([0.0, 0.0, 100.0, 4000.0]), st.integers(1, 4))


@settings(max_examples=300, deadline=None, database=None)
@given(st.sampled_from(STRATEGIES), st.lists(estimates, max_size=5, unique_by=lambda p: p.name),
       st.integers(0, 400), st.one_of(st.just(math.inf), st.floats(0.0, 30000.0)),
       st.one_of(st.just(math.inf), st.floats(0.0, 500.0)))
def test_a_plan_never_costs_more_than_the_budget_nor_ends_past_the_deadline_and_counts_every_job(
        strategy, pools, jobs, horizon, budget):
    plan = plan_jobs(strategy, pools, jobs, horizon, budget)
    by_name = {p.name: p for p in pools}
    assert sum(plan.assigned.values()) + plan.unplanned == jobs
    assert all(n > 0 for n in plan.assigned.values())
    assert plan.cost <= budget + 1e-6
    assert plan.cost == pytest.approx(sum(n * by_name[name].cost for name, n in plan.assigned.items()))
    assert set(plan.finish) == set(plan.assigned)
    assert all(t <= horizon + 1e-6 for t in plan.finish.values())
    if strategy == COST and math.isinf(horizon) and math.isinf(budget) and plan.assigned:
        assert len(plan.assigned) == 1, "no deadline: the cheapest pool takes everything"


# -- on the core: a bag with a budget and a deadline ------------------------------------------------------

ADS = {
    "cheap": {"Name": "cheap", "PricePerCpuHour": 1.0, "MaxRunning": 2, "Cpus": 1, "Speed": 1.0},
    "mid": {"Name": "mid", "PricePerCpuHour": 2.0, "MaxRunning": 2, "Cpus": 1, "Speed": 2.0},
    "dear": {"Name": "dear", "PricePerCpuHour": 8.0, "MaxRunning": 4, "Cpus": 1, "Speed": 2.0},
}
"""With runtime = 3600 (s at speed 1): cheap 3600 s and 1 a job, mid 1800 s and 1 a job (one group), dear 1800 s and
4 a job."""


def host(name: str, pool: str, slots: int = 1) -> HostInfo:
    return HostInfo(name, name, "Linux", slots, 0, slots, pool)


HOSTS = {p: [host(f"{p}{i}", p) for i in range(3)] for p in ADS}


def ok(iid: int, wall: float) -> InstanceReport:
    return InstanceReport(iid, Outcome.SUCCESS, 0, wall, wall)


def qos_bag(sim: CoreSim, jobs: int, budget: float | None, deadline: str | None, placement: str = "cost-time",
            options: str = "runtime = 3600\n") -> int:
    text = 'command = "job {i}"\ninstance_deadline = 20000\n'
    text += f"budget = {budget}\n" if budget is not None else ""
    text += f'bag_deadline = "{deadline}"\n' if deadline is not None else ""
    text += f"[parameters]\ni = {{ from = 0, to = {jobs - 1} }}\n"
    text += f'[strategy]\nplacement = "{placement}"\n{options}'
    spec = parse_spec(text, "t.toml", "b")
    registry.check_bag(spec)
    row = sim.store.create_bag(spec, None, {}, 0.0)
    sim.d.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
    return row.bag_id


def priced(ads=ADS) -> CoreSim:
    sim = CoreSim(host_timeout=1e9)
    sim.d.pool_ads = ads
    return sim


def ask_all(sim: CoreSim, now: float, want: int = 1) -> dict[str, int]:
    """Every host asks for `want`; instances sent per pool."""
    got: dict[str, int] = {}
    for p, hosts in HOSTS.items():
        for h in hosts:
            got[p] = got.get(p, 0) + len(sim.ask(h, want, now))
    return got


def report_all(sim: CoreSim, pool: str, now: float, wall: float) -> None:
    for h in HOSTS[pool]:
        sim.finish_all(h, now, wall=wall)


def plan_at(sim: CoreSim, bag: int, now: float):
    """The bag's QoS report as planned by a tick at `now` (looking at the report does not plan)."""
    sim.tick(now)
    qos = sim.d.qos(bag, now)
    assert qos is not None and qos.planned_at == now
    return qos


def test_the_qos_report_is_the_last_plans_and_looking_does_not_plan():
    sim = priced()
    bag = qos_bag(sim, 10, 100, "2h")
    assert sim.d.qos(bag, 0.0) is None, "nothing planned yet"
    first = plan_at(sim, bag, 10.0)
    assert sim.d.qos(bag, 500.0) == first
    assert plan_at(sim, bag, 500.0).planned_at == 500.0


def test_a_cost_time_bag_runs_on_the_planned_pools_only():
    sim = priced()
    bag = qos_bag(sim, 10, 100, "2h")
    qos = plan_at(sim, bag, 0.0)
    assert qos.strategy == "cost-time"
    assert qos.planned == {"mid": 8, "cheap": 2}, "the cheap group finishes all 10 by the deadline"
    assert qos.unplanned == 0
    assert qos.deadline_at == 7200.0 and qos.budget == 100.0
    assert qos.projected_finish is not None and qos.projected_finish <= 7200.0
    assert qos.cost_per_job == {"cheap": 1.0, "mid": 1.0, "dear": 4.0}
    assert sim.d.view.pilots_wanted(bag, ["cheap", "mid", "dear"], 0.0) == {"cheap": 2, "mid": 2}
    assert sorted((d.pools, d.slots) for d in bag_demands(sim.d.view, ["cheap", "mid", "dear"], 0.0)) == [
        (frozenset({"cheap"}), 2), (frozenset({"mid"}), 2)], "no pilot is asked of the dear pool"
    assert ask_all(sim, 0.0) == {"cheap": 2, "mid": 2, "dear": 0}, "as many as each planned pool has slots"


def test_a_tight_deadline_sends_what_the_cheap_group_cannot_finish_to_the_dear_pool():
    sim = priced()
    bag = qos_bag(sim, 10, 100, "1h")
    qos = plan_at(sim, bag, 0.0)
    assert qos.planned == {"mid": 4, "cheap": 2, "dear": 4}
    assert ask_all(sim, 0.0) == {"cheap": 2, "mid": 2, "dear": 3}, "dear's 4 planned jobs on its 3 hosts"


def test_the_budget_stops_dispatch_once_it_is_spent_and_the_bag_says_so():
    sim = priced()
    bag = qos_bag(sim, 10, 3, "2h")
    qos = plan_at(sim, bag, 0.0)
    assert (qos.planned, qos.unplanned) == ({"mid": 3}, 7), "3 jobs at 1 each"
    assert ask_all(sim, 0.0) == {"cheap": 0, "mid": 2, "dear": 0}
    report_all(sim, "mid", 1800.0, 1800.0)
    assert sim.d.view.bill(bag).total == pytest.approx(2.0)
    assert ask_all(sim, 1801.0) == {"cheap": 0, "mid": 1, "dear": 0}, "the budget left pays one more"
    report_all(sim, "mid", 3601.0, 1800.0)
    bill = sim.d.view.bill(bag)
    assert bill.total == pytest.approx(3.0)
    assert [(p.pool, p.instances) for p in bill.pools] == [("mid", 3)]
    assert ask_all(sim, 3610.0) == {"cheap": 0, "mid": 0, "dear": 0}, "nothing more: the budget is spent"
    assert ask_all(sim, 3700.0, want=4) == {"cheap": 0, "mid": 0, "dear": 0}
    qos = plan_at(sim, bag, 3700.0)
    assert (qos.spent, qos.committed, qos.planned, qos.unplanned) == (pytest.approx(3.0), 0.0, {}, 7)
    notes = sim.d.diagnostics(bag, 3700.0)
    assert any("budget is spent" in n for n in notes), notes
    assert sim.d.view.bag(bag).queued == 7


def test_a_budget_of_zero_runs_on_free_pools_only():
    """Found by the command-line review of 2026-11-27: `budget = 0` is valid (the docs say >= 0) and means
    "free resources only", but such a bag never started, not even on a free pool ("the budget is spent")."""
    sim = priced({**ADS, "free": {"Name": "free", "PricePerCpuHour": 0.0, "MaxRunning": 3, "Cpus": 1, "Speed": 1.0}})
    probing = qos_bag(sim, 10, 0, "1d", options="")  # no runtime given: it probes first (found by review)
    assert plan_at(sim, probing, 0.0).planned == {"free": 1}, "a probe on the free pool only"
    assert not any("budget is spent" in n for n in sim.d.diagnostics(probing, 1.0))
    sim = priced({**ADS, "free": {"Name": "free", "PricePerCpuHour": 0.0, "MaxRunning": 3, "Cpus": 1, "Speed": 1.0}})
    bag = qos_bag(sim, 10, 0, "1d")
    qos = plan_at(sim, bag, 0.0)
    assert set(qos.planned) == {"free"}, qos
    got = ask_all(sim, 0.0)
    got["free"] = sum(len(sim.ask(h, 1, 0.0)) for h in [host(f"free{i}", "free") for i in range(3)])
    assert got == {"cheap": 0, "mid": 0, "dear": 0, "free": 3}
    assert not any("budget is spent" in n for n in sim.d.diagnostics(bag, 1.0))


def test_limit_bounds_what_one_host_gets_in_one_request():
    sim = priced()
    bag = qos_bag(sim, 10, 2, "2h")
    big = host("mid-big", "mid", 4)
    got = sim.ask(big, 4, 0.0)
    assert len(got) == 2, "the budget pays 2 jobs at 1"
    assert {a.bag_id for a in got} == {bag}


def test_running_instances_count_against_the_budget_before_they_end():
    sim = priced()
    bag = qos_bag(sim, 10, 2, "2h")
    assert ask_all(sim, 0.0)["mid"] == 2
    assert ask_all(sim, 600.0) == {"cheap": 0, "mid": 0, "dear": 0}, "2 running at 1 each commit the 2"
    qos = plan_at(sim, bag, 600.0)
    assert qos.committed == pytest.approx(2.0) and qos.spent == 0.0


def test_the_plan_follows_measured_rates():
    sim = priced()
    bag = qos_bag(sim, 20, 100, "10h")
    assert ask_all(sim, 0.0)["mid"] == 2
    for h in HOSTS["mid"]:  # mid turns out 4 times slower than its speed says: 7200 s a job, 4 per job
        held = sorted(sim.held.get(h.host_id, ()))
        sim.ask(h, 0, 7200.0, [ok(i, 7200.0) for i in held])
    qos = plan_at(sim, bag, 7200.0)
    assert qos.seconds_per_job["mid"] == 7200.0
    assert qos.seconds_per_job["cheap"] == 14400.0 and qos.seconds_per_job["dear"] == 7200.0, (
        "the others extrapolated from mid's measure by their speeds")
    assert qos.cost_per_job["mid"] == pytest.approx(4.0)


def test_with_no_rate_known_the_bag_probes_one_instance_per_pool_of_its_cheapest_group():
    sim = priced()
    bag = qos_bag(sim, 10, 100, "2h", options="")
    assert ask_all(sim, 0.0) == {"cheap": 1, "mid": 1, "dear": 0}
    assert any("probes" in n for n in sim.d.diagnostics(bag, 1.0))
    qos = plan_at(sim, bag, 10.0)
    assert qos.projected_finish is None and qos.seconds_per_job == {}
    assert ask_all(sim, 20.0) == {"cheap": 0, "mid": 0, "dear": 0}, "one probe per pool until a result"


def test_once_the_deadline_passed_nothing_more_is_started_unless_finish_late():
    sim = priced()
    bag = qos_bag(sim, 10, 100, "1h")
    assert ask_all(sim, 3700.0) == {"cheap": 0, "mid": 0, "dear": 0}
    assert any("deadline passed" in n for n in sim.d.diagnostics(bag, 3700.0))
    late = priced()
    qos_bag(late, 10, 100, "1h", options="runtime = 3600\nfinish_late = true\n")
    assert sum(ask_all(late, 3700.0).values()) > 0


def test_a_budget_pays_for_the_pilots_it_asks_for():
    ads = {"cloud": {"Name": "cloud", "PricePerPilotHour": 8.0, "ChargingPeriod": 3600.0, "MaxRunning": 4,
                     "Cpus": 1, "Speed": 2.0}}
    sim = priced(ads)
    bag = qos_bag(sim, 10, 15, "2h")
    assert sim.d.view.pilots_wanted(bag, ["cloud"], 0.0) == {"cloud": 1}, "the budget pays one period of one"
    first, second = host("c0", "cloud"), host("c1", "cloud")
    assert len(sim.ask(first, 1, 10.0)) == 1
    wanted = sim.d.view.pilots_wanted(bag, ["cloud"], 70.0)
    got = sim.ask(second, 1, 80.0) if wanted else []
    for h, end in ((first, 1810.0), (second, 1880.0)):
        sim.ask(h, 0, end, [ok(i, 1800.0) for i in sorted(sim.held.get(h.host_id, ()))])
    assert sim.d.view.bill(bag).total <= 15.0, (wanted, len(got), sim.d.view.bill(bag))


# -- the spec and the registry ----------------------------------------------------------------------------

BASE = 'command = "x {i}"\n[parameters]\ni = [1, 2]\n'


@pytest.mark.parametrize("qos", ["budget = 600", 'bag_deadline = "2h"', "bag_deadline = 2026-11-27T17:00:00Z"])
def test_a_spec_with_a_budget_or_a_deadline_and_no_placement_gets_cost_time(qos):
    spec = parse_spec(qos + "\n" + BASE, "s.toml", "s")
    assert spec.strategy.placement == "cost-time"
    registry.check_bag(spec)


def test_a_spec_names_its_dbc_placement_and_keeps_it():
    spec = parse_spec('budget = 600\nbag_deadline = "90m"\n' + BASE + '[strategy]\nplacement = "cost"\n', "s", "s")
    assert (spec.strategy.placement, spec.budget, spec.bag_deadline, spec.bag_deadline_at) == (
        "cost", 600.0, 5400.0, None)
    assert spec.deadline_at(1000.0) == 6400.0
    assert parse_spec(BASE, "s", "s").strategy.placement == "gridbot", "no budget, no deadline: GridBot's"


def test_a_spec_with_an_absolute_deadline_has_it_on_the_epoch():
    spec = parse_spec("bag_deadline = 2026-11-27T17:00:00+01:00\n" + BASE, "s", "s")
    expected = dt.datetime(2026, 11, 27, 16, tzinfo=dt.UTC).timestamp()
    assert (spec.bag_deadline, spec.bag_deadline_at) == (None, expected)
    assert spec.deadline_at(0.0) == expected


@pytest.mark.parametrize(("qos", "says"), [
    ("budget = -1", "'budget' must be a finite number >= 0"),
    ('budget = "600"', "'budget' must be a number"),
    ("budget = true", "'budget' must be a number"),
    ('bag_deadline = "soon"', "a bag deadline is a duration"),
    ("bag_deadline = 2026-11-27T17:00:00", "needs its time zone"),
    ('bag_deadline = "2026-11-27T17:00:00"', "needs its time zone"),
])
def test_a_malformed_budget_or_deadline_is_refused_naming_the_key(qos, says):
    with pytest.raises(SpecError, match=re.escape(says)):
        parse_spec(qos + "\n" + BASE, "s.toml", "s")


def test_check_bag_refuses_a_budget_or_a_deadline_its_placement_would_not_keep():
    for qos in ({"budget": 5.0}, {"bag_deadline": 60.0}, {"bag_deadline_at": 2e9}):
        spec = BagSpec(name="s", command="x", strategy=StrategyChoice(placement="gridbot"), **qos)
        with pytest.raises(StrategyError, match=r"placement 'gridbot' does not keep a bag's (budget|bag_deadline)"
                                                r".*conservative-time, cost, cost-time, time|"
                                                r"placement 'gridbot' does not keep.*cost-time"):
            registry.check_bag(spec)
    registry.check_bag(BagSpec(name="s", command="x", strategy=StrategyChoice(placement="gridbot")))
    for placement in ("cost", "time", "cost-time", "conservative-time"):
        registry.check_bag(BagSpec(name="s", command="x", budget=5.0, strategy=StrategyChoice(placement=placement)))


class Indifferent(Placement):
    name = "indifferent"


def test_check_bag_refuses_a_budget_with_a_plugged_in_placement_that_counts_no_money(monkeypatch):
    monkeypatch.setitem(registry.PLACEMENTS, Indifferent.name, Indifferent)
    spec = parse_spec("budget = 10\n" + BASE + '[strategy]\nplacement = "indifferent"\n', "s", "s")
    assert spec.strategy.placement == "indifferent", "only GridBot's placement is switched to cost-time"
    with pytest.raises(StrategyError, match="placement 'indifferent' does not keep a bag's budget"):
        registry.check_bag(spec)


def test_dbc_placements_check_their_options():
    registry.check(StrategyChoice(placement="cost-time", options={"runtime": 60, "window": 10}))
    with pytest.raises(StrategyError, match="window"):
        registry.check(StrategyChoice(placement="cost-time", options={"window": 0}))
    with pytest.raises(StrategyError, match="runtime"):
        registry.check(StrategyChoice(placement="cost-time", options={"runtime": -1}))
    assert CostTimePlacement.counts_money


# -- parse_bag_deadline -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "seconds"), [
    (90, 90.0), (90.5, 90.5), ("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("2h", 7200.0), ("1d", 86400.0),
    (" 2h ", 7200.0),
])
def test_a_bag_deadline_as_a_duration_after_submission(value, seconds):
    assert parse_bag_deadline(value) == {"bag_deadline": seconds}


def utc(*args: int, **kw: object) -> float:
    return dt.datetime(*args, tzinfo=dt.UTC, **kw).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-27T17:00:00Z", utc(2026, 11, 27, 17)),
    ("2026-11-27T17:00:00z", utc(2026, 11, 27, 17)),
    ("2026-11-27 17:00Z", utc(2026, 11, 27, 17)),
    ("2026-11-27t17:00:30Z", utc(2026, 11, 27, 17, 0, 30)),
    ("2026-11-27T17:00:00.25Z", utc(2026, 11, 27, 17) + 0.25),
    ("2026-11-27T17:00:00+01:00", utc(2026, 11, 27, 16)),
    ("2026-11-27T17:00:00+0100", utc(2026, 11, 27, 16)),
    ("2026-11-27T17:00:00-05:30", utc(2026, 11, 27, 22, 30)),
    ("2024-02-29T12:00:00Z", utc(2024, 2, 29, 12)),
    ("2000-03-01T00:00:00Z", utc(2000, 3, 1)),
    ("1970-01-01T00:00:00Z", 0.0),
    ("2100-12-31T23:59:59Z", utc(2100, 12, 31, 23, 59, 59)),
])
def test_a_bag_deadline_as_an_iso_time_with_its_zone(text, expected):
    assert parse_bag_deadline(text) == {"bag_deadline_at": pytest.approx(expected)}


@pytest.mark.parametrize("text", ["d = 2026-11-27T17:00:00Z", "d = 2026-11-27T18:30:00+01:30",
                                  "d = 2026-11-27 17:00:00Z"])
def test_a_bag_deadline_as_a_toml_date_time(text):
    value = tomllib.loads(text)["d"]
    assert parse_bag_deadline(value) == {"bag_deadline_at": utc(2026, 11, 27, 17)}


@pytest.mark.parametrize("value", ["2026-11-27T17:00:00", "2026-11-27 17:00",
                                   tomllib.loads("d = 2026-11-27T17:00:00")["d"]])
def test_an_absolute_deadline_without_its_zone_is_refused_with_the_hint(value):
    with pytest.raises(ValueError, match=re.escape("needs its time zone (add Z for UTC, or +01:00)")):
        parse_bag_deadline(value)


@pytest.mark.parametrize("value", ["tomorrow", "", "2h30", 0, -5, True, None, [1], "2026-13-01T00:00Z",
                                   "2026-11-27T25:00Z", "2026-11-27T17:60Z"])
def test_what_is_no_bag_deadline_is_refused(value):
    with pytest.raises(ValueError, match=r"deadline|time|duration"):
        parse_bag_deadline(value)


@pytest.mark.parametrize("text", ["2026-02-31T00:00Z", "2026-04-31T12:00Z", "2025-02-29T00:00Z"])
def test_a_day_its_month_does_not_have_is_refused(text):
    with pytest.raises(ValueError, match="not a valid time"):
        parse_bag_deadline(text)


@pytest.mark.parametrize("text", ["2030-01-01T00:00:00+99:00", "2030-01-01T00:00:00-05:99", "2030-01-01T00:00:00+24:00",
                                  "2030-01-01T00:00:00-2400"])
def test_an_offset_no_time_zone_has_is_refused_naming_it(text):
    """Found by the API review of 2026-12-07: the zone's hours and minutes were never checked, so +99:00 moved the
    deadline by 99 hours without a word (datetime refuses offsets of a day or more)."""
    with pytest.raises(ValueError, match="is not a time zone's offset: its hours go from 00 to 23"):
        parse_bag_deadline(text)
    latest = parse_bag_deadline("2030-01-01T00:00:00+23:59")
    assert latest == {"bag_deadline_at": pytest.approx(utc(2030, 1, 1) - 86340)}


@pytest.mark.parametrize("value", ["\u0661\u0660s", "\u0661\u0660", "\uff11\uff10m"])
def test_a_duration_in_digits_other_than_ascii_is_refused(value):
    """A regular expression's \\d matches any script's digits and float() reads them: "١٠s" was 10 seconds."""
    with pytest.raises(ValueError, match="a duration is a number of seconds"):
        parse_duration(value)


# -- after a restart ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_restarted_dispatcher_bills_what_was_spent_and_keeps_the_budget(store, tmp_path):
    sim = priced()
    if store == "sqlite":
        sim.store = SQLiteStore(tmp_path / "g.db")
        sim.store.migrate()
    bag = qos_bag(sim, 10, 3, "2h")
    assert ask_all(sim, 0.0)["mid"] == 2
    m0, m1 = HOSTS["mid"][:2]
    [a] = sorted(sim.held[m0.host_id])
    [b] = sorted(sim.held[m1.host_id])
    sim.ask(m0, 0, 1800.0, [ok(a, 1800.0)])
    sim.ask(m1, 0, 1800.0, [InstanceReport(b, Outcome.FAILURE, 1, 900.0, 900.0, "exit code 1")])
    before = sim.d.view.bill(bag)
    assert before.total == pytest.approx(1.5), "a failed instance's wall time is paid too"
    restarted = Dispatcher(DispatchConfig(check_invariants=True, host_timeout=1e9), factory())
    restarted.pool_ads = ADS
    restarted.restore(sim.store.snapshot())
    assert restarted.view.bill(bag) == before
    sim.d = restarted
    got = ask_all(sim, 1900.0)
    assert got == {"cheap": 0, "mid": 1, "dear": 0}, "the 1.5 left pays one more job at 1, not two"


def test_gridbots_placement_named_beside_a_budget_is_switched_to_cost_time():
    spec = parse_spec("budget = 10\n" + BASE + '[strategy]\nplacement = "gridbot"\n', "s", "s")
    assert spec.strategy.placement == "cost-time"


def test_a_bag_without_a_dbc_placement_reports_no_qos():
    sim = priced()
    bag = sim.bag("plain", 3)
    assert sim.d.qos(bag, 0.0) is None
    assert sim.d.qos(999, 0.0) is None, "no such bag"


def test_a_note_of_jobs_left_unplanned_says_why_without_a_deadline_or_budget():
    """Found by the command-line review of 2026-11-27: a `cost` bag with neither a deadline nor a budget had its
    unplanned jobs noted as "cannot  (cost: ..." (the reason left empty)."""
    sim = priced({"cheap": {**ADS["cheap"], "MaxRunning": 0}})
    bag = qos_bag(sim, 10, None, None, placement="cost")
    plan_at(sim, bag, 0.0)
    notes = sim.d.diagnostics(bag, 1.0)
    assert not any("cannot  (" in n for n in notes), notes


def test_status_says_when_a_plans_projected_completion_has_passed():
    """Found by the walkthrough review of 2026-11-29: a DBC bag's first status said "projected completion in
    0.0s" while jobs were queued: a projection that passed before the next plan was shown as 0."""
    from gridbot.cli.render import money
    from gridbot.core.changes import BagCounts
    from gridbot.core.strategy import QosReport
    from gridbot.protocol import BagInfo

    def line(finish: float) -> str | None:
        q = QosReport("cost-time", 1600.0, 5.0, 0.0, 0.0, 1.0, finish, {"local": 6}, 0, {}, {}, 1000.0)
        info = BagInfo(1, "q", "active", 12, BagCounts(queued=6, running=2), 990.0, None, "h", budget=5.0,
                       deadline_at=1600.0, qos=q)
        return money(info, now=1004.0)

    assert "projected completion in 6.0s" in (line(1010.0) or "")
    assert "projected completion 3.0s ago, by the plan of 4.0s ago" in (line(1001.0) or "")

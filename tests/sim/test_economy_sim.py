"""DBC scheduling in the simulator (issue 16): the paper's claims at a small size. Pools cheap, mid and mid2 cost the
same per unit of work (price / speed = 2) and fast costs twice as much; 40 jobs of 10 min at speed 1 (1/3 a job on
the equal pools, 2/3 on fast). Each run takes a few hundredths of a second."""

from __future__ import annotations

import itertools

import pytest

from gridbot.model.spec import SpecError
from gridbot.sim.engine import simulate
from gridbot.sim.metrics import BagResult
from gridbot.sim.scenario import parse_scenario

SCENARIO = """
[simulation]
horizon = "{horizon}"
seed = {seed}

[pools.cheap]
kind = "cluster"
size = 2
speed = 0.5
price_per_cpu_hour = 1.0

[pools.mid]
kind = "cluster"
size = 2
speed = 1.0
price_per_cpu_hour = 2.0

[pools.mid2]
kind = "cluster"
size = 2
speed = 2.0
price_per_cpu_hour = 4.0

[pools.fast]
kind = "cloud"
size = 4
speed = 2.0
{fast_price}

[bags.b]
jobs = {jobs}
runtime = {runtime}
bag_deadline = "{deadline}"
budget = {budget}
{strategy}
"""

PER_CPU = "price_per_cpu_hour = 8.0"
JOB_COST = 1 / 3
"""What a job costs on the equal pools: 600 s of work at 2 per unit."""


def run(placement: str | None, deadline: str = "10h", budget: float = 200, *, jobs: int = 40,
        runtime: str = '"10m"', fast_price: str = PER_CPU, horizon: str = "12h", seed: int = 1) -> BagResult:
    strategy = "" if placement is None else f'[bags.b.strategy]\nplacement = "{placement}"'
    text = SCENARIO.format(horizon=horizon, seed=seed, fast_price=fast_price, jobs=jobs, runtime=runtime,
                           deadline=deadline, budget=budget, strategy=strategy)
    return simulate(parse_scenario(text, "dbc.toml")).bag("b")


def test_with_a_relaxed_deadline_cost_time_finishes_earlier_than_cost_at_no_more_spend():
    cost, both = run("cost"), run("cost-time")
    assert cost.state == both.state == "completed"
    assert cost.done == both.done == 40
    assert both.makespan is not None and cost.makespan is not None
    assert both.makespan < cost.makespan
    assert both.spent <= cost.spent + 1e-6
    assert both.spent == pytest.approx(40 * JOB_COST, rel=1e-6), "every job on the equally cheap pools"
    assert "fast" not in both.jobs_per_pool and "fast" not in cost.jobs_per_pool, "the dear pool is not needed"
    assert len(both.jobs_per_pool) == 3, "cost-time spreads over the whole cheapest group"


def test_time_finishes_first_and_pays_for_it():
    time, both = run("time"), run("cost-time")
    assert time.done == 40 and time.makespan is not None and both.makespan is not None
    assert time.makespan < both.makespan
    assert time.spent > both.spent
    assert time.jobs_per_pool.get("fast", 0) > 0
    assert time.spent <= 200


@pytest.mark.parametrize("placement", ["cost", "cost-time"])
def test_with_a_tight_budget_fewer_jobs_complete(placement):
    done = {}
    for budget in (4, 8, 12, 200):
        r = run(placement, "2h", budget, horizon="3h")
        assert r.spent <= budget + 1e-6
        assert r.done <= budget / JOB_COST + 1e-6, "no job is cheaper than on the equal pools"
        done[budget] = r.done
        if budget < 40 * JOB_COST:
            assert r.state == "active" and r.done < 40, "the budget cannot pay every job"
    assert done[4] < done[8] < done[12] < done[200] == 40
    assert done[8] == 24, "the budget buys 8 / (1/3) jobs, every one of them"


DEADLINES = ("20m", "45m", "2h", "10h")
BUDGETS = (2, 5, 12, 100)


@pytest.mark.parametrize("placement", ["cost", "time", "cost-time", "conservative-time"])
def test_no_strategy_ever_spends_more_than_its_budget(placement):
    for deadline, budget in itertools.product(DEADLINES, BUDGETS):
        r = run(placement, deadline, budget, horizon="12h")
        assert r.spent <= budget + 1e-6, (deadline, budget, r.spent, r.spent_per_pool)
        assert r.spent == pytest.approx(sum(r.spent_per_pool.values()), abs=1e-5)


def test_no_overspend_with_the_papers_job_length_variation():
    r = run("cost", "1h", 8, runtime='{ dist = "uniform", low = "10m", high = "11m" }', horizon="4h", seed=3)
    assert r.spent <= 8 + 1e-6, (r.spent, r.spent_per_pool)


def test_no_overspend_with_a_pool_priced_per_pilot_hour():
    r = run("cost", "30m", 15, jobs=30, fast_price="price_per_pilot_hour = 8.0", horizon="4h", seed=3)
    assert r.spent <= 15 + 1e-6, (r.spent, r.spent_per_pool)


def test_results_carry_the_budget_the_deadline_and_the_plan():
    r = run("cost-time", "1h", 8, horizon="3h")
    assert (r.budget, r.bag_deadline) == (8.0, 3600.0)
    assert r.done_by_deadline is not None and 0 < r.done_by_deadline <= r.done
    assert set(r.spent_per_pool) <= {"cheap", "mid", "mid2", "fast"}
    assert r.spent == pytest.approx(sum(r.spent_per_pool.values()), abs=1e-5)
    assert r.qos is not None
    assert r.qos["strategy"] == "cost-time" and r.qos["budget"] == 8.0
    assert r.qos["spent"] <= 8.0 + 1e-6
    assert set(r.qos["cost_per_job"]) == {"cheap", "mid", "mid2", "fast"}


def test_a_bag_with_a_budget_and_no_placement_is_scheduled_by_cost_time():
    text = SCENARIO.format(horizon="3h", seed=1, fast_price=PER_CPU, jobs=10, runtime='"10m"', deadline="2h",
                           budget=100, strategy="")
    [bag] = parse_scenario(text, "dbc.toml").bags
    assert bag.strategy.placement == "cost-time"
    assert (bag.budget, bag.bag_deadline) == (100.0, 7200.0)
    r = run(None, "2h", 100, jobs=10)
    assert r.qos is not None and r.qos["strategy"] == "cost-time"


@pytest.mark.parametrize(("change", "says"), [
    (("budget = 200", "budget = -1"), "'budget' must be a finite number >= 0"),
    (('bag_deadline = "10h"', 'bag_deadline = "soon"'), "bag_deadline of bag 'b'"),
])
def test_a_scenario_with_a_bad_budget_or_deadline_is_refused(change, says):
    text = SCENARIO.format(horizon="3h", seed=1, fast_price=PER_CPU, jobs=10, runtime='"10m"', deadline="10h",
                           budget=200, strategy="")
    with pytest.raises(SpecError, match=says):
        parse_scenario(text.replace(*change), "dbc.toml")

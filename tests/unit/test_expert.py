"""ExPERT's pure core (issue 15): characterization, strategy space, estimator, frontier and utilities."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from gridbot.errors import GridbotError
from gridbot.schedulers.expert import (
    ExpressionError,
    InstanceRecord,
    NTDMr,
    Prices,
    Setup,
    Utility,
    best,
    characterize,
    dominating,
    estimate,
    from_runtimes,
    pareto,
    sample_space,
    static_plans,
    utility,
)
from gridbot.schedulers.expert.characterize import CharacterizationError
from gridbot.schedulers.expert.estimate import EstimateError
from gridbot.schedulers.expert.strategy import Combine, StrategyValueError

PRICES = Prices(unreliable_per_hour=1.0, reliable_per_hour=36.0)
R = 1000.0


def fixed(success: float = 1.0, reliable: float = R):
    """Every successful instance takes R seconds; the reliable pool takes `reliable`."""
    return from_runtimes([R], success, reliable)


def one(char, strategy, setup, **kw):
    e = estimate(char, [strategy], setup, **kw)
    return e.makespan[0], e.cost[0], e.reliable[0]


# -- the estimator against closed forms ----------------------------------------------------------------------


def test_n0_sends_every_task_to_the_reliable_pool():
    makespan, cost, reliable = one(fixed(), NTDMr(0, 0.0, R, 0.5), Setup(tasks=10, unreliable=10, prices=PRICES))
    assert makespan == pytest.approx(2 * R)  # 10 tasks on 5 reliable machines, two rounds
    assert cost == pytest.approx(R * 36.0 / 3600)  # every task paid once, at the reliable price
    assert reliable == 10


def test_one_reliable_machine_serves_the_tail_in_turn():
    makespan, _, _ = one(fixed(), NTDMr(0, 0.0, R, 0.02), Setup(tasks=7, unreliable=50, prices=PRICES))
    assert makespan == pytest.approx(7 * R)  # Mr = 0.02 of 50 machines: one


def test_an_mr_that_rounds_to_no_machine_still_has_one_as_the_tail_applies_it():
    """Found by review: a plan estimates a bag larger than its budget on fewer unreliable machines (Mr x #ur
    kept), where Mr = 0.02 of 7 machines rounded to none: N=0 never ended, and 63 of 285 strategies of a
    200-slot scenario fell off the frontier, although the tail gives every Mr > 0 at least one machine."""
    makespan, _, reliable = one(fixed(), NTDMr(0, 0.0, R, 0.02), Setup(tasks=3, unreliable=7, prices=PRICES))
    assert makespan == pytest.approx(3 * R) and reliable == 3
    _, _, none = one(fixed(), NTDMr(None, 4 * R, 4 * R, 0.0), Setup(tasks=3, unreliable=7, prices=PRICES))
    assert none == 0, "Mr = 0 is no reliable machine"


def test_reliable_unreliable_pool_without_replication_takes_one_runtime():
    makespan, cost, reliable = one(fixed(), NTDMr(None, 4 * R, 4 * R, 0.1), Setup(tasks=10, unreliable=10,
                                                                                   prices=PRICES))
    assert makespan == pytest.approx(R)
    assert cost == pytest.approx(R / 3600)
    assert reliable == 0


def test_a_whole_bag_runs_in_waves_and_its_tail_starts_when_machines_go_idle():
    e = estimate(fixed(), [NTDMr(None, 4 * R, 4 * R, 0.0)], Setup(tasks=25, unreliable=10, bag=True, prices=PRICES))
    assert e.makespan[0] == pytest.approx(3 * R)
    assert e.tail_makespan[0] == pytest.approx(R)  # 5 tasks left after the second wave


def test_a_timed_out_instance_hands_over_to_the_reliable_pool_after_t():
    makespan, cost, reliable = one(fixed(), NTDMr(1, R / 2, R / 2, 1.0), Setup(tasks=4, unreliable=4, prices=PRICES))
    assert makespan == pytest.approx(1.5 * R)  # times out at R/2, the reliable instance then takes R
    assert cost == pytest.approx(R * 36.0 / 3600)  # the timed-out instance costs nothing
    assert reliable == 4


def test_replicas_already_sent_run_on_and_their_results_are_paid():
    makespan, cost, reliable = one(fixed(), NTDMr(1, 0.0, 4 * R, 1.0), Setup(tasks=5, unreliable=5, prices=PRICES))
    assert makespan == pytest.approx(R)
    assert cost == pytest.approx(R * (1.0 + 36.0) / 3600)
    assert reliable == 5


def test_a_queued_reliable_instance_is_cancelled_when_the_task_succeeds():
    # one reliable machine, T = 0: every task queues a reliable instance at once, but the unreliable
    # instances return after R, before the reliable machine reaches most of them
    _, cost, reliable = one(fixed(), NTDMr(1, 0.0, 4 * R, 0.1), Setup(tasks=10, unreliable=10, prices=PRICES))
    assert reliable == 1
    assert cost == pytest.approx((10 * R * 1.0 + R * 36.0) / 3600 / 10)


def test_the_reliable_pool_charges_whole_periods():
    hourly = Prices(unreliable_per_hour=0.0, reliable_per_hour=34.0, charging_period=3600.0)
    _, cost, _ = one(fixed(), NTDMr(0, 0.0, R, 1.0), Setup(tasks=3, unreliable=3, prices=hourly))
    assert cost == pytest.approx(34.0)


def test_instances_out_at_the_tail_start_finish_what_they_have_left():
    setup = Setup(tasks=4, unreliable=4, prices=PRICES, ages=(R / 4, R / 2, R / 2, 3 * R / 4))
    makespan, cost, _ = one(fixed(), NTDMr(None, 4 * R, 4 * R, 0.0), setup)
    assert makespan == pytest.approx(3 * R / 4)
    assert cost == pytest.approx(R / 3600)


def test_an_unreachable_deadline_never_ends_and_says_so():
    setup = Setup(tasks=2, unreliable=2, prices=PRICES, horizon=20 * R)
    makespan, _, _ = one(fixed(), NTDMr(None, R / 2, R / 2, 0.0), setup)
    assert math.isinf(makespan)


def test_lower_reliability_means_longer_tails_without_replication():
    runtimes = np.linspace(500.0, 1500.0, 101)
    setup = Setup(tasks=40, unreliable=50, prices=PRICES)
    plan = NTDMr(None, 2 * R, 2 * R, 0.0)
    good = estimate(from_runtimes(runtimes, 0.95), [plan], setup, seed=3).makespan[0]
    bad = estimate(from_runtimes(runtimes, 0.6), [plan], setup, seed=3).makespan[0]
    assert bad > good


# -- determinism ------------------------------------------------------------------------------------------------


def noisy():
    return from_runtimes(np.linspace(200.0, 4000.0, 200), 0.8, 1500.0)


def test_same_seed_same_estimate_other_seed_other_estimate():
    space = sample_space(noisy().tur, 0.1, mr_points=2)
    setup = Setup(tasks=30, unreliable=20, bag=True, prices=PRICES)
    a = estimate(noisy(), space, setup, repetitions=3, seed=7)
    b = estimate(noisy(), space, setup, repetitions=3, seed=7)
    c = estimate(noisy(), space, setup, repetitions=3, seed=8)
    assert np.array_equal(a.runs_makespan, b.runs_makespan) and np.array_equal(a.runs_cost, b.runs_cost)
    assert not np.array_equal(a.runs_makespan, c.runs_makespan)


def test_a_strategy_is_estimated_alike_alone_or_in_a_batch():
    space = sample_space(noisy().tur, 0.1, mr_points=2)
    setup = Setup(tasks=30, unreliable=20, bag=True, prices=PRICES)
    batch = estimate(noisy(), space, setup, repetitions=3, seed=1)
    alone = estimate(noisy(), [space[17]], setup, repetitions=3, seed=1)
    assert np.array_equal(batch.runs_makespan[17], alone.runs_makespan[0])
    assert np.array_equal(batch.runs_cost[17], alone.runs_cost[0])


def test_setups_that_cannot_be_simulated_are_refused():
    with pytest.raises(EstimateError):
        Setup(tasks=2, unreliable=1, ages=(1.0, 2.0))
    with pytest.raises(EstimateError):
        Setup(tasks=2, unreliable=4, ages=(1.0,), bag=True)
    with pytest.raises(EstimateError):
        estimate(fixed(), [], Setup(tasks=1, unreliable=1))


# -- characterization -------------------------------------------------------------------------------------------


def test_fs_and_its_inverse_follow_the_sample():
    char = from_runtimes([10.0, 20.0, 30.0, 40.0], 0.5)
    assert list(char.fs([5.0, 10.0, 25.0, 40.0])) == [0.0, 0.25, 0.5, 1.0]
    assert list(char.fs_inverse([0.1, 0.25, 0.26, 1.0])) == [10.0, 10.0, 20.0, 40.0]
    assert char.tur == 25.0 and char.tr == 25.0  # T_r defaults to T_ur (paper, Table 2)


def test_draws_fail_with_probability_one_minus_gamma():
    char = from_runtimes(np.linspace(1.0, 100.0, 100), 0.8)
    u = np.random.default_rng(0).random(20000)
    took = char.turnaround(u, 0.0)
    assert np.mean(np.isinf(took)) == pytest.approx(0.2, abs=0.01)
    assert np.all(took[np.isfinite(took)] >= 1.0)


def test_an_instance_already_out_is_drawn_beyond_its_age():
    char = from_runtimes(np.linspace(1.0, 100.0, 100), 1.0)
    took = char.turnaround(np.linspace(0.0, 1.0, 50), 0.0, 60.0)
    assert np.all(took >= 60.0)


def records(tail_start=1000.0):
    """Three full-knowledge sets (gamma 1, 0.5, 0.75), then one set sent 50 s before the tail starts."""
    out = []
    for start, good in ((0.0, 4), (100.0, 2), (200.0, 3)):
        out += [InstanceRecord(start + i, start + i + 50.0 if i < good else None, i < good) for i in range(4)]
    out += [InstanceRecord(tail_start - 50.0 + i * 0.0, None, False) for i in range(4)]
    out.append(InstanceRecord(10.0, 80.0, True, reliable=True))
    return out


def test_gamma_in_the_three_epochs():
    char = characterize(records(), tail_start=1000.0, deadline=400.0, bin_size=4)
    assert list(char.gamma_values[:3]) == [1.0, 0.5, 0.75]
    assert char.gamma_values[3] == 0.5  # nothing back yet, Fs(50) = 1: bounded below by the least full value
    assert char.gamma_future == pytest.approx((0.75 + 0.5) / 2)  # equal weights: full mean, partial mean
    assert char.gamma([-1000.0, -850.0, 0.0, 500.0]).tolist() == [1.0, 0.5, char.gamma_future, char.gamma_future]
    assert char.tr == 70.0  # from the reliable record
    assert char.origin == 1000.0


def test_partial_knowledge_counts_results_against_what_fs_expects():
    took = [40.0, 100.0, 100.0, 100.0]
    recs = [InstanceRecord(float(i), i + took[i] if i < 4 else None, i < 4) for i in range(10)]  # gamma 0.4
    recs += [InstanceRecord(950.0, 990.0 if i == 0 else None, i == 0) for i in range(4)]  # out 50 s, 1 back
    char = characterize(recs, tail_start=1000.0, deadline=300.0, bin_size=10)
    # Fs(50) = 2/5 (40 s twice among 40, 100, 100, 100, 40): 1 result where 4 x 2/5 were expected
    assert char.gamma_values.tolist() == pytest.approx([0.4, 0.625])
    assert char.gamma_future == pytest.approx((0.4 + 0.625) / 2)
    more = recs[:10] + [InstanceRecord(950.0, 990.0 if i < 3 else None, i < 3) for i in range(4)]
    assert characterize(more, tail_start=1000.0, deadline=300.0, bin_size=10).gamma_values[1] == 1.0  # capped


def test_nothing_returned_yet_asks_for_an_offline_characterization():
    with pytest.raises(CharacterizationError, match="from_runtimes") as err:
        characterize([InstanceRecord(0.0, None, False)], tail_start=10.0, deadline=5.0)
    assert isinstance(err.value, GridbotError)
    with pytest.raises(CharacterizationError):
        from_runtimes([], 0.9)
    with pytest.raises(CharacterizationError):
        from_runtimes([1.0], 0.0)


# -- the strategy space and the static strategies ---------------------------------------------------------------


def test_the_papers_sampling():
    space = sample_space(100.0, 0.1)
    assert len(space) == 4 * 15 * 5  # N 0..3, 15 pairs T <= D on 5 points, Mr at 5 points
    assert all(0 <= s.t <= s.d <= 400.0 for s in space)
    assert {s.mr for s in space} == {0.02, 0.04, 0.06, 0.08, 0.1}
    assert NTDMr(3, 100.0, 200.0, 0.02) in space  # the paper's "ExPERT recommended"
    assert [NTDMr(0, 0, 0, mr).reliable_machines(50) for mr in (0.02, 0.04, 0.06, 0.08, 0.1)] == [1, 2, 3, 4, 5]


def test_static_strategies_as_the_paper_defines_them():
    p = static_plans(100.0, 0.1, tasks=150)
    assert p["AR"].from_start and p["AR"].tail.n == 0
    assert (p["TRR"].tail.n, p["TRR"].tail.t, p["TRR"].tail.mr) == (0, 0.0, 0.1)
    assert (p["TR"].tail.n, p["TR"].tail.t, p["TR"].tail.d) == (0, 400.0, 400.0)
    assert p["AUR"].tail.n is None and p["AUR"].tail.t == p["AUR"].tail.d
    assert p["B"].budget == pytest.approx(100.0)  # 2/3 cent per task
    assert p["CN∞"].combine is Combine.ALWAYS and p["CN∞"].tail.n is None
    assert p["CN1T0"].combine is Combine.THROUGHPUT and (p["CN1T0"].tail.n, p["CN1T0"].tail.t) == (1, 0.0)
    with pytest.raises(StrategyValueError):
        NTDMr(-1, 0.0, 1.0, 0.1)


def test_all_to_reliable_runs_the_bag_on_the_reliable_pool_alone():
    p = static_plans(R, 0.1, tasks=20)
    e = estimate(fixed(), [p["AR"]], Setup(tasks=20, unreliable=50, bag=True, prices=PRICES))
    assert e.makespan[0] == pytest.approx(4 * R)  # 20 tasks on 5 machines
    assert e.reliable[0] == 20


def test_combining_pools_puts_reliable_machines_to_work_in_the_throughput_phase():
    p = static_plans(R, 0.2, tasks=60)
    setup = Setup(tasks=60, unreliable=10, bag=True, prices=PRICES)
    e = estimate(fixed(), [p["AUR"], p["CN∞"]], setup)
    assert e.reliable[0] == 0 and e.reliable[1] > 0
    assert e.makespan[1] < e.makespan[0]


def test_the_budget_strategy_waits_until_the_budget_covers_the_rest():
    p = static_plans(R, 0.1, tasks=20, budget_per_task=1.0)  # 20 in all; a reliable task costs 10
    setup = Setup(tasks=20, unreliable=10, bag=True, prices=PRICES)
    e = estimate(from_runtimes(np.linspace(500.0, 1500.0, 11), 0.7), [p["B"]], setup, repetitions=5)
    assert 0 < e.reliable[0] <= 1.0 + 1e-9


# -- the frontier and the utilities -----------------------------------------------------------------------------

M = [10.0, 20.0, 15.0, 30.0, 20.0, 10.0, 40.0]
C = [9.0, 3.0, 5.0, 1.0, 4.0, 9.0, 1.0]


def test_the_frontier_keeps_what_nothing_dominates():
    assert pareto(M, C).tolist() == [0, 5, 2, 1, 3]  # 4 (20, 4) is dominated by 1, 6 by 3; equal points stay
    assert dominating(M, C, (25.0, 6.0)).tolist() == [1, 2, 4]
    assert dominating(M, C, (10.0, 9.0)).tolist() == []


def test_the_frontier_of_random_points_matches_the_definition():
    rng = np.random.default_rng(5)
    m, c = rng.integers(0, 20, 300).astype(float), rng.integers(0, 20, 300).astype(float)
    front = set(pareto(m, c).tolist())
    for i in range(300):
        assert (i in front) == (dominating(m, c, (m[i], c[i])).size == 0)


@pytest.mark.parametrize(("chosen", "index"), [
    (Utility.makespan(), 0), (Utility.cost(), 3), (Utility.product(), 3), (Utility.deadline(16.0), 2),
    (Utility.budget(4.5), 1), (Utility.expression("Makespan + 2 * Cost"), 2), (utility("deadline:20"), 1),
    (utility("budget:1"), 3), (utility("product"), 3), (utility("min(Makespan, 100) * max(Cost, 5)"), 2),
])
def test_each_utility_picks_its_best(chosen, index):
    assert best(M, C, chosen, pareto(M, C)) == index


def test_a_deadline_or_budget_nobody_meets_has_no_best():
    assert best(M, C, Utility.deadline(5.0)) is None
    assert best(M, C, Utility.budget(0.5)) is None


@pytest.mark.parametrize(("text", "value"), [
    ("2 + 3 * 4", 14.0), ("-2 ** 2", -4.0), ("2 ** 3 ** 2", 512.0), ("(1 + 2) * 3", 9.0), ("10 / 4 - 1", 1.5),
    ("max(1, 2, 3) - min(4, 5)", -1.0), ("makespan * COST", 6.0), ("1e3 + .5", 1000.5), ("+Cost", 3.0),
])
def test_the_expression_language(text, value):
    score = Utility.expression(text).score(np.array([2.0]), np.array([3.0]))
    assert score.tolist() == [value]


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')", "Makespan; Cost", "eval('1')", "Makespan.real", "lambda: 1", "",
    "1 +", "(1", "max 1", "'a'", "Cost[0]", "Makespan Cost", "min()", "open(1)", "x", "1 = 1", "Cost ** ",
    "(" * 60 + "1" + ")" * 60, "1+" * 300 + "1",
])
def test_the_expression_parser_refuses_anything_else(text):
    with pytest.raises(ExpressionError, match="Makespan, Cost") as err:
        utility(text)
    assert isinstance(err.value, GridbotError)


def test_a_named_utility_with_a_bad_bound_says_how_to_write_it():
    with pytest.raises(ExpressionError, match="deadline:5000"):
        utility("deadline:soon")


@pytest.mark.parametrize("text", ["deadline:-5", "deadline:0", "budget:nan", "budget:inf", "deadline:-inf"])
def test_a_named_utility_whose_bound_no_strategy_can_meet_is_refused(text):
    """Found by the command-line review of 2026-11-27: `deadline:-5` and `budget:nan` were accepted in a spec's
    [strategy] and by `gridbot plan --utility`, and no strategy could ever meet them."""
    with pytest.raises(ExpressionError, match="finite number above 0"):
        utility(text)


@pytest.mark.parametrize("text", ["1/0", "Cost / 0", "10 ** 400", "(-1) ** 0.5", "Makespan - 1/0", "-1/0"])
def test_an_expression_that_is_no_finite_number_is_refused_when_read(text):
    """Audit: '1/0' was read (and taken as a bag's [strategy] utility), then chose no strategy, and `gridbot plan`
    said to "give a looser --deadline or --budget" that nobody had given."""
    with pytest.raises(ExpressionError, match=r"is not a finite number at any makespan and cost tried \(0 to 1e10; "
                                              r"e\.g\. a division by zero.*such as 'Makespan \* Cost'"):
        utility(text)


def test_an_expression_finite_only_at_long_makespans_is_read():
    """The review of 2026-11-29: probes up to 1e6 s refused one finite from 23 days on."""
    utility("(Makespan - 2e6) ** 0.5")


def test_an_expression_infinite_only_on_some_points_is_read_and_never_taken_for_a_bound():
    """'Makespan / Cost' is a number unless a strategy is free: read, and where every strategy is free it has no
    best, which is told apart from a bound nobody meets by `bounded`."""
    ratio = utility("Makespan / Cost")
    assert best(M, C, ratio) is not None and best(M, np.zeros_like(C), ratio) is None
    assert not ratio.bounded and not utility("product").bounded
    assert utility("deadline:20").bounded and utility("budget:1").bounded


# -- the range stated with a prediction --------------------------------------------------------------------------


def _lossy_tail(tasks: int = 16, machines: int = 16):
    from gridbot.schedulers.expert.planner import Observed, PoolFacts

    pools = (PoolFacts("grid", False, 1.0, slots=machines), PoolFacts("cloud", True, 34.0, 1.0, capacity=4))
    ages = tuple(float(a) for a in np.random.default_rng(3).uniform(0.0, 20.0, tasks))
    return Observed(now=0.0, records=(), out=(), ages=ages, tasks=tasks, pools=pools, throughput_deadline=25.0)


def _tails_again(char, planning, obs):
    """The chosen strategy's tails drawn anew with another seed (3,000 of them), from `char`: measured tails."""
    setup = Setup(obs.tasks, 16, planning.prices, ages=obs.ages, throughput_deadline=25.0, step=planning.setup.step,
                  horizon=planning.setup.horizon)
    return estimate(char, [planning.space[planning.chosen]], setup, repetitions=3000, seed=99)


def test_the_stated_range_holds_the_tails_the_standard_deviation_does_not():
    """The CI failure that made the range: a lossy tail measured 41.5 s against 21.4 ± 6.3 s predicted. Tails
    are skewed, often bimodal (a task whose N instances are all lost waits N x T for the reliable pool, and
    pays for it), so a multiple of the standard deviation holds fewer of them than a normal's would: here 2 sd
    above the mean misses 6% of the makespans, 3 sd 1.7% of the costs. The range, the extremes of 1,000 draws,
    holds 99.8% on average.
    Tails drawn with another seed stand for the measured ones."""
    from gridbot.schedulers.expert.planner import Settings, plan_with

    char = from_runtimes([3.1, 4.1, 5.1, 6.1], 0.75)
    obs = _lossy_tail()
    planning = plan_with(char, "offline", obs, Settings(repetitions=30, pin="N=3 T=2Tur D=2Tur Mr=0.0625"))
    assert planning.ranges is not None and planning.chosen is not None
    (m_lo, m_hi), (c_lo, c_hi) = planning.ranges
    mean, cost = planning.prediction()
    assert m_lo < mean < m_hi and c_lo < cost < c_hi
    other = _tails_again(char, planning, obs)
    tails, costs = other.runs_tail_makespan[0], other.runs_cost[0]
    assert np.mean((tails >= m_lo) & (tails <= m_hi)) >= 0.995
    assert np.mean((costs >= c_lo) & (costs <= c_hi)) >= 0.995
    assert np.mean(tails > mean + 2.0 * planning.error[0]) > 0.05
    assert np.mean(costs > cost + 3.0 * planning.error[1]) > 0.01


def test_the_range_widens_when_gamma_was_measured_on_few_instances():
    from gridbot.schedulers.expert.planner import Settings, plan_with

    char = from_runtimes([3.1, 4.1, 5.1, 6.1], 0.75)
    settings = Settings(repetitions=30, pin="N=3 T=2Tur D=2Tur Mr=0.0625")
    known = plan_with(char, "offline", _lossy_tail(), settings)
    few = plan_with(char, "online", _lossy_tail(), settings, sample=40)
    assert known.ranges is not None and few.ranges is not None
    assert few.ranges[0][1] > known.ranges[0][1] and few.ranges[1][1] > known.ranges[1][1]
    assert few.ranges[0][0] <= known.ranges[0][0]
    assert known.range_share == pytest.approx(999 / 1001) and few.range_share == pytest.approx(999 / 1001)


def test_the_range_holds_tails_where_the_instances_out_return_at_the_pooled_gamma():
    """A known gap until now: gamma is measured on sets of 20 instances sent one after another, and the few
    sent last before T_tail make a set of their own whose gamma by equation 2 comes out 0 or 1. The instances
    out at T_tail took that value in every simulated tail, so on a small lossy grid the range missed a tail
    where some of them came back (6 of 20 runs). The range now also draws them at the pooled gamma, with its
    error. Here the last set's gamma is 0: tails where the instances out return as the others do (gamma
    0.75) must be inside the range too."""
    from gridbot.schedulers.expert.planner import Settings, plan_with

    pooled = from_runtimes([3.1, 4.1, 5.1, 6.1], 0.75)
    last_set_lost = dataclasses.replace(pooled, gamma_sent=np.array([-200.0, -20.0]),
                                        gamma_values=np.array([0.75, 0.0]))
    obs = _lossy_tail()
    planning = plan_with(last_set_lost, "online", obs, Settings(repetitions=30, pin="N=3 T=2Tur D=2Tur Mr=0.0625"),
                         sample=40)
    assert planning.ranges is not None and planning.chosen is not None
    (m_lo, m_hi), (c_lo, c_hi) = planning.ranges
    other = _tails_again(pooled, planning, obs)
    tails, costs = other.runs_tail_makespan[0], other.runs_cost[0]
    assert np.mean((tails >= m_lo) & (tails <= m_hi)) >= 0.995, (m_lo, m_hi, np.quantile(tails, [0.001, 0.5]))
    assert np.mean((costs >= c_lo) & (costs <= c_hi)) >= 0.995, (c_lo, c_hi, np.quantile(costs, [0.001, 0.5]))


def test_the_cost_range_looks_at_both_sides_of_gamma():
    """Found by review: with replicas left to run, more instances returning makes a tail dearer, so the
    cheapest tails are not always at the higher gamma. Five replicas, gamma 0.95 measured on 40 instances:
    the range took its low cost at gamma + 2 se (1.0) alone and 35% of the tails at the measured gamma cost
    less than it."""
    from gridbot.schedulers.expert.planner import Settings, plan_with

    char = from_runtimes([3.1, 4.1, 5.1, 6.1], 0.95)
    obs = _lossy_tail()
    planning = plan_with(char, "online", obs, Settings(repetitions=30, pin="N=5 T=0.5Tur D=3Tur Mr=0.0625"),
                         sample=40)
    assert planning.ranges is not None and planning.chosen is not None
    (m_lo, m_hi), (c_lo, c_hi) = planning.ranges
    other = _tails_again(char, planning, obs)
    assert np.mean((other.runs_cost[0] >= c_lo) & (other.runs_cost[0] <= c_hi)) >= 0.995
    assert np.mean((other.runs_tail_makespan[0] >= m_lo) & (other.runs_tail_makespan[0] <= m_hi)) >= 0.995


def test_a_tail_too_long_to_simulate_whole_has_its_range_where_its_prediction_is():
    """Found by review: when the tail is too long for `refine`, the prediction comes from the space's sample of
    the tail; the range was simulated on the whole tail (longer: the longest of more tasks), 94-131 s against
    a prediction of 73 s."""
    from gridbot.schedulers.expert.planner import Settings, plan_with

    char = from_runtimes([3.1, 4.1, 5.1, 6.1], 0.75)
    planning = plan_with(char, "offline", _lossy_tail(6000), Settings(repetitions=100))
    assert planning.refined is None and planning.ranges is not None
    (m_lo, m_hi), (c_lo, c_hi) = planning.ranges
    mean, cost = planning.prediction()
    assert m_lo <= mean <= m_hi and c_lo <= cost <= c_hi
    assert planning.range_share < 0.99  # few draws of a long tail: the share says so


# -- the dispatch delays the paper's model leaves out -----------------------------------------------------------


def test_each_instance_of_a_chain_is_sent_late_by_the_dispatch_delay_and_the_reliable_one_by_a_pilots_start():
    # every instance takes R and D = R/2 loses each: instance 1 at d, instance 2 at T + 2d, the reliable one at
    # 2T + 2d + rd, its result R later; the delays are not paid for
    n2 = NTDMr(2, R / 2, R / 2, 1.0)
    makespan, cost, reliable = one(fixed(), n2, Setup(tasks=4, unreliable=4, prices=PRICES))
    assert makespan == pytest.approx(2 * R) and reliable == 4
    late = Setup(tasks=4, unreliable=4, prices=PRICES, dispatch_delay=10.0, reliable_delay=60.0)
    makespan_late, cost_late, reliable_late = one(fixed(), n2, late)
    assert makespan_late == pytest.approx(2 * R + 2 * 10.0 + 60.0)
    assert (cost_late, reliable_late) == (pytest.approx(cost), 4)


def test_a_task_that_succeeds_while_its_next_instance_waits_out_the_delay_sends_none():
    # T = R/4 < R: the replica is due at R/4, but with a dispatch delay of R it would go at 1.25 R, after the first
    # instance's result at R: it is never sent, and never paid for
    _, cost, _ = one(fixed(), NTDMr(None, R / 4, 4 * R, 0.0), Setup(tasks=3, unreliable=6, prices=PRICES,
                                                                     ages=(0.0, 0.0, 0.0), dispatch_delay=R))
    assert cost == pytest.approx(R / 3600)


def test_a_reliable_machine_that_is_not_up_starts_once_for_its_first_instance():
    # N = 0, one reliable machine serves three tasks in turn: its start is paid in time once, never in money
    strategy, setup = NTDMr(0, 0.0, R, 1 / 3), Setup(tasks=3, unreliable=3, prices=PRICES)
    makespan, cost, _ = one(fixed(), strategy, setup)
    assert makespan == pytest.approx(3 * R)
    cold = dataclasses.replace(setup, reliable_startup=100.0)
    assert one(fixed(), strategy, cold)[:2] == (pytest.approx(3 * R + 100.0), pytest.approx(cost))
    assert one(fixed(), strategy, dataclasses.replace(cold, reliable_up=1))[0] == pytest.approx(3 * R)


def test_a_reliable_machine_that_is_up_and_idle_is_taken_before_one_is_started():
    # two reliable machines, not up: the first task (due at 0) starts one, which is idle again at 1,100 s; the
    # second (due at 1,500 s) takes it rather than start the other (found by review: the idle machines were a
    # FIFO with the unstarted ones first, and this tail took 2,600 s)
    setup = Setup(tasks=2, unreliable=2, prices=PRICES, ages=(1500.0, 0.0), reliable_startup=100.0)
    makespan, _, reliable = one(from_runtimes([R], 0.001, R), NTDMr(0, 1500.0, R, 1.0), setup)
    assert (makespan, reliable) == (pytest.approx(2500.0), 2)


def test_delays_are_half_a_tick_and_the_pools_startup_until_the_tail_measured_its_own():
    from gridbot.schedulers.expert.planner import Delays, Observed, PoolFacts, delays

    cold = (PoolFacts("grid", False, slots=8), PoolFacts("cloud", True, startup=120.0),
            PoolFacts("cluster", True, startup=30.0))
    assert delays(Observed(0.0, (), (), (), 4, cold, 25.0, tick=1.0)) == Delays(
        0.5, 0.5, 30.0, 0, "instances sent 0.5 s after their timer (half a tick), 0.5 s on the reliable pools (half "
        "a tick), whose pilots start in 30.0 s (Pool.Startup; 0 slots up)")  # the fastest reliable pool to start
    warm = (cold[0], PoolFacts("cloud", True, slots=1, startup=120.0))
    assert delays(Observed(0.0, (), (), (), 4, warm, 25.0, tick=1.0))[:4] == (0.5, 0.5, 120.0, 1)
    # measured: medians (an instance that waited for a machine is no typical lag); a start less the warm lag
    measured = Observed(0.0, (), (), (), 4, cold, 25.0, tick=1.0, dispatch_lags=(0.2, 0.6, 300.0),
                        reliable_lags=(0.75, -0.1, 0.8), startup_lags=(3.25,))
    assert delays(measured) == Delays(0.6, 0.75, 2.5, 0, "instances sent 0.6 s after their timer (measured on 3), "
                                      "0.8 s on the reliable pools (measured on 3), whose pilots start in 2.5 s "
                                      "(measured on 1; 0 slots up)")
    assert delays(Observed(0.0, (), (), (), 4, (cold[0],), 25.0)) == Delays(0.0, 0.0, 0.0, 0, "")


def test_dispatch_delays_must_be_finite_and_not_negative():
    for bad in ({"dispatch_delay": -1.0}, {"reliable_delay": math.inf}, {"dispatch_delay": math.nan}):
        with pytest.raises(EstimateError, match="dispatch delays must be finite and at least 0"):
            Setup(tasks=1, unreliable=1, **bad)
    with pytest.raises(EstimateError, match="dispatch delays must be finite and at least 0"):
        Setup(tasks=1, unreliable=1, reliable_startup=-5.0)
    with pytest.raises(EstimateError, match="reliable machines up must be 0 or more, not -1"):
        Setup(tasks=1, unreliable=1, reliable_up=-1)


def test_a_host_that_claims_billions_of_slots_does_not_make_the_planner_ask_for_gigabytes():
    """Found by the bad-input hunt: a host whose exchange said slots = 2^31 - 1 made the planner allocate 16 GiB
    (one machine per slot), in `gridbot plan` and in the server. The protocol now holds a host to 65,536 slots,
    and an estimate to MACHINE_CELLS worlds x machines, however many hosts declare how much."""
    import tracemalloc

    from gridbot.schedulers.expert.planner import MACHINE_CELLS, Settings, plan_with

    char = from_runtimes([3.1, 4.1, 5.1, 6.1], 0.75)
    tracemalloc.start()
    try:
        planning = plan_with(char, "offline", _lossy_tail(machines=2**31 - 1), Settings(repetitions=10))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert planning.estimate.runs_cost.shape[0] == len(planning.space) > 0
    assert planning.setup.unreliable * len(planning.space) * 10 <= MACHINE_CELLS
    assert peak < 1 << 30, f"{peak / 2**20:.0f} MiB"

"""Plan a bag's tail with ExPERT from what was seen of it (sections 4.2-4.5, end to end).

`ExpertTail` runs this at the tail's start (and again as the statistics change) on what the dispatcher
saw; `gridbot plan` runs it in the command's own process on what the server sends back, so both find
the same frontier for the same input and seed. In order:

- the pools: which are reliable, their prices (the pools file's, or the strategy's options), the
  unreliable pools' effective size #ur and the reliable pools' capacity, which bounds Mr;
- the characterization: online (`characterize`, the paper's three epochs of gamma) from the bag's own
  instances, or, with fewer than `min_results` good results, offline from the results there are
  (`from_runtimes` with the success rate seen so far);
- the NTDMr space of section 6.1 (N = 0..3, T <= D at 0..4 T_ur, Mr from one reliable machine to
  Mr_max), or N = infinity alone when no reliable pool can be used;
- the estimate of the tail (or, while more tasks are left than #ur, of the rest of the bag: a throughput
  phase without replicas, then the tail, as in the paper's Figure 9), kept bounded: about `BUDGET`
  task-worlds (300 strategies x 10 repetitions x 50 tasks, 0.4-0.5 s here); a larger tail is simulated
  with fewer repetitions (at least 3), then scaled down to fewer tasks on proportionally fewer machines
  (same Mr, ages taken evenly), which keeps the cost per task and approximates the makespan;
- the frontier and the best strategy on it for the utility.

Short tasks with a long throughput deadline (seconds against an hour) would take the estimator's default
step (T_ur / 20) through hours of failed instances holding their machines: the step is at least a
hundredth of that deadline (event times stay exact, the step only orders them) and the horizon allows
twenty such deadlines.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from gridbot.schedulers.expert.characterize import (
    Characterization,
    CharacterizationError,
    InstanceRecord,
    characterize,
    from_history,
    from_runtimes,
)
from gridbot.schedulers.expert.estimate import Estimate, Setup, estimate
from gridbot.schedulers.expert.frontier import NOT_FINITE, Utility, best, pareto, utility
from gridbot.schedulers.expert.strategy import NTDMr, Plan, Prices, StrategyValueError, sample_space, static_plans

BUDGET = 300 * 10 * 50
"""Strategies x repetitions x simulated tasks per estimate (the event loop waits for it: well under 1 s)."""
MACHINE_CELLS = 3_000_000
"""Worlds x unreliable machines an estimate may simulate: about 170 bytes each at its peak (570 worlds on 5,000
machines took 485 MiB and 2.5 s). A tail of a few tasks among thousands of slots uses a handful of them, and
the machine count hosts declare is theirs to set: a host that said it had 2^31 slots made the planner ask
for 16 GiB."""
MIN_REPETITIONS = 3
RANGE_REPETITIONS = 1000
"""Repetitions of the chosen strategy alone, per gamma, for the range stated with its prediction
(`spread_range`); BUDGET may allow fewer for a long tail. A tail is one draw, and its makespan, the longest
of its tasks, is skewed and often bimodal (a task whose instances are all lost waits N x T for the reliable
pool), so one standard deviation says little of where it falls: the range of the draws does."""
MR_MIN = 0.02
"""The paper's lowest Mr (section 6.1)."""


@dataclass(frozen=True)
class PoolFacts:
    """One pool as the planner needs it."""

    name: str
    reliable: bool
    price_per_hour: float | None = None
    """Per CPU hour (None: the pools file does not say)."""
    charging_period: float | None = None
    slots: int = 0
    """Slots of its hosts heard from lately."""
    capacity: int = 0
    """Slots it may have at most (MaxRunning x Cpus of its ad; 0: unknown, its live slots count)."""
    startup: float = 0.0
    """Seconds a pilot of it takes from being asked for to taking work (its ad's Startup, the pools file's)."""


@dataclass(frozen=True)
class Observed:
    """What was seen of the bag at `now`: its instances, the tasks left and the pools."""

    now: float
    records: tuple[InstanceRecord, ...]
    """The instances that ended, or were lost (ended_at None)."""
    out: tuple[InstanceRecord, ...]
    """The instances still out (ended_at None)."""
    ages: tuple[float, ...]
    """Per task left with an instance out on an unreliable pool: seconds since the newest was sent."""
    tasks: int
    pools: tuple[PoolFacts, ...]
    throughput_deadline: float
    """D of the instances sent before the tail (the bag's instance deadline)."""
    mean_run_time: float = 0.0
    """Mean seconds from send to good result (a last resort when no turnaround was recorded)."""
    tick: float = 0.0
    """Seconds between the server's looks at the timers (0: not known)."""
    dispatch_lags: tuple[float, ...] = ()
    """Seconds from a tail timer running out to the instance it called for being sent, to an unreliable pool,
    as measured in this tail."""
    reliable_lags: tuple[float, ...] = ()
    """The same for the instances sent to the reliable pools, to a host that was up."""
    startup_lags: tuple[float, ...] = ()
    """The same to a reliable host that came after the timer ran out (a pilot's start included)."""


@dataclass(frozen=True)
class Settings:
    """The user's input (section 4.2): utility, Mr_max, repetitions, and prices the pools file lacks."""

    utility: str = "product"
    mr_max: float = 0.1
    repetitions: int = 10
    price_unreliable: float | None = None
    price_reliable: float | None = None
    charging_period: float | None = None
    min_results: int = 10
    """Good unreliable results below which the characterization is offline (from those results)."""
    seed: int = 0
    pin: str = ""
    """A strategy to apply whatever the utility says (`parse_pin`); it is estimated with the others."""
    reliable_runtime: float | None = None
    """T_r, seconds a task takes on the reliable pools (the paper's Table 1: the user's input); None: the
    reliable results seen, else T_ur."""


@dataclass(frozen=True)
class Planning:
    """A planned tail: the characterization, the space, its estimate, the frontier and the choice."""

    char: Characterization
    source: str
    """How the pools were characterized, for people."""
    setup: Setup
    scale: float
    """Simulated tasks over tasks left (1: all simulated)."""
    space: list[NTDMr]
    estimate: Estimate
    frontier: list[int]
    """Indices into `space`, by increasing makespan."""
    chosen: int | None
    """Index into `space` of the best strategy for `utility` (None: nothing meets its bound)."""
    utility: Utility
    unreliable: int
    """#ur, the unreliable pools' effective size."""
    reliable_capacity: int
    prices: Prices
    observed: Observed = field(repr=False)
    seed: int = 0
    error: tuple[float, float] = (0.0, 0.0)
    """One standard deviation of the chosen strategy's tail makespan and cost (`uncertainty`)."""
    ranges: tuple[tuple[float, float], tuple[float, float]] | None = None
    """The chosen strategy's simulated tail makespans and costs per task, shortest to longest and cheapest to
    dearest (`spread_range`)."""
    range_share: float = 0.0
    """The share of tails that fall in `ranges`, on average: (n - 1) / (n + 1) for the extremes of n draws."""
    refined: tuple[float, float] | None = None
    """The chosen strategy's tail makespan and cost estimated again on the whole tail with every repetition,
    when the space was simulated smaller or with fewer (None: it was not)."""

    @property
    def strategy(self) -> NTDMr | None:
        return self.space[self.chosen] if self.chosen is not None else None

    def describe(self, s: NTDMr) -> str:
        return s.describe(self.char.tur)

    def point(self, index: int) -> tuple[float, float]:
        """The tail makespan (seconds) and cost per task of a strategy of the space."""
        return float(self.estimate.tail_makespan[index]), float(self.estimate.cost[index])

    def prediction(self) -> tuple[float, float]:
        """The chosen strategy's tail makespan (seconds) and cost per task: its estimate on the whole tail."""
        assert self.chosen is not None
        return self.refined if self.refined is not None else self.point(self.chosen)

    def distinct_frontier(self) -> list[int]:
        """The frontier with one strategy per point (the first sampled of strategies that tie)."""
        out: list[int] = []
        for i in self.frontier:
            if not out or self.point(out[-1]) != self.point(i):
                out.append(i)
        return out

    def unchosen(self, duration: Callable[[float], str] = lambda s: f"{s:.0f} s") -> str:
        """Why no strategy was chosen (`chosen` is None), for people, with `duration` writing seconds: the
        utility is no finite number at any strategy sampled, or none keeps to its deadline or budget (with
        the fastest and the cheapest tails estimated, to say how far), or none ends its tail."""
        front = [self.point(i) for i in self.distinct_frontier()]
        name = self.utility.name
        if front and not self.utility.bounded:
            return f"the utility '{name}' is not a finite number for any strategy sampled (e.g. {NOT_FINITE})"
        if front:
            fast, cheap = min(front), min(front, key=lambda x: (x[1], x[0]))
            return (f"no strategy keeps to '{name}': the fastest tail estimated takes {duration(fast[0])} at "
                    f"{fast[1]:.4g} per task, the cheapest costs {cheap[1]:.4g} per task in {duration(cheap[0])}")
        return f"no strategy keeps to '{name}': none of those sampled ends its tail"

    def spread(self, index: int) -> tuple[float, float]:
        """One standard deviation over the repetitions of a strategy's tail makespan and cost."""
        runs_m = self.estimate.runs_tail_makespan[index]
        runs_c = self.estimate.runs_cost[index]
        return float(np.std(runs_m)) if np.all(np.isfinite(runs_m)) else math.inf, float(np.std(runs_c))


def reliable_pools(pools: Sequence[PoolFacts]) -> frozenset[str]:
    return frozenset(p.name for p in pools if p.reliable)


def pool_price(per_cpu_hour: float | None, per_pilot_hour: float | None, cpus: int,
               charging_period: float | None) -> tuple[float | None, float | None]:
    """A pool's price per CPU hour and the period it charges by, as the planner needs them: a CPU-hour price is
    paid by the second of wall time (gridbot's ledger), so it has no period; a pilot-hour price is paid per
    started `charging_period` and shared by the pilot's `cpus` slots (a cloud instance's bill)."""
    if per_pilot_hour is not None and per_pilot_hour > 0:
        return (per_cpu_hour or 0.0) + per_pilot_hour / max(1, cpus), charging_period
    return per_cpu_hour, None


def prices(pools: Sequence[PoolFacts], settings: Settings) -> Prices:
    """C_ur: the unreliable pools' price per CPU hour weighted by their slots; C_r and the charging period:
    the cheapest reliable pool's. An option wins over the pools file; what neither says is the paper's
    (Table 2: 1 and 34 per hour, the reliable pool charging by the second)."""
    default = Prices()
    unreliable = [p for p in pools if not p.reliable and p.price_per_hour is not None]
    c_ur = settings.price_unreliable
    if c_ur is None and unreliable:
        weights = [max(1, p.slots) for p in unreliable]
        c_ur = sum(w * (p.price_per_hour or 0.0) for w, p in zip(weights, unreliable, strict=True)) / sum(weights)
    reliable = sorted((p for p in pools if p.reliable and p.price_per_hour is not None),
                      key=lambda p: p.price_per_hour or 0.0)
    c_r = settings.price_reliable
    if c_r is None and reliable:
        c_r = reliable[0].price_per_hour
    period = settings.charging_period
    if period is None and reliable:
        period = reliable[0].charging_period
    return Prices(default.unreliable_per_hour if c_ur is None else c_ur,
                  default.reliable_per_hour if c_r is None else c_r,
                  period or default.charging_period)


def characterization(obs: Observed, settings: Settings) -> tuple[Characterization, str, int]:
    """Online from the bag's instances when it has `min_results` good unreliable results, else offline from
    the results it has (CharacterizationError when it has none); with the unreliable instances it counted."""
    ended = [r for r in obs.records if not r.reliable]
    good = [r for r in ended if r.success and r.ended_at is not None and r.ended_at <= obs.now]
    if len(good) >= settings.min_results:
        # an instance out for less than the fastest turnaround seen could not have returned yet: it tells
        # nothing of gamma (equation 2 divides by Fs = 0) and would only make a set of its own look lost
        fastest = min((r.ended_at or 0.0) - r.sent_at for r in good)
        out = [r for r in obs.out if r.reliable or obs.now - r.sent_at >= fastest]
        # with no reliable result yet, T_r is T_ur (the paper's Table 2), drawn like the unreliable turnarounds
        # rather than always the mean: a tail is the longest of its tasks
        took = [(r.ended_at or 0.0) - r.sent_at for r in good]
        char = with_tr(characterize([*obs.records, *out], obs.now, obs.throughput_deadline, reliable_runtime=took),
                       settings)
        return char, (f"online: {len(good)} results of {len(ended)} unreliable instances ended, "
                      f"gamma {char.gamma_future:.2f}"), len(ended) + sum(1 for r in out if not r.reliable)
    runtimes = [r.ended_at - r.sent_at for r in good if r.ended_at is not None]
    if not runtimes and obs.mean_run_time > 0:
        runtimes = [obs.mean_run_time]
    if not runtimes:
        raise CharacterizationError("no instance of the bag has returned a result yet")
    success = len(good) / len(ended) if ended else 1.0
    reliable_took = [r.ended_at - r.sent_at for r in obs.records
                     if r.reliable and r.success and r.ended_at is not None and r.ended_at <= obs.now]
    char = with_tr(from_runtimes(runtimes, max(0.05, success), reliable_took or runtimes), settings)
    return char, (f"offline: {len(good)} results so far (fewer than {settings.min_results}), success "
                  f"{success:.2f}"), len(ended)


def offline(history: Sequence[InstanceRecord], deadline: float, settings: Settings, name: str = "a history"
            ) -> tuple[Characterization, str, int]:
    """An offline characterization from the instances of a run that is over (`from_history`: gamma fully known),
    with the number of unreliable instances whose outcome it knew (for `uncertainty`)."""
    char = with_tr(from_history(history, deadline), settings)
    end = char.origin
    known = sum(1 for r in history if not r.reliable and r.sent_at < end - deadline)
    results = sum(1 for r in history if not r.reliable and r.success)
    return char, (f"offline from {name}: {results} results of {sum(1 for r in history if not r.reliable)} "
                  f"unreliable instances, gamma {char.gamma_future:.2f}"), known


def with_tr(char: Characterization, settings: Settings) -> Characterization:
    """The characterization with the user's T_r, if given (the paper's Table 1)."""
    if settings.reliable_runtime is None:
        return char
    if not (math.isfinite(settings.reliable_runtime) and settings.reliable_runtime > 0):
        raise CharacterizationError(f"the reliable runtime T_r must be a positive number of seconds, not "
                                    f"{settings.reliable_runtime}")
    return dataclasses.replace(char, reliable_runtimes=np.array([float(settings.reliable_runtime)]))


class Delays(NamedTuple):
    """What the paper's model leaves out of a tail (`delays`), in seconds, and what they rest on."""

    dispatch: float
    """From a timer running out to its instance being sent to an unreliable machine."""
    reliable: float
    """The same to a reliable machine that is up."""
    startup: float
    """What a reliable machine that is not up takes to start, beyond `reliable`."""
    up: int
    """Reliable slots up now."""
    said: str
    """For people ("" when all are 0)."""


def delays(obs: Observed) -> Delays:
    """The dispatch delays of a tail. The paper's model sends an instance the moment its timer runs out, on a
    machine that is there; gridbot looks at the timers on its tick, a host takes an instance when it next asks,
    and the reliable pools' pilots are asked for only once a task is due there, so each instance of a task's
    chain starts a little late, and the first on each reliable machine a pilot's start late: a lost task's
    tail, the longest, is late by all of them. Each is measured in this tail once there is one of its kind (the
    median: one instance that waited for a machine is no typical lag), else half a tick, and for a reliable
    machine's start the pools file's `startup` (the fastest reliable pool's)."""
    half = obs.tick / 2.0

    def typical(lags: tuple[float, ...], otherwise: float) -> float:
        return max(0.0, float(np.median(lags))) if lags else otherwise

    lag, reliable_lag = typical(obs.dispatch_lags, half), typical(obs.reliable_lags, half)
    pools = [p for p in obs.pools if p.reliable]
    up = reliable_up(obs)
    startup = max(0.0, typical(obs.startup_lags, 0.0) - reliable_lag) if obs.startup_lags else \
        min((p.startup for p in pools), default=0.0)
    if lag == reliable_lag == startup == 0.0:
        return Delays(0.0, 0.0, 0.0, up, "")

    def how(lags: tuple[float, ...], otherwise: str) -> str:
        return f"measured on {len(lags)}" if lags else otherwise

    return Delays(lag, reliable_lag, startup, up, (
        f"instances sent {lag:.1f} s after their timer ({how(obs.dispatch_lags, 'half a tick')}), "
        f"{reliable_lag:.1f} s on the reliable pools ({how(obs.reliable_lags, 'half a tick')}), whose pilots start "
        f"in {startup:.1f} s ({how(obs.startup_lags, 'Pool.Startup')}; {up} slot{'' if up == 1 else 's'} up)"))


def unreliable_size(obs: Observed) -> int:
    """#ur: the unreliable pools' live slots, at least the tasks with an instance out there."""
    return max(sum(p.slots for p in obs.pools if not p.reliable), len(obs.ages))


def reliable_up(obs: Observed) -> int:
    """The reliable pools' live slots: machines the tail need not start."""
    return sum(p.slots for p in obs.pools if p.reliable)


def reliable_capacity(obs: Observed) -> int:
    return sum(max(p.capacity, p.slots) for p in obs.pools if p.reliable)


def space(tur: float, unreliable: int, capacity: int, mr_max: float) -> list[NTDMr]:
    """The sampled NTDMr strategies for #ur = `unreliable` and `capacity` reliable slots.

    Mr runs from the paper's 0.02 (but at least one reliable machine) to Mr_max (but at most the reliable
    capacity; at least one machine when there is any, so a bag on fewer than 1/Mr_max unreliable slots
    may still use the reliable pool). Strategies giving the same number of reliable machines are one.
    No reliable capacity: the paper's "user without a reliable environment", N = infinity alone. D = 0 is
    kept for N = 0 only (gridbot accepts a late result, which the model ignores, so such instances would
    not even be useless)."""
    ur = max(1, unreliable)
    if capacity <= 0:
        return [NTDMr(None, s.t, s.d, 0.0) for s in sample_space(tur, MR_MIN, n_values=range(1), mr_points=1)]
    top = min(max(mr_max, 1.0 / ur), capacity / ur)
    low = min(top, max(MR_MIN, 0.5 / ur))
    sampled = sample_space(tur, top, mr_points=5 if top > low else 1, mr_min=low)
    seen: dict[tuple[int | None, float, float, int], NTDMr] = {}
    for s in sampled:
        if s.n != 0 and s.d == 0:  # unreliable instances that can never return: N = 0 with machines wasted
            continue
        seen.setdefault((s.n, s.t, s.d, max(1, s.reliable_machines(ur))), s)
    return list(seen.values())


def fit(s: NTDMr, unreliable: int, capacity: int) -> NTDMr:
    """A strategy given by hand (a pin) on the pools there are: its Mr lowered so that Mr x #ur is at most the
    reliable capacity, and raised to one machine when it rounds to none (as `space` samples it and as the tail
    applies it); no reliable capacity: Mr = 0."""
    ur = max(1, unreliable)
    if capacity <= 0:
        return dataclasses.replace(s, mr=0.0)
    if s.reliable_machines(ur) > capacity:
        return dataclasses.replace(s, mr=capacity / ur)
    if s.mr > 0 and s.reliable_machines(ur) < 1:
        return dataclasses.replace(s, mr=1.0 / ur)
    return s


def bounded(obs: Observed, unreliable: int, strategies: int, repetitions: int) -> tuple[int, int, tuple[float, ...],
                                                                                        int]:
    """(tasks, unreliable machines, ages, repetitions) to simulate within BUDGET."""
    tasks = max(1, obs.tasks)
    reps = max(1, repetitions)
    if strategies * reps * tasks > BUDGET:
        reps = max(min(reps, MIN_REPETITIONS), BUDGET // (strategies * tasks))
    top = max(1, BUDGET // (strategies * reps))
    if tasks <= top:
        return tasks, unreliable, obs.ages[:min(tasks, unreliable)], reps
    factor = top / tasks
    ur = max(1, round(unreliable * factor))
    keep = min(top, ur, len(obs.ages))
    ages = tuple(obs.ages[int(i * len(obs.ages) / keep)] for i in range(keep)) if keep else ()
    return top, ur, ages, reps


def plan(obs: Observed, settings: Settings) -> Planning:
    """Characterize, sample, estimate, and choose (CharacterizationError when nothing can be planned yet)."""
    char, source, sample = characterization(obs, settings)
    return plan_with(char, source, obs, settings, sample)


def plan_with(char: Characterization, source: str, obs: Observed, settings: Settings, sample: int = 0) -> Planning:
    """Sample, estimate and choose with a given characterization (an offline one: `gridbot plan --scenario`);
    `sample` is the number of instances its gamma was measured on (0: gamma is taken as known)."""
    price = prices(obs.pools, settings)
    ur = max(1, unreliable_size(obs))
    capacity = reliable_capacity(obs)
    strategies = space(char.tur, ur, capacity, settings.mr_max)
    if settings.pin:
        strategies.append(fit(parse_pin(settings.pin, char.tur), ur, capacity))
    tasks, sim_ur, ages, reps = bounded(obs, ur, len(strategies), settings.repetitions)
    sim_ur = min(sim_ur, max(tasks, MACHINE_CELLS // (len(strategies) * reps)))
    whole = obs.tasks > ur  # not in its tail yet: the rest of the bag, its throughput phase first
    thr = obs.throughput_deadline
    late = delays(obs)
    setup = Setup(tasks, sim_ur, price, ages=() if whole else ages, bag=whole, throughput_deadline=thr,
                  step=max(char.tur / 20.0, thr / 100.0),
                  horizon=(100.0 + 2.0 * tasks) * max(char.tur, char.tr) + 20.0 * thr + 5.0 * late.dispatch
                  + late.reliable + late.startup,
                  dispatch_delay=late.dispatch, reliable_delay=late.reliable, reliable_startup=late.startup,
                  reliable_up=round(late.up * sim_ur / ur))
    source = f"{source}; {late.said}" if late.said else source
    est = estimate(char, strategies, setup, repetitions=reps, seed=settings.seed)
    front = [int(i) for i in pareto(est.tail_makespan, est.cost) if np.isfinite(est.tail_makespan[i])]
    chosen_utility = utility(settings.utility)
    chosen = best(est.tail_makespan, est.cost, chosen_utility, front) if front else None
    if settings.pin:
        chosen = len(strategies) - 1
    planning = Planning(char, source, setup, tasks / max(1, obs.tasks), strategies, est, front, chosen,
                        chosen_utility, ur, capacity, price, obs, settings.seed)
    if chosen is None:
        return planning
    planning = dataclasses.replace(planning, error=uncertainty(planning, chosen, sample),
                                   refined=refine(planning, chosen, settings.repetitions))
    ranges, share = spread_range(planning, chosen, sample)
    return dataclasses.replace(planning, ranges=ranges, range_share=share)


def refine(planning: Planning, index: int, repetitions: int) -> tuple[float, float] | None:
    """The strategy estimated alone on the whole tail (every task, #ur machines, the instances out) with
    `repetitions`, if the space was estimated smaller or with fewer and this fits in BUDGET; else None."""
    obs, setup = planning.observed, planning.setup
    tasks, reps = max(1, obs.tasks), max(1, repetitions)
    if (setup.tasks >= tasks and planning.estimate.runs_cost.shape[1] >= reps) or tasks * reps > BUDGET:
        return None
    est = estimate(planning.char, [planning.space[index]], _capped(_whole(planning), reps), repetitions=reps,
                   seed=planning.seed)
    return float(est.tail_makespan[0]), float(est.cost[0])


def _capped(setup: Setup, worlds: int) -> Setup:
    """`setup` with no more unreliable machines than MACHINE_CELLS allows `worlds` worlds (at least its tasks)."""
    most = max(setup.tasks, MACHINE_CELLS // max(1, worlds))
    return setup if setup.unreliable <= most else dataclasses.replace(setup, unreliable=most)


def _whole(planning: Planning) -> Setup:
    """The planning's setup on the whole tail: every task, #ur machines, the instances out."""
    obs, setup, ur = planning.observed, planning.setup, planning.unreliable
    tasks = max(1, obs.tasks)
    return dataclasses.replace(setup, tasks=tasks, unreliable=ur, ages=() if setup.bag else obs.ages[:min(tasks, ur)],
                               reliable_up=reliable_up(obs))


def spread_range(planning: Planning, index: int, sample: int) -> tuple[tuple[tuple[float, float], tuple[float, float]],
                                                                       float]:
    """The range of a strategy's tails, ((makespan low, high), (cost low, high)), and the share of tails it
    holds on average: the strategy estimated alone with RANGE_REPETITIONS (fewer if BUDGET says so) on the
    setup its prediction came from (the whole tail when `refine` ran, else the space's), at the measured gamma
    and, when it was measured online on `sample` instances, two binomial standard errors either side; the
    lowest and highest of every draw. Both sides of gamma count for both ends: more instances returning makes
    a tail shorter, but with replicas left to run it can make it dearer. Measured online, gamma of the
    instances out at T_tail is their own sets' (the last set, of the few sent just before T_tail, often 0
    or 1), so the same gammas are drawn once more with those instances at the pooled gamma too: on a small
    lossy grid the range missed 5 of 60 simulated tails without it, 1 with it."""
    setup = _whole(planning) if planning.refined is not None else planning.setup
    g = planning.char.gamma_future
    se = math.sqrt(g * (1.0 - g) / sample) if sample > 0 else 0.0
    gammas = sorted({g, max(0.01, g - 2.0 * se), min(1.0, g + 2.0 * se)})
    chars = [dataclasses.replace(planning.char, gamma_future=gamma) for gamma in gammas]
    if planning.char.gamma_sent.size:  # the instances out at T_tail too, at the pooled gamma and its error
        chars += [dataclasses.replace(c, gamma_sent=np.zeros(0), gamma_values=np.zeros(0)) for c in chars]
    per = RANGE_REPETITIONS * len(gammas) // len(chars)  # (as many draws in all: the event loop waits for them)
    reps = max(MIN_REPETITIONS, min(per, BUDGET // (len(chars) * setup.tasks)))
    makespans, costs = [], []
    setup = _capped(setup, reps)
    for char in chars:
        est = estimate(char, [planning.space[index]], setup, repetitions=reps, seed=planning.seed)
        makespans.append(est.runs_tail_makespan[0])
        costs.append(est.runs_cost[0])
    m, c = np.concatenate(makespans), np.concatenate(costs)
    # the prediction is a mean of draws like these, but summed in another order: its last digit may fall outside
    pm, pc = planning.refined or planning.point(index)
    return (((min(float(m.min()), pm), max(float(m.max()), pm)), (min(float(c.min()), pc), max(float(c.max()), pc))),
            (reps - 1) / (reps + 1))


def uncertainty(planning: Planning, index: int, sample: int) -> tuple[float, float]:
    """One standard deviation of a strategy's tail makespan and cost: the spread of the estimate's repetitions
    and, when gamma was measured on `sample` instances, the change of the estimate over gamma's binomial
    standard error either way, combined. (The paper's online estimates were 20% off on average, Table 5:
    gamma measured while results are still coming in is what such estimates are least sure of.)"""
    sd_m, sd_c = planning.spread(index)
    g = planning.char.gamma_future
    se = math.sqrt(g * (1.0 - g) / sample) if sample > 0 else 0.0
    if se == 0.0:
        return sd_m, sd_c
    points = []
    for gamma in (max(0.01, g - se), min(1.0, g + se)):
        char = dataclasses.replace(planning.char, gamma_future=gamma)
        est = estimate(char, [planning.space[index]], planning.setup,
                       repetitions=int(planning.estimate.runs_cost.shape[1]), seed=planning.seed)
        points.append((float(est.tail_makespan[0]), float(est.cost[0])))
    (m_lo, c_lo), (m_hi, c_hi) = points
    return math.hypot(sd_m, abs(m_lo - m_hi) / 2.0), math.hypot(sd_c, abs(c_lo - c_hi) / 2.0)


def statics(planning: Planning, mr_max: float, budget: float | None = None) -> dict[str, tuple[float, float]]:
    """The paper's static strategies (section 5.3) on the same tail and prices: (tail makespan, cost per task).

    On a tail, AR and TRR coincide (everything left goes to the reliable pool at once) and CN1T0 is N = 1,
    T = 0; B's budget is `budget` per task, else the paper's proportion (2/3 cent against a reliable run
    of 19.5 cents: 1/29 of one reliable run)."""
    char, setup = planning.char, planning.setup
    ur = max(1, setup.unreliable)
    mr = min(max(mr_max, 1.0 / ur), planning.reliable_capacity / ur) if planning.reliable_capacity else 0.0
    per_task = float(planning.prices.reliable(np.array([char.tr]))[0])
    per_task_budget = budget if budget is not None else per_task / 29.0
    thr = setup.throughput_deadline if setup.throughput_deadline is not None else 4.0 * char.tur
    plans: dict[str, Plan] = static_plans(char.tur, mr, setup.tasks, per_task_budget, thr)
    if mr == 0.0:
        plans = {"AUR": plans["AUR"]}
    names = list(plans)
    est = estimate(char, [plans[n] for n in names], setup, repetitions=planning.estimate.runs_cost.shape[1],
                   seed=planning.seed)
    return {n: (float(est.tail_makespan[i]), float(est.cost[i])) for i, n in enumerate(names)}


def parse_pin(text: str, tur: float) -> NTDMr:
    """A strategy written as `describe` writes it: "N=3 T=2066 D=4132 Mr=0.02", T and D in seconds or in
    units of T_ur ("T=1Tur"), N a whole number or "inf" (StrategyValueError when it is not)."""
    values: dict[str, str] = {}
    for part in text.split():
        key, eq, value = part.partition("=")
        if not eq or key.strip().lower() not in ("n", "t", "d", "mr"):
            raise StrategyValueError(f"strategy {text!r}: write it as 'N=3 T=1Tur D=2Tur Mr=0.02' (T and D in "
                                     "seconds, or in units of T_ur)")
        values[key.strip().lower()] = value.strip()
    if set(values) != {"n", "t", "d", "mr"}:
        raise StrategyValueError(f"strategy {text!r} must give N, T, D and Mr, as in 'N=3 T=1Tur D=2Tur Mr=0.02'")

    def seconds(v: str) -> float:
        return float(v[:-3]) * tur if v.lower().endswith("tur") else float(v)

    try:
        n = None if values["n"].lower() in ("inf", "infinity", "none") else int(values["n"])
        return NTDMr(n, seconds(values["t"]), seconds(values["d"]), float(values["mr"]))
    except ValueError:
        raise StrategyValueError(f"strategy {text!r}: N is a whole number or inf, T and D seconds (or 2Tur), Mr "
                                 "a number") from None

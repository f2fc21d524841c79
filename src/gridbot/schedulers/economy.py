"""DBC: deadline- and budget-constrained scheduling across priced pools (Buyya, Murshed, Abramson and
Venugopal, SPE 2005: the algorithm of its Figure 2, with Nimrod-G's cost, time and conservative-time
optimizations beside the paper's cost-time).

A bag with a `bag_deadline` and a `budget` names one of four placements:
- `cost`: the pools by increasing cost; each takes as many jobs as it can finish by the deadline, while the
  budget lasts (Nimrod-G's cost optimization: the cheapest pool alone once the deadline is relaxed);
- `time`: each job to the pool where it would complete first, given the jobs planned before it, as long as
  the budget left pays for it (Nimrod-G's time optimization: fast, and it may spend the budget before the
  last jobs);
- `cost-time` (the paper's): pools of equal cost form a group; the groups by increasing cost, and within a
  group each job to the pool where it completes first, by the deadline, while the budget lasts;
- `conservative-time`: as `time`, but a job goes to a pool only if its cost there is within the budget left
  per job still to plan, so every remaining job keeps its share of the budget (when that share is below
  every pool's cost, the cheapest pools alone go on).

At each scheduling event (a tick at least `replan` seconds after the last plan) the placement follows
Figure 2's step 4: (a) each pool's job consumption is measured, as seconds one job takes on one slot there
(the mean turnaround of the bag's last `window` good results on the pool), and extrapolated to pools not
measured yet by their relative speed (the pool ad's `Speed`; the simulator sets it from the pool's speed),
else from the bag's `runtime` option, else from other bags' results on the pool; (b, c) the pools are sorted
and grouped by cost (a pool's advertised price per unit of work: its price per CPU-hour, plus its pilot-hour
price per slot, divided by its speed); (d, e) every job not started is planned anew: in a pull system a job
is bound to no pool before a host of it asks, so a plan always reschedules all of them, as step 4(d) asks
when availability changed. Step 5 (never overload a resource) is `limit`: a host of a pool gets at most the
jobs planned there not yet sent, on slots the bag does not already fill there, and never more than the
budget left pays for at the pool's cost per job, its running instances counted at full cost. `pilots` asks
the overlay for the planned slots only, and for no new pilot whose first charging period the budget cannot
pay. With no rate known anywhere yet the bag probes: one instance per pool of its cheapest group.

The plan is computed by waves (a pool's slots finish a wave of jobs every `seconds per job`): the waves before
the jobs or the budget run out are found by bisection on time, and only the last, partial ones wave by wave,
so a bag of a million jobs plans in a millisecond whatever its pools' speeds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from gridbot.core.ledger import Prices, ad_number
from gridbot.core.strategy import Migration, QosReport
from gridbot.core.view import BagView, DispatchView, HostView
from gridbot.model.spec import StrategyOption
from gridbot.schedulers.base import Placement, StrategyError

COST, TIME, COST_TIME, CONSERVATIVE = "cost", "time", "cost-time", "conservative-time"
MIN_SECONDS = 1e-3
"""The shortest time per job a plan takes (a result reported the instant it was sent measures 0)."""
UNMEASURED_MARGIN = 1.25
"""A job on a pool whose time per job comes from other bags' mean turnaround there is reserved at this much
more (extrapolated from the bag's own pools, it is reserved at their longest; with `runtime`, at that)."""
RUN_MARGIN = 1.25
"""An instance running longer than any measured is reserved at this much more than it has run so far."""


@dataclass
class PoolEstimate:
    """What a plan knows of one pool."""

    name: str
    prices: Prices
    slots: int
    """Slots the pool may give the bag at once (its pilots' limit x their slots, or its live hosts')."""
    speed: float
    seconds: float | None
    """Seconds one job takes on one slot (None: unknown)."""
    measured: bool
    running: int
    """The bag's instances running there at the plan."""
    busy_until: float = 0.0
    """Seconds from now until the running instances' remaining work would be done on all slots (fluid)."""
    cpus: int = 1
    delay: float = 0.0
    """Seconds its slots are expected to take yet before they take work (a pool slow to start its pilots)."""
    seconds_max: float | None = None
    """The longest a job took there among those measured (what an instance is reserved at: a mean lets the
    last jobs overrun the budget when run times vary)."""
    reserved: float = 0.0
    """What the bag's running instances there may still cost: each at the longer of `seconds_max` and a
    quarter more than it has run, plus one charging period per pilot-hour host they run on (the period in
    progress, which the ledger bills only once an instance of the bag ended there)."""

    @property
    def reserve(self) -> float:
        """Money an instance started now is reserved at."""
        longest = self.seconds_max if self.seconds_max is not None else self.seconds
        return 0.0 if longest is None else longest / 3600.0 * self._hourly

    @property
    def unit_cost(self) -> float:
        """The advertised price of a unit of work: what the paper's step 4(b) sorts and 4(c) groups by."""
        return (self.prices.per_cpu_hour + self.prices.per_pilot_hour / max(1, self.cpus)) / self.speed

    @property
    def cost(self) -> float:
        """Money one job costs there on average (0 when its time is unknown)."""
        if self.seconds is None:
            return 0.0
        return self.seconds / 3600.0 * self._hourly

    @property
    def _hourly(self) -> float:
        return self.prices.per_cpu_hour + self.prices.per_pilot_hour / max(1, self.cpus)


@dataclass
class Plan:
    """Jobs planned per pool, and what the plan projects."""

    assigned: dict[str, int] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)
    """Seconds from the plan until the pool's last planned job ends."""
    unplanned: int = 0
    cost: float = 0.0
    """What the planned jobs will cost."""


def plan_jobs(strategy: str, pools: Sequence[PoolEstimate], jobs: int, horizon: float, budget: float,
              tolerance: float = 0.01) -> Plan:
    """Plan `jobs` not yet started over `pools` (every one with a known time per job), to end within
    `horizon` seconds (inf: no deadline) and cost at most `budget` (inf: no limit), by `strategy`."""
    pools = [p if p.seconds is None or p.seconds >= MIN_SECONDS else replace(p, seconds=MIN_SECONDS)
             for p in pools if p.seconds is not None and p.slots > 0]
    plan = Plan()
    if strategy == COST:
        left = jobs
        for p in sorted(pools, key=lambda p: (p.unit_cost, -_rounded(p.slots / (p.seconds or 1.0)), p.name)):
            assert p.seconds is not None
            waves = math.inf if math.isinf(horizon) else max(0, math.floor((horizon - p.busy_until) / p.seconds + 1e-9))
            m = min(left, waves * p.slots, _affordable(budget, p.cost))
            m = int(m)
            if m > 0:
                plan.assigned[p.name] = m
                plan.finish[p.name] = p.busy_until + math.ceil(m / p.slots) * p.seconds
                plan.cost += m * p.cost
                budget -= m * p.cost
                left -= m
        plan.unplanned = left
        return plan
    if strategy == COST_TIME:
        left = jobs
        for group in _groups(pools, tolerance):
            left, budget = _fill(plan, group, left, horizon, budget, per_job=False)
            if left == 0:
                break
        plan.unplanned = left
        return plan
    plan.unplanned, _ = _fill(plan, pools, jobs, horizon, budget, per_job=strategy == CONSERVATIVE)
    return plan


def _rounded(x: float) -> float:
    """`x` to two significant digits: pools of equal cost are ordered by their rate without the noise of each
    measurement flipping their order from one plan to the next."""
    return float(f"{x:.2g}") if x > 0 else 0.0


def _affordable(budget: float, cost: float) -> float:
    if cost <= 0 or math.isinf(budget):
        return math.inf
    return max(0, math.floor(budget / cost + 1e-9))


def _groups(pools: Sequence[PoolEstimate], tolerance: float) -> list[list[PoolEstimate]]:
    """Pools of the same advertised cost (within `tolerance`, relative), cheapest group first."""
    groups: list[list[PoolEstimate]] = []
    for p in sorted(pools, key=lambda p: (p.unit_cost, p.name)):
        if groups and p.unit_cost <= groups[-1][0].unit_cost * (1 + tolerance) + 1e-12:
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def _fill(plan: Plan, pools: Sequence[PoolEstimate], jobs: int, horizon: float, budget: float,
          per_job: bool) -> tuple[int, float]:
    """Time optimization over `pools`: each wave of jobs to the pool where it completes first, if it completes
    within `horizon` and the budget pays for it (`per_job`: only if the pool's cost per job is within the
    budget left per job still to plan). Returns the jobs and budget left."""
    cheapest = min((p.cost for p in pools), default=0.0)
    allowed = [p for p in pools if not per_job or p.cost <= max(budget / max(1, jobs), cheapest) + 1e-12]
    done = _waves_before(plan, allowed, jobs, horizon, budget)
    for p in allowed:
        jobs -= done.get(p.name, 0) * p.slots
        budget -= done.get(p.name, 0) * p.slots * p.cost
    heap = []
    for i, p in enumerate(pools):
        assert p.seconds is not None
        heap.append((p.busy_until + (done.get(p.name, 0) + 1) * p.seconds, p.seconds, i))
    heapq.heapify(heap)
    skipped: set[int] = set()
    while jobs > 0 and heap:
        t, seconds, i = heapq.heappop(heap)
        if t > horizon + 1e-9:
            break
        p = pools[i]
        if per_job and p.cost > max(budget / jobs, cheapest) + 1e-12:
            # too dear for the budget per job left now; as cheaper waves are planned that share may grow, so
            # the pool stays for its next wave (when the budget cannot pay every job even at the cheapest,
            # the cheapest pools go on), until every pool left was passed over in a row
            skipped.add(i)
            if len(skipped) == len(heap) + 1:
                break
            heapq.heappush(heap, (t + seconds, seconds, i))
            continue
        skipped.clear()
        # the waves this pool completes before any other pool's next one: taken at once, so a plan costs one
        # step per change of pool, not one per wave (a million jobs on a few slots would be 10^5 steps); the
        # budget per job left only grows while a pool within it is planned, so the batch keeps the rule
        waves = 1 + (math.floor((heap[0][0] - t) / seconds + 1e-9) if heap else math.ceil(jobs / p.slots))
        if horizon < math.inf:
            waves = min(waves, 1 + math.floor((horizon - t) / seconds + 1e-9))
        m = int(min(max(1, waves) * p.slots, jobs, _affordable(budget, p.cost)))
        if m <= 0:
            continue
        last = t + (math.ceil(m / p.slots) - 1) * seconds
        plan.assigned[p.name] = plan.assigned.get(p.name, 0) + m
        plan.finish[p.name] = last
        plan.cost += m * p.cost
        budget -= m * p.cost
        jobs -= m
        heapq.heappush(heap, (last + seconds, seconds, i))
    return jobs, budget


def _waves_before(plan: Plan, pools: Sequence[PoolEstimate], jobs: int, horizon: float,
                  budget: float) -> dict[str, int]:
    """The waves the greedy of `_fill` would plan first, found at once: every wave that completes before T*,
    the first time by which the pools' waves would hold all the jobs or cost all the budget (or the horizon).
    They are planned (into `plan`) and counted per pool; what is left is less than a wave per pool, which
    `_fill` plans wave by wave. Without it a million jobs on pools of different speeds took a second."""
    if not pools or jobs <= 0:
        return {}
    slots = sum(p.slots for p in pools)
    if jobs < 64 * slots:
        return {}  # (few waves: the greedy alone is as quick)

    def waves(p: PoolEstimate, t: float) -> int:
        assert p.seconds is not None
        return max(0, math.floor((t - p.busy_until) / p.seconds + 1e-9))

    def enough(t: float) -> bool:
        n = sum(waves(p, t) * p.slots for p in pools)
        return n >= jobs or sum(waves(p, t) * p.slots * p.cost for p in pools) >= budget

    longest = max(p.seconds or 0.0 for p in pools)
    hi = min(horizon, max(p.busy_until for p in pools) + (math.ceil(jobs / slots) + 1) * longest)
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    out = {}
    for p in pools:
        assert p.seconds is not None
        w = waves(p, lo)  # (lo: not enough yet, so within both the jobs and the budget)
        if w > 0:
            out[p.name] = w
            plan.assigned[p.name] = plan.assigned.get(p.name, 0) + w * p.slots
            plan.finish[p.name] = p.busy_until + w * p.seconds
            plan.cost += w * p.slots * p.cost
    return out


class DbcPlacement(Placement):
    """Deadline- and budget-constrained placement: the base of the four optimizations (`strategy`)."""

    name: ClassVar[str] = ""
    strategy: ClassVar[str] = ""
    host_dependent = True
    counts_money = True
    options: ClassVar[Mapping[str, StrategyOption]] = {
        "runtime": 0.0,
        "replan": 5.0,
        "window": 50,
        "cost_tolerance": 0.01,
        "finish_late": False,
        "pickup": 300.0,
    }
    """runtime: seconds a job takes on a pool of speed 1, before any is measured (0: unknown, probe first);
    replan: seconds between plans at most; window: good results per pool its rate is measured over;
    cost_tolerance: relative difference of cost within which pools form one group (cost-time);
    finish_late: once the deadline passed, go on with the jobs left (else nothing more is started, as the
    paper's scheduler stops, and the bag says so); pickup: seconds a pool may leave planned work waiting for
    slots it does not have up before the plan counts only the slots it has (a pool slow to start pilots)."""

    @classmethod
    def validate(cls, options: Mapping[str, StrategyOption]) -> None:
        for key, low in (("runtime", 0.0), ("replan", 0.0), ("cost_tolerance", 0.0), ("pickup", 0.0)):
            v = options.get(key)
            if isinstance(v, int | float) and not (low <= v < math.inf):
                raise StrategyError(f"strategy option '{key}' must be a finite number >= {low:g}, not {v!r}")
        w = options.get("window")
        if isinstance(w, int) and not 1 <= w <= 10_000:
            raise StrategyError(f"strategy option 'window' must be from 1 to 10000 results, not {w}")

    def __init__(self, bag_id: int, seed: int, options: Mapping[str, StrategyOption]) -> None:
        super().__init__(bag_id, seed, options)
        self.planned_at = -math.inf
        self.plan = Plan()
        self.pools: dict[str, PoolEstimate] = {}
        self.at_plan: dict[str, tuple[int, int]] = {}
        """Per pool, the bag's (sent, running) there when it was planned."""
        self.spent = 0.0
        self.committed = 0.0
        self.probing = False
        self.report: QosReport | None = None
        self._running: dict[str, list[tuple[float, str]]] = {}
        self.paid_hosts: set[str] = set()
        """Pilot-hour hosts the bag ran on at the plan (their period in progress is in `committed`)."""
        self.touched: dict[str, float] = {}
        """Pilot-hour hosts first given an instance of the bag since the plan, and the period reserved for each."""
        self.waiting_since: dict[str, float] = {}
        """Per pool, since when work planned there waits for slots it does not have up (`_available`)."""

    # -- the seam ---------------------------------------------------------------------------------

    def rank(self, view: DispatchView, bag: BagView, host: HostView, rank: float, now: float) -> float | None:
        self._maybe_plan(view, bag, now)
        return rank if self._room(bag, host.pool, now) > 0 else None

    def limit(self, view: DispatchView, bag: BagView, host: HostView, now: float) -> int | None:
        self._maybe_plan(view, bag, now)
        room = self._room(bag, host.pool, now)
        p = self.pools.get(host.pool)
        if room > 0 and p is not None and p.prices.per_pilot_hour > 0 and bag.spec.budget is not None \
                and host.host_id not in self.paid_hosts and host.host_id not in self.touched:
            # a pilot-hour host the bag has not run on since the plan: its period in progress is the bag's to
            # pay (all of it, until others share it), so the budget must hold it before the first instance
            period = p.prices.period / 3600.0 * p.prices.per_pilot_hour
            if self._budget_left(bag) - period < p.reserve:
                return 0
            self.touched[host.host_id] = period
        return room

    def pilots(self, view: DispatchView, bag: BagView, pools: Sequence[str], now: float) -> Mapping[str, int] | None:
        self._maybe_plan(view, bag, now)
        left = self._budget_left(bag)
        wanted: dict[str, int] = {}
        for name in pools:
            room = self._room(bag, name, now)
            p = self.pools.get(name)
            if room <= 0 or p is None:
                continue
            per_pilot = p.prices.period / 3600.0 * p.prices.per_pilot_hour
            if per_pilot > 0 and not math.isinf(left):
                # slots beyond the pool's running pilots need new pilots, each paid a period up front
                room = min(room, max(0, math.floor(left / per_pilot)) * p.cpus)
                left -= math.ceil(room / p.cpus) * per_pilot
            if room > 0:
                wanted[name] = room
        return wanted

    def migrate(self, view: DispatchView, bag: BagView, now: float) -> Sequence[Migration]:
        self._maybe_plan(view, bag, now)
        return ()

    def notes(self, view: DispatchView, bag: BagView, now: float) -> list[str]:
        report = self.report
        if report is None:
            return []
        out = []
        spec = bag.spec
        fix = f"raise them with `gridbot qos {spec.name} --deadline ... --budget ...`"
        if report.deadline_at is not None and now >= report.deadline_at and bag.queued and not self.settings[
                "finish_late"]:
            out.append(f"the bag's deadline passed with {bag.queued:,} jobs not started: nothing more is started "
                       f"({fix}, or set the strategy option finish_late = true)")
        elif report.budget is not None and bag.queued and self._broke(bag):
            out.append(f"the budget is spent ({report.spent:,.2f} spent, {report.committed:,.2f} committed, of "
                       f"{report.budget:,.2f}; what is left pays for no job on any pool): nothing more is started; "
                       f"{fix}")
        elif report.unplanned:
            finish = _when(report.projected_finish, now)
            why = " and ".join(w for w, given in (("finish by the deadline", report.deadline_at is not None),
                                                  ("be paid within the budget", report.budget is not None)) if given)
            why = why or "be placed (the bag has neither a deadline nor a budget for its placement to keep)"
            out.append(f"{report.unplanned:,} of the {bag.queued:,} jobs not started cannot {why} ({report.strategy}:"
                       f" projected {finish}, cost {report.projected_cost:,.2f}"
                       f"{'' if report.budget is None else f' of {report.budget:,.2f}'}); {fix}")
        if self.probing:
            out.append("no job has ended yet on any pool the bag may use: it probes with one instance per pool of "
                       "the cheapest group until one does (give the strategy option runtime to plan from the start)")
        return out

    def qos(self, view: DispatchView, bag: BagView, now: float) -> QosReport | None:
        """The last plan's report: looking does not plan (the simulator samples it, and what it samples must
        not change what is decided)."""
        return self.report

    # -- the plan ---------------------------------------------------------------------------------

    def _maybe_plan(self, view: DispatchView, bag: BagView, now: float) -> None:
        if now - self.planned_at >= self.number("replan") or now < self.planned_at:
            self.replan(view, bag, now)

    def replan(self, view: DispatchView, bag: BagView, now: float) -> None:
        """Figure 2's step 4: measure, sort, group, plan every job not started."""
        self.planned_at = now
        spec = bag.spec
        deadline = spec.deadline_at(bag.created_at)
        horizon = math.inf if deadline is None else deadline - now
        pools = self._estimates(view, bag, now)
        self.pools = {p.name: p for p in pools}
        self.touched = {}
        running = self._running
        self.paid_hosts = {h for p in pools if p.prices.per_pilot_hour > 0 for _, h in running.get(p.name, ())}
        self.at_plan = {p.name: bag.on_pool(p.name) for p in pools}
        self.spent = view.bill(bag.bag_id).total
        self.committed = sum(p.reserved for p in pools)
        budget = math.inf if spec.budget is None else spec.budget - self.spent - self.committed
        jobs = bag.queued + bag.waiting_replicas
        known = [p for p in pools if p.seconds is not None]
        self.probing = not known and jobs > 0
        late = horizon <= 0 and not self.settings["finish_late"]
        if late:
            self.plan = Plan(unplanned=jobs)
        elif self.probing:
            self.plan = self._probe(pools, jobs, budget)
        else:
            self.plan = plan_jobs(self.strategy, known, jobs, horizon if not self.settings["finish_late"] or horizon
                                  > 0 else math.inf, budget, self.number("cost_tolerance"))
        finish = max(self.plan.finish.values(), default=None)
        running_end = max((p.busy_until for p in known if p.running), default=None)
        ends = [t for t in (finish, running_end) if t is not None]
        self.report = QosReport(
            self.name, deadline, spec.budget, self.spent, self.committed,
            self.spent + self.committed + self.plan.cost, now + max(ends) if ends and not self.probing else None,
            dict(self.plan.assigned), self.plan.unplanned,
            {p.name: p.seconds for p in pools if p.seconds is not None},
            {p.name: p.cost for p in pools if p.seconds is not None}, now)

    def _probe(self, pools: Sequence[PoolEstimate], jobs: int, budget: float) -> Plan:
        plan = Plan()
        groups = _groups([p for p in pools if p.slots > 0], self.number("cost_tolerance"))
        if groups and (budget > 0 or groups[0][0].unit_cost == 0):  # a budget of 0 probes the free pools
            for p in groups[0]:
                if jobs > 0 and p.running == 0:
                    plan.assigned[p.name] = 1
                    jobs -= 1
        plan.unplanned = jobs
        return plan

    def _delay(self, pool: str, slots: int, live: int, running: int, now: float) -> float:
        """Seconds the plan expects the pool to take yet before its slots take work: none, until it has left
        work planned on it waiting for slots it does not have up for `pickup` seconds; then as long again as it
        has made the bag wait (Nimrod-G's measured available share: a pool slow to start its pilots is
        expected to stay slow, so a tight deadline moves its jobs elsewhere and a relaxed one waits for it)."""
        planned = self.plan.assigned.get(pool, 0)
        since = self.waiting_since.get(pool)
        if live >= min(slots, running + max(planned, 1)):
            self.waiting_since.pop(pool, None)  # (it came up)
            return 0.0
        if since is None:
            if planned <= 0:
                return 0.0
            since = self.waiting_since[pool] = now
        # (a pool found slow stays so until it comes up: else the next plan, seeing nothing planned there,
        # would expect all of it at once again)
        waited = now - since
        return waited if waited >= self.number("pickup") else 0.0

    def _estimates(self, view: DispatchView, bag: BagView, now: float) -> list[PoolEstimate]:
        """Figure 2's step 4(a): each usable pool's seconds per job, measured or extrapolated."""
        live = view.pools(now)
        names = [n for n in view.pool_names() if view.accepts_pool(bag.bag_id, n)]
        names += [n for n, p in live.items() if p.hosts and view.pool_ad(n) is None and n not in names]
        window = int(self.number("window"))
        samples: dict[str, list[float]] = {}
        for e in bag.recent(window * max(1, len(names)) * 4):
            if e.success and e.ended_at is not None:
                got = samples.setdefault(e.pool, [])
                if len(got) < window:
                    got.append(e.ended_at - e.sent_at)
        running = self._running = view.running_by_pool(bag.bag_id)
        out = []
        for name in names:
            ad = view.pool_ad(name)
            pv = live.get(name)
            cpus = max(1, int(ad_number(ad, "Cpus", 1)))
            slots = int(ad_number(ad, "MaxRunning", 0)) * cpus if ad is not None else 0
            slots = max(slots, pv.slots if pv is not None else 0)
            delay = self._delay(name, slots, pv.slots if pv is not None else 0, len(running.get(name, ())), now)
            speed = ad_number(ad, "Speed", 1.0)
            speed = speed if speed > 0 else 1.0
            durations = samples.get(name)
            seconds = max(MIN_SECONDS, sum(durations) / len(durations)) if durations else None
            out.append(PoolEstimate(name, view.prices(name), slots, speed, seconds, seconds is not None,
                                    len(running.get(name, ())), cpus=cpus,
                                    seconds_max=max(MIN_SECONDS, *durations) if durations else None, delay=delay))
        measured = [p for p in out if p.measured]
        for p in out:
            if p.seconds is not None:
                continue
            if measured:
                ratios = sorted((q.seconds * q.speed / p.speed, (q.seconds_max or 0.0) * q.speed / p.speed)
                                for q in measured if q.seconds is not None)
                p.seconds, p.seconds_max = ratios[len(ratios) // 2]
            elif self.number("runtime") > 0:  # the owner's figure: trusted as it is
                p.seconds = p.seconds_max = max(MIN_SECONDS, self.number("runtime") / p.speed)
            elif (pv := live.get(p.name)) is not None and pv.mean_turnaround > 0:
                p.seconds = max(MIN_SECONDS, pv.mean_turnaround)
                p.seconds_max = p.seconds * UNMEASURED_MARGIN
        for p in out:
            runs = running.get(p.name, ())
            if p.seconds is not None and runs:
                left = sum(max(p.seconds - (now - sent), 0.1 * p.seconds) for sent, _ in runs)
                p.busy_until = left / max(1, p.slots)
            p.busy_until += p.delay
            if runs:
                longest = p.seconds_max or 0.0
                p.reserved = sum(max(longest, RUN_MARGIN * (now - sent)) for sent, _ in runs) / 3600.0 * p._hourly
                if p.prices.per_pilot_hour > 0:
                    hosts = len({host for _, host in runs})
                    p.reserved += hosts * p.prices.period / 3600.0 * p.prices.per_pilot_hour
        return out

    # -- step 5 -----------------------------------------------------------------------------------

    def _budget_left(self, bag: BagView) -> float:
        """The budget less what is spent, what the instances running at the plan are reserved at, and every
        instance sent since (at its pool's reserve)."""
        budget = bag.spec.budget
        if budget is None:
            return math.inf
        used = self.spent + self.committed + sum(self.touched.values())
        for name, (sent0, _) in self.at_plan.items():
            p = self.pools[name]
            used += max(0, bag.on_pool(name)[0] - sent0) * p.reserve
        return budget - used

    def _broke(self, bag: BagView) -> bool:
        """Whether the budget left pays for no job on any pool whose cost is known (a budget of 0 pays for
        jobs on free pools: it means free resources only)."""
        costs = [p.reserve for p in self.pools.values() if p.seconds is not None and p.slots > 0]
        left = self._budget_left(bag)
        free = any(p.unit_cost == 0 and p.slots > 0 for p in self.pools.values())  # (probed while none is known)
        return left < 0 or (bool(costs) and left < min(costs)) or (not costs and left <= 0 and not free)

    def _room(self, bag: BagView, pool: str, now: float) -> int:
        """How many more instances the bag may start on the pool now."""
        p = self.pools.get(pool)
        planned = self.plan.assigned.get(pool, 0)
        if p is None or planned <= 0:
            return 0
        sent0, _ = self.at_plan.get(pool, (0, 0))
        sent, running = bag.on_pool(pool)
        room = min(planned - max(0, sent - sent0), p.slots - running)
        if room <= 0:
            return 0
        left = self._budget_left(bag)
        if left < 0 or (left == 0 and p.reserve > 0):  # a free pool's jobs cost nothing: a budget of 0 pays them
            return 0
        if p.reserve > 0:
            room = min(room, int(_affordable(left, p.reserve)))
        return max(0, room)


def _when(t: float | None, now: float) -> str:
    if t is None:
        return "completion unknown"
    return f"completion in {(t - now) / 60:,.1f} min"


class CostPlacement(DbcPlacement):
    """DBC cost optimization: the cheapest pools first, each with what it can finish by the deadline."""

    name = COST
    strategy = COST


class TimePlacement(DbcPlacement):
    """DBC time optimization: each job where it completes first, while the budget pays."""

    name = TIME
    strategy = TIME


class CostTimePlacement(DbcPlacement):
    """DBC cost-time optimization (the paper's): time optimization within each group of equally cheap pools."""

    name = COST_TIME
    strategy = COST_TIME


class ConservativeTimePlacement(DbcPlacement):
    """DBC conservative-time optimization: time optimization keeping the budget per job still to plan."""

    name = CONSERVATIVE
    strategy = CONSERVATIVE


PLACEMENTS: tuple[type[DbcPlacement], ...] = (CostPlacement, TimePlacement, CostTimePlacement,
                                              ConservativeTimePlacement)

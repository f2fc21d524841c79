"""`tail = "expert"`: ExPERT chooses the bag's tail strategy at T_tail and gridbot applies it.

The tail begins when none of the bag's jobs is queued (ExPERT's T_tail: every task sent once), and
stays begun. Then `planner.plan` characterizes the pools from the bag's own instances, estimates the
sampled NTDMr strategies and picks the best on the frontier for the bag's `utility`; it plans again when
the bag's instances have grown by `replan_growth` and `replan_after` seconds have passed. Each estimate
runs on the server's event loop: `planner.BUDGET` keeps it near half a second, and the chosen strategy's
range (`planner.spread_range`, 3,000 more draws of it alone) adds 0.2 to 0.35 s.

The chosen (N, T, D, Mr) is applied as section 3 and the estimator (`estimate.py`) have it, per task:
- a task gets another instance once T seconds have passed since its last instance was sent, with no
  result, and none of its instances waits to be sent (decided on the server's tick nearest to that time);
- instances 1..N counted from T_tail (the throughput phase's are not counted) go to the unreliable
  pools, each with instance deadline D; instance N+1 goes to the reliable pools, and then the task
  waits for it (the reliable pools never fail in the model; their instances keep the policies' deadline);
- the reliable pools serve at most Mr x #ur instances at once, first come first served: a task due for
  the reliable pool waits here, in the order its timer ran out, until one of those machines is free;
- the overlay is asked for Mr x #ur slots on the reliable pools (`pilots`) while a task is on, or due for,
  the reliable pools; otherwise for none, so that no reliable host idles in the tail and takes the jobs
  the core queues again (see below).

Which pools are reliable: the server's `--reliable-pool`s (DispatchConfig.reliable_pools, the paper's
fail-over pools, Host.Reliable) when it names any, else the pools whose ad says Reliability "reliable"
(the pools file's `reliability`; a simulated cluster or cloud). Every other pool is unreliable.

Where gridbot differs from the model: a host that reports a failure, or goes silent past the host
timeout, makes its instance end before D, and a job left with no instance is queued again by the core,
which sends it on as soon as a host asks rather than T after its last instance; this strategy routes such
a job to where its next instance belongs (the unreliable pools until N, then the reliable ones). The
paper lists the same difference (section 6.3, cause 3).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np

from gridbot.core.records import Ended
from gridbot.core.strategy import Choice, TailPlan
from gridbot.core.view import BagView, DispatchView, HostView, JobView
from gridbot.model.spec import StrategyOption
from gridbot.model.states import BagState, JobState
from gridbot.schedulers.base import StrategyError, TailStrategy
from gridbot.schedulers.expert.characterize import CharacterizationError, InstanceRecord
from gridbot.schedulers.expert.frontier import FINITE_FIX, ExpressionError, utility
from gridbot.schedulers.expert.planner import Observed, Planning, PoolFacts, Settings, parse_pin, plan, pool_price
from gridbot.schedulers.expert.strategy import NTDMr, StrategyValueError

HOLD = frozenset({"(ExPERT: waiting for a reliable machine)"})
"""Where a re-queued task due on the reliable pools waits while its Mr x #ur machines are all in use: a pool
no host has (a pool name cannot hold spaces), so the core sends it nowhere until it is routed again."""
MAX_TICK = 120.0
"""Longer gaps between ticks are not taken for the tick's interval (a server that was away)."""
SERVER_TICK = 1.0
"""The server's tick (`gridbot server`'s timers are looked at every second), taken for the tick's interval at
the first plan, before `replicas` was called twice."""
MAX_LAGS = 1000
"""Dispatch lags kept per kind of pool (the newest)."""


MAX_PIN_N = 100
"""Most unreliable instances per task a pinned strategy may ask for."""
MAX_PIN_VALUE = 1e7
"""Largest T or D a pinned strategy may give (seconds, or units of T_ur)."""
MAX_PIN_MR = 10.0
"""Largest Mr (reliable machines per unreliable one) a bag may ask for: the estimate's size grows with it."""


class ExpertTail(TailStrategy):
    """ExPERT's NTDMr tail, chosen from the Pareto frontier by the bag's utility."""

    name = "expert"
    sets_deadline = True
    options: ClassVar[Mapping[str, StrategyOption]] = {
        "utility": "product",
        "mr_max": 0.1,
        "repetitions": 10,
        "price_unreliable": -1.0,
        "price_reliable": -1.0,
        "charging_period": -1.0,
        "min_results": 10,
        "replan_growth": 0.25,
        "replan_after": 60.0,
        "pin": "",
        "reliable_runtime": -1.0,
    }
    """utility: makespan, cost, product, deadline:SECONDS, budget:AMOUNT or an expression over Makespan and
    Cost; mr_max: most reliable machines per unreliable one; repetitions of the estimate; prices per CPU
    hour and the reliable charging period in seconds (-1: the pools file's, else the paper's); min_results:
    good results below which the pools are characterized offline; re-plan when the bag's instances grew
    by replan_growth and replan_after seconds passed; pin: apply this strategy ("N=3 T=1Tur D=2Tur Mr=0.1");
    reliable_runtime: T_r, seconds a task takes on the reliable pools (-1: the reliable results seen, else T_ur)."""

    @classmethod
    def validate(cls, options: Mapping[str, StrategyOption]) -> None:
        try:
            utility(str(options.get("utility", "product")))
            if options.get("pin"):
                pin = parse_pin(str(options["pin"]), 1.0)
                if not (pin.n is None or 0 <= pin.n <= MAX_PIN_N) or not all(
                        math.isfinite(v) and 0 <= v <= MAX_PIN_VALUE for v in (pin.t, pin.d)) or not (
                        math.isfinite(pin.mr) and 0 <= pin.mr <= MAX_PIN_MR):
                    raise StrategyValueError(f"pin {options['pin']!r}: N from 0 to {MAX_PIN_N} (or inf), T and D "
                                             f"from 0 to {MAX_PIN_VALUE:g}, Mr from 0 to {MAX_PIN_MR:g}")
        except (ExpressionError, StrategyValueError) as e:
            raise StrategyError(f"tail = 'expert': {e}") from None
        for key, low, high in (("mr_max", 0.0, MAX_PIN_MR), ("repetitions", 1, 1000), ("min_results", 1, 1e9),
                               ("replan_growth", 0.0, 1e6), ("replan_after", 0.0, 1e9),
                               ("reliable_runtime", -1.0, MAX_PIN_VALUE)):
            value = options.get(key, cls.options[key])
            if isinstance(value, int | float) and not (math.isfinite(value) and low <= value <= high
                                                       and (key != "mr_max" or value > 0)):
                raise StrategyError(f"tail = 'expert': option {key} must be a number from {low:g} to {high:g}"
                                    f"{' (above 0)' if key == 'mr_max' else ''}, not {value!r}")
        for key in ("price_unreliable", "price_reliable", "charging_period"):  # -1: the pools file's
            value = options.get(key, cls.options[key])
            if isinstance(value, int | float) and value != -1 and not (
                    math.isfinite(value) and 0 <= value <= MAX_PIN_VALUE and (key != "charging_period" or value > 0)):
                raise StrategyError(f"tail = 'expert': option {key} must be -1 (the pools file's) or a number from "
                                    f"0 to {MAX_PIN_VALUE:g}{' (above 0)' if key == 'charging_period' else ''}, "
                                    f"not {value!r}")

    def __init__(self, bag_id: int, seed: int, options: Mapping[str, StrategyOption]) -> None:
        super().__init__(bag_id, seed, options)
        self.tail_start: float | None = None
        self.done_at_start = 0
        self.tasks = 0
        self.planning: Planning | None = None
        self.strategy: NTDMr | None = None
        self.plans = 0
        self.planned_at = 0.0
        self.instances_at_plan = 0
        self.spent_at_plan = 0.0
        self.throughput_deadline = 0.0
        self.why_not = ""
        """Why the tail is not planned yet (nothing returned, say)."""
        self.reliable: frozenset[str] = frozenset()
        self.seen: set[int] = set()
        self.seen_up_to = 0
        self.last: dict[int, float] = {}
        """Per task: when its last instance was sent."""
        self.unreliable_sent: dict[int, int] = {}
        """Per task: instances sent to the unreliable pools since T_tail (the model's N counts these)."""
        self.reliable_sent: set[int] = set()
        self.reliable_count: dict[int, int] = {}
        self.attempts: dict[int, int] = {}
        """Per tail task: its instances sent before T_tail (the job's attempts then). Those sent since, less
        the reliable ones, are its unreliable instances, even one that failed between two looks."""
        self.to_reliable: set[int] = set()
        """Tasks chosen for the reliable pool whose instance was not sent yet."""
        self.routed: set[int] = set()
        """Tasks queued again and routed to the reliable pools, not sent yet: each holds one of the Mr x #ur
        reliable machines, as a replica chosen for them does."""
        self.held: set[int] = set()
        """Tasks queued again that wait, routed to `HOLD`: for T to pass since their last instance, or, due on the
        reliable pools, for one of their Mr x #ur machines."""
        self.last_now = 0.0
        self.tick = 0.0
        """Seconds between the calls of `replicas` when they come regularly (the server's tick), else 0: a
        timer that runs out within half a tick (at most T / 10) is taken now, so replicas are not late by
        half a tick on average."""
        self.gap = 0.0
        self.timer_end: dict[int, tuple[float, int]] = {}
        """Per task chosen for its next instance because its timer ran out: when it ran out, and the job's attempts
        then (an instance sent and ended between two looks is never seen: the entry is then dropped)."""
        self.idle = 0
        """Idle unreliable slots at the last look, less those the choices since are expected to take."""
        self.lags: tuple[list[float], list[float], list[float]] = ([], [], [])
        """Seconds from a timer running out to its instance being sent: on the unreliable pools, on the reliable
        pools to a host that was up, and to one that came after the timer ran out (a pilot's start)."""
        self.unmeasured: set[int] = set()
        """Tasks whose next instance waited for a machine after its timer ran out: its lag is not measured."""
        self.needs_reliable = 0
        """Tasks on, chosen for, or due for the reliable pools at the last look (`pilots` asks for Mr x #ur
        reliable slots only while there is one)."""

    # -- the tail and its plan ------------------------------------------------------------------------

    def in_tail(self, view: DispatchView, bag: BagView, now: float) -> bool:
        if self.tail_start is None and bag.queued == 0 and bag.running > 0:
            self.tail_start = now
            self.done_at_start = bag.counts.done
            self.tasks = bag.running
            for job in view.running_jobs(bag.bag_id):  # the throughput phase's: not counted against N
                self.attempts[job.job_id] = job.attempts
                self.seen.update(i.instance_id for i in view.instances(job.job_id))
                self.last[job.job_id] = max(i.sent_at for i in view.instances(job.job_id))
            self.plan(view, bag, now)
        return self.tail_start is not None

    def planner_settings(self) -> Settings:
        """The options as the planner takes them (a negative price: the pools file's)."""
        def given(key: str) -> float | None:
            value = self.number(key)
            return None if value < 0 else value

        return Settings(str(self.settings["utility"]), self.number("mr_max"), int(self.number("repetitions")),
                        given("price_unreliable"), given("price_reliable"), given("charging_period"),
                        int(self.number("min_results")), self.seed + self.plans, str(self.settings["pin"]),
                        given("reliable_runtime") or None)

    def plan(self, view: DispatchView, bag: BagView, now: float) -> None:
        """Plan the tail at its start, and again when the statistics changed enough."""
        if self.tail_start is None:
            return
        instances = bag.counts.instances
        if self.planning is not None and not (
                instances >= self.instances_at_plan * (1.0 + self.number("replan_growth"))
                and now - self.planned_at >= self.number("replan_after")):
            return
        self.reliable = reliable_pools(view)
        self.track(view, bag, now)
        observed = self.observe(view, bag, now)
        try:
            planning = plan(observed, self.planner_settings())
        except CharacterizationError as e:
            self.why_not = str(e)
            return
        self.planning, self.planned_at, self.instances_at_plan = planning, now, instances
        self.spent_at_plan = self.spent(bag.history, planning)
        self.strategy = planning.strategy
        self.plans += 1

    def notes(self, view: DispatchView, bag: BagView, now: float) -> list[str]:
        """Why the tail sends no replicas although it began: not planned yet (no result to characterize the
        pools with; said while the bag runs only, as a bag may end before its next tick plans), or its last
        plan chose no strategy (the utility is no number anywhere, no strategy keeps to its deadline or
        budget, or none ends its tail), with what to do: on the running bag, or for a next run once it ended
        (`gridbot plan` characterizes running bags only)."""
        if self.tail_start is None:
            return []
        planning, name, active = self.planning, bag.spec.name, bag.state is BagState.ACTIVE
        if planning is None:
            return [f"ExPERT has not planned the tail yet: {self.why_not}; until it does, no replica is sent"
                    ] if self.why_not and active else []
        if planning.chosen is not None:
            return []
        if not planning.distinct_frontier():
            fix = ""
        elif not planning.utility.bounded:
            fix = f"; {FINITE_FIX}" + (f", with `gridbot plan {name} --utility ... --apply`" if active else "")
        elif active:
            fix = (f"; `gridbot plan {name}` shows the frontier, and `gridbot plan {name} --deadline ... --apply` "
                   "(or --budget) sets a looser bound")
        else:
            fix = (f"; a next run can be planned from this bag's instances with `gridbot plan --scenario FILE "
                   f"--from-bag {name} --deadline ...` (or --budget)")
        after = "until a later plan does, no replica is sent" if active else "no replica was sent after it"
        return [f"ExPERT's last plan chose no strategy: {planning.unchosen()}; {after}{fix}"]

    def observe(self, view: DispatchView, bag: BagView, now: float) -> Observed:
        observed = observe(view, bag, now, self.reliable, self.tail_start, self.throughput_deadline)
        self.throughput_deadline = observed.throughput_deadline
        return dataclasses.replace(observed, tick=self.tick or SERVER_TICK, dispatch_lags=tuple(self.lags[0]),
                                   reliable_lags=tuple(self.lags[1]), startup_lags=tuple(self.lags[2]))

    # -- what the core asks ---------------------------------------------------------------------------

    def replicas(self, view: DispatchView, bag: BagView, room: int, now: float) -> Sequence[Choice]:
        gap = now - self.last_now
        self.tick = gap if 0.0 < gap < MAX_TICK and abs(gap - self.gap) <= 0.1 * gap else 0.0
        self.last_now, self.gap = now, gap
        self.plan(view, bag, now)
        s, planning = self.strategy, self.planning
        if s is None or planning is None or self.tail_start is None:
            return ()
        self.track(view, bag, now)
        desc = planning.describe(s)
        limit = math.inf if s.n is None else s.n
        seen = view.pools(now)
        unreliable = frozenset(n for n in (*view.pool_names(), *seen) if n not in self.reliable)
        self.idle = sum(max(0, p.slots - p.busy) for name, p in seen.items() if name in unreliable)
        out, due_reliable, routed = self.route(view, desc, unreliable, planning.utility.name)
        busy = 0
        for job in view.running_jobs(bag.bag_id):
            live = view.instances(job.job_id)
            busy += sum(1 for i in live if self._reliable_host(view, i.host_id))
            if job.replica_pending or job.job_id in self.reliable_sent or len(live) >= view.config.max_replicas:
                continue
            last = max(self.last.get(job.job_id, -math.inf), *(i.sent_at for i in live))
            if now + min(self.tick / 2.0, s.t / 10.0) < last + s.t:  # the tick nearest to the timer's end
                continue
            sent = self.unreliable_sent.get(job.job_id, 0)
            if sent < limit:
                if len(out) < room and unreliable:
                    self.timed(view, job.job_id, last + s.t)
                    out.append(Choice(job.job_id, f"ExPERT {desc}: no result {now - last:.0f} s after its last "
                                      f"instance was sent (T = {s.t:.0f} s): unreliable instance {sent + 1} of "
                                      f"N = {'inf' if s.n is None else s.n} since the tail began, deadline D = "
                                      f"{s.d:.0f} s ({planning.utility.name})", unreliable))
            elif job.pools is None or job.pools & self.reliable:
                due_reliable.append((last + s.t, job.job_id, sent, now - last, False))
            # (else the job was routed to the unreliable pools when it was queued again, and the core keeps a job
            # to the pools it was routed to, replicas too: its instance N+1 goes when it is queued again)
        machines = s.machines_applied(planning.unreliable)
        pending = sum(1 for j in self.to_reliable if _pending(view, j))
        used = busy + pending + routed
        free = machines - used
        self.needs_reliable = used + len(due_reliable)
        for end, job_id, sent, waited, queued in sorted(due_reliable):
            if queued and free > 0 and len(out) < room:
                free -= 1
                self.arm(view, job_id, end)
                self.routed.add(job_id)
                out.append(Choice(job_id, f"ExPERT {desc}: queued again after {sent} unreliable instance(s) since "
                                          f"the tail began: instance N+1 goes to the reliable pool ({used} of Mr x "
                                          f"#ur = {machines} reliable machines in use or promised; "
                                          f"{planning.utility.name})", self.reliable))
                used += 1
            elif queued:  # it waits for a reliable machine, first come first served, and goes nowhere else
                self.held.add(job_id)
                self.unmeasured.add(job_id)
                if len(out) < room:
                    out.append(Choice(job_id, f"ExPERT {desc}: queued again after {sent} unreliable instance(s) "
                                              f"since the tail began: instance N+1 waits for one of the Mr x #ur = "
                                              f"{machines} reliable machines, all in use or promised "
                                              f"({planning.utility.name})", HOLD))
            elif free > 0 and len(out) < room:
                free -= 1
                self.arm(view, job_id, end)
                self.to_reliable.add(job_id)
                out.append(Choice(job_id, f"ExPERT {desc}: {sent} unreliable instance(s) since the tail began and no "
                                          f"result {waited:.0f} s after the last (T = {s.t:.0f} s): instance N+1 goes "
                                          f"to the reliable pool ({used} of Mr x #ur = {machines} reliable machines "
                                          f"in use or promised; {planning.utility.name})", self.reliable))
                used += 1
            else:
                self.unmeasured.add(job_id)  # it waits for a reliable machine: the model's queue holds that wait
        return out

    def route(self, view: DispatchView, desc: str, unreliable: frozenset[str], why: str
              ) -> tuple[list[Choice], list[tuple[float, int, int, float, bool]], int]:
        """Tail tasks the core queued again (their instances lost or failed: it would send them on as soon as a
        host asks) wait until T has passed since their last instance was sent (the paper's T: the least time
        between two instances of a task), routed to `HOLD`; then they go where their next instance belongs: the
        unreliable pools until N (returned as choices), then the reliable ones. Those due for the reliable pools
        are returned to be served first come first served with the running tasks due there (by their timer's
        end), within Mr x #ur reliable machines: a job already routed there and not sent yet holds one of them
        (counted, third)."""
        s = self.strategy
        assert s is not None
        out = []
        due: list[tuple[float, int, int, float, bool]] = []
        routed = 0
        self.routed = {j for j in self.routed if (job := view.job(j)) is not None and job.state is JobState.QUEUED}
        self.held = set()
        now = self.last_now
        for job_id in sorted(self.last):
            job = view.job(job_id)
            if job is None or job.state is not JobState.QUEUED:
                continue
            sent = self.unreliable_sent.get(job_id, 0)
            last = self.last[job_id]
            if now + min(self.tick / 2.0, s.t / 10.0) < last + s.t:  # T is the least time between two instances
                self.held.add(job_id)
                out.append(Choice(job_id, f"ExPERT {desc}: queued again, its instances lost or failed {now - last:.0f} "
                                          f"s after its last instance was sent: the next waits until T = {s.t:.0f} "
                                          f"s have passed ({why})", HOLD))
            elif ((s.n is None or sent < s.n) and job_id not in self.reliable_sent) or not self.reliable:
                self.timed(view, job_id, last + s.t)
                out.append(Choice(job_id, f"ExPERT {desc}: queued again, its instances lost or failed: unreliable "
                                          f"instance {sent + 1} of N = {'inf' if s.n is None else s.n} since the "
                                          f"tail began ({why})", unreliable))
            elif job_id in self.routed and job.pools == self.reliable:
                routed += 1
            else:
                due.append((last + s.t, job_id, sent, now - last, True))
        return out, due, routed

    def timed(self, view: DispatchView, job_id: int, end: float) -> None:
        """Measure the lag of an unreliable instance chosen at its timer's `end` if an unreliable slot is idle to
        take it: one that waits for a machine waits in the model's queue too, and is no dispatch lag (nor is it
        once it found none: a task queued again is chosen on every look until a host takes it)."""
        if job_id in self.timer_end or job_id in self.unmeasured:
            return
        if self.idle > 0:
            self.idle -= 1
            self.timer_end[job_id] = (end, self._attempts(view, job_id))
        else:
            self.unmeasured.add(job_id)

    def arm(self, view: DispatchView, job_id: int, end: float) -> None:
        """Measure the lag of a reliable instance chosen at its timer's `end`, unless it waited for one of the
        Mr x #ur machines first (the model's reliable queue holds that wait)."""
        if job_id not in self.unmeasured:
            self.timer_end.setdefault(job_id, (end, self._attempts(view, job_id)))

    @staticmethod
    def _attempts(view: DispatchView, job_id: int) -> int:
        job = view.job(job_id)
        return job.attempts if job is not None else 0

    def deadline(self, view: DispatchView, bag: BagView, host: HostView, deadline: float, now: float) -> float:
        s = self.strategy
        if s is None or self.tail_start is None or host.pool in self.reliable or s.n == 0:
            return deadline
        return max(1.0, s.d)

    def pilots(self, view: DispatchView, bag: BagView, pools: Sequence[str], now: float) -> Mapping[str, int] | None:
        s, planning = self.strategy, self.planning
        if s is None or planning is None or self.tail_start is None:
            return None
        wanted: dict[str, int] = {}
        machines = s.machines_applied(planning.unreliable) if s.n is not None else 0
        if not self.needs_reliable:  # no reliable host idles in the tail to take the core's re-queued jobs
            machines = 0
        for name in [p for p in pools if p in self.reliable]:
            ad = view.pool_ad(name) or {}
            cap = _int(ad.get("MaxRunning")) * max(1, _int(ad.get("Cpus"))) or machines
            wanted[name] = min(machines, cap)
            machines -= wanted[name]
        others = [p for p in pools if p not in self.reliable]
        waiting = max(0, bag.queued - len(self.routed) - len(self.held)) + max(
            0, bag.waiting_replicas - sum(1 for j in self.to_reliable if _pending(view, j)))
        for i, name in enumerate(others):
            wanted[name] = waiting // len(others) + (1 if i < waiting % len(others) else 0)
        return wanted

    # -- bookkeeping ----------------------------------------------------------------------------------

    def track(self, view: DispatchView, bag: BagView, now: float) -> None:
        """Count each task's instances since T_tail per kind of pool, from those out now and those lost
        since the last look (an overdue instance still names its job)."""
        start = self.tail_start if self.tail_start is not None else now
        for job in view.running_jobs(bag.bag_id):
            for inst in view.instances(job.job_id):
                self._count(view, job.job_id, inst.instance_id, inst.host_id, inst.sent_at, start)
        if bag.counts.instances != self.seen_up_to:
            self.seen_up_to = bag.counts.instances
            for e in bag.history:
                if e.instance_id not in self.seen and e.sent_at >= start:
                    lost = view.instance(e.instance_id)
                    if lost is not None:
                        self._count(view, lost.job_id, e.instance_id, lost.host_id, e.sent_at, start)
        for job_id, (_, armed) in list(self.timer_end.items()):  # its instance came and went between two looks
            tracked = view.job(job_id)
            if tracked is None or tracked.attempts > armed:
                del self.timer_end[job_id]
                # (nor is the next measured: the task's last instance, unseen, is not its timer's start)
                if tracked is not None and tracked.state is not JobState.DONE:
                    self.unmeasured.add(job_id)
        for job_id, before in self.attempts.items():  # every instance sent, even one that ended between looks
            tracked = view.job(job_id)
            if tracked is not None:
                self.unreliable_sent[job_id] = max(self.unreliable_sent.get(job_id, 0), tracked.attempts - before
                                                   - self.reliable_count.get(job_id, 0))
        self.to_reliable = {j for j in self.to_reliable if j not in self.reliable_sent and _pending(view, j)}

    def _count(self, view: DispatchView, job_id: int, instance_id: int, host_id: str, sent_at: float,
               start: float) -> None:
        if instance_id in self.seen:
            return
        self.seen.add(instance_id)
        self.last[job_id] = max(self.last.get(job_id, -math.inf), sent_at)
        if sent_at < start:
            return
        armed = self.timer_end.pop(job_id, None)
        end = armed[0] if armed is not None else None
        self.unmeasured.discard(job_id)
        host = view.host(host_id)
        reliable = host is not None and host.pool in self.reliable
        if end is not None:  # (a timer that ran out before T_tail ran out at T_tail: the model's too)
            end = max(end, start)
            lag = sent_at - end
            if not reliable and lag > (self.tick or SERVER_TICK) + 2.0 * view.config.backoff_max:
                lags = None  # an idle host that lives asks within backoff_max: this one waited for a machine
            elif reliable and host is not None and host.first_seen > end:
                lags = self.lags[2]  # its host came after the timer ran out: it was started for it (or for another)
            else:
                lags = self.lags[1 if reliable else 0]
            if lags is not None:
                lags.append(lag)
                del lags[:-MAX_LAGS]
        if reliable:
            self.reliable_sent.add(job_id)
            self.reliable_count[job_id] = self.reliable_count.get(job_id, 0) + 1
        else:
            self.unreliable_sent[job_id] = self.unreliable_sent.get(job_id, 0) + 1

    def _reliable_host(self, view: DispatchView, host_id: str) -> bool:
        host = view.host(host_id)
        return host is not None and host.pool in self.reliable

    def spent(self, history: Sequence[Ended], planning: Planning) -> float:
        """What the results returned since T_tail cost, at the planning's prices (the estimator's)."""
        start = self.tail_start
        paid = [e for e in history if e.success and e.ended_at is not None and start is not None and e.ended_at > start]
        if not paid:
            return 0.0
        took = np.array([max(0.0, (e.ended_at or 0.0) - e.sent_at) for e in paid])
        reliable = np.array([e.pool in self.reliable for e in paid])
        prices = planning.prices
        return float(np.where(reliable, prices.reliable(took), prices.unreliable(took)).sum())

    def summary(self, bag: BagView) -> TailPlan | None:
        s, planning, start = self.strategy, self.planning, self.tail_start
        if s is None or planning is None or start is None:
            return None
        history = bag.history
        tasks = max(1, self.tasks)
        spent = self.spent(history, planning)
        makespan, cost = planning.prediction() if planning.chosen is not None else planning.point(0)
        makespan_sd, cost_sd = planning.error
        left = max(1, planning.observed.tasks)
        predicted_cost = (self.spent_at_plan + cost * left) / tasks
        ended = bag.counts.queued + bag.counts.running == 0
        finished = max((e.ended_at for e in history if e.success and e.ended_at is not None), default=None)
        actual = finished - start if ended and finished is not None else None
        frontier = [(planning.describe(planning.space[i]), *planning.point(i)) for i in planning.distinct_frontier()]
        makespan_range = cost_range = None
        if planning.ranges is not None:
            (m_lo, m_hi), (c_lo, c_hi) = planning.ranges
            makespan_range = (self.planned_at - start + m_lo, self.planned_at - start + m_hi)
            cost_range = ((self.spent_at_plan + c_lo * left) / tasks, (self.spent_at_plan + c_hi * left) / tasks)
        return TailPlan(planning.describe(s), planning.utility.name, start, self.planned_at, self.plans, self.tasks,
                        self.planned_at - start + makespan, predicted_cost, makespan_sd, cost_sd * left / tasks,
                        planning.source, frontier, bag.counts.done - self.done_at_start,
                        actual if actual is not None else max(0.0, self.last_now - start), spent / tasks, actual,
                        makespan_range, cost_range, planning.range_share)


def reliable_pools(view: DispatchView) -> frozenset[str]:
    """The server's `--reliable-pool`s, else the pools whose ad says Reliability "reliable"."""
    if view.config.reliable_pools:
        return frozenset(view.config.reliable_pools)
    return frozenset(name for name in view.pool_names()
                     if str((view.pool_ad(name) or {}).get("Reliability", "")).lower() == "reliable")


def observe(view: DispatchView, bag: BagView, now: float, reliable: frozenset[str], tail_start: float | None = None,
            throughput_deadline: float = 0.0) -> Observed:
    """What the planner needs from the view: the pools, the bag's instances, the tasks left. The throughput
    deadline is the median deadline of the instances sent before `tail_start` (or now) unless given."""
    pools = view.pools(now)
    facts = []
    for name in sorted({*view.pool_names(), *pools}):
        ad = view.pool_ad(name) or {}
        live = pools.get(name)
        capacity = _int(ad.get("MaxRunning")) * max(1, _int(ad.get("Cpus")))
        price, period = pool_price(_float(ad.get("PricePerCpuHour")), _float(ad.get("PricePerPilotHour")),
                                   max(1, _int(ad.get("Cpus"))), _float(ad.get("ChargingPeriod")))
        facts.append(PoolFacts(name, name in reliable, price, period, live.slots if live else 0, capacity,
                               _float(ad.get("Startup")) or 0.0))
    records = tuple(InstanceRecord(e.sent_at, e.ended_at, e.success, e.pool in reliable) for e in bag.history)
    out, ages, deadlines = [], [], []
    for job in view.running_jobs(bag.bag_id):
        newest = None
        for inst in view.instances(job.job_id):
            host = view.host(inst.host_id)
            on_reliable = host is not None and host.pool in reliable
            out.append(InstanceRecord(inst.sent_at, None, False, on_reliable))
            if not on_reliable:
                newest = inst.sent_at if newest is None else max(newest, inst.sent_at)
            if inst.sent_at < (tail_start if tail_start is not None else now) + 1e-9:
                deadlines.append(inst.deadline - inst.sent_at)
        if newest is not None:
            ages.append(now - newest)
    if not throughput_deadline:
        deadlines.sort()
        throughput_deadline = deadlines[len(deadlines) // 2] if deadlines else bag.spec.instance_deadline
    return Observed(now, records, tuple(out), tuple(ages), bag.running + bag.queued, tuple(facts),
                    throughput_deadline, bag.mean_run_time)


def _pending(view: DispatchView, job_id: int) -> bool:
    job: JobView | None = view.job(job_id)
    return job is not None and job.replica_pending


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and _number(value) else None


def _int(value: object) -> int:
    return int(value) if _number(value) else 0  # type: ignore[call-overload]

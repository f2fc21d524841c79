"""The grid execution hierarchy (Silberstein, Geiger, Schuster and Livny, HPDC'06): a stream of bags served
at the level that matches each bag's size, as a placement strategy (issue 17).

The pools are grouped into queues, and queues into levels (the pools file's `[queues.NAME]`: docs/
hierarchy.md); level 1 holds the small, responsive pools. A bag (the paper's "task") enters the top level
(or, when its owner gave its complexity, the first level whose limits fit it) and is run there, first come
first served with backfilling, holding at most N slots of the queue's pools. Its complexity is its work in
CPU-seconds of a speed-1 CPU: the owner's figure (`complexity`, an upper bound, for the remaining jobs in
proportion), refined by the bag's own measured run times once `min_results` of them are known.

The paper's two procedures run as written:
- ProcessNewTask (its Figure 1) when a bag arrives at a queue: *overload* (the queue's work Q already above
  C_q, or `max_bags` bags in it) moves it on without estimating; *complexity mismatch* (its complexity above
  C_e) moves it to the next level;
- EnforceQueueLimits (its Figure 2), on every tick, for each bag from the head of each queue: *overdue* (in
  the queue longer than Tq, or running in it longer than Te; not while it is the queue's only bag), *task
  potential overdue* (its remaining work cannot end within what is left of Te or Tq at the queue's
  optimistic speed), *queue potential overdue* (the work of the bags ahead plus its own exceeds C_q); the
  work of the bags kept is the queue's Q, and a bag that ends or moves takes its work off Q at once (the
  hierarchy steps only while one of its bags runs).
C = T x N x P x beta turns a time limit into work (Eq. 1): N the most slots one bag may hold in the queue, P
its machines' relative speed, beta the bag's CPU-bound fraction (option `beta`). A policy a queue does not
list is off. A bag moves one level down at a time (the paper's rule: an upper bound may be far too high);
overload first tries another queue of the same level (one with room whose complexity mismatch, if it has
that policy, would not send the bag straight back). At the lowest level a bag that violates a limit is
ended (`at_lowest = "terminate"`, its results kept) or left to run (`"run"`). Queues of one level share
load: a bag that has not started moves to a queue of its level where it would end sooner by a margin.

A migrated bag keeps every result (results are the checkpoint). Its running instances are preempted and
queued again for the new queue's pools, as the paper's master preempts its jobs (`preempt = false`, a
strategy option, lets them finish where they are instead).

All bags of a dispatcher share one `Hierarchy` (the registry's factory makes it from the queues); each bag's
placement is a view of it. The hierarchy steps once per tick; a restarted server takes the bags up again at
the top, where their measured complexity sends them down at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from gridbot.core.ledger import ad_number
from gridbot.core.strategy import LevelReport, Migration
from gridbot.core.view import BagView, DispatchView, HostView
from gridbot.model.hierarchy import QueueSpec
from gridbot.model.spec import StrategyOption
from gridbot.schedulers.base import Placement, StrategyError

MEASURE_RESULTS = 200
"""Results of each bag a queue's speed is measured from."""
SHARE_MARGIN = 0.75
"""Load sharing moves a bag only to a queue where it would end in less than this share of the time."""


@dataclass
class _Bag:
    """What the hierarchy knows of one bag."""

    bag_id: int
    queue: str = ""
    arrived: float = 0.0
    started: float | None = None
    sent_base: int = 0
    """Instances sent on the queue's pools when it arrived (more means it started there)."""
    given: float | None = None
    beta: float = 1.0
    min_results: int = 3
    complexity: float | None = None
    source: str = "unknown"
    migrations: list[tuple[float, str, str, str]] = field(default_factory=list)
    ended: str = ""
    moved_at: float | None = None
    """When it last moved (its placement then preempts its running instances)."""
    estimating: bool = False
    """Its estimator runs (a companion bag the server made): it waits, up to `estimate_share` of its queue's
    Te, for the upper bound (ProcessNewTask's step 2)."""
    estimate_share: float = 0.1
    counted: float = 0.0
    """Its work as its queue's load Q counts it, taken off when it leaves the queue."""


class Hierarchy:
    """The queues, the bags in each (FCFS), and each queue's work Q as of the last step."""

    def __init__(self, queues: Sequence[QueueSpec]) -> None:
        self.queues = sorted(queues, key=lambda q: (q.level, q.name))
        self.by_name = {q.name: q for q in self.queues}
        self.levels = sorted({q.level for q in self.queues})
        self.order: dict[str, list[int]] = {q.name: [] for q in self.queues}
        self.load: dict[str, float] = {q.name: 0.0 for q in self.queues}
        self.bags: dict[int, _Bag] = {}
        self.stepped_at: float | None = None
        self.now = 0.0
        """The time of the last step or admission (what a running instance's elapsed time is counted to)."""
        self.running: dict[int, dict[str, list[tuple[float, str]]]] = {}
        self.running_at: float | None = None
        """Every bag's running instances per pool, as of the step at `running_at`."""
        self.measured: dict[str, float] = {}
        """Each queue's relative speed as measured (`measure`)."""

    # -- Eq. 1 ------------------------------------------------------------------------------------

    def speed(self, view: DispatchView, q: QueueSpec) -> float:
        """P: the queue's given performance, else its pools' mean `Speed` attribute, else as measured (the
        bags that ran in this queue and elsewhere: their mean run time overall over theirs here), else 1."""
        if q.performance is not None:
            return q.performance
        speeds = [s for p in q.pools if (s := ad_number(view.pool_ad(p), "Speed", 0.0)) > 0]
        if speeds:
            return sum(speeds) / len(speeds)
        return self.measured.get(q.name, 1.0)

    def measure(self, view: DispatchView) -> None:
        """Each queue's relative speed from the active bags' last results (`speed`'s fallback)."""
        ratios: dict[str, list[float]] = {}
        for bag in view.bags():
            per: dict[str, list[float]] = {}
            for e in bag.recent(MEASURE_RESULTS):
                if e.success and e.ended_at is not None and (q := self._queue_of_pool(e.pool)) is not None:
                    per.setdefault(q.name, []).append(max(1e-6, e.ended_at - e.sent_at))
            if len(per) < 2:
                continue
            overall = sum(sum(v) for v in per.values()) / sum(len(v) for v in per.values())
            for name, v in per.items():
                ratios.setdefault(name, []).append(overall / (sum(v) / len(v)))
        if ratios:
            mean = {name: sum(r) / len(r) for name, r in ratios.items()}
            scale = sum(mean.values()) / len(mean)  # (relative to the queues' average)
            self.measured = {name: m / scale for name, m in mean.items()}

    def phi(self, view: DispatchView, q: QueueSpec, seconds: float, beta: float, jobs: int | None = None) -> float:
        """Work the queue does in `seconds`, optimistically (every slot, at its machines' speed); for a bag with
        `jobs` left, on no more slots than that (a bag of one job runs on one CPU, however many N allows)."""
        slots = q.max_cpus if jobs is None else max(1, min(q.max_cpus, jobs))
        return max(0.0, seconds) * slots * self.speed(view, q) * beta

    # -- the bags' complexity ---------------------------------------------------------------------

    def estimate(self, view: DispatchView, b: _Bag) -> float | None:
        """The bag's remaining work in CPU-seconds of a speed-1 CPU: measured once `min_results` results
        are in (jobs left x their mean run time, scaled by the speed of the queue they ran in and by beta, the
        CPU-bound share of a run), else the owner's figure for the jobs left, else None."""
        bag = view.bag(b.bag_id)
        if bag is None:
            return b.complexity
        left = bag.queued + bag.running
        times = []
        for e in bag.recent(MEASURE_RESULTS):  # (the recent run times: what the jobs left will take)
            if e.success and e.ended_at is not None:
                queue = self._queue_of_pool(e.pool)
                times.append((e.ended_at - e.sent_at) * (self.speed(view, queue) if queue else 1.0) * b.beta)
        if len(times) >= b.min_results:
            mean, b.source = sum(times) / len(times), "measured"
        elif b.given is not None:
            done = bag.counts.done + bag.counts.failed
            mean, b.source = b.given / max(1, left + done), "given"  # (the owner's bound, shared by its jobs)
        else:
            b.complexity, b.source = None, "unknown"
            return None
        # a running job has only what it has not run yet left (counted whole, a bag one second from its end
        # looked a job long, and task potential overdue moved it)
        running = 0.0
        by_pool = self.running.get(b.bag_id, {}) if self.running_at == self.now else view.running_by_pool(b.bag_id)
        for pool, runs in by_pool.items():
            queue = self._queue_of_pool(pool)
            speed = (self.speed(view, queue) if queue else 1.0) * b.beta
            running += sum(max(0.0, mean - (self.now - sent) * speed) for sent, _ in runs)
        b.complexity = bag.queued * mean + running
        return b.complexity

    def _queue_of_pool(self, pool: str) -> QueueSpec | None:
        return next((q for q in self.queues if pool in q.pools), None)

    # -- ProcessNewTask (Figure 1) ----------------------------------------------------------------

    def admit(self, view: DispatchView, b: _Bag, now: float) -> None:
        """A new bag enters the top level, or the first level whose C_e fits the complexity its owner gave."""
        self.now = max(self.now, now)
        self.forget(view)
        self.bags[b.bag_id] = b
        bag = view.bag(b.bag_id)
        holding = [q for q in self.queues if bag is not None and any(bag.on_pool(p)[1] for p in q.pools)]
        if holding:
            # it runs already (the server restarted): it is taken up in the deepest queue its instances run in,
            # from now, without preempting them (what moved it there is not known any more)
            q = holding[-1]
            b.queue, b.arrived, b.started = q.name, now, now
            b.sent_base = self._sent(view, b, q)
            self.order[q.name].append(b.bag_id)
            self.estimate(view, b)
            return
        c = self.estimate(view, b)
        queues = self._at(self.levels[0])
        if b.source == "given" and c is not None and any("complexity_mismatch" in q.policies for q in queues):
            for level in self.levels:
                queues = [q for q in self._at(level) if c <= self.phi(view, q, q.exec_time_limit, b.beta)]
                if queues:
                    break
            queues = queues or self._at(self.levels[-1])
        self.arrive(view, b, self._pick(view, queues), min(now, bag.created_at) if bag is not None else now)

    def forget(self, view: DispatchView) -> None:
        """Drop the bags that ended, or that another placement now places, from their queues."""
        for bag_id in list(self.bags):
            bag = view.bag(bag_id)
            if bag is None or bag.strategies[1] != "hierarchy":
                self._drop(bag_id)

    def arrive(self, view: DispatchView, b: _Bag, q: QueueSpec, now: float) -> None:
        """ProcessNewTask: the bag arrives at `q`."""
        b.queue, b.arrived, b.started = q.name, now, None
        b.sent_base = self._sent(view, b, q)
        self.order[q.name].append(b.bag_id)
        full = q.max_bags is not None and len(self.order[q.name]) > q.max_bags
        if "overload" in q.policies and (full or self.load[q.name] > self.phi(view, q, q.queue_time_limit, b.beta)):
            why = (f"queue {q.name} holds {q.max_bags} bags" if full else
                   f"queue {q.name}'s work {self.load[q.name]:,.0f} CPU-s is over its C_q")
            self.move(view, b, q, "overload", why, now, same_level=True)
            return
        c = self.estimate(view, b)
        if self._mismatch(view, b, q):
            self.move(view, b, q, "complexity mismatch", f"its work {c or 0.0:,.0f} CPU-s is over C_e "
                      f"{self.phi(view, q, q.exec_time_limit, b.beta):,.0f} of queue {q.name}", now)
            return
        b.counted = c or 0.0
        self.load[q.name] += b.counted  # (until the next step counts the queue's work again)

    # -- EnforceQueueLimits (Figure 2) ------------------------------------------------------------

    def step(self, view: DispatchView, now: float) -> None:
        """Once per tick: take up new bags, forget ended ones, enforce every queue's limits, share load."""
        if self.stepped_at == now:
            return
        self.stepped_at = self.now = now
        self.running, self.running_at = view.running_by_bag(), now  # (one pass for every bag's estimate)
        self.forget(view)
        self.measure(view)
        for q in self.queues:
            self.enforce(view, q, now)
        self.share(view, now)

    def enforce(self, view: DispatchView, q: QueueSpec, now: float) -> None:
        work = 0.0
        for bag_id in list(self.order[q.name]):
            b = self.bags[bag_id]
            if b.ended or b.queue != q.name:
                continue
            self.started(view, b, q, now)
            tq = now - b.arrived
            te = now - b.started if b.started is not None else 0.0
            alone = len(self.order[q.name]) == 1
            c = self.estimate(view, b)
            violated = self.violation(view, b, q, c, work, tq, te, alone)
            if violated is not None and self.move(view, b, q, *violated, now):
                continue
            b.counted = c or 0.0
            work += b.counted  # (a bag kept, or left to run at the lowest level, is the queue's work)
        self.load[q.name] = work

    def violation(self, view: DispatchView, b: _Bag, q: QueueSpec, c: float | None, ahead: float, tq: float,
                  te: float, alone: bool) -> tuple[str, str] | None:
        """The first of Figure 2's policies (and step 3 of Figure 1, for a bound that came after the bag's
        arrival) the bag violates in its queue, with why; None: none."""
        if "overdue" in q.policies and (tq > q.queue_time_limit or te > q.exec_time_limit) and not alone:
            return "overdue", (f"{tq:,.0f} s in queue {q.name} (Tq {q.queue_time_limit:g} s), {te:,.0f} s running "
                               f"there (Te {q.exec_time_limit:g} s)")
        if c is None:
            return None
        ce = self.phi(view, q, q.exec_time_limit, b.beta)
        if "complexity_mismatch" in q.policies and b.started is None and b.source == "given" and c > ce:
            return "complexity mismatch", f"its estimated work {c:,.0f} CPU-s is over C_e {ce:,.0f} of queue {q.name}"
        bag = view.bag(b.bag_id)
        jobs = bag.queued + bag.running if bag is not None else None
        if "task_potential_overdue" in q.policies and (
                c > self.phi(view, q, q.exec_time_limit - te, b.beta, jobs)
                or c > self.phi(view, q, q.queue_time_limit - tq, b.beta, jobs)):
            return "task potential overdue", (f"its remaining work {c:,.0f} CPU-s cannot end within what is left "
                                              f"of Te or Tq in queue {q.name}")
        cq = self.phi(view, q, q.queue_time_limit, b.beta)
        if "queue_potential_overdue" in q.policies and ahead + c > cq:
            return "queue potential overdue", (f"the work ahead of it ({ahead:,.0f} CPU-s) and its own ({c:,.0f}) "
                                               f"exceed C_q {cq:,.0f} of queue {q.name}")
        return None

    def share(self, view: DispatchView, now: float) -> None:
        """Load sharing in a level: a bag not started moves to a queue of its level where it would end within
        SHARE_MARGIN of the time it would take here."""
        for q in self.queues:
            peers = [p for p in self._at(q.level) if p.name != q.name]
            if not peers:
                continue
            ahead = 0.0
            for bag_id in list(self.order[q.name]):
                b = self.bags[bag_id]
                c = b.complexity
                bag = view.bag(bag_id)
                if c is None or b.started is not None or bag is None or bag.queued < 2:
                    ahead += c or 0.0
                    continue
                here = (ahead + c) / max(1e-9, self.phi(view, q, 1.0, b.beta))
                best = min(peers, key=lambda p: (self.load[p.name] + c) / max(1e-9, self.phi(view, p, 1.0, b.beta)))
                there = (self.load[best.name] + c) / max(1e-9, self.phi(view, best, 1.0, b.beta))
                if there < SHARE_MARGIN * here:  # (its arrival there adds its work to that queue's load)
                    self._relocate(view, b, q, best, "load sharing", f"it would end in {there:,.0f} s in queue "
                                   f"{best.name} against {here:,.0f} s here", now)
                else:
                    ahead += c

    # -- MigrationPolicy --------------------------------------------------------------------------

    def move(self, view: DispatchView, b: _Bag, q: QueueSpec, policy: str, why: str, now: float,
             same_level: bool = False) -> bool:
        """The migration policy: the bag goes to the next level (for overload, first another queue of its
        level with room); from the lowest level it is ended or left to run, as the queue says. Returns
        whether it left the queue (False: left to run in it)."""
        target: QueueSpec | None = None
        if policy == "complexity mismatch" and b.complexity is not None:  # (a queue of its level that fits it)
            fits = [p for p in self._at(q.level) if p.name != q.name
                    and b.complexity <= self.phi(view, p, p.exec_time_limit, b.beta)]
            target = self._pick(view, fits) if fits else None
        if target is None and same_level:
            roomy = [p for p in self._at(q.level) if p.name != q.name
                     and self.load[p.name] <= self.phi(view, p, p.queue_time_limit, b.beta)
                     and (p.max_bags is None or len(self.order[p.name]) < p.max_bags)
                     and not self._mismatch(view, b, p)]
            target = self._pick(view, roomy) if roomy else None
        if target is None:
            lower = [lv for lv in self.levels if lv > q.level]
            target = self._pick(view, self._at(lower[0])) if lower else None
        if target is None:
            if q.at_lowest == "terminate" or policy in ("overload", "complexity mismatch"):
                b.ended = f"{policy} at the lowest level: {why}"
                b.migrations.append((now, q.name, "", b.ended))
                self._leave(b, q.name)  # (it leaves the queue now: its placement ends it next)
                return True
            return False
        self._relocate(view, b, q, target, policy, why, now)
        return True

    def _relocate(self, view: DispatchView, b: _Bag, q: QueueSpec, target: QueueSpec, policy: str, why: str,
                  now: float) -> None:
        self._leave(b, q.name)
        b.migrations.append((now, q.name, target.name, f"{policy}: {why}"))
        b.moved_at = now
        self.arrive(view, b, target, now)

    # -- helpers ----------------------------------------------------------------------------------

    def _mismatch(self, view: DispatchView, b: _Bag, q: QueueSpec) -> bool:
        """The bag's known work is over what `q` takes by its complexity-mismatch policy (a move for overload
        there would send it back at once, and on, without end)."""
        return ("complexity_mismatch" in q.policies and b.complexity is not None
                and b.complexity > self.phi(view, q, q.exec_time_limit, b.beta))

    def _at(self, level: int) -> list[QueueSpec]:
        return [q for q in self.queues if q.level == level]

    def _pick(self, view: DispatchView, queues: Sequence[QueueSpec]) -> QueueSpec:
        """Of a level's queues, the one with the least work per unit of speed."""
        return min(queues, key=lambda q: (self.load[q.name] / max(1e-9, self.phi(view, q, 1.0, 1.0)), q.name))

    def started(self, view: DispatchView, b: _Bag, q: QueueSpec, now: float) -> None:
        """Note when the bag's first instance in its queue was sent (t_e counts from it)."""
        if b.started is None and self._sent(view, b, q) > b.sent_base:
            bag = view.bag(b.bag_id)
            b.started = max(b.arrived, bag.last_sent if bag is not None else now)

    @staticmethod
    def _sent(view: DispatchView, b: _Bag, q: QueueSpec) -> int:
        bag = view.bag(b.bag_id)
        return sum(bag.on_pool(p)[0] for p in q.pools) if bag is not None else 0

    def _drop(self, bag_id: int) -> None:
        b = self.bags.pop(bag_id)
        self._leave(b, b.queue)

    def _leave(self, b: _Bag, queue: str) -> None:
        """The bag leaves `queue`, and its work the queue's load (a new bag must not find an idle queue
        overloaded by the work of bags that left since the last step)."""
        order = self.order.get(queue)
        if order is None or b.bag_id not in order:
            return
        order.remove(b.bag_id)
        self.load[queue] = max(0.0, self.load[queue] - b.counted) if order else 0.0
        b.counted = 0.0

    def work(self, view: DispatchView, q: QueueSpec) -> float:
        """Q: the work of the queue's bags as of the last step, without those that ended since (the hierarchy
        steps only while one of its bags runs)."""
        return sum(self.bags[i].counted for i in self.order[q.name] if view.bag(i) is not None)

    def report(self, bag_id: int, now: float) -> LevelReport | None:
        """Where the hierarchy holds a bag (also just after it ended, until the next step forgets it)."""
        b = self.bags.get(bag_id)
        if b is None:
            return None
        q = self.by_name.get(b.queue)
        return LevelReport(b.queue, q.level if q else 0, self.position(b), b.complexity, b.source,
                           now - b.arrived, now - b.started if b.started is not None else 0.0, list(b.migrations),
                           b.ended)

    def position(self, b: _Bag) -> int:
        order = self.order.get(b.queue, [])
        return order.index(b.bag_id) + 1 if b.bag_id in order else 0


class HierarchyPlacement(Placement):
    """A bag's place in the grid execution hierarchy (`placement = "hierarchy"`)."""

    name: ClassVar[str] = "hierarchy"
    host_dependent = True
    options: ClassVar[Mapping[str, StrategyOption]] = {
        "complexity": 0.0,
        "beta": 1.0,
        "min_results": 3,
        "preempt": True,
        "estimator": "",
        "estimate_share": 0.1,
    }
    """complexity: the bag's work in CPU-seconds of a speed-1 CPU, an upper bound (0: unknown, measured);
    beta: the share of its run time that is CPU-bound; min_results: results before its measured run times
    replace the given complexity; preempt: a migrated bag's running instances are preempted and queued again
    in its new queue (false: they finish where they are); estimator: a shell command that prints an upper
    bound of the bag's work in CPU-seconds (the last number it prints), run once on a worker before the bag
    starts, as a companion bag NAME.estimate (the server makes it); estimate_share: the share of its queue's
    Te the bag waits for its estimator (the paper's alpha)."""

    @classmethod
    def validate(cls, options: Mapping[str, StrategyOption]) -> None:
        for key, low, high in (("complexity", 0.0, 1e15), ("beta", 1e-6, 1.0)):
            v = options.get(key)
            if isinstance(v, int | float) and not low <= v <= high:
                raise StrategyError(f"strategy option '{key}' must be from {low:g} to {high:g}, not {v!r}")
        share = options.get("estimate_share")
        if isinstance(share, int | float) and not 0 <= share <= 1:
            raise StrategyError(f"strategy option 'estimate_share' must be from 0 to 1, not {share!r}")
        n = options.get("min_results")
        if isinstance(n, int) and not 1 <= n <= 10_000:
            raise StrategyError(f"strategy option 'min_results' must be from 1 to 10000, not {n}")

    def __init__(self, bag_id: int, seed: int, options: Mapping[str, StrategyOption],
                 hierarchy: Hierarchy | None = None) -> None:
        super().__init__(bag_id, seed, options)
        if hierarchy is None or not hierarchy.queues:
            raise StrategyError("placement 'hierarchy' needs queues: declare [queues.NAME] in the pools file "
                                "(docs/hierarchy.md)")
        self.h = hierarchy
        self.moved_seen: float | None = None
        known = hierarchy.bags.get(bag_id)
        if known is not None:  # made anew (its [strategy] changed: its estimator's bound came): same place
            self.moved_seen = known.moved_at
            given = self.number("complexity")
            known.given = given if given > 0 else known.given
            known.estimating = known.estimating and known.given is None
            known.beta = self.number("beta")

    def _me(self, view: DispatchView, now: float) -> _Bag:
        b = self.h.bags.get(self.bag_id)
        if b is None:
            given = self.number("complexity")
            b = _Bag(self.bag_id, given=given if given > 0 else None, beta=self.number("beta"),
                     min_results=int(self.number("min_results")),
                     estimating=bool(self.settings["estimator"]) and given <= 0,
                     estimate_share=self.number("estimate_share"))
            self.h.admit(view, b, now)
        q = self.h.by_name.get(b.queue)
        if q is not None:
            self.h.started(view, b, q, now)
        return b

    def _held(self, b: _Bag, q: QueueSpec, now: float) -> bool:
        """It waits for its estimator's bound, for up to `estimate_share` of the queue's Te."""
        if b.estimating and now - b.arrived >= b.estimate_share * q.exec_time_limit:
            b.estimating = False  # (no bound in time: it runs as a bag of unknown complexity)
        return b.estimating

    def rank(self, view: DispatchView, bag: BagView, host: HostView, rank: float, now: float) -> float | None:
        b = self._me(view, now)
        q = self.h.by_name.get(b.queue)
        if b.ended or q is None or host.pool not in q.pools or self._held(b, q, now):
            return None
        return (1000.0 - q.level) * 1e6 - self.h.position(b)

    def limit(self, view: DispatchView, bag: BagView, host: HostView, now: float) -> int | None:
        b = self._me(view, now)
        q = self.h.by_name.get(b.queue)
        if b.ended or q is None or host.pool not in q.pools or self._held(b, q, now):
            return 0
        return max(0, q.max_cpus - sum(bag.on_pool(p)[1] for p in q.pools))

    def pilots(self, view: DispatchView, bag: BagView, pools: Sequence[str], now: float) -> Mapping[str, int] | None:
        b = self._me(view, now)
        q = self.h.by_name.get(b.queue)
        if b.ended or q is None or self._held(b, q, now):
            return {}
        want = min(bag.queued + bag.waiting_replicas, max(0, q.max_cpus - sum(bag.on_pool(p)[1] for p in q.pools)))
        out: dict[str, int] = {}
        for p in q.pools:
            if want <= 0 or p not in pools:
                continue
            ad = view.pool_ad(p) or {}
            cap = ad.get("MaxRunning", 0)
            cpus = ad.get("Cpus", 1)
            room = int(cap) * int(cpus) if isinstance(cap, int) and isinstance(cpus, int) else want
            n = min(want, max(0, room))
            if n:
                out[p] = n
                want -= n
        return out

    def migrate(self, view: DispatchView, bag: BagView, now: float) -> Sequence[Migration]:
        b = self._me(view, now)
        self.h.step(view, now)
        if b.moved_at is None or b.moved_at == self.moved_seen or b.ended:
            return ()
        self.moved_seen = b.moved_at
        q = self.h.by_name[b.queue]
        if not self.settings["preempt"]:
            return ()
        why = b.migrations[-1][3] if b.migrations else "moved"
        # (queued again for any of the hierarchy's pools: which of them may run the bag is rank's to say, so a
        # later move needs no job to be moved again)
        anywhere = frozenset(p for queue in self.h.queues for p in queue.pools)
        return [Migration(j.job_id, anywhere, f"the bag moved to queue {q.name} ({why})")
                for j in view.running_jobs(bag.bag_id)]

    def terminate(self, view: DispatchView, bag: BagView, now: float) -> str | None:
        b = self.h.bags.get(self.bag_id)
        return b.ended if b is not None and b.ended else None

    def level(self, view: DispatchView, bag: BagView, now: float) -> LevelReport | None:
        return self.h.report(self.bag_id, now)

    def notes(self, view: DispatchView, bag: BagView, now: float) -> list[str]:
        b = self.h.bags.get(self.bag_id)
        if b is None:
            return []
        q = self.h.by_name.get(b.queue)
        pos = self.h.position(b)
        if q is not None and b.estimating:
            return [f"waits for its estimator (bag {bag.name}.estimate) in queue {q.name}, up to "
                    f"{b.estimate_share * q.exec_time_limit:,.0f} s"]
        if q is not None and pos > 1 and b.started is None and bag.queued:
            return [f"waits in queue {q.name} (level {q.level}) behind {pos - 1} bag(s), first come first served"]
        return []


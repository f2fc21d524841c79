"""The baseline GridBot was measured against: the bag's jobs submitted one by one to a pool's own batch
system, with no overlay (SC'09 section 7, "GridBot versus Condor").

Each job is a batch job of its own and pays the pool's queue wait before every start: GridBot's
Figure 1b measured those waits with a steady 100 jobs of one user in the system (a job submitted as
another ended), so here too at most the pool's size of the user's jobs are in the system at once,
waiting for a match or running, and the next job enters as one leaves. A preempted job goes back to
the head of the queue and starts over; a failed one is submitted again, up to the bag's
`max_failures`, as a user's retry script would. GridBot's pilots wait once and then run job after
job; the difference is what its overlay is for. Same scenario, same seed: the same runtimes as the
GridBot run (`engine.simulate`).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field

from gridbot.sim.metrics import MILESTONES, BagResult, PoolResult, Results
from gridbot.sim.scenario import BagModel, Scenario

_QUICK_FAILURE = (1.0, 5.0)
"""A black hole fails a job this many seconds after it starts (as in the engine)."""


@dataclass
class _Bag:
    model: BagModel
    runtimes: list[float]
    failures: list[int]
    left: int
    queued: int
    """Jobs of the bag in the queue, not yet in the system."""
    done: int = 0
    failed: int = 0
    instances: int = 0
    reruns: set[int] = field(default_factory=set)
    """Jobs that had to run more than once."""
    useful: float = 0.0
    used: float = 0.0
    queue_empty: float | None = None
    """When every job had entered the system at least once (nothing left in the queue)."""
    finished: float | None = None
    milestones: dict[str, float] = field(default_factory=dict)


class BatchSystem:
    """One run of a scenario's bags on its single pool's batch system; `run()` returns Results."""

    def __init__(self, scenario: Scenario, seed: int | None = None) -> None:
        pools = [p for p in scenario.pools if not p.volunteer]
        if len(scenario.pools) != 1 or not pools:
            raise ValueError("a plain batch system is one pool's own scheduler: give the scenario exactly one "
                             f"pool that is not a community grid, not {len(scenario.pools)}")
        self.sc, self.pool = scenario, pools[0]
        self.seed = scenario.seed if seed is None else seed
        self.rng = random.Random(self.seed)
        self.machines = [(max(1e-3, self.pool.speed.sample(self.rng)), self.rng.random() < self.pool.black_holes)
                         for _ in range(self.pool.hosts)]
        self.unreliability = [self.pool.machine_factor(self.rng) for _ in self.machines]
        """Each machine's factor on the pool's failure_rate, and what its jobs' lives are divided by
        (`failure_spread`)."""
        self.now, self.size, self.inflight, self.peak = 0.0, 0, 0, 0
        self.queue: deque[tuple[_Bag, int]] = deque()
        self.bags: list[_Bag] = []
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = 0
        self.counts = {"instances": 0, "done": 0, "failed": 0, "lost": 0}

    def _at(self, t: float, kind: str, what: object = None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, what))

    def run(self) -> Results:
        for b in self.sc.bags:
            self._at(b.arrival, "arrive", b)
        p = self.pool
        if p.fluctuate is not None:
            self._at(0.0, "resize", None)
        else:
            for step in p.size:
                self._at(step.at, "resize", step.size)
        pending = len(self.sc.bags)
        while self.events:
            t, _, kind, what = heapq.heappop(self.events)
            if t > self.sc.horizon:
                self.now = self.sc.horizon
                break
            self.now = t
            if kind == "arrive":
                assert isinstance(what, BagModel)
                self._arrive(what)
                pending -= 1
            elif kind == "resize":
                self._resize(what)
            elif kind == "start":
                assert isinstance(what, tuple)
                self._start(*what)
            else:
                assert isinstance(what, tuple)
                self._end(*what)
            if pending == 0 and all(b.finished is not None for b in self.bags):
                break
            self._pump()
        return self._results()

    def _arrive(self, model: BagModel) -> None:
        if model.runtimes is not None:
            runs, n = model.runtimes, len(model.runtimes)
            runtimes = [runs[i * n // model.jobs] for i in range(model.jobs)]
        else:
            rng = random.Random(f"{self.seed}:{model.name}")
            runtimes = [model.runtime.draw(rng) for _ in range(model.jobs)]
        bag = _Bag(model, runtimes, [0] * model.jobs, model.jobs, model.jobs)
        self.bags.append(bag)
        self.queue.extend((bag, i) for i in range(model.jobs))

    def _resize(self, size: object) -> None:
        fl = self.pool.fluctuate
        if fl is not None:
            self.size = self.rng.randint(fl[0], fl[1])
            self._at(self.now + fl[2], "resize", None)
        else:
            assert isinstance(size, int)
            self.size = size

    def _pump(self) -> None:
        """Jobs enter the system as others leave it, each to wait its own queue wait for a match."""
        while self.queue and self.inflight < self.size:
            bag, i = self.queue.popleft()
            bag.queued -= 1
            if bag.queued == 0 and bag.queue_empty is None:
                bag.queue_empty = self.now
            self.inflight += 1
            self._at(self.now + self.pool.queue_wait.sample(self.rng), "start", (bag, i))

    def _start(self, bag: _Bag, i: int) -> None:
        k = int(self.rng.random() * len(self.machines))
        speed, black_hole = self.machines[k]
        factor = self.unreliability[k]
        work = bag.runtimes[i] / speed
        p = self.pool
        if black_hole:
            outcome, wall = "failed", self.rng.uniform(*_QUICK_FAILURE)
        elif p.failure_rate and self.rng.random() < p.failure_rate * factor:
            outcome, wall = "failed", self.rng.uniform(0.0, work)
        else:
            outcome, wall = "done", work
        life = p.preemption.sample(self.rng) / max(factor, 1e-9) if p.preemption is not None else float("inf")
        if life < wall:
            outcome, wall = "lost", life
        bag.instances += 1
        self.counts["instances"] += 1
        self.peak = max(self.peak, self.inflight)
        self._at(self.now + wall, "end", (bag, i, outcome, wall))

    def _end(self, bag: _Bag, i: int, outcome: str, wall: float) -> None:
        self.inflight -= 1
        self.counts[outcome] += 1
        bag.used += wall
        if outcome == "done":
            bag.useful += wall
            bag.done += 1
            self._left(bag, -1)
            return
        if outcome == "failed":
            bag.failures[i] += 1
            if bag.failures[i] >= bag.model.max_failures:
                bag.failed += 1
                self._left(bag, -1)
                return
        bag.reruns.add(i)
        bag.queued += 1
        (self.queue.appendleft if outcome == "lost" else self.queue.append)((bag, i))

    def _left(self, bag: _Bag, change: int) -> None:
        bag.left += change
        for m in MILESTONES:
            if bag.left <= m and str(m) not in bag.milestones:
                bag.milestones[str(m)] = self.now
        if bag.left == 0:
            bag.finished = self.now

    def _results(self) -> Results:
        bags = []
        for b in self.bags:
            m = b.model
            makespan = b.finished - m.arrival if b.finished is not None else None
            tail = b.finished - b.queue_empty if b.finished is not None and b.queue_empty is not None else None
            state = "active" if b.finished is None else "failed" if b.failed else "completed"
            bags.append(BagResult(
                m.name, m.jobs, m.arrival, state, b.finished, makespan, b.queue_empty, tail, b.done, b.failed,
                b.instances, 0, 0, len(b.reruns), 0.0, 0.0,
                round(100.0 * max(0.0, b.used - b.useful) / b.useful, 2) if b.useful else 0.0,
                round(b.used / 3600.0, 2), {self.pool.name: b.done}, dict(b.milestones)))
        c = self.counts
        pool = PoolResult(self.pool.name, self.peak, c["instances"], c["done"], 0, c["failed"], c["lost"], 100.0)
        return Results(self.sc.source, self.seed, self.now, self.seq, bags, [pool])


def simulate_batch(scenario: Scenario, seed: int | None = None) -> Results:
    """Run a scenario's bags as plain batch jobs on its one pool; the same scenario and seed always give
    the same Results (per bag: makespan, tail from the moment no job was left waiting to enter)."""
    return BatchSystem(scenario, seed).run()

"""The ExPERT Estimator (section 4.4): the mean makespan and cost of strategies, by simulation.

The model is the paper's: #ur unreliable and Mr x #ur reliable machines, one FCFS queue per pool; an
instance sent to the unreliable pool returns after a turnaround drawn from F(t, t') = Fs(t) gamma(t'), or
times out at its deadline (the machine is held until then, since nobody hears of a failure earlier);
reliable machines never fail. A queued instance of a task that succeeds is cancelled; one already sent
runs on, and its result is paid for. At each time step: instances end, tasks whose timer ran out get
their next instance queued, idle machines take queued instances.

Every (strategy, repetition) pair is one world, and all worlds advance together, in numpy arrays. Event
times are kept exact (an instance sent to a machine that freed at e, for an instance queued at q, is
sent at max(e, q)); the step only orders events: within a step, results come first, then timers, then
sends. Repetition r of every strategy uses the same random numbers (the u drawn for each task's i-th
instance), so strategies are compared on the same luck and a strategy's estimate does not depend on
which others share the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from gridbot.errors import GridbotError
from gridbot.schedulers.expert.characterize import Characterization
from gridbot.schedulers.expert.strategy import Combine, NTDMr, Plan, Prices

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]
Bools = NDArray[np.bool_]

NO_LIMIT = 1 << 30
"""N = infinity."""
DRAWS = 64
"""Random numbers kept per task: its i-th instance uses the (i mod DRAWS)-th."""


class EstimateError(GridbotError, ValueError):
    """The estimator was asked something it cannot simulate."""


@dataclass(frozen=True)
class Setup:
    """What is simulated: a tail (default) or a whole bag, on #ur unreliable machines."""

    tasks: int
    unreliable: int
    prices: Prices = field(default_factory=Prices)
    ages: tuple[float, ...] = ()
    """Tail only: the first len(ages) tasks each have an instance out on an unreliable machine, sent that
    many seconds ago with the throughput deadline (the others have none yet)."""
    bag: bool = False
    """Simulate the whole bag from its first task: a throughput phase without replicas until fewer tasks
    remain than unreliable machines, then the tail (the paper's Figure 9)."""
    throughput_deadline: float | None = None
    """D (and T) of instances sent before the tail; default 4 T_ur."""
    step: float | None = None
    """Seconds per time step; default T_ur / 20."""
    horizon: float | None = None
    """Give up on a world after this many seconds (its makespan is then inf); default 100 T_ur plus twice
    the time one machine would take to run every task."""
    dispatch_delay: float = 0.0
    """Tail only: seconds from a task's timer running out to its next instance being sent to an unreliable
    machine (the model has none; a server decides on its tick and a host takes the instance when it asks)."""
    reliable_delay: float = 0.0
    """Tail only: the same for an instance sent to the reliable pool. Neither delay is paid for: the turnaround
    is."""
    reliable_startup: float = 0.0
    """Seconds a reliable machine takes to start the first time an instance is sent to it (a pilot, asked for
    once a task is due there), beyond the first `reliable_up`; not paid for either."""
    reliable_up: int = 0
    """Reliable machines up already, that need no start."""

    def __post_init__(self) -> None:
        if self.tasks < 1 or self.unreliable < 0:
            raise EstimateError(f"a setup needs 1 or more tasks and 0 or more unreliable machines, not "
                                f"{self.tasks} and {self.unreliable}")
        if len(self.ages) > min(self.tasks, self.unreliable):
            raise EstimateError(f"{len(self.ages)} instances out need as many tasks and unreliable machines "
                                f"(have {self.tasks} and {self.unreliable})")
        if self.bag and self.ages:
            raise EstimateError("a whole bag starts with no instance out: give ages only for a tail")
        if not all(0.0 <= x < math.inf for x in (self.dispatch_delay, self.reliable_delay, self.reliable_startup)):
            raise EstimateError(f"dispatch delays must be finite and at least 0 seconds, not {self.dispatch_delay}, "
                                f"{self.reliable_delay} and {self.reliable_startup}")
        if self.reliable_up < 0:
            raise EstimateError(f"reliable machines up must be 0 or more, not {self.reliable_up}")


@dataclass(frozen=True)
class Estimate:
    """Per strategy (rows) and repetition (columns); the properties average over repetitions."""

    runs_makespan: Floats
    """Seconds from the start (the tail's, or the bag's) to the last task's first result."""
    runs_tail_makespan: Floats
    """Seconds from the tail's start to the end (equal to the makespan when a tail is simulated)."""
    runs_cost: Floats
    """Cost per task, in the prices' currency."""
    runs_reliable: Floats
    """Instances sent to the reliable pool (the paper's RI)."""

    @property
    def makespan(self) -> Floats:
        return np.asarray(self.runs_makespan.mean(axis=1))

    @property
    def tail_makespan(self) -> Floats:
        return np.asarray(self.runs_tail_makespan.mean(axis=1))

    @property
    def cost(self) -> Floats:
        return np.asarray(self.runs_cost.mean(axis=1))

    @property
    def reliable(self) -> Floats:
        return np.asarray(self.runs_reliable.mean(axis=1))


def estimate(char: Characterization, strategies: Sequence[NTDMr | Plan], setup: Setup, repetitions: int = 10,
             seed: int = 0) -> Estimate:
    """Simulate each strategy `repetitions` times; deterministic for a seed."""
    if repetitions < 1 or not strategies:
        raise EstimateError("estimate needs at least one strategy and one repetition")
    plans = [s if isinstance(s, Plan) else Plan("", s) for s in strategies]
    draws = np.random.default_rng(seed).random((repetitions, setup.tasks, DRAWS))
    sim = _Simulation(char, plans, setup, repetitions, draws)
    sim.run()
    shape = (len(plans), repetitions)
    return Estimate(sim.out_makespan.reshape(shape), sim.out_tail.reshape(shape),
                    (sim.out_cost / setup.tasks).reshape(shape), sim.out_reliable.reshape(shape))


class _Ring:
    """A FIFO of ids per world (a ring buffer per row)."""

    def __init__(self, worlds: int, capacity: int) -> None:
        self.buf = np.zeros((worlds, capacity), dtype=np.int64)
        self.head = np.zeros(worlds, dtype=np.int64)
        self.tail = np.zeros(worlds, dtype=np.int64)

    def take(self, rows: Ints) -> None:
        self.buf, self.head, self.tail = self.buf[rows], self.head[rows], self.tail[rows]

    @property
    def size(self) -> Ints:
        return self.tail - self.head

    def push(self, rows: Ints, ids: Ints) -> None:
        """Append `ids` to the FIFOs of `rows` (sorted), in that order."""
        counts = np.bincount(rows, minlength=self.head.size)
        self.buf[rows, (self.tail[rows] + _within(rows, counts)) % self.buf.shape[1]] = ids
        self.tail += counts

    def pop_each(self, rows: Ints) -> Ints:
        """One id off the FIFO of each entry of `rows` (sorted; a row repeated k times gives k ids)."""
        counts = np.bincount(rows, minlength=self.head.size)
        ids = self.buf[rows, (self.head[rows] + _within(rows, counts)) % self.buf.shape[1]]
        self.head += counts
        return np.asarray(ids, dtype=np.int64)


class _Queue(_Ring):
    """A pool's FCFS queue of task ids per world; entries of tasks done meanwhile are skipped."""

    def pop(self, rows: Ints, free: Ints, done: Bools, ready: Floats, now: float) -> tuple[Ints, Ints]:
        """Up to free[i] live entries off the queue of world rows[i] that are ready (`ready` <= now, per world
        and task; the first that is not waits, and those behind it): (i, task) by i, then queue order."""
        cap = self.buf.shape[1]
        width = min(cap, int(np.minimum(free, self.size[rows]).max()) + 32)
        pos = self.head[rows, None] + np.arange(width)
        inside = pos < self.tail[rows, None]
        tasks = self.buf[rows[:, None], pos % cap]
        live = inside & ~done[rows[:, None], tasks]
        waits = live & (ready[rows[:, None], tasks] > now)
        take = live & (np.cumsum(live, axis=1) <= free[:, None]) & (np.cumsum(waits, axis=1) == 0)
        left = live & ~take
        self.head[rows] += np.where(left.any(axis=1), left.argmax(axis=1), inside.sum(axis=1))
        i, c = _cells(take)
        return i, tasks[i, c]


def _within(rows: Ints, counts: Ints) -> Ints:
    """Each entry's rank among the entries of its row, for `rows` sorted."""
    return np.arange(rows.size) - (np.cumsum(counts) - counts)[rows]


class _Simulation:
    """The worlds' state: per task (rows x tasks), per machine (rows x machines), per world (rows).

    `due` holds when each task's timer runs out (inf: it waits for nothing: done, queued, or its reliable
    instance sent); `next_due` and `next_end` are per-world lower bounds of the next timer and the next
    instance end, so a step only looks at the worlds where something happens."""

    def __init__(self, char: Characterization, plans: Sequence[Plan], setup: Setup, reps: int,
                 draws: Floats) -> None:
        self.char, self.setup, self.draws = char, setup, draws
        tur = char.tur
        self.dt = setup.step or tur / 20.0
        self.horizon = setup.horizon or (100.0 + 2.0 * setup.tasks) * max(tur, char.tr)
        self.thr_d = setup.throughput_deadline if setup.throughput_deadline is not None else 4.0 * tur
        self.per_task = float(setup.prices.reliable(np.array([char.tr]))[0])
        w, k, nur = len(plans) * reps, setup.tasks, setup.unreliable

        def per_world(values: list[float] | list[int] | list[bool]) -> NDArray[Any]:
            return np.repeat(np.asarray(values), reps)

        self.world = np.arange(w)
        self.rep = self.world % reps
        self.n = per_world([NO_LIMIT if p.tail.n is None else p.tail.n for p in plans]).astype(np.int64)
        self.t = per_world([p.tail.t for p in plans]).astype(float)
        self.d = per_world([p.tail.d for p in plans]).astype(float)
        nr = per_world([p.tail.machines_applied(nur) for p in plans]).astype(np.int64)  # (as the tail applies them)
        self.combine = per_world([_COMBINE[p.combine] for p in plans]).astype(np.int64)
        self.budget = per_world([np.inf if p.budget is None else p.budget for p in plans]).astype(float)
        machines = nur + int(nr.max())
        self.reliable_machine = np.arange(machines) >= nur
        self.usable = ~self.reliable_machine[None, :] | (np.arange(machines)[None, :] - nur < nr[:, None])
        self.in_tail = per_world([p.from_start or not setup.bag for p in plans]).astype(bool)
        self.t_tail = np.zeros(w)
        self.done = np.zeros((w, k), dtype=bool)
        self.finish = np.full((w, k), np.inf)
        self.last = np.full((w, k), -np.inf)
        self.due = np.full((w, k), -np.inf)
        self.queued = np.zeros((w, k), dtype=bool)
        self.q_time = np.zeros((w, k))
        self.sent_reliable = np.zeros((w, k), dtype=bool)
        self.count = np.zeros((w, k), dtype=np.int64)
        self.nu = np.zeros((w, k), dtype=np.int64)
        self.left = np.full(w, k, dtype=np.int64)
        self.latest = np.full(w, -np.inf)
        self.cost = np.zeros(w)
        self.reliable = np.zeros(w)
        self.active = np.ones(w, dtype=bool)
        self.next_due = np.full(w, -np.inf)
        self.next_end = np.full(w, np.inf)
        self.m_task = np.full((w, machines), -1, dtype=np.int64)
        self.m_end = np.full((w, machines), np.inf)
        self.m_free = np.zeros((w, machines))
        self.m_ok = np.zeros((w, machines), dtype=bool)
        self.m_cost = np.zeros((w, machines))
        self.m_cold = np.repeat((np.arange(machines) >= nur + setup.reliable_up)[None, :], w, axis=0)
        """Reliable machines not started yet."""
        self.queues = (_Queue(w, 2 * k + 2), _Queue(w, 2 * k + 2))
        self.idle = (_Ring(w, machines), _Ring(w, machines))
        self.unstarted = _Ring(w, machines)
        """The reliable machines not started yet: taken only when no started one is idle (as a host that is up takes
        an instance before a pilot is started for it)."""
        """The idle machines of each pool, the longest idle first."""
        self.out_makespan = np.full(w, np.inf)
        self.out_tail = np.full(w, np.inf)
        self.out_cost = np.full(w, np.inf)
        self.out_reliable = np.zeros(w)
        self._start_instances()
        idle = (self.m_task < 0) & self.usable
        self.idle[0].push(*_cells(idle & ~self.reliable_machine[None, :]))
        self.idle[1].push(*_cells(idle & self.reliable_machine[None, :] & ~self.m_cold))
        self.unstarted.push(*_cells(idle & self.m_cold))

    def _start_instances(self) -> None:
        """The tail's instances already out, on the first unreliable machines."""
        ages = np.asarray(self.setup.ages, dtype=float)
        if ages.size == 0:
            return
        j = np.arange(ages.size)
        u = self.draws[self.rep[:, None], j[None, :], 0]
        took = self.char.turnaround(u, -ages[None, :], ages[None, :])
        ok = took < self.thr_d
        end = -ages[None, :] + np.where(ok, took, self.thr_d)
        busy = end > 0.0
        self.last[:, j] = -ages[None, :]
        self.due[:, j] = -ages[None, :] + self.t[:, None]
        self.count[:, j] = 1
        self.m_task[:, j] = np.where(busy, j[None, :], -1)
        self.m_end[:, j] = np.where(busy, end, np.inf)
        self.m_ok[:, j] = ok & busy
        self.m_cost[:, j] = np.where(ok, self.setup.prices.unreliable(np.where(ok, took, 0.0)), 0.0)
        self.next_end = self.m_end.min(axis=1)

    def run(self) -> None:
        now = 0.0
        while self.active.any():
            self._results(now)
            self._phases(now)
            self._timers(now)
            self._send(now)
            self._finish(now)
            now += self.dt
            if self.active.sum() < 0.7 * self.active.size:
                self._compact(np.flatnonzero(self.active))

    def _results(self, now: float) -> None:
        self.latest.fill(-np.inf)
        rows = np.flatnonzero(self.next_end <= now)
        if rows.size == 0:
            return
        everywhere = rows.size > self.left.size // 2
        if everywhere:
            rows = np.arange(self.left.size)
        ri, j = _cells((self.m_end if everywhere else self.m_end[rows]) <= now)
        r = rows[ri]
        task, end, ok = self.m_task[r, j], self.m_end[r, j], self.m_ok[r, j]
        self.cost += np.bincount(r, weights=np.where(ok, self.m_cost[r, j], 0.0), minlength=self.cost.size)
        self.m_task[r, j] = -1
        self.m_free[r, j] = end
        self.m_end[r, j] = np.inf
        unreliable = ~self.reliable_machine[j]
        self.idle[0].push(r[unreliable], j[unreliable])
        self.idle[1].push(r[~unreliable], j[~unreliable])
        r, task, end = r[ok], task[ok], end[ok]
        k = self.done.shape[1]
        first = np.unique((r * k + task)[~self.done[r, task]])
        np.minimum.at(self.finish, (r, task), end)
        self.done[r, task] = True
        self.due[r, task] = np.inf
        self.left -= np.bincount(first // k, minlength=self.left.size)
        np.maximum.at(self.latest, r, end)
        self.next_end[rows] = (self.m_end if everywhere else self.m_end[rows]).min(axis=1)

    def _phases(self, now: float) -> None:
        """The tail starts once fewer tasks remain than unreliable machines; B switches to the reliable pool
        once what is left of its budget pays for every remaining task there."""
        starts = ~self.in_tail & (self.left < self.setup.unreliable)
        switch = np.isfinite(self.budget) & (self.left * self.per_task <= self.budget - self.cost)
        if not (starts.any() or switch.any()):
            return
        self.t_tail[starts] = np.clip(self.latest[starts], 0.0, now)
        self.t_tail[switch & ~self.in_tail] = now
        self.in_tail |= starts | switch
        self.n[switch], self.t[switch], self.budget[switch] = 0, 0.0, np.inf
        rows = np.flatnonzero(starts | switch)
        waiting = ~self.done[rows] & ~self.queued[rows] & ~self.sent_reliable[rows]
        self.due[rows] = np.where(waiting, self.last[rows] + self.t[rows, None], np.inf)
        self.next_due[rows] = self.due[rows].min(axis=1)

    def _timers(self, now: float) -> None:
        rows = np.flatnonzero(self.next_due <= now)
        if rows.size == 0:
            return
        ri, task = _cells(self.due[rows] <= now)
        r = rows[ri]
        # first come first served: within a step, tasks are queued in the order their timers ran out (at the
        # tail's start, the instances out longest first: they are the likeliest to be lost)
        order = np.lexsort((task, self.due[r, task], r))
        r, task = r[order], task[order]
        self.queued[r, task] = True
        tail = self.in_tail[r]
        to_reliable = tail & (self.nu[r, task] >= self.n[r])
        delay = np.where(to_reliable, self.setup.reliable_delay, np.where(tail, self.setup.dispatch_delay, 0.0))
        self.q_time[r, task] = np.maximum(self.due[r, task], np.where(self.in_tail, self.t_tail, 0.0)[r]) + delay
        self.due[r, task] = np.inf
        self.next_due[rows] = self.due[rows].min(axis=1)
        self.sent_reliable[r[to_reliable], task[to_reliable]] = True
        for pool, pick in ((0, ~to_reliable), (1, to_reliable)):
            if pick.any():
                self.queues[pool].push(r[pick], task[pick])

    def _send(self, now: float) -> None:
        unreliable, reliable = self.queues
        self._assign(unreliable, self.idle[0], None, now)
        self._assign(reliable, self.idle[1], None, now)
        self._assign(reliable, self.unstarted, None, now)
        combined = (self.combine == 2) | ((self.combine == 1) & ~self.in_tail)
        if combined.any():
            self._assign(unreliable, self.idle[1], combined, now)
            self._assign(unreliable, self.unstarted, combined, now)

    def _assign(self, queue: _Queue, machines: _Ring, worlds: Bools | None, now: float) -> None:
        """Idle `machines` (in `worlds`, if given) take the instances off `queue` that are due by `now`."""
        ready = (queue.tail > queue.head) & (machines.tail > machines.head)
        rows = np.flatnonzero(ready if worlds is None else ready & worlds)
        if rows.size == 0:
            return
        i, task = queue.pop(rows, machines.size[rows], self.done, self.q_time, now + 1e-9)
        if i.size == 0:
            return
        r = rows[i]
        mj = machines.pop_each(r)
        cold = self.m_cold[r, mj]
        sent = np.maximum(self.q_time[r, task], self.m_free[r, mj]) + np.where(cold, self.setup.reliable_startup, 0.0)
        self.m_cold[r, mj] = False
        u = self.draws[self.rep[r], task, self.count[r, task] % DRAWS]
        reliable = self.reliable_machine[mj]
        tail = self.in_tail[r]
        deadline = np.where(tail, self.d[r], self.thr_d)
        took = np.where(reliable, self.char.reliable_time(u), self.char.turnaround(u, sent))
        ok = reliable | (took < deadline)
        safe = np.where(ok, took, 0.0)
        prices = self.setup.prices
        end = sent + np.where(ok, took, deadline)
        self.m_task[r, mj] = task
        self.m_end[r, mj] = end
        self.m_ok[r, mj] = ok
        self.m_cost[r, mj] = np.where(reliable, prices.reliable(safe), np.where(ok, prices.unreliable(safe), 0.0))
        np.minimum.at(self.next_end, r, end)
        self.reliable += np.bincount(r[reliable], minlength=self.reliable.size)
        self.queued[r, task] = False
        self.last[r, task] = sent
        self.count[r, task] += 1
        self.nu[r, task] += tail & ~reliable
        due = np.where(self.sent_reliable[r, task], np.inf, sent + np.where(tail, self.t[r], self.thr_d))
        self.due[r, task] = due
        np.minimum.at(self.next_due, r, due)

    def _finish(self, now: float) -> None:
        """Worlds whose tasks are all done (or that ran past the horizon) are recorded and go still: the
        results still to come from instances out are paid for now."""
        over = self.active & ((self.left == 0) | (now + self.dt > self.horizon))
        if not over.any():
            return
        rows = np.flatnonzero(over)
        world = self.world[rows]
        span = np.where(self.left[rows] == 0, self.finish[rows].max(axis=1), np.inf)
        self.out_makespan[world] = span
        self.out_tail[world] = span - self.t_tail[rows]
        running = (self.m_task[rows] >= 0) & self.m_ok[rows]
        self.out_cost[world] = self.cost[rows] + (self.m_cost[rows] * running).sum(axis=1)
        self.out_reliable[world] = self.reliable[rows]
        self.active[rows] = False
        self.done[rows] = True
        self.m_task[rows] = -1
        self.m_end[rows] = np.inf
        self.next_due[rows] = self.next_end[rows] = np.inf
        for q in (*self.queues, *self.idle, self.unstarted):
            q.head[rows] = q.tail[rows]

    def _compact(self, keep: Ints) -> None:
        for name in _PER_WORLD:
            setattr(self, name, getattr(self, name)[keep])
        for q in (*self.queues, *self.idle, self.unstarted):
            q.take(keep)


_COMBINE = {Combine.NEVER: 0, Combine.THROUGHPUT: 1, Combine.ALWAYS: 2}
_PER_WORLD = ("world", "rep", "n", "t", "d", "combine", "budget", "usable", "in_tail", "t_tail", "done", "finish",
              "last", "due", "queued", "q_time", "sent_reliable", "count", "nu", "left", "latest", "cost", "reliable",
              "active", "next_due", "next_end", "m_task", "m_end", "m_free", "m_ok", "m_cost", "m_cold")


def _cells(mask: Bools) -> tuple[Ints, Ints]:
    """np.nonzero of a 2-d mask, in the same (row-major) order, several times faster."""
    flat = np.flatnonzero(mask)
    rows, cols = np.divmod(flat, mask.shape[1])
    return rows, cols

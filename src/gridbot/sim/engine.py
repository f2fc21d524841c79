"""The discrete-event simulator: the real dispatcher, policies and overlay planner on a virtual clock.

Simulated pilots land on simulated hosts and talk to the very `Dispatcher` the server runs, through the
same calls (`request_work` with reports and the held-instance list, `tick`, `needs_feed`/`feed`), and
every `Changes` is applied to a store before the next event, as the server does. Pools submit pilots by
the overlay's own max-flow plan (`schedulers.overlay`). Nothing sleeps and nothing reads the wall clock:
a run is a pure function of its scenario and seed.

What is modelled, per pool: its size over time, pilots' queue waits, host speeds, silent preemption of
pilots, job failures, black-hole hosts, a community grid's late reports (execution/turnaround ratio)
and hosts that come and go by themselves, network latency, pilot walltime and idle exit. A host paces its
exchanges as the worker does (the same `model.pacing.Pacing`), and the server's long poll is modelled: an
idle host's request is held until work is added or its backoff has passed (`model.pacing.server_hold`).
"""

from __future__ import annotations

import bisect
import heapq
import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import msgspec

from gridbot.core.changes import BagCounts, BagSnapshot, Changes, QueuedJob
from gridbot.core.dispatcher import Dispatcher
from gridbot.core.strategy import LevelReport, QosReport
from gridbot.core.view import BagView
from gridbot.model.pacing import PaceConfig, Pacing, server_hold
from gridbot.model.records import Assignment, HostInfo, InstanceReport, Outcome
from gridbot.model.spec import BagSpec, Parameter
from gridbot.model.states import BagState, InstanceState, JobState
from gridbot.schedulers import registry
from gridbot.schedulers.overlay import bag_demands, host_slots, pilots_to_cancel, plan, pool_capacity
from gridbot.sim.metrics import Recorder, Results
from gridbot.sim.scenario import BagModel, PoolModel, Scenario
from gridbot.store.memory import MemoryStore

# event kinds, in the order they run when due at the same moment
_ARRIVE, _RESIZE, _REPAIR, _PILOT_UP, _INST_END, _DEATH, _EXCHANGE, _TICK, _OVERLAY, _SAMPLE = range(10)
_WALLTIME_SHARE = 0.9
"""A pilot's worker stops at this share of its walltime (the real pilot's --lifetime)."""
_COMMUNITY_BACKOFF_CAP = 3600.0
"""A volunteer host doubles its wait after each empty answer up to this (BOINC clients back off
exponentially after "no work", for up to a day)."""
_QUICK_FAILURE = (1.0, 5.0)
"""A black hole fails each job this many seconds after it starts."""
_AGAIN = 0.001
"""Least time from an answer to the host's next exchange (with a backoff of 0, not at the same instant)."""


@dataclass(eq=False)
class _Machine:
    info: HostInfo
    speed: float
    black_hole: bool


@dataclass(eq=False)
class _Pilot:
    machine: _Machine
    pool: _PoolRt
    started: float
    number: int
    info: HostInfo
    """What the host says about itself: its machine's, with this pilot's session and its prefetch."""
    pacing: Pacing
    gen: int = 0
    alive: bool = True
    running: dict[int, float] = field(default_factory=dict)
    """Instance id → when it ends on this host."""
    waiting: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Prefetched instances not started yet, in arrival order: id → (bag, job index)."""
    outcome: dict[int, tuple[Outcome, float, int, float]] = field(default_factory=dict)
    """Instance id → how it will end, its execution time, its bag and when it started."""
    outbox: list[InstanceReport] = field(default_factory=list)
    reports_since: float = 0.0
    """When the oldest report of the outbox became ready."""
    held: int = 0
    """The `want` of the request of this idle host that the server holds (0: none held)."""


@dataclass
class _PoolRt:
    model: PoolModel
    machines: list[_Machine]
    pace: PaceConfig
    size: int = 0
    queue: dict[int, float] = field(default_factory=dict)
    """Pilots submitted and waiting in the pool's queue, in submission order: ticket → when submitted.
    A cancelled pilot leaves it at once, and its start event, finding it gone, does nothing."""
    pilots: dict[int, _Pilot] = field(default_factory=dict)
    """Running pilots by a number of their own (insertion order keeps runs reproducible)."""
    free: list[_Machine] = field(default_factory=list)
    """Machines with no pilot on them."""

    @property
    def running(self) -> int:
        return len(self.pilots)

    @property
    def queued(self) -> int:
        return len(self.queue)


class CompactStore:
    """Job states only, one byte a job: what the simulator needs of a store (the feeder's reads), at a
    size that holds a bag of millions. `store = "memory"` in a scenario runs the full MemoryStore instead."""

    _CODES: ClassVar[dict[JobState, int]] = {
        JobState.QUEUED: 0, JobState.RUNNING: 1, JobState.DONE: 2, JobState.FAILED: 3, JobState.CANCELLED: 4}

    def __init__(self) -> None:
        self.next_job_id = 1
        self.bags: dict[int, tuple[int, bytearray]] = {}
        self._firsts: list[int] = []
        """First job id of each bag, in bag order (job ids are contiguous per bag)."""
        self._bag_ids: list[int] = []

    def create_bag(self, bag_id: int, jobs: int) -> None:
        self.bags[bag_id] = (self.next_job_id, bytearray(jobs))
        self._firsts.append(self.next_job_id)
        self._bag_ids.append(bag_id)
        self.next_job_id += jobs

    def queued_jobs(self, bag_id: int, after: int, limit: int) -> list[QueuedJob]:
        first, states = self.bags[bag_id]
        out: list[QueuedJob] = []
        i = max(0, after - first + 1)
        while len(out) < limit:
            i = states.find(0, i)
            if i < 0:
                break
            out.append(QueuedJob(first + i, i, None, 0, 0))
            i += 1
        return out

    def apply(self, changes: Changes) -> None:
        codes = self._CODES
        for j in changes.jobs.values():
            bag_id = self._bag_ids[bisect.bisect_right(self._firsts, j.job_id) - 1]
            first, states = self.bags[bag_id]
            states[j.job_id - first] = codes[j.state]


class Simulation:
    """One run of a scenario with one seed; `run()` returns its Results."""

    def __init__(self, scenario: Scenario, seed: int | None = None,
                 progress: Callable[[float, int, int], None] | None = None) -> None:
        self.sc = scenario
        self.seed = scenario.seed if seed is None else seed
        self.rng = random.Random(self.seed)
        cfg = scenario.dispatch
        self._factory = registry.factory(self.seed, scenario.queues)
        self.dispatcher = Dispatcher(type(cfg)(**{**cfg.__dict__, "seed": self.seed}), self._factory)
        self.dispatcher.pool_ads = {p.name: {"Speed": p.speed.mean, **p.spec.ad()} for p in scenario.pools}
        self.memory = MemoryStore() if scenario.store == "memory" else None
        self.compact = CompactStore()
        self.progress = progress
        self.now = 0.0
        self._events: list[tuple[float, int, int, object, object]] = []
        self._seq = 0
        self.pools: dict[str, _PoolRt] = {}
        for p in scenario.pools:
            machines = []
            for n in range(p.hosts):
                host_id = f"{p.name}-{n}"
                info = HostInfo(host_id, host_id, "sim", p.spec.cpus, 0, p.spec.cpus, p.name, p.prefetch)
                machines.append(_Machine(info, self._speed(p), self.rng.random() < p.black_holes))
            # a pilot is a worker started with the pool's --prefetch and --idle-timeout; a volunteer is a
            # BOINC client, which never leaves for want of work and backs off on its own
            pace = PaceConfig(p.spec.cpus, p.prefetch, idle_timeout=0.0 if p.volunteer else p.spec.idle_timeout,
                              backoff_cap=_COMMUNITY_BACKOFF_CAP if p.volunteer else 0.0)
            self.pools[p.name] = _PoolRt(p, machines, pace, free=list(machines))
        self._pilot_ids = 0
        self._tickets = 0
        """Numbers queued pilots, so that a cancellation names the pilots it cancels, as the server does."""
        self.runtimes: dict[int, array[float]] = {}
        self.bag_ids: dict[str, int] = {}
        self.pending_bags = len(scenario.bags)
        self.total_jobs = sum(b.jobs for b in scenario.bags)
        self.recorder = Recorder(scenario, [p.name for p in scenario.pools])
        self._inst_pool: dict[int, tuple[str, int]] = {}
        self._views: dict[int, BagView | None] = {}
        self._qos: dict[int, QosReport] = {}
        self._levels: dict[int, LevelReport] = {}
        """Each bag's place in the execution hierarchy, as of the last sample."""
        """Each bag's last deadline-and-budget plan, as of the last sample."""
        """Each active bag's view, read once more when it ends (its tail plan)."""
        self._finished = False
        self._held: dict[_Pilot, None] = {}
        """Idle hosts whose requests the server holds, in the order they came (the server's long poll)."""
        self._work_seen = 0
        """The dispatcher's `work_added` when the held requests were last woken (as the server keeps it)."""

    # -- the event loop -------------------------------------------------------------------------------

    def _at(self, t: float, kind: int, obj: object = None, arg: object = None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, kind, self._seq, obj, arg))

    def run(self) -> Results:
        """Run until every bag has ended (or the horizon); return the metrics."""
        sc = self.sc
        for b in sc.bags:
            self._at(b.arrival, _ARRIVE, b)
        for pool in self.pools.values():
            m = pool.model
            if m.fluctuate:
                self._at(0.0, _RESIZE, pool, None)
            else:
                for step in m.size:
                    self._at(step.at, _RESIZE, pool, step.size)
        self._at(sc.tick, _TICK)
        self._at(0.0, _OVERLAY)
        self._at(0.0, _SAMPLE)
        events = self._events
        handlers = {_ARRIVE: self._arrive, _RESIZE: self._resize, _REPAIR: self._repair, _PILOT_UP: self._pilot_up,
                    _INST_END: self._inst_end, _DEATH: self._death,
                    _EXCHANGE: self._exchange, _TICK: self._tick, _OVERLAY: self._overlay, _SAMPLE: self._sample}
        d = self.dispatcher
        while events and not self._finished:
            t, kind, _, obj, arg = heapq.heappop(events)
            if t > sc.horizon:
                self.now = sc.horizon
                break
            self.now = t
            self.recorder.events += 1
            handlers[kind](obj, arg)
            if d.work_added != self._work_seen:
                self._wake_held()
        self._record()
        results = self.recorder.results(self.now, self.bag_ids)
        results.seed = self.seed
        view = self.dispatcher.view
        for res in results.bags:
            if (bag_id := self.bag_ids.get(res.name)) is not None:
                bill = view.bill(bag_id)
                res.spent = round(bill.total, 6)
                res.spent_per_pool = {p.pool: round(p.total, 6) for p in bill.pools}
                if (qos := self._qos.get(bag_id)) is not None:
                    res.qos = msgspec.to_builtins(qos)
                if (level := self._levels.get(bag_id)) is not None:
                    res.level = msgspec.to_builtins(level)
        return results

    def _apply(self, changes: Changes) -> None:
        if not changes:
            return
        if self.memory is not None:
            self.memory.apply(changes)
        self.compact.apply(changes)
        rec, now = self.recorder, self.now
        for n in changes.new_instances:
            pool = n.host_id.rsplit("-", 1)[0]
            self._inst_pool[n.instance_id] = (pool, n.bag_id)
            rec.sent(pool)
        for u in changes.instances:
            where = self._inst_pool.get(u.instance_id)
            if where is None:
                continue
            rec.ended(where[0], where[1], u.state, u.report.wall_s if u.report is not None else 0.0)
            if u.state is not InstanceState.OVERDUE:
                del self._inst_pool[u.instance_id]
        for b in changes.bags.values():
            rec.bag_update(b.bag_id, b.state, b.counts, now)
            if b.state is not BagState.ACTIVE:
                self.runtimes.pop(b.bag_id, None)
                h = self._factory.hierarchy  # (its place as it ended: samples miss a bag shorter than their period)
                if h is not None and (level := h.report(b.bag_id, now)) is not None:
                    self._levels[b.bag_id] = level
                kept = self._views.pop(b.bag_id, None)  # its tail plan, as its last view reads it
                if kept is not None and (tail := kept.tail_plan) is not None:
                    rec.tail_plans[b.bag_id] = msgspec.to_builtins(tail)
                if not self.dispatcher.view.bags() and self.pending_bags == 0:
                    self._finished = True

    def _feed(self) -> None:
        d = self.dispatcher
        for req in d.needs_feed():
            src = self.memory if self.memory is not None else self.compact
            d.feed(req.bag_id, src.queued_jobs(req.bag_id, req.after, req.limit), req.limit)

    # -- bags -----------------------------------------------------------------------------------------

    def _arrive(self, model: object, _: object) -> None:
        assert isinstance(model, BagModel)
        spec = BagSpec(name=model.name, command="sim {i}",
                       parameters=[Parameter("i", start="0", stop=str(model.jobs - 1), step="1")],
                       max_failures=model.max_failures, instance_deadline=model.instance_deadline,
                       policy=model.policy, strategy=model.strategy, bag_deadline=model.bag_deadline,
                       budget=model.budget)
        if self.memory is not None:
            row = self.memory.create_bag(spec, None, {}, self.now)
            bag_id, counts = row.bag_id, row.counts
        else:
            bag_id, counts = len(self.bag_ids) + 1, BagCounts(queued=model.jobs)
        self.compact.create_bag(bag_id, model.jobs)
        self.bag_ids[model.name] = bag_id
        if model.runtimes is not None:  # replayed from a log, job by job (evenly thinned when scaled down)
            runs, n = model.runtimes, len(model.runtimes)
            self.runtimes[bag_id] = array("d", (runs[i * n // model.jobs] for i in range(model.jobs)))
        else:
            rng = random.Random(f"{self.seed}:{model.name}")
            draw = model.runtime.draw
            self.runtimes[bag_id] = array("d", (draw(rng) for _ in range(model.jobs)))
        self.dispatcher.add_bag(BagSnapshot(bag_id, spec, counts, self.now))
        self._views[bag_id] = self.dispatcher.view.bag(bag_id)
        self.recorder.bag_arrived(bag_id, model, self.now)
        self.pending_bags -= 1
        self._wake_held()  # a bag submitted wakes the held requests, as the server's submit does

    # -- pools and pilots -----------------------------------------------------------------------------

    def _speed(self, p: PoolModel) -> float:
        return max(1e-3, p.speed.sample(self.rng))

    def _resize(self, pool_obj: object, size: object) -> None:
        pool = pool_obj
        assert isinstance(pool, _PoolRt)
        fl = pool.model.fluctuate
        if fl is not None:
            pool.size = self.rng.randint(fl[0], fl[1])
            self._at(self.now + fl[2], _RESIZE, pool, None)
        else:
            assert isinstance(size, int)
            pool.size = size
        excess = pool.running - pool.size
        if excess > 0:  # the pool shrank: the grid takes nodes back, pilots die without a word
            for pilot in self.rng.sample(list(pool.pilots.values()), excess):
                self._kill(pilot)
        if pool.model.volunteer:
            for _ in range(pool.size - pool.running - pool.queued):
                self._submit(pool)

    def _repair(self, pool_obj: object, machine: object) -> None:
        assert isinstance(pool_obj, _PoolRt) and isinstance(machine, _Machine)
        pool_obj.free.append(machine)

    def _submit(self, pool: _PoolRt) -> None:
        self._enqueue(pool, pool.model.queue_wait.sample(self.rng))

    def _enqueue(self, pool: _PoolRt, wait: float) -> None:
        """A pilot joins the pool's queue and tries to start after `wait`."""
        self._tickets += 1
        pool.queue[self._tickets] = self.now
        self._at(self.now + wait, _PILOT_UP, pool, self._tickets)

    def _pilot_up(self, pool_obj: object, ticket: object) -> None:
        pool = pool_obj
        assert isinstance(pool, _PoolRt) and isinstance(ticket, int)
        if ticket not in pool.queue:  # cancelled while it waited
            return
        if pool.running >= pool.size:  # no room yet: the pilot stays queued
            self._at(self.now + max(60.0, self.sc.overlay_interval), _PILOT_UP, pool, ticket)
            return
        free = pool.free
        if not free:
            self._at(self.now + max(60.0, self.sc.overlay_interval), _PILOT_UP, pool, ticket)
            return
        del pool.queue[ticket]
        i = int(self.rng.random() * len(free))
        machine = free[i]
        free[i] = free[-1]
        free.pop()
        self._pilot_ids += 1
        info = msgspec.structs.replace(machine.info, session=f"pilot-{self._pilot_ids}")
        pilot = _Pilot(machine, pool, self.now, self._pilot_ids, info, Pacing(pool.pace))
        pilot.pacing.begin(self.now)
        pool.pilots[pilot.number] = pilot
        m = pool.model
        if m.availability is not None:  # a volunteer leaving, or a machine failing under the pilot
            self._at(self.now + m.availability.sample(self.rng), _DEATH, pilot,
                     "leave" if m.volunteer else "failure")
        if not m.volunteer:
            self._at(self.now + m.spec.walltime * _WALLTIME_SHARE, _DEATH, pilot, "walltime")
            if m.preemption is not None:
                self._at(self.now + m.preemption.sample(self.rng), _DEATH, pilot, "preempted")
        self._exchange_at(pilot, self.now)

    def _death(self, pilot_obj: object, why: object) -> None:
        pilot = pilot_obj
        assert isinstance(pilot, _Pilot)
        if not pilot.alive:
            return
        if why == "walltime":  # the worker's goodbye: its jobs are given back
            reports = [*pilot.outbox, *(InstanceReport(iid, Outcome.INTERRUPTED, reason="pilot lifetime reached")
                                        for iid in [*pilot.running, *pilot.waiting])]
            for iid in pilot.running:
                self._stop(pilot, iid)
            pilot.outbox = []
            pilot.running.clear()
            pilot.waiting.clear()
            _, changes = self.dispatcher.request_work(pilot.info, 0, [], self.now, reports)
            self._apply(changes)
        self._kill(pilot, repair=why == "failure")

    def _stop(self, pilot: _Pilot, iid: int) -> None:
        """An instance ends on its host before its time (killed, cancelled): count the time it ran."""
        _, wall, bag_id, start = pilot.outcome.pop(iid)
        self.recorder.cpu(bag_id, min(wall, max(0.0, self.now - start)))

    def _kill(self, pilot: _Pilot, repair: bool = False) -> None:
        """The pilot is gone; what it held is lost until the server notices (host timeout or deadline).
        With `repair`, its machine failed and stays out of service for the pool's unavailability."""
        pilot.alive = False
        self._held.pop(pilot, None)
        for iid in pilot.running:
            self._stop(pilot, iid)
        pool = pilot.pool
        del pool.pilots[pilot.number]
        if repair and not pool.model.volunteer:
            self._at(self.now + pool.model.unavailability.sample(self.rng), _REPAIR, pool, pilot.machine)
        else:
            pool.free.append(pilot.machine)
        if pool.model.volunteer and pool.running + pool.queued < pool.size:
            # the same kind of host comes back after being away
            self._enqueue(pool, pool.model.unavailability.sample(self.rng))

    # -- a host's side of the protocol ------------------------------------------------------------------

    def _exchange_at(self, pilot: _Pilot, t: float) -> None:
        pilot.gen += 1
        self._at(t, _EXCHANGE, pilot, pilot.gen)

    def _latency(self, pilot: _Pilot) -> float:
        lat = pilot.pool.model.latency
        return self.sc.latency if lat is None else lat

    def _exchange(self, pilot_obj: object, gen: object) -> None:
        """The time the host's pacing set has come: it talks to the server, or leaves, or waits on."""
        pilot = pilot_obj
        assert isinstance(pilot, _Pilot)
        if not pilot.alive or gen != pilot.gen:
            return
        now = self.now
        if pilot.held:  # the server let its held request go with no work and no backoff
            del self._held[pilot]
            pilot.pacing.answered(now, pilot.held, 0, 0.0, self.sc.heartbeat, self.rng.uniform)
            pilot.held = 0
        step = pilot.pacing.step(now, len(pilot.running), len(pilot.waiting),
                                 pilot.reports_since if pilot.outbox else None)
        if step.leave:
            self._kill(pilot)  # the worker exits, as the real pilot does when it gets no work
            return
        if step.at > now:
            self._exchange_at(pilot, step.at)
            return
        if step.prefetch != pilot.info.prefetch:
            pilot.info = msgspec.structs.replace(pilot.info, prefetch=step.prefetch)
        reports, pilot.outbox = pilot.outbox, []
        held = [*pilot.running, *pilot.waiting]
        self._feed()
        answer, changes = self.dispatcher.request_work(pilot.info, step.want, held, now, reports)
        self._apply(changes)
        hold = None
        if not pilot.pool.model.volunteer:  # a BOINC server answers at once
            hold = server_hold(step.want, len(held), len(reports), len(answer.assignments), len(answer.cancel),
                               answer.backoff)
        if hold:
            pilot.held = step.want
            self._held[pilot] = None
            self._exchange_at(pilot, now + hold)
        else:
            self._receive(pilot, step.want, answer.assignments, answer.cancel, 0.0 if hold == 0.0 else answer.backoff)

    def _receive(self, pilot: _Pilot, want: int, assignments: list[Assignment], cancel: list[int],
                 backoff: float) -> None:
        """The answer reaches the host: it kills what is cancelled, starts what it was sent after the
        latency, and sets the time of its next exchange."""
        now = self.now
        for iid in cancel:
            if pilot.running.pop(iid, None) is not None:
                self._stop(pilot, iid)
            pilot.waiting.pop(iid, None)
        start = now + self._latency(pilot)
        slots = pilot.info.slots
        for a in assignments:
            if len(pilot.running) < slots:
                self._start(pilot, a.instance_id, a.bag_id, a.index, start)
            else:
                pilot.waiting[a.instance_id] = (a.bag_id, a.index)
        self._fill(pilot, start)
        pilot.pacing.answered(now, want, len(assignments), backoff, self.sc.heartbeat, self.rng.uniform)
        self._pace(pilot, now + _AGAIN)

    def _pace(self, pilot: _Pilot, earliest: float) -> None:
        """Set the host's next exchange when its pacing says, not before `earliest`."""
        step = pilot.pacing.step(self.now, len(pilot.running), len(pilot.waiting),
                                 pilot.reports_since if pilot.outbox else None)
        self._exchange_at(pilot, max(self.now if step.leave else step.at, earliest))

    def _wake_held(self) -> None:
        """Work was added: the server answers the held requests of idle hosts again, at once."""
        self._work_seen = self.dispatcher.work_added
        held, self._held = self._held, {}
        for pilot in held:
            want, pilot.held = pilot.held, 0
            self._feed()
            answer, changes = self.dispatcher.request_work(pilot.info, want, [], self.now, [])
            self._apply(changes)
            self._receive(pilot, want, answer.assignments, answer.cancel, answer.backoff)

    def _inst_end(self, pilot_obj: object, iid_obj: object) -> None:
        pilot, iid = pilot_obj, iid_obj
        assert isinstance(pilot, _Pilot) and isinstance(iid, int)
        if not pilot.alive or pilot.running.pop(iid, None) is None:
            return
        outcome, wall, bag_id, _ = pilot.outcome.pop(iid)
        self.recorder.cpu(bag_id, wall)
        pilot.pacing.ran(wall)
        report = InstanceReport(iid, outcome, 0 if outcome is Outcome.SUCCESS else 1, wall, wall,
                                "" if outcome is Outcome.SUCCESS else "exit code 1")
        if not pilot.outbox:
            pilot.reports_since = self.now
        pilot.outbox.append(report)
        self._fill(pilot, self.now)
        self._pace(pilot, self.now + self._latency(pilot))

    def _fill(self, pilot: _Pilot, at: float) -> None:
        """Start prefetched instances on free slots, oldest first."""
        while pilot.waiting and len(pilot.running) < pilot.info.slots:
            iid = next(iter(pilot.waiting))
            bag_id, index = pilot.waiting.pop(iid)
            self._start(pilot, iid, bag_id, index, at)

    def _start(self, pilot: _Pilot, iid: int, bag_id: int, index: int, at: float) -> None:
        """Run an instance on the pilot's host from `at`: how long it takes and how it ends are drawn here."""
        machine, model = pilot.machine, pilot.pool.model
        work = self.runtimes[bag_id][index] / machine.speed
        if machine.black_hole:
            outcome, wall = Outcome.FAILURE, self.rng.uniform(*_QUICK_FAILURE)
        elif model.failure_rate and self.rng.random() < model.failure_rate:
            outcome, wall = Outcome.FAILURE, self.rng.uniform(0.0, work)
        else:
            outcome, wall = Outcome.SUCCESS, work
        turnaround = wall
        if model.turnaround_ratio.mean < 1.0:
            # a volunteer host shares its time with other projects and is off at times: its result comes
            # back after execution time / ratio (GridBot section 7: the ratio varies from 0.01 to 1)
            turnaround = wall / min(1.0, max(1e-3, model.turnaround_ratio.sample(self.rng)))
        pilot.running[iid] = at + turnaround
        pilot.outcome[iid] = (outcome, wall, bag_id, at)
        self._at(at + turnaround, _INST_END, pilot, iid)

    # -- the server's periodic work ---------------------------------------------------------------------

    def _tick(self, _: object, __: object) -> None:
        self._apply(self.dispatcher.tick(self.now))
        self._at(self.now + self.sc.tick, _TICK)

    def _overlay(self, _: object, __: object) -> None:
        """The overlay constructor's step: the max-flow plan of the server, on the simulated pools."""
        d = self.dispatcher
        submitted = [p for p in self.pools.values() if not p.model.volunteer]
        demands = bag_demands(d.view, [p.model.name for p in submitted], self.now)
        hosts = host_slots(d.view, self.now)
        capacity = [pool_capacity(p.model.spec, p.queued, p.running, hosts.get(p.model.name, (0, 0)), True,
                                  max_running=p.size) for p in submitted]
        decision = plan(demands, capacity)
        for name, n in decision.submit.items():
            for _ in range(n):
                self._submit(self.pools[name])
        for name, n in decision.cancel.items():
            queue = self.pools[name].queue
            for ticket in pilots_to_cancel(list(queue), n):  # the very pilots the server would cancel
                del queue[ticket]
        self._at(self.now + self.sc.overlay_interval, _OVERLAY)

    def _sample(self, _: object, __: object) -> None:
        self._record()
        self._at(self.now + self.sc.sample, _SAMPLE)

    def _record(self) -> None:
        for b in self.dispatcher.view.bags():
            if (qos := self.dispatcher.qos(b.bag_id, self.now)) is not None:
                self._qos[b.bag_id] = qos
            if (level := self.dispatcher.level(b.bag_id, self.now)) is not None:
                self._levels[b.bag_id] = level
        self.recorder.sample(self.now, {n: p.running for n, p in self.pools.items()},
                             {n: sum(len(x.running) for x in p.pilots.values()) for n, p in self.pools.items()})
        if self.progress is not None:
            self.progress(self.now, self.recorder.jobs_ended, self.total_jobs)


def simulate(scenario: Scenario, seed: int | None = None,
             progress: Callable[[float, int, int], None] | None = None) -> Results:
    """Run a scenario once; the same scenario and seed always give the same Results."""
    return Simulation(scenario, seed, progress).run()

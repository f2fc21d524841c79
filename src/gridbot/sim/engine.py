"""The discrete-event simulator: the real dispatcher, policies and overlay planner on a virtual clock.

Simulated pilots land on simulated hosts and talk to the very `Dispatcher` the server runs, through the
same calls (`request_work` with reports and the held-instance list, `tick`, `needs_feed`/`feed`), and
every `Changes` is applied to a store before the next event, as the server does. Pools submit pilots by
the overlay's own max-flow plan (`schedulers.overlay`). Nothing sleeps and nothing reads the wall clock:
a run is a pure function of its scenario and seed.

What is modelled, per pool: its size over time, pilots' queue waits, host speeds, silent preemption of
pilots, job failures (as often on every machine, or unevenly: `failure_spread`), black-hole hosts, a community
grid's late reports (execution/turnaround ratio) and hosts that come and go by themselves, speaking BOINC's
scheduler RPC (`sim.boinc`: a work buffer asked for in seconds, results reported in batches, backoff, deadlines;
answered by the BOINC door's own arithmetic), network latency, pilot walltime and idle exit. A worker paces its
exchanges as the worker does (the same `model.pacing.Pacing`), and the server's long poll is modelled: an
idle host's request is held until work is added or its backoff has passed (`model.pacing.server_hold`).
A pilot's instances hold their bag's `cpus` slots each, as the worker's do.

A cluster pool (`cluster_cpus`) is a batch cluster of that many CPUs with one first-come-first-served queue:
each pilot is a batch job of the pool's `cpus` that joins the queue once its `queue_wait` (the submission)
has passed and starts when it is at the head and the CPUs are free, as do other users' jobs (`external`);
starts follow the events that free CPUs, so queue times are exact. A pool with a `monitor_interval` is read
that often by a simulated monitor whose readings go to the dispatcher (`Dispatcher.monitor`), as the server's
overlay gives it Slurm's: work that started less than `monitor_lag` before a reading is not in it (the RENCI
report's MDS hysteresis, its Protocol 2), ended work leaves it at once.
"""

from __future__ import annotations

import bisect
import heapq
import random
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import msgspec

from gridbot.core.changes import BagCounts, BagSnapshot, Changes, QueuedJob
from gridbot.core.dispatcher import Dispatcher
from gridbot.core.strategy import LevelReport, QosReport
from gridbot.core.view import BagView
from gridbot.model.pacing import PaceConfig, Pacing, Step, server_hold
from gridbot.model.pools import PoolMonitor
from gridbot.model.records import Assignment, HostInfo, InstanceReport, Outcome
from gridbot.model.spec import BagSpec, Parameter
from gridbot.model.states import BagState, InstanceState, JobState
from gridbot.model.volunteer import empty_delay, instances_for, rpc_delay, runtime_estimate, volunteer_prefetch
from gridbot.schedulers import registry
from gridbot.schedulers.overlay import bag_demands, host_slots, pilots_to_cancel, plan, pool_capacity, stale_count
from gridbot.sim.boinc import BoincClient
from gridbot.sim.metrics import ClusterResult, Recorder, Results
from gridbot.sim.scenario import BagModel, PoolModel, Scenario
from gridbot.store.memory import MemoryStore

# event kinds, in the order they run when due at the same moment (a cluster frees CPUs before pilots queue for
# them; a monitor reading is taken before the tick whose placements read it)
(_ARRIVE, _RESIZE, _REPAIR, _EXT_END, _EXT_ARRIVE, _PILOT_UP, _INST_END, _DEATH, _SESSION, _EXCHANGE, _MONITOR, _TICK,
 _OVERLAY, _SAMPLE) = range(14)
_WALLTIME_SHARE = 0.9
"""A pilot's worker stops at this share of its walltime (the real pilot's --lifetime)."""
_QUICK_FAILURE = (1.0, 5.0)
"""A black hole fails each job this many seconds after it starts."""
_AGAIN = 0.001
"""Least time from an answer to the host's next exchange (with a backoff of 0, not at the same instant)."""


@dataclass(eq=False)
class _Machine:
    info: HostInfo
    speed: float
    black_hole: bool
    unreliability: float = 1.0
    """This machine's failure_rate over its pool's, and what its pilots' lives are divided by (`failure_spread`)."""


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
    width: dict[int, int] = field(default_factory=dict)
    """Instance id → slots it holds (its bag's `cpus`, at most the host's slots), running or waiting."""
    busy: int = 0
    """Slots the running instances hold."""
    queued: int = 0
    """Slots the waiting instances will hold."""
    taken: int = 0
    """Instances it was sent (a pool's `jobs_per_pilot` ends it after so many)."""
    client: BoincClient | None = None
    """A community pool's host: the stock BOINC client's side of the scheduler RPC (`sim.boinc`)."""
    estimate: dict[int, float] = field(default_factory=dict)
    """A BOINC host's instance id → the run time the server estimated when it sent it (the client's buffer)."""
    deadline: dict[int, float] = field(default_factory=dict)
    """A BOINC host's instance id → its report deadline (a queued one not started by then is aborted)."""


@dataclass(eq=False)
class _External:
    """One batch job of another user on a cluster pool."""

    cpus: int
    runtime: float
    submitted: float = 0.0
    started: float | None = None


@dataclass(eq=False)
class _Cluster:
    """A cluster pool's CPUs and its first-come-first-served queue, with what its `ClusterResult` reports."""

    cpus: int
    width: int
    """CPUs of one of gridbot's pilots (the pool's `cpus`)."""
    fifo: deque[int | _External] = field(default_factory=deque)
    """Pilot tickets (of the pool's queue) and other users' jobs, in the order they were submitted."""
    running: dict[_External, None] = field(default_factory=dict)
    """Other users' jobs running."""
    used: int = 0
    ours: int = 0
    """CPUs held by gridbot's pilots (of `used`)."""
    last: float = 0.0
    saturated_at: float | None = None
    latency: float = 0.0
    cpu_ours: float = 0.0
    cpu_external: float = 0.0
    external_started: int = 0
    external_wait: float = 0.0
    queued_max: int = 0
    pilots: int = 0

    def advance(self, now: float) -> None:
        """Count the CPU-seconds since the last change (before `used` changes at `now`)."""
        span = now - self.last
        if span > 0:
            self.cpu_ours += span * self.ours
            self.cpu_external += span * (self.used - self.ours)
            if self.saturated_at is None:
                self.latency += span * (self.cpus - self.used)
            self.last = now

    def take(self, cpus: int, ours: bool, now: float) -> None:
        """A batch job of `cpus` starts: the first time the cluster has no room for another pilot, it is saturated."""
        self.advance(now)
        self.used += cpus
        if ours:
            self.ours += cpus
        if self.saturated_at is None and self.cpus - self.used < self.width:
            self.saturated_at = now

    def give(self, cpus: int, ours: bool, now: float) -> None:
        """A batch job of `cpus` ends: its CPUs are free at once."""
        self.advance(now)
        self.used -= cpus
        if ours:
            self.ours -= cpus


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
    """Machines with no pilot on them (not kept for named volunteers, which come back by their trace)."""
    online: set[_Machine] = field(default_factory=set)
    """Named volunteers online (`PoolModel.sessions`)."""
    cluster: _Cluster | None = None
    """Its CPUs and batch queue, when it is a cluster pool (`cluster_cpus`)."""

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
        self.dispatcher.pool_ads = {p.name: {"Speed": p.speed.mean, **p.spec.ad(), "Startup": p.queue_wait.mean}
                                    for p in scenario.pools}
        self.memory = MemoryStore() if scenario.store == "memory" else None
        self.compact = CompactStore()
        self.progress = progress
        self.now = 0.0
        self._events: list[tuple[float, int, int, object, object]] = []
        self._seq = 0
        self.pools: dict[str, _PoolRt] = {}
        self._pool_of: dict[str, str] = {}
        """Host id -> its pool's name."""
        for p in scenario.pools:
            machines = []
            # a named volunteer is POOL:NAME (':' is in no pool's name, so it is no other pool's host), a
            # numbered host POOL-N
            ids = ([f"{p.name}:{name}" for name in sorted({s.host for s in p.sessions})] if p.sessions
                   else [f"{p.name}-{n}" for n in range(p.hosts)])
            for host_id in ids:
                self._pool_of[host_id] = p.name
                info = HostInfo(host_id, host_id, "sim", p.spec.cpus, 0, p.spec.cpus, p.name, p.prefetch)
                machine = _Machine(info, self._speed(p), self.rng.random() < p.black_holes)
                machine.unreliability = p.machine_factor(self.rng)
                machines.append(machine)
            # a pilot is a worker started with the pool's --prefetch and --idle-timeout (a volunteer is a BOINC
            # client, paced by `sim.boinc` instead)
            pace = PaceConfig(p.spec.cpus, p.prefetch, idle_timeout=0.0 if p.volunteer else p.spec.idle_timeout,
                              leave_refused=True)
            cluster = _Cluster(p.cluster_cpus, p.spec.cpus) if p.cluster_cpus else None
            self.pools[p.name] = _PoolRt(p, machines, pace, free=[] if p.sessions else list(machines), cluster=cluster)
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
        self._monitor_rng = random.Random(f"{self.seed}:monitor")
        """The monitors' lags are drawn apart, so that reading pools changes no other draw of a run."""

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
            if m.sessions:  # named volunteers come and go when their trace says, each on its own machine
                machine = {mc.info.name: mc for mc in pool.machines}
                for s in m.sessions:
                    self._at(s.start, _SESSION, pool, (machine[f"{m.name}:{s.host}"], s.end))
            elif m.fluctuate:
                self._at(0.0, _RESIZE, pool, None)
            else:
                for step in m.size:
                    self._at(step.at, _RESIZE, pool, step.size)
            if m.monitor_interval:
                self._at(0.0, _MONITOR, pool)
            rng = random.Random(f"{self.seed}:{m.name}:external")
            for load in m.external:
                for k in range(load.count):
                    runtime = load.runtime.sample(rng)  # drawn even past the horizon: the next load's draws stay
                    if load.at + k * load.every <= sc.horizon:
                        self._at(load.at + k * load.every, _EXT_ARRIVE, pool, _External(load.cpus, runtime))
        self._at(sc.tick, _TICK)
        self._at(0.0, _OVERLAY)
        self._at(0.0, _SAMPLE)
        events = self._events
        handlers = {_ARRIVE: self._arrive, _RESIZE: self._resize, _SESSION: self._session, _REPAIR: self._repair,
                    _PILOT_UP: self._pilot_up,
                    _INST_END: self._inst_end, _DEATH: self._death,
                    _EXCHANGE: self._exchange, _TICK: self._tick, _OVERLAY: self._overlay, _SAMPLE: self._sample,
                    _EXT_ARRIVE: self._ext_arrive, _EXT_END: self._ext_end, _MONITOR: self._monitor}
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
        for bag in self.dispatcher.view.bags():  # unfinished at the horizon: what it says now
            self.recorder.diagnostics[bag.bag_id] = self.dispatcher.diagnostics(bag.bag_id, self.now)
        results = self.recorder.results(self.now, self.bag_ids)
        results.seed = self.seed
        results.clusters = [self._cluster_result(p) for p in self.pools.values() if p.cluster is not None]
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
            pool = self._pool_of[n.host_id]
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
                rec.diagnostics[b.bag_id] = self.dispatcher.diagnostics(b.bag_id, now)  # (as it ended)
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
                       budget=model.budget, cpus=model.cpus)
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
        self._feed()  # as the server's submit reads the new bag's first jobs (a placement places them from there)
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
        if pool.cluster is not None:
            self._cluster_start(pool)

    def _repair(self, pool_obj: object, machine: object) -> None:
        assert isinstance(pool_obj, _PoolRt) and isinstance(machine, _Machine)
        pool_obj.free.append(machine)
        if pool_obj.cluster is not None:
            self._cluster_start(pool_obj)

    def _submit(self, pool: _PoolRt) -> None:
        self._enqueue(pool, pool.model.queue_wait.sample(self.rng))

    def _enqueue(self, pool: _PoolRt, wait: float) -> None:
        """A pilot joins the pool's queue and tries to start after `wait`."""
        self._tickets += 1
        pool.queue[self._tickets] = self.now
        if pool.cluster is not None:
            pool.cluster.queued_max = max(pool.cluster.queued_max, len(pool.queue))
        self._at(self.now + wait, _PILOT_UP, pool, self._tickets)

    def _pilot_up(self, pool_obj: object, ticket: object) -> None:
        pool = pool_obj
        assert isinstance(pool, _PoolRt) and isinstance(ticket, int)
        if ticket not in pool.queue:  # cancelled while it waited
            return
        if pool.cluster is not None:  # submitted: it joins the cluster's queue
            pool.cluster.fifo.append(ticket)
            self._cluster_start(pool)
            return
        if pool.running >= pool.size:  # no room yet: the pilot stays queued
            self._at(self.now + max(60.0, self.sc.overlay_interval), _PILOT_UP, pool, ticket)
            return
        if not pool.free:
            self._at(self.now + max(60.0, self.sc.overlay_interval), _PILOT_UP, pool, ticket)
            return
        self._launch(pool, ticket)

    def _session(self, pool_obj: object, session: object) -> None:
        """A named volunteer comes online (`PoolModel.sessions`): on its own machine, until its session's end."""
        assert isinstance(pool_obj, _PoolRt) and isinstance(session, tuple)
        machine, end = session
        if machine in pool_obj.online:  # not in a trace read by `traces.host_sessions`, which merges such
            return
        pool_obj.online.add(machine)
        pool_obj.size += 1  # the hosts online: what the pool's monitor reads
        pilot = self._land(pool_obj, machine)
        self._at(end, _DEATH, pilot, "leave")

    def _launch(self, pool: _PoolRt, ticket: int) -> None:
        """The queued pilot `ticket` lands on a free machine of the pool and its worker starts."""
        free = pool.free
        del pool.queue[ticket]
        i = int(self.rng.random() * len(free))
        machine = free[i]
        free[i] = free[-1]
        free.pop()
        self._land(pool, machine)

    def _land(self, pool: _PoolRt, machine: _Machine) -> _Pilot:
        """A pilot (or a volunteer's client) starts on `machine`, which the caller took for it."""
        self._pilot_ids += 1
        info = msgspec.structs.replace(machine.info, session=f"pilot-{self._pilot_ids}")
        pilot = _Pilot(machine, pool, self.now, self._pilot_ids, info, Pacing(pool.pace))
        pilot.pacing.begin(self.now)
        pool.pilots[pilot.number] = pilot
        m = pool.model
        if m.volunteer:
            pilot.client = BoincClient(m.client, m.spec.cpus)
        if m.availability is not None:  # a volunteer leaving, or a machine failing under the pilot
            self._at(self.now + m.availability.sample(self.rng), _DEATH, pilot,
                     "leave" if m.volunteer else "failure")
        if not m.volunteer:
            self._at(self.now + m.spec.walltime * _WALLTIME_SHARE, _DEATH, pilot, "walltime")
            if m.preemption is not None:
                life = m.preemption.sample(self.rng) / max(machine.unreliability, 1e-9)
                self._at(self.now + life, _DEATH, pilot, "preempted")
        self._exchange_at(pilot, self.now)
        return pilot

    # -- cluster pools and their monitors ------------------------------------------------------------

    def _cluster_start(self, pool: _PoolRt) -> None:
        """Start the batch jobs at the head of the cluster's queue while its CPUs (and, for a pilot, the pool's
        size and machines) allow: first come, first served, the head blocking those behind it."""
        c = pool.cluster
        assert c is not None
        now = self.now
        while c.fifo:
            head = c.fifo[0]
            if isinstance(head, int):
                if head not in pool.queue:  # cancelled by the overlay while it queued
                    c.fifo.popleft()
                    continue
                if c.cpus - c.used < c.width or pool.running >= pool.size or not pool.free:
                    return
                c.fifo.popleft()
                c.take(c.width, True, now)
                c.pilots += 1
                self._launch(pool, head)
                continue
            if c.cpus - c.used < head.cpus:
                return
            c.fifo.popleft()
            c.take(head.cpus, False, now)
            head.started = now
            c.running[head] = None
            c.external_started += 1
            c.external_wait += now - head.submitted
            self._at(now + head.runtime, _EXT_END, pool, head)

    def _ext_arrive(self, pool_obj: object, job: object) -> None:
        """Another user's job is submitted to a cluster pool."""
        assert isinstance(pool_obj, _PoolRt) and isinstance(job, _External) and pool_obj.cluster is not None
        job.submitted = self.now
        pool_obj.cluster.fifo.append(job)
        self._cluster_start(pool_obj)

    def _ext_end(self, pool_obj: object, job: object) -> None:
        """Another user's job ends: its CPUs go to the head of the queue."""
        assert isinstance(pool_obj, _PoolRt) and isinstance(job, _External) and pool_obj.cluster is not None
        c = pool_obj.cluster
        del c.running[job]
        c.give(job.cpus, False, self.now)
        self._cluster_start(pool_obj)

    def _monitor(self, pool_obj: object, _: object) -> None:
        """A reading of the pool's simulated monitor, given to the dispatcher as the server's overlay gives it a
        real one: free CPUs count as busy only the work that started at least the lag before now."""
        pool = pool_obj
        assert isinstance(pool, _PoolRt)
        m, now = pool.model, self.now
        lag = max(0.0, m.monitor_lag.sample(self._monitor_rng)) if m.monitor_lag is not None else 0.0
        seen = now - lag
        width = m.spec.cpus
        busy = width * sum(1 for p in pool.pilots.values() if p.started <= seen)
        c = pool.cluster
        if c is not None:
            total = c.cpus
            busy += sum(j.cpus for j in c.running if j.started is not None and j.started <= seen)
            waiting = [width if isinstance(x, int) else x.cpus for x in c.fifo
                       if not isinstance(x, int) or x in pool.queue]
        else:
            total = pool.size * width
            waiting = [width] * len(pool.queue)
        self.dispatcher.monitor(m.name, PoolMonitor(
            free_cpus=max(0, total - busy), total_cpus=total, pending_jobs=len(waiting), pending_cpus=sum(waiting),
            observed_at=now, lag=lag, source=f"simulated monitor, lag {lag:.0f} s"))
        self._at(now + m.monitor_interval, _MONITOR, pool)

    def _cluster_result(self, pool: _PoolRt) -> ClusterResult:
        """What a cluster pool's CPUs did, counted up to the end of the run."""
        c = pool.cluster
        assert c is not None
        c.advance(self.now)
        return ClusterResult(pool.model.name, c.cpus, c.saturated_at, round(c.latency, 3), round(c.cpu_ours, 3),
                             round(c.cpu_external, 3), c.external_started, round(c.external_wait, 3), c.queued_max,
                             c.pilots)

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
            pilot.width.clear()
            pilot.busy = pilot.queued = 0
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
        if pool.model.sessions:  # a named volunteer: back when its trace says
            pool.online.discard(pilot.machine)
            pool.size -= 1
        elif repair and not pool.model.volunteer:
            self._at(self.now + pool.model.unavailability.sample(self.rng), _REPAIR, pool, pilot.machine)
        else:
            pool.free.append(pilot.machine)
        if pool.model.volunteer and not pool.model.sessions and pool.running + pool.queued < pool.size:
            # the same kind of host comes back after being away
            self._enqueue(pool, pool.model.unavailability.sample(self.rng))
        if pool.cluster is not None:  # its batch job ended: the CPUs go to the head of the queue
            pool.cluster.give(pool.cluster.width, True, self.now)
            self._cluster_start(pool)

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
        if pilot.client is not None:
            self._rpc(pilot, pilot.client)
            return
        now = self.now
        if pilot.held:  # the server let its held request go with no work and no backoff
            del self._held[pilot]
            pilot.pacing.answered(now, pilot.held, 0, 0.0, self.sc.heartbeat, self.rng.uniform)
            pilot.held = 0
        done = self._done_taking(pilot)
        if done and not pilot.running and not pilot.waiting and not pilot.outbox:
            self._kill(pilot)  # its batch job ran its jobs: it exits
            return
        step = self._step(pilot, done)
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
                               answer.backoff, answer.refused)
        if hold:
            pilot.held = step.want
            self._held[pilot] = None
            self._exchange_at(pilot, now + hold)
        else:
            self._receive(pilot, step.want, answer.assignments, answer.cancel, 0.0 if hold == 0.0 else answer.backoff,
                          answer.refused)

    def _buffered(self, pilot: _Pilot) -> tuple[float, int]:
        """A BOINC host's work held, in estimated seconds (what is left of its running jobs and the whole of the
        queued ones), and its idle CPUs: what its next request is made of."""
        now, est = self.now, pilot.estimate
        held = sum(est.get(iid, 0.0) for iid in pilot.waiting)
        held += sum(max(0.0, est.get(iid, 0.0) - (now - pilot.outcome[iid][3])) for iid in pilot.running)
        return held, max(0, pilot.info.slots - pilot.busy - pilot.queued)

    def _rpc_due(self, pilot: _Pilot, client: BoincClient) -> tuple[float, float, int]:
        """When the BOINC host's next scheduler RPC is due, with the work it holds and its idle CPUs now."""
        held, idle = self._buffered(pilot)
        ready = pilot.reports_since if pilot.outbox else None
        deadline = min((pilot.deadline.get(r.instance_id, float("inf")) for r in pilot.outbox), default=None)
        return client.next_rpc(self.now, held, idle, ready, deadline), held, idle

    def _rpc(self, pilot: _Pilot, client: BoincClient) -> None:
        """A BOINC host's scheduler RPC, if one is due: its ready results, the results it holds, a request of so
        many seconds of work, turned into instances and answered as gridbot's BOINC door does."""
        now = self.now
        due, held_s, idle = self._rpc_due(pilot, client)
        if due > now:
            self._exchange_at(pilot, due)
            return
        seconds, cpus = client.request(held_s, idle)
        d, m = self.dispatcher, pilot.pool.model
        est = runtime_estimate([b.mean_run_time for b in d.view.bags()], m.runtime_estimate)
        want = instances_for(seconds, 0.0, cpus, est, d.config.max_assign)
        prefetch = volunteer_prefetch(want, pilot.info.slots)
        if prefetch != pilot.info.prefetch:
            pilot.info = msgspec.structs.replace(pilot.info, prefetch=prefetch)
        reports, pilot.outbox = pilot.outbox, []
        for r in reports:
            pilot.deadline.pop(r.instance_id, None)
        self._feed()
        answer, changes = d.request_work(pilot.info, want, [*pilot.running, *pilot.waiting], now, reports)
        self._apply(changes)
        for a in answer.assignments:
            pilot.estimate[a.instance_id] = est
            pilot.deadline[a.instance_id] = now + a.instance_deadline
        self._take(pilot, answer.assignments, answer.cancel)
        got = len(answer.assignments)
        client.answered(now, want > 0, got, empty_delay(answer.backoff) if want and not got else 0.0,
                        rpc_delay(m.next_rpc_delay, self.sc.dispatch.host_timeout), self.rng.uniform)
        self._exchange_at(pilot, max(self._rpc_due(pilot, client)[0], now + _AGAIN))

    def _receive(self, pilot: _Pilot, want: int, assignments: list[Assignment], cancel: list[int],
                 backoff: float, refused: bool = False) -> None:
        """The answer reaches the host: it kills what is cancelled, starts what it was sent after the
        latency, and sets the time of its next exchange (or leaves, `refused` and holding nothing)."""
        now = self.now
        self._take(pilot, assignments, cancel)
        pilot.pacing.answered(now, want, len(assignments), backoff, self.sc.heartbeat, self.rng.uniform, refused)
        self._pace(pilot, now + _AGAIN)

    def _take(self, pilot: _Pilot, assignments: list[Assignment], cancel: list[int]) -> None:
        """The host kills what is cancelled, and starts what it was sent after the latency (or queues it)."""
        now = self.now
        for iid in cancel:
            if pilot.running.pop(iid, None) is not None:
                pilot.busy -= pilot.width.pop(iid, 1)
                self._stop(pilot, iid)
            if pilot.waiting.pop(iid, None) is not None:
                pilot.queued -= pilot.width.pop(iid, 1)
            pilot.estimate.pop(iid, None)
            pilot.deadline.pop(iid, None)
        start = now + self._latency(pilot)
        slots = pilot.info.slots
        pilot.taken += len(assignments)
        for a in assignments:
            width = pilot.width[a.instance_id] = min(a.cpus, slots)
            if pilot.busy + width <= slots:
                self._start(pilot, a.instance_id, a.bag_id, a.index, start)
            else:
                pilot.waiting[a.instance_id] = (a.bag_id, a.index)
                pilot.queued += width
        self._fill(pilot, start)

    def _done_taking(self, pilot: _Pilot) -> bool:
        """The pilot was sent its pool's `jobs_per_pilot` instances: it takes no more, and exits once they ended."""
        limit = pilot.pool.model.jobs_per_pilot
        return bool(limit) and pilot.taken >= limit

    def _step(self, pilot: _Pilot, done: bool) -> Step:
        """The host's pacing now; a pilot done taking work paces as a full one (it asks for none)."""
        busy = pilot.info.slots if done else pilot.busy
        return pilot.pacing.step(self.now, busy, pilot.queued, pilot.reports_since if pilot.outbox else None)

    def _pace(self, pilot: _Pilot, earliest: float) -> None:
        """Set the host's next exchange when its pacing says, not before `earliest`."""
        if pilot.client is not None:
            self._exchange_at(pilot, max(self._rpc_due(pilot, pilot.client)[0], earliest))
            return
        done = self._done_taking(pilot)
        if done and not pilot.running and not pilot.waiting and not pilot.outbox:
            self._exchange_at(pilot, earliest)  # (where it exits)
            return
        step = self._step(pilot, done)
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
            self._receive(pilot, want, answer.assignments, answer.cancel, answer.backoff, answer.refused)

    def _inst_end(self, pilot_obj: object, iid_obj: object) -> None:
        pilot, iid = pilot_obj, iid_obj
        assert isinstance(pilot, _Pilot) and isinstance(iid, int)
        if not pilot.alive or pilot.running.pop(iid, None) is None:
            return
        pilot.busy -= pilot.width.pop(iid, 1)
        pilot.estimate.pop(iid, None)
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
        """Start prefetched instances on free slots, oldest first (the oldest waits for room, as the worker's)."""
        while pilot.waiting:
            iid = next(iter(pilot.waiting))
            width = pilot.width.get(iid, 1)
            if pilot.busy + width > pilot.info.slots:
                return
            bag_id, index = pilot.waiting.pop(iid)
            pilot.queued -= width
            self._start(pilot, iid, bag_id, index, at)

    def _start(self, pilot: _Pilot, iid: int, bag_id: int, index: int, at: float) -> None:
        """Run an instance on the pilot's host from `at`: how long it takes and how it ends are drawn here."""
        machine, model = pilot.machine, pilot.pool.model
        if bag_id not in self.runtimes:  # its bag ended while it was queued on the host: the server cancels it
            pilot.width.pop(iid, None)
            pilot.estimate.pop(iid, None)
            pilot.deadline.pop(iid, None)
            return
        if pilot.client is not None and at > pilot.deadline.get(iid, float("inf")):
            # the BOINC client aborts a task whose deadline passed before it started, and reports it so
            pilot.width.pop(iid, None)
            pilot.estimate.pop(iid, None)
            if not pilot.outbox:
                pilot.reports_since = self.now
            pilot.outbox.append(InstanceReport(iid, Outcome.INTERRUPTED, None, 0.0, 0.0,
                                               "aborted on the volunteer's host: not started by its deadline"))
            return
        work = self.runtimes[bag_id][index] / machine.speed
        if machine.black_hole:
            outcome, wall = Outcome.FAILURE, self.rng.uniform(*_QUICK_FAILURE)
        elif model.failure_rate and self.rng.random() < model.failure_rate * machine.unreliability:
            outcome, wall = Outcome.FAILURE, self.rng.uniform(0.0, work)
        else:
            outcome, wall = Outcome.SUCCESS, work
        turnaround = wall
        if model.turnaround_ratio.mean < 1.0:
            # a volunteer host shares its time with other projects and is off at times: its result comes
            # back after execution time / ratio (GridBot section 7: the ratio varies from 0.01 to 1)
            turnaround = wall / min(1.0, max(1e-3, model.turnaround_ratio.sample(self.rng)))
        pilot.running[iid] = at + turnaround
        pilot.busy += pilot.width.get(iid, 1)
        pilot.outcome[iid] = (outcome, wall, bag_id, at)
        self.recorder.started(bag_id, at)
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
        stale = {p.model.name: stale_count(p.queue.values(), p.model.spec.queue_patience, self.now)
                 for p in submitted}
        capacity = [pool_capacity(p.model.spec, p.queued, p.running, hosts.get(p.model.name, (0, 0)), True,
                                  max_running=p.size, stale=stale[p.model.name]) for p in submitted]
        decision = plan(demands, capacity)
        for name, n in decision.submit.items():
            for _ in range(n):
                self._submit(self.pools[name])
        for name, n in decision.cancel.items():
            queue = self.pools[name].queue
            for ticket in pilots_to_cancel(list(queue), n, stale[name]):  # the very pilots the server would cancel
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

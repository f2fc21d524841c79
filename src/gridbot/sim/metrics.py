"""What a simulated run measured: per bag (makespan, tail, replicas, waste, jobs per pool) and per pool
(hosts and throughput over time), gathered from the dispatcher's own `Changes` as they are applied.

Replicas % and discarded % follow GridBot section 7: instances created by replication, and good results
discarded because the job already had one, each as a share of the bag's jobs. gridbot cancels the other
instances of a job once it has a result, so few results are ever discarded; waste % is therefore measured
as compute: host time spent on instances whose result was not the one kept (failed, lost, cancelled or
discarded), as a share of the host time of the results kept.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gridbot.core.changes import BagCounts
from gridbot.model.states import BagState, InstanceState
from gridbot.sim.scenario import BagModel, Scenario


@dataclass
class BagResult:
    """One bag's outcome; times in seconds from the start of the run (None: did not happen)."""

    name: str
    jobs: int
    arrival: float
    state: str
    finished: float | None
    makespan: float | None
    tail_start: float | None
    """When every job had been sent at least once (nothing left queued for the first time)."""
    tail_makespan: float | None
    done: int
    failed: int
    instances: int
    replicas: int
    wasted: int
    reruns: int
    replicas_pct: float
    discarded_pct: float
    waste_pct: float
    cpu_hours: float
    """Host time spent on the bag's instances, all of them."""
    jobs_per_pool: dict[str, int]
    milestones: dict[str, float]
    """When the bag's incomplete jobs first fell to each threshold (Figure 7a: 1000, 500, 100, 50, 0)."""
    tail_plan: dict[str, Any] | None = None
    """What its tail strategy planned and measured (ExPERT's `TailPlan`), as it read when the bag ended."""
    budget: float | None = None
    bag_deadline: float | None = None
    """Its QoS deadline, seconds after it arrived."""
    spent: float = 0.0
    """What it spent on the pools, as the dispatcher's ledger bills it (core/ledger.py)."""
    spent_per_pool: dict[str, float] = field(default_factory=dict)
    done_by_deadline: int | None = None
    """Jobs done by its deadline (None: it has none)."""
    qos: dict[str, Any] | None = None
    """Its placement's last plan of deadline and budget (`QosReport`), when it plans one."""
    level: dict[str, Any] | None = None
    """Where the execution hierarchy last held it (`LevelReport`: queue, level, migrations), when it has levels."""
    first_start: float | None = None
    """When its first instance started on a host (None: none did)."""
    queue_time: float | None = None
    """From its arrival to its first instance's start (the RENCI report's time queued, for a one-job bag)."""
    diagnostics: list[str] = field(default_factory=list)
    """What the server's `gridbot status` would have said of it as it ended (or at the horizon): policies
    that evaluated to no usable value and counted as their default, a strategy that failed, why it stalls."""


@dataclass
class PoolResult:
    name: str
    pilots_peak: int
    instances: int
    done: int
    wasted: int
    failed: int
    lost: int
    """Instances that went silent (host timeout or instance deadline)."""
    throughput_share_pct: float


@dataclass
class ClusterResult:
    """A cluster pool (`cluster_cpus`): how its CPUs were used, by gridbot's pilots and by others' jobs."""

    name: str
    cpus: int
    saturated_at: float | None
    """When it first ran at full capacity: fewer free CPUs than one pilot needs (None: never)."""
    initial_latency: float
    """CPU-seconds unused from the start of the run until `saturated_at` (or the end): the RENCI report's
    initial latency until saturation (Figure 3), capacity lost before the cluster was found and filled."""
    cpu_seconds_ours: float
    """CPU-seconds held by gridbot's pilots (busy or idle)."""
    cpu_seconds_external: float
    external_jobs: int
    """Other users' jobs that started."""
    external_wait: float
    """Their total time in the cluster's queue."""
    pilots_queued_max: int
    """Most pilots waiting in its queue at once."""
    pilots: int = 0
    """gridbot's pilots (batch jobs) that started on it."""


@dataclass
class Results:
    """Everything a run measured, with the time series for the plots."""

    scenario: str
    seed: int
    end: float
    events: int
    bags: list[BagResult]
    pools: list[PoolResult]
    times: list[float] = field(default_factory=list)
    incomplete: dict[str, list[int | None]] = field(default_factory=dict)
    """Per bag, incomplete jobs at each sample (None before the bag arrived)."""
    pilots: dict[str, list[int]] = field(default_factory=dict)
    busy: dict[str, list[int]] = field(default_factory=dict)
    throughput: dict[str, list[float]] = field(default_factory=dict)
    """Per pool, results accepted per hour over each sample interval."""
    clusters: list[ClusterResult] = field(default_factory=list)
    """The cluster pools (`cluster_cpus`), in scenario order."""

    def bag(self, name: str) -> BagResult:
        return next(b for b in self.bags if b.name == name)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "metrics.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1))
        tmp.replace(path)
        return path


MILESTONES = (1000, 500, 100, 50, 0)


class Recorder:
    """Gathers a run's metrics as the simulator applies each batch of changes."""

    def __init__(self, scenario: Scenario, pools: list[str]) -> None:
        self.scenario = scenario
        self.pool_names = pools
        self.events = 0
        self.jobs_ended = 0
        self.models: dict[int, BagModel] = {}
        self.arrival: dict[int, float] = {}
        self.counts: dict[int, BagCounts] = {}
        self.state: dict[int, BagState] = {}
        self.finished: dict[int, float] = {}
        self.tail_start: dict[int, float] = {}
        self.milestones: dict[int, dict[str, float]] = defaultdict(dict)
        self.used: dict[int, float] = defaultdict(float)
        self.useful: dict[int, float] = defaultdict(float)
        self.per_pool_jobs: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.pool: dict[str, dict[str, int]] = {p: defaultdict(int) for p in pools}
        self.pilots_peak = dict.fromkeys(pools, 0)
        self.tail_plans: dict[int, dict[str, Any]] = {}
        self.diagnostics: dict[int, list[str]] = {}
        self._done_since: dict[str, int] = dict.fromkeys(pools, 0)
        self._last_sample = 0.0
        self.times: list[float] = []
        self.incomplete: dict[int, list[int | None]] = {}
        self.pilots: dict[str, list[int]] = {p: [] for p in pools}
        self.busy: dict[str, list[int]] = {p: [] for p in pools}
        self.throughput: dict[str, list[float]] = {p: [] for p in pools}
        self.done_by_deadline: dict[int, int] = {}
        self.first_start: dict[int, float] = {}

    def bag_arrived(self, bag_id: int, model: BagModel, now: float) -> None:
        self.models[bag_id] = model
        self.arrival[bag_id] = now
        self.counts[bag_id] = BagCounts(queued=model.jobs)
        self.state[bag_id] = BagState.ACTIVE
        self.incomplete[bag_id] = [None] * len(self.times)

    def sent(self, pool: str) -> None:
        self.pool[pool]["instances"] += 1

    def started(self, bag_id: int, at: float) -> None:
        """An instance of the bag starts on its host at `at` (its first one sets the bag's queue time)."""
        if bag_id not in self.first_start:
            self.first_start[bag_id] = at

    def cpu(self, bag_id: int, seconds: float) -> None:
        """A host spent `seconds` on an instance of the bag (whatever became of it)."""
        self.used[bag_id] += seconds

    def ended(self, pool: str, bag_id: int, state: InstanceState, wall: float) -> None:
        counters = self.pool[pool]
        if state is InstanceState.DONE:
            self.useful[bag_id] += wall
            counters["done"] += 1
            self._done_since[pool] += 1
            self.per_pool_jobs[bag_id][pool] += 1
        elif state is InstanceState.WASTED:
            counters["wasted"] += 1
        elif state is InstanceState.FAILED:
            counters["failed"] += 1
        elif state is InstanceState.OVERDUE:
            counters["lost"] += 1

    def bag_update(self, bag_id: int, state: BagState, counts: BagCounts, now: float) -> None:
        deadline = self.models[bag_id].bag_deadline if bag_id in self.models else None
        if deadline is not None and now <= self.arrival[bag_id] + deadline:
            self.done_by_deadline[bag_id] = counts.done
        old = self.counts.get(bag_id)
        if old is not None:
            self.jobs_ended += (counts.done + counts.failed) - (old.done + old.failed)
        self.counts[bag_id] = counts
        self.state[bag_id] = state
        if counts.queued == 0 and bag_id not in self.tail_start:
            self.tail_start[bag_id] = now
        left = counts.queued + counts.running
        marks = self.milestones[bag_id]
        for m in MILESTONES:
            if left <= m and str(m) not in marks:
                marks[str(m)] = now
        if state is not BagState.ACTIVE:
            self.finished[bag_id] = now

    def sample(self, now: float, pilots: dict[str, int], busy: dict[str, int]) -> None:
        span = now - self._last_sample
        if self.times and span <= 0:
            return
        self.times.append(now)
        for bag_id, series in self.incomplete.items():
            c = self.counts[bag_id]
            series.append(c.queued + c.running if self.state[bag_id] is BagState.ACTIVE else 0)
        for p in self.pool_names:
            self.pilots[p].append(pilots[p])
            self.busy[p].append(busy[p])
            self.pilots_peak[p] = max(self.pilots_peak[p], pilots[p])
            self.throughput[p].append(self._done_since[p] * 3600.0 / span if span > 0 else 0.0)
            self._done_since[p] = 0
        self._last_sample = now

    def results(self, end: float, bag_ids: dict[str, int]) -> Results:
        bags = []
        for name, bag_id in bag_ids.items():
            model, c = self.models[bag_id], self.counts[bag_id]
            finished = self.finished.get(bag_id)
            tail = self.tail_start.get(bag_id)
            bags.append(BagResult(
                name, model.jobs, self.arrival[bag_id], self.state[bag_id].value, finished,
                finished - self.arrival[bag_id] if finished is not None else None, tail,
                finished - tail if finished is not None and tail is not None else None,
                c.done, c.failed, c.instances, c.replicas, c.wasted, c.reruns,
                round(100.0 * c.replicas / model.jobs, 2), round(100.0 * c.wasted / model.jobs, 2),
                round(100.0 * max(0.0, self.used[bag_id] - self.useful[bag_id]) / self.useful[bag_id], 2)
                if self.useful[bag_id] else 0.0, round(self.used[bag_id] / 3600.0, 2),
                dict(sorted(self.per_pool_jobs[bag_id].items())), dict(self.milestones[bag_id]),
                self.tail_plans.get(bag_id), model.budget, model.bag_deadline,
                done_by_deadline=self.done_by_deadline.get(bag_id, 0) if model.bag_deadline is not None else None,
                first_start=(start := self.first_start.get(bag_id)),
                queue_time=start - self.arrival[bag_id] if start is not None else None,
                diagnostics=self.diagnostics.get(bag_id, [])))
        for model in self.scenario.bags:  # bags that never arrived before the horizon
            if model.name not in bag_ids:
                bags.append(BagResult(model.name, model.jobs, model.arrival, "not arrived", None, None, None, None,
                                      0, 0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, {}, {}))
        total_done = sum(self.pool[p]["done"] for p in self.pool_names) or 1
        pools = [PoolResult(p, self.pilots_peak[p], self.pool[p]["instances"], self.pool[p]["done"],
                            self.pool[p]["wasted"], self.pool[p]["failed"], self.pool[p]["lost"],
                            round(100.0 * self.pool[p]["done"] / total_done, 2)) for p in self.pool_names]
        names = {bag_id: name for name, bag_id in bag_ids.items()}
        return Results(self.scenario.source, 0, end, self.events, bags, pools, list(self.times),
                       {names[b]: s for b, s in self.incomplete.items()}, self.pilots, self.busy, self.throughput)

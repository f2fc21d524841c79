"""Scenario files: the pools, bags, policies and server settings of one simulated run, validated.

A scenario is TOML with four tables (documented field by field in docs/simulation.md):
`[simulation]` (seed, horizon, sampling), `[server]` (the dispatcher's knobs), `[pools.NAME]` (one per
simulated pool) and `[bags.NAME]` (one per bag, `copies` for several alike). Every problem is reported
with its line and a hint, all at once, as `SpecError`, the same as for bag specs and pools files.
"""

from __future__ import annotations

import math
import random
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from gridbot.core.config import DispatchConfig, Knob, knob_conflict, knobs
from gridbot.model.hierarchy import QueueSpec, parse_queues
from gridbot.model.pools import RELIABILITY, PoolSpec, classad_int_problem
from gridbot.model.records import MAX_PILOT_CPUS
from gridbot.model.spec import (
    HARD_MAX_JOBS,
    MAX_CPUS,
    NAME_RE,
    BagSpec,
    Problem,
    SpecError,
    StrategyChoice,
    as_float,
    budget_problem,
    closest,
    key_lines,
    parse_duration,
    parse_strategy,
    shown,
    with_qos_placement,
)
from gridbot.model.volunteer import DEFAULT_RPC_DELAY, DEFAULT_RUNTIME
from gridbot.policy.policies import PolicyError, validate_policies
from gridbot.schedulers import registry
from gridbot.schedulers.base import StrategyError
from gridbot.sim import traces
from gridbot.sim.boinc import ClientConfig
from gridbot.sim.distributions import Dist, DistError, constant, empirical, parse_dist, seconds

SIM_KEYS = ("seed", "horizon", "tick", "overlay_interval", "sample", "latency", "heartbeat", "store",
            "description")
SERVER_KNOBS = tuple(k for k in knobs() if k.scenario)
"""The DispatchConfig fields a `[server]` table sets, each under its field's name."""
SERVER_KEYS = tuple(k.name for k in SERVER_KNOBS)
POOL_KINDS = ("grid", "cluster", "cloud", "community")
DEFAULT_RELIABILITY = {"grid": "unreliable", "cluster": "reliable", "cloud": "reliable", "community": "volunteer"}
COMMUNITY_KEYS = ("work_buffer_min", "work_buffer_extra", "report_immediately", "next_rpc_delay", "runtime_estimate")
"""A community pool's BOINC settings: its clients' work buffer, and the server's heartbeat and first estimate."""
POOL_KEYS = ("kind", "size", "hosts", "max_queued", "cpus", "prefetch", "queue_wait", "queue_patience", "walltime",
             "idle_timeout",
             "speed", "preemption", "failure_rate", "failure_spread", "black_holes", "turnaround_ratio", "availability",
             "unavailability",
             "price_per_cpu_hour", "price_per_pilot_hour", "charging_period", "reliability", "level", "attributes",
             "latency", "cluster_cpus", "external", "monitor_interval", "monitor_lag", "jobs_per_pilot",
             *COMMUNITY_KEYS)
EXTERNAL_KEYS = ("at", "cpus", "runtime", "count", "every")
BAG_KEYS = ("jobs", "runtime", "arrival", "instance_deadline", "max_failures", "copies", "policy", "strategy",
            "bag_deadline", "budget", "cpus")
STORES = ("compact", "memory")
MAX_HOSTS = 2_000_000
"""Simulated hosts in a scenario, its pools' together: each is an object of its own, about 350 bytes (two
million took 0.7 GB and 5 s to set up on the reference machine; a pool of 10^12 ran out of memory)."""
MAX_EXTERNAL_JOBS = 2_000_000
"""Jobs of other users (`[[pools.NAME.external]]`) in a scenario, every entry's together: each is an event
set up before the run starts, about 250 bytes (as much memory as MAX_HOSTS hosts at 2 million)."""

MAX_STEPS = {
    "tick": (10_000_000, "each runs the server's periodic work, about 0.1 ms on a small run"),
    "overlay_interval": (10_000_000, "each plans the pools' pilots, 25 µs or more"),
    "sample": (1_000_000, "each keeps a number for every bag and three for every pool, about 100 bytes for one "
               "of each"),
}
"""The most steps of each `[simulation]` period over the horizon without a warning, and what one costs (a run that
goes to the horizon, its bags unfinished, takes them all): ten million ticks are about a quarter of an hour."""
REFUSED_STEPS = 100
"""A period making this many times MAX_STEPS over the horizon is refused, not warned of: such a run could not end."""


@dataclass(frozen=True)
class SizeStep:
    """From `at` seconds on, the pool allows `size` pilots (hosts online, for a community pool)."""

    at: float
    size: int


@dataclass(frozen=True)
class ExternalLoad:
    """Batch jobs of other users on a cluster pool (`[[pools.NAME.external]]`): `count` jobs of `cpus` CPUs,
    the first submitted at `at`, the next `every` seconds later, each running a draw of `runtime` seconds
    once it starts. They queue first come, first served with gridbot's pilots (the RENCI report's external
    load, "assigned statically to the cluster resources")."""

    at: float
    cpus: int
    runtime: Dist
    count: int = 1
    every: float = 0.0


@dataclass(frozen=True)
class PoolModel:
    """One simulated pool: its pilots' limits and behaviour, and the ad its GridPolicy sees."""

    name: str
    kind: str
    spec: PoolSpec
    """The pool as the overlay and GridPolicy see it (its ad: Name, Kind, Reliability, ...)."""
    size: list[SizeStep]
    """Pilots (or hosts online) allowed over time; a step function."""
    fluctuate: tuple[int, int, float] | None
    """(low, high, every): the size is drawn uniformly from low..high every `every` seconds."""
    hosts: int
    """Machines the pool's pilots land on; host statistics stay with a machine across pilots."""
    queue_wait: Dist
    speed: Dist
    preemption: Dist | None
    """How long a pilot lives before the grid takes its node back, silently (None: never). A constant
    rate per hour is an exponential lifetime; real best-effort queues kill young pilots more often
    (a Weibull of shape below 1), see docs/simulation.md."""
    failure_rate: float
    black_holes: float
    turnaround_ratio: Dist
    availability: Dist | None
    unavailability: Dist
    latency: float | None
    failure_spread: float = 0.0
    """How unevenly failures fall on the pool's machines: each machine's `failure_rate` is the pool's times a draw
    of a Gamma distribution of mean 1 and this shape, and its pilots' lives are `preemption`'s divided by the
    same draw (small: a few machines fail most; Los Alamos' nodes, 0.25 to 2). 0: every machine alike."""
    prefetch: int = 0
    """Instances a host asks for beyond its slots, run one after another (the worker's --prefetch)."""
    cluster_cpus: int = 0
    """A batch cluster of this many CPUs (0: not one): each pilot is a batch job of the pool's `cpus` that starts
    once it is at the head of the cluster's first-come-first-served queue and the CPUs are free."""
    external: tuple[ExternalLoad, ...] = ()
    """Other users' batch jobs on the cluster."""
    monitor_interval: float = 0.0
    """Seconds between two readings of the pool's simulated monitor, given to the dispatcher (0: none)."""
    monitor_lag: Dist | None = None
    """The monitor's hysteresis, drawn at each reading: work that started less than this long before the
    reading is not in it (the report's MDS, two to three minutes behind); ended work leaves it at once."""
    jobs_per_pilot: int = 0
    """A pilot takes this many instances and exits once they ended (0: as many as come): 1 makes each pilot one
    job's own batch job. The real worker has no such limit (its pilots leave only after `idle_timeout`)."""
    client: ClientConfig = field(default_factory=ClientConfig)
    """A community pool's hosts: stock BOINC clients with this work buffer (`work_buffer_min`, `_extra`)."""
    next_rpc_delay: float = DEFAULT_RPC_DELAY
    """The BOINC side's heartbeat (the volunteer pool's `next_rpc_delay`)."""
    runtime_estimate: float = DEFAULT_RUNTIME
    """The BOINC side's run time estimate before any job has ended (the volunteer pool's `runtime_estimate`)."""
    sessions: tuple[traces.HostSession, ...] = ()
    """A community pool's named hosts and when each was online (`size = { hosts = "f.csv" }`): the same host
    comes back as the same machine, with its record; none: hosts come and go as `size` and `availability` say."""

    @property
    def volunteer(self) -> bool:
        """Hosts that come by themselves (BOINC clients): no pilots, nothing to submit."""
        return self.kind == "community"

    @property
    def max_size(self) -> int:
        return max([s.size for s in self.size] + ([self.fluctuate[1]] if self.fluctuate else []))

    def machine_factor(self, rng: random.Random) -> float:
        """One machine's unreliability: its `failure_rate` over the pool's, and what its pilots' (or jobs')
        lives are divided by; a draw of `failure_spread`'s Gamma distribution, or 1 without drawing when the
        machines are alike, so that scenarios without it run as they always did."""
        spread = self.failure_spread
        return rng.gammavariate(spread, 1.0 / spread) if spread else 1.0


@dataclass(frozen=True)
class BagModel:
    """One simulated bag: its jobs' runtimes, when it arrives, its policies."""

    name: str
    jobs: int
    runtime: Dist
    arrival: float
    instance_deadline: float
    max_failures: int
    policy: dict[str, str]
    runtimes: tuple[float, ...] | None = None
    """Each job's runtime, in order, when replayed from a log (a user's burst); `runtime` is then their
    distribution. A bag scaled down to fewer jobs takes evenly spaced ones."""
    strategy: StrategyChoice = field(default_factory=StrategyChoice)
    """The bag's `[strategy]` table, as a spec's (checked against the strategies' registry)."""
    bag_deadline: float | None = None
    """Its QoS deadline, seconds after it arrives (None: none)."""
    budget: float | None = None
    cpus: int = 1
    """CPUs (slots) one job needs (the spec's `cpus`): it runs on a pilot with that many free slots."""


@dataclass(frozen=True)
class Scenario:
    """A validated scenario: everything one run needs besides the seed."""

    source: str
    description: str
    seed: int
    horizon: float
    tick: float
    overlay_interval: float
    sample: float
    latency: float
    heartbeat: float
    store: str
    dispatch: DispatchConfig
    pools: list[PoolModel]
    bags: list[BagModel] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    """What is allowed but probably not meant (jobs of a replayed log that cannot finish in time)."""
    queues: list[QueueSpec] = field(default_factory=list)
    """The execution hierarchy's queues (`[queues.NAME]`, as in a pools file: docs/hierarchy.md)."""


def parse_scenario(text: str, source: str) -> Scenario:
    """Validate a scenario's TOML into a Scenario, or raise SpecError listing every problem."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(source, [Problem(f"TOML syntax error: {e}", None,
                                         "check quotes, brackets and '=' signs")]) from e
    return _Reader(text, source).scenario(data)


class _Reader:
    def __init__(self, text: str, source: str) -> None:
        self.lines = key_lines(text)
        self.source = source
        self.base = Path(source).parent
        """Files a scenario names (size traces, SWF logs) are found relative to it."""
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []
        self.has_queues = False
        """The scenario declares the hierarchy's queues (its bags are then placed by "hierarchy")."""
        self.horizon = 365 * 86400.0
        """The simulation's horizon (`[simulation] horizon`): a bag arriving after it never runs."""

    def line(self, path: tuple[str, ...]) -> int | None:
        """The line of `path`'s key in the file, or of the nearest table holding it."""
        return next((self.lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in self.lines), None)

    def fail(self, path: tuple[str, ...], message: str, hint: str = "") -> None:
        self.problems.append(Problem(message, self.line(path), hint))

    def warn(self, path: tuple[str, ...], message: str, hint: str = "") -> None:
        self.warnings.append(Problem(message, self.line(path), hint))

    def keys(self, table: dict[str, Any], allowed: tuple[str, ...], path: tuple[str, ...], what: str) -> None:
        for key in table:
            if key not in allowed:
                self.fail((*path, key), f"unknown key '{key}' in {what}",
                          closest(key, allowed) or f"the keys are {', '.join(allowed)}")

    def get(self, table: dict[str, Any], key: str, path: tuple[str, ...], default: Any,
            convert: Callable[[Any], Any]) -> Any:
        """`convert(table[key])`, or `default` if absent; a conversion error is recorded, default returned."""
        if key not in table:
            return default
        try:
            return convert(table[key])
        except (DistError, ValueError, TypeError) as e:
            self.fail((*path, key), f"{'.'.join(path)}.{key}: {e}")
            return default

    def scenario(self, data: dict[str, Any]) -> Scenario:
        self.keys(data, ("simulation", "server", "pools", "queues", "bags", "swf_bags"), (), "the scenario")
        sim = self.table(data, "simulation")
        self.keys(sim, SIM_KEYS, ("simulation",), "[simulation]")
        p = ("simulation",)
        seed = self.get(sim, "seed", p, 1, check_seed)
        horizon = self.horizon = self.get(sim, "horizon", p, self.horizon, _dur(False))
        tick = self.get(sim, "tick", p, 60.0, _dur(False))
        overlay_interval = self.get(sim, "overlay_interval", p, 60.0, _dur(False))
        sample = self.get(sim, "sample", p, 0.0, _dur(False))
        latency = self.get(sim, "latency", p, 0.0, _dur(True))
        store = self.get(sim, "store", p, "compact", _choice(STORES))
        written = not self.problems
        for key, every in (("tick", tick), ("overlay_interval", overlay_interval), ("sample", sample or 300.0)):
            if written and (key in sim or "horizon" in sim) and every > 0:
                self.steps(key, every, horizon)
        dispatch = self.dispatch(self.table(data, "server"))
        heartbeat = self.get(sim, "heartbeat", p, dispatch.host_timeout / 2, _dur(False))
        if heartbeat >= dispatch.host_timeout:
            self.fail((*p, "heartbeat"), f"heartbeat ({heartbeat:g} s) must be shorter than the server's "
                      f"host_timeout ({dispatch.host_timeout:g} s), or every busy host would be declared lost",
                      "leave heartbeat out: it defaults to half the host timeout")
        pools = [m for name, t in self.table(data, "pools").items() if (m := self.pool(name, t)) is not None]
        if not pools and "pools" not in data:
            self.fail((), "the scenario defines no pool", '[pools.cluster]\nkind = "cluster"\nsize = 100')
        if len(pools) > 1 and sum(m.hosts for m in pools) > MAX_HOSTS:
            self.fail(("pools",), f"the pools have {sum(m.hosts for m in pools):,} hosts together, over the "
                      f"simulator's {MAX_HOSTS:,} (each host is simulated on its own, about 350 bytes of memory)",
                      "simulate a sample: smaller sizes, and fewer jobs to match")
        external = sum(load.count for m in pools for load in m.external)
        if external > MAX_EXTERNAL_JOBS:
            self.fail(("pools",), f"the pools' external loads have {external:,} jobs together, over the simulator's "
                      f"{MAX_EXTERNAL_JOBS:,} (each is an event set up before the run, about 250 bytes)",
                      "lower their count, or raise every so that fewer fall within the horizon")
        names = {m.name for m in pools}
        queues = parse_queues(data["queues"], sorted(names), self.fail) if "queues" in data else []
        self.has_queues = bool(queues)
        for reliable in dispatch.reliable_pools:
            if reliable not in names:
                self.fail(("server", "reliable_pools"), f"reliable pool '{reliable}' is not a pool of the scenario",
                          closest(reliable, sorted(names)))
        bags = []
        for name, t in self.table(data, "bags").items():
            bags.extend(self.bag(name, t))
        for name, t in self.table(data, "swf_bags").items():
            bags.extend(self.swf_bags(name, t))
        bags.sort(key=lambda b: b.arrival)
        if not bags and "bags" not in data and "swf_bags" not in data:
            self.fail((), "the scenario defines no bag", '[bags.sweep]\njobs = 1000\nruntime = "10m"')
        widest = max((m.spec.cpus for m in pools), default=0)
        for b in bags:
            if pools and b.cpus > widest:
                self.fail(("bags", b.name, "cpus"),
                          f"bag '{b.name}' needs {b.cpus} CPUs a job, but no pool's pilots have more than {widest}, "
                          "so its jobs would never run", f"raise a pool's cpus to {b.cpus}, or lower the bag's")
        seen: set[str] = set()
        for b in bags:
            if b.name in seen:
                self.fail(("bags",), f"two bags are named '{b.name}'", "rename one, or change its copies")
            seen.add(b.name)
        if self.problems:
            raise SpecError(self.source, self.problems)
        description = str(sim.get("description", ""))
        sample = sample or 300.0
        return Scenario(self.source, description, seed, horizon, tick, overlay_interval, sample, latency,
                        heartbeat, store, dispatch, pools, bags, sorted(self.warnings, key=lambda w: w.line or 0),
                        queues)

    def steps(self, key: str, every: float, horizon: float) -> None:
        """Warn of a step of `[simulation]` so short that a run to the horizon would take more than MAX_STEPS of
        it, and refuse one that would take a hundred times that: `sample = 1e-5` over two hours grew past 1 GB,
        `tick = 1e-4` ran for minutes on end. A run stops when its bags have all ended, often long before the
        horizon (a year unless written), so between the two it is a warning: `tick = "1s"` is a fine choice for
        a bag of an hour."""
        most, cost = MAX_STEPS[key]
        if horizon / every <= most:
            return
        smallest = math.ceil(horizon / most * 1000) / 1000
        said = (f"simulation.{key} = {every:g} s makes {horizon / every:,.0f} steps to the horizon "
                f"({_span(horizon)}), over the simulator's {most:,} ({cost})")
        fix = f'{key} = {smallest:g} or more, or a shorter horizon'
        if horizon / every > REFUSED_STEPS * most:
            self.fail(("simulation", key), said, fix)
        else:
            self.warn(("simulation", key), f"{said}: a run whose bags do not all end long before the horizon takes "
                      "them all", fix)

    def table(self, data: dict[str, Any], key: str) -> dict[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            self.fail((key,), f"'{key}' must be a table", f"write [{key}] on a line of its own")
            return {}
        return value

    def dispatch(self, server: dict[str, Any]) -> DispatchConfig:
        """The `[server]` table: a key per field of SERVER_KNOBS, checked as `gridbot server` checks its option."""
        self.keys(server, SERVER_KEYS, ("server",), "[server]")
        values = {k.name: self.get(server, k.name, ("server",), k.default, _knob_value(k)) for k in SERVER_KNOBS}
        if (conflict := knob_conflict(values)) is not None:
            self.fail(("server", "replicas_mixed"), conflict, "remove one of the two keys from [server]")
            values["replicas_mixed"] = False
        return DispatchConfig(**values)

    def pool(self, name: str, t: object) -> PoolModel | None:
        path = ("pools", name)
        if not isinstance(t, dict):
            self.fail(path, f"pool '{name}' must be a table", f'[pools.{name}]\nkind = "grid"\nsize = 100')
            return None
        if not NAME_RE.match(name):
            self.fail(path, f"pool name {name!r} may hold letters, digits, '.', '_' and '-' only")
        before = len(self.problems)
        self.keys(t, POOL_KEYS, path, f"pool '{name}'")
        kind = self.get(t, "kind", path, "grid", _choice(POOL_KINDS))
        cpus = self.get(t, "cpus", path, 1, _int(1, MAX_PILOT_CPUS))
        cluster_cpus = self.get(t, "cluster_cpus", path, 0, _int(1))
        sessions = self.sessions(t, path, name, kind)
        if _is_host_trace(t.get("size")):  # read as named hosts, or refused and said so: no size to read again
            size = [SizeStep(at, n) for at, n in traces.online_steps(sessions)] if sessions else [SizeStep(0.0, 1)]
            fluctuate = None
        else:
            size, fluctuate = self.get(t, "size", path, ([SizeStep(0.0, cluster_cpus // cpus)], None),
                                       lambda v: _size(v, self.base))
        if "size" not in t and not cluster_cpus:
            self.fail(path, f"pool '{name}' has no size", "size = 100 (pilots at once), a list of [time, size] "
                      "steps, or { min = 10, max = 100, every = \"1h\" }")
        top = max([s.size for s in size] + ([fluctuate[1]] if fluctuate else []))
        hosts = len({s.host for s in sessions}) if sessions else self.get(t, "hosts", path, max(1, top), _int(1))
        if hosts > MAX_HOSTS:
            self.fail((*path, "hosts" if "hosts" in t else "size"),
                      f"pool '{name}' has {hosts:,} hosts, over the simulator's {MAX_HOSTS:,} (each host is "
                      "simulated on its own, about 350 bytes of memory)",
                      "simulate a sample: a smaller size, and fewer jobs to match")
        elif hosts < top:
            self.fail((*path, "hosts"), f"pool '{name}' has {hosts} hosts but a size of up to {top}",
                      "a pilot needs a host of its own: raise hosts, or leave it out (it defaults to the size)")
        self.cluster(name, t, path, kind, cpus, cluster_cpus)
        spec_values = {
            "max_running": top,
            "max_queued": self.get(t, "max_queued", path, max(1, top), _int(0)),
            "cpus": cpus,
            "walltime": self.get(t, "walltime", path, 365 * 86400.0, _dur(False)),
            "idle_timeout": self.get(t, "idle_timeout", path, 120.0, _dur(True)),
            "queue_patience": self.get(t, "queue_patience", path, 0.0, _dur(True)),
            "price_per_cpu_hour": self.get(t, "price_per_cpu_hour", path, 0.0, _fraction(math.inf)),
            "price_per_pilot_hour": self.get(t, "price_per_pilot_hour", path, 0.0, _fraction(math.inf)),
            "charging_period": self.get(t, "charging_period", path, 3600.0, _dur(False)),
            "reliability": self.get(t, "reliability", path, DEFAULT_RELIABILITY[kind], _choice(RELIABILITY)),
            "level": self.get(t, "level", path, 0, _int(0)),
            "attributes": self.get(t, "attributes", path, {}, _attributes),
        }
        what = f"pool '{name}'"
        model = PoolModel(
            name=name, kind=kind, spec=PoolSpec(name=name, kind=kind, **spec_values),
            size=size, fluctuate=fluctuate, hosts=hosts,
            queue_wait=self.get(t, "queue_wait", path, constant(0.0), _dist(self.base, f"queue_wait of {what}")),
            speed=self.get(t, "speed", path, constant(1.0), _dist(self.base, f"speed of {what}", durations=False)),
            preemption=self.get(t, "preemption", path, None, _preemption(self.base, f"preemption of {what}")),
            failure_rate=self.get(t, "failure_rate", path, 0.0, _fraction(1.0)),
            black_holes=self.get(t, "black_holes", path, 0.0, _fraction(1.0)),
            failure_spread=self.get(t, "failure_spread", path, 0.0, _shape),
            turnaround_ratio=self.get(t, "turnaround_ratio", path, constant(1.0),
                                      _dist(self.base, f"turnaround_ratio of {what}", durations=False)),
            availability=self.get(t, "availability", path, None, _life(self.base, f"availability of {what}")),
            unavailability=self.get(t, "unavailability", path, constant(0.0),
                                    _dist(self.base, f"unavailability of {what}")),
            latency=self.get(t, "latency", path, None, _dur(True)),
            prefetch=self.get(t, "prefetch", path, 0, _int(0)),
            cluster_cpus=cluster_cpus,
            external=self.external(t, path, name, cluster_cpus),
            monitor_interval=self.get(t, "monitor_interval", path, 0.0, _dur(True)),
            monitor_lag=self.get(t, "monitor_lag", path, None, _dist(self.base, f"monitor_lag of {what}")),
            jobs_per_pilot=self.get(t, "jobs_per_pilot", path, 0, _int(0)),
            client=ClientConfig(min_buffer=self.get(t, "work_buffer_min", path, ClientConfig.min_buffer, _dur(True)),
                                extra_buffer=self.get(t, "work_buffer_extra", path, ClientConfig.extra_buffer,
                                                      _dur(True)),
                                report_immediately=self.get(t, "report_immediately", path, True, _bool)),
            next_rpc_delay=self.get(t, "next_rpc_delay", path, DEFAULT_RPC_DELAY, _dur(True)),
            runtime_estimate=self.get(t, "runtime_estimate", path, DEFAULT_RUNTIME, _dur(False)),
            sessions=sessions,
        )
        if kind != "community":
            for key in COMMUNITY_KEYS:
                if key in t:
                    self.fail((*path, key), f"'{key}' of pool '{name}' applies to community pools (BOINC clients) "
                              f"only, and this pool is a {kind}", "remove it, or make the pool kind = \"community\"")
        if model.monitor_lag is not None and not model.monitor_interval:
            self.fail((*path, "monitor_lag"), f"pool '{name}' has a monitor_lag but no monitor_interval, so it is "
                      "never read", 'add monitor_interval = "60s" (how often the monitor is read)')
        ratio = model.turnaround_ratio
        if ratio.mean <= 0 or ratio.mean > 1:
            self.fail((*path, "turnaround_ratio"), f"turnaround_ratio of {what} must lie in (0, 1] "
                      f"(execution time / turnaround time), but its mean is {ratio.mean:g}",
                      '{ dist = "uniform", low = 0.01, high = 1 } for a community grid')
        if model.speed.mean <= 0:
            self.fail((*path, "speed"), f"speed of {what} must be positive (1 = the runtimes as written)")
        if top == 0 and "size" in t:
            self.warn((*path, "size"), f"pool '{name}' has a size of 0 at all times, so it never holds a host and "
                      "runs nothing (a scenario whose pools all do runs to its horizon, a year by default, for "
                      "nothing)", "give it a size, or steps that grow ([[0, 0], [\"6h\", 100]]); or remove the pool")
        return model if len(self.problems) == before else None

    def sessions(self, t: dict[str, Any], path: tuple[str, ...], name: str,
                 kind: str) -> tuple[traces.HostSession, ...]:
        """`size = { hosts = "volunteers.csv" }`: a community pool's named hosts and their sessions online, which
        stand for `size`, `hosts`, `availability` and `unavailability` (each host comes back when the trace says,
        as itself)."""
        v = t.get("size")
        if not _is_host_trace(v):
            return ()
        assert isinstance(v, dict)
        where = (*path, "size")
        if kind != "community":
            self.fail(where, f"pool '{name}' is a {kind}: a trace of named hosts online is for community pools "
                      "(volunteers come and go by themselves; a grid's pilots are submitted)",
                      'make the pool kind = "community", or give its size as { trace = "sizes.csv" }')
            return ()
        for key in ("hosts", "availability", "unavailability"):
            if key in t:
                self.fail((*path, key), f"pool '{name}' takes its hosts and when each is online from its host trace, "
                          f"so '{key}' has no say", f"remove '{key}'")
        try:
            return tuple(traces.host_sessions(self.base / str(v["hosts"])))
        except traces.TraceError as e:
            self.fail(where, str(e), "a CSV file of host,start,end rows (seconds), one per session online")
            return ()

    def cluster(self, name: str, t: dict[str, Any], path: tuple[str, ...], kind: str, cpus: int,
                cluster_cpus: int) -> None:
        """A cluster pool's own rules: its pilots fit in it, and volunteers have no batch queue."""
        if not cluster_cpus:
            return
        if kind == "community":
            self.fail((*path, "cluster_cpus"), f"pool '{name}' is a community pool, whose hosts come by themselves: "
                      "it has no batch queue for cluster_cpus", 'use kind = "cluster"')
        if cpus > cluster_cpus:
            self.fail((*path, "cpus"), f"pool '{name}': a pilot of {cpus} CPUs never fits in a cluster of "
                      f"{cluster_cpus}", f"cpus = {cluster_cpus} at most")

    def external(self, t: dict[str, Any], path: tuple[str, ...], name: str,
                 cluster_cpus: int) -> tuple[ExternalLoad, ...]:
        """`[[pools.NAME.external]]`: other users' batch jobs on a cluster pool."""
        if "external" not in t:
            return ()
        entries = t["external"]
        p = (*path, "external")
        if not cluster_cpus:
            self.fail(p, f"pool '{name}' has external load but no cluster_cpus: other users' jobs need a cluster "
                      "to queue on", "add cluster_cpus = 16 (the cluster's CPUs)")
            return ()
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            self.fail(p, f"the external load of pool '{name}' must be a list of tables",
                      f'[[pools.{name}.external]]\nat = "0s"\ncpus = 2\nruntime = "200s"')
            return ()
        out = []
        for i, e in enumerate(entries):
            at = (*p, str(i))
            self.keys(e, EXTERNAL_KEYS, at, f"the external load of pool '{name}'")
            if "runtime" not in e:
                self.fail(at, f"an external job of pool '{name}' has no runtime", 'runtime = "200s"')
                continue
            cpus = self.get(e, "cpus", at, 1, _int(1))
            if cpus > cluster_cpus:
                self.fail((*at, "cpus"), f"an external job of {cpus} CPUs never fits in pool '{name}' of "
                          f"{cluster_cpus}", f"cpus = {cluster_cpus} at most")
            out.append(ExternalLoad(self.get(e, "at", at, 0.0, _dur(True)), cpus,
                                    self.get(e, "runtime", at, constant(0.0),
                                             _dist(self.base, f"external runtime of '{name}'")),
                                    self.get(e, "count", at, 1, _int(1, MAX_EXTERNAL_JOBS)),
                                    self.get(e, "every", at, 0.0, _dur(True))))
        return tuple(out)

    def policies(self, written: dict[str, str], deadline: float, path: tuple[str, ...], what: str) -> bool:
        """Validate a bag's policies as a submitted spec's are (which refuses a constant Deadline that is not a
        positive number of seconds: issue 14's `Deadline = "-5"` ran as 1 day), one at a time as `gridbot submit`
        does, so that every wrong one is named at once (the first alone was)."""
        ok = True
        for name, text in written.items():
            try:
                validate_policies({name: text}, deadline)
            except PolicyError as e:
                self.fail((*path, "policy", e.policy), f"{what}: {e}")
                ok = False
        if ok:  # and together, as the server checks a spec's (what one policy says of another)
            try:
                validate_policies(written, deadline)
            except PolicyError as e:
                self.fail((*path, "policy", e.policy), f"{what}: {e}")
                ok = False
        return ok

    def bag(self, name: str, t: object) -> list[BagModel]:
        path = ("bags", name)
        if not isinstance(t, dict):
            self.fail(path, f"bag '{name}' must be a table", f'[bags.{name}]\njobs = 1000\nruntime = "10m"')
            return []
        before = len(self.problems)
        self.keys(t, BAG_KEYS, path, f"bag '{name}'")
        jobs = self.get(t, "jobs", path, 0, _int(1))
        if "jobs" not in t:
            self.fail(path, f"bag '{name}' has no jobs", "jobs = 1000")
        if "runtime" not in t:
            self.fail(path, f"bag '{name}' has no runtime", 'runtime = "10m", or { dist = "uniform", low = "10m", '
                      'high = "15m" }, or { trace = "blastall" }')
        runtime = self.get(t, "runtime", path, constant(1.0), _dist(self.base, f"runtime of bag '{name}'"))
        arrival = self.get(t, "arrival", path, 0.0, _dur(True))
        deadline = self.get(t, "instance_deadline", path, 24 * 3600.0, _dur(False))
        max_failures = self.get(t, "max_failures", path, 3, _int(1))
        copies = self.get(t, "copies", path, 1, _int(1))
        if not self.too_many_jobs(path, name, jobs, copies):
            copies = 1  # (not a loop of a trillion copies to report the problem)
        self.arrives_late(path, f"bag '{name}'", [arrival], "arrival = \"0s\"")
        cpus = self.get(t, "cpus", path, 1, _int(1, MAX_CPUS))
        policy = t.get("policy", {})
        if not isinstance(policy, dict) or not all(isinstance(v, str) for v in policy.values()):
            self.fail((*path, "policy"), f"the policy of bag '{name}' must be a table of ClassAd expressions in "
                      "strings", '[bags.NAME.policy]\nJobRequirements = "Host.ErrorRate < 0.1"')
            policy = {}
        qos = self.qos(t, path, name)
        strategy = self.strategy(t.get("strategy", {}), path, name, qos)
        out = []
        for copy in range(1, copies + 1):
            bag_name = name if copies == 1 else f"{name}-{copy}"
            written = {k: v.replace("{copy}", str(copy)) for k, v in policy.items()}
            if not self.policies(written, deadline, path, f"bag '{bag_name}'"):
                break
            out.append(BagModel(bag_name, jobs, runtime, arrival, deadline, max_failures, written, strategy=strategy,
                                bag_deadline=qos.bag_deadline, budget=qos.budget, cpus=cpus))
        return out if len(self.problems) == before else []

    def too_many_jobs(self, path: tuple[str, ...], name: str, jobs: int, copies: int) -> bool:
        """Refuse a bag of more than HARD_MAX_JOBS jobs (its copies together), as a spec is refused: the simulator
        keeps a byte or more of every job in memory (`jobs = 1e12` asked for a terabyte, and died of MemoryError).
        Return whether the bag is within the limit."""
        if jobs > HARD_MAX_JOBS:
            self.fail((*path, "jobs"), f"bag '{name}' has {jobs:,} jobs; a bag takes at most {HARD_MAX_JOBS:,}, as a "
                      "spec does (the simulator keeps every job in memory)",
                      f"jobs = {HARD_MAX_JOBS:,} at most; a smaller bag shows the same shape sooner")
            return False
        if jobs * copies > HARD_MAX_JOBS:
            self.fail((*path, "copies"), f"bag '{name}' has {copies:,} copies of {jobs:,} jobs, {jobs * copies:,} in "
                      f"all; its copies take at most {HARD_MAX_JOBS:,} jobs together (the simulator keeps every job "
                      "in memory)", f"copies = {max(1, HARD_MAX_JOBS // jobs):,} at most, or fewer jobs")
            return False
        return True

    def arrives_late(self, path: tuple[str, ...], what: str, arrivals: list[float], fix: str) -> None:
        """Warn of bags that arrive after the horizon, or at it: the run stops before they are submitted, and
        reports them "not arrived", or as they are, and reports them "active" with nothing run (a bag arriving
        at the horizon itself was not warned of)."""
        late = [a for a in arrivals if a >= self.horizon]
        if not late:
            return
        horizon = _span(self.horizon)
        if len(arrivals) == 1 and late[0] > self.horizon:
            which = (f"it arrives at {_span(late[0])}, after the simulation's horizon ({horizon}): the run stops "
                     'first, and reports it "not arrived"')
        elif len(arrivals) == 1:
            which = (f"it arrives at {_span(late[0])}, at the simulation's horizon: the run stops as it arrives, "
                     'and reports it "active" with nothing run')
        elif min(late) > self.horizon:
            which = (f"{len(late)} of its {len(arrivals)} bags arrive after the simulation's horizon ({horizon}), "
                     f'the last at {_span(max(late))}: the run stops first, and reports them "not arrived"')
        else:
            which = (f"{len(late)} of its {len(arrivals)} bags arrive at or after the simulation's horizon "
                     f"({horizon}), the last at {_span(max(late))}: the run stops first, and reports them "
                     '"not arrived" (those at the horizon itself "active", with nothing run)')
        self.warn((*path, "arrival"), f"{what}: {which}",
                  f'raise [simulation] horizon above it (horizon = "{math.ceil(max(late) / 86400) + 1}d"), or {fix}')

    def qos(self, t: dict[str, Any], path: tuple[str, ...], name: str) -> BagSpec:
        """A bag's deadline (after it arrives: a duration) and budget, as a spec holds them."""
        values: dict[str, Any] = {}
        if "bag_deadline" in t:
            try:
                values["bag_deadline"] = parse_duration(t["bag_deadline"])
            except ValueError as e:
                self.fail((*path, "bag_deadline"), f"bag_deadline of bag '{name}': {e}", 'bag_deadline = "2h"')
        if "budget" in t:
            if problem := budget_problem(t["budget"]):
                self.fail((*path, "budget"), f"bag '{name}': {problem}", "budget = 600")
            else:
                values["budget"] = float(t["budget"])
        return BagSpec(name=name, **values)

    def strategy(self, table: object, path: tuple[str, ...], name: str, qos: BagSpec | None = None) -> StrategyChoice:
        """A bag's `[strategy]` table, parsed as a spec's and checked against the registry (with its deadline
        and budget, which it must keep)."""
        try:
            choice = parse_strategy(table, f"bag '{name}'")
            has_queues = self.has_queues
            spec = with_qos_placement(msgspec.structs.replace(qos or BagSpec(name=name), strategy=choice))
            spec = registry.default_placement(spec, has_queues)  # as the server does: a named gridbot too
            registry.check_bag(spec, has_queues)
            choice = spec.strategy
        except (SpecError, StrategyError) as e:
            self.fail((*path, "strategy"), f"bag '{name}': {e}")
            return StrategyChoice()
        return choice


    def swf_bags(self, name: str, t: object) -> list[BagModel]:
        """Bags from an SWF job log: each job that ran becomes a bag of as many jobs as it had processors,
        each running the job's run time, arriving at its submit time (from the first one taken); with
        `burst`, each burst of one user's jobs becomes one bag. Records are filtered by status (killed jobs'
        run times are not run times), user, queue and partition."""
        path = ("swf_bags", name)
        if not isinstance(t, dict):
            self.fail(path, f"swf_bags '{name}' must be a table", f'[swf_bags.{name}]\nswf = "NASA-iPSC"\ncount = 20')
            return []
        before = len(self.problems)
        self.keys(t, ("swf", "skip", "count", "time_scale", "max_jobs", "instance_deadline", "max_failures",
                      "policy", "burst", "strategy", *traces.SwfFilter.KEYS), path, f"swf_bags '{name}'")
        strategy = self.strategy(t.get("strategy", {}), path, name)
        if "swf" not in t:
            self.fail(path, f"swf_bags '{name}' names no log", 'swf = "NASA-iPSC" (shipped) or a path')
            return []
        skip = self.get(t, "skip", path, 0, _int(0))
        count = self.get(t, "count", path, 20, _int(1))
        scale = self.get(t, "time_scale", path, 1.0, _time_scale)
        max_jobs = self.get(t, "max_jobs", path, 10_000, _int(1, HARD_MAX_JOBS))
        deadline = self.get(t, "instance_deadline", path, 24 * 3600.0, _dur(False))
        max_failures = self.get(t, "max_failures", path, 3, _int(1))
        burst = self.get(t, "burst", path, None, _dur(True))
        for key in traces.SwfFilter.KEYS:  # each key's mistake reported on its own line
            self.get(t, key, path, None, _swf_filter(key))
        policy = t.get("policy", {})
        if not isinstance(policy, dict) or not all(isinstance(v, str) for v in policy.values()):
            self.fail((*path, "policy"), f"the policy of swf_bags '{name}' must be a table of strings")
            policy = {}
        self.policies(policy, deadline, path, f"swf_bags '{name}'")
        if len(self.problems) > before:
            return []
        try:
            records = traces.swf_records(traces.swf_source(str(t["swf"]), self.base), traces.SwfFilter.from_table(t))
        except traces.TraceError as e:
            self.fail((*path, "swf"), f"swf_bags '{name}': {e}")
            return []
        groups = [[r] for r in records] if burst is None else traces.swf_bursts(records, burst)
        groups = groups[skip:skip + count]
        if not groups:
            return []
        self.warn_overdue(path, name, [r for g in groups for r in g], max_failures, deadline)
        first = groups[0][0].submit
        bags = []
        for g in groups:
            arrival = (g[0].submit - first) * scale
            if len(g) == 1:  # one job of the log: its processors are the bag's jobs
                bags.append(BagModel(f"{name}-{g[0].number}", min(g[0].procs, max_jobs), constant(g[0].run),
                                     arrival, deadline, max_failures, dict(policy), strategy=strategy))
                continue
            runs = tuple(r.run for r in g for _ in range(min(r.procs, max_jobs)))[:max_jobs]
            bags.append(BagModel(f"{name}-{g[0].number}", len(runs), empirical(runs, f"burst of {len(g)} jobs"),
                                 arrival, deadline, max_failures, dict(policy), runs, strategy=strategy))
        self.arrives_late(path, f"swf_bags '{name}'", [b.arrival for b in bags],
                          "lower time_scale or count (or skip the first records)")
        return bags

    def warn_overdue(self, path: tuple[str, ...], name: str, records: list[traces.SwfJob], max_failures: int,
                     deadline: float) -> None:
        """Warn of replayed jobs that run longer than `max_failures` instance deadlines: each instance is
        counted lost at its deadline and re-sent, and the job fails for good before its first instance ends
        (issue 14: the defaults, 3 and 1 day, failed every job of a log running over 3 days, without a word;
        the 13.5-day job of the first 40 of the CESNET log `wagap-2013` did)."""
        limit = max_failures * deadline
        longer = [r.run for r in records if r.run > limit]
        if not longer:
            return
        longest = max(longer)
        self.warn((*path, "instance_deadline"),
                  f"swf_bags '{name}': {len(longer)} of the {len(records)} jobs replayed run longer than max_failures "
                  f"x instance_deadline ({max_failures} x {_span(deadline)}), up to {_span(longest)}: each instance "
                  "is counted lost at its deadline and the job sent again, so these jobs fail for good before one "
                  "ends (wherever other hosts are free to take the copies)",
                  f'raise instance_deadline above the longest run (instance_deadline = '
                  f'"{math.ceil(longest / 86400)}d"), or leave the long jobs out (queue = [...], user = [...])')


def _swf_filter(key: str) -> Callable[[Any], traces.SwfFilter]:
    return lambda v: traces.SwfFilter.from_table({key: v})


def _span(seconds: float) -> str:
    """A duration for a person: `3 d`, `36 h`, `20 min`, `45 s`."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def _knob_value(k: Knob) -> Callable[[Any], Any]:
    """The check and conversion of a `[server]` key, by its field's kind."""
    if k.kind == "count":
        return _int(int(k.low))
    if k.kind == "flag":
        return _bool
    if k.kind == "pools":
        return lambda v: frozenset(_strings(v))
    assert k.kind == "seconds", f"{k.name}: a {k.kind} field has no scenario key"
    return _seconds(k.low)


def _seconds(low: float) -> Callable[[Any], float]:
    def convert(v: Any) -> float:
        out = seconds(v, allow_zero=False)
        if out < low:
            raise ValueError(f"must be at least {low:g} s, not {shown(v)}")
        return out
    return convert


INT_CEILING = 2**53
"""The largest whole number a scenario takes where it names no other bound: beyond it a count means nothing
here, and the ClassAd library (64-bit integers) fails on it in the middle of a run."""


def _int(low: int, high: int | None = None) -> Callable[[Any], int]:
    top = INT_CEILING if high is None else high
    def convert(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"must be a whole number of at least {low}, not {shown(v)}")
        if v > top:
            raise ValueError(f"must be a whole number of at most {top:,}, not {shown(v)}")
        return v
    return convert


def check_seed(v: Any) -> int:
    """A run's seed, the scenario's `seed` and `gridbot simulate --seed` alike: a whole number from 0 to
    INT_CEILING (ValueError otherwise)."""
    return _int(0)(v)


def _fraction(high: float) -> Callable[[Any], float]:
    """A number from 0 to `high`, finite even when `high` is not (`time_scale = inf` made a NaN arrival)."""
    def convert(v: Any) -> float:
        number = as_float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan
        if not (0 <= number <= high and math.isfinite(number)):
            rule = f"from 0 to {high:g}" if math.isfinite(high) else "of 0 or more, finite"
            raise ValueError(f"must be a number {rule}, not {shown(v)}")
        return float(v)
    return convert


def _time_scale(v: Any) -> float:
    """An SWF replay's `time_scale`: a finite number above 0. 0 would put every bag at time 0, a meaning the
    key does not have (it scales the log's gaps between submissions); `time_scale = inf` made a NaN arrival."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < as_float(v) < math.inf:
        raise ValueError(f"must be a number above 0, finite, not {shown(v)}: the log's gaps between submissions are "
                         "multiplied by it (time_scale = 0.01 replays them 100 times closer)")
    return float(v)


def _shape(v: Any) -> float:
    """A Gamma shape: a positive finite number (`failure_spread`)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < as_float(v) < math.inf:
        raise ValueError(f"must be a positive number, the shape of a Gamma distribution of mean 1 (0.75 for "
                         f"machines as uneven as Los Alamos' nodes; leave it out for machines alike), not "
                         f"{shown(v)}")
    return float(v)


def _dur(allow_zero: bool) -> Callable[[Any], float]:
    return lambda v: seconds(v, allow_zero=allow_zero)


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def convert(v: Any) -> str:
        if v not in options:
            raise ValueError(f"{shown(v)} is not one of {', '.join(options)}" +
                             (f"; {hint}" if (hint := closest(str(v), options)) else ""))
        return str(v)
    return convert


def _dist(base: Path, what: str, durations: bool = True) -> Callable[[Any], Dist]:
    return lambda v: parse_dist(v, what, durations, base)


def _life(base: Path, what: str) -> Callable[[Any], Dist]:
    """A host's or a pilot's life (`availability`, `preemption` as a table): a distribution whose mean is above
    zero. A life of 0 ended every pilot the moment it started, and the simulation ran to its horizon saying no
    worker was connected (the audit of 2026-11-29)."""
    def convert(v: Any) -> Dist:
        dist = parse_dist(v, what, base=base)
        rng = random.Random(0)  # (a normal's mean is not its clipped draws': mean 0, sd 10h lives about 8 h)
        if not dist.mean > 0 and not any(dist.sample(rng) > 0 for _ in range(64)):
            raise ValueError(f"is a life of {dist.describe}: every pilot (a host, for availability) would end the "
                             'moment it started; give a life above zero, like { dist = "weibull", shape = 0.5, '
                             'scale = "90h" }, or leave the key out for none')
        return dist
    return convert


def _preemption(base: Path, what: str) -> Callable[[Any], Dist | None]:
    """A pilot's life until preemption: a table is its distribution (`{ fta = "nd07cpu" }`); a number is
    the older form, a constant rate per hour of life, drawn exactly as it always was (so a scenario
    written that way gives the same runs); 0 is no preemption."""
    def convert(v: Any) -> Dist | None:
        if isinstance(v, dict):
            return _life(base, what)(v)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= as_float(v) < math.inf:
            raise ValueError(f"must be a rate (pilots killed per hour of their life, like 0.1) or a table giving "
                             f'the distribution of a pilot\'s life, like {{ dist = "weibull", shape = 0.5, '
                             f'scale = "90h" }}, not {shown(v)}')
        if v == 0:
            return None
        rate = float(v) / 3600.0
        return Dist(f"exponential({v:g} per hour)", lambda rng: rng.expovariate(rate), 1 / rate)
    return convert


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"must be true or false, not {shown(v)}")
    return v


def _strings(v: Any) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise ValueError('must be a list of pool names, like ["technion"]')
    return v


def _attributes(v: Any) -> dict[str, str | int | float | bool]:
    if not isinstance(v, dict) or not all(isinstance(x, str | int | float | bool) for x in v.values()):
        raise ValueError("must be a table of plain values (strings, numbers, true/false)")
    for key, x in v.items():
        if problem := classad_int_problem(key, x):
            raise ValueError(problem)
    return v


def _is_host_trace(v: Any) -> bool:
    """Whether a pool's `size` names a trace of named hosts (`{ hosts = "volunteers.csv" }`)."""
    return isinstance(v, dict) and set(v) == {"hosts"}


def _size(v: Any, base: Path) -> tuple[list[SizeStep], tuple[int, int, float] | None]:
    """`100`; `[[0, 100], ["6h", 400]]`; `{ min = 10, max = 100, every = "1h" }`; or `{ trace = "f.csv" }`."""
    if isinstance(v, dict) and set(v) == {"trace"}:
        try:
            v = [[at, n] for at, n in traces.size_steps(base / str(v["trace"]))]
        except traces.TraceError as e:
            raise ValueError(str(e)) from None
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return [SizeStep(0.0, v)], None
    if isinstance(v, list) and v:
        steps = []
        for item in v:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[1], int)
                    and not isinstance(item[1], bool) and item[1] >= 0):
                raise ValueError(f"each step is [time, size], like [\"6h\", 400], not {item!r}")
            steps.append(SizeStep(seconds(item[0]), item[1]))
        if [s.at for s in steps] != sorted(s.at for s in steps):
            raise ValueError("the steps must be in time order")
        if steps[0].at > 0:
            steps.insert(0, SizeStep(0.0, 0))
        return steps, None
    if isinstance(v, dict) and set(v) == {"min", "max", "every"}:
        low, high = _int(0)(v["min"]), _int(0)(v["max"])
        if high < low:
            raise ValueError(f"max ({high}) is below min ({low})")
        return [SizeStep(0.0, high)], (low, high, seconds(v["every"], allow_zero=False))
    raise ValueError(f"{v!r} is not a size: write 100, a list of [time, size] steps, "
                     '{ min = 10, max = 100, every = "1h" }, { trace = "sizes.csv" }, or for a community pool '
                     '{ hosts = "volunteers.csv" }')


def scaled_pool(p: PoolModel, factor: float) -> PoolModel:
    """A pool of pilots (not named hosts) at `factor` of its size: its sizes, machines and queue limit, each
    at least 1 where it was not 0 (`scaled`; an experiment's larger pools, with a factor above 1)."""
    import dataclasses

    def n(x: int) -> int:
        return 0 if x == 0 else max(1, round(x * factor))

    size = [SizeStep(s.at, n(s.size)) for s in p.size]
    fluctuate = (n(p.fluctuate[0]), n(p.fluctuate[1]), p.fluctuate[2]) if p.fluctuate else None
    p = dataclasses.replace(p, size=size, fluctuate=fluctuate)
    spec = msgspec.structs.replace(p.spec, max_running=p.max_size, max_queued=n(p.spec.max_queued))
    return dataclasses.replace(p, spec=spec, hosts=max(p.max_size, n(p.hosts)))


def scaled(sc: Scenario, factor: float) -> Scenario:
    """The same scenario at `factor` of its size: jobs, pool sizes, machines and the scheduling buffer
    (whose share of a bag sets the tail threshold), the tail threshold and `replicate_below` scaled alike,
    so a run shows the same shape sooner."""
    import dataclasses

    if not 0 < factor <= 1:
        raise ValueError(f"a scale must be above 0 and at most 1, not {factor:g}")

    def n(x: int, low: int = 1) -> int:
        return 0 if x == 0 else max(low, round(x * factor))

    pools = []
    for p in sc.pools:
        if p.sessions:  # named hosts: a sample of them, evenly spaced in name order, each with all its sessions
            names = sorted({s.host for s in p.sessions})
            kept = {names[int(k * len(names) / n(len(names)))] for k in range(n(len(names)))}
            sessions = tuple(s for s in p.sessions if s.host in kept)
            size = [SizeStep(at, count) for at, count in traces.online_steps(sessions)]
            top = max(s.size for s in size)
            spec = msgspec.structs.replace(p.spec, max_running=top, max_queued=n(p.spec.max_queued))
            pools.append(dataclasses.replace(p, spec=spec, size=size, hosts=len(kept), sessions=sessions))
            continue
        pools.append(scaled_pool(p, factor))
    bags = [dataclasses.replace(b, jobs=n(b.jobs)) for b in sc.bags]
    dispatch = dataclasses.replace(sc.dispatch, buffer_size=n(sc.dispatch.buffer_size, 10),
                                   tail_threshold=n(sc.dispatch.tail_threshold),
                                   replicate_below=n(sc.dispatch.replicate_below))
    return dataclasses.replace(sc, pools=pools, bags=bags, dispatch=dispatch)

"""The read-only view of the dispatcher that strategies, the overlay's planner and the server read.

It answers from the dispatcher's records (core/records.py) without exposing them: bags, hosts, jobs and
instances come out as small views whose fields cannot be assigned, counters as copies. The composite ads
of the paper's policies (a host's, a job's with its replicas) are built here, as the kernel and the
strategies both need them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import NamedTuple

import msgspec

from gridbot.core.changes import BagCounts
from gridbot.core.config import DispatchConfig
from gridbot.core.hosts import HostStats
from gridbot.core.ledger import Bill, HostTerm, Prices
from gridbot.core.records import BagRecord, Ended, HostRecord, Job, State, busy_slots, guarded, has_wide_jobs
from gridbot.core.strategy import TailPlan
from gridbot.model.pools import PoolMonitor
from gridbot.model.records import HostInfo
from gridbot.model.spec import BagSpec
from gridbot.model.states import BagState, InstanceState, JobState
from gridbot.policy.evaluator import BagPolicies, HostAd, host_ad


class BagView:
    """An active bag as strategies see it."""

    __slots__ = ("_b",)

    def __init__(self, record: BagRecord) -> None:
        self._b = record

    @property
    def bag_id(self) -> int:
        return self._b.bag_id

    @property
    def name(self) -> str:
        return self._b.spec.name

    @property
    def spec(self) -> BagSpec:
        return self._b.spec

    @property
    def state(self) -> BagState:
        return self._b.state

    @property
    def counts(self) -> BagCounts:
        """A copy of the bag's counters."""
        return msgspec.structs.replace(self._b.counts)

    @property
    def queued(self) -> int:
        return self._b.counts.queued

    @property
    def running(self) -> int:
        return self._b.counts.running

    @property
    def created_at(self) -> float:
        return self._b.created_at

    @property
    def last_sent(self) -> float:
        """When an instance of the bag was last sent (0: never)."""
        return self._b.last_sent

    @property
    def tail(self) -> bool:
        """The bag is in its tail phase, as its tail strategy said at the last refresh of its ad."""
        return self._b.tail

    @property
    def phase(self) -> str:
        """parked (its window given up for a while), tail, or throughput."""
        if self._b.window.parked_until is not None:
            return "parked"
        return "tail" if self._b.tail else "throughput"

    @property
    def parked_until(self) -> float | None:
        return self._b.window.parked_until

    @property
    def window(self) -> int:
        """Queued jobs in the feeder's window."""
        return len(self._b.window.buffer)

    @property
    def waiting_replicas(self) -> int:
        """Replicas chosen and not yet sent."""
        return len(self._b.replicas)

    @property
    def mean_run_time(self) -> float:
        """Mean seconds from send to good result since the server started (0: none yet)."""
        b = self._b
        return b.run_time_sum / b.good_results if b.good_results else 0.0

    @property
    def policies(self) -> BagPolicies:
        """The bag's compiled policies, with its ad as of the last refresh (evaluate, do not change)."""
        return self._b.policies

    @property
    def strategies(self) -> tuple[str, str]:
        """The names of the bag's tail strategy and placement."""
        return self._b.tail_strategy.name, self._b.placement.name

    def on_pool(self, pool: str) -> tuple[int, int]:
        """Instances of the bag sent to the pool since the dispatcher took it up, and running there now."""
        counts = self._b.on_pool.get(pool)
        return (counts[0], counts[1]) if counts else (0, 0)

    def queued_ids(self) -> set[int]:
        """The ids of the bag's queued jobs the dispatcher holds (queued again, and its window)."""
        return {j.job_id for queue in (self._b.retry, self._b.window.buffer) for j in queue
                if j.state is JobState.QUEUED}

    def unplaced(self, limit: int, placed: Mapping[int, object], pools: Sequence[str]) -> list[JobView]:
        """Up to `limit` of the bag's queued jobs, in the order they would be sent, that are not in `placed` and are
        new, queued again after an instance, or routed to none of `pools` (a stateful placement's work: where the
        bag no longer goes). It stops at `limit`, so placing a few jobs of a big window stays cheap."""
        out: list[JobView] = []
        for queue in (self._b.retry, self._b.window.buffer):
            for j in queue:
                if len(out) >= limit:
                    return out
                if j.state is JobState.QUEUED and j.job_id not in placed and (
                        j.pools is None or j.attempts > 0 or not j.pools & set(pools)):
                    out.append(_job_view(j))
        return out

    def queued_jobs(self, limit: int) -> list[JobView]:
        """Up to `limit` of the bag's queued jobs the dispatcher holds, in the order they will be sent: those
        queued again first, then its window (jobs still in the store are not here until read)."""
        out: list[JobView] = []
        for queue in (self._b.retry, self._b.window.buffer):
            for j in queue:
                if len(out) >= limit:
                    return out
                if j.state is JobState.QUEUED:
                    out.append(_job_view(j))
        return out

    @property
    def pools_used(self) -> list[str]:
        """Pools the bag has sent instances to since the dispatcher took it up."""
        return list(self._b.on_pool)

    @property
    def history(self) -> list[Ended]:
        """The bag's instances that ended or were lost, oldest first (also read after the bag ended, through
        a view kept from before: `tail_plan`)."""
        return sorted(self._b.history.values())

    def recent(self, n: int) -> list[Ended]:
        """Its last `n` instances to end or be lost, the last first: without sorting all of its history (a
        strategy reading it on every plan)."""
        return list(islice(reversed(self._b.history.values()), max(0, n)))

    @property
    def tail_plan(self) -> TailPlan | None:
        """What the bag's tail strategy planned and how its tail went (`TailStrategy.summary`)."""
        b = self._b
        plan: TailPlan | None = guarded(b, f"tail={b.tail_strategy.name} summary", None, b.tail_strategy.summary, self)
        return plan


class HostView:
    """A host as strategies see it."""

    __slots__ = ("_h",)

    def __init__(self, record: HostRecord) -> None:
        self._h = record

    @property
    def host_id(self) -> str:
        return self._h.info.host_id

    @property
    def info(self) -> HostInfo:
        return self._h.info

    @property
    def pool(self) -> str:
        return self._h.info.pool

    @property
    def slots(self) -> int:
        return self._h.info.slots

    @property
    def running(self) -> int:
        """Instances the host holds now."""
        return len(self._h.running)

    @property
    def first_seen(self) -> float:
        return self._h.first_seen

    @property
    def last_seen(self) -> float:
        return self._h.last_seen

    @property
    def stats(self) -> HostStats:
        """A copy of the host's statistics."""
        return msgspec.structs.replace(self._h.stats)


@dataclass(frozen=True, slots=True)
class JobView:
    """A job the dispatcher holds (queued in a window, running, or waiting for a late report)."""

    job_id: int
    bag_id: int
    index: int
    state: JobState
    failures: int
    attempts: int
    live: tuple[int, ...]
    """Its running instances, oldest first."""
    replica_pending: bool
    pools: frozenset[str] | None
    votes: tuple[tuple[int, bytes], ...] = ()
    """A quorum job's results waiting for their quorum: (instance, vote), in the order they came; results with
    one vote agree."""


class InstanceView(NamedTuple):
    """A running or overdue instance."""

    instance_id: int
    job_id: int
    host_id: str
    state: InstanceState
    sent_at: float
    deadline: float


class PoolView(NamedTuple):
    """What the dispatcher saw of a pool's hosts since it started."""

    name: str
    hosts: int
    """Hosts heard from within the host timeout."""
    slots: int
    busy: int
    """Slots of those hosts holding an instance."""
    done: int
    failed: int
    mean_turnaround: float
    """Mean seconds from send to good result on the pool (0: none yet)."""
    bandwidth: float = 0.0
    """MB/s its hosts measured downloading inputs from the server (0: none downloaded yet)."""
    idle_hosts: tuple[int, ...] = ()
    """The idle slots of each of those hosts (a job wider than each fragment fits none)."""


class DispatchView:
    """Read-only access to what the dispatcher holds."""

    def __init__(self, state: State) -> None:
        self._s = state

    @property
    def config(self) -> DispatchConfig:
        return self._s.config

    # -- bags and jobs --------------------------------------------------------------------------------

    def bags(self) -> list[BagView]:
        """The active bags, oldest first."""
        return [BagView(b) for b in self._s.bags.values()]

    @property
    def active(self) -> int:
        """How many bags are active."""
        return len(self._s.bags)

    def bag(self, bag_id: int) -> BagView | None:
        b = self._s.bags.get(bag_id)
        return BagView(b) if b is not None else None

    def __contains__(self, bag_id: int) -> bool:
        """Whether the bag is active here."""
        return bag_id in self._s.bags

    def job(self, job_id: int) -> JobView | None:
        j = self._s.jobs.get(job_id)
        return _job_view(j) if j is not None else None

    def running_jobs(self, bag_id: int) -> Iterator[JobView]:
        """The bag's running jobs with an instance out, by job id."""
        jobs = [j for j in self._s.jobs.values() if j.bag_id == bag_id and j.state is JobState.RUNNING and j.live]
        return (_job_view(j) for j in sorted(jobs, key=lambda j: j.job_id))

    def instances(self, job_id: int) -> list[InstanceView]:
        """The job's running instances, oldest first."""
        j = self._s.jobs.get(job_id)
        if j is None:
            return []
        out = []
        for iid in sorted(j.live):
            i = self._s.instances[iid]
            out.append(InstanceView(iid, j.job_id, i.host_id, i.state, i.sent_at, i.instance_deadline))
        return out

    def running_instances(self) -> list[int]:
        """The ids of every running instance, in increasing order."""
        return sorted(self._s.running)

    def instance(self, instance_id: int) -> InstanceView | None:
        """A running or overdue instance (None: ended, or never sent)."""
        i = self._s.instances.get(instance_id)
        if i is None:
            return None
        return InstanceView(instance_id, i.job.job_id, i.host_id, i.state, i.sent_at, i.instance_deadline)

    def accepts_pool(self, bag_id: int, pool: str) -> bool:
        """Whether an active bag's GridPolicy accepts a pool of the pools file (the overlay asks)."""
        return accepts(self._s.bags[bag_id], pool, self._s.pool_ads[pool])

    def held_back(self, bag_id: int, now: float) -> dict[str, bool]:
        """The pools whose pilots the bag kept refusing (`records.Refusals`): True where it may have none of
        their pilots now, False where one at a time."""
        after = self._s.config.refused_pilots
        return {pool: now < r.until for pool, r in self._s.bags[bag_id].refusals.items() if r.held(after)}

    def pilots_wanted(self, bag_id: int, pools: Sequence[str], now: float) -> Mapping[str, int] | None:
        """The slots the bag wants per pool among `pools`: its tail strategy's say first, then its
        placement's (None: the overlay's planner decides)."""
        b = self._s.bags[bag_id]
        view = BagView(b)
        wanted: Mapping[str, int] | None = guarded(b, f"tail={b.tail_strategy.name} pilots", None,
                                                   b.tail_strategy.pilots, self, view, pools, now)
        if wanted is None:
            wanted = guarded(b, f"placement={b.placement.name} pilots", None,
                             b.placement.pilots, self, view, pools, now)
        return wanted

    def history(self, bag_id: int) -> list[Ended]:
        """The bag's instances that ended or were lost, oldest first (the last `HISTORY` of them)."""
        b = self._s.bags.get(bag_id)
        return sorted(b.history.values()) if b is not None else []

    # -- hosts and pools ------------------------------------------------------------------------------

    def hosts(self) -> list[HostView]:
        """Hosts heard from within the host timeout (as of the last tick, or since)."""
        return [HostView(h) for h in self._s.live_hosts.values()]

    def known_hosts(self) -> list[HostView]:
        """Every host heard from since the server started (or restored from the store)."""
        return [HostView(h) for h in self._s.hosts.values()]

    def busy_slots(self, host_id: str) -> int:
        """Slots the host's running instances hold (each its bag's `cpus`)."""
        h = self._s.hosts.get(host_id)
        return busy_slots(self._s, h) if h is not None else 0

    def host(self, host_id: str) -> HostView | None:
        h = self._s.hosts.get(host_id)
        return HostView(h) if h is not None else None

    def host_attrs(self, host_id: str, now: float) -> dict[str, object]:
        """The host's ClassAd attributes as of `now` (empty for a host never heard from)."""
        h = self._s.hosts.get(host_id)
        return attrs(self._s, h, now) if h is not None else {}

    def pool_ad(self, name: str) -> dict[str, object] | None:
        """The ad of a pool of the pools file (its price, reliability, size...)."""
        ad = self._s.pool_ads.get(name)
        return dict(ad) if ad is not None else None

    def pool_names(self) -> list[str]:
        """The pools of the pools file."""
        return list(self._s.pool_ads)

    def monitor(self, pool: str) -> PoolMonitor | None:
        """The last reading of the pool's own monitoring (None: it has none)."""
        return self._s.monitors.get(pool)

    def monitors(self) -> dict[str, PoolMonitor]:
        """The last reading of every pool that has one."""
        return dict(self._s.monitors)

    def pool_errors(self) -> dict[str, str]:
        return dict(self._s.pool_errors)

    def pools(self, now: float) -> dict[str, PoolView]:
        """Per pool (of the pools file, or of a host heard from): its live hosts and results so far."""
        horizon = now - self._s.config.host_timeout
        names = dict.fromkeys([*self._s.pool_ads, *self._s.pools])
        live: dict[str, list[HostRecord]] = {}
        for h in self._s.live_hosts.values():
            if h.last_seen >= horizon:
                names[h.info.pool] = None
                live.setdefault(h.info.pool, []).append(h)
        out = {}
        wide = has_wide_jobs(self._s)
        for name in names:
            rec = self._s.pools.get(name)
            hosts = live.get(name, [])
            done = rec.done if rec else 0
            busy = [min(busy_slots(self._s, h, wide), h.info.slots) for h in hosts]
            out[name] = PoolView(name, len(hosts), sum(h.info.slots for h in hosts), sum(busy), done,
                                 rec.failed if rec else 0, rec.turnaround_sum / done if rec and done else 0.0,
                                 rec.fetched_bytes / rec.fetch_s / 1e6 if rec and rec.fetch_s > 0 else 0.0,
                                 tuple(h.info.slots - b for h, b in zip(hosts, busy, strict=True)))
        return out

    # -- money --------------------------------------------------------------------------------------

    def prices(self, pool: str) -> Prices:
        """What a pool charges, from its ad (a pool not in the pools file is free)."""
        return Prices.of(self._s.pool_ads.get(pool))

    def bill(self, bag_id: int) -> Bill:
        """What the bag (active or ended since the server started) has spent, per pool (core/ledger.py)."""
        return self._s.ledger.bill(bag_id, self._term, self.prices)

    def idle_pilots(self) -> float:
        """What the pilots that ran no instance with a report cost (nobody's share of it)."""
        terms = {h: HostTerm(r.info.pool, r.first_seen, max(r.first_seen, r.contact)) for h, r in self._s.hosts.items()}
        return self._s.ledger.idle_pilots(terms, self.prices)

    def running_by_pool(self, bag_id: int) -> dict[str, list[tuple[float, str]]]:
        """The bag's running instances per pool of their host ("" for a host not known): when each was sent,
        and its host."""
        out: dict[str, list[tuple[float, str]]] = {}
        for inst in self._s.running.values():
            if inst.job.bag_id == bag_id:
                h = self._s.hosts.get(inst.host_id)
                out.setdefault(h.info.pool if h is not None else "", []).append((inst.sent_at, inst.host_id))
        return out

    def running_by_bag(self) -> dict[int, dict[str, list[tuple[float, str]]]]:
        """`running_by_pool` for every bag at once, in one pass over the running instances."""
        out: dict[int, dict[str, list[tuple[float, str]]]] = {}
        for inst in self._s.running.values():
            h = self._s.hosts.get(inst.host_id)
            pools = out.setdefault(inst.job.bag_id, {})
            pools.setdefault(h.info.pool if h is not None else "", []).append((inst.sent_at, inst.host_id))
        return out

    def _term(self, host_id: str) -> HostTerm | None:
        h = self._s.hosts.get(host_id)
        return HostTerm(h.info.pool, h.first_seen, max(h.first_seen, h.contact)) if h is not None else None

    # -- composite ads --------------------------------------------------------------------------------

    def host_ad(self, host_id: str, now: float) -> HostAd | None:
        h = self._s.hosts.get(host_id)
        return host_ad_of(self._s, h, now) if h is not None else None

    def job_ad(self, job_id: int, now: float) -> dict[str, object]:
        """The job's ad with one Replica<i> ad per instance out, each with its host's ad (paper, Figure 3)."""
        return job_ad(self._s, self._s.jobs[job_id], now)


def _job_view(j: Job) -> JobView:
    return JobView(j.job_id, j.bag_id, j.index, j.state, j.failures, j.attempts, tuple(sorted(j.live)),
                   j.replica_pending, j.pools, tuple((c.instance_id, c.digest) for c in j.candidates or ()))


def accepts(bag: BagRecord, pool: str, pool_ad: dict[str, object]) -> bool:
    """GridPolicy's answer for a pool, kept per bag until its ad or policies change."""
    ok = bag.pool_ok.get(pool)
    if ok is None:
        ok = bag.pool_ok[pool] = bag.policies.accepts_pool(pool_ad)
    return ok and not bag.policies.set_aside  # (set aside after its answers were kept: no pool any more)


def attrs(state: State, host: HostRecord, now: float) -> dict[str, object]:
    """The host's ClassAd attributes as of `now`."""
    out = host.stats.attrs(host.info, len(host.running), now, state.others_good_at(host.info.host_id),
                           any(h != host.info.host_id for h in state.busy))
    out["Reliable"] = host.info.pool in state.config.reliable_pools
    return out


def host_ad_of(state: State, host: HostRecord, now: float) -> HostAd:
    """The host's ClassAd as of `now`, kept per host and updated where attributes changed (most stay the
    same from one request to the next, and building an ad from scratch costs more)."""
    new = attrs(state, host, now)
    if host.ad is None:
        host.ad = host_ad(new)
    else:
        old = host.ad_attrs
        for k, v in new.items():
            if k not in old or old[k] != v or type(old[k]) is not type(v):
                host.ad[k] = v
    host.ad_attrs = new
    return host.ad


def job_ad(state: State, job: Job, now: float) -> dict[str, object]:
    """The job's ad with one Replica<i> ad per instance out, each with its host's ad (paper, Figure 3)."""
    spec = state.bags[job.bag_id].spec
    bag_name = spec.name
    ad: dict[str, object] = {"Name": f"{bag_name}.{job.index}", "Index": job.index,
                             "NumberOfReplicas": len(job.live), "Failures": job.failures, "Cpus": spec.cpus,
                             "Memory": (spec.memory or 0) >> 20}
    for i, iid in enumerate(sorted(job.live), 1):
        inst = state.instances[iid]
        host = state.hosts.get(inst.host_id)
        ad[f"Replica{i}"] = {
            "Name": f"{bag_name}.{job.index}.{i}", "SentTime": inst.sent_at, "RunTime": now - inst.sent_at,
            "Host": attrs(state, host, now) if host is not None else {}}
    return ad

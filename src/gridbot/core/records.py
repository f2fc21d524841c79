"""The dispatcher's records of what it holds: jobs, instances, bags, hosts, and the whole of them (`State`).

They are the core's own: the kernel changes them, the view reads them, and nothing outside the core
sees them (strategies, the overlay and the server read `DispatchView`, which wraps them).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from gridbot.core.changes import BagCounts
from gridbot.core.config import DispatchConfig
from gridbot.core.feeder import Window
from gridbot.core.hosts import HostStats
from gridbot.core.ledger import Ledger
from gridbot.core.strategy import PlacementStrategy, TailStrategy
from gridbot.model.pools import PoolMonitor
from gridbot.model.records import HostInfo, Limits
from gridbot.model.spec import BagSpec
from gridbot.model.states import BagState, InstanceState, JobState
from gridbot.policy.evaluator import BagPolicies, HostAd


@dataclass(slots=True)
class Job:
    """A job the dispatcher currently holds: in a bag's window, running, or waiting for a late report."""

    job_id: int
    bag_id: int
    index: int
    line: str | None
    state: JobState
    failures: int = 0
    attempts: int = 0
    live: set[int] = field(default_factory=set)
    overdue: set[int] | None = None
    in_buffer: bool = False
    reason: str = ""
    quick_failures: list[str] | None = None
    """Hosts that failed this job right after starting it: blamed if another host then does it."""
    replica_pending: bool = False
    failed_on: dict[str, float] | None = None
    """When the job last failed on each host (the three are made on first use: most jobs never fail, and a
    window of twenty thousand jobs paid for them all)."""
    pools: frozenset[str] | None = None
    """Pools the job was moved to by its placement strategy (None: any its policies accept)."""
    routed: bool = False
    """`pools` is its tail strategy's route for its next instance only (cleared when that one is sent)."""
    replica_pools: frozenset[str] | None = None
    """Pools its pending replica may go to, as its tail strategy chose (None: any)."""
    candidates: list[Candidate] | None = None
    """Results waiting for their quorum (a bag with `quorum` > 1), in the order they came."""
    single: str = ""
    """The host it was sent to unreplicated, for its long record of valid results or its trusted pool: that
    host's result counts as a quorum alone (adaptive replication)."""


class Candidate(NamedTuple):
    """A good result of a job whose bag asks for a quorum: which instance, whose, and what it said."""

    instance_id: int
    host_id: str
    account: str
    digest: bytes
    sent_at: float
    cpu_s: float
    reported_at: float


@dataclass(slots=True)
class Instance:
    """One run of a job on one host: running, or overdue and waiting for a late report."""

    instance_id: int
    job: Job
    host_id: str
    state: InstanceState
    sent_at: float
    instance_deadline: float
    pool: str = ""
    """Its host's pool when it was sent."""


REFUSED_BACKOFF_CAP = 3600.0
"""Longest wait between two pilots of a pool whose pilots a bag keeps refusing (`Refusals`)."""


@dataclass
class Refusals:
    """The pilots of one pool a bag refused in a row, since a host of the pool last matched it or the bag's
    policies last changed: after `DispatchConfig.refused_pilots` of them the overlay sends the bag one pilot
    of the pool at a time, `refused_backoff` apart and twice as long after each one refused (up to
    REFUSED_BACKOFF_CAP), rather than start pilot after pilot that leave at once (a pool on which every
    machine fails the bag's JobRequirements; on a cloud each would be billed)."""

    pilots: set[tuple[str, str]] = field(default_factory=set)
    """The worker runs refused: (host id, session), so a pilot that lands on a machine seen before counts,
    and a worker started by hand that keeps asking counts once."""
    until: float = 0.0
    """No pilot of the pool for the bag before this."""
    level: int = 0
    """Waits begun since the bag was held back: the next is `refused_backoff` * 2 ** level (at most the cap)."""
    why: str = ""
    """What refused the last one (for `gridbot status`)."""
    host: str = ""
    """The last one's host name."""

    def refused(self, pilot: tuple[str, str], host: str, why: str, now: float, after: int, backoff: float) -> None:
        """Count a refused worker run; the `after`-th and each one refused once the wait is over lengthen it."""
        if pilot in self.pilots:
            return
        self.pilots.add(pilot)
        self.host, self.why = host, why
        if after and len(self.pilots) >= after and now >= self.until:
            self.until = now + min(REFUSED_BACKOFF_CAP, backoff * 2.0 ** min(self.level, 60))
            self.level += 1

    def held(self, after: int) -> bool:
        """Whether the bag is held back on this pool."""
        return bool(after) and len(self.pilots) >= after


@dataclass
class BagRecord:
    """An active bag: its spec and policies, counters, strategies, and the queues the kernel serves from."""

    bag_id: int
    spec: BagSpec
    counts: BagCounts
    created_at: float
    policies: BagPolicies
    tail_strategy: TailStrategy
    placement: PlacementStrategy
    state: BagState = BagState.ACTIVE
    closing: bool = False
    """Its owner is cancelling it: its jobs end one by one, and it closes once, as cancelled, after them."""
    tail: bool = False
    dirty: bool = True
    """Counters changed since the bag's ad was last refreshed."""
    seen_active: int = 0
    rank: float | None = None
    """The bag's static Rank, while its ad is unchanged."""
    window: Window = field(default_factory=Window)
    """The feeder's window of queued jobs read from the store (core/feeder.py)."""
    failover: deque[Job] = field(default_factory=deque)
    """Jobs that failed `failover_after` times, for reliable hosts only."""
    last_sent: float = 0.0
    """When an instance of the bag was last sent (a bag idle since long enough says why)."""
    pool_ok: dict[str, bool] = field(default_factory=dict)
    """GridPolicy's answer per pool, while the bag's ad and policies are unchanged."""
    retry: deque[Job] = field(default_factory=deque)
    """Re-queued jobs, oldest first; served before the window."""
    replicas: deque[Job] = field(default_factory=deque)
    """Running jobs chosen for one more instance (the tail strategy's), served after the queued jobs."""
    run_time_sum: float = 0.0
    good_results: int = 0
    """Seconds from send to result summed over the good results seen since the server started, and their
    number: `Bag.MeanRunTime`, which the default replication policy compares a straggler with."""
    input_names: list[str] = field(default_factory=list)
    """File names of the spec's inputs, as every assignment carries them."""
    render: Callable[[int, str | None], tuple[str, dict[str, str], list[str]]] | None = None
    """The spec's renderer (BagSpec.renderer), made once per spec."""
    limits: Limits | None = None
    """The spec's resource limits (BagSpec.limits), made once per spec and sent with every assignment."""
    revision: int = 1
    """The spec's revision (BagSnapshot.revision), sent with every assignment."""
    buffer: deque[Job] = field(init=False)
    """The window's queued jobs (`window.buffer`, the same deque: Algorithm 1 reads it for every bag on every
    request, one attribute nearer)."""
    ranks_hosts: bool = field(init=False)
    """`placement.host_dependent`, read as often."""
    places_jobs: bool = field(init=False)
    """`placement.places_jobs`: its jobs wait for their route before they are sent."""
    strategy_error: str = ""
    """The last error one of the bag's strategies raised (shown with its diagnostics)."""
    on_pool: dict[str, list[int]] = field(default_factory=dict)
    """Per pool: [instances sent there since the dispatcher took the bag up, instances running there now]."""
    history: OrderedDict[int, Ended] = field(default_factory=OrderedDict)
    """The bag's last `HISTORY` instances that ended or were lost, by id (a late report replaces the loss):
    what a tail strategy characterizes the pools from (ExPERT's Fs and gamma). Ordered so that dropping the
    oldest costs O(1): a dict's first key is found past the slots of the keys deleted before it, a scan that
    took 13% of the server's time at 18,000 results/s."""
    refusals: dict[str, Refusals] = field(default_factory=dict)
    """Per pool: its pilots the bag refused in a row (the overlay holds the bag's pilots there back)."""
    short_deadline: tuple[int, float, str] | None = None
    """Instances sent with a deadline shorter than the spec's `timeout` since its policies last changed: how
    many, and the last one's deadline (seconds) and host (`diagnostics.deadline_before_timeout`)."""

    def __post_init__(self) -> None:
        self.buffer = self.window.buffer
        self.ranks_hosts = self.placement.host_dependent
        self.places_jobs = self.placement.places_jobs


HISTORY = 20_000
"""Ended instances a bag remembers (`BagRecord.history`)."""


class Ended(NamedTuple):
    """An instance that ended or was lost, as a tail strategy reads it."""

    instance_id: int
    sent_at: float
    ended_at: float | None
    """None: lost (past its deadline, or its host silent) and not reported since."""
    success: bool
    pool: str


@dataclass
class HostRecord:
    """A host the dispatcher heard from, with its statistics and the instances it holds."""

    info: HostInfo
    first_seen: float
    last_seen: float
    stats: HostStats = field(default_factory=HostStats)
    running: set[int] = field(default_factory=set)
    late: set[int] = field(default_factory=set)
    """Instances the host still held at its last exchange that the server no longer counts as running on it
    (overdue: their deadline passed and their job went back to the queue; or cancelled, until the host stops
    them). They hold its slots until they end, so the overlay must not take those slots for idle capacity:
    a straggler's host would otherwise absorb the demand of the very job re-queued because of it."""
    cancel: set[int] = field(default_factory=set)
    unconfirmed: set[int] = field(default_factory=set)
    """Instances sent in the last answer (or restored after a restart) that the host has not yet listed as
    held: if the next exchange of the same worker run (HostInfo.session) does not list them, the answer
    never reached it, and nobody is blamed. A restarted worker (another session) lost them: they count."""
    watched: bool = False
    """The host has an entry in the dispatcher's silence heap."""
    empty_answers: int = 0
    """Answers in a row with nothing to run, while bags were active (sets the backoff)."""
    refused: bool = False
    """Its last request for work fitted no waiting job: every active bag with work waiting refused the host
    (its GridPolicy, JobRequirements, a Concurrency of 0, or its placement) and no other active bag with jobs
    running or queued would take it (`assign._refused`), so a pilot told so leaves at once rather than idle
    (GridBot's pilot suicide, section 5; `WorkAnswer.refused`)."""
    ad: HostAd | None = None
    ad_attrs: dict[str, object] = field(default_factory=dict)
    """The attributes `ad` was last written with: only changed ones are written again."""
    contact: float = 0.0
    """When it last called, as it did (what its pilot's hours are billed to: `last_seen` is moved by a restart's
    grace and by a pause of the server, which bill nothing)."""


@dataclass
class PoolRecord:
    """What the dispatcher saw of one pool's hosts since it started (for strategies comparing pools)."""

    done: int = 0
    failed: int = 0
    turnaround_sum: float = 0.0
    """Seconds from send to good result, summed over `done`."""
    fetched_bytes: int = 0
    fetch_s: float = 0.0
    """Input bytes its hosts downloaded from the server, and the seconds that took (its measured bandwidth)."""


MAX_FETCH_RATE = 1e11
"""Bytes per second a host's input downloads count at, at most: 100 GB/s, above any network link (400 Gb/s is
50 GB/s), so a pool's measured bandwidth is never above it (fetch_seconds)."""
MAX_FETCH_SECONDS = 1e6
"""Seconds one exchange's report of downloads may take (11 days: a worker reports at every exchange)."""


def fetch_seconds(nbytes: int, seconds: float) -> float:
    """The seconds to count for a host's report of `nbytes` downloaded in `seconds` (`ExchangeRequest.fetched`),
    as if at most at MAX_FETCH_RATE; 0.0: not counted (no bytes, no time, NaN, or more than MAX_FETCH_SECONDS
    even at that rate). A download timed at 1e-300 s, or a report of 2^63 bytes, made the pool's bandwidth
    infinite or absurd, in `gridbot pools` (inf is JSON's null, which the client refused) and in stateful
    selection's plans."""
    if not (nbytes > 0 and 0 < seconds < MAX_FETCH_SECONDS):
        return 0.0
    counted = max(seconds, nbytes / MAX_FETCH_RATE)
    return counted if counted < MAX_FETCH_SECONDS else 0.0


@dataclass
class State:
    """Everything the dispatcher holds; the kernel changes it, the view reads it."""

    config: DispatchConfig
    bags: dict[int, BagRecord] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    instances: dict[int, Instance] = field(default_factory=dict)
    running: dict[int, Instance] = field(default_factory=dict)
    """The running instances alone, oldest first (overdue ones, which may wait long for a late report, stay
    only in `instances`)."""
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    live_hosts: dict[str, HostRecord] = field(default_factory=dict)
    """Hosts heard from within host_timeout, as of the last tick (or since)."""
    pools: dict[str, PoolRecord] = field(default_factory=dict)
    pool_ads: dict[str, dict[str, object]] = field(default_factory=dict)
    """Ads of the pools in the pools file: a host of such a pool gets only bags whose GridPolicy accepts it."""
    pool_errors: dict[str, str] = field(default_factory=dict)
    """The last error of each pool that fails to start pilots (the overlay sets it)."""
    monitors: dict[str, PoolMonitor] = field(default_factory=dict)
    """The last reading of each pool's own monitoring that has one (the overlay, or the simulator, sets it)."""
    ended_notes: dict[int, list[str]] = field(default_factory=dict)
    """Of the last `ENDED_NOTES` bags that ended with policy diagnostics or a strategy's error: those, so that
    `gridbot status` of a finished bag (and the simulator's report) still says its Deadline fell back."""
    busy: tuple[str, ...] = ()
    """Up to two hosts that, at the last tick, ran an instance past the quick-failure window."""
    good: list[tuple[float, str]] = field(default_factory=list)
    """When the last two distinct hosts produced a good result, newest first (for black-hole detection)."""
    ledger: Ledger = field(default_factory=Ledger)
    """Wall time of every bag's ended instances per host: what each bag spent (core/ledger.py)."""

    def others_good_at(self, host_id: str) -> float:
        """When a host other than `host_id` last produced a good result (-inf: never)."""
        return next((t for t, h in self.good if h != host_id), -math.inf)


T = TypeVar("T")


def has_wide_jobs(state: State) -> bool:
    """A bag on the server has jobs of several CPUs (else every instance holds one slot)."""
    return any(b.spec.cpus > 1 for b in state.bags.values())


ENDED_NOTES = 1000
"""Ended bags whose diagnostics the dispatcher keeps (in memory: a restart forgets them)."""


def busy_slots(state: State, host: HostRecord, wide: bool | None = None, late: bool = True) -> int:
    """Slots the host's running instances hold, and, with `late`, those it still runs past their deadline: one
    each, unless a bag on the server has wider jobs (`cpus`; `wide`: whether one has, when the caller already
    knows, so that a loop over hosts asks once). Dispatch counts without `late` what a bag's Concurrency bounds
    (the instances the server has out there); the overlay's capacity counts with it (what the host is doing)."""
    held = (*host.running, *host.late) if late else host.running
    if not (has_wide_jobs(state) if wide is None else wide):
        return len(held)
    total = 0
    for iid in held:
        inst = state.instances.get(iid)
        bag = state.bags.get(inst.job.bag_id) if inst is not None else None
        total += bag.spec.cpus if bag is not None else 1
    return total


def guarded(bag: BagRecord, what: str, default: T, call: Callable[..., T], *args: object) -> T:
    """Ask one of the bag's strategies; if it raises, the bag falls back to `default` and its diagnostics
    say why (`gridbot status`): a strategy's error must not stop the dispatcher, nor leave an event
    half-applied, nor starve the other bags."""
    try:
        return call(*args)
    except Exception as e:  # any error of a strategy, which may be a user's plug-in
        bag.strategy_error = f"{what} failed ({type(e).__name__}: {str(e)[:300]}); the bag falls back to no opinion"
        return default


class SplitMix:
    """A small deterministic PRNG (SplitMix64): the core and strategies may not use the random module's
    entropy, so runs are reproducible."""

    def __init__(self, seed: int) -> None:
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def random(self) -> float:
        """The next float in [0, 1)."""
        self.state = (self.state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return ((z ^ (z >> 31)) >> 11) / float(1 << 53)

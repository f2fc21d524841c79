"""`GET /metrics`: the server's state in Prometheus' text exposition format (version 0.0.4), written here.

Two kinds of numbers. Gauges are read at scrape time from what the server already holds in memory: the
dispatcher's view (bags, hosts, pools, its buffer), the overlay's pilots, the service's commit backlog;
no store query but one per ended bag whose name is not known yet. Counters and histograms that only an
event can count (exchanges and their latency, instances sent and ended, store commits and their latency)
are counted by `Counters`, fed by two hooks: the exchange handler's timing and the service's commit hook,
which sees every batch once it is durable (so nothing is counted that a failed commit took back).

Cardinality: per-bag series exist for active bags and for bags that ended within the last `LINGER`
seconds (so a scrape sees a bag's final counts), the newest `MAX_BAGS` of those by id; the rest are summed
under `bag="_other"` (bag names start with a letter or digit, so no bag is named that). Every other label
is a pool of the pools file or of a host heard from, or a fixed set of states. docs/metrics.md lists them.
The route is for admin keys only: the bag labels are every owner's bag names.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

from aiohttp import web

from gridbot.core.changes import BagCounts, Changes
from gridbot.model.states import BagState, InstanceState, JobState
from gridbot.protocol import PoolInfo

if TYPE_CHECKING:
    from gridbot.server.service import Service

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_BAGS = 100
"""Most bags with series of their own; the others are summed under `OTHER`."""
LINGER = 300.0
"""Seconds an ended bag keeps its series after its end, so that the next scrapes see its final counts."""
OTHER = "_other"
"""The `bag` label of the bags beyond `MAX_BAGS`, summed (not a valid bag name: see model.spec.NAME_RE)."""
LATENCY_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                                      5.0, 10.0)
"""Upper bounds (seconds) of the latency histograms: an exchange takes about a millisecond to decide and
a few more to commit with its group; a commit over a second means a store in trouble."""
JOB_STATES = (JobState.QUEUED, JobState.RUNNING, JobState.DONE, JobState.FAILED, JobState.CANCELLED)
ENDED_OUTCOMES = (InstanceState.DONE, InstanceState.WASTED, InstanceState.FAILED, InstanceState.INTERRUPTED,
                  InstanceState.CANCELLED)
"""The `outcome` label of gridbot_instances_finished_total (an instance that goes overdue is lost instead)."""
_replica = attrgetter("replica")
_state = attrgetter("state")


# -- the text format -------------------------------------------------------------------------------------

def escape_label(value: str) -> str:
    """A label value as the text format quotes it: backslash, double quote and line feed escaped (bag and
    pool names come from users; anything else of UTF-8 is allowed as it is)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """A HELP docstring as the text format wants it: backslash and line feed escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value: integers without a decimal point, floats in full precision, +Inf, -Inf and NaN."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


Labels = Sequence[tuple[str, str]]


@dataclass
class Family:
    """One metric: its name, type, help and samples (suffix, labels, value), written together."""

    name: str
    kind: str
    """counter, gauge or histogram."""
    help: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)

    def add(self, value: float, labels: Labels = (), suffix: str = "") -> Family:
        """One more sample (`suffix`: a histogram's _bucket, _sum or _count); the family, to chain."""
        self.samples.append((suffix, labels, value))
        return self

    def lines(self) -> Iterable[str]:
        """HELP, TYPE, then the samples, each label value escaped."""
        yield f"# HELP {self.name} {escape_help(self.help)}"
        yield f"# TYPE {self.name} {self.kind}"
        for suffix, labels, value in self.samples:
            inner = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels)
            yield f"{self.name}{suffix}{{{inner}}} {format_value(value)}" if inner else \
                f"{self.name}{suffix} {format_value(value)}"


def render(families: Iterable[Family]) -> str:
    """The exposition: each family's HELP, TYPE and samples together, a line feed after the last line."""
    return "".join(line + "\n" for f in families for line in f.lines())


class Histogram:
    """Cumulative buckets, sum and count, as Prometheus histograms are kept: `observe` costs a bisection."""

    def __init__(self, bounds: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one value (seconds) in its bucket."""
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value: `le` is inclusive
        self.sum += value

    @property
    def count(self) -> int:
        """Values observed."""
        return sum(self.counts)

    def family(self, name: str, help: str, labels: Labels = ()) -> Family:
        """The histogram as the format writes one: cumulative `_bucket`s up to le="+Inf", `_sum`, `_count`."""
        f = Family(name, "histogram", help)
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            f.add(running, (*labels, ("le", format_value(bound) if bound != math.inf else "+Inf")), "_bucket")
        f.add(self.sum, labels, "_sum")
        return f.add(running, labels, "_count")


# -- counting what only events show ------------------------------------------------------------------------

@dataclass(frozen=True)
class EndedBag:
    """A bag's final counts, from the batch that ended it."""

    bag_id: int
    state: BagState
    counts: BagCounts
    ended_at: float


class Counters:
    """Counts since the server started; fed by `exchanged` (the exchange handler) and `committed` (the
    service's commit hook, on the loop's thread)."""

    def __init__(self, max_ended: int = MAX_BAGS) -> None:
        self.exchanges = 0
        self.exchange_seconds = Histogram()
        self.commit_seconds = Histogram()
        self.sent = 0
        self.replicas = 0
        self.lost = 0
        self.finished: dict[InstanceState, int] = dict.fromkeys(ENDED_OUTCOMES, 0)
        self.bags_ended: dict[BagState, int] = {s: 0 for s in BagState if s is not BagState.ACTIVE}
        self.ended: dict[int, EndedBag] = {}
        """The bags that ended most recently, oldest first (at most `max_ended`)."""
        self.max_ended = max_ended

    def exchanged(self, seconds: float) -> None:
        """One exchange decided and made durable in `seconds`."""
        self.exchanges += 1
        self.exchange_seconds.observe(seconds)

    def committed(self, batch: Changes, seconds: float) -> None:
        """A durable batch: its instances sent and ended, its bags that ended, and how long its commit took."""
        self.commit_seconds.observe(seconds)
        self.sent += len(batch.new_instances)
        self.replicas += sum(map(_replica, batch.new_instances))  # (map and Counter: C loops, ~40 ns an item)
        for state, n in Counter(map(_state, batch.instances)).items():
            if state is InstanceState.OVERDUE:
                self.lost += n
            elif state in self.finished:
                self.finished[state] += n
        for b in batch.bags.values():
            if b.state is BagState.ACTIVE:
                self.ended.pop(b.bag_id, None)  # retried: active again
                continue
            if b.bag_id not in self.ended:
                self.bags_ended[b.state] += 1
            self.ended.pop(b.bag_id, None)
            at = b.finished_at if b.finished_at is not None else batch.events[-1].at if batch.events else 0.0
            self.ended[b.bag_id] = EndedBag(b.bag_id, b.state, b.counts, at)
            while len(self.ended) > self.max_ended:
                del self.ended[next(iter(self.ended))]


# -- the endpoint ----------------------------------------------------------------------------------------

@dataclass
class _BagLine:
    """What one `bag` label carries: a bag's counts, or the sum of those beyond the cap."""

    name: str
    counts: BagCounts


class Metrics:
    """The `/metrics` route of one server: reads the service (and the overlay through `pools`) at each scrape."""

    def __init__(self, service: Service, pools: Callable[[float], list[PoolInfo]], max_bags: int = MAX_BAGS,
                 linger: float = LINGER) -> None:
        self.service = service
        self.pools = pools
        self.max_bags = max_bags
        self.linger = linger
        self.counters = Counters(max_bags)
        self.started = time.time()
        self._names: dict[int, str] = {}
        """Names of bags seen, kept for their series after they end (trimmed to the bags still shown)."""
        service.commit_hooks.append(self.counters.committed)

    def routes(self) -> list[web.RouteDef]:
        """The one route, for the server to add (its PERMISSIONS admit admin keys only)."""
        return [web.get("/metrics", self.handle)]

    async def handle(self, request: web.Request) -> web.Response:
        """The exposition, built on the loop's thread (the dispatcher is not to be read from another)."""
        body = self.render(time.time()).encode()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    def render(self, now: float) -> str:
        """The whole exposition as of `now` (server clock)."""
        return render([*self._bag_families(now), *self._event_families(), *self._pool_families(now),
                       *self._dispatcher_families()])

    # -- bags ---------------------------------------------------------------------------------------------

    def _bags(self, now: float) -> tuple[list[_BagLine], int]:
        """The bags with series (newest first, at most `max_bags`, then `_other` if any are left out) and how
        many were summed into `_other`."""
        shown: dict[int, BagCounts] = {}
        for b in self.service.dispatcher.view.bags():
            shown[b.bag_id] = b.counts
            self._names[b.bag_id] = b.name
        horizon = now - self.linger
        for e in self.counters.ended.values():
            if e.ended_at >= horizon and e.bag_id not in shown:
                shown[e.bag_id] = e.counts
        ids = sorted(shown, reverse=True)
        lines = [_BagLine(self._name(i), shown[i]) for i in ids[:self.max_bags]]
        rest = ids[self.max_bags:]
        if rest:
            total = BagCounts()
            for i in rest:
                for f in total.__struct_fields__:
                    setattr(total, f, getattr(total, f) + getattr(shown[i], f))
            lines.append(_BagLine(OTHER, total))
        self._names = {i: self._names[i] for i in ids[:self.max_bags] if i in self._names}
        return lines, len(rest)

    def _name(self, bag_id: int) -> str:
        """A bag's name (an ended bag's, read once from the store; its id if the store no longer has it)."""
        name = self._names.get(bag_id)
        if name is None:
            row = self.service.store.bag(bag_id)
            name = self._names[bag_id] = row.name if row is not None else str(bag_id)
        return name

    def _bag_families(self, now: float) -> list[Family]:
        """Jobs by state, instances, replicas and waste per bag (within the cap), and bags by state."""
        lines, others = self._bags(now)
        jobs = Family("gridbot_jobs", "gauge", f"Jobs of the bag in each state (active bags and bags ended in the "
                      f"last {self.linger:g} s; beyond the newest {self.max_bags} of those, summed under "
                      f"bag=\"{OTHER}\").")
        sent = Family("gridbot_bag_instances_sent", "gauge", "Instances of the bag sent to hosts over its life.")
        replicas = Family("gridbot_bag_replicas_sent", "gauge",
                          "Of those, speculative replicas (GridBot's replication in the tail).")
        wasted = Family("gridbot_bag_instances_wasted", "gauge",
                        "Instances of the bag that completed after their job had a result: waste.")
        overdue = Family("gridbot_bag_instances_overdue", "gauge",
                         "Instances of the bag lost: their deadline passed or their host went silent.")
        for line in lines:
            bag = (("bag", line.name),)
            c = line.counts
            for state in JOB_STATES:
                jobs.add(getattr(c, state.value), (*bag, ("state", state.value)))
            sent.add(c.instances, bag)
            replicas.add(c.replicas, bag)
            wasted.add(c.wasted, bag)
            overdue.add(c.overdue, bag)
        view = self.service.dispatcher.view
        active = Family("gridbot_bags_active", "gauge", "Bags being dispatched.").add(view.active)
        summed = Family("gridbot_bags_other", "gauge",
                        "Bags whose series are summed under bag=\"_other\" (beyond the cap).").add(others)
        ended = Family("gridbot_bags_ended_total", "counter", "Bags that ended since the server started, by how.")
        for how, n in self.counters.bags_ended.items():
            ended.add(n, (("state", how.value),))
        return [jobs, sent, replicas, wasted, overdue, active, summed, ended]

    # -- events -------------------------------------------------------------------------------------------

    def _event_families(self) -> list[Family]:
        """What `Counters` counted: instances, exchanges, commits, with their latency histograms."""
        c = self.counters
        finished = Family("gridbot_instances_finished_total", "counter",
                          "Instances that ended since the server started, by outcome.")
        for state, n in c.finished.items():
            finished.add(n, (("outcome", state.value),))
        return [
            Family("gridbot_instances_sent_total", "counter", "Instances sent to hosts since the server started."
                   ).add(c.sent),
            Family("gridbot_replicas_sent_total", "counter", "Of those, speculative replicas.").add(c.replicas),
            finished,
            Family("gridbot_instances_lost_total", "counter", "Instances that went overdue (deadline passed or "
                   "host silent) since the server started; their jobs were queued again.").add(c.lost),
            Family("gridbot_exchanges_total", "counter", "Worker exchanges (POST /v1/exchange) answered.").add(
                c.exchanges),
            c.exchange_seconds.family("gridbot_exchange_duration_seconds", "Seconds to decide an exchange and "
                                      "make it durable (group commit), without the wait of a held idle request."),
            c.commit_seconds.family("gridbot_store_commit_duration_seconds",
                                    "Seconds the store took to apply one batch (one transaction)."),
            Family("gridbot_store_commit_failures_total", "counter", "Batches the store refused; each made the "
                   "dispatcher reload from the store.").add(self.service.commit_failures),
            Family("gridbot_start_time_seconds", "gauge", "When the server started, Unix time.").add(self.started),
        ]

    # -- pools, hosts and pilots --------------------------------------------------------------------------

    def _pool_families(self, now: float) -> list[Family]:
        """Hosts, slots and results per pool (the dispatcher's), pilots and errors per pool (the overlay's)."""
        alive = Family("gridbot_hosts_alive", "gauge", "Hosts heard from within the host timeout, per pool.")
        slots = Family("gridbot_slots", "gauge", "Slots of the live hosts, per pool.")
        busy = Family("gridbot_slots_busy", "gauge", "Of those, slots holding an instance.")
        results = Family("gridbot_pool_results_total", "counter", "Results returned by the pool's hosts (those "
                         "the dispatcher knows) over their lives, by outcome.")
        for name, (n, total, held, good, bad) in sorted(self._per_pool(now).items()):
            pool = (("pool", name),)
            alive.add(n, pool)
            slots.add(total, pool)
            busy.add(held, pool)
            results.add(good, (*pool, ("outcome", "done")))
            results.add(bad, (*pool, ("outcome", "failed")))
        pilots = Family("gridbot_pilots", "gauge", "Pilots of each pool of the pools file that are queued or "
                        "running now.")
        submitted = Family("gridbot_pilots_submitted_total", "counter", "Pilots submitted since the server started.")
        ended = Family("gridbot_pilots_ended_total", "counter", "Pilots that ended since the server started.")
        failed = Family("gridbot_pilots_failed", "gauge", "Pilots known to have failed (refused by the pool, or "
                        "their worker crashed).")
        errors = Family("gridbot_pool_error", "gauge", "1 while the pool's adapter reports an error (gridbot pools "
                        "shows it), else 0.")
        pool_errors = self.service.dispatcher.view.pool_errors()
        for info in sorted(self.pools(now), key=lambda p: p.name):
            pool = (("pool", info.name),)
            pilots.add(info.pilots_queued, (*pool, ("state", "queued")))
            pilots.add(info.pilots_running, (*pool, ("state", "running")))
            submitted.add(info.pilots_submitted, pool)
            ended.add(info.pilots_ended, pool)
            failed.add(info.pilots_failed, pool)
            errors.add(1 if info.error or pool_errors.get(info.name) else 0, pool)
        return [alive, slots, busy, results, pilots, submitted, ended, failed, errors]

    def _per_pool(self, now: float) -> dict[str, tuple[int, int, int, int, int]]:
        """Per pool (of the pools file, or of a known host): live hosts, their slots, the busy ones, and the
        results of all its known hosts. `DispatchView.pools` says the same, but it looks at every bag for each
        host (1 s with 1,000 bags and 10,000 hosts); this pass is linear, and used unless a bag has jobs wider
        than one slot (then a host's busy slots depend on its instances' bags, which only the view knows)."""
        view = self.service.dispatcher.view
        out: dict[str, list[int]] = {name: [0, 0, 0, 0, 0] for name in view.pool_names()}
        for h in view.known_hosts():
            stats = h.stats
            row = out.setdefault(h.pool, [0, 0, 0, 0, 0])
            row[3] += stats.done
            row[4] += stats.failed
        horizon = now - view.config.host_timeout
        wide = any(b.spec.cpus > 1 for b in view.bags())
        for h in view.hosts():
            if h.last_seen >= horizon:
                row = out.setdefault(h.pool, [0, 0, 0, 0, 0])
                row[0] += 1
                row[1] += h.slots
                row[2] += min(h.running, h.slots)
        if wide:
            for name, p in view.pools(now).items():
                out.setdefault(name, [0, 0, 0, 0, 0])[2] = p.busy
        return {name: (r[0], r[1], r[2], r[3], r[4]) for name, r in out.items()}

    # -- the dispatcher's queues --------------------------------------------------------------------------

    def _dispatcher_families(self) -> list[Family]:
        """The dispatcher's queues: its buffer, the replicas waiting, the events waiting for their commit."""
        view = self.service.dispatcher.view
        bags = view.bags()
        return [
            Family("gridbot_dispatcher_buffer_jobs", "gauge", "Queued jobs held in the dispatcher's scheduling "
                   "buffer (all bags' windows).").add(sum(b.window for b in bags)),
            Family("gridbot_dispatcher_buffer_capacity_jobs", "gauge", "The buffer's size (--buffer-size).").add(
                view.config.buffer_size),
            Family("gridbot_dispatcher_replicas_waiting", "gauge", "Replicas chosen and not yet sent.").add(
                sum(b.waiting_replicas for b in bags)),
            Family("gridbot_dispatcher_bags_parked", "gauge", "Active bags whose window is given up for a while."
                   ).add(sum(1 for b in bags if b.parked_until is not None)),
            Family("gridbot_commit_backlog", "gauge", "Events decided and waiting for their commit (staged, or on "
                   "the store's writer thread).").add(self.service.commit_backlog()),
        ]

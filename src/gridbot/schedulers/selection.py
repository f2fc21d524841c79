"""Stateful resource selection (Lander, Fowler, Thorpe and Ramakrishnan, RENCI TR-08-02): where to place each
job when the monitoring that says which site has free CPUs lags minutes behind.

A burst of jobs placed by a selector that trusts the monitor ("naive") all goes to the site that looked
free, since none of them shows before the next reading: they queue there while other sites idle. The
report's Protocol 1 keeps a record of what it placed and subtracts, per site, the CPUs of its placed work
the monitor does not show yet; Protocol 2 (its emulation) says when placed work becomes visible: once it
has run for the monitor's delay. Here a placed job is unseen until an instance of it started no later than
`observed_at - lag` of the site's reading (`PoolMonitor`): a live `squeue` shows a job that started before
the poll, a simulated MDS one that has run for its hysteresis. A site with no monitor is counted from
gridbot's own records (its pilots' slots, busy or not), where running work shows at once.

Each job is placed when the bag's window holds it (the report placed each ensemble member as it arrived):
among the sites its GridPolicy accepts whose pilots are wide enough, those with as many free CPUs as it needs
are ranked by the report's estimate (run time over the site's `Speed`, plus its inputs over the site's
bandwidth when both are known: NWS's forecast there, here what its hosts measured downloading inputs, else
its `Bandwidth` attribute) and the fastest is chosen; when none fits, the
fallback chooses `random`ly or the `best` site, the one with the most free CPUs even if that number is
negative. The job is then routed to that pool (its story says why), the overlay gets pilots for it there,
and it runs on the first host of that pool that asks. Bags whose placements name the same `stream` share
one record of placed work, as the report's single application coordinator did; two streams are two
coordinators that do not see each other's placements (the report's competing streams).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from gridbot.core.ledger import ad_number
from gridbot.core.records import SplitMix
from gridbot.core.strategy import Migration
from gridbot.core.view import BagView, DispatchView
from gridbot.model.pools import KINDS
from gridbot.model.spec import StrategyOption
from gridbot.model.states import JobState
from gridbot.schedulers.base import Placement, StrategyError

FALLBACKS = ("random", "best")


@dataclass
class Placed:
    """A job this stream placed on a site, until the site's monitor shows it (or it ends)."""

    job_id: int
    bag_id: int
    pool: str
    cpus: int
    at: float
    started: float | None = None
    """When its first instance was sent (None: not yet)."""
    shown_from: float | None = None
    """From when a monitor shows its CPUs busy: its start, or earlier when it started on a pilot that was already
    there (the monitor counted that pilot's CPUs as busy from the pilot's start)."""


class Site(NamedTuple):
    """One site as the selector saw it when it placed a job."""

    pool: str
    monitored: int
    """Free CPUs as the pool's monitor reported them (or gridbot's own records of a pool with no monitor)."""
    unseen: int
    """CPUs of work this stream placed there that the monitor does not show yet."""
    free: int
    """What the selector believes: `monitored - unseen` when stateful, `monitored` when naive."""
    seconds: float
    """The report's estimate of the job's time there: run time over speed, plus the transfer of its inputs."""
    age: float | None
    """Seconds since the monitor's reading was taken (None: no monitor, gridbot's own records)."""


class Selector:
    """The record of placed work that one stream of bags shares (the report's database of runs sent to a site
    and not yet reported by MDS)."""

    def __init__(self) -> None:
        self.placed: dict[int, Placed] = {}
        self._refreshed: float | None = None
        self._idle: dict[str, int] = {}

    def refresh(self, view: DispatchView, now: float) -> None:
        """Forget placed work the monitors show by now, and work that ended; count the idle slots of our hosts
        that each monitor shows busy (once per instant: every bag of the stream shares it)."""
        if self._refreshed == now:
            return
        self._refreshed = now
        queued: dict[int, set[int]] = {}
        for job_id, p in list(self.placed.items()):
            bag = view.bag(p.bag_id)
            if bag is None:
                del self.placed[job_id]
                continue
            if p.started is None:
                job = view.job(job_id)
                if job is not None and job.live:
                    first = min(view.instances(job_id), key=lambda i: i.sent_at)
                    host = view.host(first.host_id)
                    p.started = first.sent_at
                    p.shown_from = min(first.sent_at, host.first_seen) if host is not None else first.sent_at
                elif job is None or job.state is not JobState.QUEUED:
                    ids = queued.get(p.bag_id)
                    if ids is None:
                        ids = queued[p.bag_id] = bag.queued_ids()
                    if job_id not in ids:  # it ended (done, failed, cancelled) without us seeing it start
                        del self.placed[job_id]
                        continue
            if p.started is not None and self.visible(view, p):
                del self.placed[job_id]
        self._idle = {}
        for h in view.hosts():
            reading = view.monitor(h.pool)
            if reading is None or h.first_seen <= reading.observed_at - reading.lag:  # (a younger one: free in it)
                self._idle[h.pool] = self._idle.get(h.pool, 0) + max(0, h.slots - view.busy_slots(h.host_id))

    @staticmethod
    def visible(view: DispatchView, p: Placed) -> bool:
        """Whether the site's monitor shows the started job `p` (with no monitor: it shows once started)."""
        reading = view.monitor(p.pool)
        return p.shown_from is not None and (reading is None or p.shown_from <= reading.observed_at - reading.lag)

    def unseen(self, pool: str) -> int:
        return sum(p.cpus for p in self.placed.values() if p.pool == pool)

    def idle(self, pool: str) -> int:
        """Slots of our hosts in the pool that run nothing and that its monitor counts as busy (pilots older than
        the reading): free for a job all the same."""
        return self._idle.get(pool, 0)

    def waiting(self, bag_id: int) -> int:
        """The bag's jobs placed and not started yet."""
        return sum(1 for p in self.placed.values() if p.bag_id == bag_id and p.started is None)


class StatefulPlacement(Placement):
    """Protocol 1 of the RENCI report: each job to the fastest site with enough free CPUs once the work this
    stream placed and the monitor does not show yet is subtracted; a fallback when none fits."""

    name: ClassVar[str] = "stateful"
    stateful: ClassVar[bool] = True
    places_jobs: ClassVar[bool] = True
    options: ClassVar[Mapping[str, StrategyOption]] = {
        "fallback": "best",
        "stream": "",
        "runtime": 0.0,
        "input_mb": 0.0,
        "ahead": 100,
    }
    """`fallback`: where a job goes when no site has enough free CPUs: "best" (the site with the most, even
    if negative) or "random". `stream`: bags naming the same stream share one record of placed work.
    `runtime`: seconds one job takes on a speed-1 CPU (0: the bag's measured mean, else 1). `input_mb`: the
    inputs a job moves to its site, over the site's bandwidth (MB/s). `ahead`: the bag's jobs placed and not
    started yet, at most (a big bag is placed as it runs, not all at once)."""

    def __init__(self, bag_id: int, seed: int, options: Mapping[str, StrategyOption],
                 selector: Selector | None = None) -> None:
        super().__init__(bag_id, seed, options)
        self.selector = selector if selector is not None else Selector()
        self.rng = SplitMix(seed)
        self.last: OrderedDict[int, tuple[str, str]] = OrderedDict()
        """Job id → (pool, why) of this bag's placements (`notes` shows the newest)."""

    @classmethod
    def validate(cls, options: Mapping[str, StrategyOption]) -> None:
        fallback = options.get("fallback", cls.options["fallback"])
        if fallback not in FALLBACKS:
            raise StrategyError(f"strategy option fallback = {fallback!r} is not one of {', '.join(FALLBACKS)}: "
                                "\"best\" sends a job that fits nowhere to the site with the most free CPUs, "
                                "\"random\" to any")
        for key in ("runtime", "input_mb"):
            value = options.get(key, 0.0)
            if isinstance(value, int | float) and not (math.isfinite(value) and value >= 0):
                raise StrategyError(f"strategy option {key} = {value!r} must be a finite number of at least 0")
        ahead = options.get("ahead", 100)
        if isinstance(ahead, int) and not 1 <= ahead <= 100_000:
            raise StrategyError(f"strategy option ahead = {ahead} must be from 1 to 100,000 jobs")

    def sites(self, view: DispatchView, bag: BagView, now: float) -> list[Site]:
        """The sites the bag may use, as the selector sees them now."""
        cpus = bag.spec.cpus
        runtime = self.number("runtime") or bag.mean_run_time or 1.0
        input_mb = self.number("input_mb")
        pools = view.pools(now)
        out = []
        for name in view.pool_names():
            ad = view.pool_ad(name)
            if not view.accepts_pool(bag.bag_id, name) or ad_number(ad, "Cpus", 1) < cpus:
                continue
            own = pools.get(name)
            reading = view.monitor(name)
            if reading is not None:
                monitored, age = reading.free_cpus + self.selector.idle(name), now - reading.observed_at
            else:
                kind = KINDS.get(str(ad.get("Kind", ""))) if ad is not None else None
                # a pool whose hosts come by themselves (static, volunteers) has what is connected, nothing more
                size = 0 if kind is not None and not kind.pilots else \
                    int(ad_number(ad, "MaxRunning", 0) * ad_number(ad, "Cpus", 1))
                monitored, age = max(size, own.slots if own is not None else 0) - (own.busy if own else 0), None
            unseen = self.selector.unseen(name)
            free = monitored - unseen if self.stateful else monitored
            speed = ad_number(ad, "Speed", 1.0)
            bandwidth = own.bandwidth if own is not None and own.bandwidth > 0 else ad_number(ad, "Bandwidth", 0.0)
            seconds = runtime / (speed if speed > 0 else 1.0)
            if input_mb and bandwidth > 0:
                seconds += input_mb / bandwidth
            out.append(Site(name, monitored, unseen, free, seconds, age))
        return out

    def choose(self, sites: Sequence[Site], cpus: int) -> tuple[Site, str]:
        """The site for one job of `cpus`, and why."""
        fits = [s for s in sites if s.free >= cpus]
        if fits:
            site = min(fits, key=lambda s: (s.seconds, -s.free, s.pool))
            return site, f"fastest of {len(fits)} site(s) with {cpus} CPU(s) free"
        if self.settings["fallback"] == "random":
            site = sites[int(self.rng.random() * len(sites))]
            return site, f"no site has {cpus} CPU(s) free: fallback random"
        site = max(sites, key=lambda s: (s.free, -s.seconds, s.pool))
        return site, f"no site has {cpus} CPU(s) free: fallback best (most free CPUs)"

    def migrate(self, view: DispatchView, bag: BagView, now: float) -> Sequence[Migration]:
        """Place the bag's queued jobs not placed yet (new, queued again, or routed where the bag no longer goes),
        each on one pool, while fewer than `ahead` of its placed jobs wait to start."""
        self.selector.refresh(view, now)
        sites = self.sites(view, bag, now)
        if not sites:
            return ()
        usable = {s.pool for s in sites}
        for job_id in [j for j, p in self.selector.placed.items()
                       if p.bag_id == bag.bag_id and p.started is None and p.pool not in usable]:
            del self.selector.placed[job_id]  # its pool no longer takes the bag (GridPolicy): placed again below
        room = int(self.number("ahead")) - self.selector.waiting(bag.bag_id)
        if room <= 0:
            return ()
        todo = bag.unplaced(room, self.selector.placed, list(usable))
        if not todo:
            return ()
        cpus = bag.spec.cpus
        moves = []
        for job in todo:
            site, why = self.choose(sites, cpus)
            self.selector.placed[job.job_id] = Placed(job.job_id, bag.bag_id, site.pool, cpus, now)
            sites = [s._replace(unseen=s.unseen + cpus, free=s.free - cpus if self.stateful else s.free)
                     if s.pool == site.pool else s for s in sites]
            text = f"{self.name}: {why}: {_describe(site, self.stateful)}; others: " + (
                ", ".join(f"{s.pool} {s.free}" for s in sites if s.pool != site.pool) or "none")
            self.last[job.job_id] = (site.pool, text)
            moves.append(Migration(job.job_id, frozenset({site.pool}), text))
        while len(self.last) > 1000:
            self.last.popitem(last=False)  # (O(1): a dict's first key is found past its deleted slots)
        return moves

    def pilots(self, view: DispatchView, bag: BagView, pools: Sequence[str], now: float) -> Mapping[str, int] | None:
        """Slots for the bag's placed jobs that have not started, on their pools (jobs not placed yet ask for
        none: they are placed at the next scheduling event)."""
        want: dict[str, int] = {}
        for p in self.selector.placed.values():
            if p.bag_id == bag.bag_id and p.started is None and p.pool in pools:
                want[p.pool] = want.get(p.pool, 0) + p.cpus
        return want

    def notes(self, view: DispatchView, bag: BagView, now: float) -> list[str]:
        if not self.last:
            return []
        job_id, (pool, why) = next(reversed(self.last.items()))
        return [f"last placement: job {job_id} on {pool}: {why}"]


class NaivePlacement(StatefulPlacement):
    """The report's stateless protocol, for comparison: trusts the monitor as it is, and, when no site fits,
    chooses at random."""

    name: ClassVar[str] = "naive"
    stateful: ClassVar[bool] = False
    options: ClassVar[Mapping[str, StrategyOption]] = {**StatefulPlacement.options, "fallback": "random"}


def _describe(site: Site, stateful: bool) -> str:
    """A site's numbers, as a job's story shows them."""
    seen = "gridbot's own records" if site.age is None else f"its monitor {site.age:.0f} s ago"
    text = f"{site.pool} {site.free} CPU(s) free ({site.monitored} by {seen}"
    if stateful:
        text += f", less {site.unseen} placed and not yet shown"
    return text + f"), est. {site.seconds:.0f} s"


PLACEMENTS: tuple[type[StatefulPlacement], ...] = (StatefulPlacement, NaivePlacement)

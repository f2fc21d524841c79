"""GridBot's Algorithm 1: which of the bags' jobs a host that asks for work gets.

Jobs with no replica out are alike, so each bag's policies are evaluated once per request; the matching
bags are served by rank (then age), and the Concurrency of the highest-ranked one bounds what the host
may hold, each later bag's own Concurrency lowering it further. Within a bag, jobs that failed go
first, then its window, then replicas (with `replicas_first`, replicas before all). A bag's placement
strategy may change its rank on the host or refuse it; its tail strategy sets the instances' deadline.

`want` and Concurrency count slots: a job of a bag with `cpus = 8` takes eight, so it goes only to a host
with eight slots free (of those it asked for, and under the bound). A host that could run a waiting wide job
but for the slots that bags ranked below hold is reserved for it: those bags get none of its slots as they
free, one at a time, until the wide job fits (else a narrow bag with work would starve a higher-ranked wide
one). A gap the wide bag could not use even then (its own jobs hold the rest) is anyone's.
"""

from __future__ import annotations

import math
from collections import deque

from gridbot.core.changes import Changes
from gridbot.core.kernel import Kernel
from gridbot.core.records import BagRecord, HostRecord, Job, Refusals, busy_slots, guarded
from gridbot.core.view import BagView, HostView, accepts, host_ad_of, job_ad
from gridbot.model.pools import submits_pilots
from gridbot.model.records import Assignment
from gridbot.model.states import BagState, JobState
from gridbot.policy.evaluator import HostAd


class Room:
    """The slots of one request: asked for, taken by what was sent so far, and busy on the host."""

    __slots__ = ("busy", "size", "taken", "want")

    def __init__(self, want: int, busy: int, size: int) -> None:
        self.want, self.taken, self.busy, self.size = want, 0, busy, size

    def fits(self, need: int, bound: int) -> bool:
        """A job of `need` slots fits in what the host asked for, under `bound` busy slots, and on the host at all
        (it may ask for more than its slots, to prefetch: a job wider than the host never fits)."""
        return need <= self.size and self.taken + need <= self.want and self.busy + need <= bound

    def take(self, need: int) -> None:
        self.taken += need
        self.busy += need


def assign(k: Kernel, host: HostRecord, want: int, now: float, changes: Changes) -> list[Assignment]:
    """Instances for `host`, up to `want` slots, sent (the kernel applied them) and returned; `host.refused` says
    whether every bag with work waiting refused the host and no other active bag, with jobs running or parked,
    would take it (`_refused`)."""
    out: list[Assignment] = []
    s = k.s
    host.refused = False
    if want <= 0:
        return out
    ready = [b for b in s.bags.values()
             if b.state is BagState.ACTIVE and (b.retry or b.buffer or b.replicas or b.failover)]
    # (a bag whose only queued jobs avoid this host still gets its policies evaluated: cheap, and rare)
    if not ready:
        if any(b.state is BagState.ACTIVE and b.counts.queued for b in s.bags.values()):  # parked windows
            ad = host_ad_of(s, host, now)
            host.refused = _refused(k, ready, host, ad, now)
            if host.refused:
                _count_refused(k, host, ad, now)
        return out
    ad = host_ad_of(s, host, now)
    ranked = _ranked(k, ready, host, ad, now)
    slots = Room(want, busy_slots(s, host, late=False), host.info.slots)
    concurrency: int | None = None
    pool_ad = s.pool_ads.get(host.info.pool)
    above: set[int] = set()
    matched = False
    for _, _, bag in ranked:
        above.add(bag.bag_id)
        if pool_ad is not None and not accepts(bag, host.info.pool, pool_ad):
            continue
        if not bag.policies.matches(ad):
            continue
        bag_concurrency, deadline = bag.policies.bundle(ad)
        if bag_concurrency <= 0:
            continue  # none of the bag's instances on this host, and no bound on the others' (issue 12)
        room: int | None = None
        if bag.ranks_hosts:
            room = guarded(bag, f"placement={bag.placement.name} limit", None,
                           bag.placement.limit, k.view, BagView(bag), HostView(host), now)
            if room is not None and room <= 0:
                continue  # (its budget or its plan allows nothing more here now: the host is no bag's worse)
        matched = True
        if bag.refusals:
            bag.refusals.pop(host.info.pool, None)  # the pool has hosts the bag takes: its pilots go unhindered
        if bag.tail_strategy.sets_deadline:
            deadline = _deadline(k, bag, host, deadline, now)
        concurrency = bag_concurrency if concurrency is None else min(concurrency, bag_concurrency)
        need = bag.spec.cpus
        bound = concurrency if room is None else min(concurrency, slots.busy + room * need)
        if (s.config.replicas_first or bag.spec.quorum > 1) and bag.replicas:  # a quorum's copies go first
            _replicas(k, bag, host, ad, slots, bound, now, changes, out)
        elif s.config.replicas_mixed and bag.replicas:
            _replicas(k, bag, host, ad, slots, _mixed(k, bag, slots, bound), now, changes, out)
        if bag.failover and host.info.pool in s.config.reliable_pools:
            _queue(k, bag.failover, bag, host, slots, bound, now, deadline, changes, out)
        if bag.retry:
            _queue(k, bag.retry, bag, host, slots, bound, now, deadline, changes, out)
        buffer = bag.window.buffer
        while buffer and slots.fits(need, bound):
            job = buffer.popleft()
            job.in_buffer = False
            if job.state is not JobState.QUEUED:
                continue
            if bag.places_jobs and job.pools is None and s.pool_ads:  # not routed yet: it waits for its placement
                job.in_buffer = True
                buffer.appendleft(job)
                break
            if job.pools is not None and host.info.pool not in job.pools:
                job.in_buffer = True  # moved elsewhere by its placement: it waits for a host of its pools
                bag.retry.append(job)
                continue
            out.append(k.send(bag, job, host, now, changes, deadline))
            slots.take(need)
        if bag.replicas and slots.fits(need, bound):
            _replicas(k, bag, host, ad, slots, bound, now, changes, out)
        if slots.taken >= want or slots.busy >= concurrency:
            break
        if (1 < need <= slots.size < slots.busy + need and _held_by(k, host, above) + need <= slots.size
                and _waits_here(k, bag, host, now)):
            break  # its job waits for slots that lower-ranked bags hold: they must not take them as they free
    host.refused = not matched and _refused(k, ready, host, ad, now)
    if host.refused:
        _count_refused(k, host, ad, now)
    return out


def _count_refused(k: Kernel, host: HostRecord, ad: HostAd, now: float) -> None:
    """A refused host's worker run counts against its pool for every bag with jobs or replicas waiting, each of
    which refused it (`records.Refusals`: the overlay holds back the bag's pilots of a pool that keeps sending
    refused ones)."""
    s = k.s
    cfg = s.config
    pool_ad = s.pool_ads.get(host.info.pool)
    if not cfg.refused_pilots or (pool_ad is not None and not submits_pilots(str(pool_ad.get("Kind", "")))):
        return  # (a static or volunteer pool's hosts come by themselves: there are no pilots to hold back)
    pilot = (host.info.host_id, host.info.session)
    for bag in s.bags.values():
        if bag.state is not BagState.ACTIVE or not (bag.counts.queued or bag.replicas):
            continue
        if pool_ad is not None and not accepts(bag, host.info.pool, pool_ad):
            continue  # (its GridPolicy refuses the pool: the overlay sends the bag none of its pilots anyway)
        r = bag.refusals.get(host.info.pool)
        if r is not None and pilot in r.pilots:
            continue
        if not bag.policies.matches(ad):
            why = f"JobRequirements fails on `{bag.policies.failing_clause('JobRequirements', ad)}`"
        elif bag.policies.bundle(ad)[0] <= 0:
            why = "Concurrency is 0 there"
        else:
            continue  # its placement's rank or limit: the strategy asks for each pool's pilots itself (its `pilots`)
        if r is None:
            r = bag.refusals[host.info.pool] = Refusals()
        r.refused(pilot, host.info.name, why, now, cfg.refused_pilots, cfg.refused_backoff)


def _refused(k: Kernel, ready: list[BagRecord], host: HostRecord, ad: HostAd, now: float) -> bool:
    """Whether a host every bag with work waiting (`ready`) refused is refused by the other active bags too: those
    with jobs still running, one of which would take it for a job that fails, is lost or is replicated, and those
    whose queued jobs wait out of their window (parked: `feeder.park`, their jobs unmatched for `buffer_ttl`). The
    host then stays (until its idle timeout), rather than leave its pool's slot for a pilot that must queue again.
    Small bags of Figure 8 showed it: the grids' idle pilots left while only B5, in its tail and kept to the
    cluster, had work waiting, and B1's lost bundles waited for new pilots."""
    s = k.s
    waiting = {b.bag_id for b in ready}
    pool_ad = s.pool_ads.get(host.info.pool)
    active = len(s.bags)
    for bag in s.bags.values():
        if bag.state is not BagState.ACTIVE or bag.bag_id in waiting or not (bag.counts.running or bag.counts.queued):
            continue
        if pool_ad is not None and not accepts(bag, host.info.pool, pool_ad):
            continue
        k.refresh(bag, now, active)
        if bag.policies.matches(ad) and bag.policies.bundle(ad)[0] > 0:
            return False
    return True


def _held_by(k: Kernel, host: HostRecord, bags: set[int]) -> int:
    """Slots the host's running instances of these bags hold."""
    total = 0
    for iid in host.running:
        inst = k.s.instances.get(iid)
        if inst is not None and inst.job.bag_id in bags:
            total += k.s.bags[inst.job.bag_id].spec.cpus
    return total


def _waits_here(k: Kernel, bag: BagRecord, host: HostRecord, now: float) -> bool:
    """Whether the bag's next job (of its window, or re-queued) could go to this host but for its busy slots:
    the host is then reserved for it as its slots free (a wide job behind narrow ones would starve)."""
    horizon = now - k.s.config.retry_same_host_after
    pool = host.info.pool
    for job in (*bag.retry, *list(bag.window.buffer)[:1]):
        if job.state is not JobState.QUEUED:
            continue
        if job.pools is not None and pool not in job.pools:
            continue
        if bag.places_jobs and job.pools is None and k.s.pool_ads:
            continue
        if (job.failed_on or {}).get(host.info.host_id, -math.inf) > horizon:
            continue
        if bag.spec.quorum > 1 and job.candidates is not None and _same_account(k, job, host):
            continue
        return True
    return False


def _ranked(k: Kernel, ready: list[BagRecord], host: HostRecord, ad: HostAd,
            now: float) -> list[tuple[float, int, BagRecord]]:
    """The ready bags by rank on this host, highest first (then oldest); those their placement refuses
    the host are left out."""
    ranked: list[tuple[float, int, BagRecord]] = []
    active = len(k.s.bags)
    for bag in ready:
        if bag.dirty or bag.policies.uses_time or bag.seen_active != active:  # (refresh's test, saving a call)
            k.refresh(bag, now, active)
        if bag.window.last_match is None:
            bag.window.last_match = now
        if bag.policies.rank_static:
            if bag.rank is None:
                bag.rank = bag.policies.rank(None)
            rank = bag.rank
        else:
            rank = bag.policies.rank(ad)
        if bag.ranks_hosts:
            kept: float | None = rank
            placed = guarded(bag, f"placement={bag.placement.name} rank", kept,
                             bag.placement.rank, k.view, BagView(bag), HostView(host), rank, now)
            if placed is None:
                continue
            rank = placed
        ranked.append((-rank, bag.bag_id, bag))
    ranked.sort(key=lambda c: (c[0], c[1]))
    return ranked


def _queue(k: Kernel, queue: deque[Job], bag: BagRecord, host: HostRecord, slots: Room, concurrency: int,
           now: float, deadline: float, changes: Changes, out: list[Assignment]) -> None:
    """Send re-queued jobs, each to a host it did not just fail on, and moved jobs to their pools only."""
    keep: deque[Job] = deque()
    horizon = now - k.s.config.retry_same_host_after
    live = len(k.s.live_hosts)
    while queue:
        job = queue.popleft()
        if job.state is not JobState.QUEUED:
            job.in_buffer = False
            continue
        failed_on = job.failed_on or {}
        avoid = failed_on.get(host.info.host_id, -math.inf) > horizon and len(failed_on) < live
        elsewhere = job.pools is not None and host.info.pool not in job.pools
        voted = bag.spec.quorum > 1 and job.candidates is not None and _same_account(k, job, host)
        unrouted = bag.places_jobs and job.pools is None and bool(k.s.pool_ads)
        if not slots.fits(bag.spec.cpus, concurrency) or avoid or elsewhere or voted or unrouted:
            keep.append(job)
            continue
        job.in_buffer = False
        out.append(k.send(bag, job, host, now, changes, deadline))
        slots.take(bag.spec.cpus)
    queue.extend(keep)


def _replicas(k: Kernel, bag: BagRecord, host: HostRecord, ad: HostAd, slots: Room, concurrency: int, now: float,
              changes: Changes, out: list[Assignment]) -> None:
    """Send queued replicas that this host may run: never a second copy of a job to the same host, nor, for a
    bag with a quorum, to a host of an account that holds or gave one."""
    keep: deque[Job] = deque()
    max_replicas = max(k.s.config.max_replicas, bag.spec.quorum)
    quorum = bag.spec.quorum > 1
    while bag.replicas:
        job = bag.replicas.popleft()
        if job.state is not JobState.RUNNING or not job.live or len(job.live) >= max_replicas:
            job.replica_pending, job.replica_pools = False, None
            continue
        if not slots.fits(bag.spec.cpus, concurrency) or any(
                k.s.instances[i].host_id == host.info.host_id for i in job.live) or (
                quorum and _same_account(k, job, host)) or (
                job.pools is not None and host.info.pool not in job.pools) or (
                job.replica_pools is not None and host.info.pool not in job.replica_pools):
            keep.append(job)
            continue
        matches, d = bag.policies.job_matches(ad, job_ad(k.s, job, now))
        if not matches:
            keep.append(job)
            continue
        job.replica_pending = False
        job.replica_pools = None
        bag.counts.replicas += 1
        seconds = d.deadline
        if bag.tail_strategy.sets_deadline:
            seconds = _deadline(k, bag, host, seconds, now)
        out.append(k.send(bag, job, host, now, changes, seconds, replica=True))
        slots.take(bag.spec.cpus)
    bag.replicas = keep


def _mixed(k: Kernel, bag: BagRecord, slots: Room, bound: int) -> int:
    """The bound under which replicas go before the bag's jobs with `replicas_mixed`: of the instances the
    host may still take, each is a replica with the chance that a slot drawn at random from the waiting
    replicas and the bag's jobs in the buffer holds one (the rest go to the jobs, then to replicas if none)."""
    need = bag.spec.cpus
    free = max(0, min((slots.want - slots.taken) // need, (bound - slots.busy) // need))
    waiting = len(bag.replicas)
    share = waiting / (waiting + len(bag.window.buffer) + len(bag.retry))
    drawn = sum(1 for _ in range(free) if k.rng.random() < share)
    return slots.busy + drawn * need


def _same_account(k: Kernel, job: Job, host: HostRecord) -> bool:
    """The host's account already holds an instance of the job, or gave it a result."""
    account = host.info.account or host.info.host_id
    return any(k.account(k.s.instances[i].host_id) == account for i in job.live) or any(
        c.account == account for c in job.candidates or ())


def _deadline(k: Kernel, bag: BagRecord, host: HostRecord, deadline: float, now: float) -> float:
    """The instance deadline the bag's tail strategy sets (the policies' if it fails)."""
    return guarded(bag, f"tail={bag.tail_strategy.name} deadline", deadline,
                   bag.tail_strategy.deadline, k.view, BagView(bag), HostView(host), deadline, now)

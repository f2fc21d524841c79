"""How many pilots each pool gets: GridBot's allocation of bags to pools, as a maximum flow.

The paper (section 5) calls it a variation of bipartite maximum matching: bags with a demand (slots
wanted) on one side, pools with a capacity (slots they may still add) on the other, an edge where the
bag's GridPolicy accepts the pool. Demand first goes onto capacity that already exists (pilots
running with free slots, queued, or submitted but not yet visible: the stateful selection of the
RENCI report), and only what is left asks for new pilots, so a burst of demand does not send
everything to the pool that looked empty a moment ago. New capacity is filled in the order of
preference (free before paid, lower level first): pools are added one at a time and the flow
augmented, and an augmenting path never lowers the flow already through an earlier pool, so the
result is a maximum flow that prefers the cheapest pools.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from gridbot.core.view import DispatchView
from gridbot.model.pools import PoolSpec


@dataclass(frozen=True)
class BagDemand:
    """A bag's wish for slots and the pools its GridPolicy accepts."""

    bag_id: int
    slots: int
    pools: frozenset[str]
    cpus: int = 1
    """Slots of each of its jobs: only whole blocks of that many on one host can take one."""


@dataclass(frozen=True)
class PoolCapacity:
    """A pool's slots: what exists and is not busy, what it may still add, and how pilots are sized."""

    name: str
    spare_slots: int
    """Free slots of running pilots, plus all slots of queued or just-submitted pilots (not the stale ones)."""
    queued_pilots: int
    """Pilots waiting in the pool's queue (or submitted and not yet visible), stale ones included: may be
    cancelled."""
    new_pilots: int
    """Pilots the pool's limits still allow (max_running and max_queued)."""
    pilot_slots: int
    preference: tuple[float, int, str] = (0.0, 0, "")
    """Lower is preferred: (price per CPU-hour, level, name)."""
    idle_hosts: tuple[int, ...] | None = None
    """The idle slots of each host that called in (None: not known; the spare slots count whole)."""
    stale_pilots: int = 0
    """Of the queued pilots, those that waited longer than the pool's `queue_patience`: not spare capacity."""

    def spare_for(self, cpus: int) -> int:
        """Spare slots a job of `cpus` slots can use: whole blocks of that many on one host, and on each pilot
        that has not called in yet (a fragment narrower than the job holds none of it)."""
        spare = max(0, self.spare_slots)
        if cpus <= 1 or self.idle_hosts is None:
            return spare
        fresh = max(0, self.queued_pilots - self.stale_pilots)
        running = max(0, spare - fresh * self.pilot_slots)  # free slots of the running pilots
        # (hosts that left are listed until the host timeout: their fragments are no more than the running pilots')
        whole = min(sum(i // cpus * cpus for i in self.idle_hosts), running // cpus * cpus)
        not_called = max(0, running - sum(self.idle_hosts)) // max(1, self.pilot_slots)
        return min(spare, whole + (fresh + not_called) * (self.pilot_slots // cpus * cpus))


class HostSlots(NamedTuple):
    """A pool's hosts that called in: slots busy, slots idle, and the idle slots of each."""

    busy: int
    idle: int
    idle_hosts: tuple[int, ...] = ()


@dataclass(frozen=True)
class Plan:
    """Pilots to submit and queued pilots to cancel, per pool; unmet demand per bag."""

    submit: dict[str, int]
    cancel: dict[str, int]
    unmet: dict[int, int]


class _Flow:
    """Edmonds-Karp on a small graph (node 0: source, 1: sink)."""

    def __init__(self) -> None:
        self.cap: dict[int, dict[int, int]] = {0: {}, 1: {}}

    def edge(self, a: int, b: int, c: int) -> None:
        self.cap.setdefault(a, {})[b] = self.cap.get(a, {}).get(b, 0) + c
        self.cap.setdefault(b, {}).setdefault(a, 0)

    def augment(self) -> int:
        """Push flow along shortest augmenting paths until none is left; return what was added."""
        total = 0
        while True:
            parent = {0: 0}
            q = deque([0])
            while q and 1 not in parent:
                u = q.popleft()
                for v, c in self.cap[u].items():
                    if c > 0 and v not in parent:
                        parent[v] = u
                        q.append(v)
            if 1 not in parent:
                return total
            v, push = 1, None
            while v != 0:
                u = parent[v]
                push = self.cap[u][v] if push is None else min(push, self.cap[u][v])
                v = u
            assert push is not None
            v = 1
            while v != 0:
                u = parent[v]
                self.cap[u][v] -= push
                self.cap[v][u] += push
                v = u
            total += push

    def used(self, a: int, b: int, original: int) -> int:
        return original - self.cap[a][b]


def max_flow(demands: Sequence[BagDemand], capacity: Mapping[str, int],
             order: Sequence[str] | None = None) -> tuple[dict[str, int], list[int]]:
    """Route demand to pool capacity; return the slots each pool takes and the demand left of each of
    `demands` (one node per demand: a bag whose placement wants slots per pool has one demand per pool, each
    bounded by its own slots).

    Pools are added in `order` (default: as given) and the flow augmented after each.
    """
    g = _Flow()
    node = [2 + i for i in range(len(demands))]
    names = list(order) if order is not None else list(capacity)
    pool_node = {p: 2 + len(demands) + i for i, p in enumerate(names)}
    for i, d in enumerate(demands):
        g.edge(0, node[i], d.slots)
    for p in names:
        for i, d in enumerate(demands):
            if p in d.pools:
                g.edge(node[i], pool_node[p], d.slots)
        g.edge(pool_node[p], 1, capacity[p])
        g.augment()
    taken = {p: g.used(pool_node[p], 1, capacity[p]) for p in names}
    return taken, [g.cap[0][node[i]] for i in range(len(demands))]


def plan(demands: Sequence[BagDemand], pools: Sequence[PoolCapacity]) -> Plan:
    """Pilots to submit to each pool and queued pilots to cancel, for the current demand."""
    demands = [d for d in demands if d.slots > 0]
    existing, rest = _onto_spare(demands, pools)
    residual = [BagDemand(d.bag_id, left, d.pools, d.cpus) for d, left in zip(demands, rest, strict=True)]
    order = [p.name for p in sorted(pools, key=lambda p: p.preference)]
    added, left_after = max_flow(residual, {p.name: max(0, p.new_pilots) * p.pilot_slots for p in pools}, order)
    unmet: dict[int, int] = {}
    for d, n in zip(residual, left_after, strict=True):
        unmet[d.bag_id] = unmet.get(d.bag_id, 0) + n
    submit, cancel = {}, {}
    for p in pools:
        n = -(-added[p.name] // p.pilot_slots)
        if n:
            submit[p.name] = min(n, p.new_pilots)
        n = _surplus(p, existing[p.name], [d.cpus for d in demands if p.name in d.pools])
        if n > 0:
            cancel[p.name] = n
    return Plan(submit, cancel, {b: n for b, n in unmet.items() if n})


def _surplus(p: PoolCapacity, taken: int, widths: Sequence[int]) -> int:
    """How many of a pool's queued pilots no demand needs: the fresh ones beyond what the demand took of the
    pool's spare slots (`taken`) past those of its running pilots, and the stale ones too once no bag wants the
    pool or it has a whole pilot's worth beyond the demand. The slots are counted as the widest job that wants
    the pool can use them (`PoolCapacity.spare_for`): a running host's idle fragment narrower than that job is
    no capacity for it, and counting it as such cancelled the very queued pilot the job was routed to, which
    the next step submitted again (found by review). With jobs of several widths this keeps a queued pilot the
    narrow ones could do without, never cancels one a wide one needs."""
    width = max(widths, default=1)
    per_pilot = max(1, p.pilot_slots // width * width)
    fresh = p.queued_pilots - p.stale_pilots
    usable = max(0, p.spare_for(width))
    on_running = max(0, usable - fresh * per_pilot)
    needed = -(-max(0, taken - on_running) // per_pilot)
    spare_pilot = usable - taken >= per_pilot
    return max(0, fresh - needed) + (p.stale_pilots if spare_pilot or not widths else 0)


def _onto_spare(demands: Sequence[BagDemand], pools: Sequence[PoolCapacity]) -> tuple[dict[str, int], list[int]]:
    """Route demand onto the pools' spare slots: the widest jobs first, each width onto the blocks of its size
    left (`PoolCapacity.spare_for`), then narrower ones onto what remains. Returns the slots each pool gives
    and the demand left of each of `demands`."""
    widths = sorted({d.cpus for d in demands}, reverse=True)
    if widths in ([], [1]):
        return max_flow(demands, {p.name: max(0, p.spare_slots) for p in pools})
    given = {p.name: 0 for p in pools}
    rest = [d.slots for d in demands]
    for w in widths:
        group = [i for i, d in enumerate(demands) if d.cpus == w]
        cap = {p.name: max(0, min(p.spare_for(w), max(0, p.spare_slots)) - given[p.name]) for p in pools}
        taken, left = max_flow([demands[i] for i in group], cap)
        for i, n in zip(group, left, strict=True):
            rest[i] = n
        for name, n in taken.items():
            given[name] += n
    return given, rest


PilotId = TypeVar("PilotId")


def pilots_to_cancel(queued: Sequence[PilotId], n: int, stale: int = 0) -> list[PilotId]:
    """Which of a pool's queued pilots to cancel when `Plan.cancel` asks for `n`: the stale ones, then the newest.

    `queued` lists the pool's queued pilots in the order they were submitted, its first `stale` those that
    waited past the pool's `queue_patience` (`PoolCapacity.stale_pilots`). Within the patience the oldest
    have waited longest and are the likeliest to start soon (a batch queue ages its jobs up), so they are
    kept; past it a pilot is taken for stuck, and goes first. The server's overlay and the simulator both
    cancel these very pilots (issue 14: the simulator once cancelled whichever pilot started next, so a fresh
    pilot was eaten by a stale cancellation while a pilot stuck in the queue still counted as spare capacity).
    """
    if n <= 0:
        return []
    stale = max(0, min(stale, n, len(queued)))
    fresh = queued[stale:]
    return list(queued[:stale]) + list(reversed(fresh[max(0, len(fresh) - (n - stale)):]))


def bag_demands(view: DispatchView, pools: Iterable[str], now: float) -> list[BagDemand]:
    """Each active bag's queued jobs (and replicas waiting for a host), in slots (its `cpus` each), and the
    pools among `pools` that its GridPolicy accepts and whose pilots are wide enough for one of its jobs; a
    bag whose placement says how many slots it wants per pool (`Placement.pilots`) gets one demand per such
    pool instead. A pool whose pilots the bag kept refusing (`DispatchView.held_back`) gets a demand of one
    job's slots when its next pilot is due and none before: one pilot at a time, absorbed by a queued one."""
    names = list(pools)
    out = []
    for bag in view.bags():
        cpus = bag.spec.cpus
        queued = (bag.queued + bag.waiting_replicas) * cpus
        if queued <= 0:
            continue
        accepted = [n for n in names if view.accepts_pool(bag.bag_id, n) and _fits(view.pool_ad(n), cpus)]
        held = view.held_back(bag.bag_id, now)
        wanted = view.pilots_wanted(bag.bag_id, [p for p in accepted if not held.get(p)], now)
        if wanted is None:
            free = frozenset(n for n in accepted if n not in held)
            if free:
                out.append(BagDemand(bag.bag_id, queued, free, cpus))
            wanted = {p: cpus for p in accepted if p in held}
        for pool, n in sorted(wanted.items()):
            if pool in held:  # the bag refused its pilots, one after another: one pilot at a time, when it is due
                n = 0 if held[pool] else min(n, cpus)
            if n > 0 and pool in accepted:
                out.append(BagDemand(bag.bag_id, n, frozenset({pool}), cpus))
    return out


def _fits(ad: Mapping[str, object] | None, cpus: int) -> bool:
    """A pool's pilots (its ad's Cpus) hold a job of `cpus` slots."""
    if cpus <= 1 or ad is None:
        return True
    width = ad.get("Cpus", 1)
    return not isinstance(width, int) or isinstance(width, bool) or width >= cpus


def host_slots(view: DispatchView, now: float) -> dict[str, HostSlots]:
    """Per pool: slots busy and slots idle on the hosts heard from within the host timeout, and the idle
    slots of each."""
    return {name: HostSlots(p.busy, p.slots - p.busy, p.idle_hosts) for name, p in view.pools(now).items()
            if p.hosts}


def pool_capacity(spec: PoolSpec, queued: int, running: int, hosts: HostSlots | tuple[int, int], can_submit: bool,
                  max_running: int | None = None, stale: int = 0) -> PoolCapacity:
    """A pool's capacity from its pilots (`queued` waiting, `stale` of them past the pool's `queue_patience`,
    `running` started) and the slots of the hosts that called in (`hosts`: busy and idle, from `host_slots`).

    Spare slots are those of the running pilots not busy, plus every slot of the queued ones: the pool's
    own count of running pilots bounds it, so a host that left (its worker exited after idling, its
    pilot ended) no longer counts as idle capacity while the server still remembers it; a pilot whose
    worker has not called in yet counts as spare. A pool of hosts that come by themselves (`static`) has
    no pilot count: its idle hosts are its spare slots. `max_running` overrides the spec's limit (a
    pool whose size varies)."""
    busy, idle = hosts[0], hosts[1]
    fragments = hosts.idle_hosts if isinstance(hosts, HostSlots) else None
    stale = max(0, min(stale, queued))
    spare = max(0, running * spec.cpus - busy) + (queued - stale) * spec.cpus if spec.submits else idle
    can_add = (spec.max_running if max_running is None else max_running) - running - queued
    if spec.queues:  # a local pilot runs at once: there is no queue to limit
        can_add = min(can_add, spec.max_queued - queued)
    can_add = max(0, can_add) if can_submit and spec.submits else 0
    return PoolCapacity(spec.name, spare, queued, can_add, spec.cpus,
                        (spec.price_per_cpu_hour, spec.level, spec.name), fragments, stale)


def stale_count(submitted: Iterable[float], patience: float, now: float) -> int:
    """How many of a pool's queued pilots, submitted at `submitted`, waited longer than `patience` (0: none)."""
    if patience <= 0:
        return 0
    cutoff = now - patience
    return sum(1 for t in submitted if t < cutoff)

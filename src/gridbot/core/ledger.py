"""Money: what each bag has spent on the pools, by pool, and what its running instances hold (issue 16).

A pool may charge in two ways (its ad: `PricePerCpuHour`, `PricePerPilotHour`, `ChargingPeriod`):
- per CPU-hour: an instance costs the wall time its host reported for it x the price, since it held one of
  the pool's slots that long (Nimrod-G's and GridSim's price per unit of PE time);
- per pilot-hour: a pilot costs its started charging periods (a cloud instance bills by the started hour).
  Those from its worker's first call to the end of the last instance it reported are shared by the bags that
  ran instances on it, in proportion to their instances' wall time there; the periods it idled on after
  that, and a pilot that ran nothing, are nobody's: `idle_pilots` shows them (the run's, not a bag's).
A host here is one worker run, that is one pilot; the time a pilot took to boot before its worker called is
not seen, and is in the same started period unless the boot took longer than the period.

An instance lost without a report (its host silent or past its deadline) costs nothing per CPU-hour: no
host said how long it held a slot (its pilot's hours are billed all the same). Prices are the pools'
current ones: a pools file changed mid-run re-prices what was spent before.

The store holds everything this needs (instances' `wall_s` and `host_id`, hosts' pool and first and last
contact), so the ledger is rebuilt from it after a restart (`Usage`) and a test can recompute it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec


@dataclass(frozen=True)
class Prices:
    """What a pool charges (all zero: free, as own machines and volunteers are)."""

    per_cpu_hour: float = 0.0
    per_pilot_hour: float = 0.0
    period: float = 3600.0

    @classmethod
    def of(cls, ad: Mapping[str, object] | None) -> Prices:
        """A pool's prices from its ad (None: a pool not in the pools file, free)."""
        if not ad:
            return FREE
        period = ad_number(ad, "ChargingPeriod", 3600.0)
        return cls(max(0.0, ad_number(ad, "PricePerCpuHour", 0.0)), max(0.0, ad_number(ad, "PricePerPilotHour", 0.0)),
                   period if period > 0 else 3600.0)

    @property
    def free(self) -> bool:
        return self.per_cpu_hour <= 0 and self.per_pilot_hour <= 0

    def instance(self, seconds: float) -> float:
        """What an instance that held a slot `seconds` costs per CPU-hour."""
        return self.per_cpu_hour * max(0.0, seconds) / 3600.0

    def pilot(self, first_seen: float, last_seen: float) -> float:
        """What a pilot alive from `first_seen` to `last_seen` costs: its started charging periods (at least
        one once it called)."""
        if self.per_pilot_hour <= 0:
            return 0.0
        periods = max(1, math.ceil((last_seen - first_seen) / self.period - 1e-9))
        return periods * self.period / 3600.0 * self.per_pilot_hour


FREE = Prices()


def ad_number(ad: Mapping[str, object] | None, key: str, default: float) -> float:
    """A number of a pool's ad (its price, size, speed), or `default` where the ad has none that is a finite
    number (an attribute a pools file or a simulator scenario wrote as anything else counts as absent)."""
    v = (ad or {}).get(key, default)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else default


class Usage(NamedTuple):
    """Instances of one bag that ended on one host with a report: how many, their wall time summed, and when
    the last of them ended."""

    bag_id: int
    host_id: str
    instances: int
    seconds: float
    last: float = 0.0


class HostTerm(NamedTuple):
    """What the ledger needs of a host: its pool and when its worker first and last called."""

    pool: str
    first_seen: float
    last_seen: float


class PoolBill(msgspec.Struct, frozen=True):
    """One pool's part of a bag's spend."""

    pool: str
    instances: int
    """Instances of the bag that ended there with a report."""
    seconds: float
    """Their wall time summed."""
    cpu: float
    """Charged per CPU-hour."""
    pilots: float
    """The bag's share of the pool's pilots' started periods."""
    hosts: int
    """Hosts (pilots) of the pool that ran the bag's instances."""

    @property
    def total(self) -> float:
        return self.cpu + self.pilots


class Bill(msgspec.Struct, frozen=True):
    """A bag's spend, per pool (`gridbot cost`)."""

    bag_id: int
    pools: list[PoolBill]

    @property
    def total(self) -> float:
        return sum(p.total for p in self.pools)


@dataclass
class Ledger:
    """Wall time of ended instances per bag and host: all the spend derives from it and the hosts' terms."""

    by_bag: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    """bag id -> host id -> [instances, seconds]."""
    by_host: dict[str, float] = field(default_factory=dict)
    """host id -> seconds of every bag's instances there (the pilot's use, which shares its bill)."""
    last_use: dict[str, float] = field(default_factory=dict)
    """host id -> when the last instance it reported ended (its periods after that are idle)."""

    def charge(self, bag_id: int, host_id: str, seconds: float, at: float, instances: int = 1) -> None:
        """An instance of the bag ended on the host at `at` with a report of `seconds` of wall time."""
        seconds = max(0.0, seconds) if math.isfinite(seconds) else 0.0
        entry = self.by_bag.setdefault(bag_id, {}).setdefault(host_id, [0.0, 0.0])
        entry[0] += instances
        entry[1] += seconds
        self.by_host[host_id] = self.by_host.get(host_id, 0.0) + seconds
        if math.isfinite(at):
            self.last_use[host_id] = max(self.last_use.get(host_id, at), at)

    def restore(self, usage: Iterable[Usage]) -> None:
        """Take up what the store holds (after a restart)."""
        for u in usage:
            self.charge(u.bag_id, u.host_id, u.seconds, u.last, u.instances)

    def used_until(self, host_id: str, term: HostTerm) -> float:
        """The end of the part of a pilot's life the bags it served pay: its last reported instance's end."""
        return min(term.last_seen, max(term.first_seen, self.last_use.get(host_id, term.first_seen)))

    def bill(self, bag_id: int, host: Callable[[str], HostTerm | None],
             prices: Callable[[str], Prices]) -> Bill:
        """The bag's spend so far, per pool. `host` gives a host's terms (None: unknown host, charged nothing
        for its pilot and priced as a free pool), `prices` a pool's prices."""
        pools: dict[str, list[float]] = {}
        for host_id, (count, seconds) in self.by_bag.get(bag_id, {}).items():
            term = host(host_id)
            pool = term.pool if term is not None else ""
            p = prices(pool) if term is not None else FREE
            row = pools.setdefault(pool, [0.0, 0.0, 0.0, 0.0, 0.0])
            row[0] += count
            row[1] += seconds
            row[2] += p.instance(seconds)
            if term is not None and p.per_pilot_hour > 0:
                total = self.by_host.get(host_id, 0.0)
                share = seconds / total if total > 0 else 1.0 / max(1, self._bags_on(host_id))
                row[3] += p.pilot(term.first_seen, self.used_until(host_id, term)) * share
            row[4] += 1
        return Bill(bag_id, [PoolBill(name, int(r[0]), r[1], r[2], r[3], int(r[4]))
                             for name, r in sorted(pools.items())])

    def idle_pilots(self, hosts: Mapping[str, HostTerm], prices: Callable[[str], Prices]) -> float:
        """What the pilots' periods no bag pays cost: those of pilots that ran no instance with a report, and
        those a pilot idled on after its last one."""
        total = 0.0
        for h, t in hosts.items():
            p = prices(t.pool)
            if p.per_pilot_hour <= 0:
                continue
            whole = p.pilot(t.first_seen, t.last_seen)
            total += whole - p.pilot(t.first_seen, self.used_until(h, t)) if h in self.by_host else whole
        return total

    def _bags_on(self, host_id: str) -> int:
        return sum(1 for hosts in self.by_bag.values() if host_id in hosts)

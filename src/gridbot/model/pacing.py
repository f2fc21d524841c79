"""A host's side of the worker protocol, written once: when it talks to the server, how many instances it
asks for, and when it leaves for want of work.

The worker (worker/worker.py) and the simulator's hosts (sim/engine.py) both follow a `Pacing`, so a
simulated host asks what a real one would, when it would. It is given the time and its random draws,
and never reads a clock. `server_hold` is the server's side of the same exchange: how long it holds
an idle host's request (the long poll of server/app.py, which the simulator models too).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

REPORT_DELAY = 1.0
"""Seconds a result may wait for company while the host still holds work (reports travel in bundles)."""
PREFETCH_MAX = 500
"""Most instances held beyond the slots, whatever `prefetch_seconds` asks for."""
LONG_POLL_S = 30.0
"""Longest time the server holds an idle host's request waiting for work."""


@dataclass(frozen=True)
class PaceConfig:
    """What a host's pacing depends on; the defaults are a worker's started by hand."""

    slots: int = 1
    prefetch: int = 0
    """Instances held beyond `slots`, so the next job starts without a round trip (bundling)."""
    prefetch_seconds: float = 0.0
    """Hold enough instances beyond `slots` for this many seconds of work, from the wall time of the
    instances run so far (0: `prefetch` only), never fewer than `prefetch`."""
    idle_timeout: float = 0.0
    """Leave after this long holding nothing and reporting nothing (0: never)."""
    leave_refused: bool = False
    """Also leave at once, holding nothing, once the server said the bags refuse this host (`answered`'s
    `refused`): a pilot the overlay started does, as GridBot's did; a worker started by hand waits for its
    idle timeout (its user may be about to change the bag's policy)."""
    backoff_cap: float = 0.0
    """0: after an empty answer, wait the server's backoff times a uniform draw in [0.5, 1.5), so a fleet
    spreads out (a gridbot worker). Above 0: a BOINC client's own backoff, twice the last one after each
    empty answer (at least the server's), up to this."""


class Step(NamedTuple):
    """What a host does next, as of the moment it was asked."""

    want: int
    """Instances to ask for when it talks."""
    prefetch: int
    """Its prefetch now (`HostInfo.prefetch`, the policies' `Host.Prefetch`)."""
    at: float
    """When it talks next (the moment asked: now), unless something changes first."""
    leave: bool
    """It got no work for `idle_timeout`, or was refused by the bags and holds nothing (`leave_refused`): it
    leaves (and does not talk)."""


class Pacing:
    """One host's pacing: call `begin` when it starts, `step` whenever its state changes or the time it
    was told comes, `answered` after each answer, and `ran` with the wall time of each instance ended."""

    def __init__(self, config: PaceConfig) -> None:
        self.config = config
        self.last_work = 0.0
        """When the host last held or reported work, or was sent some."""
        self.next_talk = 0.0
        """Earliest time to ask for work again (after an empty answer's backoff)."""
        self.next_heartbeat = 0.0
        """Latest time to talk again, hungry or not, so the server knows the host is alive."""
        self.avg_wall = 0.0
        """Moving average of the wall seconds of the instances the host ran (0: none yet)."""
        self.backoff = 0.0
        """The last wait after an empty answer (a BOINC client's doubles)."""
        self.refused = False
        """The server's last answer refused the host for every bag with work waiting."""

    def begin(self, now: float) -> None:
        """The host starts at `now`: it talks at once, and its idle time counts from now."""
        self.last_work = now
        self.next_talk = self.next_heartbeat = now

    def prefetch(self) -> int:
        """Instances to hold beyond the slots now (see `PaceConfig.prefetch_seconds`)."""
        cfg = self.config
        if not cfg.prefetch_seconds or not self.avg_wall:
            return cfg.prefetch
        return max(cfg.prefetch, min(PREFETCH_MAX, int(cfg.slots * cfg.prefetch_seconds / self.avg_wall)))

    def ran(self, wall_s: float) -> None:
        """An instance ended after `wall_s` seconds (it moves the prefetch of `prefetch_seconds`)."""
        self.avg_wall = wall_s if not self.avg_wall else 0.9 * self.avg_wall + 0.1 * wall_s

    def step(self, now: float, running: int, waiting: int, reports_since: float | None) -> Step:
        """What the host does next, holding `running` instances on its slots and `waiting` more, with
        results to report since `reports_since` (None: none).

        It asks when a slot is idle or half the prefetched work is gone; held results go at once when
        nothing waits to run here (the tail), otherwise after `REPORT_DELAY`; and it talks at least at
        each heartbeat.
        """
        cfg = self.config
        prefetch = self.prefetch()
        want = max(0, cfg.slots + prefetch - running - waiting)
        if running or waiting or reports_since is not None:
            self.last_work = now
        elif cfg.idle_timeout and ((self.refused and cfg.leave_refused) or now - self.last_work > cfg.idle_timeout):
            return Step(want, prefetch, math.inf, True)
        hungry = want > 0 and (running < cfg.slots or 2 * want >= prefetch)
        at = self.next_heartbeat
        if hungry:
            at = min(at, self.next_talk)
        if reports_since is not None:
            at = min(at, reports_since + REPORT_DELAY if waiting else now)
        return Step(want, prefetch, max(at, now), False)

    def answered(self, now: float, want: int, assigned: int, backoff: float, heartbeat: float,
                 uniform: Callable[[float, float], float], refused: bool = False) -> None:
        """The server answered at `now` a request for `want` with `assigned` instances, a `backoff` and a
        `heartbeat`; `uniform` draws the jitter (`random.uniform`, or a simulation's seeded one). `refused`: the bags
        refuse the host, which then leaves as soon as it holds nothing (with `leave_refused` and an idle timeout),
        as GridBot's pilots did (section 5), rather than idle in a slot of its pool that the overlay counts as
        spare while the bags' work waits for a host they accept."""
        self.next_heartbeat = now + heartbeat
        self.refused = refused and not assigned
        if assigned:
            self.last_work = now
            self.next_talk = now
            self.backoff = 0.0
        elif want:
            cap = self.config.backoff_cap
            if cap:
                self.backoff = min(cap, max(backoff, 2 * self.backoff))
            else:
                self.backoff = backoff * uniform(0.5, 1.5)
            self.next_talk = now + self.backoff


def server_hold(want: int, held: int, reports: int, assigned: int, cancelled: int, backoff: float,
                refused: bool = False) -> float | None:
    """How the server answers an exchange in which a host holding `held` instances, reporting `reports`,
    asked for `want` and was given `assigned` with `cancelled` to kill and a `backoff` (`refused`: by every bag
    with work waiting, which it is told at once, so a pilot leaves without waiting for the long poll).

    None: at once, as decided. 0.0: at once with no backoff, since the host just handed in its last
    results and holds nothing (it asks again at once, rather than sleep through work that comes
    meanwhile). Otherwise the seconds the server holds the request of an idle host, answering it again
    as soon as work is added (the long poll), or with no work and no backoff once they have passed.
    """
    if assigned or held or want <= 0 or backoff <= 0 or refused:
        return None
    if reports or cancelled:
        return 0.0
    return min(backoff, LONG_POLL_S)

"""The overlay constructor: pilots submitted to each pool in response to demand, within its limits.

Every `interval` seconds: poll the state of our pilots, compute each active bag's demand (queued jobs,
in slots) and the pools its GridPolicy accepts, plan with the max-flow allocation (existing and
just-submitted pilots absorb demand first: stateful selection), then submit and cancel. Pool calls
(sbatch, squeue, EC2) run on a worker thread so dispatching never waits for them. A pool whose calls
fail is backed off exponentially and its last error shown in `gridbot pools`; the others go on.

Pilots are recorded in the store as they are submitted and as they move. A restarted server takes up
those still queued or running before it plans anything, so the pools' limits hold across a restart; a
clean stop leaves them running unless the server was started with --cancel-pilots-on-exit (docs/pools.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgspec

from gridbot.model.pools import KINDS, PoolMonitor, PoolSpec
from gridbot.model.states import PILOT_TERMINAL, PILOT_TRANSITIONS, PilotState, check_transition
from gridbot.pools.adapters import make_adapter
from gridbot.pools.base import PilotRequest, PoolAdapter, PoolError
from gridbot.protocol import PoolInfo
from gridbot.schedulers.overlay import (
    BagDemand,
    PoolCapacity,
    bag_demands,
    host_slots,
    pilots_to_cancel,
    plan,
    pool_capacity,
    stale_count,
)
from gridbot.security.access import ServerAccess
from gridbot.security.keys import AccessError
from gridbot.server.service import Service
from gridbot.store.base import PilotRow, StoreError

log = logging.getLogger("gridbot.overlay")
BACKOFF_BASE, BACKOFF_CAP = 15.0, 900.0
FAILED_PILOTS = 3
"""Pilots of a pool that end, one after another, with no host of the pool heard from since they began, before
the pool's next is held back: a pilot that cannot start (a pool without run_as, a wrong Python, an EC2 image
whose install fails) would otherwise be sent again at every step. A pilot whose host was heard from (it ran,
was refused by the bags, was preempted, had its key rotated) does not count."""


@dataclass
class _Pool:
    spec: PoolSpec
    adapter: PoolAdapter | None
    error: str = ""
    pilots: dict[str, PilotRow] = field(default_factory=dict)
    """By native id, in the order they were submitted."""
    ended: int = 0
    submitted: int = 0
    failures: int = 0
    backoff_until: float = 0.0
    failed_in_a_row: int = 0
    """Its pilots that ended without a host of the pool heard from since they began (`FAILED_PILOTS`)."""
    failed_level: int = 0
    """How many steps have held the pool back for them: its wait doubles with each."""
    failed_at: float = 0.0
    """When the last of them was seen to end."""
    last_failed: str = ""
    pilot_error: bool = False
    """`error` is about pilots that cannot start (cleared once a host of the pool is heard from)."""
    monitor_at: float = 0.0
    """When its monitoring is read next."""
    reading: PoolMonitor | None = None
    done_samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=120))

    def queued(self, now: float) -> tuple[list[PilotRow], int]:
        """Its queued pilots in the order they were submitted (a restarted server may hold them in another), and
        how many of the first waited past its `queue_patience` (`schedulers.overlay.stale_count`)."""
        waiting = sorted((r for r in self.pilots.values() if r.state is PilotState.QUEUED),
                         key=lambda r: r.submitted_at)
        return waiting, stale_count((r.submitted_at for r in waiting), self.spec.queue_patience, now)


class Overlay:
    """Keeps the pools' pilots matched to the bags' demand."""

    def __init__(self, service: Service, pools: Sequence[PoolSpec], server_url: str, workdir: Path,
                 interval: float = 3.0, access: ServerAccess | None = None, fingerprint: str = "",
                 cancel_on_exit: bool = False) -> None:
        self.service = service
        self.request = PilotRequest(server_url, fingerprint=fingerprint)
        self.access = access
        self.interval = interval
        self.cancel_on_exit = cancel_on_exit
        self.pools: dict[str, _Pool] = {}
        self._restored = False
        self._new: list[PilotRow] = []
        self._changed: dict[tuple[str, str], PilotRow] = {}
        """Pilots submitted and moved since the store last took them."""
        service.dispatcher.pool_ads = {spec.name: spec.ad() for spec in pools}
        for spec in pools:
            try:
                adapter: PoolAdapter | None = make_adapter(spec, workdir)
                error = ""
            except PoolError as e:
                adapter, error = None, str(e)
                log.error("%s; the other pools go on", e)
            self.pools[spec.name] = _Pool(spec, adapter, error)

    async def run(self) -> None:
        """The loop, until cancelled; a failing step is logged and tried again next time."""
        while True:
            try:
                await self.step(time.time())
            except Exception:
                log.exception("overlay step failed; will try again")
            await asyncio.sleep(self.interval)

    async def step(self, now: float) -> None:
        loop = asyncio.get_running_loop()
        if not self._restored:
            await loop.run_in_executor(None, self.restore)
        live = {name: [i for i, r in p.pilots.items() if r.state not in PILOT_TERMINAL]
                for name, p in self.pools.items()}
        states = await loop.run_in_executor(None, self._poll, live, now)
        seen = self._seen()
        for name, result in states.items():
            self._observe(self.pools[name], result, now, seen.get(name))
        for name, pool in self.pools.items():
            self._starting(pool, now, seen.get(name))
        due = [p for p in self.pools.values() if p.adapter is not None and p.spec.monitor_interval > 0
               and now >= p.monitor_at]
        if due:
            readings = await loop.run_in_executor(None, self._monitor, due, now)
            for name, reading in readings.items():
                self.service.monitor(name, reading)
        decision = plan(self._demand(), self._capacity(now))
        await loop.run_in_executor(None, self._act, decision.submit, decision.cancel, now)
        # bags that cannot move say why: a pool that fails to start pilots is part of the answer
        self.service.dispatcher.pool_errors = {name: p.error for name, p in self.pools.items() if p.error}
        done = self._pool_hosts()
        for name, p in self.pools.items():
            p.done_samples.append((now, done.get(name, (0, 0))[1]))

    def _monitor(self, due: list[_Pool], now: float) -> dict[str, PoolMonitor | None]:
        """Read the monitoring of the pools that have one (on the worker thread), each reading as taken: its
        time is when the command ran. A failed reading is None, so the placements count the pool from gridbot's
        own records rather than from stale numbers."""
        out: dict[str, PoolMonitor | None] = {}
        for pool in due:
            assert pool.adapter is not None
            pool.monitor_at = now + pool.spec.monitor_interval
            try:
                reading = pool.adapter.monitor(time.time())
            except Exception as e:  # one pool's trouble is never the others'
                log.warning("pool %s: its monitoring could not be read: %s", pool.spec.name, e)
                reading = None
            pool.reading = out[pool.spec.name] = reading
        return out

    def _poll(self, live: dict[str, list[str]], now: float) -> dict[str, dict[str, PilotState] | PoolError]:
        out: dict[str, dict[str, PilotState] | PoolError] = {}
        for name, ids in live.items():
            pool = self.pools[name]
            if pool.adapter is None or not ids:
                continue
            try:
                out[name] = pool.adapter.status(ids)
            except Exception as e:  # one pool's trouble is never the others'
                out[name] = e if isinstance(e, PoolError) else PoolError(f"pool '{name}': status failed: {e!r}")
        return out

    def restore(self) -> None:
        """Take up the pilots that an earlier run of the server left queued or running (the store has them), so
        that each pool's counts, and so its limits, include them."""
        for row in self.service.store.pilots(live=True):
            pool = self.pools.get(row.pool)
            if pool is None:
                log.warning("pilot %s of pool %s is left as it is: the pools file has no such pool now",
                            row.native_id, row.pool)
            else:
                pool.pilots[row.native_id] = row
        for name, pool in self.pools.items():
            if pool.pilots and pool.adapter is not None:
                try:
                    pool.adapter.attach({i: r.state for i, r in pool.pilots.items()})
                except Exception as e:  # one pool's trouble is never the others'
                    pool.error = f"pool '{name}': cannot take up the pilots of the server's last run: {e}"
                    log.error("%s", pool.error)
                    continue
                log.info("pool %s: took up %d pilots of the server's last run", name, len(pool.pilots))
        self._restored = True

    def _observe(self, pool: _Pool, result: dict[str, PilotState] | PoolError, now: float,
                 seen: float | None = None) -> None:
        """The pilots' states as the pool reports them; `seen`: when a host of the pool was last heard from
        (None: never), which tells a pilot that ended without ever taking work from one that did."""
        if isinstance(result, PoolError):
            pool.error, pool.pilot_error = str(result), False
            return
        for pilot, state in result.items():
            row = pool.pilots.get(pilot)
            if row is None or state is row.state:
                continue
            if state not in PILOT_TRANSITIONS[row.state]:  # e.g. a batch system requeued a running pilot
                log.debug("pool %s: pilot %s is %s again; still counted %s", pool.spec.name, pilot, state, row.state)
                continue
            self._move(pool, row, state, now)
            began = row.started_at if row.started_at is not None else row.submitted_at
            if state in (PilotState.FAILED, PilotState.COMPLETED) and (seen is None or seen < began):
                pool.failed_in_a_row += 1
                pool.failed_at, pool.last_failed = now, pilot

    def _starting(self, pool: _Pool, now: float, seen: float | None) -> None:
        """Once in a step: a pool whose pilots keep ending without a host heard from waits before its next, one
        doubling a step however many ended in it; a host of the pool heard from since ends that."""
        if pool.failed_in_a_row and seen is not None and seen >= pool.failed_at:
            pool.failed_in_a_row = pool.failed_level = 0
            if pool.pilot_error:
                pool.error, pool.pilot_error = "", False
            return
        if pool.failed_in_a_row < FAILED_PILOTS or pool.failed_at != now or pool.adapter is None:
            return
        try:
            why = pool.adapter.why_failed(pool.last_failed)
        except Exception as e:  # one pool's trouble is never the others'
            why = f"(its reason could not be read: {e})"
        delay = min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** min(pool.failed_level, 16))
        pool.failed_level += 1
        pool.backoff_until = max(pool.backoff_until, now + delay)
        pool.error = (f"{pool.failed_in_a_row} pilots in a row ended without taking work"
                      f"{': the last, ' + why if why else ''} (next pilot in {delay:.0f} s)")
        pool.pilot_error = True
        log.error("pool %s: %s", pool.spec.name, pool.error)

    def _seen(self) -> dict[str, float]:
        """When a host of each pool was last heard from."""
        out: dict[str, float] = {}
        for h in self.service.dispatcher.view.known_hosts():
            out[h.pool] = max(out.get(h.pool, h.last_seen), h.last_seen)
        return out

    def _move(self, pool: _Pool, row: PilotRow, state: PilotState, now: float) -> None:
        """The one way a pilot changes state: along PILOT_TRANSITIONS, recorded for the store."""
        check_transition(PILOT_TRANSITIONS, row.state, state)
        started = now if state is PilotState.RUNNING else row.started_at
        ended = now if state in PILOT_TERMINAL else None
        moved = msgspec.structs.replace(row, state=state, started_at=started, ended_at=ended)
        pool.pilots[row.native_id] = moved
        self._changed[(row.pool, row.native_id)] = moved
        if state in PILOT_TERMINAL:
            pool.ended += 1

    def _save(self) -> None:
        """Give the store the pilots submitted and moved since it last took them (kept for the next try if it
        cannot take them now)."""
        if not self._new and not self._changed:
            return
        try:
            self.service.store.save_pilots(self._new, list(self._changed.values()))
        except StoreError as e:
            log.warning("cannot record pilots now (%s); will try again", e)
            return
        self._new, self._changed = [], {}

    def _demand(self) -> list[BagDemand]:
        return bag_demands(self.service.dispatcher.view, [n for n, p in self.pools.items() if p.adapter is not None],
                           time.time())

    def _capacity(self, now: float) -> list[PoolCapacity]:
        hosts = host_slots(self.service.dispatcher.view, now)
        out = []
        for name, p in self.pools.items():
            queued, stale = p.queued(now)
            running = sum(1 for r in p.pilots.values() if r.state is PilotState.RUNNING)
            out.append(pool_capacity(p.spec, len(queued), running, hosts.get(name, (0, 0)),
                                     p.adapter is not None and now >= p.backoff_until, stale=stale))
        return out

    def _pilot(self, pool: str, n: int, now: float) -> PilotRequest:
        """The request for `n` pilots of `pool`, with the pool's worker key as the access file has it now (so
        a rotated key reaches the next pilots); never the submitter's or the admin's key. A pool whose pilots'
        jobs can read what the pilot was given (`PoolKind.exposes_pilot_env`: an EC2 instance's user data)
        gets an enrollment token for `n` hosts instead (`_launch` asks for one at a time), spent by the
        pilot's worker before any job runs."""
        if self.access is None:
            return self.request
        key = self.access.access().workers.get(pool, "")
        if not key:
            raise PoolError(f"the access file {self.access.access_path} has no worker key for pool '{pool}'; "
                            f"make one with `gridbot access rotate worker --pool {pool}` (or restart the server)")
        if KINDS[self.pools[pool].spec.kind].exposes_pilot_env:
            try:
                key = self.access.auth.enrollment(key, n, now)
            except AccessError as e:
                raise PoolError(f"pool '{pool}': {e}; make a new one with `gridbot access rotate worker --pool "
                                f"{pool}`") from None
        return replace(self.request, key=key)

    def _launch(self, name: str, n: int, now: float) -> tuple[list[str], Exception | None]:
        """Submit `n` pilots of pool `name`: their ids, and the error that stopped it (None: none). A pool whose
        pilots' jobs can read what a pilot was given gets one submission per pilot, each with its own
        enrollment token, so a job on one instance never finds a token its siblings have yet to spend."""
        adapter = self.pools[name].adapter
        assert adapter is not None
        ids: list[str] = []
        single = self.access is not None and KINDS[self.pools[name].spec.kind].exposes_pilot_env
        try:
            for _ in range(n if single else 1):
                ids += adapter.submit(1 if single else n, self._pilot(name, 1 if single else n, now))
        except Exception as e:
            return ids, e
        return ids, None

    def _act(self, submit: dict[str, int], cancel: dict[str, int], now: float) -> None:
        for name, n in submit.items():
            pool = self.pools[name]
            ids, error = self._launch(name, n, now)
            pool.submitted += len(ids)
            for i in ids:  # (those a failure came after are pilots too)
                pool.pilots[i] = PilotRow(name, i, PilotState.QUEUED, now)
                self._new.append(pool.pilots[i])
            if ids:
                log.info("pool %s: submitted %d pilots", name, len(ids))
            if error is not None:  # one pool's trouble is never the others'
                if not isinstance(error, PoolError):
                    log.error("pool %s: unexpected error while submitting", name, exc_info=error)
                pool.failures += 1
                delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (pool.failures - 1))
                pool.backoff_until = now + delay
                pool.error, pool.pilot_error = f"{error} (next try in {delay:.0f} s)", False
                log.error("pool %s: %s", name, pool.error)
                continue
            pool.failures = 0
            if not pool.pilot_error:  # a pilot that fails again keeps saying why, submitted or not
                pool.error = ""
        for name, n in cancel.items():
            pool = self.pools[name]
            waiting, stale = pool.queued(now)
            queued = pilots_to_cancel([r.native_id for r in waiting], n, stale)
            if pool.adapter is not None and queued:
                try:
                    pool.adapter.cancel(queued)
                    log.info("pool %s: cancelled %d queued pilots (demand dropped%s)", name, len(queued),
                             f"; {min(stale, n)} queued past queue_patience" if stale else "")
                except Exception as e:  # one pool's trouble is never the others'
                    pool.error, pool.pilot_error = f"cancel failed: {e}", False
        self._save()

    def _pool_hosts(self) -> dict[str, tuple[int, int]]:
        """Hosts and jobs done, per pool."""
        hosts: dict[str, tuple[int, int]] = {}
        for h in self.service.dispatcher.view.known_hosts():
            n, done = hosts.get(h.info.pool, (0, 0))
            hosts[h.info.pool] = (n + 1, done + h.stats.done)
        return hosts

    def info(self, now: float) -> list[PoolInfo]:
        """What `gridbot pools` shows; throughput is over the loop's last samples (about six minutes)."""
        hosts = self._pool_hosts()
        seen = self.service.dispatcher.view.pools(now)
        out = []
        for name, p in self.pools.items():
            n, done = hosts.get(name, (0, 0))
            t0, d0 = p.done_samples[0] if p.done_samples else (now, done)
            rate = (done - d0) / (now - t0) if now > t0 else 0.0
            states = [r.state for r in p.pilots.values()]
            stale = p.queued(now)[1]
            out.append(PoolInfo(name, p.spec.kind, sum(s is PilotState.QUEUED for s in states),
                                sum(s is PilotState.RUNNING for s in states), p.ended,
                                sum(s is PilotState.FAILED for s in states), p.submitted, n, done, rate,
                                p.error, p.spec.max_running, p.spec.max_queued, p.reading,
                                seen[name].bandwidth if name in seen else 0.0, stale))
        return out

    def close(self) -> None:
        """The server is stopping: its pilots go on, for a restarted server to take up, unless `cancel_on_exit`
        (then every pilot still queued or running is cancelled: the queued ones end as cancelled, the running
        ones as completed, asked to stop)."""
        now = time.time()
        for p in self.pools.values():
            live = [r for r in p.pilots.values() if r.state not in PILOT_TERMINAL]
            if p.adapter is None:
                continue
            try:
                if self.cancel_on_exit and live:
                    p.adapter.cancel([r.native_id for r in live])
                    for r in live:
                        self._move(p, r, PilotState.CANCELLED if r.state is PilotState.QUEUED else
                                   PilotState.COMPLETED, now)
                    log.info("pool %s: cancelled %d pilots (the server stops)", p.spec.name, len(live))
                p.adapter.close()
            except PoolError as e:
                log.error("pool %s: %s", p.spec.name, e)
        self._save()

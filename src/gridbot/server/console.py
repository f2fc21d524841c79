"""The web console: its static files at /ui, and the read-only aggregates its pages need under /v1/console/.

The page shell (HTML, CSS, JS in `gridbot/web/`) holds no data and is served without a key: a browser
cannot send a bearer header when it navigates, so the shell asks for the key once, keeps it in the tab's
sessionStorage, and calls the JSON API with `Authorization: Bearer` like any client. Only the routes in
`PUBLIC` are served without a key, and they return files of the package, never anything of the store.

The aggregates are paged and grouped on the server (a 1,000,000-job bag, 10,000 hosts): what a page shows
comes back, never the rows. Expensive ones are cached and refreshed on the console's own thread, with a
time to live proportional to what they cost, so a page polling every two seconds costs the dispatcher
next to nothing; a submitter sees only its own bags (`owner`, the API's rule).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.resources
import logging
import mimetypes
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from gridbot.core.changes import HostSnapshot
from gridbot.model.states import PILOT_TERMINAL, BagState
from gridbot.protocol import BagInfo, PoolInfo
from gridbot.server.aggregates import RUNTIME_EDGES, Aggregates, Completions, aggregates_of, empty
from gridbot.server.service import BadRequest, Service, query_whole_number
from gridbot.store.base import BagRow

log = logging.getLogger("gridbot.server")
PUBLIC: frozenset[tuple[str, str]] = frozenset({("GET", "/ui"), ("GET", "/ui/static/{name}")})
"""Routes served without a key: the console's shell, files shipped in the package that carry no data (the
page fetches everything else with the user's key). Each answers only names from `_assets`, an allow-list
read from the package at start, so no path reaches the file system."""
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
"""The shell runs only its own scripts and talks only to this server; no other site may frame it."""
BUCKETS = 120
"""Time buckets of a plot over time: a point every 1/120 of the run, whatever its length."""
MAX_HOST_PAGE = 500
HOST_SORTS = ("host_id", "name", "pool", "ncpus", "done", "failed", "error_rate", "black_hole", "jobs_today",
              "turnaround", "last_seen")
POOL_WINDOW = 3600.0
"""Seconds of history the pools page plots at most."""
ANSWER_WITHIN = 0.15
"""Seconds a page's request waits for an aggregate never computed before; past it, the page is answered with
`pending` and the counts land in the cache for its next poll (the first look at a million-job bag)."""
RATE_WINDOW = 300.0
"""Seconds over which a bag's completion rate (its ETA) is measured."""


class BagSummary(msgspec.Struct, frozen=True):
    """A bag as the bags page lists it: the API's BagInfo and what the console adds."""

    info: BagInfo
    rate: float
    """Jobs finished per second, over the last few minutes (or since the start)."""
    eta: float | None
    """Seconds until the bag's last job ends at that rate (None: not running, or no rate yet)."""
    waste: float
    """Instances whose result was not wanted, as a fraction of all instances sent."""


class BagSeries(msgspec.Struct, frozen=True):
    """A bag's plots: incomplete jobs, completions and CPU per pool over time, and its run-time distribution."""

    bag: BagSummary
    now: float
    times: list[float]
    """The end of each bucket; `incomplete[k]` is the count then (the first point, at the start, is total)."""
    incomplete: list[int]
    done: dict[str, list[int]]
    cpu: dict[str, list[float]]
    width: float
    runtime_edges: list[float]
    runtime: list[int]
    pending: bool = False
    """The counts are still being computed (the first look at a large bag): the next poll has them."""


class HostRow(msgspec.Struct, frozen=True):
    """A host as the hosts page shows it."""

    host_id: str
    name: str
    pool: str
    ncpus: int
    done: int
    failed: int
    error_rate: float
    black_hole: bool
    jobs_today: int
    turnaround: float | None
    """Mean seconds from sending an instance to the host to its result."""
    last_seen: float
    alive: bool


class HostPage(msgspec.Struct, frozen=True):
    """One page of the hosts, sorted and filtered on the server, with totals over every host that matched."""

    total: int
    matched: int
    page: int
    size: int
    rows: list[HostRow]
    black_holes: int
    alive: int


class PoolSeries(msgspec.Struct, frozen=True):
    """The pools page: each pool's state, pilots over time and effective throughput over time."""

    now: float
    pools: list[PoolInfo]
    errors: dict[str, str]
    hosts: dict[str, int]
    """Hosts heard from within the host timeout, per pool."""
    times: list[float]
    pilots: dict[str, dict[str, list[int]]]
    """Per pool, per state (queued, running, ended): pilots at the end of each bucket."""
    throughput: dict[str, list[float]]
    """Per pool: CPU-seconds of results returned per second, in each bucket (GridBot's effective throughput)."""
    results: dict[str, list[int]]
    pending: bool = False
    """The series are still being computed: the next poll has them."""


@dataclass
class _Cached:
    value: Any
    at: float
    cost: float


Owner = Callable[[web.Request], str | None]
Reply = Callable[[web.Request, Any], web.Response]


class Console:
    """The console's routes over one Service (and the server's overlay, for the pools)."""

    def __init__(self, service: Service, pools: Callable[[float], list[PoolInfo]], owner: Owner,
                 reply: Reply) -> None:
        """The console of `service`: `pools` lists the overlay's pools; `owner` and `reply` are the API's own rules."""
        self.service = service
        self.pool_info = pools
        self.owner = owner
        self.reply = reply
        self.aggregates: Aggregates | None = aggregates_of(service.store)
        self._assets = _assets()
        self._cache: dict[tuple[Any, ...], _Cached] = {}
        self._running: dict[tuple[Any, ...], asyncio.Future[Any]] = {}
        self._samples: dict[int, deque[tuple[float, int]]] = {}
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._hosts: tuple[list[HostSnapshot], float, list[HostRow]] | None = None
        self.started = time.time()
        """When the server started: the pools page plots from then on (at most POOL_WINDOW back)."""

    def routes(self) -> list[web.RouteDef]:
        """The console's routes, for `app.add_routes` (each is in app.PERMISSIONS, the shell in PUBLIC)."""
        return [
            web.get("/ui", self.index),
            web.get("/ui/static/{name}", self.static),
            web.get("/v1/console/bags", self.bags),
            web.get("/v1/console/bags/{bag}", self.bag),
            web.get("/v1/console/hosts", self.hosts),
            web.get("/v1/console/pools", self.pools),
        ]

    async def close(self, app: web.Application) -> None:
        """Stop the console's thread and its database connection (on the server's cleanup)."""
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
        if self.aggregates is not None:
            self.aggregates.close()

    # -- the shell ------------------------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.Response:
        """The console's page: the same shell for every page (the JS routes by the URL's #fragment)."""
        return self._asset("index.html")

    async def static(self, request: web.Request) -> web.Response:
        """A file of the shell, by name, from the allow-list read at start; anything else is a 404."""
        return self._asset(request.match_info["name"])

    def _asset(self, name: str) -> web.Response:
        """A shipped file with the headers that keep the shell to its own scripts and this server."""
        found = self._assets.get(name)
        if found is None:
            raise web.HTTPNotFound()
        body, kind = found
        return web.Response(body=body, content_type=kind, charset="utf-8" if kind.startswith("text/") or
                            kind.endswith("javascript") else None, headers=SECURITY_HEADERS)

    # -- bags -----------------------------------------------------------------------------------------

    async def bags(self, request: web.Request) -> web.Response:
        """Every bag the caller may see with its completion rate, ETA and waste."""
        now = time.time()
        return self.reply(request, [self._summary(info, now) for info in self.service.bags(self.owner(request))])

    async def bag(self, request: web.Request) -> web.Response:
        """One bag with its plots; the counts are grouped on the server (cached while they are fresh)."""
        row = self.service.bag(request.match_info["bag"], self.owner(request))
        now = time.time()
        info = self.service.info(row)
        end = row.finished_at or now
        width = max(1.0, (end - row.created_at) / BUCKETS)
        buckets = max(1, min(BUCKETS, int((end - row.created_at) // width) + 1))
        # an ended bag's counts never change: computed once more after its end (a new key), then kept
        wait = request.query.get("wait") in ("1", "true")  # `gridbot report` waits for the counts
        done = await self._cached(("bag", row.bag_id, row.finished_at, row.revision),
                                  lambda: self._bag_completions(row, width, buckets), row.finished_at is not None,
                                  budget=None if wait else ANSWER_WITHIN)
        pending = done is None
        done = done or empty(row.created_at, width, 0)
        return self.reply(request, _series(self._summary(info, now), done, now, pending))

    def _bag_completions(self, row: BagRow, width: float, buckets: int) -> Completions:
        """The bag's completions from the store, grouped there (none for a store of an unknown kind)."""
        if self.aggregates is None:
            return empty(row.created_at, width, buckets)
        return self.aggregates.bag(row.bag_id, row.created_at, width, buckets)

    def _summary(self, info: BagInfo, now: float) -> BagSummary:
        """The bag's rate over the console's recent samples of it (else since it started) and its ETA."""
        c = info.counts
        finished = c.done + c.failed + c.cancelled
        samples = self._samples.setdefault(info.bag_id, deque(maxlen=600))
        if not samples or now - samples[-1][0] >= 1.0:
            samples.append((now, finished))
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW:
            samples.popleft()
        t0, f0 = samples[0]
        if now - t0 >= 10.0 and finished > f0:
            rate = (finished - f0) / (now - t0)
        else:
            rate = finished / max(1e-9, (info.finished_at or now) - info.created_at) if finished else 0.0
        left = info.total - finished
        eta = left / rate if info.state == BagState.ACTIVE.value and rate > 0 else None
        return BagSummary(info, rate, eta, c.wasted / c.instances if c.instances else 0.0)

    # -- hosts ----------------------------------------------------------------------------------------

    async def hosts(self, request: web.Request) -> web.Response:
        """A page of hosts: `q` searches id, name and pool; `sort` is a column (`desc=1` reverses); `page`, `size`."""
        q = request.query
        sort = q.get("sort", "host_id")
        if sort not in HOST_SORTS:
            raise BadRequest(f"hosts cannot be sorted by {sort[:40]!r}; use one of {', '.join(HOST_SORTS)}")
        size = min(_number(q, "size", 50), MAX_HOST_PAGE) or 50
        page = _number(q, "page", 0)
        stored = await self._cached(("hosts",), self.service.store.hosts, False)
        rows = self._host_rows(stored)
        needle = q.get("q", "").strip().lower()[:200]
        matched = [h for h in rows if needle in h.host_id.lower() or needle in h.name.lower()
                   or needle in h.pool.lower()] if needle else rows
        ordered = sorted(matched, key=lambda h: _sort_key(getattr(h, sort)), reverse=q.get("desc") in ("1", "true"))
        return self.reply(request, HostPage(len(rows), len(matched), page, size, ordered[page * size:(page + 1) * size],
                                            sum(h.black_hole for h in rows), sum(h.alive for h in rows)))

    def _host_rows(self, stored: list[HostSnapshot]) -> list[HostRow]:
        """Every known host as the hosts page shows it, with the dispatcher's live statistics where it has them
        (read here, on the server's thread; the store's rows come from the console's thread, cached). The rows
        made from one read are kept for a second: a page polled by many costs one pass."""
        now = time.time()
        if self._hosts is not None and self._hosts[0] is stored and now - self._hosts[1] < 1.0:
            return self._hosts[2]
        view = self.service.dispatcher.view
        timeout = self.service.config.dispatch.host_timeout
        out = []
        for h in stored:
            live = view.host(h.info.host_id)
            s = live.stats if live is not None else h.stats
            black = bool(live is not None and view.host_attrs(h.info.host_id, now).get("BlackHole"))
            today = s.jobs_today if s.day == int(now // 86400) else 0
            out.append(HostRow(h.info.host_id, h.info.name, h.info.pool, h.info.ncpus, s.done, s.failed, s.error_rate,
                               black, today, s.turnaround_sum / s.turnarounds if s.turnarounds else None, h.last_seen,
                               now - h.last_seen < timeout))
        self._hosts = (stored, now, out)
        return out

    # -- pools ----------------------------------------------------------------------------------------

    async def pools(self, request: web.Request) -> web.Response:
        """Pools with their pilots over time, effective throughput over time and adapter errors."""
        now = time.time()
        owner = self.owner(request)
        # since the server started, up to POOL_WINDOW, in buckets of a round width whose edges are fixed in
        # time, so that the cached counts stay valid until a bucket is added
        span = min(POOL_WINDOW, max(60.0, now - self.started))
        width = next((w for w in (1.0, 2.0, 5.0, 10.0, 15.0, 30.0) if w * BUCKETS >= span), 30.0)
        start = (now // width + 1) * width - width * BUCKETS
        start = max(start, (self.started // width) * width)
        buckets = max(1, min(BUCKETS, int(-(-(now - start) // width))))
        done = await self._cached(("pools", owner, start, width, buckets),
                                  lambda: self._pool_completions(start, width, buckets, owner), False,
                                  budget=ANSWER_WITHIN)
        pilots = await self._cached(("pilots", start, width, buckets),
                                    lambda: _pilot_series(self.service, start, width, buckets), False, ttl=2.0,
                                    budget=ANSWER_WITHIN)
        pending = done is None or pilots is None
        done, pilots = done or empty(start, width, buckets), pilots or {}
        hosts: dict[str, int] = {}
        for h in self.service.dispatcher.view.hosts():
            hosts[h.pool] = hosts.get(h.pool, 0) + 1
        infos = self.pool_info(now)
        errors = {**self.service.dispatcher.view.pool_errors(), **{p.name: p.error for p in infos if p.error}}
        times = [start + (k + 1) * width for k in range(buckets)]
        return self.reply(request, PoolSeries(now, infos, errors, hosts, times, pilots,
                                              {p: [c / width for c in v] for p, v in done.cpu.items()}, done.done,
                                              pending))

    def _pool_completions(self, start: float, width: float, buckets: int, owner: str | None) -> Completions:
        """Every pool's results per bucket, of the caller's bags only for a submitter."""
        if self.aggregates is None:
            return empty(start, width, buckets)
        return self.aggregates.pools(start, width, buckets, owner)

    # -- the cache ------------------------------------------------------------------------------------

    async def _cached(self, key: tuple[Any, ...], compute: Callable[[], Any], final: bool,
                      ttl: float | None = None, budget: float | None = None) -> Any:
        """`compute()`'s value, fresh or from the cache. A value older than its time to live (`ttl`, else 20
        times what it took, at least a second) is served once more while it is computed again; `final` values
        (a bag that ended) never change. A value never computed that takes longer than `budget` seconds is
        answered None (the page says "computing" and has it at its next poll)."""
        cached = self._cache.get(key)
        if cached is not None:
            age = time.monotonic() - cached.at
            if not final and age >= (ttl if ttl is not None else max(1.0, 20 * cached.cost)):
                self._refresh(key, compute)
            return cached.value
        task = self._refresh(key, compute)
        if budget is None:
            return await asyncio.shield(task)
        done, _ = await asyncio.wait({task}, timeout=budget)
        return task.result() if done else None

    def _refresh(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> asyncio.Future[Any]:
        """The computation of `key`, started unless it runs already (one at a time per key)."""
        running = self._running.get(key)
        if running is not None:
            return running
        task = asyncio.ensure_future(self._compute(key, compute))
        self._running[key] = task

        def finished(t: asyncio.Future[Any]) -> None:
            self._running.pop(key, None)
            if not t.cancelled() and t.exception() is not None:
                log.warning("the console could not compute %s: %s", key[0], t.exception())

        task.add_done_callback(finished)
        return task

    async def _compute(self, key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
        """Compute a value on the console's thread (where the store allows it: never the dispatcher's state)
        and keep it with what it cost."""
        started = time.monotonic()
        if self.aggregates is not None and self.aggregates.threaded:
            if self._thread is None:
                self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gridbot-console")
            value = await asyncio.get_running_loop().run_in_executor(self._thread, compute)
        else:
            value = compute()
        if len(self._cache) > 1000:
            for old in sorted(self._cache, key=lambda k: self._cache[k].at)[:500]:
                del self._cache[old]
        self._cache[key] = _Cached(value, time.monotonic(), time.monotonic() - started)
        return value


def _series(summary: BagSummary, done: Completions, now: float, pending: bool = False) -> BagSeries:
    """The incomplete-jobs curve from the completions: the total less what ended by each bucket's end."""
    info = summary.info
    finished = [sum(v[k] for v in done.done.values()) + done.failed[k] for k in range(done.buckets)]
    incomplete, left = [], info.total
    for n in finished:
        left -= n
        incomplete.append(max(left, 0))
    times = [done.start + (k + 1) * done.width for k in range(done.buckets)]
    return BagSeries(summary, now, [done.start, *times], [info.total, *incomplete], done.done, done.cpu, done.width,
                     list(RUNTIME_EDGES), done.runtime, pending)


def _pilot_series(service: Service, start: float, width: float, buckets: int) -> dict[str, dict[str, list[int]]]:
    """Pilots queued, running and ended per pool at the end of each bucket, from the store's pilot rows."""
    out: dict[str, dict[str, list[int]]] = {}
    ends = [start + (k + 1) * width for k in range(buckets)]
    for p in service.store.pilots():
        series = out.setdefault(p.pool, {s: [0] * buckets for s in ("queued", "running", "ended")})
        ended = p.ended_at if p.ended_at is not None else (p.submitted_at if p.state in PILOT_TERMINAL else None)
        for k, t in enumerate(ends):
            if p.submitted_at > t:
                continue
            if ended is not None and ended <= t:
                series["ended"][k] += 1
            elif p.started_at is not None and p.started_at <= t:
                series["running"][k] += 1
            else:
                series["queued"][k] += 1
    return out


def _sort_key(value: Any) -> tuple[int, Any]:
    """Sort None (no turnaround yet) below every number."""
    return (0, 0) if value is None else (1, value)


def _number(query: Any, key: str, default: int) -> int:
    """A whole number from the query (`default` when absent); BadRequest names a bad one."""
    raw = query.get(key)
    return default if raw is None else query_whole_number(raw, key)


def _assets() -> dict[str, tuple[bytes, str]]:
    """The console's files shipped in `gridbot/web/`, by name, with their content types (read once)."""
    out: dict[str, tuple[bytes, str]] = {}
    for entry in importlib.resources.files("gridbot.web").iterdir():
        name = entry.name
        if entry.is_file() and not name.startswith((".", "_")) and name.endswith((".html", ".css", ".js", ".svg")):
            kind = "text/javascript" if name.endswith(".js") else mimetypes.guess_type(name)[0] or "text/plain"
            out[name] = (entry.read_bytes(), kind)
    return out

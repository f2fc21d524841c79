"""The execution client: pull instances from the server, run them, report, repeat.

One exchange is in flight at a time; reports that pile up while it is out go in the next one, so a
busy worker batches naturally. While the server is unreachable the worker keeps its reports and
retries with exponential backoff and full jitter, so a fleet does not hammer a server that is down.
It exits when it got no work for `idle_timeout` seconds, and on SIGTERM/SIGINT it kills its jobs,
gives them back (INTERRUPTED: no failure counted) and says goodbye.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import platform
import random
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec

from gridbot.model.records import Assignment, HostInfo, InstanceReport, Outcome
from gridbot.protocol import MSGPACK, ExchangeRequest, ExchangeResponse
from gridbot.worker import hostid
from gridbot.worker.executor import KillSwitch, group_cpu_seconds, run_instance

log = logging.getLogger("gridbot.worker")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ExchangeResponse)


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker runs; the defaults suit a worker started by hand on a host."""

    server: str
    slots: int = os.cpu_count() or 1
    prefetch: int = 0
    """Instances held beyond `slots`, so the next job starts without a round trip (bundling)."""
    slot_name: str = "worker"
    workdir: Path = Path("gridbot-work")
    idle_timeout: float = 300.0
    """Exit after this long with no work (0: never)."""
    pool: str = "local"
    keep_dirs: bool = False
    retry_base: float = 0.5
    retry_cap: float = 30.0
    give_up_after: float = 0.0
    """Exit when the server stayed unreachable this long (0: never)."""
    exit_with_parent: bool = False
    state_dir: Path | None = None
    lifetime: float = 0.0
    """Stop (giving back what is held) after this many seconds (0: never): a pilot's walltime margin."""
    min_cpu: float = 0.0
    """A job using less than this fraction of a CPU over `cpu_window` makes the worker leave (0: never)."""
    cpu_window: float = 600.0
    prefetch_seconds: float = 0.0
    """Hold enough instances beyond `slots` for this many seconds of work, from the wall time of the
    instances done so far (0: `prefetch` only). Short jobs then come in bundles of many, one round trip
    each, and long ones one at a time, so the tail is not held up by a host sitting on queued work."""
    executor: str = "shell"
    """"shell" runs each command; "noop" reports each instance done at once without running it, so a
    benchmark or a test measures the server, the protocol and the store alone (issue 6)."""


EXECUTORS = ("shell", "noop")
PREFETCH_MAX = 500
"""Most instances held beyond the slots, whatever `prefetch_seconds` asks for."""
REPORT_DELAY = 1.0
"""Seconds a result may wait for company while the worker still holds work (reports travel in bundles)."""


class ProtocolError(Exception):
    """The server refused a request for good (4xx): retrying the same request cannot help."""


class Worker:
    """One execution client with `slots` concurrent instances."""

    def __init__(self, config: WorkerConfig) -> None:
        if config.executor not in EXECUTORS:
            raise ValueError(f"unknown executor {config.executor!r}; use one of {', '.join(EXECUTORS)}")
        self.config = config
        self.identity = hostid.acquire(config.slot_name, config.state_dir)
        self.host = HostInfo(self.identity.host_id, self.identity.name, f"{platform.system()}-{platform.machine()}",
                             os.cpu_count() or 1, _memory_mb(), config.slots, config.pool)
        self.waiting: deque[Assignment] = deque()
        self.running: dict[int, asyncio.Task[InstanceReport]] = {}
        self.reports: list[InstanceReport] = []
        self.kill: dict[int, KillSwitch] = {}
        self.workdir = config.workdir.resolve()
        """Absolute: the executor changes the worker's directory around each spawn."""
        self.free_slots = list(range(config.slots - 1, -1, -1))
        """Job directories reused from one instance to the next (unless keep_dirs)."""
        self.slot_of: dict[int, int] = {}
        self.base_env = dict(os.environ)
        self.avg_wall = 0.0
        """Moving average of the wall seconds of the instances this worker ran (0: none yet)."""
        self.reports_since = 0.0
        self.exchanges = 0
        """Round trips made (each carries the reports and requests of that moment)."""
        self.dropped_answer = False
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.max_result_bytes = 16 << 20
        self.heartbeat = 30.0
        self.inputs: dict[tuple[int, str], asyncio.Future[Path]] = {}
        self.pids: dict[int, tuple[int, float, float]] = {}
        """Running instance -> (process group, time and CPU seconds at the start of the window)."""
        self.starved: dict[int, str] = {}
        self._parent = os.getppid()
        self._session: aiohttp.ClientSession | None = None

    @property
    def held(self) -> int:
        return len(self.waiting) + len(self.running)

    async def run(self) -> int:
        """Work until idle, stopped or given up; return the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        timeout = aiohttp.ClientTimeout(total=120, connect=10)
        self.workdir.mkdir(parents=True, exist_ok=True)
        log.info("worker %s (%s) with %d slots pulling from %s", self.host.name, self.host.host_id,
                 self.config.slots, self.config.server)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as self._session:
                code = await self._loop()
                await self._goodbye()
                return code
        finally:
            self.identity.release()

    def stop(self) -> None:
        """Begin a clean stop: running jobs are killed and given back."""
        self.stopping.set()
        self.wake.set()

    async def _loop(self) -> int:
        last_work = started = time.monotonic()
        next_talk = 0.0
        next_heartbeat = 0.0
        while not self.stopping.is_set():
            if self.config.exit_with_parent and os.getppid() != self._parent:
                log.warning("parent process is gone; stopping")
                self.stop()
                break
            now = time.monotonic()
            if self.config.lifetime and now - started > self.config.lifetime:
                log.info("lifetime of %.0f s reached; stopping", self.config.lifetime)
                self.stop()
                break
            if self.config.min_cpu and self._starving(now):
                self.stop()
                break
            prefetch = self.prefetch()
            want = max(0, self.config.slots + prefetch - self.held)
            if self.held or self.reports:
                last_work = now
            elif self.config.idle_timeout and now - last_work > self.config.idle_timeout:
                log.info("no work for %.0f s; exiting", self.config.idle_timeout)
                return 0
            # ask when a slot is idle or half the held work is gone; report then, or after REPORT_DELAY
            hungry = want > 0 and (len(self.running) < self.config.slots or 2 * want >= prefetch)
            report_at = math.inf
            if self.reports:  # held results go at once when nothing waits here to run (the tail)
                report_at = self.reports_since + REPORT_DELAY if self.waiting else now
            if not (now >= report_at or (hungry and now >= next_talk) or now >= next_heartbeat):
                self.wake.clear()
                delay = min(next_heartbeat, next_talk if hungry else next_heartbeat, report_at) - now
                if self.config.lifetime:
                    delay = min(delay, started + self.config.lifetime - now)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), max(0.01, delay))
                continue
            resp = await self._exchange(want)
            if resp is None:
                return 1
            next_heartbeat = time.monotonic() + self.heartbeat
            if resp.assignments:
                last_work = time.monotonic()
                next_talk = 0.0
            elif want:
                next_talk = time.monotonic() + resp.backoff * random.uniform(0.5, 1.5)
        return 0

    async def _exchange(self, want: int) -> ExchangeResponse | None:
        """Send reports and ask for `want` instances, retrying until the server answers."""
        failures = 0
        first_failure = 0.0
        while True:
            batch = self._batch()
            running = sorted([a.instance_id for a in self.waiting] + list(self.running))
            prefetch = self.prefetch()
            if prefetch != self.host.prefetch:
                self.host = msgspec.structs.replace(self.host, prefetch=prefetch)
            req = ExchangeRequest(self.host, 0 if self.stopping.is_set() else want, running, batch)
            try:
                if batch or not req.want:
                    resp = await self._post(req)
                else:
                    held = await self._post_unless_stopped(req)
                    if held is None:
                        return ExchangeResponse([], [], 0.0, self.heartbeat, self.max_result_bytes)
                    resp = held
            except ProtocolError as e:
                if len(batch) > 1 or not batch:
                    log.error("server refused the exchange: %s", e)
                    if not batch:
                        return None
                    self.reports[:0] = batch[1:]
                    batch = batch[:1]
                    continue
                log.error("server refused the report of instance %d: %s", batch[0].instance_id, e)
                r = batch[0]
                self.reports.insert(0, InstanceReport(r.instance_id, Outcome.FAILURE, r.exit_code, r.wall_s, r.cpu_s,
                                                      f"the server refused the result: {e}"[:500]))
                continue
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                self.reports[:0] = batch
                failures += 1
                first_failure = first_failure or time.monotonic()
                if self.config.give_up_after and time.monotonic() - first_failure > self.config.give_up_after:
                    log.error("server unreachable for %.0f s; giving up", self.config.give_up_after)
                    return None
                delay = random.uniform(self.config.retry_base,
                                       min(self.config.retry_cap, self.config.retry_base * 2 ** failures))
                log.warning("server unreachable (%s); retry %d in %.1f s", e.__class__.__name__, failures, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), delay)
                if self.stopping.is_set() and not self.held and not self.reports:
                    return ExchangeResponse([], [], 0.0, self.heartbeat, self.max_result_bytes)
                continue
            if batch:
                log.debug("acknowledged reports %s", [r.instance_id for r in batch])
            self._accept(resp)
            return resp

    async def _post_unless_stopped(self, req: ExchangeRequest) -> ExchangeResponse | None:
        """An idle host's request, which the server may hold until work comes: a stop does not wait for
        it (None). The goodbye then tells the server this host holds nothing, in case the answer it
        dropped carried work."""
        post = asyncio.ensure_future(self._post(req))
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({post, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if post.done():
            return post.result()
        post.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError, OSError):
            await post
        self.dropped_answer = True
        return None

    def _starving(self, now: float) -> bool:
        """GridBot's pilot suicide: a job that gets almost no CPU means this host is no place to run."""
        for iid, (pgid, t0, cpu0) in list(self.pids.items()):
            if now - t0 < self.config.cpu_window:
                continue
            used = (group_cpu_seconds(pgid) - cpu0) / (now - t0)
            if used < self.config.min_cpu:
                self.starved[iid] = (f"used {used:.1%} of a CPU over {now - t0:.0f} s, below the pool's min_cpu of "
                                     f"{self.config.min_cpu:.0%}: the host starves it, or the job waits on something")
                log.warning("instance %d: %s; leaving", iid, self.starved[iid])
                return True
        return False

    def prefetch(self) -> int:
        """Instances to hold beyond the slots now (see `WorkerConfig.prefetch_seconds`)."""
        cfg = self.config
        if not cfg.prefetch_seconds or not self.avg_wall:
            return cfg.prefetch
        return max(cfg.prefetch, min(PREFETCH_MAX, int(cfg.slots * cfg.prefetch_seconds / self.avg_wall)))

    def _batch(self) -> list[InstanceReport]:
        """Take pending reports up to one result-size limit's worth per request."""
        size, n = 0, 0
        for r in self.reports:
            size += r.result_bytes + 256
            if n and size > self.max_result_bytes:
                break
            n += 1
        batch, self.reports = self.reports[:n], self.reports[n:]
        return batch

    async def _post(self, req: ExchangeRequest) -> ExchangeResponse:
        assert self._session is not None
        self.exchanges += 1
        async with self._session.post(f"{self.config.server}/v1/exchange", data=_encoder.encode(req),
                                      headers={"Content-Type": MSGPACK, "Accept": MSGPACK}) as r:
            body = await r.read()
            if r.status >= 500:
                raise aiohttp.ClientResponseError(r.request_info, (), status=r.status, message=body[:200].decode())
            if r.status != 200:
                raise ProtocolError(f"HTTP {r.status}: {body[:500].decode(errors='replace')}")
            return _decoder.decode(body)

    def _accept(self, resp: ExchangeResponse) -> None:
        self.max_result_bytes = resp.max_result_bytes
        self.heartbeat = resp.heartbeat
        for iid in resp.cancel:
            if iid in self.kill:
                self.kill[iid].set()
            self.waiting = deque(a for a in self.waiting if a.instance_id != iid)
        self.waiting.extend(resp.assignments)
        self._start_ready()

    def _start_ready(self) -> None:
        if self.config.executor == "noop":
            if not self.stopping.is_set():
                if not self.reports:
                    self.reports_since = time.monotonic()
                self.reports.extend(InstanceReport(a.instance_id, Outcome.SUCCESS, 0) for a in self.waiting)
                self.waiting.clear()
                self.wake.set()
            return
        while self.waiting and len(self.running) < self.config.slots and not self.stopping.is_set():
            a = self.waiting.popleft()
            stop = self.kill[a.instance_id] = KillSwitch()
            iid = a.instance_id
            if self.config.keep_dirs:
                jobdir = self.workdir / f"{a.bag_name}" / f"{a.index}-{a.instance_id}"
            else:
                slot = self.slot_of[iid] = self.free_slots.pop()
                # per host id: workers started side by side (gridbot run) may share a workdir
                jobdir = self.workdir / ".slots" / self.host.host_id / str(slot)
            task = asyncio.ensure_future(run_instance(
                a, jobdir, self._fetch_input, self.max_result_bytes, stop, self.config.keep_dirs,
                started=functools.partial(self._started, iid),
                stop_reason=functools.partial(self._stop_reason, iid), base_env=self.base_env))
            self.running[a.instance_id] = task
            task.add_done_callback(functools.partial(self._finished, a.instance_id))

    def _stop_reason(self, iid: int) -> str:
        """Why the worker stops, when it is because of this instance (it then counts as the job's failure)."""
        return self.starved.get(iid, "")

    def _started(self, iid: int, pid: int) -> None:
        if self.config.min_cpu:
            self.pids[iid] = (pid, time.monotonic(), group_cpu_seconds(pid))

    def _finished(self, iid: int, task: asyncio.Task[InstanceReport]) -> None:
        self.running.pop(iid, None)
        self.pids.pop(iid, None)
        killed = self.kill.pop(iid)
        if iid in self.slot_of:
            self.free_slots.append(self.slot_of.pop(iid))
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("instance %d crashed the executor: %r", iid, exc)
            report = InstanceReport(iid, Outcome.FAILURE, reason=f"worker error: {exc!r}"[:500])
        else:
            report = task.result()
        if killed.is_set() and not self.stopping.is_set():
            return
        self.avg_wall = report.wall_s if not self.avg_wall else 0.9 * self.avg_wall + 0.1 * report.wall_s
        if not self.reports:
            self.reports_since = time.monotonic()
        self.reports.append(report)
        self.wake.set()
        self._start_ready()

    async def _fetch_input(self, bag_id: int, name: str) -> Path:
        """Download an input file once per bag and keep it in the worker's cache."""
        key = (bag_id, name)
        if key not in self.inputs:
            self.inputs[key] = asyncio.ensure_future(self._download(bag_id, name))
        return await asyncio.shield(self.inputs[key])

    async def _download(self, bag_id: int, name: str) -> Path:
        assert self._session is not None
        path = self.workdir / ".inputs" / str(bag_id) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        async with self._session.get(f"{self.config.server}/v1/bags/{bag_id}/inputs/{name}") as r:
            if r.status != 200:
                self.inputs.pop((bag_id, name), None)
                raise RuntimeError(f"server answered HTTP {r.status} for input '{name}'")
            tmp = path.with_suffix(".part")
            tmp.write_bytes(await r.read())
            tmp.replace(path)
        return path

    async def _goodbye(self) -> None:
        """Kill running jobs, give back everything held, and tell the server (best effort)."""
        for ev in self.kill.values():
            ev.set()
        if self.running:
            await asyncio.gather(*self.running.values(), return_exceptions=True)
        for a in self.waiting:
            self.reports.append(InstanceReport(a.instance_id, Outcome.INTERRUPTED, reason="the worker stopped"))
        self.waiting.clear()
        if not self.reports and not self.dropped_answer:
            return
        assert self._session is not None
        for _ in range(3):
            try:
                await self._post(ExchangeRequest(self.host, 0, [], self.reports))
                self.reports = []
                return
            except (aiohttp.ClientError, TimeoutError, OSError, ProtocolError) as e:
                log.warning("could not give back %d instances: %s", len(self.reports), e)
                await asyncio.sleep(0.5)


def _memory_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return 0


def run_worker(config: WorkerConfig) -> int:
    """Run a worker until it exits; return its exit code."""
    return asyncio.run(Worker(config).run())

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
import os
import platform
import random
import secrets
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import aiohttp
import msgspec

from gridbot.errors import GridbotError
from gridbot.model.pacing import PaceConfig, Pacing
from gridbot.model.records import Assignment, HostInfo, InstanceReport, Outcome
from gridbot.protocol import (
    MSGPACK,
    ErrorBody,
    ExchangeRequest,
    ExchangeResponse,
    RegisterRequest,
    Registration,
    lean,
)
from gridbot.security import tls
from gridbot.security.keys import write_private
from gridbot.worker import hostid
from gridbot.worker.executor import KillSwitch, run_blocking, run_instance, sessions_cpu_seconds
from gridbot.worker.inputs import InputCache
from gridbot.worker.isolation import job_environment, new_token, resolve_user
from gridbot.worker.reaper import Reaper
from gridbot.worker.spool import ReportSpool
from gridbot.worker.threads import AVAILABLE, LOOK, Held, SlotThreads

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
    retry_cap: float = 5.0
    """Longest wait between two tries while the server is unreachable (full jitter below it): a server
    that comes back hears from its whole fleet within seconds."""
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
    key: str = ""
    """The pool's worker key ("": a server started without keys). The worker registers with it once and
    keeps the host credential it gets (in `state_dir`), so a restart is the same host to the server."""
    fingerprint: str = ""
    """SHA-256 fingerprint of the server's TLS certificate: with https, no other certificate is accepted."""
    executor: str = "shell"
    """"shell" runs each command; "noop" reports each instance done at once without running it, so a
    benchmark or a test measures the server, the protocol and the store alone (issue 6)."""
    pass_env: tuple[str, ...] = ()
    """Variables of the worker's environment its jobs get beyond `isolation.ENV_ALLOWED` (`--pass-env`)."""
    run_as: str | None = None
    """The user a worker started as root runs its jobs as (`--run-as`); their directories become theirs."""
    allow_root: bool = False
    """Let a worker started as root run its jobs as root (`--allow-root`); refused otherwise."""
    drop: float = 0.0
    """Testing: this fraction of the instances, drawn at random, is held without running until its deadline
    and never reported, as a machine of an unreliable pool loses work silently (`--drop`, hidden)."""
    max_jobs: int = 0
    """Ask for no more once this many instances were received, and leave when they are done (0: no limit): a
    pilot that is one job's own batch job (`jobs_per_pilot` of a pool), as a site may want."""
    slot_threads: bool = True
    """Run single-slot instances without inputs in threads of the worker, one per slot (gridbot.worker.threads),
    rather than as tasks of its event loop: a short job costs the worker about half the CPU that way. False
    (`--no-slot-threads`, hidden) keeps every job on the loop, to compare the two."""
    leave_refused: bool = False
    """Also exit at once, holding nothing, when the server says its bags refuse this host (`--leave-when-refused`,
    which the overlay gives its pilots: `PaceConfig.leave_refused`)."""


EXECUTORS = ("shell", "noop")
REFUSED = "the server refused the result"
GOODBYE_TIMEOUT = 5.0
"""Seconds each of the last exchanges of a stopping worker may take: a server that does not answer then
gets the results from the disk at the host's next start."""


class ProtocolError(GridbotError):
    """The server refused a request for good (4xx): retrying the same request cannot help."""


class Unauthorized(ProtocolError):
    """The server did not accept the worker's key or host credential (401)."""


class Worker:
    """One execution client with `slots` concurrent instances."""

    def __init__(self, config: WorkerConfig) -> None:
        if config.executor not in EXECUTORS:
            raise ValueError(f"unknown executor {config.executor!r}; use one of {', '.join(EXECUTORS)}")
        self.run_as = resolve_user(config.run_as, config.allow_root) if config.executor == "shell" else None
        self.config = config
        self.state_dir = (config.state_dir or hostid.state_dir()).absolute()
        """Absolute: a spawn may change the process's directory (the loop's, or a slot thread's where the system
        refuses it a directory of its own) while another thread runs."""
        self.identity = hostid.acquire(config.slot_name, self.state_dir)
        self.host = HostInfo(self.identity.host_id, self.identity.name, f"{platform.system()}-{platform.machine()}",
                             os.cpu_count() or 1, _memory_mb(), config.slots, config.pool,
                             session=secrets.token_hex(8))
        self.waiting: deque[Assignment] = deque()
        self.waiting_cpus = 0
        """Slots the waiting instances will hold, kept as they come and go (a sum over hundreds prefetched
        at every pass of the loop was one of the worker's largest costs per short job)."""
        self.running: dict[int, asyncio.Task[InstanceReport]] = {}
        self.reports: list[InstanceReport] = []
        self.kill: dict[int, KillSwitch] = {}
        self.workdir = config.workdir.resolve()
        """Absolute: the executor changes the worker's directory around each spawn."""
        self.free_slots = list(range(config.slots - 1, -1, -1))
        self.received = 0
        """Instances the server sent this worker (`max_jobs`)."""
        self.fetched: tuple[int, float] = (0, 0.0)
        """Input bytes downloaded and the seconds it took, not yet told to the server."""
        self.threads = SlotThreads(config.slots, self._run_in_thread, self._collect)
        """The slots of both paths, and the threads that run single-slot instances (gridbot.worker.threads)."""
        self.use_threads = (config.slot_threads and AVAILABLE and config.executor == "shell" and self.run_as is None
                            and not config.drop)
        self.cpus_of: dict[int, int] = {}
        """Job directories reused from one instance to the next (unless keep_dirs)."""
        self.slot_of: dict[int, int] = {}
        self.slot_dirs: dict[tuple[str, int | str], Path] = {}
        self.token = new_token()
        self.base_env = job_environment(config.pass_env, self.token, self.run_as)
        self.reaper = Reaper(self.token)
        self.cache = InputCache(self.workdir / ".inputs")
        self.pacing = Pacing(PaceConfig(config.slots, config.prefetch, config.prefetch_seconds, config.idle_timeout,
                                        leave_refused=config.leave_refused))
        """When to talk to the server and what to ask for, as the simulator's hosts do (model/pacing.py)."""
        self.reports_since = 0.0
        self.exchanges = 0
        """Round trips made (each carries the reports and requests of that moment)."""
        self.dropped_answer = False
        self.wake = asyncio.Event()
        self.sleep_until = 0.0
        """When the loop, asleep, next looks at its work unwoken (0: it is awake)."""
        self.stopping = asyncio.Event()
        self.max_result_bytes = 16 << 20
        self.heartbeat = 30.0
        self.inputs: dict[tuple[int, str], asyncio.Future[Path]] = {}
        self.pids: dict[int, tuple[int, float, float]] = {}
        """Running instance -> (its session, time and CPU seconds at the start of the window)."""
        self.starved: dict[int, str] = {}
        self.cpu_due = 0.0
        """When `_starving` next looks (`min_cpu`)."""
        self._parent = os.getppid()
        self._session: aiohttp.ClientSession | None = None
        self.one_by_one = 0
        """Exchanges still to carry a single report, after the server refused a batch (a 4xx)."""
        self.outage = False
        """The last exchange failed: results are kept on disk as they end, until the server answers."""
        self.spool = ReportSpool(self.workdir / ".pending")
        """Replaced in `run` by the spool of this host's identity."""
        self.credential = ""
        """The host credential the server gave at registration ("" with a server started without keys)."""
        self.reauthorized = False

    async def run(self) -> int:
        """Work until idle, stopped or given up; return the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        timeout = aiohttp.ClientTimeout(total=120, connect=10)
        self.workdir.mkdir(parents=True, exist_ok=True)
        ssl: aiohttp.Fingerprint | bool = True
        if self.config.fingerprint and self.config.server.startswith("https:"):
            ssl = aiohttp.Fingerprint(tls.digest(self.config.fingerprint))
        try:
            async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(ssl=ssl)) as self._session:
                if self.config.key and not await self._sign_in(fresh=False):
                    return 1
                self.spool = ReportSpool(self._spool_dir())
                self.reports[:0] = self.spool.load()
                self.reports_since = time.monotonic()
                log.info("worker %s (%s) with %d slots pulling from %s", self.host.name, self.host.host_id,
                         self.config.slots, self.config.server)
                code = await self._loop()
                await self._goodbye()
                return code
        finally:
            self.threads.close()
            self.identity.release()

    def _spool_dir(self) -> Path:
        """Where this host keeps results the server has not acknowledged (beside its credential)."""
        if self.config.key:
            return self._credential_file().with_suffix(".pending")
        return self.state_dir / "pending" / self.host.host_id

    def _credential_file(self) -> Path:
        parts = self.config.key.split(".")  # (a worker key, or a pilot's enrollment token: security/keys.py)
        key_id = parts[1] if len(parts) in (3, 6) else "key"
        return self.state_dir / "credentials" / key_id / f"{self.identity.slot}.json"

    async def _sign_in(self, fresh: bool) -> bool:
        """Use the host credential kept from an earlier run with this key, or register for one; False when
        the server refuses the key (revoked, or from another server) or stays unreachable."""
        path = self._credential_file()
        reg: Registration | None = None
        if not fresh:
            with contextlib.suppress(OSError, msgspec.DecodeError, msgspec.ValidationError):
                reg = msgspec.json.decode(path.read_bytes(), type=Registration)
        if reg is None:
            reg = await self._register()
            if reg is None:
                return False
            write_private(path, msgspec.json.encode(reg))
        self.credential = reg.credential
        self.host = msgspec.structs.replace(self.host, host_id=reg.host_id, pool=reg.pool)
        return True

    async def _register(self) -> Registration | None:
        assert self._session is not None
        body = msgspec.msgpack.encode(lean(RegisterRequest(self.host.name)))
        first_failure = 0.0
        for attempt in range(1, 1_000_000):
            try:
                async with self._session.post(f"{self.config.server}/v1/register", data=body, headers={
                        "Content-Type": MSGPACK, "Accept": MSGPACK,
                        "Authorization": f"Bearer {self.config.key}"}) as r:
                    data = await r.read()
                    if r.status == 200:
                        return msgspec.msgpack.decode(data, type=Registration)
                    if r.status < 500 and r.status != 429:
                        log.error("the server refused this worker's key (HTTP %d: %s); is it revoked, or from "
                                  "another server's access file?", r.status, _message(data))
                        return None
            except aiohttp.ServerFingerprintMismatch as e:
                log.error("%s; refusing to talk to it", _pin_message(self.config.server, e))
                return None
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                log.warning("cannot register with %s (%s); retrying", self.config.server, e.__class__.__name__)
                first_failure = first_failure or time.monotonic()
                if self.config.give_up_after and time.monotonic() - first_failure > self.config.give_up_after:
                    log.error("server unreachable for %.0f s; giving up", self.config.give_up_after)
                    return None
            if self.stopping.is_set():
                return None
            cap = min(self.config.retry_cap, self.config.retry_base * 2 ** min(attempt, 30))
            delay = random.uniform(self.config.retry_base, cap)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
        return None

    @property
    def busy(self) -> int:
        """Slots the running instances hold (each its bag's `cpus`, at most `slots`), both paths."""
        return self.threads.busy

    def _waiting_cpus(self) -> int:
        """Slots the instances held but not started will need, both paths."""
        return self.waiting_cpus + self.threads.waiting()

    def stop(self) -> None:
        """Begin a clean stop: running jobs are killed and given back."""
        self.stopping.set()
        self.threads.halt()
        self.wake.set()

    async def _loop(self) -> int:
        started = time.monotonic()
        self.pacing.begin(started)
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
            if self.threads.done:
                self._collect()
            if self.config.min_cpu and self._starving(now):
                self.stop()
                break
            step = self.pacing.step(now, self.busy, self._waiting_cpus(),
                                    self.reports_since if self.reports else None)
            if self.config.max_jobs and self.received >= self.config.max_jobs:
                if not self.running and not self.waiting and not self.reports and not self.threads.holds():
                    log.info("ran the %d job(s) it was for; exiting", self.received)
                    return 0
                # no more work: talk to report results and at heartbeats only
                step = step._replace(want=0, at=step.at if self.reports else max(step.at, self.pacing.next_heartbeat))
            if step.leave:
                if self.pacing.refused and self.config.leave_refused:
                    log.info("the server's bags with work waiting all refuse this host (their GridPolicy, "
                             "JobRequirements or Concurrency); exiting, so that a pilot elsewhere can take the work")
                else:
                    log.info("no work for %.0f s; exiting", self.config.idle_timeout)
                return 0
            if step.at > now:
                self.wake.clear()
                delay = step.at - now
                if self.config.lifetime:
                    delay = min(delay, started + self.config.lifetime - now)
                if self.threads.holds():
                    delay = min(delay, LOOK)  # the threads' reports wait for company, not for a long job's end
                    self._low_water()
                self.sleep_until = now + max(0.01, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), max(0.01, delay))
                self.sleep_until = 0.0
                continue
            resp = await self._exchange(step.want)
            if resp is None:
                return 1
            self.pacing.answered(time.monotonic(), step.want, len(resp.assignments), resp.backoff, resp.heartbeat,
                                 random.uniform, resp.refused)
        return 0

    async def _exchange(self, want: int) -> ExchangeResponse | None:
        """Send reports and ask for `want` instances, retrying until the server answers."""
        failures = 0
        first_failure = 0.0
        while True:
            if self.threads.done:
                self._collect()
            batch = self._batch()
            running = sorted([a.instance_id for a in self.waiting] + list(self.running) + self.threads.held_ids())
            prefetch = self.pacing.prefetch()
            if prefetch != self.host.prefetch:
                self.host = msgspec.structs.replace(self.host, prefetch=prefetch)
            fetched = self.fetched
            req = ExchangeRequest(self.host, 0 if self.stopping.is_set() else want, running, batch, fetched)
            try:
                if not req.want:
                    resp = await self._post(req)
                else:
                    held = await self._post_unless_stopped(req)
                    if held is None:  # stopped first: whether the server got the reports is unknown
                        self.reports[:0] = batch
                        self.spool.keep(self.reports)
                        return ExchangeResponse([], [], 0.0, self.heartbeat, self.max_result_bytes)
                    resp = held
            except aiohttp.ServerFingerprintMismatch as e:
                self.reports[:0] = batch
                log.error("%s; refusing to talk to it", _pin_message(self.config.server, e))
                return None
            except Unauthorized as e:
                self.reports[:0] = batch
                if self.reauthorized or not self.config.key:
                    log.error("the server refused this host's credential: %s; stopping", e)
                    return None
                log.warning("the server refused this host's credential (%s); registering again", e)
                self.reauthorized = True
                if not await self._sign_in(fresh=True):
                    return None
                continue
            except ProtocolError as e:
                if not batch:
                    log.error("server refused the exchange: %s", e)
                    return None
                self.reports[:0] = batch
                if len(batch) > 1:  # find the report it refuses: send them one at a time
                    log.warning("server refused an exchange of %d reports (%s); sending them one by one",
                                len(batch), e)
                    self.one_by_one = len(batch)
                    continue
                r = self.reports.pop(0)
                if r.reason.startswith(REFUSED):
                    log.error("server refused instance %d's failure report too (%s); dropping it", r.instance_id, e)
                    continue
                log.error("server refused the report of instance %d: %s", r.instance_id, e)
                self.reports.insert(0, InstanceReport(r.instance_id, Outcome.FAILURE, r.exit_code, r.wall_s, r.cpu_s,
                                                      f"{REFUSED}: {e}"[:500]))
                await asyncio.sleep(random.uniform(0.5, 1.5))
                continue
            except (aiohttp.ClientError, TimeoutError, OSError, msgspec.DecodeError, msgspec.ValidationError) as e:
                # the server is down, overloaded (5xx), unreachable or answered garbage: keep the results
                # on disk, wait with jitter and try again; never exit over it
                self.reports[:0] = batch
                self.outage = True
                self.spool.keep(self.reports)
                if self.stopping.is_set():
                    log.warning("stopping while the server is unreachable: %d results kept for the next run of "
                                "this host", len(self.reports))
                    self.reports = []
                    return ExchangeResponse([], [], 0.0, self.heartbeat, self.max_result_bytes)
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
                continue
            self.outage = False
            self.fetched = (self.fetched[0] - fetched[0], self.fetched[1] - fetched[1])
            if batch:
                log.debug("acknowledged reports %s", [r.instance_id for r in batch])
                if self.spool.kept:
                    self.spool.acknowledged(r.instance_id for r in batch)
            self._accept(resp)
            return resp

    async def _post_unless_stopped(self, req: ExchangeRequest) -> ExchangeResponse | None:
        """A request the server may hold until work comes (an idle host's), or that cannot get through (a
        cut network): a stop does not wait for it (None). The goodbye then tells the server this host
        holds nothing, in case the answer it dropped carried work."""
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
        """GridBot's pilot suicide: a job that gets almost no CPU means this host is no place to run. Looked
        at every tenth of `cpu_window` (1 to 30 s), in one pass over /proc for every job: the loop wakes twice
        a second while slot threads run, and a pass per job at each wake was a core's tenth on a big host."""
        if now < self.cpu_due:
            return False
        self.cpu_due = now + min(30.0, max(1.0, self.config.cpu_window / 10))
        old = [(iid, sid, t0, cpu0) for iid, (sid, t0, cpu0) in list(self.pids.items())
               if now - t0 >= self.config.cpu_window]
        if not old:
            return False
        seconds = sessions_cpu_seconds({sid for _, sid, _, _ in old})
        for iid, sid, t0, cpu0 in old:
            if sid not in seconds or self.pids.get(iid) != (sid, t0, cpu0):
                continue  # it ended during the pass (a session with no process left is a job reaped)
            used = (seconds[sid] - cpu0) / (now - t0)
            if used < self.config.min_cpu:
                self.starved[iid] = (f"used {used:.1%} of a CPU over {now - t0:.0f} s, below the pool's min_cpu of "
                                     f"{self.config.min_cpu:.0%}: the host starves it, or the job waits on something")
                log.warning("instance %d: %s; leaving", iid, self.starved[iid])
                return True
        return False

    def _batch(self) -> list[InstanceReport]:
        """Take pending reports up to one result-size limit's worth per request (one at a time while the
        server is refusing one of them)."""
        if self.one_by_one > 0:
            self.one_by_one -= 1
            batch, self.reports = self.reports[:1], self.reports[1:]
            return batch
        size, n = 0, 0
        for r in self.reports:
            size += r.result_bytes + 256
            if n and size > self.max_result_bytes:
                break
            n += 1
        batch, self.reports = self.reports[:n], self.reports[n:]
        return batch

    async def _post(self, req: ExchangeRequest, timeout: float | None = None) -> ExchangeResponse:
        assert self._session is not None
        self.exchanges += 1
        limit = aiohttp.ClientTimeout(total=timeout) if timeout is not None else None
        async with self._session.post(f"{self.config.server}/v1/exchange", data=_encoder.encode(req),
                                      headers=self._headers(), timeout=limit) as r:
            body = await r.read()
            if r.status >= 500:
                raise aiohttp.ClientResponseError(r.request_info, (), status=r.status, message=_message(body))
            if r.status == 401:
                raise Unauthorized(f"HTTP 401: {_message(body)}")
            if r.status != 200:
                raise ProtocolError(f"HTTP {r.status}: {_message(body)}")
            return _decoder.decode(body)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
        if self.credential:
            headers["Authorization"] = f"Bearer {self.credential}"
        return headers

    def _accept(self, resp: ExchangeResponse) -> None:
        self.max_result_bytes = resp.max_result_bytes
        self.heartbeat = resp.heartbeat
        for iid in resp.cancel:
            if iid in self.kill:
                self.kill[iid].set()
            self.threads.cancel(iid)
            self.waiting = deque(a for a in self.waiting if a.instance_id != iid)
        if resp.cancel:
            self.waiting_cpus = sum(a.cpus for a in self.waiting)
        self.waiting.extend(resp.assignments)
        self.waiting_cpus += sum(a.cpus for a in resp.assignments)
        self.received += len(resp.assignments)
        self._start_ready()
        self._low_water()

    def _start_ready(self) -> None:
        if self.config.executor == "noop":
            if not self.stopping.is_set():
                if not self.reports:
                    self.reports_since = time.monotonic()
                self.reports.extend(InstanceReport(a.instance_id, Outcome.SUCCESS, 0,
                                                   outputs=dict.fromkeys(a.outputs, b"")) for a in self.waiting)
                self.waiting.clear()
                self.waiting_cpus = 0
                self.wake.set()
            return
        if self.use_threads and self.threads.broken:
            self.use_threads = False
            back = self.threads.take_back()
            self.waiting.extendleft(reversed(back))
            self.waiting_cpus += len(back)
        while self.waiting and not self.stopping.is_set():
            if self.use_threads and not self.threads.broken and self._threadable(self.waiting[0]):
                ready: list[Assignment] = []
                while self.waiting and self._threadable(self.waiting[0]):
                    ready.append(self.waiting.popleft())
                self.waiting_cpus -= len(ready)
                self.threads.submit(ready)
                continue
            need = min(self.waiting[0].cpus, self.config.slots)
            if not self.threads.take(need):
                break
            a = self.waiting.popleft()
            self.waiting_cpus -= a.cpus
            self.cpus_of[a.instance_id] = need
            stop = self.kill[a.instance_id] = KillSwitch()
            iid = a.instance_id
            if self.config.drop and random.random() < self.config.drop:
                lost = self.running[iid] = asyncio.ensure_future(_vanish(a, stop))
                lost.add_done_callback(functools.partial(self._vanished, iid))
                continue
            if self.config.keep_dirs:
                jobdir = self._kept_dir(a)
            else:
                slot = self.slot_of[iid] = self.free_slots.pop()
                jobdir = self._slot_dir(slot)
            task = asyncio.ensure_future(run_instance(
                a, jobdir, functools.partial(self._fetch_input, revision=a.revision), self.max_result_bytes, stop,
                self.config.keep_dirs,
                started=functools.partial(self._job_started, a),
                stop_reason=functools.partial(self._stop_reason, iid), base_env=self.base_env, user=self.run_as))
            self.running[a.instance_id] = task
            task.add_done_callback(functools.partial(self._finished, a.instance_id))

    @staticmethod
    def _threadable(a: Assignment) -> bool:
        """Whether a slot thread may run `a`: one slot, no inputs to fetch (the loop downloads them) and no
        memory limit (the reaper's memory watch is armed on the loop). `--run-as` and `--drop` keep every
        instance on the loop (`use_threads`)."""
        return a.cpus == 1 and not a.inputs and (a.limits is None or a.limits.memory is None)

    def _run_in_thread(self, held: Held, index: int, wake: int) -> InstanceReport:
        """Run a held instance on slot thread `index` (gridbot.worker.threads), in that thread's own slot
        directory (the loop's slots number theirs 0, 1, ...; these are t0, t1, ...)."""
        a, iid = held.a, held.a.instance_id
        jobdir = self._kept_dir(a) if self.config.keep_dirs else self._slot_dir(f"t{index}")
        if a.timeout is not None:  # the thread sleeps in `poll` on its eventfd (without one, `_Waiting` stops it)
            held.stop.on_set(functools.partial(self.threads.poke, index))
        try:
            return run_blocking(a, jobdir, self.max_result_bytes, held.stop, wake,
                                functools.partial(self._thread_job_started, held),
                                functools.partial(self._stop_reason, iid), self.base_env, self.config.keep_dirs,
                                functools.partial(self._thread_job_reaped, iid))
        finally:
            if iid in self.reaper.jobs:  # an error of ours came before the reaping
                self._thread_job_reaped(iid)

    def _thread_job_reaped(self, iid: int) -> bool:
        """A slot thread's job was reaped: kill what it left behind before its outputs are read and its slot is
        emptied (a process left running could still write to its files, or make new ones); True if some was, or
        if it cannot tell: a worker that is not its jobs' subreaper (run inside another program) sweeps nothing,
        and a process that left the job's session may still write to its files (the next spawn truncates them)."""
        self.pids.pop(iid, None)
        if not self.reaper.ended(iid):
            return not self.reaper.adopted
        if self.threads.loop is not None:
            with contextlib.suppress(RuntimeError):
                self.threads.loop.call_soon_threadsafe(self.reaper.follow_up)
        return True

    def _thread_job_started(self, held: Held, pid: int) -> None:
        """A slot thread's job started (under SPAWN_LOCK): the reaper watches it, and `min_cpu` its CPU (the
        entry goes as soon as the job is reaped, so a job that ended is never judged starved)."""
        self.reaper.started(held.a.instance_id, pid, None, held.stop.set)
        self._started(held.a.instance_id, pid)

    def _collect(self) -> None:
        """Take in the reports of the jobs the slot threads ended (event loop's thread), as `_finished` does
        for one of the loop's."""
        done = self.threads.collect()
        if not done:
            if self.threads.broken and self.use_threads:
                self._start_ready()
            return
        for held, _ in done:
            self.pids.pop(held.a.instance_id, None)
        self._took([report for held, report in done if not self._taken_back(held.stop)])

    def _taken_back(self, stop: KillSwitch) -> bool:
        """Whether an ended instance was taken back by the server (a cancel): no report is sent for it."""
        return stop.is_set() and not stop.reason and not self.stopping.is_set()

    def _took(self, reports: list[InstanceReport]) -> None:
        """Hold the reports of ended instances for the next exchange (on disk too while the server is away),
        then fill the slots they freed."""
        if reports:
            for r in reports:
                self.pacing.ran(r.wall_s)
            if not self.reports:
                self.reports_since = time.monotonic()
            self.reports.extend(reports)
            if self.outage:
                self.spool.keep(reports)
        self._start_ready()
        self._nudge()

    def _kept_dir(self, a: Assignment) -> Path:
        """The directory of its own an instance runs in with `--keep-dirs`, kept after it ends."""
        return self.workdir / a.bag_name / f"{a.index}-{a.instance_id}"

    def _slot_dir(self, slot: int | str) -> Path:
        """A slot's reused job directory, per host id: workers started side by side (gridbot run) may share
        a workdir. Kept, not joined again for each job (three path joins, about a twentieth of the worker's own
        CPU per short job in a profile)."""
        key = (self.host.host_id, slot)
        path = self.slot_dirs.get(key)
        if path is None:
            path = self.slot_dirs[key] = self.workdir / ".slots" / self.host.host_id / str(slot)
        return path

    def _vanished(self, iid: int, _: asyncio.Task[InstanceReport]) -> None:
        """A dropped instance (`drop`) is let go without a report."""
        self.running.pop(iid, None)
        self.threads.give(self.cpus_of.pop(iid, 0))
        self.kill.pop(iid, None)
        self.wake.set()
        self._start_ready()

    def _stop_reason(self, iid: int) -> str:
        """Why the worker stops, when it is because of this instance (it then counts as the job's failure)."""
        return self.starved.get(iid, "")

    def _started(self, iid: int, pid: int) -> None:
        """Watch the CPU a job's session uses (`min_cpu`), from its spawn: it has used none yet (one item set,
        atomic in CPython; `_starving` copies the items on the loop's thread)."""
        if self.config.min_cpu:
            self.pids[iid] = (pid, time.monotonic(), 0.0)

    def _job_started(self, a: Assignment, pid: int) -> None:
        """The first process of `a` runs: watch it, and everything it starts, until it ends."""
        self._started(a.instance_id, pid)
        memory = a.limits.memory if a.limits is not None else None
        self.reaper.started(a.instance_id, pid, memory, self.kill[a.instance_id].set)

    def _finished(self, iid: int, task: asyncio.Task[InstanceReport]) -> None:
        self.running.pop(iid, None)
        self.threads.give(self.cpus_of.pop(iid, 0))
        if self.reaper.ended(iid):
            self.reaper.follow_up()
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
        # taken back by the server: no report, but its slot takes the next job now
        self._took([] if self._taken_back(killed) else [report])

    def _low_water(self) -> None:
        """Tell the slot threads how few queued instances make the pacing ask for more (half the prefetch
        gone, with every slot busy: `Pacing.step`), so that they wake the loop then and not later."""
        prefetch = self.pacing.prefetch()
        self.threads.low_water = prefetch // 2 - self.waiting_cpus if prefetch else -1

    def _nudge(self) -> None:
        """Wake the loop when what just changed makes it talk sooner than it planned to. A job's end
        seldom does while others wait here (its report waits for company); waking the loop at each of a
        thousand short jobs a second, with the sum over the waiting instances each pass made, took about a
        fifth of the worker's own CPU per job (0.36 ms -> 0.28 with this, the count and `_slot_dir`)."""
        if not self.sleep_until or not (self.waiting or self.threads.waiting()) or self.pacing.step(
                time.monotonic(), self.busy, self._waiting_cpus(), self.reports_since if self.reports else None,
        ).at < self.sleep_until:
            self.wake.set()

    async def _fetch_input(self, bag_id: int, name: str, revision: int = 1) -> Path:
        """An input file from the worker's cache, downloaded once per revision of the bag (a revision may
        change an input under the same name) and again if a job changed it."""
        key = (bag_id, name if revision == 1 else f"{name}\0{revision}")  # no file name holds a NUL
        for _ in range(3):
            if key not in self.inputs:
                self.inputs[key] = asyncio.ensure_future(self._download(bag_id, name, key))
            future = self.inputs[key]
            try:
                path = await asyncio.shield(future)
            except Exception:
                if self.inputs.get(key) is future:  # the next job tries again
                    del self.inputs[key]
                raise
            if self.cache.intact(key):
                return path
            log.warning("input '%s' of bag %d changed in the cache; downloading it again", name, bag_id)
            if self.inputs.get(key) is future:
                del self.inputs[key]
        raise RuntimeError(f"input '{name}' changed in the worker's cache after each of three downloads")

    async def _download(self, bag_id: int, name: str, key: tuple[int, str]) -> Path:
        """Fetch an input from the server into the cache, which keeps it by content (worker/inputs.py)."""
        assert self._session is not None
        started = time.monotonic()
        async with self._session.get(f"{self.config.server}/v1/bags/{bag_id}/inputs/{quote(name, safe='')}",
                                     headers=self._headers()) as r:
            if r.status != 200:
                self.inputs.pop(key, None)
                raise RuntimeError(f"server answered HTTP {r.status} for input '{name}'")
            data = await r.read()
        self.fetched = (self.fetched[0] + len(data), self.fetched[1] + time.monotonic() - started)
        return self.cache.store(key, data)

    async def _goodbye(self) -> None:
        """Kill running jobs, give back everything held, and tell the server (best effort)."""
        self.stopping.set()  # also when the loop gave up: nothing held may start now
        for ev in self.kill.values():
            ev.set()
        queued = self.threads.stop()
        if self.running:
            await asyncio.gather(*self.running.values(), return_exceptions=True)
        while self.threads.running:
            await asyncio.sleep(0.02)
        self._collect()
        for a in [*queued, *self.waiting]:
            self.reports.append(InstanceReport(a.instance_id, Outcome.INTERRUPTED, reason="the worker stopped"))
        self.waiting.clear()
        self.waiting_cpus = 0
        if not self.reports and not self.dropped_answer:
            return
        assert self._session is not None
        for _ in range(3):
            try:
                await self._post(ExchangeRequest(self.host, 0, [], self.reports), timeout=GOODBYE_TIMEOUT)
                self.spool.acknowledged(r.instance_id for r in self.reports)
                self.reports = []
                return
            except (aiohttp.ClientError, TimeoutError, OSError, ProtocolError, msgspec.DecodeError) as e:
                log.warning("could not give back %d instances: %s", len(self.reports), e)
                await asyncio.sleep(0.5)
        self.spool.keep(r for r in self.reports if r.outcome is not Outcome.INTERRUPTED)


async def _vanish(a: Assignment, stop: KillSwitch) -> InstanceReport:
    """Hold an instance without running it until its deadline has passed (or it is taken back); the report
    returned is never sent."""
    taken = asyncio.Event()
    stop.on_set(taken.set)
    with contextlib.suppress(TimeoutError):
        # a second beyond it, so the server's tick has found it overdue: a worker that no longer lists an
        # instance sent in the last answer it got would have it taken for never delivered (no failure)
        await asyncio.wait_for(taken.wait(), max(0.0, a.instance_deadline - time.time()) + 1.0)
    return InstanceReport(a.instance_id, Outcome.INTERRUPTED, reason="dropped (--drop)")


def _pin_message(server: str, e: aiohttp.ServerFingerprintMismatch) -> str:
    return (f"the server at {server} presented a TLS certificate with fingerprint sha256:{e.got.hex()}, not the "
            "pinned one (a wrong server, or its certificate changed: take the fingerprint from its access file)")


def _message(body: bytes) -> str:
    """The message of an error answer (msgpack or JSON ErrorBody), or its first bytes as text."""
    for decode in (msgspec.msgpack.decode, msgspec.json.decode):
        with contextlib.suppress(Exception):
            err = decode(body, type=ErrorBody)
            return err.error[:500]
    return body[:300].decode(errors="replace")


def _memory_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        return 0


def run_worker(config: WorkerConfig) -> int:
    """Run a worker as this whole process until it exits; return its exit code.

    The process adopts its jobs' orphans (gridbot.worker.reaper), which a worker run inside another
    program must not do: that program's own children would look like the jobs'.
    """
    worker = Worker(config)
    if config.executor == "shell":
        worker.reaper.adopt()
    try:
        return asyncio.run(worker.run())
    finally:
        worker.reaper.close()

"""The service: one dispatcher, one store, and the rule that a decision is durable before it is answered.

Everything here is synchronous and runs on the server's event loop thread, so the dispatcher sees one
event at a time. If the store fails to apply a batch, the dispatcher is rebuilt from the store (which
holds the last durable state) and the caller gets ServiceUnavailable: the host retries later.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from gridbot.core.changes import BagSnapshot, Changes
from gridbot.core.dispatcher import DispatchConfig, Dispatcher
from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.model.spec import BagSpec
from gridbot.model.states import BagState, JobState
from gridbot.policy.policies import PolicyError, PolicySet, compile_policies
from gridbot.protocol import BagInfo, ExchangeRequest, ExchangeResponse, HostInfoRow, JobInfo, ResultInfo
from gridbot.store.base import BagRow, JobRow, Store

log = logging.getLogger("gridbot.server")


class NotFound(GridbotError):
    """No bag, job or file by that name."""


class BadRequest(GridbotError):
    """The request cannot be served as sent."""


@dataclass(frozen=True)
class ServiceConfig:
    """Server settings beyond the dispatcher's."""

    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    max_jobs: int = 10_000_000
    max_input_bytes: int = 256 * 1024 * 1024
    heartbeat: float = 15.0
    """Seconds between a busy worker's contacts: how soon it hears that an instance was cancelled."""


Waiter = Callable[[BaseException | None], None]


@dataclass
class _Flight:
    """A batch being applied on the writer thread, and the exchanges waiting for it."""

    future: concurrent.futures.Future[None]
    batch: Changes
    waiters: list[Waiter]
    settled: bool = False


class Service:
    """Owns the dispatcher and the store; every public method is one event."""

    def __init__(self, store: Store, config: ServiceConfig | None = None) -> None:
        self.store = store
        self.config = config or ServiceConfig()
        if self.config.heartbeat * 2 > self.config.dispatch.host_timeout:
            raise GridbotError(f"the heartbeat ({self.config.heartbeat:g} s) must be at most half the host timeout "
                               f"({self.config.dispatch.host_timeout:g} s), or busy hosts would be taken for lost")
        store.claim()
        self._pending: list[Changes] = []
        self._waiters: list[Waiter] = []
        self._flight: _Flight | None = None
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self.batches = 0
        """Transactions committed (each may carry many exchanges)."""
        self.dispatcher = Dispatcher(self.config.dispatch)
        self._load()

    def _load(self) -> None:
        pool_ads = self.dispatcher.pool_ads  # the pools file survives a reload from the store
        self.dispatcher = Dispatcher(self.config.dispatch)
        self.dispatcher.pool_ads = pool_ads
        self.dispatcher.restore(self.store.snapshot())
        self.feed()

    def _commit(self, changes: Changes) -> None:
        """Make `changes` durable now, with any staged before them (raises ServerUnavailable)."""
        self._pending.append(changes)
        self.flush()

    def stage(self, changes: Changes, done: Waiter) -> None:
        """Queue `changes` for the next `flush` (group commit); `done` is called once they are durable,
        with None, or with the error if the store refused the batch. Nothing staged may be answered
        before `done` has been called."""
        self._pending.append(changes)
        self._waiters.append(done)

    def _take(self) -> tuple[Changes, list[Waiter]]:
        pending, waiters = self._pending, self._waiters
        self._pending, self._waiters = [], []
        batch = pending[0]
        for more in pending[1:]:
            batch.merge(more)
        return batch, waiters

    def flush(self) -> None:
        """Apply every staged batch in one transaction (one fsync for all of them), then tell the waiters.

        A batch still on the writer thread lands first. If the store fails, nothing of the batch was
        applied: the dispatcher is rebuilt from the store, every waiter gets the error, and so does the
        caller (ServerUnavailable).
        """
        self._settle()
        if not self._pending:
            return
        batch, waiters = self._take()
        try:
            self.store.apply(batch)
        except Exception as e:
            raise self._failed(e, waiters) from e
        self._applied(batch, waiters)

    def flush_async(self, post: Callable[[Callable[[], None]], object]) -> None:
        """Start applying the staged batches on the store's writer thread and return at once.

        One batch is in flight at a time: what is staged meanwhile goes in the next, started when this
        one lands, so the commit of one batch overlaps the decisions of the next (the store's C code
        runs outside the interpreter lock). `post` runs a callback on the caller's thread (the event
        loop's `call_soon_threadsafe`); the waiters are told there. A store that cannot take writes
        from another thread is flushed here and now.
        """
        if self._flight is not None or not self._pending:
            return
        if not self.store.threaded_writes:
            with contextlib.suppress(ServerUnavailable):  # every waiter has the error and answers it
                self.flush()
            return
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gridbot-store")
        batch, waiters = self._take()
        flight = self._flight = _Flight(self._writer.submit(self.store.apply, batch), batch, waiters)

        def landed() -> None:
            if not flight.settled:
                self._settle()
                self.flush_async(post)

        flight.future.add_done_callback(lambda _: post(landed))

    def _settle(self) -> None:
        """Wait for the batch on the writer thread, if any, and tell its waiters how it went."""
        flight = self._flight
        if flight is None:
            return
        self._flight = None
        flight.settled = True
        error = flight.future.exception()
        if error is None:
            self._applied(flight.batch, flight.waiters)
            return
        # what was decided after it assumed it: those exchanges fail too, and the dispatcher reloads
        later = self._waiters
        self._pending, self._waiters = [], []
        self._failed(error, flight.waiters + later)

    def _failed(self, e: BaseException, waiters: list[Waiter]) -> ServerUnavailable:
        log.error("store failed to apply a batch (%s); reloading the dispatcher from the store", e, exc_info=e)
        error = ServerUnavailable(f"the store failed: {e}; try again")
        for done in waiters:
            done(error)
        self._load()
        return error

    def _applied(self, batch: Changes, waiters: list[Waiter]) -> None:
        self.batches += 1
        for done in waiters:
            done(None)
        for b in batch.bags.values():
            if b.state is not BagState.ACTIVE:
                log.info("bag %d %s: %d done, %d failed, %d instances, %d wasted", b.bag_id, b.state.value,
                         b.counts.done, b.counts.failed, b.counts.instances, b.counts.wasted)

    def close(self) -> None:
        """Let the batch in flight land and stop the writer thread (the store stays open)."""
        self._settle()
        if self._writer is not None:
            self._writer.shutdown()
            self._writer = None

    def feed(self) -> None:
        """Refill the dispatcher's windows from the store (the paper's feeder).

        Where the dispatcher changed jobs beyond a window's cursor (`FeedRequest.stale`), staged changes
        are flushed first: the store must not offer as queued a job the dispatcher has already sent or
        finished. Otherwise the read needs only what is committed, and the writer's batch goes on."""
        requests = self.dispatcher.needs_feed()
        if any(r.stale for r in requests) and (self._pending or self._flight is not None):
            self.flush()
            requests = self.dispatcher.needs_feed()
        for req in requests:
            self.dispatcher.feed(req.bag_id, self.store.queued_jobs(req.bag_id, req.after, req.limit), req.limit)

    # -- workers --------------------------------------------------------------------------------------

    def exchange(self, req: ExchangeRequest, now: float) -> ExchangeResponse:
        """A worker's round trip; its reports and new assignments are durable when this returns."""
        resp, changes = self.decide(req, now)
        self._commit(changes)
        return resp

    def decide(self, req: ExchangeRequest, now: float) -> tuple[ExchangeResponse, Changes]:
        """A worker's round trip without the commit: the answer may be sent only once `changes` are
        durable (through `stage` and `flush`, or `_commit`)."""
        self.feed()
        answer, changes = self.dispatcher.request_work(req.host, max(0, req.want), req.running, now, req.reports)
        cfg = self.config.dispatch
        return ExchangeResponse(answer.assignments, answer.cancel, answer.backoff, heartbeat=self.config.heartbeat,
                                max_result_bytes=cfg.max_result_bytes), changes

    def tick(self, now: float) -> None:
        """Deadline expiry and silent hosts, then a feeder pass."""
        self._commit(self.dispatcher.tick(now))
        self.feed()

    def input_file(self, bag_ref: str, name: str) -> bytes:
        data = self.store.input_file(self.bag(bag_ref).bag_id, name)
        if data is None:
            raise NotFound(f"bag {bag_ref} has no input file '{name}'")
        return data

    # -- submitters -----------------------------------------------------------------------------------

    def submit(self, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes], now: float) -> BagInfo:
        """Store a bag and start dispatching it; nothing is stored if it is refused."""
        total = len(lines) if lines is not None else spec.sweep_size
        if spec.each_line != (lines is not None):
            raise BadRequest("an each-line bag needs its lines, and only an each-line bag has lines")
        if total > self.config.max_jobs:
            raise BadRequest(f"the bag has {total:,} jobs, over this server's limit of {self.config.max_jobs:,}; "
                             "split it, or start the server with a larger --max-jobs")
        if total < 1:
            raise BadRequest("the bag has no jobs")
        self.compile(spec.policy, spec)
        missing = sorted({p.rstrip("/").rsplit("/", 1)[-1] for p in spec.inputs} - set(inputs))
        if missing:
            raise BadRequest(f"input files {missing} are named in the spec but were not sent")
        size = sum(len(v) for v in inputs.values())
        if size > self.config.max_input_bytes:
            raise BadRequest(f"input files total {size:,} bytes, over the limit of {self.config.max_input_bytes:,}")
        row = self.store.create_bag(spec, lines, inputs, now)
        self.dispatcher.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
        self.feed()
        log.info("bag %d '%s' submitted: %d jobs", row.bag_id, row.name, row.total)
        return bag_info(row)

    def compile(self, written: dict[str, str], spec: BagSpec) -> PolicySet:
        """Validate policies with a trial evaluation bounded in time; BadRequest names the bad one."""
        try:
            return compile_policies(written, spec.instance_deadline, time.perf_counter)
        except PolicyError as e:
            raise BadRequest(str(e)) from None

    def policies(self, ref: str) -> dict[str, str]:
        """A bag's policies as they apply: what its owner wrote, and the defaults for the rest."""
        row = self.bag(ref)
        return self.compile(row.spec.policy, row.spec).texts

    def set_policy(self, ref: str, name: str, text: str) -> BagInfo:
        """Change one policy of a bag; the next decision uses it. Nothing changes if it is refused."""
        row = self.bag(ref)
        written = {**row.spec.policy, name: text}
        self.compile(written, row.spec)
        spec = msgspec.structs.replace(row.spec, policy=written)
        self.store.set_spec(row.bag_id, spec)
        if row.bag_id in self.dispatcher.bags:
            self.dispatcher.set_policy(row.bag_id, spec)
        log.info("bag %d policy %s = %r", row.bag_id, name, text)
        return self.info(self.bag(ref))

    def info(self, row: BagRow) -> BagInfo:
        return msgspec.structs.replace(bag_info(row), diagnostics=self.dispatcher.diagnostics(row.bag_id))

    def hosts(self, now: float) -> list[HostInfoRow]:
        """Known hosts with the statistics the dispatcher holds (the store's for hosts it never saw)."""
        rows = []
        for h in self.store.hosts():
            live = self.dispatcher.hosts.get(h.info.host_id)
            stats = live.stats if live is not None else h.stats
            black = bool(live is not None and self.dispatcher.host_attrs(live, now)["BlackHole"])
            rows.append(HostInfoRow(h.info.host_id, h.info.name, h.info.pool, h.info.ncpus, h.first_seen,
                                    h.last_seen, stats.done, stats.failed, stats.error_rate, black))
        return rows

    def bag(self, ref: str) -> BagRow:
        row = self.store.bag(ref)
        if row is None:
            raise NotFound(f"no bag '{ref}'; `gridbot status` lists the bags")
        return row

    def bags(self) -> list[BagInfo]:
        return [self.info(b) for b in self.store.bags()]

    def cancel(self, ref: str, now: float) -> BagInfo:
        row = self.bag(ref)
        self._commit(self.dispatcher.cancel_bag(row.bag_id, now))
        return bag_info(self.bag(ref))

    def jobs(self, ref: str, state: str | None, limit: int, after: int) -> list[JobInfo]:
        try:
            st = JobState(state) if state else None
        except ValueError:
            raise BadRequest(f"unknown job state '{state}'; use one of "
                             f"{', '.join(s.value for s in JobState)}") from None
        row = self.bag(ref)
        return [job_info(row.spec, j) for j in self.store.jobs(row.bag_id, st, limit, after)]

    def results(self, ref: str, after: int, limit: int) -> list[ResultInfo]:
        row = self.bag(ref)
        out = []
        for r in self.store.results(row.bag_id, after, limit):
            inst = r.instance
            out.append(ResultInfo(
                job_info(row.spec, r.job), {} if row.spec.each_line else row.spec.params(r.job.index),
                inst.exit_code if inst else None, inst.wall_s if inst else None, inst.cpu_s if inst else None,
                inst.host_id if inst else None, (inst.stdout_tail or "") if inst else "",
                (inst.stderr_tail or "") if inst else "", r.outputs))
        return out


def bag_info(row: BagRow) -> BagInfo:
    return BagInfo(row.bag_id, row.name, row.state.value, row.total, row.counts, row.created_at, row.finished_at,
                   row.spec_hash, row.spec.description)


def job_info(spec: BagSpec, job: JobRow) -> JobInfo:
    command = spec.render(job.index, job.line)[0]
    return JobInfo(job.job_id, job.index, job.state.value, command, job.failures, job.attempts, job.reason)

"""The service: one dispatcher, one store, and the rule that a decision is durable before it is answered.

Everything here is synchronous and runs on the server's event loop thread, so the dispatcher sees one
event at a time. If the store fails to apply a batch, the dispatcher is rebuilt from the store (which
holds the last durable state) and the caller gets ServiceUnavailable: the host retries later.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from gridbot.core.changes import BagSnapshot, Changes, QueuedJob
from gridbot.core.config import DispatchConfig
from gridbot.core.dispatcher import Dispatcher
from gridbot.core.strategy import TailPlan
from gridbot.core.view import BagView
from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.history import rows_from_states
from gridbot.model.hierarchy import QueueSpec
from gridbot.model.pools import PoolMonitor
from gridbot.model.records import Verdict
from gridbot.model.spec import (
    MAX_PATH,
    BagSpec,
    StrategyChoice,
    StrategyOption,
    budget_problem,
    check_spec,
    each_line_spec,
    parse_bag_deadline,
    with_qos_placement,
)
from gridbot.model.states import BAG_TERMINAL, BagState, InstanceState, JobState
from gridbot.model.validators import ValidatorSpec
from gridbot.policy.policies import PolicyError, PolicySet, compile_policies, validate_policies
from gridbot.protocol import (
    BagHistory,
    BagInfo,
    CostInfo,
    Deleted,
    ExchangeRequest,
    ExchangeResponse,
    HostInfoRow,
    InstanceLog,
    JobInfo,
    JobLog,
    JobStory,
    PlanInput,
    QosChange,
    QueueInfo,
    ResultInfo,
    RetryAnswer,
    StoryInstance,
)
from gridbot.schedulers import registry
from gridbot.schedulers.base import StrategyError
from gridbot.schedulers.expert.tail import SERVER_TICK, observe, reliable_pools
from gridbot.store.base import BagExists, BagRow, ClaimLost, InstanceRow, JobRow, Store, spec_hash

log = logging.getLogger("gridbot.server")


class NotFound(GridbotError):
    """No bag, job or file by that name."""


class BadRequest(GridbotError):
    """The request cannot be served as sent."""


class Conflict(GridbotError):
    """The request is valid but would lose something the caller did not say it may lose (HTTP 409)."""


@dataclass(frozen=True)
class ServiceConfig:
    """Server settings beyond the dispatcher's."""

    dispatch: DispatchConfig = field(default_factory=DispatchConfig)
    max_jobs: int = 10_000_000
    max_input_bytes: int = 256 * 1024 * 1024
    heartbeat: float = 15.0
    """Seconds between a busy worker's contacts: how soon it hears that an instance was cancelled."""
    max_bags_per_submitter: int = 1_000
    """Active bags one submitter may have at once."""
    queues: tuple[QueueSpec, ...] = ()
    """The grid execution hierarchy's queues, from the pools file (docs/hierarchy.md): with them, a bag that
    names GridBot's default placement is placed by "hierarchy"."""
    validators: tuple[ValidatorSpec, ...] = ()
    """The quorums' validators, from the pools file (`[validators.NAME]`): what a bag's `compare` may name."""


Waiter = Callable[[BaseException | None], None]
ESTIMATOR_OF = "gridbot: the complexity estimator of bag "
"""The description of a hierarchy bag's estimator companion, followed by the bag's id."""
RELOAD_EVERY = 2.0
"""Seconds between tries to reload the dispatcher from a store that was unavailable."""
ENDED_PLANS = 10_000
"""Tail plans of ended bags kept in memory for `gridbot status`."""
SOLO_SECONDS = 10.0
"""How long exchanges are committed one by one after a batch of several failed."""
PAUSE_GAP = 5.0
"""Seconds between two ticks (one a second) beyond which the server counts itself as having been away."""


@dataclass
class _Flight:
    """A batch being applied on the writer thread, and the exchanges waiting for it."""

    future: concurrent.futures.Future[None]
    batch: Changes
    waiters: list[Waiter]
    settled: bool = False


class Service:
    """Owns the dispatcher and the store; every public method is one event."""

    def __init__(self, store: Store, config: ServiceConfig | None = None, only: set[int] | None = None) -> None:
        self.store = store
        self.only = only
        """The bags this service dispatches, and those submitted through it (None: every active bag). `gridbot
        run` serves its own bag alone, leaving others of the same store as they are."""
        self.config = config or ServiceConfig()
        if self.config.heartbeat * 2 > self.config.dispatch.host_timeout:
            raise GridbotError(f"the heartbeat ({self.config.heartbeat:g} s) must be at most half the host timeout "
                               f"({self.config.dispatch.host_timeout:g} s), or busy hosts would be taken for lost")
        store.claim()
        store.on_lost(self._claim_lost)
        self._pending: list[Changes] = []
        self._waiters: list[Waiter] = []
        self._flight: _Flight | None = None
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self.batches = 0
        """Transactions committed (each may carry many exchanges)."""
        self.commit_failures = 0
        """Batches the store refused (each made the dispatcher reload from the store), for /metrics."""
        self.commit_hooks: list[Callable[[Changes, float], None]] = []
        """Called on the loop's thread with each batch once it is durable and the seconds its commit took
        (`gridbot.server.metrics` counts instances and commit latency there): read-only observers."""
        self.reload_hooks: list[Callable[[], None]] = []
        """Called on the loop's thread each time the dispatcher was rebuilt from the store after a failed batch
        or an outage: a batch the store reported failed may have landed all the same (the connection lost
        right after its COMMIT), and no commit hook heard of it. Read-only observers."""
        self.lost: ClaimLost | None = None
        """Set when another server took the store (`ClaimLost`): this one must stop."""
        self.on_lost: list[Callable[[ClaimLost], None]] = []
        """Called once the claim is lost (on the thread that found it: the store's writer thread, the loop's,
        or the one `hold_claim` runs on): `gridbot server` stops."""
        self._commit_seconds = 0.0
        self._last_tick = 0.0
        self.stale = False
        self._outage = True
        """The server could not hear hosts before this load (it starts, or its store was unavailable)."""
        self._next_reload = 0.0
        self.solo_until = 0.0
        """While the clock is before this, each exchange is committed alone (after a failed batch, so an
        exchange whose changes the store refuses fails alone instead of taking its batch with it)."""
        self.factory = registry.factory(self.config.dispatch.seed, self.config.queues)
        self.dispatcher = Dispatcher(self.config.dispatch, self.factory, time.perf_counter)
        self.dispatcher.reseed(secrets.randbits(62))
        self._bag_views: dict[int, BagView] = {}
        self._estimators: dict[int, int] = {}
        """A hierarchy bag's estimator (a companion bag) -> the bag it estimates (`_estimate`)."""
        self._estimated_by: dict[int, int] = {}
        """The reverse: a bag -> its estimator."""
        self._ended_estimates: list[int] = []
        """Bags of either kind that ended since the last tick."""
        """The active bags' views, kept to read their tail plan once they end (`_remember_ended`)."""
        self._ended_plans: dict[int, TailPlan] = {}
        self._load()

    def _load(self) -> None:
        """Rebuild the dispatcher from the store's last durable state. The new one replaces the old only
        once the snapshot has been read whole: a store that is down leaves the service `stale`, answering
        ServerUnavailable until a reload succeeds, never an empty dispatcher that forgets running work.
        Hosts could not be heard while the server was away or its store down: they get a grace period."""
        factory = registry.factory(self.config.dispatch.seed, self.config.queues)
        fresh = Dispatcher(self.config.dispatch, factory, time.perf_counter)
        fresh.reseed(secrets.randbits(62))
        fresh.pool_ads = self.dispatcher.pool_ads  # the pools file survives a reload from the store
        snapshot = self.store.snapshot()
        if self.only is not None:
            only = self.only
            snapshot = msgspec.structs.replace(snapshot, bags=[b for b in snapshot.bags if b.bag_id in only],
                                               instances=[i for i in snapshot.instances if i.bag_id in only])
        fresh.restore(snapshot)
        if self._outage:  # started, or the store was away: nobody could reach the server meanwhile
            fresh.grace(time.time())
        fresh.pool_errors = self.dispatcher.pool_errors
        for pool, reading in self.dispatcher.view.monitors().items():
            fresh.monitor(pool, reading)
        self.dispatcher, self.factory = fresh, factory
        self.stale = self._outage = False
        self._last_tick = 0.0  # the gap since the last tick is covered by the grace, not shifted again
        self.feed()
        for hook in self.reload_hooks:
            try:
                hook()
            except Exception:  # an observer's bug must not fail the reload
                log.exception("a reload hook failed")

    def hold_claim(self) -> None:
        """Keep the store's claim (`Store.hold_claim`), from a thread other than the loop's: a statement on a
        connection to a database cut off by the network waits for TCP to give up. A claim another server took
        stops the server (`on_lost`); anything else is tried again at the next tick or write."""
        try:
            self.store.hold_claim()
        except ServerUnavailable:
            pass
        except Exception:  # a bug of ours must not go unheard in a future nobody reads
            log.exception("keeping the store's claim failed; the next tick tries again")

    def _claim_lost(self, e: ClaimLost) -> None:
        if self.lost is None:
            self.lost = e
            log.critical("%s", e)
            for hook in self.on_lost:
                hook(e)

    def ready(self) -> None:
        """Raise ServerUnavailable while the dispatcher waits to be reloaded from a store that was down
        (a reload is tried at most every RELOAD_EVERY seconds; requests in between are refused at once), and
        for good once another server took the store (`lost`)."""
        if self.lost is not None:
            raise self.lost
        if not self.stale:
            return
        if time.monotonic() < self._next_reload:
            raise ServerUnavailable("the store is unavailable; try again shortly")
        try:
            self._load()
        except ServerUnavailable as e:
            self._next_reload = time.monotonic() + RELOAD_EVERY
            raise ServerUnavailable(f"the store is unavailable ({e}); try again shortly") from e
        log.info("the store is back; the dispatcher was reloaded from it")

    def commit(self, changes: Changes) -> None:
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
        lost = self._settle()
        if lost is not None:  # the batch in flight failed, and what was staged after it went with it
            raise lost
        if not self._pending:
            return
        batch, waiters = self._take()
        try:
            self._timed_apply(batch)
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
        future = self._writer.submit(self._timed_apply, batch)
        self._flight = _Flight(future, batch, waiters)
        # the callback names the future, not the flight: a future keeps its callbacks after it is done, and a
        # callback holding the flight made a cycle that kept every batch's changes (thousands of objects an
        # exchange) alive until the collector's oldest generation came round
        future.add_done_callback(lambda landed: post(functools.partial(self._landed, landed, post)))

    def _landed(self, future: concurrent.futures.Future[None], post: Callable[[Callable[[], None]], object]) -> None:
        """On the caller's thread: the batch of `future` was applied; tell its waiters and start the next batch,
        unless a synchronous flush settled it first."""
        flight = self._flight
        if flight is not None and flight.future is future and not flight.settled:
            self._settle()
            self.flush_async(post)

    def _settle(self) -> ServerUnavailable | None:
        """Wait for the batch on the writer thread, if any, and tell its waiters how it went; the error
        when it failed (staged changes decided after it failed with it, and the dispatcher reloads)."""
        flight = self._flight
        if flight is None:
            return None
        self._flight = None
        flight.settled = True
        error = flight.future.exception()
        if error is None:
            self._applied(flight.batch, flight.waiters)
            return None
        later = self._waiters
        self._pending, self._waiters = [], []
        return self._failed(error, flight.waiters + later)

    def _failed(self, e: BaseException, waiters: list[Waiter]) -> ServerUnavailable:
        log.error("store failed to apply a batch (%s); reloading the dispatcher from the store", e, exc_info=e)
        error = ServerUnavailable(f"the store failed: {e}; try again")
        self.commit_failures += 1
        for done in waiters:
            done(error)
        if len(waiters) > 1:
            self.solo_until = time.monotonic() + SOLO_SECONDS
        self.stale = True
        self._outage = isinstance(e, ServerUnavailable)
        if self.lost is not None:  # another server's database now: nothing to reload, the server stops
            return error
        try:
            self._load()
        except ServerUnavailable as reload_error:
            self._next_reload = time.monotonic() + RELOAD_EVERY
            log.error("cannot reload the dispatcher from the store (%s); answering 503 until it can", reload_error)
        return error

    def _timed_apply(self, batch: Changes) -> None:
        """`store.apply`, timed for /metrics (on the writer thread; one batch is in flight at a time, and its
        time is read once it has landed, in `_applied`)."""
        started = time.perf_counter()
        self.store.apply(batch)
        self._commit_seconds = time.perf_counter() - started

    def _applied(self, batch: Changes, waiters: list[Waiter]) -> None:
        self.batches += 1
        for done in waiters:
            done(None)
        for hook in self.commit_hooks:
            try:
                hook(batch, self._commit_seconds)
            except Exception:  # an observer's bug must not stop the commits
                log.exception("a commit hook failed")
        for b in batch.bags.values():
            if b.state is not BagState.ACTIVE:
                self._remember_ended(b.bag_id)
                if b.bag_id in self._estimators or b.bag_id in self._estimated_by:
                    self._ended_estimates.append(b.bag_id)  # (taken up at the next tick, on the loop)
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
        self.commit(changes)
        return resp

    def decide(self, req: ExchangeRequest, now: float,
               verdicts: Mapping[int, Verdict] | None = None) -> tuple[ExchangeResponse, Changes]:
        """A worker's round trip without the commit: the answer may be sent only once `changes` are
        durable (through `stage` and `flush`, or `commit`). `verdicts`: the validators' say on its reported
        results of quorum jobs (server/validate.py)."""
        self.ready()
        self.feed()
        answer, changes = self.dispatcher.request_work(req.host, max(0, req.want), req.running, now, req.reports,
                                                       req.fetched, verdicts)
        cfg = self.config.dispatch
        return ExchangeResponse(answer.assignments, answer.cancel, answer.backoff, heartbeat=self.config.heartbeat,
                                max_result_bytes=cfg.max_result_bytes, refused=answer.refused), changes

    def monitor(self, pool: str, reading: PoolMonitor | None) -> None:
        """A new reading of a pool's own monitoring (the overlay takes them), for the stateful placements."""
        self.dispatcher.monitor(pool, reading)

    def tick(self, now: float) -> None:
        """Deadline expiry and silent hosts, then a feeder pass.

        A gap since the last tick longer than PAUSE_GAP means the server itself was away (stopped, or its
        loop blocked): that time is not counted against hosts or instances (`Dispatcher.shift`)."""
        self.ready()
        if self._last_tick and now - self._last_tick > PAUSE_GAP:
            gap = now - self._last_tick
            log.warning("the server did not run for %.0f s; hosts and instances are not blamed for it", gap)
            self.dispatcher.shift(gap)
        self._last_tick = now
        self.commit(self.dispatcher.tick(now))
        ended, self._ended_estimates = self._ended_estimates, []
        for bag_id in ended:
            try:
                self._estimate_ended(bag_id, now)
            except Exception as e:  # an estimator's bag is the user's: its end must not stop the server's tick
                log.warning("bag %d: its estimator's end could not be taken up (%s)", bag_id, e)
        self.feed()
        for bag in self.dispatcher.view.bags():  # read again once the bag has ended: its tail plan
            self._bag_views[bag.bag_id] = bag

    def input_file(self, row: BagRow, name: str) -> bytes:
        data = self.store.input_file(row.bag_id, name) if 0 < len(name) <= MAX_PATH and "\0" not in name else None
        if data is None:
            raise NotFound(f"bag {row.name} has no input file '{name[:100]}'")
        return data

    # -- submitters -----------------------------------------------------------------------------------

    def submit(self, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes], now: float,
               owner: str = "") -> BagInfo:
        """Store a bag for `owner` and start dispatching it; nothing is stored if it is refused."""
        self.ready()
        spec = self._placed(spec)
        self._check_work(spec, lines, inputs)
        if spec.bag_deadline_at is not None and spec.bag_deadline_at <= now:  # (a revision may keep a past one)
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(spec.bag_deadline_at))
            raise BadRequest(f"bag_deadline {when} has passed: give a later time, or a duration from the "
                             "submission (2h)")
        self._check_room(owner)
        row = self.store.create_bag(spec, lines, inputs, now, owner)
        if self.only is not None:
            self.only.add(row.bag_id)
        self.dispatcher.add_bag(BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at))
        if (view := self.dispatcher.view.bag(row.bag_id)) is not None:  # kept to read its tail plan at its end
            self._bag_views[row.bag_id] = view
        self.feed()
        log.info("bag %d '%s' submitted: %d jobs", row.bag_id, row.name, row.total)
        estimator = spec.strategy.options.get("estimator") if spec.strategy.placement == "hierarchy" else None
        if isinstance(estimator, str) and estimator and not spec.strategy.options.get("complexity"):
            self._estimate(row, estimator, inputs, now, owner)
        return bag_info(row)

    def _estimate(self, row: BagRow, command: str, inputs: dict[str, bytes], now: float, owner: str) -> None:
        """Run a hierarchy bag's estimator once on a worker, as a one-job companion bag NAME.estimate with the
        bag's inputs; when it ends, the last number it printed becomes the bag's `complexity` (`_estimated`)."""
        name = f"{row.name[:55]}.estimate"
        options: dict[str, StrategyOption] = {"complexity": 1.0}
        spec = msgspec.structs.replace(
            each_line_spec(name, max_failures=1), inputs=list(row.spec.inputs), env=dict(row.spec.env),
            description=f"{ESTIMATOR_OF}{row.bag_id}", timeout=row.spec.timeout,
            strategy=StrategyChoice(placement="hierarchy", options=options))
        try:
            info = self.submit(spec, [command], inputs, now, owner)
        except (BadRequest, Conflict, BagExists) as e:
            log.warning("bag %d: its estimator could not be submitted (%s); it runs without", row.bag_id, e)
            return
        self._estimators[info.bag_id] = row.bag_id
        self._estimated_by[row.bag_id] = info.bag_id

    def _estimate_ended(self, bag_id: int, now: float) -> None:
        """A bag that has an estimator ended: its estimator is cancelled if it still runs. An estimator ended:
        the bag it estimated (its owner's, and still running) gets its bound as `complexity`. The link is the
        server's own (`_estimate`), never anything a user wrote; a restart forgets it, and the bag then runs
        without its bound once it has waited its share of Te."""
        companion = self._estimated_by.pop(bag_id, None)
        if companion is not None:
            self._estimators.pop(companion, None)
            if companion in self.dispatcher.view:
                self.commit(self.dispatcher.cancel_bag(companion, now))
            return
        main_id = self._estimators.pop(bag_id, None)
        if main_id is None:
            return
        self._estimated_by.pop(main_id, None)
        row, main = self.store.bag(bag_id), self.store.bag(main_id)
        if row is None or main is None or row.owner != main.owner:
            return
        results = self.store.results(bag_id, limit=1)
        printed = results[0].instance.stdout_tail if results and results[0].instance is not None else None
        found = [t.replace(",", "").replace("_", "") for t in
                 re.findall(r"(?<![\w.])\d[\d,_]*(?:\.\d+)?(?:[eE][-+]?\d+)?", printed or "")]
        if main.state is not BagState.ACTIVE or main.bag_id not in self.dispatcher.view:
            return
        bound = float(found[-1]) if found else 0.0
        if not found or not 0 < bound < 1e15:
            log.warning("bag %d: its estimator printed no positive number; it runs as of unknown complexity",
                        main.bag_id)
            return
        options = {**main.spec.strategy.options, "complexity": bound}
        spec = msgspec.structs.replace(main.spec, strategy=msgspec.structs.replace(main.spec.strategy, options=options))
        self.store.set_spec(main.bag_id, spec)
        self.dispatcher.set_strategy(main.bag_id, spec, time.time())
        log.info("bag %d: its estimator bounds its work by %g CPU-s", main.bag_id, bound)

    def _placed(self, spec: BagSpec) -> BagSpec:
        """The placement a bag that names none gets: DBC's with a deadline or a budget, the hierarchy's on a
        server with queues."""
        return registry.default_placement(with_qos_placement(spec), bool(self.config.queues))

    def _check_work(self, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes]) -> int:
        """Refuse (BadRequest) a spec, lines and inputs that cannot make a bag here; return its jobs."""
        problems = check_spec(spec, lines, self.config.max_jobs)  # the command line's checks, issue 12
        if problems:
            raise BadRequest("; ".join(problems))
        total = len(lines) if lines is not None else spec.sweep_size
        self.compile(spec.policy, spec)
        names = sorted(v.name for v in self.config.validators)
        if spec.compare and spec.compare not in names:
            raise BadRequest(f"compare = {spec.compare!r}: this server has no such validator "
                             + (f"(it has {', '.join(names)})" if names else "(it has none)")
                             + "; leave 'compare' out to compare results byte for byte, or ask the server's admin to "
                             f"add [validators.{spec.compare}] to its pools file")
        try:
            registry.check_bag(spec, bool(self.config.queues))
        except StrategyError as e:
            raise BadRequest(str(e)) from None
        named = {p.rstrip("/").rsplit("/", 1)[-1] for p in spec.inputs}
        missing = sorted(named - set(inputs))
        if missing:
            raise BadRequest(f"input files {missing} are named in the spec but were not sent")
        extra = sorted(set(inputs) - named)
        if extra:
            raise BadRequest(f"input files {[n[:60] for n in extra[:5]]} were sent but the spec names no such input; "
                             "list them under inputs")
        size = sum(len(v) for v in inputs.values())
        if size > self.config.max_input_bytes:
            raise BadRequest(f"input files total {size:,} bytes, over the limit of {self.config.max_input_bytes:,}")
        return total

    def _check_room(self, owner: str) -> None:
        """Refuse one more active bag for `owner` beyond the server's limit."""
        active = sum(1 for b in self.store.bags() if b.owner == owner and b.state is BagState.ACTIVE)
        if active >= self.config.max_bags_per_submitter:
            raise BadRequest(f"'{owner}' has {active:,} active bags, this server's limit (--max-bags-per-submitter); "
                             "wait for some to end, or cancel some")

    def compile(self, written: dict[str, str], spec: BagSpec) -> PolicySet:
        """Validate policies someone wrote with a trial evaluation bounded in time, as the command line does;
        BadRequest names the bad one."""
        try:
            return validate_policies(written, spec.instance_deadline, time.perf_counter, spec.name)
        except PolicyError as e:
            raise BadRequest(str(e)) from None

    def policies(self, row: BagRow) -> dict[str, str]:
        """A bag's policies as they apply: what its owner wrote, and the defaults for the rest (as stored: a
        bag stored before a check was added shows its policies too)."""
        try:
            return compile_policies(row.spec.policy, row.spec.instance_deadline).texts
        except PolicyError as e:
            raise BadRequest(str(e)) from None

    def set_policy(self, row: BagRow, name: str, text: str) -> BagInfo:
        """Change one policy of a bag; the next decision uses it. Nothing changes if it is refused."""
        self.ready()
        written = {**row.spec.policy, name: text}
        self.compile(written, row.spec)
        spec = msgspec.structs.replace(row.spec, policy=written)
        self.store.set_spec(row.bag_id, spec)
        if row.bag_id in self.dispatcher.view:
            self.dispatcher.set_policy(row.bag_id, spec, time.time())
        log.info("bag %d policy %s = %r", row.bag_id, name, text)
        return self.info(self.bag(row.bag_id))

    def info(self, row: BagRow) -> BagInfo:
        now = time.time()
        return msgspec.structs.replace(bag_info(row), diagnostics=self.dispatcher.diagnostics(row.bag_id, now),
                                       tail_plan=self.tail_plan(row.bag_id), budget=row.spec.budget,
                                       deadline_at=row.spec.deadline_at(row.created_at),
                                       spent=self.dispatcher.view.bill(row.bag_id).total,
                                       qos=self.dispatcher.qos(row.bag_id, now),
                                       level=self.dispatcher.level(row.bag_id, now))

    def levels(self, owner: str | None = None) -> list[QueueInfo]:
        """The execution hierarchy's queues with their limits and load as of its last step (empty: the server
        has none). Bags of other owners than `owner` (None: an admin, who sees all) are counted, not named."""
        h = self.factory.hierarchy
        if h is None:
            return []
        view = self.dispatcher.view
        mine = {r.bag_id for r in self.store.bags() if owner is None or r.owner == owner}
        out = []
        for q in h.queues:
            held = [(i, b) for i in h.order[q.name] if (b := view.bag(i)) is not None]
            names = [b.name if i in mine else "(another owner's)" for i, b in held]
            running = sum(b.on_pool(p)[1] for _, b in held for p in q.pools)
            out.append(QueueInfo(q.name, q.level, list(q.pools), q.queue_time_limit, q.exec_time_limit, q.max_cpus,
                                 h.speed(view, q), q.max_bags, sorted(q.policies), q.at_lowest, h.work(view, q),
                                 h.phi(view, q, q.queue_time_limit, 1.0), h.phi(view, q, q.exec_time_limit, 1.0),
                                 names, running))
        return out

    def cost(self, row: BagRow, admin: bool = True) -> CostInfo:
        """What the bag spent per pool, as the dispatcher's ledger bills it (core/ledger.py); the server's idle
        pilots (nobody's share) for an admin only."""
        view = self.dispatcher.view
        bill = view.bill(row.bag_id)
        return CostInfo(row.name, bill.total, bill.pools, row.spec.budget, row.spec.deadline_at(row.created_at),
                        self.dispatcher.qos(row.bag_id, time.time()), view.idle_pilots() if admin else 0.0)

    def set_qos(self, row: BagRow, change: QosChange) -> BagInfo:
        """Change a bag's deadline or budget while it runs: its placement plans with them from the next
        decision on (a bag with GridBot's placement gets the DBC placement `cost-time`, as at submission).
        Nothing changes if it is refused."""
        self.ready()
        if row.state is not BagState.ACTIVE or row.bag_id not in self.dispatcher.view:
            raise BadRequest(f"bag {row.name} is {row.state.value}, not running here: its deadline and budget can "
                             "change only while it runs")
        values: dict[str, float | None] = {}
        if change.budget is not msgspec.UNSET:
            if change.budget is not None and (problem := budget_problem(change.budget)):
                raise BadRequest(f"{problem}: give a number >= 0 in the pools' currency, or null for no budget")
            values["budget"] = None if change.budget is None else float(change.budget)
        if change.bag_deadline is not msgspec.UNSET:
            values["bag_deadline"] = values["bag_deadline_at"] = None
            if change.bag_deadline is not None:
                try:
                    parsed = parse_bag_deadline(change.bag_deadline)
                except ValueError as e:
                    raise BadRequest(f"bag_deadline {str(change.bag_deadline)[:80]!r}: {e}") from None
                now = time.time()
                # a duration given now counts from now (the owner means "two hours from now", not from when
                # the bag was submitted); a time already past is refused
                at = parsed.get("bag_deadline_at", now + parsed.get("bag_deadline", 0.0))
                if at <= now:
                    raise BadRequest(f"bag_deadline {str(change.bag_deadline)[:80]!r} has passed: give a later time, "
                                     "or a duration from now (2h)")
                values["bag_deadline_at"] = at
        if not values:
            raise BadRequest("give a budget or a bag_deadline to change (null removes one)")
        spec = with_qos_placement(msgspec.structs.replace(row.spec, **values))
        try:
            registry.check_bag(spec, bool(self.config.queues))
        except StrategyError as e:
            raise BadRequest(str(e)) from None
        self.store.set_spec(row.bag_id, spec)
        if spec.strategy == row.spec.strategy:  # (its strategies keep what they learnt, and plan with the new QoS)
            self.dispatcher.set_policy(row.bag_id, spec, time.time())
        else:
            self.dispatcher.set_strategy(row.bag_id, spec, time.time())
        log.info("bag %d qos: budget %s, deadline %s", row.bag_id, spec.budget, spec.deadline_at(row.created_at))
        return self.info(self.bag(row.bag_id))

    def tail_plan(self, bag_id: int) -> TailPlan | None:
        """The bag's tail plan: its tail strategy's while the dispatcher holds it; after it ended, the one read
        then from the view kept of it (in memory: a restarted server has none for the bags ended before)."""
        live = self.dispatcher.view.bag(bag_id)
        if live is not None:
            return live.tail_plan
        if bag_id in self._ended_plans:
            return self._ended_plans[bag_id]
        kept = self._bag_views.get(bag_id)
        return kept.tail_plan if kept is not None else None

    def _remember_ended(self, bag_id: int) -> None:
        """A bag ended: keep its tail plan as its last view reads it, and let the view go."""
        kept = self._bag_views.pop(bag_id, None)
        plan = kept.tail_plan if kept is not None else None
        if plan is not None:
            self._ended_plans[bag_id] = plan
            while len(self._ended_plans) > ENDED_PLANS:
                del self._ended_plans[next(iter(self._ended_plans))]

    def set_strategy(self, row: BagRow, choice: StrategyChoice) -> BagInfo:
        """Change an active bag's `[strategy]` while it runs: its strategies are made anew from the next
        decision on (what the old ones chose and not yet sent is dropped). Nothing changes if it is refused."""
        self.ready()
        try:
            registry.check(choice)
        except StrategyError as e:
            raise BadRequest(str(e)) from None
        if row.state is not BagState.ACTIVE or row.bag_id not in self.dispatcher.view:
            raise BadRequest(f"bag {row.name} is {row.state.value}, not running here: its strategy can change only "
                             "while it runs")
        spec = msgspec.structs.replace(row.spec, strategy=choice)
        try:
            registry.check_bag(spec, bool(self.config.queues))
        except StrategyError as e:  # said as such: it was "the strategies 'gridbot' and 'gridbot' cannot start"
            now, default = row.spec.strategy.placement, StrategyChoice().placement
            unnamed = (f"; bag {row.name} has placement {now!r} now, and a change that names no placement asks for "
                       f"{default!r}") if choice.placement == default != now else ""
            raise BadRequest(f"{e}{unnamed}") from None
        try:
            # made once on trial (with a hierarchy of its own): a strategy that cannot start changes nothing
            registry.factory(self.config.dispatch.seed, self.config.queues)(row.bag_id, spec)
        except Exception as e:
            raise BadRequest(f"tail {choice.tail!r} with placement {choice.placement!r} cannot start: {e}") from None
        self.store.set_spec(row.bag_id, spec)
        self.dispatcher.set_strategy(row.bag_id, spec, time.time())
        log.info("bag %d strategy: tail %s, placement %s, %s", row.bag_id, choice.tail, choice.placement,
                 choice.options)
        return self.info(self.bag(row.bag_id))

    def plan_input(self, row: BagRow) -> PlanInput:
        """What `gridbot plan` characterizes a running bag from: its instances so far, the tasks left, the pools
        (BadRequest for a bag that is not running here: its instances are known only while it runs)."""
        view = self.dispatcher.view
        bag = view.bag(row.bag_id)
        if bag is None:
            raise BadRequest(f"bag {row.name} is {row.state.value}: `gridbot plan` characterizes a running bag from "
                             "its instances; `gridbot plan --scenario FILE` plans one before it runs")
        # the tail's own measured dispatch lags stay with it: this plan assumes half a tick and the pools' startup
        observed = dataclasses.replace(observe(view, bag, time.time(), reliable_pools(view)), tick=SERVER_TICK)
        return PlanInput(row.name, row.spec.strategy, observed, bag.tail_plan)

    def bag_history(self, row: BagRow) -> BagHistory:
        """Every instance of a bag, running or ended, from the store: what `gridbot plan --from-bag` characterizes
        the pools from, offline (the dispatcher forgets a bag's instances when it ends; the store keeps them)."""
        self.flush()  # the store holds every change made so far
        pools = {h.info.host_id: h.info.pool for h in self.store.hosts()}
        stored: list[tuple[float, float | None, InstanceState, str]] = []
        after = 0
        while jobs := self.store.jobs(row.bag_id, None, 1000, after):
            for job in jobs:
                stored.extend((i.sent_at, i.ended_at, i.state, pools.get(i.host_id, ""))
                              for i in self.store.instances_of(job.job_id))
            after = jobs[-1].job_id
        rows = rows_from_states(stored)
        return BagHistory(row.name, row.state.value, row.spec.instance_deadline,
                          sorted(reliable_pools(self.dispatcher.view)),
                          [(r.sent_at, r.ended_at, r.success, r.pool) for r in rows])

    def hosts(self, now: float) -> list[HostInfoRow]:
        """Known hosts with the statistics the dispatcher holds (the store's for hosts it never saw)."""
        rows = []
        for h in self.store.hosts():
            live = self.dispatcher.view.host(h.info.host_id)
            stats = live.stats if live is not None else h.stats
            black = bool(live is not None and self.dispatcher.view.host_attrs(h.info.host_id, now)["BlackHole"])
            info = live.info if live is not None else h.info
            rows.append(HostInfoRow(h.info.host_id, h.info.name, h.info.pool, h.info.ncpus, h.first_seen,
                                    h.last_seen, stats.done, stats.failed, stats.error_rate, black, stats.refused,
                                    stats.valid, stats.invalid, stats.invalid_rate, info.speed, info.account))
        return rows

    def bag(self, ref: str | int, owner: str | None = None) -> BagRow:
        """The bag by name or id; another owner's bag is no bag at all (None: any owner, for admins)."""
        key = _bag_key(ref)
        row = self.store.bag(key) if key is not None else None
        if row is None or (owner is not None and row.owner != owner):
            raise NotFound(f"no bag '{str(ref)[:100]}'; `gridbot status` lists the bags")
        return row

    def bags(self, owner: str | None = None) -> list[BagInfo]:
        return [self.info(b) for b in self.store.bags() if owner is None or b.owner == owner]

    def cancel(self, row: BagRow, now: float) -> BagInfo:
        self.ready()
        self.commit(self.dispatcher.cancel_bag(row.bag_id, now))
        return bag_info(self.bag(row.bag_id))

    def retry(self, row: BagRow, indices: Sequence[int] | None, now: float) -> RetryAnswer:
        """Queue failed jobs of the bag again (those at `indices`, else every failed one), with their failure
        counts reset, and make the bag active again if it had ended. BadRequest names what cannot be retried
        (a cancelled bag, a job that did not fail), and then nothing changes."""
        self.ready()
        self.flush()  # the store holds every decision made so far: its failed jobs are the dispatcher's too
        row = self.bag(row.bag_id)
        if row.state is BagState.CANCELLED:
            raise BadRequest(f"bag {row.name} was cancelled, so its jobs cannot be retried; submit it again "
                             f"(`gridbot delete {row.name}` frees its name)")
        self._check_served(row)
        failed = self._failed_jobs(row, indices)
        if not failed:
            return RetryAnswer(self.info(row), 0)
        if row.state is not BagState.ACTIVE:
            self._check_room(row.owner)
        if self.only is not None:
            self.only.add(row.bag_id)
        snapshot = BagSnapshot(row.bag_id, row.spec, row.counts, row.created_at, row.revision)
        queued = [QueuedJob(j.job_id, j.index, j.line, 0, j.attempts) for j in failed]
        self.commit(self.dispatcher.retry(snapshot, row.state, queued, now))
        self.feed()
        log.info("bag %d '%s': %d failed jobs queued again", row.bag_id, row.name, len(failed))
        return RetryAnswer(self.info(self.bag(row.bag_id)), len(failed))

    def _check_served(self, row: BagRow) -> None:
        """Refuse to retry or revise an active bag this service does not dispatch (`only`)."""
        if row.state is BagState.ACTIVE and row.bag_id not in self.dispatcher.view:
            raise BadRequest(f"bag {row.name} is not dispatched here: this `gridbot run` serves its own bag only")

    def _failed_jobs(self, row: BagRow, indices: Sequence[int] | None) -> list[JobRow]:
        """The bag's failed jobs, or those at `indices` (BadRequest if one of them did not fail)."""
        failed: list[JobRow] = []
        after = 0
        while page := self.store.jobs(row.bag_id, JobState.FAILED, 10_000, after):
            failed.extend(page)
            after = page[-1].job_id
        if indices is None:
            return failed
        wanted = set(indices)
        outside = sorted(i for i in wanted if not 0 <= i < row.total)
        if outside:
            raise BadRequest(f"bag {row.name} has jobs 0 to {row.total - 1}; there is no job "
                             f"{', '.join(map(str, outside[:5]))}")
        chosen = [j for j in failed if j.index in wanted]
        others = sorted(wanted - {j.index for j in chosen})
        if others:
            states = ", ".join(f"{i} ({self._job_at(row, i).state.value})" for i in others[:5])
            raise BadRequest(f"only failed jobs can be retried, and job(s) {states}"
                             f"{f' and {len(others) - 5} more' if len(others) > 5 else ''} of bag {row.name} "
                             "did not fail; `gridbot jobs BAG --state failed` lists those that did")
        return chosen

    def revise(self, row: BagRow, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes],
               now: float) -> RetryAnswer:
        """Make `spec` (with its lines and inputs) the bag's next revision and queue its failed jobs again.

        Done jobs keep their results (and the revision that made them); every other job runs the new
        command, the running ones withdrawn from their hosts and queued again. The bag keeps its jobs, so
        the new spec must make as many. The same spec, lines and inputs as the bag's make no revision: its
        failed jobs are retried."""
        self.ready()
        spec = self._placed(spec)
        total = self._check_work(spec, lines, inputs)
        if spec.name != row.name:
            raise BadRequest(f"a revision of bag {row.name} must keep its name, not {spec.name[:80]!r}")
        if spec.each_line != row.spec.each_line:
            raise BadRequest(f"bag {row.name} is {'' if row.spec.each_line else 'not '}an each-line bag, and a "
                             "revision cannot change that; give the new one another name")
        if total != row.total:
            raise BadRequest(f"a revision keeps the bag's jobs, and bag {row.name} has {row.total:,} where the new "
                             f"spec makes {total:,}; give the new one another name")
        if row.state is BagState.CANCELLED:
            raise BadRequest(f"bag {row.name} was cancelled, so it cannot be revised; submit it again "
                             f"(`gridbot delete {row.name}` frees its name)")
        self._check_served(row)
        if spec_hash(spec, lines, inputs) == row.spec_hash:
            return self.retry(row, None, now)
        self.flush()
        revised = self.store.revise(row.bag_id, spec, lines, inputs, now)
        self.commit(self.dispatcher.revise(row.bag_id, spec, revised.revision, lines, now))
        self.feed()
        log.info("bag %d '%s': revision %d (%s)", row.bag_id, row.name, revised.revision, revised.spec_hash)
        return self.retry(revised, None, now)

    def delete(self, row: BagRow, force: bool, now: float) -> Deleted:
        """Remove the bag and everything the store holds of it, cancelling it first if it is active (its hosts
        kill its instances). Conflict if some of its results were never downloaded, unless `force`."""
        self.ready()
        self.flush()
        row = self.bag(row.bag_id)
        results = row.counts.done + row.counts.failed
        if results and row.downloaded_at is None and not force:
            raise Conflict(f"the results of bag {row.name} ({results:,} jobs) were never downloaded: fetch them with "
                           f"`gridbot results {row.name} DIR`, or `gridbot delete {row.name} --keep-results DIR` "
                           "(downloads, then deletes), or delete them with the bag: --force")
        if row.bag_id in self.dispatcher.view:
            self.commit(self.dispatcher.cancel_bag(row.bag_id, now))
        self.store.delete_bag(row.bag_id)
        if self.only is not None:
            self.only.discard(row.bag_id)
        log.info("bag %d '%s' deleted (it was %s)", row.bag_id, row.name, row.state.value)
        return Deleted(row.bag_id, row.name, row.state.value, row.total)

    def logs(self, row: BagRow, index: int) -> JobLog:
        """The job at `index` with every instance of it and what its host said: output tails and reasons."""
        job = self._job_at(row, index)
        spec = self._specs(row).get(job.revision, row.spec)
        instances = self.store.instances_of(job.job_id)
        kept = job.result_instance
        if kept is None and job.state is JobState.FAILED and instances:
            kept = instances[-1].instance_id  # as the results show a failed job: its last instance
        return JobLog(row.name, job_info(spec, job), {} if spec.each_line else spec.params(index), [
            InstanceLog(i.instance_id, i.host_id, i.state.value, i.sent_at, i.ended_at, i.reason, i.exit_code,
                        i.wall_s, i.cpu_s, i.stdout_tail or "", i.stderr_tail or "", i.instance_id == kept)
            for i in instances])

    def story(self, row: BagRow, index: int) -> JobStory:
        """The life of the job at `index`: each instance with its host, outcome and the events that sent and
        ended it, and the strategies' decisions about the job, with why."""
        told = self.store.story(self._job_at(row, index).job_id)
        if told is None:  # deleted meanwhile
            raise NotFound(f"bag {row.name} has no job {index}")
        spec = self._specs(row).get(told.job.revision, row.spec)
        return JobStory(row.name, job_info(spec, told.job), told.job.result_instance, [
            StoryInstance(i.instance_id, i.host_id, i.state.value, i.sent_at, i.ended_at, i.reason, i.exit_code,
                          i.wall_s, i.cpu_s, i.host_name, i.pool, i.instance_deadline, i.replica, i.sent_event,
                          i.end_event, i.overdue_event)
            for i in told.instances], told.decisions, told.events)

    def _job_at(self, row: BagRow, index: int) -> JobRow:
        """The bag's job at `index`. Job ids ascend with the index within a bag (they are inserted in order),
        so it is found by id, a few rows on where the ids have gaps, never by reading the whole bag."""
        if not 0 <= index < row.total:
            raise NotFound(f"bag {row.name} has jobs 0 to {row.total - 1}; there is no job {index}")
        first = self.store.jobs(row.bag_id, None, 1, 0)
        if first:
            near = self.store.jobs(row.bag_id, None, 1, first[0].job_id + index - 1)
            if near and near[0].index < index:
                near = self.store.jobs(row.bag_id, None, index - near[0].index, near[0].job_id)[-1:]
            if near and near[0].index == index:
                return near[0]
        raise NotFound(f"bag {row.name} has no job {index}")

    def _specs(self, row: BagRow) -> dict[int, BagSpec]:
        """The bag's spec of each revision, to show each job with the command of its own revision."""
        return {**(self.store.revisions(row.bag_id) if row.revision > 1 else {}), row.revision: row.spec}

    def instances(self, row: BagRow, job_id: int) -> list[InstanceRow]:
        """The instances of one job of the bag (a job of another bag is not found)."""
        jobs = self.store.jobs(row.bag_id, None, 1, job_id - 1) if job_id > 0 else []
        if not jobs or jobs[0].job_id != job_id:
            raise NotFound(f"bag {row.name} has no job with id {job_id}")
        return self.store.instances_of(job_id)

    def jobs(self, row: BagRow, state: JobState | None, limit: int, after: int) -> list[JobInfo]:
        specs = self._specs(row)
        return [job_info(specs.get(j.revision, row.spec), j) for j in self.store.jobs(row.bag_id, state, limit, after)]

    def results(self, row: BagRow, after: int, limit: int, now: float | None = None) -> list[ResultInfo]:
        """A page of ended jobs with their results, cut short once it holds more than twice the largest
        result (the client asks for the next page after the last job it got). The empty page after the
        last of an ended bag marks its results as downloaded (`BagRow.downloaded_at`): the page after one of its
        ended jobs, or from the start of a bag with none; not a page asked from beyond them, which only skipped
        them (`gridbot delete` would then lose results nobody read)."""
        out: list[ResultInfo] = []
        size, budget = 0, 2 * self.config.dispatch.max_result_bytes
        specs = self._specs(row)
        for r in self.store.results(row.bag_id, after, limit):
            size += sum(len(v) for v in r.outputs.values())
            if out and size > budget:
                break
            inst = r.instance
            spec = specs.get(r.job.revision, row.spec)
            out.append(ResultInfo(
                job_info(spec, r.job), {} if spec.each_line else spec.params(r.job.index),
                inst.exit_code if inst else None, inst.wall_s if inst else None, inst.cpu_s if inst else None,
                inst.host_id if inst else None, (inst.stdout_tail or "") if inst else "",
                (inst.stderr_tail or "") if inst else "", r.outputs))
        if not out and now is not None and row.state in BAG_TERMINAL and row.downloaded_at is None and (
                after == 0 or self._ended_job(row.bag_id, after)):
            self.store.mark_downloaded(row.bag_id, now)
        return out

    def _ended_job(self, bag_id: int, job_id: int) -> bool:
        """Whether `job_id` is an ended job (done or failed) of the bag."""
        first = self.store.jobs(bag_id, None, 1, job_id - 1)
        return bool(first) and first[0].job_id == job_id and first[0].state in (JobState.DONE, JobState.FAILED)

    # -- read-only accessors for /metrics (gridbot.server.metrics) -------------------------------------

    def commit_backlog(self) -> int:
        """Exchanges (and other events) decided and waiting for their commit: staged, or in the batch on the
        writer thread. A backlog that grows means the store cannot keep up with the dispatcher."""
        flight = self._flight
        return len(self._waiters) + (len(flight.waiters) if flight is not None and not flight.settled else 0)


def whole_number(text: str) -> int | None:
    """`text` as a number that ids, indices and counts can be (ASCII digits, below 2^63), else None.

    Python's int() also reads ' 7', '1_000' and other scripts' digits, and any length; the stores take
    64-bit integers only (a larger one was an OverflowError, a 500, on SQLite)."""
    if not (0 < len(text) <= 19 and text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if value < 2**63 else None


MAX_WHOLE = 2**63 - 1
"""The largest whole number a request may give (the stores' 64-bit integers)."""
_SIGNED_DIGITS = re.compile(r"[+-]?[0-9]+")


def query_whole_number(raw: str, key: str, least: int = 0) -> int:
    """Query parameter `key`'s text `raw` as a whole number from `least` to MAX_WHOLE; else BadRequest that says
    which it is: not a whole number at all (`1.5`, `1_000`), or one out of that range (`-5`, 2^63), as the
    two need different fixes."""
    value = whole_number(raw)
    if value is not None and value >= least:
        return value
    shown = f"{raw[:40]!r}" + ("..." if len(raw) > 40 else "")
    if _SIGNED_DIGITS.fullmatch(raw):
        digits = raw.lstrip("+-").lstrip("0")
        number = None if len(digits) > 19 else -int(digits or "0") if raw.startswith("-") else int(digits or "0")
        if number is not None and least <= number <= MAX_WHOLE:  # `+5`, `-0`, `0001`: in range, written otherwise
            raise BadRequest(f"query parameter {key}={shown} is written with a sign or leading zeros: give the "
                             f"number in digits alone, from {least} to {MAX_WHOLE}, like {number}")
        raise BadRequest(f"query parameter {key}={shown} is out of range: give a whole number from {least} to "
                         f"{MAX_WHOLE}")
    raise BadRequest(f"query parameter {key}={shown} is not a whole number: give one from {least} to {MAX_WHOLE}")


def _bag_key(ref: str | int) -> str | int | None:
    """What the store may be asked for a bag named or numbered `ref` in a request: an id below 2^63, or a name
    without NUL of at most 255 characters; None when `ref` can name no bag. (A 30-digit id overflowed SQLite's
    integers, a NUL is refused by PostgreSQL's text, and the stores read '²' as a number: 500s, issue 12.)"""
    if isinstance(ref, int):
        return ref
    if ref.isdigit():  # what the stores read as an id
        return whole_number(ref)
    return ref if 0 < len(ref) <= 255 and "\0" not in ref else None


def job_state(state: str | None) -> JobState | None:
    """A job state named in a request (None: every state); BadRequest names the known ones."""
    try:
        return JobState(state) if state else None
    except ValueError:
        raise BadRequest(f"unknown job state '{str(state)[:40]}'; use one of "
                         f"{', '.join(s.value for s in JobState)}") from None


def bag_info(row: BagRow) -> BagInfo:
    return BagInfo(row.bag_id, row.name, row.state.value, row.total, row.counts, row.created_at, row.finished_at,
                   row.spec_hash, row.spec.description, revision=row.revision)


def job_info(spec: BagSpec, job: JobRow) -> JobInfo:
    command = spec.render(job.index, job.line)[0]
    return JobInfo(job.job_id, job.index, job.state.value, command, job.failures, job.attempts, job.reason,
                   job.revision)

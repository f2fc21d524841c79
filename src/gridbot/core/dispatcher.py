"""The work-dispatch core: GridBot's events in, `Changes` out, with no I/O.

Events come in as method calls with the current time as an argument (`request_work`, `report`, `tick`,
`cancel_bag`, `retry`, `revise`, `set_policy`), and each returns the `Changes` it made; the caller makes
them durable. The core is split by what changes together:

- records.py: what the dispatcher holds (jobs, instances, bags, hosts);
- view.py: the read-only view that strategies, the overlay's planner and the server read;
- feeder.py: each bag's window of queued jobs read from the store, and bag parking;
- kernel.py: the only code that changes the records (send, report, lose, state changes);
- assign.py: Algorithm 1, which jobs a host that asks for work gets;
- strategy.py: what the core asks of a bag's strategies (`gridbot.schedulers` implements them);
- this module: the events, in the order each applies its steps.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec

from gridbot.core import feeder
from gridbot.core.assign import assign
from gridbot.core.changes import BagSnapshot, Changes, QueuedJob, Snapshot
from gridbot.core.config import DispatchConfig
from gridbot.core.diagnostics import deadline_before_timeout, held_back, stuck
from gridbot.core.feeder import FeedRequest
from gridbot.core.hosts import QUICK_FAILURE_S
from gridbot.core.kernel import Kernel
from gridbot.core.records import (
    BagRecord,
    Candidate,
    Ended,
    HostRecord,
    Instance,
    Job,
    PoolRecord,
    SplitMix,
    State,
    fetch_seconds,
    guarded,
)
from gridbot.core.strategy import Choice, LevelReport, Migration, QosReport, StrategyFactory
from gridbot.core.view import BagView, DispatchView
from gridbot.model.pools import PoolMonitor
from gridbot.model.records import Assignment, HostInfo, InstanceReport, Outcome, Verdict
from gridbot.model.spec import BagSpec, output_name_problem
from gridbot.model.states import (
    BAG_REOPEN,
    JOB_RETRY,
    JOB_TERMINAL,
    BagState,
    InstanceState,
    JobState,
    check_transition,
)
from gridbot.policy.evaluator import EMPTY_JOB, BagPolicies
from gridbot.policy.policies import compile_policies

MAX_TAIL = 64 * 1024
"""Characters of a report's stdout and stderr tails the server keeps (what a worker sends by default)."""
MAX_REASON = 2_000
"""Characters of a failure reason the server keeps."""

__all__ = ["Dispatcher", "FeedRequest", "WorkAnswer"]


@dataclass(frozen=True)
class WorkAnswer:
    """The answer to one work request: instances to run, instances to kill, and when to ask again."""

    assignments: list[Assignment]
    cancel: list[int]
    backoff: float
    refused: bool = False
    """It asked for work and the bags refused the host (`HostRecord.refused`): a pilot (`--leave-when-refused`,
    with an idle timeout) leaves now, so the overlay's next pilot may land where the bags' policies let it run
    (GridBot's pilot suicide, section 5: "the running client automatically commits suicide if it fails to
    obtain new jobs from the server")."""


class Dispatcher:
    """GridBot's work-dispatch logic over bags, jobs, instances and hosts held in memory.

    `strategies` makes each bag's tail strategy and placement from its spec (the server and the
    simulator pass `gridbot.schedulers.registry.factory`); the core never picks one itself.
    """

    def __init__(self, config: DispatchConfig, strategies: StrategyFactory,
                 timer: Callable[[], float] | None = None) -> None:
        """`timer`: a monotonic clock the bags' policies are timed with (`BagPolicies.timer`; the server's, never
        the simulator's, whose runs are functions of their seed)."""
        self.config = config
        self.timer = timer
        self._strategies = strategies
        self._s = State(config)
        self._k = Kernel(self._s)
        self.view: DispatchView = self._k.view
        """What strategies, the overlay's planner and the server read."""

    # -- what the server sets and reads ---------------------------------------------------------------

    @property
    def pool_ads(self) -> dict[str, dict[str, object]]:
        """Ads of the pools in the pools file: a host of such a pool gets only bags whose GridPolicy accepts it."""
        return self._s.pool_ads

    @pool_ads.setter
    def pool_ads(self, ads: dict[str, dict[str, object]]) -> None:
        self._s.pool_ads = ads
        for bag in self._s.bags.values():
            bag.pool_ok.clear()

    @property
    def pool_errors(self) -> dict[str, str]:
        """The last error of each pool that fails to start pilots (the overlay sets it)."""
        return self._s.pool_errors

    @pool_errors.setter
    def pool_errors(self, errors: dict[str, str]) -> None:
        self._s.pool_errors = errors

    def reseed(self, seed: int) -> None:
        """Seed the draws hosts must not predict (the quorum's spot checks); the server gives a secret one."""
        self._k.rng = SplitMix(seed)

    def monitor(self, pool: str, reading: PoolMonitor | None) -> None:
        """A new reading of a pool's own monitoring (None: it has none, or it failed): what the placements read
        through `DispatchView.monitor`."""
        if reading is None:
            self._s.monitors.pop(pool, None)
        else:
            self._s.monitors[pool] = reading

    @property
    def work_added(self) -> int:
        """Counts jobs made ready to send other than by the feeder's first fill (the server wakes the idle
        hosts it holds when it changes)."""
        return self._k.work_added

    # -- set-up ---------------------------------------------------------------------------------------

    def restore(self, snapshot: Snapshot) -> None:
        """Resume from what the store holds: active bags, their live instances, and known hosts."""
        k, s = self._k, self._s
        k.next_instance_id = snapshot.next_instance_id
        k.next_event_id = max(k.next_event_id, snapshot.next_event_id)
        for b in snapshot.bags:
            self.add_bag(b)
        for h in snapshot.hosts:
            restored = s.hosts[h.info.host_id] = HostRecord(h.info, h.first_seen, h.last_seen, h.stats,
                                                            contact=h.last_seen)
            k.watch(restored)
        s.ledger.restore(snapshot.usage)
        for row in snapshot.history:
            bag = s.bags.get(row.bag_id)
            if bag is not None:
                lost = row.state is InstanceState.OVERDUE
                bag.history[row.instance_id] = Ended(row.instance_id, row.sent_at, None if lost else row.ended_at,
                                                     row.state in (InstanceState.DONE, InstanceState.WASTED), row.pool)
        for li in snapshot.instances:
            if li.bag_id not in s.bags:
                continue
            job = s.jobs.get(li.job_id)
            if job is None:
                job = s.jobs[li.job_id] = Job(li.job_id, li.bag_id, li.job_index, li.job_line, li.job_state,
                                              li.job_failures, li.job_attempts)
            elif li.job_state is JobState.RUNNING and job.state is JobState.QUEUED:
                # the rows of one job may disagree: a store that did not write the send (JobUpdate.sent)
                # shows the job running only beside its running instance, not beside an overdue one
                job.state, job.attempts = JobState.RUNNING, li.job_attempts
            host = s.hosts.get(li.host_id)
            pool = host.info.pool if host is not None else ""
            inst = s.instances[li.instance_id] = Instance(li.instance_id, job, li.host_id, li.state, li.sent_at,
                                                          li.instance_deadline, pool)
            if li.state is InstanceState.RUNNING:
                s.running[li.instance_id] = inst
                counts = s.bags[li.bag_id].on_pool.setdefault(pool, [0, 0])
                counts[0] += 1
                counts[1] += 1
                job.live.add(li.instance_id)
                heapq.heappush(k.deadlines, (li.instance_deadline, li.instance_id))
                if host is not None:
                    host.running.add(li.instance_id)
                    host.unconfirmed.add(li.instance_id)  # the answer sending it may have died with the server
            else:
                job.overdue = (job.overdue or set()) | {li.instance_id}
        self._restore_votes(snapshot)
        k.check()

    def _restore_votes(self, snapshot: Snapshot) -> None:
        """The quorum jobs' results still waiting for their quorum count again, and each running quorum job gets
        the copies it lacks queued again (those queued and not sent died with the server). A job sent alone to a
        host of a trusted pool stays alone; one sent alone for its host's record (adaptive replication) gets a
        copy: whether its spot check applied is not stored, and a copy too many is the safe side."""
        k, s = self._k, self._s
        for v in snapshot.votes:
            if v.bag_id not in s.bags:
                continue
            job = s.jobs.get(v.job_id)
            if job is None:
                job = s.jobs[v.job_id] = Job(v.job_id, v.bag_id, v.job_index, v.job_line, v.job_state,
                                             v.job_failures, v.job_attempts)
            job.candidates = [*(job.candidates or ()),
                              Candidate(v.instance_id, v.host_id, k.account(v.host_id), v.vote, v.sent_at, v.cpu_s,
                                        v.ended_at)]
        for job in s.jobs.values():
            bag = s.bags.get(job.bag_id)
            if bag is None or bag.spec.quorum <= 1 or job.state is not JobState.RUNNING:
                continue
            if not job.candidates and len(job.live) == 1:
                host = s.hosts.get(s.instances[next(iter(job.live))].host_id)
                if host is not None and k.trusted(host):
                    job.single = host.info.host_id
                    continue
            k.want_copies(bag, job)

    def holds(self, host_id: str, bag_id: int) -> bool:
        """Whether the host runs (or holds) an instance of the bag now: it may then read the bag's inputs."""
        host = self._s.hosts.get(host_id)
        return host is not None and any(self._s.instances[i].job.bag_id == bag_id for i in host.running)

    def grace(self, now: float) -> None:
        """The server starts again after an absence of unknown length: no host is blamed for it. Every host
        counts as heard from now, and instances whose deadline passed meanwhile get the host timeout to
        report (their hosts kept running them, and may have results to hand in)."""
        for host in self._s.hosts.values():
            host.last_seen = max(host.last_seen, now)
        late = now + self.config.host_timeout
        for inst in self._s.running.values():
            inst.instance_deadline = max(inst.instance_deadline, late)
        self._k.deadlines = [(inst.instance_deadline, iid) for iid, inst in self._s.running.items()]
        heapq.heapify(self._k.deadlines)

    def shift(self, gap: float) -> None:
        """The server itself was not running for `gap` seconds (paused, or its loop blocked): hosts' silence
        and instances' deadlines do not count that time, since nobody could have reached the server."""
        for host in self._s.hosts.values():
            host.last_seen += gap
        for inst in self._s.running.values():
            inst.instance_deadline += gap
        self._k.deadlines = [(d + gap, iid) for d, iid in self._k.deadlines]

    def add_bag(self, bag: BagSnapshot) -> None:
        """Register a newly submitted (or restored) active bag; its jobs come through `feed`.

        Its policies and strategies must have been validated at submission (PolicyError, or the
        strategy registry's error, otherwise).
        """
        tail, placement = self._strategies(bag.bag_id, bag.spec)
        record = BagRecord(bag.bag_id, bag.spec, bag.counts, bag.created_at, _policies(bag.spec, self.timer), tail,
                           placement,
                           revision=bag.revision)
        _use_spec(record, bag.spec)
        self._s.bags[bag.bag_id] = record

    def set_policy(self, bag_id: int, spec: BagSpec, now: float) -> None:
        """Use a bag's changed policies from the next decision on (validated by the caller): every cached
        answer of the old ones is dropped (GridPolicy's per pool, the static Rank, the bag's ad)."""
        bag = self._s.bags[bag_id]
        old, bag.policies = bag.policies, _policies(spec, self.timer)
        if old.policies.texts == bag.policies.policies.texts:  # (a strategy or QoS change: as slow as they were)
            bag.policies.slow_s, bag.policies.set_aside = old.slow_s, old.set_aside
        _use_spec(bag, spec)
        bag.pool_ok.clear()
        bag.refusals.clear()  # pilots refused under the old policies say nothing of the new: send them again
        bag.short_deadline = None  # (deadlines shorter than the timeout: counted again under the new ones)
        bag.rank = None
        bag.dirty = True
        for job in bag.replicas:  # chosen under the old ReplicationRequirements: the next tick chooses again
            job.replica_pending, job.replica_pools = False, None
        bag.replicas.clear()
        if bag.window.parked_until is not None:  # parked for matching nobody under the old policies
            feeder.wake(bag.window, now)

    def set_strategy(self, bag_id: int, spec: BagSpec, now: float) -> None:
        """Use a bag's changed `[strategy]` from the next decision on (validated by the caller): its strategies
        are made anew from the spec, knowing nothing of what the old ones learnt, and every cached answer and
        chosen replica is dropped as for a policy change."""
        bag = self._s.bags[bag_id]
        bag.tail_strategy, bag.placement = self._strategies(bag_id, spec)
        bag.ranks_hosts = bag.placement.host_dependent
        bag.places_jobs = bag.placement.places_jobs
        self.set_policy(bag_id, spec, now)

    def diagnostics(self, bag_id: int, now: float) -> list[str]:
        """Why an active bag is not moving, if it is not, and policies that evaluated to UNDEFINED or ERROR,
        as sentences for its owner (of an ended bag: its policies' and strategies', as it ended)."""
        bag = self._s.bags.get(bag_id)
        if bag is None:
            return list(self._s.ended_notes.get(bag_id, ()))
        none: list[str] = []
        notes = [*guarded(bag, f"tail={bag.tail_strategy.name} notes", none, bag.tail_strategy.notes, self.view,
                          BagView(bag), now),
                 *guarded(bag, f"placement={bag.placement.name} notes", none, bag.placement.notes, self.view,
                          BagView(bag), now)]
        failed = [bag.strategy_error] if bag.strategy_error else []
        return [*stuck(self._s, bag, now), *held_back(self._s, bag, now), *notes, *bag.policies.messages(), *failed,
                *deadline_before_timeout(bag)]

    def level(self, bag_id: int, now: float) -> LevelReport | None:
        """Where the execution hierarchy holds an active bag (None: its placement has no levels)."""
        bag = self._s.bags.get(bag_id)
        if bag is None:
            return None
        return guarded(bag, f"placement={bag.placement.name} level", None, bag.placement.level, self.view,
                       BagView(bag), now)

    def qos(self, bag_id: int, now: float) -> QosReport | None:
        """An active bag's deadline and budget as its placement plans them (None: it does not, or the bag is
        not active here)."""
        bag = self._s.bags.get(bag_id)
        if bag is None:
            return None
        return guarded(bag, f"placement={bag.placement.name} qos", None, bag.placement.qos, self.view, BagView(bag),
                       now)

    # -- the feeder -----------------------------------------------------------------------------------

    def needs_feed(self) -> list[FeedRequest]:
        """Which bags' windows want refilling from the store, and by how much."""
        active = [b for b in self._s.bags.values() if b.state is BagState.ACTIVE]
        return feeder.needs_feed(active, self.config.buffer_size)

    def feed(self, bag_id: int, jobs: Sequence[QueuedJob], limit: int) -> None:
        """Put queued jobs read from the store into the bag's window (fewer than `limit`: no more left)."""
        bag = self._s.bags.get(bag_id)
        if bag is None or bag.state is not BagState.ACTIVE:
            return
        feeder.fill(bag.window, jobs, self._s.jobs, lambda q: Job(q.job_id, bag_id, q.index, q.line, JobState.QUEUED,
                                                                   q.failures, q.attempts), limit)

    # -- hosts' events --------------------------------------------------------------------------------

    def request_work(self, info: HostInfo, want: int, running: Iterable[int], now: float,
                     reports: Sequence[InstanceReport] = (), fetched: tuple[int, float] = (0, 0.0),
                     verdicts: Mapping[int, Verdict] | None = None) -> tuple[WorkAnswer, Changes]:
        """A host's exchange: its reports, the instances it still runs, and a request for `want` more; with the
        input bytes it downloaded since its last exchange and the seconds that took (its pool's bandwidth).
        `verdicts`: for reported results of quorum jobs whose bag names a validator, what the server's validator
        found: the vote (`JobView.votes`) of the results each is equivalent to (None: a vote of its own), and a
        note for the instance's story.

        Instances the server believes run on this host but that the host neither runs nor reports
        were lost: they count as failures when the worker restarted (another session), and not when the
        answer that sent them never reached it (see `HostRecord.unconfirmed`).
        """
        k = self._k
        changes = k.begin("request", info.host_id, now)
        known = self._s.hosts.get(info.host_id)
        same_run = bool(info.session) and (known is None or known.info.session in ("", info.session))
        host = k.touch_host(info, now)
        counted = fetch_seconds(*fetched)
        if counted:
            pool = self._s.pools.setdefault(info.pool, PoolRecord())
            pool.fetched_bytes += fetched[0]
            pool.fetch_s += counted
        self._report(info.host_id, reports, now, changes, verdicts)
        still = set(running)
        for iid in sorted(host.running - still):
            if same_run and iid in host.unconfirmed:
                k.undelivered(self._s.instances[iid], now, changes)
            else:
                k.lose(self._s.instances[iid], now, f"lost by host {info.name}: the worker no longer has it", changes)
        host.late = still - host.running
        assignments = assign(k, host, min(want, max(self.config.max_assign, host.info.slots)), now, changes)
        host.unconfirmed = {a.instance_id for a in assignments}
        cancel = sorted(host.cancel & still)
        host.cancel.clear()
        backoff = self._backoff(host, bool(assignments))
        k.emit_host(host, changes)
        return WorkAnswer(assignments, cancel, backoff, host.refused), k.seal(changes)

    def _backoff(self, host: HostRecord, served: bool) -> float:
        """Seconds the host waits before it asks again: none when served; doubling from `backoff_idle` to
        `backoff_max` while bags are active and it gets nothing; `backoff_empty` when no bag is active."""
        cfg = self.config
        if served:
            host.empty_answers = 0
            return 0.0
        if not any(b.state is BagState.ACTIVE for b in self._s.bags.values()):
            return cfg.backoff_empty
        backoff = min(cfg.backoff_max, cfg.backoff_idle * 2.0 ** min(host.empty_answers, 16))
        host.empty_answers += 1
        return backoff

    def report(self, host_id: str, reports: Sequence[InstanceReport], now: float) -> Changes:
        """Instances that ended on host `host_id`, reported without a request for work."""
        changes = self._k.begin("report", host_id, now)
        self._report(host_id, reports, now, changes)
        return self._k.seal(changes)

    def _report(self, host_id: str, reports: Sequence[InstanceReport], now: float, changes: Changes,
                verdicts: Mapping[int, Verdict] | None = None) -> None:
        """Apply reports; those of unknown instances are ignored, those of another host's refused.

        A report may arrive twice (the host retried after a lost answer): the second is ignored, since
        the instance has already left the dispatcher.
        """
        for r in reports:
            inst = self._s.instances.get(r.instance_id)
            if inst is None:
                continue
            if inst.host_id != host_id:
                self._k.refuse(host_id, changes)
                continue
            problem = self._report_problem(inst, r)
            if problem:
                r = InstanceReport(r.instance_id, Outcome.FAILURE, r.exit_code, r.wall_s, r.cpu_s, problem,
                                   r.stdout_tail[-4096:], r.stderr_tail[-4096:])
            elif len(r.reason) > MAX_REASON or len(r.stdout_tail) > MAX_TAIL or len(r.stderr_tail) > MAX_TAIL:
                r = msgspec.structs.replace(r, reason=r.reason[:MAX_REASON], stdout_tail=r.stdout_tail[-MAX_TAIL:],
                                            stderr_tail=r.stderr_tail[-MAX_TAIL:])
            self._k.end(inst, r, now, changes, verdicts.get(r.instance_id) if verdicts and not problem else None)

    def _report_problem(self, inst: Instance, r: InstanceReport) -> str:
        """Why a successful report cannot be kept as it is: too large, outputs the bag did not declare, or a
        declared one missing (a success without it is none, docs/spec.md: the worker and the volunteer side
        fail such a job, and the server does not take a host's word for it)."""
        if r.outcome is not Outcome.SUCCESS:
            return ""
        bag = self._s.bags[inst.job.bag_id]
        expected = bool(bag.spec.outputs) and inst.job.state not in JOB_TERMINAL  # (a late replica's is wasted)
        if not (r.outputs or r.stdout_tail or r.stderr_tail or expected):
            return ""
        limit = self.config.max_result_bytes
        if r.result_bytes > limit:
            return (f"result of {r.result_bytes:,} bytes is over the server's limit of {limit:,} bytes "
                    "(server option --max-result-size)")
        if not (r.outputs or expected):
            return ""
        assert bag.render is not None
        declared = bag.render(inst.job.index, inst.job.line)[2]
        extra = sorted(set(r.outputs) - set(declared))
        if extra:
            return f"the host returned outputs the bag did not declare: {', '.join(n[:60] for n in extra[:5])}"
        missing = [name for name in declared if name not in r.outputs]
        if missing and expected:
            return (f"the host reported success without the declared output '{missing[0][:100]}'"
                    + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
        bad = [problem for name in r.outputs if (problem := output_name_problem(name))]
        return bad[0] if bad else ""

    # -- time -----------------------------------------------------------------------------------------

    def tick(self, now: float) -> Changes:
        """Periodic work: instances past their deadline and instances of silent hosts become overdue;
        windows are parked; the bags' strategies choose replicas and moves."""
        k, s = self._k, self._s
        changes = k.begin("tick", "", now)
        while k.deadlines and k.deadlines[0][0] < now:
            _, iid = heapq.heappop(k.deadlines)
            inst = s.instances.get(iid)
            if inst is not None and inst.state is InstanceState.RUNNING:
                k.lose(inst, now, f"instance deadline passed ({now - inst.sent_at:.0f} s after it was sent)", changes)
        horizon = now - self.config.host_timeout
        while k.silence and k.silence[0][0] < horizon:
            _, _, host = heapq.heappop(k.silence)
            host.watched = False
            if host.last_seen >= horizon:
                k.watch(host)
                continue
            s.live_hosts.pop(host.info.host_id, None)
            for iid in sorted(host.running):
                k.lose(s.instances[iid], now, f"host {host.info.name} silent for {now - host.last_seen:.0f} s",
                       changes)
        s.busy = self._busy_hosts(now)
        for bag in s.bags.values():  # the overlay judges GridPolicy on the bag's ad, also before any host asked
            k.refresh(bag, now, len(s.bags))
        feeder.park(s.bags.values(), now, self.config.buffer_ttl)
        self._replicate(now, changes)
        self._migrate(now, changes)
        return k.seal(changes)

    def _busy_hosts(self, now: float) -> tuple[str, ...]:
        """Two hosts running an instance for longer than a quick failure takes (oldest instances first,
        so this usually stops after a few)."""
        cutoff = now - QUICK_FAILURE_S
        found: list[str] = []
        for inst in self._s.running.values():  # in the order they were sent
            if inst.sent_at >= cutoff:
                break
            if inst.host_id not in found:
                found.append(inst.host_id)
                if len(found) == 2:
                    break
        return tuple(found)

    def _replicate(self, now: float, changes: Changes) -> None:
        """Each bag with running (or re-queued) jobs asks its tail strategy for replicas (GridBot's: Algorithm 2),
        within `replica_queue` waiting and `max_replicas` out per job. A choice of a re-queued job with pools
        routes it: it waits for a host of those pools (ExPERT sends a task's next instance where N says)."""
        k, s = self._k, self._s
        with_running = {j.bag_id for j in s.jobs.values() if j.state is JobState.RUNNING and j.live}
        with_running.update(b.bag_id for b in s.bags.values() if b.retry)
        for bag_id in sorted(with_running):
            bag = s.bags[bag_id]
            room = self.config.replica_queue - len(bag.replicas)
            if room <= 0:
                continue
            k.refresh(bag, now, len(s.bags))
            chosen: Sequence[Choice] = guarded(bag, f"tail={bag.tail_strategy.name} replicas", (),
                                               bag.tail_strategy.replicas, self.view, BagView(bag), room, now)
            for job_id, why, pools in list(chosen)[:room]:
                job = s.jobs.get(job_id)
                if job is not None and job.bag_id == bag_id and job.state is JobState.QUEUED and pools:
                    if job.pools != pools:
                        job.pools, job.routed = pools, True
                        k.decide(changes, job, f"tail={bag.tail_strategy.name}", "route",
                                 f"{why} (on {', '.join(sorted(pools))})")
                    continue
                if (job is None or job.bag_id != bag_id or job.state is not JobState.RUNNING or not job.live
                        or job.replica_pending or len(job.live) >= self.config.max_replicas):
                    continue
                job.replica_pending = True
                job.replica_pools = pools
                bag.replicas.append(job)
                k.work_added += 1
                where = f" (on {', '.join(sorted(pools))})" if pools else ""
                k.decide(changes, job, f"tail={bag.tail_strategy.name}", "replicate", why + where)

    def _migrate(self, now: float, changes: Changes) -> None:
        """Each bag's placement may move jobs to other pools: their instances are withdrawn, no failure
        counted, and they are queued again for hosts of those pools only."""
        k, s = self._k, self._s
        for bag in list(s.bags.values()):
            end: str | None = guarded(bag, f"placement={bag.placement.name} terminate", None,
                                      bag.placement.terminate, self.view, BagView(bag), now)
            if end is not None and not bag.closing:
                self._end_bag(bag, f"ended by placement={bag.placement.name}: {end}", now, changes)
                continue
            moves: Sequence[Migration] = guarded(bag, f"placement={bag.placement.name} migrate", (),
                                                 bag.placement.migrate, self.view, BagView(bag), now)
            held: dict[int, Job] | None = None
            for job_id, pools, why in list(moves):
                job = s.jobs.get(job_id)
                if job is None:  # a job of the window, not sent yet
                    if held is None:
                        held = {j.job_id: j for queue in (bag.retry, bag.window.buffer) for j in queue}
                    job = held.get(job_id)
                if job is None or job.bag_id != bag.bag_id or job.state in JOB_TERMINAL:
                    continue
                job.pools = pools
                k.decide(changes, job, f"placement={bag.placement.name}", "migrate",
                         f"to {', '.join(sorted(pools))}: {why}")
                k.withdraw(job, now, f"moved to {', '.join(sorted(pools))} by its placement", changes)
                if bag.state is not BagState.ACTIVE:
                    return

    # -- owners' acts ---------------------------------------------------------------------------------

    def cancel_bag(self, bag_id: int, now: float) -> Changes:
        """Cancel an active bag: its queued and running jobs are cancelled, its hosts told to kill them."""
        k = self._k
        changes = k.begin("cancel", str(bag_id), now)
        bag = self._s.bags.get(bag_id)
        if bag is None or bag.state is not BagState.ACTIVE:
            return k.seal(changes)
        self._end_bag(bag, "bag cancelled", now, changes)
        return k.seal(changes)

    def _end_bag(self, bag: BagRecord, reason: str, now: float, changes: Changes) -> None:
        """Cancel the bag's queued and running jobs (its hosts are told to kill them) and close it, cancelled;
        its results stay."""
        k = self._k
        bag.closing = True
        held = [j for j in self._s.jobs.values() if j.bag_id == bag.bag_id]
        for job in held + list(bag.window.buffer) + list(bag.retry) + list(bag.failover):
            if job.state not in JOB_TERMINAL:
                k.finish_job(job, JobState.CANCELLED, reason, now, changes)
        bag.counts.cancelled += bag.counts.queued
        bag.counts.queued = 0
        changes.cancelled_bags.append(bag.bag_id)
        k.close_bag(bag, BagState.CANCELLED, now, changes)

    def retry(self, bag: BagSnapshot, state: BagState, failed: Sequence[QueuedJob], now: float) -> Changes:
        """The owner queues failed jobs of a bag again (`JOB_RETRY`), each with its failure count reset so
        `max_failures` applies afresh; an ended bag is active again (`BAG_REOPEN`).

        `bag` and `state` are as stored, and `failed` are jobs the store holds as failed for good: the caller
        has flushed every staged change first. The jobs lie behind the window's cursor, so the window is read
        again from the start; the feeder finds them once these changes are durable.
        """
        k = self._k
        changes = k.begin("retry", str(bag.bag_id), now)
        held = self._s.bags.get(bag.bag_id)
        if held is None:
            check_transition(BAG_REOPEN, state, BagState.ACTIVE)
            self.add_bag(bag)
            held = self._s.bags[bag.bag_id]
            changes.reopened_bags.append(bag.bag_id)
        ids = {q.job_id for q in failed}
        for iid in [i for i, inst in self._s.instances.items() if inst.job.job_id in ids]:
            del self._s.instances[iid]  # overdue instances of the failed run: a late report of one is ignored
        changes.retired_jobs.extend(sorted(ids))  # and in the store, where a restart would find them
        for q in failed:
            # a quorum's max_instances counts the instances of this try (a job that failed for want of a quorum
            # would otherwise fail again at its first result)
            attempts = 0 if held.spec.quorum > 1 else q.attempts
            job = Job(q.job_id, bag.bag_id, q.index, q.line, JobState.FAILED, 0, attempts)
            check_transition(JOB_RETRY, job.state, JobState.QUEUED)
            held.counts.failed -= 1
            held.counts.queued += 1
            job.state = JobState.QUEUED
            k.emit_job(job, changes)
        self._wake(held, now)
        return k.seal(changes)

    def revise(self, bag_id: int, spec: BagSpec, revision: int, lines: Sequence[str] | None, now: float) -> Changes:
        """A new revision of a bag's spec (and, for an each-line bag, new commands for its jobs not done).

        Jobs without a result run the new command: running ones are withdrawn from their hosts (killed there,
        as a cancel does) and queued again, which counts as no failure; done jobs keep their results. A bag
        that has ended is not held here, and `retry` brings it back with its new spec.
        """
        k = self._k
        changes = k.begin("revise", str(bag_id), now)
        bag = self._s.bags.get(bag_id)
        if bag is None:
            return k.seal(changes)
        self.set_policy(bag_id, spec, now)  # (which drops the replicas chosen for the old command's instances)
        bag.revision = revision
        for iid in [i for i, inst in self._s.instances.items()
                    if inst.job.bag_id == bag_id and inst.state is InstanceState.OVERDUE]:
            inst = self._s.instances.pop(iid)  # a late result of the old command is not wanted now
            k.detach(inst)
            changes.retired_jobs.append(inst.job.job_id)
        held = [j for j in self._s.jobs.values() if j.bag_id == bag_id]
        for job in [*held, *bag.retry, *bag.failover]:
            job.candidates, job.single = None, ""  # a quorum's votes were for the old command
        for job in held:
            k.withdraw(job, now, f"the bag was revised (revision {revision})", changes)
        if lines is not None:
            for job in [*held, *bag.retry, *bag.failover]:
                job.line = lines[job.index]
        self._wake(bag, now)
        return k.seal(changes)

    def _wake(self, bag: BagRecord, now: float) -> None:
        """After its owner re-queued jobs of the bag: read its window again, end a parking, wake idle hosts."""
        feeder.wake(bag.window, now)
        bag.last_sent = now
        self._k.work_added += 1
        self._k.emit_bag(bag)


def _policies(spec: BagSpec, timer: Callable[[], float] | None) -> BagPolicies:
    job = {**EMPTY_JOB, "Cpus": spec.cpus, "Memory": (spec.memory or 0) >> 20}
    return BagPolicies(compile_policies(spec.policy, spec.instance_deadline), spec.instance_deadline, job,
                       timer=timer)


def _use_spec(bag: BagRecord, spec: BagSpec) -> None:
    """What the bag's assignments carry, made once per spec."""
    bag.spec = spec
    bag.input_names = [p.rstrip("/").rsplit("/", 1)[-1] for p in spec.inputs]
    bag.render = spec.renderer()
    bag.limits = spec.limits()

"""The work-dispatch core: GridBot's scheduling buffer, assignment and instance deadlines, with no I/O.

Events come in as method calls with the current time as an argument (`request_work`, `report`,
`tick`, `cancel_bag`), and each returns the `Changes` it made; the caller makes them durable. The
dispatcher holds only what a decision needs: per-bag counters, a window of queued jobs per bag (the
paper's feeder buffer, refilled through `needs_feed`/`feed`), the running and overdue instances, and
the hosts. Queued jobs that are not in the window stay in the store, so a bag of ten million jobs
costs the dispatcher a window, not ten million objects.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from gridbot.core.changes import (
    BagCounts,
    BagSnapshot,
    BagUpdate,
    Changes,
    HostUpdate,
    InstanceUpdate,
    JobUpdate,
    NewInstance,
    QueuedJob,
    Snapshot,
)
from gridbot.core.config import DispatchConfig
from gridbot.core.hosts import QUICK_FAILURE_S, HostStats
from gridbot.model.records import Assignment, HostInfo, InstanceReport, Limits, Outcome
from gridbot.model.spec import BagSpec, output_name_problem
from gridbot.model.states import (
    BAG_REOPEN,
    INSTANCE_TRANSITIONS,
    JOB_RETRY,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    BagState,
    InstanceState,
    JobState,
    check_transition,
)
from gridbot.policy.evaluator import BagPolicies, HostAd, host_ad
from gridbot.policy.policies import compile_policies

MAX_TAIL = 64 * 1024
"""Characters of a report's stdout and stderr tails the server keeps (what a worker sends by default)."""
STUCK_AFTER = 10.0
"""Seconds a bag with queued jobs waits with none running before it says why (`Dispatcher.diagnostics`)."""
MAX_REASON = 2_000
"""Characters of a failure reason the server keeps."""


@dataclass(slots=True)
class _Job:
    """A job the dispatcher currently holds: in a bag's window, running, or waiting for a late report."""

    job_id: int
    bag_id: int
    index: int
    line: str | None
    state: JobState
    failures: int = 0
    attempts: int = 0
    live: set[int] = field(default_factory=set)
    overdue: set[int] | None = None
    in_buffer: bool = False
    reason: str = ""
    quick_failures: list[str] | None = None
    """Hosts that failed this job right after starting it: blamed if another host then does it."""
    replica_pending: bool = False
    failed_on: dict[str, float] | None = None
    """When the job last failed on each host (the three are made on first use: most jobs never fail, and a
    window of twenty thousand jobs paid for them all)."""


@dataclass(slots=True)
class _Instance:
    instance_id: int
    job: _Job
    host_id: str
    state: InstanceState
    sent_at: float
    instance_deadline: float


@dataclass
class _Bag:
    bag_id: int
    spec: BagSpec
    counts: BagCounts
    created_at: float
    policies: BagPolicies
    state: BagState = BagState.ACTIVE
    tail: bool = False
    dirty: bool = True
    """Counters changed since the bag's ad was last refreshed."""
    seen_active: int = 0
    rank: float | None = None
    """The bag's static Rank, while its ad is unchanged."""
    failover: deque[_Job] = field(default_factory=deque)
    """Jobs that failed `failover_after` times, for reliable hosts only."""
    last_match: float | None = None
    last_sent: float = 0.0
    """When an instance of the bag was last sent (a bag idle since long enough says why)."""
    parked_until: float | None = None
    pool_ok: dict[str, bool] = field(default_factory=dict)
    """GridPolicy's answer per pool, while the bag's ad is unchanged."""
    buffer: deque[_Job] = field(default_factory=deque)
    retry: deque[_Job] = field(default_factory=deque)
    """Re-queued jobs, oldest first; served before the window."""
    replicas: deque[_Job] = field(default_factory=deque)
    """Running jobs chosen for one more instance (Algorithm 2), served after the queued jobs."""
    run_time_sum: float = 0.0
    good_results: int = 0
    """Seconds from send to result summed over the good results seen since the server started, and their
    number: `Bag.MeanRunTime`, which the default replication policy compares a straggler with."""
    cursor: int = 0
    exhausted: bool = False
    touched: int = 0
    """The highest job id whose state the dispatcher changed: while the cursor is past it, what the store
    lists after the cursor is untouched here, so the feeder needs no flush of staged changes first."""
    input_names: list[str] = field(default_factory=list)
    """File names of the spec's inputs, as every assignment carries them."""
    render: Callable[[int, str | None], tuple[str, dict[str, str], list[str]]] | None = None
    """The spec's renderer (BagSpec.renderer), made once per spec."""
    limits: Limits | None = None
    """The spec's resource limits (BagSpec.limits), made once per spec and sent with every assignment."""
    revision: int = 1
    """The spec's revision (BagSnapshot.revision), sent with every assignment."""


@dataclass
class _Host:
    info: HostInfo
    first_seen: float
    last_seen: float
    stats: HostStats = field(default_factory=HostStats)
    running: set[int] = field(default_factory=set)
    cancel: set[int] = field(default_factory=set)
    unconfirmed: set[int] = field(default_factory=set)
    """Instances sent in the last answer (or restored after a restart) that the host has not yet listed as
    held: if the next exchange of the same worker run (HostInfo.session) does not list them, the answer
    never reached it, and nobody is blamed. A restarted worker (another session) lost them: they count."""
    watched: bool = False
    """The host has an entry in the dispatcher's silence heap."""
    empty_answers: int = 0
    """Answers in a row with nothing to run, while bags were active (sets the backoff)."""
    ad: HostAd | None = None
    ad_attrs: dict[str, object] = field(default_factory=dict)
    """The attributes `ad` was last written with: only changed ones are written again."""


@dataclass(frozen=True)
class FeedRequest:
    """Ask the store for up to `limit` queued jobs of `bag_id` with ids above `after`."""

    bag_id: int
    after: int
    limit: int
    stale: bool = False
    """Jobs above `after` have changed here (after a restore or a parked window): the store must have every
    staged change before it is read, or it could list as queued a job already sent or ended."""


@dataclass(frozen=True)
class WorkAnswer:
    """The answer to one work request: instances to run, instances to kill, and when to ask again."""

    assignments: list[Assignment]
    cancel: list[int]
    backoff: float


class Dispatcher:
    """GridBot's work-dispatch logic over bags, jobs, instances and hosts held in memory."""

    def __init__(self, config: DispatchConfig | None = None) -> None:
        self.config = config or DispatchConfig()
        self.bags: dict[int, _Bag] = {}
        self.jobs: dict[int, _Job] = {}
        self.instances: dict[int, _Instance] = {}
        self._running: dict[int, _Instance] = {}
        """The running instances alone, oldest first (overdue ones, which may wait long for a late
        report, stay only in `instances`)."""
        self.hosts: dict[str, _Host] = {}
        self.next_instance_id = 1
        self._deadlines: list[tuple[float, int]] = []
        self._rng = _SplitMix(self.config.seed)
        self.pool_ads: dict[str, dict[str, object]] = {}
        """Ads of the pools in the pools file: a host of such a pool gets only bags whose GridPolicy accepts it."""
        self.live_hosts: dict[str, _Host] = {}
        """Hosts heard from within host_timeout, as of the last tick (or since)."""
        self.pool_errors: dict[str, str] = {}
        """The last error of each pool that fails to start pilots (the overlay sets it)."""
        self._silence: list[tuple[float, str, _Host]] = []
        """(last time seen, id, host): at most one entry per live host, so a tick finds the silent ones
        without walking every host ever seen."""
        self._busy: tuple[str, ...] = ()
        """Up to two hosts that, at the last tick, ran an instance past the quick-failure window."""
        self._good: list[tuple[float, str]] = []
        """When the last two distinct hosts produced a good result, newest first (for black-hole detection)."""
        self.work_added = 0
        """Counts jobs made ready to send other than by the feeder's first fill: re-queued jobs and replicas
        (the server wakes idle hosts it holds when it changes)."""
        self._touched: dict[int, _Bag] = {}
        """Bags whose counters changed during the current event: their update is written once, at its end
        (a bundle of a thousand instances used to copy the counters a thousand times)."""

    # -- set-up ---------------------------------------------------------------------------------------

    def restore(self, snapshot: Snapshot) -> None:
        """Resume from what the store holds: active bags, their live instances, and known hosts."""
        self.next_instance_id = snapshot.next_instance_id
        for b in snapshot.bags:
            self.add_bag(b)
        for h in snapshot.hosts:
            restored = self.hosts[h.info.host_id] = _Host(h.info, h.first_seen, h.last_seen, h.stats)
            self._watch(restored)
        for li in snapshot.instances:
            if li.bag_id not in self.bags:
                continue
            job = self.jobs.get(li.job_id)
            if job is None:
                job = _Job(li.job_id, li.bag_id, li.job_index, li.job_line, li.job_state,
                           li.job_failures, li.job_attempts)
                self.jobs[li.job_id] = job
            elif li.job_state is JobState.RUNNING and job.state is JobState.QUEUED:
                # the rows of one job may disagree: a store that did not write the send (JobUpdate.sent)
                # shows the job running only beside its running instance, not beside an overdue one
                job.state, job.attempts = JobState.RUNNING, li.job_attempts
            inst = _Instance(li.instance_id, job, li.host_id, li.state, li.sent_at, li.instance_deadline)
            self.instances[li.instance_id] = inst
            if li.state is InstanceState.RUNNING:
                self._running[li.instance_id] = inst
                job.live.add(li.instance_id)
                heapq.heappush(self._deadlines, (li.instance_deadline, li.instance_id))
                host = self.hosts.get(li.host_id)
                if host is not None:
                    host.running.add(li.instance_id)
                    host.unconfirmed.add(li.instance_id)  # the answer sending it may have died with the server
            else:
                job.overdue = (job.overdue or set()) | {li.instance_id}
        self._check()

    def holds(self, host_id: str, bag_id: int) -> bool:
        """Whether the host runs (or holds) an instance of the bag now: it may then read the bag's inputs."""
        host = self.hosts.get(host_id)
        return host is not None and any(self.instances[i].job.bag_id == bag_id for i in host.running)

    def grace(self, now: float) -> None:
        """The server starts again after an absence of unknown length: no host is blamed for it. Every host
        counts as heard from now, and instances whose deadline passed meanwhile get the host timeout to
        report (their hosts kept running them, and may have results to hand in)."""
        for host in self.hosts.values():
            host.last_seen = max(host.last_seen, now)
        late = now + self.config.host_timeout
        for inst in self._running.values():
            inst.instance_deadline = max(inst.instance_deadline, late)
        self._deadlines = [(inst.instance_deadline, iid) for iid, inst in self._running.items()]
        heapq.heapify(self._deadlines)

    def shift(self, gap: float) -> None:
        """The server itself was not running for `gap` seconds (paused, or its loop blocked): hosts' silence
        and instances' deadlines do not count that time, since nobody could have reached the server."""
        for host in self.hosts.values():
            host.last_seen += gap
        for inst in self._running.values():
            inst.instance_deadline += gap
        self._deadlines = [(d + gap, iid) for d, iid in self._deadlines]

    def add_bag(self, bag: BagSnapshot) -> None:
        """Register a newly submitted (or restored) active bag; its jobs come through `feed`.

        Its policies must have been validated at submission (PolicyError otherwise).
        """
        policies = BagPolicies(compile_policies(bag.spec.policy, bag.spec.instance_deadline),
                               bag.spec.instance_deadline)
        self.bags[bag.bag_id] = _Bag(bag.bag_id, bag.spec, bag.counts, bag.created_at, policies,
                                     input_names=_input_names(bag.spec), render=bag.spec.renderer(),
                                     limits=bag.spec.limits(), revision=bag.revision)

    def set_policy(self, bag_id: int, spec: BagSpec) -> None:
        """Use a bag's changed policies from the next decision on (validated by the caller)."""
        bag = self.bags[bag_id]
        bag.spec = spec
        bag.input_names = _input_names(spec)
        bag.render = spec.renderer()
        bag.limits = spec.limits()
        bag.policies = BagPolicies(compile_policies(spec.policy, spec.instance_deadline), spec.instance_deadline)
        bag.pool_ok.clear()  # GridPolicy's answers per pool were the old policy's
        bag.rank = None
        bag.dirty = True

    def diagnostics(self, bag_id: int, now: float) -> list[str]:
        """Why an active bag is not moving, if it is not, and policies that evaluated to UNDEFINED or ERROR,
        as sentences for its owner."""
        bag = self.bags.get(bag_id)
        if bag is None:
            return []
        return [*self._stuck(bag, now), *bag.policies.messages()]

    def _stuck(self, bag: _Bag, now: float) -> list[str]:
        """What keeps a bag with queued jobs and none running from being served: no host, no host its
        policies accept (with the closest one and the clause that failed), or pools that fail."""
        if bag.state is not BagState.ACTIVE or not bag.counts.queued or bag.counts.running:
            return []
        if now - max(bag.created_at, bag.last_sent) < STUCK_AFTER:
            return []  # a bag just submitted, or served a moment ago, is not stuck yet
        failing = [f"pool {name} cannot start pilots: {error}" for name, error in sorted(self.pool_errors.items())
                   if name in self.pool_ads and self._accepts(bag, name, self.pool_ads[name])]
        hosts = list(self.live_hosts.values())
        if not hosts:
            how = "the server's pools start none yet" if self.pool_ads else "start `gridbot worker` on a machine, " \
                  "or give the server a pools file (--pools) to start pilots"
            return [f"no worker is connected: {how}", *failing]
        refused: list[tuple[int, str, str]] = []
        starved = 0
        for host in hosts[:1000]:
            ad = self._host_ad(host, now)
            pool_ad = self.pool_ads.get(host.info.pool)
            if pool_ad is not None and not self._accepts(bag, host.info.pool, pool_ad):
                refused.append((0, host.info.name, f"GridPolicy {bag.policies.policies.texts['GridPolicy']!r} "
                                                   f"refuses its pool {host.info.pool}"))
            elif not bag.policies.matches(ad):
                clause = bag.policies.failing_clause("JobRequirements", ad)
                refused.append((1, host.info.name, f"JobRequirements fails on `{clause}`"))
            elif bag.policies.bundle(ad)[0] <= 0:
                starved += 1
        if len(refused) == len(hosts):
            _, name, why = max(refused)
            return [f"none of the {len(hosts)} connected hosts matches the bag's policies; the closest, {name}: "
                    f"{why}", *failing]
        if starved and starved + len(refused) == len(hosts):
            return [f"Concurrency evaluates to 0 or less on every host the bag matches (policy Concurrency = "
                    f"{bag.policies.policies.texts['Concurrency']!r}): no host may hold one of its jobs", *failing]
        return failing

    # -- the feeder -----------------------------------------------------------------------------------

    def needs_feed(self) -> list[FeedRequest]:
        """Which bags' windows want refilling from the store, and by how much."""
        active = [b for b in self.bags.values() if b.state is BagState.ACTIVE and b.parked_until is None]
        if not active:
            return []
        share = max(1, self.config.buffer_size // len(active))
        return [
            FeedRequest(b.bag_id, b.cursor, share - len(b.buffer), b.touched > b.cursor)
            for b in active
            if not b.exhausted and len(b.buffer) < share // 2
        ]

    def feed(self, bag_id: int, jobs: Sequence[QueuedJob], limit: int) -> None:
        """Put queued jobs read from the store into the bag's window (fewer than `limit`: no more left)."""
        bag = self.bags.get(bag_id)
        if bag is None or bag.state is not BagState.ACTIVE:
            return
        for q in jobs:
            bag.cursor = max(bag.cursor, q.job_id)
            job = self.jobs.get(q.job_id)
            if job is None:
                job = _Job(q.job_id, bag_id, q.index, q.line, JobState.QUEUED, q.failures, q.attempts)
            elif job.state is not JobState.QUEUED or job.in_buffer:
                continue
            job.in_buffer = True
            bag.buffer.append(job)
        if len(jobs) < limit:
            bag.exhausted = True

    # -- events ---------------------------------------------------------------------------------------

    def request_work(self, info: HostInfo, want: int, running: Iterable[int], now: float,
                     reports: Sequence[InstanceReport] = ()) -> tuple[WorkAnswer, Changes]:
        """A host's exchange: its reports, the instances it still runs, and a request for `want` more.

        Instances the server believes run on this host but that the host neither runs nor reports
        were lost: they count as failures when the worker restarted (another session), and not when the
        answer that sent them never reached it (see `_Host.unconfirmed`).
        """
        changes = Changes()
        known = self.hosts.get(info.host_id)
        same_run = bool(info.session) and (known is None or known.info.session in ("", info.session))
        host = self._touch_host(info, now, changes)
        self.report(info.host_id, reports, now, changes)
        still = set(running)
        for iid in sorted(host.running - still):
            if same_run and iid in host.unconfirmed:
                self._undelivered(self.instances[iid], now, changes)
            else:
                self._lose(self.instances[iid], now, f"lost by host {info.name}: the worker no longer has it",
                           changes)
        assignments = self._assign(host, min(want, self.config.max_assign), now, changes)
        host.unconfirmed = {a.instance_id for a in assignments}
        cancel = sorted(host.cancel & still)
        host.cancel.clear()
        backoff = 0.0
        if assignments:
            host.empty_answers = 0
        else:
            active = any(b.state is BagState.ACTIVE for b in self.bags.values())
            if active:
                cfg = self.config
                backoff = min(cfg.backoff_max, cfg.backoff_idle * 2.0 ** min(host.empty_answers, 16))
                host.empty_answers += 1
            else:
                backoff = self.config.backoff_empty
        self._emit_host(host, changes)
        self._seal(changes)
        self._check()
        return WorkAnswer(assignments, cancel, backoff), changes

    def report(self, host_id: str, reports: Sequence[InstanceReport], now: float,
               changes: Changes | None = None) -> Changes:
        """Instances that ended on host `host_id`; reports of unknown or foreign instances are ignored.

        A report may arrive twice (the host retried after a lost answer): the second is ignored, since
        the instance has already left the dispatcher.
        """
        changes = changes if changes is not None else Changes()
        for r in reports:
            inst = self.instances.get(r.instance_id)
            if inst is None:
                continue
            if inst.host_id != host_id:
                self._refuse(host_id, changes)
                continue
            problem = self._report_problem(inst, r)
            if problem:
                r = InstanceReport(r.instance_id, Outcome.FAILURE, r.exit_code, r.wall_s, r.cpu_s, problem,
                                   r.stdout_tail[-4096:], r.stderr_tail[-4096:])
            elif len(r.reason) > MAX_REASON or len(r.stdout_tail) > MAX_TAIL or len(r.stderr_tail) > MAX_TAIL:
                r = msgspec.structs.replace(r, reason=r.reason[:MAX_REASON], stdout_tail=r.stdout_tail[-MAX_TAIL:],
                                            stderr_tail=r.stderr_tail[-MAX_TAIL:])
            self._end(inst, r, now, changes)
        self._seal(changes)
        self._check()
        return changes

    def _refuse(self, host_id: str, changes: Changes) -> None:
        """A report for an instance the host was not running (another host's, or forged): counted, ignored."""
        host = self.hosts.get(host_id)
        if host is not None:
            host.stats.refused += 1
            self._emit_host(host, changes)

    def _report_problem(self, inst: _Instance, r: InstanceReport) -> str:
        """Why a successful report cannot be kept as it is (too large, or outputs the bag did not declare)."""
        if r.outcome is not Outcome.SUCCESS or not (r.outputs or r.stdout_tail or r.stderr_tail):
            return ""
        limit = self.config.max_result_bytes
        if r.result_bytes > limit:
            return (f"result of {r.result_bytes:,} bytes is over the server's limit of {limit:,} bytes "
                    "(server option --max-result-size)")
        if not r.outputs:
            return ""
        render = self.bags[inst.job.bag_id].render
        assert render is not None
        declared = render(inst.job.index, inst.job.line)[2]
        extra = sorted(set(r.outputs) - set(declared))
        if extra:
            return f"the host returned outputs the bag did not declare: {', '.join(n[:60] for n in extra[:5])}"
        bad = [problem for name in r.outputs if (problem := output_name_problem(name))]
        return bad[0] if bad else ""

    def tick(self, now: float) -> Changes:
        """Periodic work: instances past their deadline and instances of silent hosts become overdue."""
        changes = Changes()
        while self._deadlines and self._deadlines[0][0] < now:
            _, iid = heapq.heappop(self._deadlines)
            inst = self.instances.get(iid)
            if inst is not None and inst.state is InstanceState.RUNNING:
                self._lose(inst, now, f"instance deadline passed ({now - inst.sent_at:.0f} s after it was sent)",
                           changes)
        horizon = now - self.config.host_timeout
        silence = self._silence
        while silence and silence[0][0] < horizon:
            _, _, host = heapq.heappop(silence)
            host.watched = False
            if host.last_seen >= horizon:
                self._watch(host)
                continue
            self.live_hosts.pop(host.info.host_id, None)
            for iid in sorted(host.running):
                self._lose(self.instances[iid], now,
                           f"host {host.info.name} silent for {now - host.last_seen:.0f} s", changes)
        self._busy = self._busy_hosts(now)
        self._park(now)
        self._replicate(now)
        self._seal(changes)
        self._check()
        return changes

    def _busy_hosts(self, now: float) -> tuple[str, ...]:
        """Two hosts running an instance for longer than a quick failure takes (oldest instances first,
        so this usually stops after a few)."""
        cutoff = now - QUICK_FAILURE_S
        found: list[str] = []
        for inst in self._running.values():  # in the order they were sent
            if inst.sent_at >= cutoff:
                break
            if inst.host_id not in found:
                found.append(inst.host_id)
                if len(found) == 2:
                    break
        return tuple(found)

    def _park(self, now: float) -> None:
        """The buffer's time-to-live (section 6.2): a bag that matched no host for `buffer_ttl` while other
        bags could use the room gives its window up until as long again has passed."""
        ttl = self.config.buffer_ttl
        for bag in self.bags.values():
            if bag.parked_until is not None and now >= bag.parked_until:
                bag.parked_until = None
                bag.last_match = now
        for bag in self.bags.values():
            if bag.parked_until is not None or not bag.buffer or bag.last_match is None:
                continue
            if now - bag.last_match <= ttl:
                continue
            if not any(o is not bag and o.parked_until is None and not o.exhausted for o in self.bags.values()):
                continue
            self._reset_window(bag)
            bag.parked_until = now + ttl

    def _reset_window(self, bag: _Bag) -> None:
        """Empty the bag's window and have the feeder read it again from the bag's first job (its cursor only
        moves forward, so jobs queued again behind it would otherwise wait for the window to be used up)."""
        for job in bag.buffer:
            job.in_buffer = False
        bag.buffer.clear()
        bag.cursor, bag.exhausted = 0, False

    def _replicate(self, now: float) -> None:
        """Algorithm 2, speculative half: when few of a bag's jobs are queued, evaluate ReplicationRequirements
        for its running jobs and queue replicas of some, sampled with weight inverse to their replicas."""
        running: dict[int, list[_Job]] = {}
        for job in self.jobs.values():
            if job.state is JobState.RUNNING and job.live and not job.replica_pending:
                running.setdefault(job.bag_id, []).append(job)
        queue = {"BagsInQueue": len(self.bags), "BOTsInQueue": len(self.bags)}
        for bag_id, jobs in sorted(running.items()):
            bag = self.bags[bag_id]
            room = self.config.replica_queue - len(bag.replicas)
            if bag.counts.queued >= self.config.replicate_below or room <= 0:
                continue
            self._refresh(bag, queue, now)
            eligible = []
            for job in sorted(jobs, key=lambda j: j.job_id):
                if len(job.live) >= self.config.max_replicas:
                    continue
                first = self.instances[min(job.live)]
                host = self.hosts.get(first.host_id)
                ad = self._host_ad(host, now) if host is not None else None
                if bag.policies.should_replicate(self._job_ad(job, now), ad):
                    eligible.append(job)
            for job in self._rng.weighted_sample(eligible, [1.0 / len(j.live) for j in eligible], room):
                job.replica_pending = True
                bag.replicas.append(job)
                self.work_added += 1

    def _job_ad(self, job: _Job, now: float) -> dict[str, object]:
        """The job's ad with one Replica<i> ad per instance out, each with its host's ad (paper, Figure 3)."""
        bag_name = self.bags[job.bag_id].spec.name
        ad: dict[str, object] = {"Name": f"{bag_name}.{job.index}", "Index": job.index,
                                 "NumberOfReplicas": len(job.live), "Failures": job.failures}
        for i, iid in enumerate(sorted(job.live), 1):
            inst = self.instances[iid]
            host = self.hosts.get(inst.host_id)
            ad[f"Replica{i}"] = {
                "Name": f"{bag_name}.{job.index}.{i}", "SentTime": inst.sent_at, "RunTime": now - inst.sent_at,
                "Host": self.host_attrs(host, now) if host is not None else {}}
        return ad

    def cancel_bag(self, bag_id: int, now: float) -> Changes:
        """Cancel an active bag: its queued and running jobs are cancelled, its hosts told to kill them."""
        changes = Changes()
        bag = self.bags.get(bag_id)
        if bag is None or bag.state is not BagState.ACTIVE:
            return changes
        bag.state = BagState.CANCELLED
        for job in [j for j in self.jobs.values() if j.bag_id == bag_id] + list(bag.buffer) + list(bag.retry) + list(
                bag.failover):
            if job.state not in JOB_TERMINAL:
                self._finish_job(job, JobState.CANCELLED, "bag cancelled", now, changes)
        bag.counts.cancelled += bag.counts.queued
        bag.counts.queued = 0
        changes.cancelled_bags.append(bag_id)
        self._close_bag(bag, BagState.CANCELLED, now, changes)
        self._seal(changes)
        self._check()
        return changes

    def retry(self, bag: BagSnapshot, state: BagState, failed: Sequence[QueuedJob], now: float) -> Changes:
        """The owner queues failed jobs of a bag again (`JOB_RETRY`), each with its failure count reset so
        `max_failures` applies afresh; an ended bag is active again (`BAG_REOPEN`).

        `bag` and `state` are as stored, and `failed` are jobs the store holds as failed for good: the caller
        has flushed every staged change first. The jobs lie behind the window's cursor, so the window is read
        again from the start; the feeder finds them once these changes are durable.
        """
        changes = Changes()
        held = self.bags.get(bag.bag_id)
        if held is None:
            check_transition(BAG_REOPEN, state, BagState.ACTIVE)
            self.add_bag(bag)
            held = self.bags[bag.bag_id]
            changes.reopened_bags.append(bag.bag_id)
        ids = {q.job_id for q in failed}
        for iid in [i for i, inst in self.instances.items() if inst.job.job_id in ids]:
            del self.instances[iid]  # overdue instances of the failed run: a late report of one is ignored
        changes.retired_jobs.extend(sorted(ids))  # and in the store, where a restart would find them
        for q in failed:
            job = _Job(q.job_id, bag.bag_id, q.index, q.line, JobState.FAILED, 0, q.attempts)
            check_transition(JOB_RETRY, job.state, JobState.QUEUED)
            held.counts.failed -= 1
            held.counts.queued += 1
            job.state = JobState.QUEUED
            self._emit_job(job, changes)
        self._wake(held, now)
        self._seal(changes)
        self._check()
        return changes

    def revise(self, bag_id: int, spec: BagSpec, revision: int, lines: Sequence[str] | None, now: float) -> Changes:
        """A new revision of a bag's spec (and, for an each-line bag, new commands for its jobs not done).

        Jobs without a result run the new command: running ones are withdrawn from their hosts (killed there,
        as a cancel does) and queued again, which counts as no failure; done jobs keep their results. A bag
        that has ended is not held here, and `retry` brings it back with its new spec.
        """
        changes = Changes()
        bag = self.bags.get(bag_id)
        if bag is None:
            return changes
        self.set_policy(bag_id, spec)
        bag.revision = revision
        for job in bag.replicas:  # replicas of the old command's instances
            job.replica_pending = False
        bag.replicas.clear()
        for iid in [i for i, inst in self.instances.items()
                    if inst.job.bag_id == bag_id and inst.state is InstanceState.OVERDUE]:
            inst = self.instances.pop(iid)  # a late result of the old command is not wanted now
            self._detach(inst)
            changes.retired_jobs.append(inst.job.job_id)
        held = [j for j in self.jobs.values() if j.bag_id == bag_id]
        for job in held:
            for iid in sorted(job.live):
                inst = self.instances[iid]
                self._detach(inst)
                self._move(inst, InstanceState.CANCELLED, now, f"the bag was revised (revision {revision})", None,
                           changes)
                host = self.hosts.get(inst.host_id)
                if host is not None:
                    host.cancel.add(iid)
            if job.state is JobState.RUNNING:
                self._requeue_if_idle(job, now, changes)
        if lines is not None:
            for job in [*held, *bag.retry, *bag.failover]:
                job.line = lines[job.index]
        self._wake(bag, now)
        self._seal(changes)
        self._check()
        return changes

    def _wake(self, bag: _Bag, now: float) -> None:
        """After its owner re-queued jobs of the bag: read its window again, end a parking, wake idle hosts."""
        self._reset_window(bag)
        bag.parked_until = None
        bag.last_match = bag.last_sent = now
        self.work_added += 1
        self._emit_bag(bag)

    # -- internals ------------------------------------------------------------------------------------

    def host_attrs(self, host: _Host, now: float) -> dict[str, object]:
        """The host's ClassAd attributes as of `now`."""
        attrs = host.stats.attrs(host.info, len(host.running), now, self._others_good_at(host.info.host_id),
                                 any(h != host.info.host_id for h in self._busy))
        attrs["Reliable"] = host.info.pool in self.config.reliable_pools
        return attrs

    def _host_ad(self, host: _Host, now: float) -> HostAd:
        """The host's ClassAd as of `now`, kept per host and updated where attributes changed (most stay
        the same from one request to the next, and building an ad from scratch costs more)."""
        attrs = self.host_attrs(host, now)
        if host.ad is None:
            host.ad = host_ad(attrs)
        else:
            old = host.ad_attrs
            for k, v in attrs.items():
                if k not in old or old[k] != v or type(old[k]) is not type(v):
                    host.ad[k] = v
        host.ad_attrs = attrs
        return host.ad

    def _others_good_at(self, host_id: str) -> float:
        """When a host other than `host_id` last produced a good result (-inf: never)."""
        return next((t for t, h in self._good if h != host_id), -math.inf)

    def _touch_host(self, info: HostInfo, now: float, changes: Changes) -> _Host:
        host = self.hosts.get(info.host_id)
        if host is None:
            host = self.hosts[info.host_id] = _Host(info, now, now)
        host.info = info
        host.last_seen = now
        self.live_hosts[info.host_id] = host
        if not host.watched:
            self._watch(host)
        return host

    def _watch(self, host: _Host) -> None:
        host.watched = True
        heapq.heappush(self._silence, (host.last_seen, host.info.host_id, host))

    def _assign(self, host: _Host, want: int, now: float, changes: Changes) -> list[Assignment]:
        """GridBot's Algorithm 1 with the BOT-level optimization.

        Jobs with no replica out are alike, so each bag's policies are evaluated once per request; the
        matching bags are served by Rank (then age), and the Concurrency of the highest-ranked one bounds
        what the host may hold, each later bag's own Concurrency lowering it further.
        """
        out: list[Assignment] = []
        ready = [b for b in self.bags.values()
                 if b.state is BagState.ACTIVE and (b.retry or b.buffer or b.replicas or b.failover)]
        # (a bag whose only queued jobs avoid this host still gets its policies evaluated: cheap, and rare)
        if not ready or want <= 0:
            return out
        ad = self._host_ad(host, now)
        queue = {"BagsInQueue": len(self.bags), "BOTsInQueue": len(self.bags)}
        ranked: list[tuple[float, int, _Bag]] = []
        for bag in ready:
            self._refresh(bag, queue, now)
            if bag.last_match is None:
                bag.last_match = now
            if bag.policies.rank_static:
                if bag.rank is None:
                    bag.rank = bag.policies.rank(None)
                rank = bag.rank
            else:
                rank = bag.policies.rank(ad)
            ranked.append((-rank, bag.bag_id, bag))
        ranked.sort(key=lambda c: (c[0], c[1]))
        concurrency: int | None = None
        pool_ad = self.pool_ads.get(host.info.pool)
        for _, _, bag in ranked:
            if pool_ad is not None and not self._accepts(bag, host.info.pool, pool_ad):
                continue
            if not bag.policies.matches(ad):
                continue
            bag_concurrency, deadline = bag.policies.bundle(ad)
            if bag_concurrency <= 0:
                continue  # none of the bag's instances on this host, and no bound on the others' (issue 12)
            concurrency = bag_concurrency if concurrency is None else min(concurrency, bag_concurrency)
            if bag.failover and host.info.pool in self.config.reliable_pools:
                self._assign_queue(bag.failover, bag, host, want, concurrency, now, deadline, changes, out)
            if bag.retry:
                self._assign_queue(bag.retry, bag, host, want, concurrency, now, deadline, changes, out)
            while bag.buffer and len(out) < want and len(host.running) < concurrency:
                job = bag.buffer.popleft()
                job.in_buffer = False
                if job.state is JobState.QUEUED:
                    out.append(self._send(bag, job, host, now, changes, deadline))
            if bag.replicas and len(out) < want and len(host.running) < concurrency:
                self._assign_replicas(bag, host, ad, want, concurrency, now, changes, out)
            if len(out) >= want or len(host.running) >= concurrency:
                break
        return out

    def accepts_pool(self, bag_id: int, pool: str) -> bool:
        """Whether an active bag's GridPolicy accepts a pool of the pools file (the overlay asks)."""
        bag = self.bags[bag_id]
        return self._accepts(bag, pool, self.pool_ads[pool])

    def _accepts(self, bag: _Bag, pool: str, pool_ad: dict[str, object]) -> bool:
        ok = bag.pool_ok.get(pool)
        if ok is None:
            ok = bag.pool_ok[pool] = bag.policies.accepts_pool(pool_ad)
        return ok

    def _assign_queue(self, queue: deque[_Job], bag: _Bag, host: _Host, want: int, concurrency: int, now: float,
                      deadline: float, changes: Changes, out: list[Assignment]) -> None:
        """Send re-queued jobs, each to a host it did not just fail on."""
        keep: deque[_Job] = deque()
        horizon = now - self.config.retry_same_host_after
        while queue:
            job = queue.popleft()
            if job.state is not JobState.QUEUED:
                job.in_buffer = False
                continue
            failed_on = job.failed_on or {}
            avoid = (failed_on.get(host.info.host_id, -math.inf) > horizon
                     and len(failed_on) < len(self.live_hosts))
            if len(out) >= want or len(host.running) >= concurrency or avoid:
                keep.append(job)
                continue
            job.in_buffer = False
            out.append(self._send(bag, job, host, now, changes, deadline))
        queue.extend(keep)

    def _assign_replicas(self, bag: _Bag, host: _Host, ad: HostAd, want: int, concurrency: int, now: float,
                         changes: Changes, out: list[Assignment]) -> None:
        """Send queued replicas that this host may run: never a second copy of a job to the same host."""
        keep: deque[_Job] = deque()
        while bag.replicas:
            job = bag.replicas.popleft()
            if job.state is not JobState.RUNNING or not job.live or len(job.live) >= self.config.max_replicas:
                job.replica_pending = False
                continue
            if len(out) >= want or len(host.running) >= concurrency or any(
                    self.instances[i].host_id == host.info.host_id for i in job.live):
                keep.append(job)
                continue
            matches, d = bag.policies.job_matches(ad, self._job_ad(job, now))
            if not matches:
                keep.append(job)
                continue
            job.replica_pending = False
            bag.counts.replicas += 1
            out.append(self._send(bag, job, host, now, changes, d.deadline))
        bag.replicas = keep

    def _refresh(self, bag: _Bag, queue: dict[str, int], now: float) -> None:
        """Update the bag's ad when its counters (or the queue) changed; detect the tail phase (section 6.3)."""
        if not (bag.dirty or bag.policies.uses_time or bag.seen_active != queue["BagsInQueue"]):
            return
        bag.dirty = False
        bag.seen_active = queue["BagsInQueue"]
        bag.rank = None
        if not bag.policies.grid_policy_static:
            bag.pool_ok.clear()
        c = bag.counts
        threshold = self.config.tail_threshold or max(1, self.config.buffer_size // max(1, len(self.bags)))
        bag.tail = (bag.tail and self.config.tail_sticky) or c.queued < threshold
        bag.policies.set_bag({
            "Name": bag.spec.name, "Tail": bag.tail, "JobsTotal": c.total, "JobsLeft": c.queued + c.running,
            "JobsDone": c.done, "JobsFailed": c.failed, "JobsRunning": c.running, "JobsQueued": c.queued,
            "Replicas": c.replicas,
            "MeanRunTime": bag.run_time_sum / bag.good_results if bag.good_results else 0.0,
            "ElapsedTime": float(now - bag.created_at)}, queue)

    def _send(self, bag: _Bag, job: _Job, host: _Host, now: float, changes: Changes,
              instance_deadline: float) -> Assignment:
        iid = self.next_instance_id
        self.next_instance_id += 1
        deadline = now + instance_deadline
        bag.last_match = bag.last_sent = now
        inst = _Instance(iid, job, host.info.host_id, InstanceState.RUNNING, now, deadline)
        self.instances[iid] = inst
        self._running[iid] = inst
        self.jobs[job.job_id] = job
        job.live.add(iid)
        job.attempts += 1
        if job.attempts == 2:
            bag.counts.reruns += 1
        host.running.add(iid)
        heapq.heappush(self._deadlines, (deadline, iid))
        bag.counts.instances += 1
        self._set_job(job, JobState.RUNNING, changes, sent=True)
        changes.new_instances.append(NewInstance(iid, job.job_id, bag.bag_id, host.info.host_id, now, deadline))
        assert bag.render is not None
        command, env, outputs = bag.render(job.index, job.line)
        return Assignment(iid, job.job_id, bag.bag_id, bag.spec.name, job.index, command, env, bag.input_names,
                          outputs, deadline, bag.spec.timeout, bag.limits, bag.revision)

    def _end(self, inst: _Instance, r: InstanceReport, now: float, changes: Changes) -> None:
        """Apply a host's report about `inst`, which may be running or overdue (a late report)."""
        job, bag = inst.job, self.bags[inst.job.bag_id]
        was_running = self._detach(inst)
        host = self.hosts.get(inst.host_id)
        if r.outcome is Outcome.SUCCESS:
            if job.state in JOB_TERMINAL:
                self._move(inst, InstanceState.WASTED, now, "a result already existed", r, changes)
                bag.counts.wasted += 1
                self._emit_bag(bag)
            else:
                self._move(inst, InstanceState.DONE, now, "", r, changes)
                self._finish_job(job, JobState.DONE, "", now, changes, result=inst.instance_id, winner=inst.host_id)
            bag.run_time_sum += now - inst.sent_at
            bag.good_results += 1
            good = self._good
            if good and good[0][1] == inst.host_id:
                good[0] = (now, inst.host_id)
            else:
                self._good = [(now, inst.host_id), *[g for g in good if g[1] != inst.host_id][:1]]
            if host is not None:
                host.stats.good(now, r.cpu_s, now - inst.sent_at)
        elif r.outcome is Outcome.INTERRUPTED and was_running:
            self._move(inst, InstanceState.INTERRUPTED, now, r.reason or "interrupted by the worker", r, changes)
            self._requeue_if_idle(job, now, changes)
        else:
            reason = r.reason or "failed"
            self._move(inst, InstanceState.FAILED, now, reason, r, changes)
            if host is not None:
                quick = r.wall_s < QUICK_FAILURE_S
                host.stats.bad(now, quick)
                if quick:
                    job.quick_failures = [*(job.quick_failures or ()), inst.host_id]
            if was_running:
                job.failures += 1
                job.failed_on = {**(job.failed_on or {}), inst.host_id: now}
            self._after_failure(job, reason, now, changes)

    def _lose(self, inst: _Instance, now: float, reason: str, changes: Changes) -> None:
        """A running instance that will probably never report: overdue, a failure, the job re-queued."""
        self._detach(inst)
        self._move(inst, InstanceState.OVERDUE, now, reason, None, changes)
        inst.job.overdue = (inst.job.overdue or set()) | {inst.instance_id}
        self.bags[inst.job.bag_id].counts.overdue += 1
        inst.job.failures += 1
        inst.job.failed_on = {**(inst.job.failed_on or {}), inst.host_id: now}
        host = self.hosts.get(inst.host_id)
        if host is not None:
            host.stats.bad(now, False)
        self._after_failure(inst.job, reason, now, changes)

    def _undelivered(self, inst: _Instance, now: float, changes: Changes) -> None:
        """An instance whose sending answer never reached its host (lost on the network, or the server
        stopped before it went out): given back as an interruption, with no failure for the job or host."""
        self._detach(inst)
        self._move(inst, InstanceState.INTERRUPTED, now, "the answer that sent it never reached its host", None,
                   changes)
        self._requeue_if_idle(inst.job, now, changes)

    def _detach(self, inst: _Instance) -> bool:
        """Take `inst` off its job's live set and its host; return whether it was running."""
        inst.job.live.discard(inst.instance_id)
        if inst.job.overdue:
            inst.job.overdue.discard(inst.instance_id)
        self._running.pop(inst.instance_id, None)
        host = self.hosts.get(inst.host_id)
        if host is not None:
            host.running.discard(inst.instance_id)
        return inst.state is InstanceState.RUNNING

    def _after_failure(self, job: _Job, reason: str, now: float, changes: Changes) -> None:
        job.reason = reason
        if job.state in JOB_TERMINAL:
            self._emit_job(job, changes)
            return
        spec = self.bags[job.bag_id].spec
        if job.failures >= spec.max_failures:
            self._finish_job(job, JobState.FAILED, f"failed {job.failures} times; last: {reason}", now, changes)
        else:
            self._requeue_if_idle(job, now, changes)

    def _requeue_if_idle(self, job: _Job, now: float, changes: Changes) -> None:
        """Put a running job with no live instance left on its bag's retry queue."""
        if job.state is JobState.RUNNING and not job.live:
            self._set_job(job, JobState.QUEUED, changes)
            if not job.in_buffer:
                job.in_buffer = True
                bag = self.bags[job.bag_id]
                cfg = self.config
                failover = cfg.failover_after and cfg.reliable_pools and job.failures >= cfg.failover_after
                (bag.failover if failover else bag.retry).append(job)
                self.work_added += 1
        else:
            self._emit_job(job, changes)

    def _finish_job(self, job: _Job, state: JobState, reason: str, now: float, changes: Changes,
                    result: int | None = None, winner: str | None = None) -> None:
        """Move a job to a terminal state; its other running instances are cancelled on their hosts."""
        if reason:
            job.reason = reason
        if state is JobState.DONE:
            for host_id in job.quick_failures or ():
                culprit = self.hosts.get(host_id)
                if culprit is not None and host_id != winner:
                    culprit.stats.blame += 1
                    self._emit_host(culprit, changes)
        self._set_job(job, state, changes, result)
        for iid in sorted(job.live):
            inst = self.instances[iid]
            self._detach(inst)
            self._move(inst, InstanceState.CANCELLED, now, f"job {state.value} elsewhere" if state is JobState.DONE
                       else reason, None, changes)
            host = self.hosts.get(inst.host_id)
            if host is not None:
                host.cancel.add(iid)
        self.jobs.pop(job.job_id, None)
        bag = self.bags[job.bag_id]
        if bag.state is BagState.ACTIVE and bag.counts.queued == 0 and bag.counts.running == 0:
            self._close_bag(bag, BagState.FAILED if bag.counts.failed else BagState.COMPLETED, now, changes)

    def _close_bag(self, bag: _Bag, state: BagState, now: float, changes: Changes) -> None:
        """End a bag; its overdue instances are forgotten (a report from one now is ignored)."""
        bag.state = state
        bag.buffer.clear()
        bag.retry.clear()
        bag.replicas.clear()
        bag.failover.clear()
        for iid in [i for i, inst in self.instances.items() if inst.job.bag_id == bag.bag_id]:
            del self.instances[iid]
            self._running.pop(iid, None)
        for job_id in [j.job_id for j in self.jobs.values() if j.bag_id == bag.bag_id]:
            del self.jobs[job_id]
        self._touched.pop(bag.bag_id, None)
        changes.bags[bag.bag_id] = BagUpdate(bag.bag_id, state, _copy(bag.counts), now)
        del self.bags[bag.bag_id]

    def _set_job(self, job: _Job, state: JobState, changes: Changes, result: int | None = None,
                 sent: bool = False) -> None:
        sent = sent and job.state is JobState.QUEUED
        if state is not job.state:
            check_transition(JOB_TRANSITIONS, job.state, state)
            counts = self.bags[job.bag_id].counts
            old, new = _COUNTER[job.state], _COUNTER[state]
            setattr(counts, old, getattr(counts, old) - 1)
            setattr(counts, new, getattr(counts, new) + 1)
            job.state = state
        self._emit_job(job, changes, result, sent)

    def _emit_job(self, job: _Job, changes: Changes, result: int | None = None, sent: bool = False) -> None:
        prior = changes.jobs.get(job.job_id)
        if prior is not None:
            sent = False  # the job changed otherwise in this event: the update must be written
            if result is None:
                result = prior.result_instance
        changes.jobs[job.job_id] = JobUpdate(job.job_id, job.state, job.failures, job.attempts, job.reason, result,
                                             sent)
        bag = self.bags.get(job.bag_id)
        if bag is not None:
            if job.job_id > bag.touched:
                bag.touched = job.job_id
            self._emit_bag(bag)

    def _emit_bag(self, bag: _Bag) -> None:
        bag.dirty = True
        self._touched[bag.bag_id] = bag

    def _seal(self, changes: Changes) -> None:
        """Write the counters of the bags this event changed (once each, whatever the number of jobs)."""
        for bag in self._touched.values():
            changes.bags[bag.bag_id] = BagUpdate(bag.bag_id, bag.state, _copy(bag.counts))
        self._touched.clear()

    def _move(self, inst: _Instance, state: InstanceState, now: float, reason: str,
              report: InstanceReport | None, changes: Changes) -> None:
        check_transition(INSTANCE_TRANSITIONS, inst.state, state)
        inst.state = state
        if state is not InstanceState.OVERDUE:
            self.instances.pop(inst.instance_id, None)
        changes.instances.append(InstanceUpdate(inst.instance_id, state, now, reason, report))

    def _emit_host(self, host: _Host, changes: Changes) -> None:
        changes.hosts[host.info.host_id] = HostUpdate(host.info, host.first_seen, host.last_seen,
                                                      msgspec.structs.replace(host.stats))

    def _check(self) -> None:
        """Counters agree with the jobs held (only with `check_invariants`, as it walks everything)."""
        if not self.config.check_invariants:
            return
        for bag in self.bags.values():
            running = sum(1 for j in self.jobs.values() if j.bag_id == bag.bag_id and j.state is JobState.RUNNING)
            assert running == bag.counts.running, (bag.bag_id, running, bag.counts)
            assert min(bag.counts.queued, bag.counts.running, bag.counts.done, bag.counts.failed) >= 0, bag.counts
        assert set(self._running) == {i for i, x in self.instances.items() if x.state is InstanceState.RUNNING}
        for iid, inst in self.instances.items():
            assert inst.state in (InstanceState.RUNNING, InstanceState.OVERDUE), (iid, inst.state)
            assert (iid in inst.job.live) == (inst.state is InstanceState.RUNNING), iid



_COUNTER = {s: s.value for s in JobState}
"""The BagCounts field of each job state."""


def _input_names(spec: BagSpec) -> list[str]:
    return [p.rstrip("/").rsplit("/", 1)[-1] for p in spec.inputs]


def _copy(counts: BagCounts) -> BagCounts:
    return msgspec.structs.replace(counts)


class _SplitMix:
    """A small deterministic PRNG (SplitMix64): the core may not use the random module's entropy."""

    def __init__(self, seed: int) -> None:
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def random(self) -> float:
        self.state = (self.state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return ((z ^ (z >> 31)) >> 11) / float(1 << 53)

    def weighted_sample(self, items: list[_Job], weights: list[float], k: int) -> list[_Job]:
        """Up to k items without replacement, each draw proportional to its weight (Efraimidis-Spirakis)."""
        if len(items) <= k:
            return list(items)
        keyed = sorted(((self.random() ** (1.0 / w), i) for i, w in enumerate(weights)), reverse=True)
        return [items[i] for _, i in keyed[:k]]

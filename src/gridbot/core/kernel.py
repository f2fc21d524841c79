"""The kernel: applies decisions to the dispatcher's records and writes each change down for the store.

Sending an instance, a host's report of one, an instance lost (past its deadline, or its host silent),
a job's and a bag's state changes: each goes through the state tables of `gridbot.model.states`, keeps the
counters right, and appends what changed to the event's `Changes`, tagged with the event's id. Nothing
here decides what to run where: Algorithm 1 (core/assign.py) and the bags' strategies do, and the
`Dispatcher` (core/dispatcher.py) turns the outside world's calls into events.
"""

from __future__ import annotations

import heapq
from collections import Counter

import msgspec

from gridbot.core.changes import (
    BagCounts,
    BagUpdate,
    Changes,
    Decision,
    Event,
    HostUpdate,
    InstanceUpdate,
    JobUpdate,
    NewInstance,
)
from gridbot.core.diagnostics import deadline_before_timeout
from gridbot.core.hosts import QUICK_FAILURE_S
from gridbot.core.records import (
    ENDED_NOTES,
    HISTORY,
    BagRecord,
    Candidate,
    Ended,
    HostRecord,
    Instance,
    Job,
    PoolRecord,
    SplitMix,
    State,
    guarded,
)
from gridbot.core.view import BagView, DispatchView
from gridbot.model.records import Assignment, HostInfo, InstanceReport, Outcome, Verdict, result_digest
from gridbot.model.states import (
    BAG_TRANSITIONS,
    INSTANCE_TRANSITIONS,
    JOB_TERMINAL,
    JOB_TRANSITIONS,
    BagState,
    InstanceState,
    JobState,
    check_transition,
)


class Kernel:
    """The records, and the only code that changes them."""

    def __init__(self, state: State) -> None:
        self.s = state
        self.view = DispatchView(state)
        self.rng = SplitMix(state.config.seed * 7919 + 17)
        """Draws the quorum's spot checks (the server reseeds it with a secret: a host must not predict them)."""
        self.next_instance_id = 1
        self.next_event_id = 1
        self.event_id = 0
        """The event being applied (`begin`)."""
        self.deadlines: list[tuple[float, int]] = []
        self.silence: list[tuple[float, str, HostRecord]] = []
        """(last time seen, id, host): at most one entry per live host, so a tick finds the silent ones
        without walking every host ever seen."""
        self.work_added = 0
        """Counts jobs made ready to send other than by the feeder's first fill: re-queued jobs and replicas
        (the server wakes idle hosts it holds when it changes)."""
        self._touched: dict[int, BagRecord] = {}
        """Bags whose counters changed during the current event: their update is written once, at its end
        (a bundle of a thousand instances used to copy the counters a thousand times)."""

    # -- events ---------------------------------------------------------------------------------------

    def begin(self, kind: str, source: str, now: float) -> Changes:
        """Start an event: the changes it makes carry its id."""
        self.event_id = self.next_event_id
        self.next_event_id += 1
        return Changes(events=[Event(self.event_id, now, kind, source)])

    def seal(self, changes: Changes) -> Changes:
        """End an event: write the counters of the bags it changed (once each, whatever the number of jobs),
        and drop the event itself when it changed no instance and decided nothing (a host's mere contact
        is not worth a row)."""
        for bag in self._touched.values():
            changes.bags[bag.bag_id] = BagUpdate(bag.bag_id, bag.state, _copy(bag.counts))
        self._touched.clear()
        if not (changes.new_instances or changes.instances or changes.decisions):
            changes.events.clear()
        self.check()
        return changes

    def decide(self, changes: Changes, job: Job, strategy: str, action: str, why: str) -> None:
        """Record a strategy's decision about a job, for the job's story."""
        changes.decisions.append(Decision(self.event_id, job.bag_id, job.job_id, strategy, action, why))

    # -- hosts ----------------------------------------------------------------------------------------

    def touch_host(self, info: HostInfo, now: float) -> HostRecord:
        """A host called in: create it or refresh its info, and mark it alive."""
        host = self.s.hosts.get(info.host_id)
        if host is None:
            host = self.s.hosts[info.host_id] = HostRecord(info, now, now)
        host.info = info
        host.last_seen = host.contact = now
        self.s.live_hosts[info.host_id] = host
        if not host.watched:
            self.watch(host)
        return host

    def watch(self, host: HostRecord) -> None:
        host.watched = True
        heapq.heappush(self.silence, (host.last_seen, host.info.host_id, host))

    def emit_host(self, host: HostRecord, changes: Changes) -> None:
        # (the store keeps its last real call: what its pilot's hours are billed to, core/ledger.py)
        changes.hosts[host.info.host_id] = HostUpdate(host.info, host.first_seen, max(host.first_seen, host.contact),
                                                      msgspec.structs.replace(host.stats))

    def refuse(self, host_id: str, changes: Changes) -> None:
        """A report for an instance the host was not running (another host's, or forged): counted, ignored."""
        host = self.s.hosts.get(host_id)
        if host is not None:
            host.stats.refused += 1
            self.emit_host(host, changes)

    # -- the bag's ad ---------------------------------------------------------------------------------

    def refresh(self, bag: BagRecord, now: float, active: int) -> None:
        """Update the bag's ad when its counters (or the number of `active` bags) changed; its tail strategy
        says whether it is in its tail (section 6.3)."""
        if not (bag.dirty or bag.policies.uses_time or bag.seen_active != active):
            return
        bag.dirty = False
        bag.seen_active = active
        bag.rank = None
        if not bag.policies.grid_policy_static:
            bag.pool_ok.clear()
        bag.tail = guarded(bag, f"tail={bag.tail_strategy.name} in_tail", bag.counts.queued == 0,
                           bag.tail_strategy.in_tail, self.view, BagView(bag), now)
        c = bag.counts
        bag.policies.set_bag({
            "Name": bag.spec.name, "Tail": bag.tail, "JobsTotal": c.total, "JobsLeft": c.queued + c.running,
            "JobsDone": c.done, "JobsFailed": c.failed, "JobsRunning": c.running, "JobsQueued": c.queued,
            "Replicas": c.replicas,
            "MeanRunTime": bag.run_time_sum / bag.good_results if bag.good_results else 0.0,
            "ElapsedTime": float(now - bag.created_at)}, {"BagsInQueue": active, "BOTsInQueue": active})

    # -- instances ------------------------------------------------------------------------------------

    def send(self, bag: BagRecord, job: Job, host: HostRecord, now: float, changes: Changes,
             instance_deadline: float, replica: bool = False) -> Assignment:
        """Create an instance of `job` on `host`, with `instance_deadline` seconds to report."""
        iid = self.next_instance_id
        self.next_instance_id += 1
        deadline = now + instance_deadline
        bag.window.last_match = bag.last_sent = now
        inst = Instance(iid, job, host.info.host_id, InstanceState.RUNNING, now, deadline, host.info.pool)
        counts = bag.on_pool.setdefault(host.info.pool, [0, 0])
        counts[0] += 1
        counts[1] += 1
        self.s.instances[iid] = inst
        self.s.running[iid] = inst
        self.s.jobs[job.job_id] = job
        job.live.add(iid)
        job.attempts += 1
        if job.routed:  # a tail strategy's route holds for this instance, not for the job's replicas after it
            job.pools, job.routed = None, False
        if job.attempts == 2:
            bag.counts.reruns += 1
        host.running.add(iid)
        heapq.heappush(self.deadlines, (deadline, iid))
        if len(self.deadlines) > 2 * len(self.s.running) + 4096:
            self._compact_deadlines()
        bag.counts.instances += 1
        timeout = bag.spec.timeout
        if timeout is not None and instance_deadline < timeout and not bag.tail_strategy.sets_deadline:
            bag.short_deadline = ((bag.short_deadline or (0,))[0] + 1, instance_deadline, host.info.name)
        self.set_job(job, JobState.RUNNING, changes, sent=True)
        if bag.spec.quorum > 1:
            self._quorum_copies(bag, job, host)
        changes.new_instances.append(NewInstance(iid, job.job_id, bag.bag_id, host.info.host_id, now, deadline,
                                                 self.event_id, replica))
        assert bag.render is not None
        command, env, outputs = bag.render(job.index, job.line)
        return Assignment(iid, job.job_id, bag.bag_id, bag.spec.name, job.index, command, env, bag.input_names,
                          outputs, deadline, bag.spec.timeout, bag.limits, bag.revision, bag.spec.cpus)

    def _compact_deadlines(self) -> None:
        """Keep only the running instances' deadlines: an instance that ended leaves its entry in the heap until
        its deadline passes (a day by default), so a busy server's heap grew by every instance it sent, in
        memory and in the cost of each push (a tenth of the server's time at 20,000 jobs/s). Rebuilt when
        over twice the running instances: O(1) a push, amortized."""
        self.deadlines = [(inst.instance_deadline, iid) for iid, inst in self.s.running.items()]
        heapq.heapify(self.deadlines)

    def end(self, inst: Instance, r: InstanceReport, now: float, changes: Changes,
            verdict: Verdict | None = None) -> None:
        """Apply a host's report about `inst`, which may be running or overdue (a late report); `verdict` is, for
        a quorum job's result, what the server's validator found of it."""
        job, bag = inst.job, self.s.bags[inst.job.bag_id]
        self.s.ledger.charge(bag.bag_id, inst.host_id, r.wall_s, now)
        was_running = self.detach(inst)
        host = self.s.hosts.get(inst.host_id)
        if r.outcome is not Outcome.INTERRUPTED:
            self._remember(bag, inst, host, now, r.outcome is Outcome.SUCCESS)
        if r.outcome is Outcome.SUCCESS:
            if job.state in JOB_TERMINAL:
                self.move(inst, InstanceState.WASTED, now, "a result already existed", r, changes)
                bag.counts.wasted += 1
                self.emit_bag(bag)
            elif bag.spec.quorum > 1 and job.single != inst.host_id and not (host is not None and self.trusted(host)):
                self._candidate(bag, job, inst, host, r, now, changes, verdict)
                return
            else:
                self.move(inst, InstanceState.DONE, now, "", r, changes)
                self.finish_job(job, JobState.DONE, "", now, changes, result=inst.instance_id, winner=inst.host_id)
            self._good_result(bag, inst.host_id, host, inst.sent_at, r.cpu_s, now)
        elif r.outcome is Outcome.INTERRUPTED and was_running:
            self.move(inst, InstanceState.INTERRUPTED, now, r.reason or "interrupted by the worker", r, changes)
            self.requeue_if_idle(job, changes)
        else:
            reason = r.reason or "failed"
            self.move(inst, InstanceState.FAILED, now, reason, r, changes)
            if host is not None:
                quick = r.wall_s < QUICK_FAILURE_S
                host.stats.bad(now, quick)
                self._pool(host).failed += 1
                if quick:
                    job.quick_failures = [*(job.quick_failures or ()), inst.host_id]
            if was_running:
                job.failures += 1
                job.failed_on = {**(job.failed_on or {}), inst.host_id: now}
            self.after_failure(job, reason, now, changes)

    # -- quorum (BOINC's validation of volunteers' results) ------------------------------------------------

    def account(self, host_id: str) -> str:
        """Whose host it is: its account where its pool knows one, else the host itself."""
        host = self.s.hosts.get(host_id)
        return (host.info.account or host_id) if host is not None else host_id

    def trusted(self, host: HostRecord) -> bool:
        """Whether the host's pool is trusted: its results count as a quorum alone."""
        return (self.s.pool_ads.get(host.info.pool) or {}).get("Trusted") is True

    def _quorum_copies(self, bag: BagRecord, job: Job, host: HostRecord) -> None:
        """After an instance of a quorum job was sent: the first one to a trusted pool, or to a host with a long
        streak of valid results (but for a `spot_check` share, drawn from a seed the server keeps secret), goes
        alone; else the job gets another copy queued until enough are out for a quorum."""
        if job.attempts == 1 and not job.candidates and (self.trusted(host) or (
                host.stats.valid_streak >= ADAPTIVE_STREAK and self.rng.random() >= bag.spec.spot_check)):
            job.single = host.info.host_id
            return
        self.want_copies(bag, job)

    def want_copies(self, bag: BagRecord, job: Job) -> None:
        """Queue one more copy of a running quorum job while fewer are out than its quorum still needs (the
        replica path sends it, to a host of another account)."""
        agreeing = max(Counter(c.digest for c in job.candidates or ()).values(), default=0)
        if (job.state is JobState.RUNNING and not job.replica_pending and not job.single
                and len(job.live) < bag.spec.quorum - agreeing and job.attempts < bag.spec.instance_cap()):
            job.replica_pending = True
            bag.replicas.append(job)
            self.work_added += 1

    def _candidate(self, bag: BagRecord, job: Job, inst: Instance, host: HostRecord | None, r: InstanceReport,
                   now: float, changes: Changes, verdict: Verdict | None) -> None:
        """A good result of a quorum job: kept until `quorum` results of distinct accounts agree (byte for byte, or
        as the bag's validator says: `verdict`, whose note goes into the instance's story); the agreeing ones are
        valid and the first of them the job's result, the others invalid, counted against their hosts and never
        returned."""
        q = bag.spec.quorum
        digest = (verdict.vote if verdict is not None else None) or result_digest(r)
        account = self.account(inst.host_id)
        # one vote an account, and a host: its newest (a host may not vote again under another account)
        cands = [c for c in job.candidates or () if c.account != account and c.host_id != inst.host_id]
        cands.append(Candidate(inst.instance_id, inst.host_id, account, digest, inst.sent_at, r.cpu_s, now))
        job.candidates = cands
        agree = [c for c in cands if c.digest == digest]
        note = f" ({verdict.note})" if verdict is not None and verdict.note else ""
        self.move(inst, InstanceState.DONE, now, f"a result for the quorum: {len(agree)} of {q} agree{note}", r,
                  changes, vote=digest)
        if len(agree) >= q:
            winner = agree[0]
            for c in cands:
                ok = c.digest == digest
                judged = self.s.hosts.get(c.host_id)
                if ok:  # a good result once the quorum says so (an invalid one never counts as done)
                    self._good_result(bag, c.host_id, judged, c.sent_at, c.cpu_s, c.reported_at)
                if judged is not None:
                    judged.stats.validated(ok)
                    if not ok:  # an invalid result is a failed job to its host's record (Host.ErrorRate)
                        judged.stats.bad(now, False)
                    self.emit_host(judged, changes)
                self.decide(changes, job, "quorum", "valid" if ok else "invalid",
                            f"instance {c.instance_id} on {judged.info.name if judged else c.host_id}: "
                            + (f"agrees with {q - 1} other(s)" if ok else f"differs from the {q} that agree"))
            job.candidates = None
            self.finish_job(job, JobState.DONE, "", now, changes, result=winner.instance_id, winner=winner.host_id)
            return
        cap = bag.spec.instance_cap()
        if job.attempts >= cap and not job.live:
            groups = sorted(Counter(c.digest for c in cands).values(), reverse=True)
            self.finish_job(job, JobState.FAILED, f"no quorum of {q} after {job.attempts} instances (max_instances): "
                            f"{len(cands)} results in {len(groups)} disagreeing group(s) of {groups}", now, changes)
            return
        self.requeue_if_idle(job, changes)
        self.want_copies(bag, job)

    def _good_result(self, bag: BagRecord, host_id: str, host: HostRecord | None, sent_at: float, cpu_s: float,
                     now: float) -> None:
        turnaround = now - sent_at
        bag.run_time_sum += turnaround
        bag.good_results += 1
        good = self.s.good
        if good and good[0][1] == host_id:
            good[0] = (now, host_id)
        else:
            self.s.good = [(now, host_id), *[g for g in good if g[1] != host_id][:1]]
        if host is not None:
            host.stats.good(now, cpu_s, turnaround)
            pool = self._pool(host)
            pool.done += 1
            pool.turnaround_sum += turnaround

    @staticmethod
    def _remember(bag: BagRecord, inst: Instance, host: HostRecord | None, ended_at: float | None,
                  success: bool) -> None:
        history = bag.history
        if inst.state is InstanceState.OVERDUE:  # its loss is recorded: the late report replaces it
            history.pop(inst.instance_id, None)
        history[inst.instance_id] = Ended(inst.instance_id, inst.sent_at, ended_at, success,
                                          host.info.pool if host is not None else "")
        if len(history) > HISTORY:
            history.popitem(last=False)

    def _pool(self, host: HostRecord) -> PoolRecord:
        pool = self.s.pools.get(host.info.pool)
        if pool is None:
            pool = self.s.pools[host.info.pool] = PoolRecord()
        return pool

    def lose(self, inst: Instance, now: float, reason: str, changes: Changes) -> None:
        """A running instance that will probably never report: overdue, a failure, the job re-queued."""
        self.detach(inst)
        self.move(inst, InstanceState.OVERDUE, now, reason, None, changes)
        inst.job.overdue = (inst.job.overdue or set()) | {inst.instance_id}
        self.s.bags[inst.job.bag_id].counts.overdue += 1
        inst.job.failures += 1
        inst.job.failed_on = {**(inst.job.failed_on or {}), inst.host_id: now}
        host = self.s.hosts.get(inst.host_id)
        self._remember(self.s.bags[inst.job.bag_id], inst, host, None, False)
        if host is not None:
            host.stats.bad(now, False)
            self._pool(host).failed += 1
        self.after_failure(inst.job, reason, now, changes)

    def undelivered(self, inst: Instance, now: float, changes: Changes) -> None:
        """An instance whose sending answer never reached its host (lost on the network, or the server
        stopped before it went out): given back as an interruption, with no failure for the job or host."""
        self.detach(inst)
        self.move(inst, InstanceState.INTERRUPTED, now, "the answer that sent it never reached its host", None,
                  changes)
        self.requeue_if_idle(inst.job, changes)

    def withdraw(self, job: Job, now: float, reason: str, changes: Changes) -> None:
        """Cancel the job's running instances on their hosts (a revision, a migration): no failure for the
        job or the hosts; the job is queued again once none is left."""
        for iid in sorted(job.live):
            inst = self.s.instances[iid]
            self.detach(inst)
            self.move(inst, InstanceState.CANCELLED, now, reason, None, changes)
            host = self.s.hosts.get(inst.host_id)
            if host is not None:
                host.cancel.add(iid)
        if job.state is JobState.RUNNING:
            self.requeue_if_idle(job, changes)

    def detach(self, inst: Instance) -> bool:
        """Take `inst` off its job's live set and its host; return whether it was running."""
        inst.job.live.discard(inst.instance_id)
        if inst.job.overdue:
            inst.job.overdue.discard(inst.instance_id)
        if self.s.running.pop(inst.instance_id, None) is not None:
            bag = self.s.bags.get(inst.job.bag_id)
            if bag is not None and (counts := bag.on_pool.get(inst.pool)):
                counts[1] -= 1
        host = self.s.hosts.get(inst.host_id)
        if host is not None:
            host.running.discard(inst.instance_id)
        return inst.state is InstanceState.RUNNING

    def move(self, inst: Instance, state: InstanceState, now: float, reason: str,
             report: InstanceReport | None, changes: Changes, vote: bytes | None = None) -> None:
        check_transition(INSTANCE_TRANSITIONS, inst.state, state)
        inst.state = state
        if state is not InstanceState.OVERDUE:
            self.s.instances.pop(inst.instance_id, None)
        changes.instances.append(InstanceUpdate(inst.instance_id, state, now, reason, report, self.event_id, vote))

    # -- jobs -----------------------------------------------------------------------------------------

    def after_failure(self, job: Job, reason: str, now: float, changes: Changes) -> None:
        """A failed or lost instance: the job fails for good after `max_failures`, else is queued again."""
        job.reason = reason
        if job.state in JOB_TERMINAL:
            self.emit_job(job, changes)
            return
        bag = self.s.bags[job.bag_id]
        spec = bag.spec
        if job.failures >= spec.max_failures:
            times = "1 time" if job.failures == 1 else f"{job.failures} times"
            self.finish_job(job, JobState.FAILED, f"failed {times}; last: {reason}", now, changes)
        elif spec.quorum > 1 and job.attempts >= spec.instance_cap() and not job.live:
            self.finish_job(job, JobState.FAILED, f"no quorum of {spec.quorum} after {job.attempts} instances "
                            f"(max_instances); last: {reason}", now, changes)
        else:
            if job.single and not job.live:
                job.single = ""  # its trusted host failed it: the next copies need a quorum
            self.requeue_if_idle(job, changes)
            if spec.quorum > 1:
                self.want_copies(bag, job)

    def requeue_if_idle(self, job: Job, changes: Changes) -> None:
        """Put a running job with no live instance left on its bag's retry queue (or the fail-over queue,
        after `failover_after` failures). A job with another instance still running stays running."""
        if job.state is JobState.RUNNING and not job.live:
            self.set_job(job, JobState.QUEUED, changes)
            if not job.in_buffer:
                job.in_buffer = True
                bag = self.s.bags[job.bag_id]
                cfg = self.s.config
                failover = cfg.failover_after and cfg.reliable_pools and job.failures >= cfg.failover_after
                (bag.failover if failover else bag.retry).append(job)
                self.work_added += 1
        else:
            self.emit_job(job, changes)

    def finish_job(self, job: Job, state: JobState, reason: str, now: float, changes: Changes,
                   result: int | None = None, winner: str | None = None) -> None:
        """Move a job to a terminal state; its other running instances are cancelled on their hosts (those of
        a job done run on with `let_replicas_finish`: their results are discarded when they come)."""
        if reason:
            job.reason = reason
        if state is JobState.DONE:
            for host_id in job.quick_failures or ():
                culprit = self.s.hosts.get(host_id)
                if culprit is not None and host_id != winner:
                    culprit.stats.blame += 1
                    self.emit_host(culprit, changes)
        self.set_job(job, state, changes, result)
        for iid in () if state is JobState.DONE and self.s.config.let_replicas_finish else sorted(job.live):
            inst = self.s.instances[iid]
            self.detach(inst)
            self.move(inst, InstanceState.CANCELLED, now, f"job {state.value} elsewhere" if state is JobState.DONE
                      else reason, None, changes)
            host = self.s.hosts.get(inst.host_id)
            if host is not None:
                host.cancel.add(iid)
        self.s.jobs.pop(job.job_id, None)
        bag = self.s.bags[job.bag_id]
        if not bag.closing and bag.counts.queued == 0 and bag.counts.running == 0:
            self.close_bag(bag, BagState.FAILED if bag.counts.failed else BagState.COMPLETED, now, changes)

    def set_job(self, job: Job, state: JobState, changes: Changes, result: int | None = None,
                sent: bool = False) -> None:
        sent = sent and job.state is JobState.QUEUED
        if state is not job.state:
            check_transition(JOB_TRANSITIONS, job.state, state)
            counts = self.s.bags[job.bag_id].counts
            old, new = _COUNTER[job.state], _COUNTER[state]
            setattr(counts, old, getattr(counts, old) - 1)
            setattr(counts, new, getattr(counts, new) + 1)
            job.state = state
        self.emit_job(job, changes, result, sent)

    def emit_job(self, job: Job, changes: Changes, result: int | None = None, sent: bool = False) -> None:
        prior = changes.jobs.get(job.job_id)
        if prior is not None:
            sent = False  # the job changed otherwise in this event: the update must be written
            if result is None:
                result = prior.result_instance
        changes.jobs[job.job_id] = JobUpdate(job.job_id, job.state, job.failures, job.attempts, job.reason, result,
                                             sent)
        bag = self.s.bags.get(job.bag_id)
        if bag is not None:
            if job.job_id > bag.window.touched:
                bag.window.touched = job.job_id
            self.emit_bag(bag)

    # -- bags -----------------------------------------------------------------------------------------

    def emit_bag(self, bag: BagRecord) -> None:
        bag.dirty = True
        self._touched[bag.bag_id] = bag

    def close_bag(self, bag: BagRecord, state: BagState, now: float, changes: Changes) -> None:
        """End a bag; its overdue instances are forgotten (a report from one now is ignored), and the replicas
        still running of its done jobs (`let_replicas_finish`) are cancelled on their hosts."""
        bag.state = check_transition(BAG_TRANSITIONS, bag.state, state)
        bag.window.buffer.clear()
        bag.retry.clear()
        bag.replicas.clear()
        bag.failover.clear()
        for iid in [i for i, inst in self.s.instances.items() if inst.job.bag_id == bag.bag_id]:
            inst = self.s.instances[iid]
            if self.detach(inst):  # (off its host's running set too: the host's next exchange is not a loss)
                self.move(inst, InstanceState.CANCELLED, now, f"its bag {state.value}", None, changes)
                host = self.s.hosts.get(inst.host_id)
                if host is not None:
                    host.cancel.add(iid)
            self.s.instances.pop(iid, None)
        for job_id in [j.job_id for j in self.s.jobs.values() if j.bag_id == bag.bag_id]:
            del self.s.jobs[job_id]
        self._touched.pop(bag.bag_id, None)
        changes.bags[bag.bag_id] = BagUpdate(bag.bag_id, state, _copy(bag.counts), now)
        del self.s.bags[bag.bag_id]
        tail: list[str] = guarded(bag, f"tail={bag.tail_strategy.name} notes", [], bag.tail_strategy.notes,
                                  self.view, BagView(bag), now)
        notes = [*bag.policies.messages(), *tail, *([bag.strategy_error] if bag.strategy_error else []),
                 *deadline_before_timeout(bag)]
        self.s.ended_notes.pop(bag.bag_id, None)  # (a bag reopened and ended again says only its last run's)
        if notes:
            self.s.ended_notes[bag.bag_id] = notes
            if len(self.s.ended_notes) > ENDED_NOTES:
                del self.s.ended_notes[next(iter(self.s.ended_notes))]

    # -- checks ---------------------------------------------------------------------------------------

    def check(self) -> None:
        """Counters agree with the jobs held (only with `check_invariants`, as it walks everything)."""
        if not self.s.config.check_invariants:
            return
        s = self.s
        for bag in s.bags.values():
            running = sum(1 for j in s.jobs.values() if j.bag_id == bag.bag_id and j.state is JobState.RUNNING)
            assert running == bag.counts.running, (bag.bag_id, running, bag.counts)
            assert min(bag.counts.queued, bag.counts.running, bag.counts.done, bag.counts.failed) >= 0, bag.counts
        assert set(s.running) == {i for i, x in s.instances.items() if x.state is InstanceState.RUNNING}
        for iid, inst in s.instances.items():
            assert inst.state in (InstanceState.RUNNING, InstanceState.OVERDUE), (iid, inst.state)
            assert (iid in inst.job.live) == (inst.state is InstanceState.RUNNING), iid


_COUNTER = {s: s.value for s in JobState}
"""The BagCounts field of each job state."""


def _copy(counts: BagCounts) -> BagCounts:
    return msgspec.structs.replace(counts)


ADAPTIVE_STREAK = 10
"""Valid results in a row after which a host gets quorum jobs unreplicated (BOINC's adaptive replication)."""


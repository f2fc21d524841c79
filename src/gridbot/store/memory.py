"""A store in memory: for unit tests and the simulator; same contract as the SQL stores, no durability."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from gridbot.core.changes import (
    ENDED_STATES,
    HISTORY_ROWS,
    BagCounts,
    BagSnapshot,
    Changes,
    Decision,
    EndedRow,
    Event,
    HostSnapshot,
    LiveInstance,
    QueuedJob,
    Snapshot,
    VoteRow,
)
from gridbot.core.ledger import Ledger, Usage
from gridbot.model.spec import BagSpec
from gridbot.model.states import PILOT_TERMINAL, BagState, InstanceState, JobState
from gridbot.store.base import (
    RETIRED,
    BagExists,
    BagRow,
    InstanceRow,
    JobRow,
    JobStoryRow,
    PilotRow,
    ResultRow,
    Store,
    StoryInstanceRow,
    retiring_event,
    spec_hash,
)

FAILURES = (InstanceState.FAILED, InstanceState.OVERDUE)
"""The instances that count as a job's failures: a failed job's result shows the newest of them."""

@dataclass
class _Inst:
    row: InstanceRow
    bag_id: int
    instance_deadline: float
    replica: bool = False
    sent_event: int | None = None
    end_event: int | None = None
    overdue_event: int | None = None
    vote: bytes | None = None


@dataclass
class _Data:
    bags: dict[int, BagRow] = field(default_factory=dict)
    inputs: dict[tuple[int, str], bytes] = field(default_factory=dict)
    jobs: dict[int, JobRow] = field(default_factory=dict)
    job_ids: dict[int, list[int]] = field(default_factory=dict)
    instances: dict[int, _Inst] = field(default_factory=dict)
    by_job: dict[int, list[int]] = field(default_factory=dict)
    outputs: dict[int, dict[str, bytes]] = field(default_factory=dict)
    hosts: dict[str, HostSnapshot] = field(default_factory=dict)
    revisions: dict[int, dict[int, BagSpec]] = field(default_factory=dict)
    events: dict[int, Event] = field(default_factory=dict)
    decisions: dict[int, list[Decision]] = field(default_factory=dict)
    """The strategies' decisions about each job, by job id, in the order they were made."""
    pilots: list[PilotRow] = field(default_factory=list)
    enrollments: dict[str, tuple[int, float]] = field(default_factory=dict)
    live_pilots: dict[tuple[str, str], int] = field(default_factory=dict)
    """Where each live pilot is in `pilots`, by pool and native id."""
    floors: dict[str, int] = field(default_factory=lambda: {"bags": 0, "jobs": 0, "instances": 0})
    """The highest bag, job and instance ids deleted bags had: no id is given twice (as `id_floors`)."""


class MemoryStore(Store):
    """Everything in dictionaries; `apply` is atomic because it cannot fail half-way on valid changes."""

    def __init__(self) -> None:
        self.d = _Data()

    def migrate(self) -> None:
        """Nothing to migrate in memory."""

    def create_bag(self, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes], now: float,
                   owner: str = "") -> BagRow:
        if any(b.name == spec.name for b in self.d.bags.values()):
            raise BagExists(f"a bag named '{spec.name}' exists already")
        bag_id = max(max(self.d.bags, default=0), self.d.floors["bags"]) + 1
        total = len(lines) if lines is not None else spec.sweep_size
        row = BagRow(bag_id, spec.name, spec, spec_hash(spec, lines, inputs), BagState.ACTIVE,
                     BagCounts(queued=total), total, now, None, owner)
        self.d.bags[bag_id] = row
        first = max(max(self.d.jobs, default=0), self.d.floors["jobs"]) + 1
        ids = list(range(first, first + total))
        self.d.job_ids[bag_id] = ids
        for i, job_id in enumerate(ids):
            self.d.jobs[job_id] = JobRow(job_id, bag_id, i, lines[i] if lines is not None else None,
                                         JobState.QUEUED, 0, 0, None, None)
        for name, data in inputs.items():
            self.d.inputs[(bag_id, name)] = data
        return row

    def set_spec(self, bag_id: int, spec: BagSpec) -> None:
        self.d.bags[bag_id] = msgspec.structs.replace(self.d.bags[bag_id], spec=spec)

    def revise(self, bag_id: int, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes],
               now: float) -> BagRow:
        d = self.d
        old = d.bags[bag_id]
        d.revisions.setdefault(bag_id, {})[old.revision] = old.spec
        row = d.bags[bag_id] = msgspec.structs.replace(old, spec=spec, spec_hash=spec_hash(spec, lines, inputs),
                                                       revision=old.revision + 1)
        for key in [k for k in d.inputs if k[0] == bag_id]:
            del d.inputs[key]
        for name, data in inputs.items():
            d.inputs[(bag_id, name)] = data
        for job_id in d.job_ids.get(bag_id, []):
            job = d.jobs[job_id]
            if job.state is not JobState.DONE:
                line = lines[job.index] if lines is not None else job.line
                d.jobs[job_id] = msgspec.structs.replace(job, line=line, revision=row.revision)
        return row

    def revisions(self, bag_id: int) -> dict[int, BagSpec]:
        return dict(self.d.revisions.get(bag_id, {}))

    def delete_bag(self, bag_id: int) -> None:
        d = self.d
        jobs = d.job_ids.get(bag_id, [])
        for name, top in (("bags", bag_id), ("jobs", max(jobs, default=0)),
                          ("instances", max((i for j in jobs for i in d.by_job.get(j, [])), default=0))):
            d.floors[name] = max(d.floors[name], top)
        for job_id in d.job_ids.pop(bag_id, []):
            del d.jobs[job_id]
            d.decisions.pop(job_id, None)
            for iid in d.by_job.pop(job_id, []):
                d.instances.pop(iid, None)
                d.outputs.pop(iid, None)
        for key in [k for k in d.inputs if k[0] == bag_id]:
            del d.inputs[key]
        d.revisions.pop(bag_id, None)
        del d.bags[bag_id]
        self._prune()

    def _keep_events(self, changes: Changes, retiring: int | None) -> None:
        """Keep the batch's events that a row of it cites (`Store.apply`)."""
        if not changes.events:
            return
        cited = {n.event_id for n in changes.new_instances}
        cited.update(u.event_id for u in changes.instances)
        cited.update(x.event_id for x in changes.decisions)
        cited.add(retiring or 0)
        for event in changes.events:
            if event.event_id in cited and event.event_id:
                self.d.events.setdefault(event.event_id, event)

    def _prune(self) -> None:
        """Forget the events nothing refers to any more, but the highest: ids go on from it after a restart."""
        d = self.d
        gone = set(d.events)
        gone.discard(max(d.events, default=0))
        for inst in d.instances.values():
            gone.difference_update((inst.sent_event, inst.end_event, inst.overdue_event))
        for decisions in d.decisions.values():
            gone.difference_update(x.event_id for x in decisions)
        for event_id in gone:
            del d.events[event_id]

    def mark_downloaded(self, bag_id: int, now: float) -> None:
        self.d.bags[bag_id] = msgspec.structs.replace(self.d.bags[bag_id], downloaded_at=now)

    def bag(self, ref: str | int) -> BagRow | None:
        if isinstance(ref, int) or ref.isdigit():
            return self.d.bags.get(int(ref))
        return next((b for b in self.d.bags.values() if b.name == ref), None)

    def bags(self) -> list[BagRow]:
        return sorted(self.d.bags.values(), key=lambda b: b.bag_id)

    def snapshot(self) -> Snapshot:
        active = {b.bag_id for b in self.d.bags.values() if b.state is BagState.ACTIVE}
        live = []
        for iid in sorted(self.d.instances):
            inst = self.d.instances[iid]
            if inst.bag_id in active and inst.row.state in (InstanceState.RUNNING, InstanceState.OVERDUE):
                job = self.d.jobs[inst.row.job_id]
                live.append(LiveInstance(iid, job.job_id, inst.bag_id, inst.row.host_id, inst.row.state,
                                         inst.row.sent_at, inst.instance_deadline, job.index, job.line, job.state,
                                         job.failures, job.attempts))
        bags = [BagSnapshot(b.bag_id, b.spec, b.counts, b.created_at, b.revision) for b in self.bags()
                if b.bag_id in active]
        ledger = Ledger()
        for inst in self.d.instances.values():
            if inst.row.wall_s is not None:
                ledger.charge(inst.bag_id, inst.row.host_id, inst.row.wall_s, inst.row.ended_at or 0.0)
        usage = [Usage(b, h, int(n), s, ledger.last_use.get(h, 0.0)) for b, hosts in ledger.by_bag.items()
                 for h, (n, s) in hosts.items()]
        pools = {h.info.host_id: h.info.pool for h in self.d.hosts.values()}
        ended: dict[int, list[EndedRow]] = {}
        for iid in sorted(self.d.instances):
            inst = self.d.instances[iid]
            if inst.bag_id in active and inst.row.state in ENDED_STATES:
                ended.setdefault(inst.bag_id, []).append(EndedRow(
                    inst.bag_id, iid, inst.row.sent_at, inst.row.ended_at, inst.row.state,
                    pools.get(inst.row.host_id, "")))
        history = [row for rows in ended.values() for row in rows[-HISTORY_ROWS:]]
        votes = []
        for iid in sorted(self.d.instances):
            inst = self.d.instances[iid]
            job = self.d.jobs[inst.row.job_id]
            if (inst.vote is not None and inst.bag_id in active and inst.row.state is InstanceState.DONE
                    and job.state in (JobState.QUEUED, JobState.RUNNING)):
                votes.append(VoteRow(iid, job.job_id, inst.bag_id, inst.row.host_id, inst.row.sent_at,
                                     inst.row.ended_at or 0.0, inst.row.cpu_s or 0.0, inst.vote, job.index, job.line,
                                     job.state, job.failures, job.attempts))
        next_instance = max(max(self.d.instances, default=0), self.d.floors["instances"]) + 1
        return Snapshot(bags, live, list(self.d.hosts.values()), next_instance, max(self.d.events, default=0) + 1,
                        usage, history, votes)

    def queued_jobs(self, bag_id: int, after: int, limit: int) -> list[QueuedJob]:
        ids = self.d.job_ids.get(bag_id, [])
        out = []
        for job_id in ids[bisect.bisect_right(ids, after):]:
            job = self.d.jobs[job_id]
            if job.state is JobState.QUEUED:
                out.append(QueuedJob(job.job_id, job.index, job.line, job.failures, job.attempts))
                if len(out) >= limit:
                    break
        return out

    def apply(self, changes: Changes) -> None:
        d = self.d
        for n in changes.new_instances:
            d.instances[n.instance_id] = _Inst(
                InstanceRow(n.instance_id, n.job_id, n.host_id, InstanceState.RUNNING, n.sent_at, None, None, None,
                            None, None, None, None), n.bag_id, n.instance_deadline, n.replica, n.event_id or None)
            d.by_job.setdefault(n.job_id, []).append(n.instance_id)
        for u in changes.instances:
            inst = d.instances[u.instance_id]
            r = u.report
            old = inst.row
            inst.row = InstanceRow(
                old.instance_id, old.job_id, old.host_id, u.state, old.sent_at, u.at, u.reason,
                r.exit_code if r else old.exit_code, r.wall_s if r else old.wall_s, r.cpu_s if r else old.cpu_s,
                r.stdout_tail if r else old.stdout_tail, r.stderr_tail if r else old.stderr_tail)
            if u.state is not InstanceState.OVERDUE:
                inst.end_event = u.event_id or inst.end_event
            elif u.event_id:  # it has not ended: its event is the one that found it overdue
                inst.overdue_event = u.event_id
            if u.state is InstanceState.DONE and r is not None and r.outputs:
                d.outputs[u.instance_id] = dict(r.outputs)
            if u.vote is not None:
                inst.vote = u.vote
        for bag_id in changes.cancelled_bags:
            for job_id in d.job_ids.get(bag_id, []):
                job = d.jobs[job_id]
                if job.state is JobState.QUEUED:
                    d.jobs[job_id] = _replace_job(job, state=JobState.CANCELLED)
        for j in changes.jobs.values():
            old_job = d.jobs[j.job_id]
            d.jobs[j.job_id] = JobRow(old_job.job_id, old_job.bag_id, old_job.index, old_job.line, j.state,
                                      j.failures, j.attempts, j.reason or old_job.reason,
                                      j.result_instance if j.result_instance is not None else old_job.result_instance,
                                      old_job.revision)
        retiring, retired = retiring_event(changes), False
        for job_id in dict.fromkeys(changes.retired_jobs):
            for iid in d.by_job.get(job_id, []):
                inst = d.instances[iid]
                inst.vote = None
                if inst.row.state is InstanceState.OVERDUE:
                    inst.row = msgspec.structs.replace(inst.row, state=InstanceState.CANCELLED, reason=RETIRED)
                    inst.end_event, retired = retiring or inst.end_event, True
        for decision in changes.decisions:
            d.decisions.setdefault(decision.job_id, []).append(decision)
        self._keep_events(changes, retiring if retired else None)
        for bag_id in changes.reopened_bags:  # before the bag's update, which may end it again
            d.bags[bag_id] = msgspec.structs.replace(d.bags[bag_id], finished_at=None, downloaded_at=None)
        for b in changes.bags.values():
            old_bag = d.bags[b.bag_id]
            d.bags[b.bag_id] = BagRow(old_bag.bag_id, old_bag.name, old_bag.spec, old_bag.spec_hash, b.state,
                                      b.counts, old_bag.total, old_bag.created_at,
                                      b.finished_at if b.finished_at is not None else old_bag.finished_at,
                                      old_bag.owner, old_bag.revision, old_bag.downloaded_at)
        for h in changes.hosts.values():
            prior = d.hosts.get(h.info.host_id)
            d.hosts[h.info.host_id] = HostSnapshot(h.info, prior.first_seen if prior else h.first_seen, h.last_seen,
                                                   msgspec.structs.replace(h.stats))

    def jobs(self, bag_id: int, state: JobState | None = None, limit: int = 1000, after: int = 0) -> list[JobRow]:
        ids = self.d.job_ids.get(bag_id, [])
        out = []
        for job_id in ids[bisect.bisect_right(ids, after):]:
            job = self.d.jobs[job_id]
            if state is None or job.state is state:
                out.append(job)
                if len(out) >= limit:
                    break
        return out

    def instances_of(self, job_id: int) -> list[InstanceRow]:
        return [self.d.instances[i].row for i in self.d.by_job.get(job_id, [])]

    def outputs_of(self, instance_id: int) -> dict[str, bytes]:
        return dict(self.d.outputs.get(instance_id, {}))

    def story(self, job_id: int) -> JobStoryRow | None:
        d = self.d
        job = d.jobs.get(job_id)
        if job is None:
            return None
        instances = []
        for iid in d.by_job.get(job_id, []):
            inst, r = d.instances[iid], d.instances[iid].row
            host = d.hosts.get(r.host_id)
            instances.append(StoryInstanceRow(
                r.instance_id, r.host_id, host.info.name if host else None, host.info.pool if host else None, r.state,
                r.sent_at, inst.instance_deadline, r.ended_at, r.reason or None, r.exit_code, r.wall_s, r.cpu_s,
                inst.replica, inst.sent_event, inst.end_event, inst.overdue_event))
        decisions = list(d.decisions.get(job_id, []))
        cited = {x.event_id for x in decisions}
        for i in instances:
            cited.update(e for e in (i.sent_event, i.end_event, i.overdue_event) if e is not None)
        return JobStoryRow(job, instances, decisions, [d.events[e] for e in sorted(cited) if e in d.events])

    def results(self, bag_id: int, after: int = 0, limit: int = 500) -> list[ResultRow]:
        out = []
        for job in self.jobs(bag_id, None, limit=len(self.d.job_ids.get(bag_id, [])), after=after):
            if job.state not in (JobState.DONE, JobState.FAILED):
                continue
            iid = job.result_instance
            if iid is None and (mine := self.d.by_job.get(job.job_id)):
                # a failed job shows its last failure, not a replica stopped when it failed for good, and never
                # a result no quorum accepted (a bag with `quorum`)
                kept = [i for i in reversed(mine) if self.d.instances[i].row.state is not InstanceState.DONE]
                iid = next((i for i in kept if self.d.instances[i].row.state in FAILURES), kept[0] if kept else None)
            inst = self.d.instances[iid].row if iid is not None else None
            out.append(ResultRow(job, inst, dict(self.d.outputs.get(iid, {})) if iid is not None else {}))
            if len(out) >= limit:
                break
        return out

    def input_file(self, bag_id: int, name: str) -> bytes | None:
        return self.d.inputs.get((bag_id, name))

    def hosts(self) -> list[HostSnapshot]:
        return list(self.d.hosts.values())

    def spend_enrollment(self, nonce: str, uses: int, expires: float, now: float) -> bool:
        d = self.d
        d.enrollments = {n: v for n, v in d.enrollments.items() if v[1] > now}
        used = d.enrollments.get(nonce, (0, expires))[0]
        if used >= uses:
            return False
        d.enrollments[nonce] = (used + 1, expires)
        return True

    def save_pilots(self, new: Sequence[PilotRow], changed: Sequence[PilotRow]) -> None:
        d = self.d
        for row in new:
            d.pilots.append(row)
            if row.state not in PILOT_TERMINAL:
                d.live_pilots[(row.pool, row.native_id)] = len(d.pilots) - 1
        for row in changed:
            at = d.live_pilots.pop((row.pool, row.native_id), None)
            if at is None:
                continue
            d.pilots[at] = msgspec.structs.replace(d.pilots[at], state=row.state, started_at=row.started_at,
                                                   ended_at=row.ended_at)
            if row.state not in PILOT_TERMINAL:
                d.live_pilots[(row.pool, row.native_id)] = at

    def pilots(self, live: bool = False) -> list[PilotRow]:
        return [p for p in self.d.pilots if not live or p.state not in PILOT_TERMINAL]


def _replace_job(job: JobRow, state: JobState) -> JobRow:
    return JobRow(job.job_id, job.bag_id, job.index, job.line, state, job.failures, job.attempts, job.reason,
                  job.result_instance, job.revision)

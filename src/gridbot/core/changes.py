"""Decisions of the dispatcher, as typed records that a store applies in one transaction.

The dispatcher never writes anything itself: each event returns a `Changes`, and the server makes it
durable before answering the host that caused it. Every instance change carries its cause, so the
question "why did job 42 run three times?" has an answer in the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from gridbot.core.hosts import HostStats
from gridbot.core.ledger import Usage
from gridbot.model.records import HostInfo, InstanceReport
from gridbot.model.spec import BagSpec
from gridbot.model.states import BagState, InstanceState, JobState


class Event(msgspec.Struct, frozen=True):
    """What caused a batch of changes: one call into the dispatcher. Every change made by it carries its
    `event_id`, so a job's story can say, of each of its instances, why it started and why it ended."""

    event_id: int
    """Increasing over the server's life (the store gives the next one after a restart)."""
    at: float
    kind: str
    """request (a host's exchange), report, tick, cancel, retry, revise, policy (a live policy change)."""
    source: str = ""
    """The host of a request or report; the bag of an owner's act."""


class Decision(msgspec.Struct, frozen=True):
    """A strategy's decision about a job, and why: `gridbot jobs BAG JOB --story` prints them."""

    event_id: int
    bag_id: int
    job_id: int
    strategy: str
    """Which strategy decided, as the bag's spec names it: `tail=gridbot`, `placement=gridbot`."""
    action: str
    """replicate, migrate, veto or deadline."""
    why: str


class NewInstance(msgspec.Struct, frozen=True):
    """An instance created and sent to a host."""

    instance_id: int
    job_id: int
    bag_id: int
    host_id: str
    sent_at: float
    instance_deadline: float
    event_id: int = 0
    """The event that sent it (a host's request)."""
    replica: bool = False
    """Sent as a speculative replica (the tail strategy's decision) rather than for a queued job."""


class InstanceUpdate(msgspec.Struct, frozen=True):
    """An instance moved to `state` at time `at`, because of `reason`; `report` is what its host said."""

    instance_id: int
    state: InstanceState
    at: float
    reason: str = ""
    report: InstanceReport | None = None
    event_id: int = 0
    """The event that moved it (a report, a tick that found it late, a cancel, ...)."""
    vote: bytes | None = None
    """A quorum job's result waiting for its quorum: what it says (the digest the quorum compares), kept so that
    a restarted server counts it still (`Snapshot.votes`)."""


class JobUpdate(msgspec.Struct, frozen=True):
    """A job's new state and counters; `result_instance` is set once the job is done."""

    job_id: int
    state: JobState
    failures: int
    attempts: int
    reason: str = ""
    result_instance: int | None = None
    sent: bool = False
    """The only change is that a queued job was sent (running, one more attempt). The new instance's row
    says as much, so a store may skip this update; the store then shows the job as queued with a
    running instance, which its listings and `Snapshot` read as running (issue 6: one row write less
    per job)."""


class BagCounts(msgspec.Struct):
    """Per-bag counters kept by the dispatcher and mirrored into the store."""

    queued: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0
    cancelled: int = 0
    instances: int = 0
    wasted: int = 0
    overdue: int = 0
    reruns: int = 0
    """Jobs sent out more than once (after a failure, a lost host or replication)."""
    replicas: int = 0
    """Instances created by speculative replication (GridBot Algorithm 2)."""

    @property
    def total(self) -> int:
        return self.queued + self.running + self.done + self.failed + self.cancelled


class BagUpdate(msgspec.Struct, frozen=True):
    """A bag's state and counters after a batch of events."""

    bag_id: int
    state: BagState
    counts: BagCounts
    finished_at: float | None = None


class HostUpdate(msgspec.Struct, frozen=True):
    """What the server knows about a host, written on every contact."""

    info: HostInfo
    first_seen: float
    last_seen: float
    stats: HostStats


@dataclass
class Changes:
    """Everything one event changed, in the order a store must apply it."""

    events: list[Event] = field(default_factory=list)
    """The events these changes came from (one, or several merged into one commit)."""
    decisions: list[Decision] = field(default_factory=list)
    """Strategies' decisions made by these events, for the jobs' stories."""
    new_instances: list[NewInstance] = field(default_factory=list)
    instances: list[InstanceUpdate] = field(default_factory=list)
    jobs: dict[int, JobUpdate] = field(default_factory=dict)
    bags: dict[int, BagUpdate] = field(default_factory=dict)
    hosts: dict[str, HostUpdate] = field(default_factory=dict)
    cancelled_bags: list[int] = field(default_factory=list)
    """Bags cancelled by their owner: the store cancels their queued jobs that the dispatcher never saw."""
    reopened_bags: list[int] = field(default_factory=list)
    """Ended bags made active again by their owner's retry: the store clears their end time and the mark of
    their results having been downloaded (new results are coming)."""
    retired_jobs: list[int] = field(default_factory=list)
    """Jobs retried or revised: the store cancels their overdue instances of the old run, so that after a
    restart a late report of one cannot complete the job as it is now."""

    def merge(self, other: Changes) -> Changes:
        """Append `other` to this batch (later updates of the same job or bag win, but a result, a reason
        or an end time already in this batch is kept when the later update leaves it out, as a store
        applying the two batches one after the other would keep it)."""
        self.events.extend(other.events)
        self.decisions.extend(other.decisions)
        self.new_instances.extend(other.new_instances)
        self.instances.extend(other.instances)
        for job_id, j in other.jobs.items():
            prior = self.jobs.get(job_id)
            if prior is not None and ((j.result_instance is None and prior.result_instance is not None)
                                      or (not j.reason and prior.reason) or j.sent):
                # a send after another change of the job in the same batch must be written with it
                j = JobUpdate(j.job_id, j.state, j.failures, j.attempts, j.reason or prior.reason,
                              j.result_instance if j.result_instance is not None else prior.result_instance)
            self.jobs[job_id] = j
        for bag_id, b in other.bags.items():
            prior_bag = self.bags.get(bag_id)
            if prior_bag is not None and b.finished_at is None and prior_bag.finished_at is not None:
                b = BagUpdate(b.bag_id, b.state, b.counts, prior_bag.finished_at)
            self.bags[bag_id] = b
        self.hosts.update(other.hosts)
        self.cancelled_bags.extend(other.cancelled_bags)
        self.reopened_bags.extend(other.reopened_bags)
        self.retired_jobs.extend(other.retired_jobs)
        return self

    def __bool__(self) -> bool:
        return bool(self.new_instances or self.instances or self.jobs or self.bags or self.hosts
                    or self.cancelled_bags or self.reopened_bags or self.retired_jobs or self.decisions)


class QueuedJob(msgspec.Struct, frozen=True):
    """A queued job as the feeder reads it from the store."""

    job_id: int
    index: int
    line: str | None = None
    failures: int = 0
    attempts: int = 0


class LiveInstance(msgspec.Struct, frozen=True):
    """A running or overdue instance of an active bag, as the store holds it across a restart."""

    instance_id: int
    job_id: int
    bag_id: int
    host_id: str
    state: InstanceState
    sent_at: float
    instance_deadline: float
    job_index: int
    job_line: str | None
    job_state: JobState
    job_failures: int
    job_attempts: int


class VoteRow(msgspec.Struct, frozen=True):
    """A result of a queued or running quorum job of an active bag, stored while its quorum is not in."""

    instance_id: int
    job_id: int
    bag_id: int
    host_id: str
    sent_at: float
    ended_at: float
    cpu_s: float
    vote: bytes
    job_index: int
    job_line: str | None
    job_state: JobState
    job_failures: int
    job_attempts: int


class BagSnapshot(msgspec.Struct, frozen=True):
    """An active bag as the store holds it."""

    bag_id: int
    spec: BagSpec
    counts: BagCounts
    created_at: float
    revision: int = 1
    """How many times its owner revised the spec (`gridbot run --retry-failed` with a changed spec); sent
    with each assignment, so a worker fetches the inputs of the revision it runs."""


class HostSnapshot(msgspec.Struct, frozen=True):
    """A known host with its statistics."""

    info: HostInfo
    first_seen: float
    last_seen: float
    stats: HostStats


class Snapshot(msgspec.Struct, frozen=True):
    """What the dispatcher needs to resume after a restart."""

    bags: list[BagSnapshot]
    instances: list[LiveInstance]
    hosts: list[HostSnapshot]
    next_instance_id: int
    next_event_id: int = 1
    """One more than the highest event id the store holds."""
    usage: list[Usage] = msgspec.field(default_factory=list)
    """Every bag's instances that ended with a report, per host: the ledger's spend (core/ledger.py)."""
    history: list[EndedRow] = msgspec.field(default_factory=list)
    """The active bags' last instances that ended or were lost (at most `HISTORY_ROWS` each), oldest first:
    what their strategies characterize the pools and the bags' work from (BagRecord.history)."""
    votes: list[VoteRow] = msgspec.field(default_factory=list)
    """The quorum jobs' results still waiting for their quorum, oldest first."""


HISTORY_ROWS = 2_000
"""Ended instances of each active bag a restart takes up again."""
ENDED_STATES = (InstanceState.DONE, InstanceState.WASTED, InstanceState.FAILED, InstanceState.OVERDUE)
"""The states of an instance that ended (or was lost) as a bag's history counts it."""


class EndedRow(NamedTuple):
    """An instance of an active bag that ended or was lost, as the store holds it."""

    bag_id: int
    instance_id: int
    sent_at: float
    ended_at: float | None
    state: InstanceState
    pool: str

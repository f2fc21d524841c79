"""The store interface: what the server keeps durable, behind one narrow API with three implementations.

`MemoryStore` serves unit tests and the simulator, `SQLiteStore` is the embedded default, and
`PostgresStore` serves shared deployments. One conformance suite (tests/integration/test_store_*.py)
runs against all three. A `Changes` batch is applied in one transaction: once `apply` returns, what
it holds survives a crash of the server.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import msgspec

from gridbot.core.changes import BagCounts, Changes, Decision, Event, HostSnapshot, QueuedJob, Snapshot
from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.model.spec import BagSpec, StrategyChoice
from gridbot.model.states import BagState, InstanceState, JobState, PilotState


class StoreError(GridbotError):
    """The store could not do what was asked (bad URL, unreachable database, conflicting name)."""


class StoreUnavailable(StoreError, ServerUnavailable):
    """The database cannot be reached or used right now (connection lost, disk full, locked): a request
    may succeed later, and the server answers 503 with Retry-After meanwhile."""

    retryable = True


class ClaimLost(StoreUnavailable):
    """Another gridbot server took the database while this one's connection to it was lost: this server
    is no longer its writer and must stop (a request is answered 503 until it has)."""


class BagExists(StoreError):
    """A bag with that name exists already."""


class BagRow(msgspec.Struct, frozen=True):
    """A bag as stored, with its counters."""

    bag_id: int
    name: str
    spec: BagSpec
    spec_hash: str
    state: BagState
    counts: BagCounts
    total: int
    created_at: float
    finished_at: float | None
    owner: str = ""
    """The name of the submitter key that submitted the bag ("" for bags stored before keys existed)."""
    revision: int = 1
    """1 as submitted, one more at each revision of its spec (`Store.revise`)."""
    downloaded_at: float | None = None
    """When the results of the ended bag were last read to their end (None: never, or it ran again since),
    so deleting a bag whose results nobody fetched can be refused."""


class JobRow(msgspec.Struct, frozen=True):
    """A job as stored; `reason` is the last failure's reason."""

    job_id: int
    bag_id: int
    index: int
    line: str | None
    state: JobState
    failures: int
    attempts: int
    reason: str | None
    result_instance: int | None
    revision: int = 1
    """The bag's revision whose command the job runs, or ran for its result: done jobs keep the revision of
    their result when the bag is revised, the others take the new one."""


class InstanceRow(msgspec.Struct, frozen=True):
    """An instance as stored, with what its host reported."""

    instance_id: int
    job_id: int
    host_id: str
    state: InstanceState
    sent_at: float
    ended_at: float | None
    reason: str | None
    exit_code: int | None
    wall_s: float | None
    cpu_s: float | None
    stdout_tail: str | None
    stderr_tail: str | None


class StoryInstanceRow(msgspec.Struct, frozen=True):
    """An instance as a job's story tells it: where it ran and how it ended, with the events that sent it,
    made it overdue and ended it (None where no event was recorded: a cause the store was not told)."""

    instance_id: int
    host_id: str
    host_name: str | None
    """The host's name and pool as the server knows them now (None: the host is not in the store)."""
    pool: str | None
    state: InstanceState
    sent_at: float
    instance_deadline: float
    ended_at: float | None
    reason: str | None
    exit_code: int | None
    wall_s: float | None
    cpu_s: float | None
    replica: bool
    """Sent as a speculative replica of a running job rather than for a queued one."""
    sent_event: int | None
    end_event: int | None
    """The event that ended it (None while it runs or is overdue: found overdue, it has not ended)."""
    overdue_event: int | None
    """The event that found it overdue (a late report may end it afterwards)."""


class JobStoryRow(msgspec.Struct, frozen=True):
    """A job's life as stored: the job, its instances oldest first, the strategies' decisions about it in
    the order they were made, and every event these refer to, by id."""

    job: JobRow
    instances: list[StoryInstanceRow]
    decisions: list[Decision]
    events: list[Event]


class ResultRow(msgspec.Struct, frozen=True):
    """A finished job with the instance whose result it kept and that instance's output files."""

    job: JobRow
    instance: InstanceRow | None
    outputs: dict[str, bytes]


class PilotRow(msgspec.Struct, frozen=True):
    """A pilot the overlay submitted, as stored, so that a restarted server takes it up again."""

    pool: str
    native_id: str
    """The pool's id of it: a batch job's id, an EC2 instance id, `local-<pid>`."""
    state: PilotState
    submitted_at: float
    started_at: float | None = None
    """When it was first seen running (None: not yet, or it ended between two polls)."""
    ended_at: float | None = None


RETIRED = "the job was retried or revised: a late result of this run is not wanted"
"""The reason the stores give the overdue instances of a retried or revised job (`Changes.retired_jobs`)."""
LATER_FIELDS: dict[str, object] = {"memory": None, "cpu_time": None, "max_file_size": None, "max_processes": None,
                                   "strategy": msgspec.to_builtins(StrategyChoice()), "cpus": 1, "quorum": 1,
                                   "max_instances": None, "spot_check": 0.1, "compare": ""}
"""Spec fields added since the first stores were made (issue 11's limits, issue 13's strategies, issue 18's
cpus, issue 19's quorum), with their defaults."""


QOS_FIELDS = ("bag_deadline", "bag_deadline_at", "budget")
"""Spec fields that say what the owner asks of the run (issue 16), not what its work is: no part of the hash."""


def retiring_event(changes: Changes) -> int | None:
    """The owner's act that retired the batch's overdue instances (`Changes.retired_jobs`): its last retry or
    revision (None: no such event in it)."""
    if not changes.retired_jobs:
        return None
    return next((e.event_id for e in reversed(changes.events) if e.kind in ("retry", "revise")), None)


def spec_hash(spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes]) -> str:
    """A digest of everything that defines a bag's work, so a re-run can tell 'same bag' from 'changed'.

    Fields added to the spec after a store was made hash as they did before while they are unset, so a
    bag stored by an older gridbot still resumes."""
    fields = msgspec.to_builtins(spec)
    for name, default in LATER_FIELDS.items():
        if fields.get(name) == default:
            fields.pop(name, None)
    for name in QOS_FIELDS:  # what the owner asks of the run, not what the work is (`gridbot qos` changes it)
        fields.pop(name, None)
    h = hashlib.sha256(msgspec.json.encode(fields))
    for line in lines or ():
        h.update(line.encode() + b"\n")
    for name in sorted(inputs):
        h.update(name.encode() + b"\0" + hashlib.sha256(inputs[name]).digest())
    return h.hexdigest()[:16]


class Store(ABC):
    """What the server needs to keep: bags, jobs, instances with results, outputs, inputs and hosts."""

    threaded_writes = False
    """`apply` may run on a writer thread of its own while other methods are called from the server's
    thread (the SQL stores serialize them with a lock); the server then overlaps the commit of one
    batch with the decisions that go into the next."""

    @abstractmethod
    def migrate(self) -> None:
        """Bring the schema to the newest version (idempotent)."""

    @abstractmethod
    def create_bag(self, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes], now: float,
                   owner: str = "") -> BagRow:
        """Store a bag with all its jobs queued, atomically; raise BagExists if the name is taken."""

    @abstractmethod
    def set_spec(self, bag_id: int, spec: BagSpec) -> None:
        """Replace a bag's spec (its policies changed); its jobs and hash stay as submitted."""

    @abstractmethod
    def revise(self, bag_id: int, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes],
               now: float) -> BagRow:
        """Make `spec` the bag's next revision, atomically: its spec, hash and input files are replaced (the
        old spec is kept in `revisions`), and every job not done takes the new revision (and, in an each-line
        bag, its line of `lines`, by index). Done jobs keep their revision and line. States and counters are
        the dispatcher's business (`Changes`): they do not change here."""

    @abstractmethod
    def revisions(self, bag_id: int) -> dict[int, BagSpec]:
        """The specs of the bag's earlier revisions, by revision (empty for a bag never revised)."""

    @abstractmethod
    def delete_bag(self, bag_id: int) -> None:
        """Remove the bag and everything of it (jobs, instances, outputs, inputs, revisions, decisions), atomically,
        and the events nothing left refers to (but the highest: event ids go on from it after a restart)."""

    @abstractmethod
    def mark_downloaded(self, bag_id: int, now: float) -> None:
        """Record that the bag's results were read to their end (`BagRow.downloaded_at`)."""

    @abstractmethod
    def bag(self, ref: str | int) -> BagRow | None:
        """The bag with this id or name."""

    @abstractmethod
    def bags(self) -> list[BagRow]:
        """Every bag, oldest first."""

    @abstractmethod
    def snapshot(self) -> Snapshot:
        """What the dispatcher needs to resume: active bags, their live instances, hosts, and the next event id
        (one more than the highest stored)."""

    @abstractmethod
    def queued_jobs(self, bag_id: int, after: int, limit: int) -> list[QueuedJob]:
        """Up to `limit` queued jobs of a bag with ids above `after`, by id."""

    @abstractmethod
    def apply(self, changes: Changes) -> None:
        """Make a batch of dispatcher decisions durable, all or nothing.

        Of the batch's events, those a row of it refers to are kept (an instance sent, found overdue or
        ended, a decision): the others, a heartbeat's, say nothing of any job's story and would only grow
        the store."""

    @abstractmethod
    def jobs(self, bag_id: int, state: JobState | None = None, limit: int = 1000, after: int = 0) -> list[JobRow]:
        """Jobs of a bag, optionally in one state, by id, with ids above `after`."""

    @abstractmethod
    def instances_of(self, job_id: int) -> list[InstanceRow]:
        """Every instance of a job, oldest first (the job's story)."""

    @abstractmethod
    def outputs_of(self, instance_id: int) -> dict[str, bytes]:
        """The output files an instance's report brought, by name (a quorum's validator compares them)."""

    @abstractmethod
    def story(self, job_id: int) -> JobStoryRow | None:
        """The job's story (None: no such job), read in one transaction."""

    @abstractmethod
    def results(self, bag_id: int, after: int = 0, limit: int = 500) -> list[ResultRow]:
        """Ended jobs (done or failed) of a bag by id above `after`, with the kept result and outputs."""

    @abstractmethod
    def input_file(self, bag_id: int, name: str) -> bytes | None:
        """An input file staged into every job of the bag."""

    @abstractmethod
    def hosts(self) -> list[HostSnapshot]:
        """Every known host with its statistics."""

    @abstractmethod
    def save_pilots(self, new: Sequence[PilotRow], changed: Sequence[PilotRow]) -> None:
        """Record pilots just submitted (`new`) and the states and times of live ones (`changed`, found by pool
        and native id among those queued or running), all or nothing."""

    @abstractmethod
    def pilots(self, live: bool = False) -> list[PilotRow]:
        """The overlay's pilots in the order they were submitted; with `live`, only those queued or running."""

    @abstractmethod
    def spend_enrollment(self, nonce: str, uses: int, expires: float, now: float) -> bool:
        """Count one more host registered with the enrollment token `nonce` (good for `uses` hosts until
        `expires`), durably; False, counting nothing, if it has registered that many. Rows of tokens expired
        by `now` are dropped."""

    def claim(self) -> None:  # noqa: B027 - a store in memory belongs to its process anyway
        """Become the one server of this store, or raise StoreError if another process already is.

        Two dispatchers on one store would send the same jobs twice; the claim lasts until `close`.
        """

    def hold_claim(self) -> None:  # noqa: B027 - only a shared database's claim can be lost
        """Keep the claim (every tick of the server): on a shared database, look at the writing connection, and
        if it was lost, take the claim again at once rather than at the next write, which may be long in
        coming; ClaimLost (after `on_lost`'s hooks) if another server took it, StoreUnavailable while it
        cannot tell yet."""

    def on_lost(self, hook: Callable[[ClaimLost], None]) -> None:  # noqa: B027 - only a shared database is taken
        """Have `hook` called (on the thread that writes) if another server takes this store from this one
        (`ClaimLost`): its claim went with a lost connection, and another took it before it was taken again."""

    def ping(self) -> None:  # noqa: B027 - a store in memory is always there
        """Raise StoreUnavailable unless the database answers now (for /v1/health)."""

    def close(self) -> None:  # noqa: B027 - optional for stores with nothing to release
        """Release connections."""

"""The store interface: what the server keeps durable, behind one narrow API with three implementations.

`MemoryStore` serves unit tests and the simulator, `SQLiteStore` is the embedded default, and
`PostgresStore` serves shared deployments. One conformance suite (tests/integration/test_store_*.py)
runs against all three. A `Changes` batch is applied in one transaction: once `apply` returns, what
it holds survives a crash of the server.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Sequence

import msgspec

from gridbot.core.changes import BagCounts, Changes, HostSnapshot, QueuedJob, Snapshot
from gridbot.errors import GridbotError
from gridbot.model.spec import BagSpec
from gridbot.model.states import BagState, InstanceState, JobState


class StoreError(GridbotError):
    """The store could not do what was asked (bad URL, unreachable database, conflicting name)."""


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


class ResultRow(msgspec.Struct, frozen=True):
    """A finished job with the instance whose result it kept and that instance's output files."""

    job: JobRow
    instance: InstanceRow | None
    outputs: dict[str, bytes]


def spec_hash(spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes]) -> str:
    """A digest of everything that defines a bag's work, so a re-run can tell 'same bag' from 'changed'."""
    h = hashlib.sha256(msgspec.json.encode(spec))
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
    def create_bag(self, spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes], now: float) -> BagRow:
        """Store a bag with all its jobs queued, atomically; raise BagExists if the name is taken."""

    @abstractmethod
    def set_spec(self, bag_id: int, spec: BagSpec) -> None:
        """Replace a bag's spec (its policies changed); its jobs and hash stay as submitted."""

    @abstractmethod
    def bag(self, ref: str | int) -> BagRow | None:
        """The bag with this id or name."""

    @abstractmethod
    def bags(self) -> list[BagRow]:
        """Every bag, oldest first."""

    @abstractmethod
    def snapshot(self) -> Snapshot:
        """What the dispatcher needs to resume: active bags, their live instances, hosts."""

    @abstractmethod
    def queued_jobs(self, bag_id: int, after: int, limit: int) -> list[QueuedJob]:
        """Up to `limit` queued jobs of a bag with ids above `after`, by id."""

    @abstractmethod
    def apply(self, changes: Changes) -> None:
        """Make a batch of dispatcher decisions durable, all or nothing."""

    @abstractmethod
    def jobs(self, bag_id: int, state: JobState | None = None, limit: int = 1000, after: int = 0) -> list[JobRow]:
        """Jobs of a bag, optionally in one state, by id, with ids above `after`."""

    @abstractmethod
    def instances_of(self, job_id: int) -> list[InstanceRow]:
        """Every instance of a job, oldest first (the job's story)."""

    @abstractmethod
    def results(self, bag_id: int, after: int = 0, limit: int = 500) -> list[ResultRow]:
        """Ended jobs (done or failed) of a bag by id above `after`, with the kept result and outputs."""

    @abstractmethod
    def input_file(self, bag_id: int, name: str) -> bytes | None:
        """An input file staged into every job of the bag."""

    @abstractmethod
    def hosts(self) -> list[HostSnapshot]:
        """Every known host with its statistics."""

    def claim(self) -> None:  # noqa: B027 - a store in memory belongs to its process anyway
        """Become the one server of this store, or raise StoreError if another process already is.

        Two dispatchers on one store would send the same jobs twice; the claim lasts until `close`.
        """

    def close(self) -> None:  # noqa: B027 - optional for stores with nothing to release
        """Release connections."""

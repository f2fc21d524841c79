"""Plain typed records that cross layers: what a host says about itself, what it is sent, what it reports.

They are msgspec Structs so the worker protocol carries them as they are, with no per-message
conversion on the hot path.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Annotated

import msgspec

# What a field of a message from a host may hold, checked as msgspec decodes it (issue 12): a value that
# decodes but that the store cannot keep (an exit code of 2^31 in PostgreSQL's integer, an id of 2^63 in
# SQLite's) failed the whole group-committed batch, every other exchange in it with it; now it is a 400
# for its own request only. The limits are those of the stores' columns; decoding costs the same.
Int64 = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
"""An id or a count: what a BIGINT column holds, never negative."""
Int32 = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
"""A small count: what an INTEGER column holds, never negative."""
MAX_PILOT_CPUS = 65536
"""The most slots a pilot (a worker, a host) may have: a pools file's `cpus`, `gridbot worker --slots` and a
host's reported CPUs and slots are held to it."""
SlotCount = Annotated[int, msgspec.Meta(ge=1, le=MAX_PILOT_CPUS)]
"""A host's CPUs or slots: the planner counts a machine per slot, and a host that said it had 2^31 made it ask
for 16 GiB."""
ExitCode = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
"""An exit status, negative for a signal (as Python reports it)."""
Seconds = Annotated[float, msgspec.Meta(ge=0.0, le=1e12)]
"""A finite, non-negative time: NaN and infinities are refused, which SQLite would have stored as NULL."""
HostId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")]
"""A host id: the server's (20 hex digits), or a worker's own on a server without keys."""
Label = Annotated[str, msgspec.Meta(max_length=255, pattern=r"^[^\x00-\x1f\x7f]*\Z")]
"""A name shown in listings: at most 255 characters, no control characters (no NUL, newline or escape)."""


class HostInfo(msgspec.Struct, frozen=True):
    """A host's description of itself, sent with every work request.

    `host_id` is stable across restarts of the worker on the same machine, so the server's statistics
    about the host survive them.
    """

    host_id: HostId
    name: Label
    platform: Label = ""
    ncpus: SlotCount = 1
    memory_mb: Int64 = 0
    slots: SlotCount = 1
    pool: Label = "local"
    prefetch: Int32 = 0
    """Instances the worker would hold beyond its slots (more for short jobs); `Host.Prefetch` in policies."""
    session: Label = ""
    """A token of the worker process ("" where unknown): another one on the same host means the worker
    restarted, so instances it did not list were lost, rather than never received."""
    account: Label = ""
    """Whose machine it is, where the pool knows (a volunteer's account): a quorum never counts two results of
    one account ("": the host is its own account)."""
    speed: Annotated[float, msgspec.Meta(ge=0.0, le=1e9)] = 0.0
    """Floating-point speed of one of its CPUs in GFLOPS, where measured (a BOINC client's benchmark,
    `p_fpops`); 0: unknown. `Host.Speed` in policies."""


class Limits(msgspec.Struct, frozen=True):
    """A bag's resource limits, enforced on each of its jobs by the worker (None: unlimited).

    Sizes are in bytes and `cpu_time` in seconds; see docs/spec.md for what each one limits.
    """

    memory: int | None = None
    cpu_time: float | None = None
    max_file_size: int | None = None
    max_processes: int | None = None


class Assignment(msgspec.Struct, frozen=True):
    """One instance sent to a host: everything the worker needs to run it."""

    instance_id: int
    job_id: int
    bag_id: int
    bag_name: str
    index: int
    command: str
    env: dict[str, str]
    inputs: list[str]
    outputs: list[str]
    instance_deadline: float
    timeout: float | None = None
    limits: Limits | None = None
    """None when the bag sets no limit (the common case, and what older servers send)."""
    revision: int = 1
    """The bag's revision whose command and inputs this is: a worker keeps inputs per revision, since a
    revision may change an input's content under the same name."""
    cpus: int = 1
    """Slots the instance holds on its host (the bag's `cpus`): the worker starts it only when that many are free."""


class Outcome(StrEnum):
    """How an instance ended on its host."""

    SUCCESS = "success"
    """The command exited 0 and every declared output exists."""
    FAILURE = "failure"
    """The command failed (non-zero exit, signal, timeout, missing output, could not start)."""
    INTERRUPTED = "interrupted"
    """The worker stopped before the command ended: the job is re-queued with no failure counted."""


class InstanceReport(msgspec.Struct, frozen=True):
    """The end of one instance as its host saw it."""

    instance_id: Int64
    outcome: Outcome
    exit_code: ExitCode | None = None
    wall_s: Seconds = 0.0
    cpu_s: Seconds = 0.0
    reason: str = ""
    stdout_tail: str = ""
    stderr_tail: str = ""
    outputs: dict[str, bytes] = msgspec.field(default_factory=dict)

    @property
    def result_bytes(self) -> int:
        """Size of what the result would store: outputs and both tails."""
        return sum(len(v) for v in self.outputs.values()) + len(self.stdout_tail) + len(self.stderr_tail)


class Verdict(msgspec.Struct, frozen=True):
    """What the bag's validator found of a reported result of a quorum job (gridbot/server/validate.py)."""

    vote: bytes | None
    """The vote of the results it is equivalent to (None: none of them; the result votes on its own)."""
    note: str
    """What the comparisons said, for the instance's story: "validator close: equivalent to instance 12's"."""


def result_digest(r: InstanceReport) -> bytes:
    """What a quorum compares of a result: its stdout and its declared outputs, by name, byte for byte (the
    server's validators see the same parts: gridbot/model/validators.py)."""
    stdout = r.stdout_tail.encode("utf-8", "surrogatepass")
    h = hashlib.sha256(f"{len(stdout)}\0".encode())
    h.update(stdout)
    for name in sorted(r.outputs):
        data = r.outputs[name]
        h.update(f"\0{name}\0{len(data)}\0".encode("utf-8", "surrogatepass"))
        h.update(data)
    return h.digest()

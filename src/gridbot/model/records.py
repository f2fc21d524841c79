"""Plain typed records that cross layers: what a host says about itself, what it is sent, what it reports.

They are msgspec Structs so the worker protocol carries them as they are, with no per-message
conversion on the hot path.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec


class HostInfo(msgspec.Struct, frozen=True):
    """A host's description of itself, sent with every work request.

    `host_id` is stable across restarts of the worker on the same machine, so the server's statistics
    about the host survive them.
    """

    host_id: str
    name: str
    platform: str = ""
    ncpus: int = 1
    memory_mb: int = 0
    slots: int = 1
    pool: str = "local"
    prefetch: int = 0
    """Instances the worker would hold beyond its slots (more for short jobs); `Host.Prefetch` in policies."""


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

    instance_id: int
    outcome: Outcome
    exit_code: int | None = None
    wall_s: float = 0.0
    cpu_s: float = 0.0
    reason: str = ""
    stdout_tail: str = ""
    stderr_tail: str = ""
    outputs: dict[str, bytes] = msgspec.field(default_factory=dict)

    @property
    def result_bytes(self) -> int:
        """Size of what the result would store: outputs and both tails."""
        return sum(len(v) for v in self.outputs.values()) + len(self.stdout_tail) + len(self.stderr_tail)

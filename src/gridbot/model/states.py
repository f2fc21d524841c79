"""The state machines of bags, jobs and instances, each declared once.

Every member is documented, each machine has an explicit terminal set, and the allowed transitions are
listed so that code (and tests) can check that nothing moves backwards out of a terminal state. The
only ways back are the owner's, declared apart (`JOB_RETRY`, `BAG_REOPEN`): the dispatcher's own moves
never leave a terminal state.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar


class BagState(StrEnum):
    """Lifecycle of a bag of tasks."""

    ACTIVE = "active"
    """Accepting work requests: some jobs are queued or running."""
    COMPLETED = "completed"
    """Every job has a result."""
    FAILED = "failed"
    """Every job has ended and at least one failed for good."""
    CANCELLED = "cancelled"
    """The owner cancelled it; unfinished jobs were cancelled."""


class JobState(StrEnum):
    """Lifecycle of one job (a point of the sweep), over all its instances."""

    QUEUED = "queued"
    """Waits for an instance to be sent to a host."""
    RUNNING = "running"
    """At least one instance is out on a host and no result exists yet."""
    DONE = "done"
    """A good result exists (the first one that arrived)."""
    FAILED = "failed"
    """Failed on `max_failures` instances; the last reason is kept."""
    CANCELLED = "cancelled"
    """Its bag was cancelled before it had a result."""


class InstanceState(StrEnum):
    """Lifecycle of one instance: a copy of a job sent to one host."""

    RUNNING = "running"
    """Sent to a host; no report yet and its instance deadline has not passed."""
    OVERDUE = "overdue"
    """Its instance deadline passed, or its host was lost, with no report: counted as a failure and the job
    re-queued. A late report is still accepted (GridBot Algorithm 2)."""
    DONE = "done"
    """Completed well, and its result is the job's result."""
    WASTED = "wasted"
    """Completed well after the job already had a result: recorded as waste."""
    FAILED = "failed"
    """The host reported a failure (non-zero exit, missing output, result too large, ...)."""
    INTERRUPTED = "interrupted"
    """The host gave it back unfinished (worker stopped, pilot walltime): not the job's fault."""
    CANCELLED = "cancelled"
    """Withdrawn by the server: the bag was cancelled or another instance already produced the result."""


S = TypeVar("S", BagState, JobState, InstanceState, "PilotState")

BAG_TERMINAL = frozenset({BagState.COMPLETED, BagState.FAILED, BagState.CANCELLED})
JOB_TERMINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})
INSTANCE_TERMINAL = frozenset(
    {
        InstanceState.DONE,
        InstanceState.WASTED,
        InstanceState.FAILED,
        InstanceState.INTERRUPTED,
        InstanceState.CANCELLED,
    }
)
INSTANCE_LIVE = frozenset({InstanceState.RUNNING})
"""Instances that occupy a slot on a host and may still produce the job's result."""
INSTANCE_FAILURES = frozenset({InstanceState.FAILED, InstanceState.OVERDUE})
"""Outcomes that count towards a job's `max_failures`."""

BAG_TRANSITIONS: dict[BagState, frozenset[BagState]] = {
    BagState.ACTIVE: BAG_TERMINAL,
    BagState.COMPLETED: frozenset(),
    BagState.FAILED: frozenset(),
    BagState.CANCELLED: frozenset(),
}
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.DONE, JobState.CANCELLED, JobState.FAILED}),
    JobState.RUNNING: frozenset({JobState.QUEUED, JobState.DONE, JobState.FAILED, JobState.CANCELLED}),
    JobState.DONE: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}
INSTANCE_TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    InstanceState.RUNNING: frozenset(
        {
            InstanceState.OVERDUE,
            InstanceState.DONE,
            InstanceState.WASTED,
            InstanceState.FAILED,
            InstanceState.INTERRUPTED,
            InstanceState.CANCELLED,
        }
    ),
    InstanceState.OVERDUE: frozenset(
        {InstanceState.DONE, InstanceState.WASTED, InstanceState.FAILED, InstanceState.CANCELLED}
    ),
    InstanceState.DONE: frozenset(),
    InstanceState.WASTED: frozenset(),
    InstanceState.FAILED: frozenset(),
    InstanceState.INTERRUPTED: frozenset(),
    InstanceState.CANCELLED: frozenset(),
}


JOB_RETRY: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset(),
    JobState.RUNNING: frozenset(),
    JobState.DONE: frozenset(),
    JobState.FAILED: frozenset({JobState.QUEUED}),
    JobState.CANCELLED: frozenset(),
}
"""The one way out of a terminal job state, and only by its owner's act (`gridbot retry`, a revision): a
job that failed for good is queued again, its failure count reset so `max_failures` applies afresh. The
dispatcher never takes it by itself, so for it `failed` stays final (a late report of an instance of the
job's earlier run is ignored). A done job keeps its result, and a cancelled job belongs to a cancelled bag."""
BAG_REOPEN: dict[BagState, frozenset[BagState]] = {
    BagState.ACTIVE: frozenset(),
    BagState.COMPLETED: frozenset({BagState.ACTIVE}),
    BagState.FAILED: frozenset({BagState.ACTIVE}),
    BagState.CANCELLED: frozenset(),
}
"""An ended bag whose owner re-queues jobs (`JOB_RETRY`) is active again until they end; a cancelled bag
stays cancelled (its owner gave it up: submit it again)."""


class TransitionError(ValueError):
    """A state change that the declared machine does not allow: always a bug in gridbot. Deliberately not a
    GridbotError: the server answers those as the client's fault (HTTP 400) and the command line as a wrong
    input (exit 2), where a bug must show as an internal error, with its traceback in the log."""


def check_transition(table: dict[S, frozenset[S]], old: S, new: S) -> S:
    """Return `new` if the machine `table` allows `old -> new`, else raise TransitionError."""
    if new not in table[old]:
        raise TransitionError(f"{type(old).__name__} cannot move from {old.value} to {new.value}")
    return new


class PilotState(StrEnum):
    """Lifecycle of a pilot: one execution client submitted into a pool."""

    QUEUED = "queued"
    """Submitted to the pool; not yet running."""
    RUNNING = "running"
    """The worker process runs (it may be idle between instances)."""
    COMPLETED = "completed"
    """Ended normally: idle exit, asked to stop, or its walltime reached (an expected end, not a failure)."""
    FAILED = "failed"
    """Ended abnormally: the pool refused it or the worker crashed."""
    CANCELLED = "cancelled"
    """Cancelled by gridbot before it ran (demand dropped, or the server stopped with --cancel-pilots-on-exit)."""


PILOT_TERMINAL = frozenset({PilotState.COMPLETED, PilotState.FAILED, PilotState.CANCELLED})
PILOT_TRANSITIONS: dict[PilotState, frozenset[PilotState]] = {
    PilotState.QUEUED: frozenset({PilotState.RUNNING, *PILOT_TERMINAL}),
    PilotState.RUNNING: PILOT_TERMINAL,
    PilotState.COMPLETED: frozenset(),
    PilotState.FAILED: frozenset(),
    PilotState.CANCELLED: frozenset(),
}
"""A queued pilot may end without being seen running (it ran between two polls); a running one never goes back
to the queue in gridbot's view, even if its batch system requeues it."""

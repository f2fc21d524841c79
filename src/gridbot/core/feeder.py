"""The feeder's windows: queued jobs read from the store a window at a time, and bag parking.

GridBot's scheduling buffer (section 6.2): each active bag holds a window of its queued jobs, refilled
from the store through `needs_feed`/`feed`, so a bag of ten million jobs costs the dispatcher a window,
not ten million objects. A bag whose window matched no host for the buffer's time-to-live, while other
bags could use the room, gives its window up for as long again (`park`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gridbot.core.changes import QueuedJob
from gridbot.model.states import JobState

if TYPE_CHECKING:
    from gridbot.core.records import Job


class _Windowed(Protocol):
    bag_id: int
    window: Window


@dataclass
class Window:
    """One bag's queued jobs in memory, and where the store's listing of them resumes."""

    buffer: deque[Job] = field(default_factory=deque)
    cursor: int = 0
    """The highest job id read from the store."""
    exhausted: bool = False
    """The store had no queued job after the cursor when last read."""
    touched: int = 0
    """The highest job id whose state the dispatcher changed: while the cursor is past it, what the store
    lists after the cursor is untouched here, so the feeder needs no flush of staged changes first."""
    last_match: float | None = None
    """When the window last served a host (None: never offered yet)."""
    parked_until: float | None = None

    def reset(self) -> None:
        """Empty the window and have the feeder read it again from the bag's first job (the cursor only
        moves forward, so jobs queued again behind it would otherwise wait for the window to be used up)."""
        for job in self.buffer:
            job.in_buffer = False
        self.buffer.clear()
        self.cursor, self.exhausted = 0, False


@dataclass(frozen=True)
class FeedRequest:
    """Ask the store for up to `limit` queued jobs of `bag_id` with ids above `after`."""

    bag_id: int
    after: int
    limit: int
    stale: bool = False
    """Jobs above `after` have changed here (after a restore or a parked window): the store must have every
    staged change before it is read, or it could list as queued a job already sent or ended."""


def needs_feed(active: Sequence[_Windowed], buffer_size: int) -> list[FeedRequest]:
    """Which of the active bags' windows want refilling from the store, and by how much: each of n bags
    gets at least 1/n of the buffer, and is refilled once it is half empty."""
    unparked = [b for b in active if b.window.parked_until is None]
    if not unparked:
        return []
    share = max(1, buffer_size // len(unparked))
    return [FeedRequest(b.bag_id, b.window.cursor, share - len(b.window.buffer), b.window.touched > b.window.cursor)
            for b in unparked if not b.window.exhausted and len(b.window.buffer) < share // 2]


def park(bags: Iterable[_Windowed], now: float, ttl: float) -> None:
    """The buffer's time-to-live (section 6.2): a bag that matched no host for `ttl` while other bags
    could use the room gives its window up until as long again has passed."""
    windows = [b.window for b in bags]
    for w in windows:
        if w.parked_until is not None and now >= w.parked_until:
            w.parked_until = None
            w.last_match = now
    for w in windows:
        if w.parked_until is not None or not w.buffer or w.last_match is None or now - w.last_match <= ttl:
            continue
        if not any(o is not w and o.parked_until is None and not o.exhausted for o in windows):
            continue
        w.reset()
        w.parked_until = now + ttl


def wake(window: Window, now: float) -> None:
    """Its owner re-queued jobs of the bag: read the window again from the start and end a parking."""
    window.reset()
    window.parked_until = None
    window.last_match = now


def fill(window: Window, jobs: Sequence[QueuedJob], held: dict[int, Job], make: Callable[[QueuedJob], Job],
         limit: int) -> None:
    """Put queued jobs read from the store into the window (fewer than `limit`: no more are left). A job
    the dispatcher holds already is taken only if it is queued and not in a window yet."""
    for q in jobs:
        window.cursor = max(window.cursor, q.job_id)
        job = held.get(q.job_id)
        if job is None:
            job = make(q)
        elif job.state is not JobState.QUEUED or job.in_buffer:
            continue
        job.in_buffer = True
        window.buffer.append(job)
    if len(jobs) < limit:
        window.exhausted = True

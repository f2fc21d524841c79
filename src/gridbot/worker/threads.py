"""Jobs run by threads of the worker, one thread per slot at most, beside the event loop.

On the event loop's path a job costs an asyncio task, a pidfd reader, a future and a pass of the loop at its
end; for a bag of short commands that was most of the worker's own CPU (docs/performance.md, issue 14). A
slot thread spawns the job, sleeps in `waitid` (or `poll`) until it exits, reaps it, builds its report with
the executor's own code, and takes the next held instance itself, with the slot it already has: a bundle of
short jobs runs without the loop, which hears of ended jobs in batches.

The slots are counted here, for both paths: a slot is free, reserved for the head of the queue (a thread is
on its way to it), or held by a running job of either path. The loop moves instances to the queue in the
order the server sent them, and only while the first instance it holds is one for a thread, so an instance
of several slots is not overtaken by the single-slot ones sent after it. Everything but the thread's own
loop runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gridbot.model.records import Assignment, InstanceReport, Outcome
from gridbot.worker.executor import KillSwitch

log = logging.getLogger("gridbot.worker")
BATCH = 32
"""Ended jobs the threads let pile up before they wake the loop. They wake it at once when one runs out of
work, when a job ran `LONG` or more, and when the queue runs low (`low_water`); the loop also looks at least
every `LOOK` seconds while they hold work."""
LOOK = 0.5
LONG = 0.05
"""Seconds: a job that ran this long is told to the loop at once, not held behind short ones."""


def _pidfds() -> bool:
    """Whether this kernel gives pidfds (Linux 5.3, and not refused by a seccomp profile)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
        return hasattr(os, "eventfd")
    except (AttributeError, OSError):
        return False


AVAILABLE = _pidfds()
"""Linux with pidfds: a thread sleeps in `waitid`, or for a job with a timeout on the job's pidfd and on an
eventfd its kill switch writes (without pidfds it would look every 50 ms, slower for short jobs than the event
loop's path, which every job then takes)."""


@dataclass(eq=False)
class Held:
    """An instance handed to the threads, and the switch that takes it back."""

    a: Assignment
    stop: KillSwitch = field(default_factory=KillSwitch)


Run = Callable[[Held, int, int], InstanceReport]
"""Runs an instance on the calling thread: (held, the thread's index, its eventfd) -> the report."""


class SlotThreads:
    """The worker's slots and the threads that run single-slot instances in them."""

    def __init__(self, slots: int, run: Run, on_reports: Callable[[], None]) -> None:
        self.slots = slots
        self.run = run
        self.on_reports = on_reports
        """Called on the event loop's thread when ended jobs wait in `done`."""
        self.cond = threading.Condition(threading.Lock())
        self.free = slots
        self.reserved = 0
        """Slots set aside for the first `reserved` queued instances: a thread is on its way to each."""
        self.queue: deque[Held] = deque()
        self.running: dict[int, Held] = {}
        self.done: list[tuple[Held, InstanceReport]] = []
        self.told = False
        """The loop was asked to collect `done` and has not yet."""
        self.low_water = -1
        """Set by the loop: once no more than this many queued instances wait for a slot, a thread that ends
        a job tells the loop at once (its pacing then asks the server for more)."""
        self.stopping = False
        self.closing = False
        self.closed = False
        self.broken = False
        """A thread could not be started: the worker takes the queue back and runs everything on its loop."""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.threads: list[threading.Thread] = []
        self.wakes: list[int] = []
        self.idle = 0
        self.starting = 0

    @property
    def busy(self) -> int:
        """Slots held or reserved, by both paths (read without the lock: a count for the pacing)."""
        return self.slots - self.free

    def waiting(self) -> int:
        """Queued instances no slot is set aside for yet."""
        return len(self.queue) - self.reserved

    def holds(self) -> bool:
        """Whether any instance is queued, running or ended and not yet collected."""
        return bool(self.queue or self.running or self.done)

    def held_ids(self) -> list[int]:
        """The instances queued, running or ended here and not yet collected: the host holds them until their
        reports go (else a job that ends while an exchange is made looks lost to the server)."""
        with self.cond:
            return [h.a.instance_id for h in self.queue] + list(self.running) + [h.a.instance_id for h, _ in self.done]

    def take(self, n: int) -> bool:
        """Take `n` free slots for a job on the loop's path; False if there are not that many."""
        with self.cond:
            if self.free < n:
                return False
            self.free -= n
            return True

    def give(self, n: int) -> None:
        """Give back slots a job on the loop's path held."""
        with self.cond:
            self.free += n
            self._settle()

    def submit(self, assignments: Iterable[Assignment]) -> None:
        """Queue instances for the threads (event loop's thread)."""
        self.loop = asyncio.get_running_loop()
        with self.cond:
            self.queue.extend(Held(a) for a in assignments)
            self._settle()

    def cancel(self, iid: int) -> None:
        """The server took `iid` back: drop it if queued, stop it if running (its report is not sent)."""
        with self.cond:
            held = self.running.get(iid)
            if held is not None:
                held.stop.set()
                return
            kept = deque(h for h in self.queue if h.a.instance_id != iid)
            if len(kept) != len(self.queue):
                self.queue = kept
                self._settle()

    def halt(self) -> None:
        """The worker stops: start nothing more (running jobs go on until `stop`)."""
        with self.cond:
            self.stopping = True
            self._settle()

    def stop(self) -> list[Assignment]:
        """Take back every running job and return the queued instances, which will not run."""
        with self.cond:
            self.stopping = True
            queued = [h.a for h in self.queue]
            self.queue.clear()
            self._settle()
            for held in self.running.values():
                held.stop.set()
        return queued

    def collect(self) -> list[tuple[Held, InstanceReport]]:
        """The jobs ended since the last call (event loop's thread)."""
        with self.cond:
            self.told = False
            done, self.done = self.done, []
        return done

    def close(self) -> None:
        """Take back what still runs (nothing, after the worker's goodbye), end the threads and free their
        eventfds (once)."""
        if self.closed:
            return
        self.stop()
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        deadline = time.monotonic() + 10
        for t in self.threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self.closed = True
        for t, fd in zip(self.threads, self.wakes, strict=True):
            if not t.is_alive():  # one still in a job keeps its eventfd (a daemon: it ends with the process)
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _settle(self) -> None:
        """Set free slots aside for queued instances and wake (or start) a thread for each. Under the lock."""
        excess = self.reserved - len(self.queue)
        if excess > 0:
            self.reserved -= excess
            self.free += excess
        add = 0 if self.stopping else min(self.free, len(self.queue) - self.reserved)
        if add <= 0:
            return
        self.free -= add
        self.reserved += add
        self.cond.notify(add)
        for _ in range(max(0, self.reserved - self.idle - self.starting)):
            if self.broken or not self._start_thread():
                break

    def _start_thread(self) -> bool:
        """Start one more slot thread; False if the system refuses (`_refused`)."""
        index = len(self.threads)
        try:
            wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        except OSError as e:
            self._refused(e)
            return False
        thread = threading.Thread(target=self._serve, args=(index,), name=f"gridbot-slot-{index}", daemon=True)
        self.wakes.append(wake)
        self.threads.append(thread)
        self.starting += 1
        try:
            thread.start()
        except RuntimeError as e:
            self.starting -= 1
            self.threads.pop()
            self.wakes.pop()
            os.close(wake)
            self._refused(e)
            return False
        return True

    def _refused(self, e: Exception) -> None:
        """The system refused a thread (no descriptor or task left: a small `ulimit -u` counts threads)."""
        if not self.broken:
            log.warning("cannot start a slot thread (%s): the jobs held run on the event loop from now on", e)
        self.broken = True
        self._tell()

    def take_back(self) -> list[Assignment]:
        """The queued instances, taken back for the event loop's path (after `broken`)."""
        with self.cond:
            queued = [h.a for h in self.queue]
            self.queue.clear()
            self._settle()
        return queued

    def _next(self) -> Held | None:
        """The next queued instance for a thread that just gave its slot back. Under the lock."""
        held = None
        if self.queue and not self.stopping:
            if self.reserved:
                self.reserved -= 1
            else:
                self.free -= 1
            held = self.queue[0]
            self.running[held.a.instance_id] = held  # before it leaves the queue: `holds` reads both unlocked
            self.queue.popleft()
        self._settle()
        return held

    def _serve(self, index: int) -> None:
        """A thread's life: wait for a reserved instance, then run instances until none is queued."""
        wake = self.wakes[index]
        with self.cond:
            self.starting -= 1
            while True:
                while not self.closing and not (self.reserved and not self.stopping):
                    self.idle += 1
                    self.cond.wait()
                    self.idle -= 1
                if self.closing:
                    return
                self.reserved -= 1
                held: Held | None = self.queue[0]
                assert held is not None
                self.running[held.a.instance_id] = held
                self.queue.popleft()
                while held is not None:
                    self.cond.release()
                    try:
                        report = self._run_one(held, index, wake)
                    finally:
                        self.cond.acquire()
                    self.done.append((held, report))  # before it leaves `running`: the loop reads both unlocked
                    del self.running[held.a.instance_id]
                    self.free += 1
                    held = self._next()
                    if not self.told and (held is None or len(self.done) >= BATCH or report.wall_s >= LONG
                                          or len(self.queue) - self.reserved <= self.low_water):
                        self.told = True
                        self._tell()

    def _run_one(self, held: Held, index: int, wake: int) -> InstanceReport:
        try:
            return self.run(held, index, wake)
        except Exception as e:  # a bug of ours must not take the slot with it: the job fails, as on the loop
            log.error("instance %d crashed the executor: %r", held.a.instance_id, e)
            return InstanceReport(held.a.instance_id, Outcome.FAILURE, reason=f"worker error: {e!r}"[:500])

    def _tell(self) -> None:
        """Have the loop collect the ended jobs and look at its work (from any thread)."""
        if self.loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is gone: the worker has ended
            self.loop.call_soon_threadsafe(self.on_reports)

    def poke(self, index: int) -> None:
        """Wake thread `index` from its poll (a job with a timeout): a kill switch was set (any thread)."""
        if not self.closed and index < len(self.wakes):
            with contextlib.suppress(OSError):
                os.eventfd_write(self.wakes[index], 1)

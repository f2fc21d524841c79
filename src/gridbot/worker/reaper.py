"""A worker's hold on every process of its jobs, not only the first one the executor waits for.

A job's process group is killed when the job ends (gridbot.worker.executor), but a process that called
`setsid` has left it. So the worker process becomes the *subreaper* of its descendants
(PR_SET_CHILD_SUBREAPER, Linux): an orphan of a job becomes the worker's child instead of init's. When
a job ends, the worker reads its own children (one read of /proc/self/task/PID/children, about a
microsecond) and settles those that are not running jobs' first processes: the ones whose job has
ended are killed (with their process group when they lead one), the ones that exited are reaped. A
child is attributed by the `GRIDBOT_RUN` and `GRIDBOT_INSTANCE` of its environment, else by its session
(a job's first process leads a session of its own); one neither marks nor its session tie to a running
job is killed. A running job's first process is never waited for here, so the executor's `wait4` always
finds it.

A job of a bag with a `memory` limit is watched once a second: the resident memory of every process
carrying its marks, summed, and the job killed when over. The worker's own death, even by SIGKILL, is
covered by the watchdog (gridbot.worker.watchdog), started with the worker.

Jobs start and end on the event loop's thread and on the slot threads (gridbot.worker.threads): the
registers and the sweep are used under the executor's SPAWN_LOCK, which a spawn holds until its job is
registered, so a sweep never takes a job's first process for a stray. The timers stay on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gridbot.worker.executor import LIBC, SPAWN_LOCK
from gridbot.worker.isolation import RUN_VAR

log = logging.getLogger("gridbot.worker")
PR_SET_CHILD_SUBREAPER = 36
MEMORY_POLL = 1.0
"""Seconds between two looks at the memory of jobs with a limit (a job allocating faster is seen late)."""
FOLLOW_UP = 0.1
"""Seconds before looking again at the children after killing some: their own orphans come next."""
_PAGE = os.sysconf("SC_PAGE_SIZE")
_INSTANCE = b"GRIDBOT_INSTANCE="


@dataclass
class _Job:
    pid: int
    memory: int | None
    kill: Callable[[str], None]


class Reaper:
    """The processes of one worker's jobs: registered as they start and end, watched in between."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._marker = f"{RUN_VAR}={token}\0".encode()
        self.jobs: dict[int, _Job] = {}
        """Running instance -> its first process, memory limit and how to kill it with a reason."""
        self.mains: dict[int, int] = {}
        """First process (and so session) of a running job -> its instance."""
        self.orphans: dict[int, int] = {}
        """Adopted processes of running jobs -> their instance (not looked at again while it runs)."""
        self.limited: set[int] = set()
        """Running instances with a memory limit."""
        self.adopted = False
        self.watchdog: subprocess.Popen[bytes] | None = None
        self._pipe = -1
        self._children = -1
        self._timer: asyncio.TimerHandle | None = None
        self._memory_due = 0.0

    def adopt(self) -> bool:
        """Start the watchdog and become the subreaper of the jobs' orphans (Linux; False elsewhere or
        when refused).

        Only for a process that is the worker and nothing else: every child it has is then a job's, so
        one that no running job claims may be killed. A worker run inside another program (a test) has
        neither: its jobs' process groups are still killed, and their memory watched.
        """
        if not sys.platform.startswith("linux"):
            return False
        self._start_watchdog()
        if LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            log.warning("cannot adopt the orphans of jobs (prctl: %s)", os.strerror(ctypes.get_errno()))
            return False
        self._children = os.open(f"/proc/self/task/{os.getpid()}/children", os.O_RDONLY | os.O_CLOEXEC)
        self.adopted = True
        return True

    def started(self, iid: int, pid: int, memory: int | None, kill: Callable[[str], None]) -> None:
        """A job's first process started (`kill(reason)` ends the job as a failure). The caller holds
        SPAWN_LOCK since the spawn; a job with a `memory` limit is started on the event loop's thread."""
        self.jobs[iid] = _Job(pid, memory, kill)
        self.mains[pid] = iid
        if memory is not None:
            self.limited.add(iid)
            self._arm(MEMORY_POLL)

    def ended(self, iid: int) -> bool:
        """A job ended and its first process was reaped: kill what it left behind (any thread). True if
        something was killed: `follow_up` must then be called on the event loop's thread."""
        with SPAWN_LOCK:
            job = self.jobs.pop(iid, None)
            if job is None:
                return False
            self.mains.pop(job.pid, None)
            self.limited.discard(iid)
            return self.adopted and self.sweep()

    def follow_up(self) -> None:
        """Look at the children again shortly, after `ended` killed some (their own orphans come next)."""
        self._arm(FOLLOW_UP)

    def sweep(self) -> bool:
        """Settle every child that is neither a running job's first process nor the watchdog; True if
        some were killed (their reaping, and their own orphans, need another look). Under SPAWN_LOCK."""
        keep = self.watchdog.pid if self.watchdog is not None else 0
        killed = False
        for pid in self._child_pids():
            if pid in self.mains or pid == keep or self.orphans.get(pid, -1) in self.jobs:
                continue
            killed |= self._settle(pid)
        return killed

    def close(self) -> None:
        """At the worker's end: kill what is left of its jobs, and let the watchdog check and go."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for _ in range(50):
            with SPAWN_LOCK:
                if not (self.adopted and self.sweep()):
                    break
            time.sleep(FOLLOW_UP / 2)
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        if self.watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watchdog.wait(5)
        if self._children >= 0:
            os.close(self._children)
            self._children = -1

    def _child_pids(self) -> list[int]:
        """This process's children (orphans adopted included), from the file opened at adoption."""
        if self._children < 0:
            return []
        data = b""
        while len(chunk := os.pread(self._children, 1 << 16, len(data))) == 1 << 16:
            data += chunk
        return [int(p) for p in (data + chunk).split()]

    def _settle(self, pid: int) -> bool:
        """Reap `pid` if it exited, leave it if a running job claims it, else kill it; True if killed."""
        info = _stat(pid)
        if info is None:
            self.orphans.pop(pid, None)
            return False
        state, pgid, sid = info
        if state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            self.orphans.pop(pid, None)
            return False
        owner = self._instance_of(pid)
        if owner is None:
            owner = self.mains.get(sid)
        if owner is not None and owner in self.jobs:
            self.orphans[pid] = owner
            return False
        log.debug("killing process %d left by instance %s", pid, owner if owner is not None else "unknown")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if pgid == pid:
                os.killpg(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        self.orphans.pop(pid, None)
        return True

    def _instance_of(self, pid: int) -> int | None:
        """The instance in the environment of `pid`, if it carries this worker's mark."""
        env = _environ(pid)
        if self._marker not in env:
            return None
        for item in env.split(b"\0"):
            if item.startswith(_INSTANCE):
                with contextlib.suppress(ValueError):
                    return int(item[len(_INSTANCE):])
        return None

    def _arm(self, delay: float) -> None:
        """Look again in `delay` seconds, unless a look is due sooner."""
        loop = asyncio.get_running_loop()
        if self._timer is not None:
            if self._timer.when() <= loop.time() + delay:
                return
            self._timer.cancel()
        self._timer = loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        """The memory of limited jobs when due, and the children after a kill."""
        self._timer = None
        now = asyncio.get_running_loop().time()
        if self.limited and now >= self._memory_due:
            self._memory_due = now + MEMORY_POLL
            self._check_memory()
        with SPAWN_LOCK:
            killed = self.adopted and self.sweep()
        if killed:
            self._arm(FOLLOW_UP)
        if self.limited:
            self._arm(max(0.0, self._memory_due - now))

    def _check_memory(self) -> None:
        """Kill each job with a memory limit whose processes, together, are resident over it. (Those jobs
        start and end on the event loop's thread, as this runs: no lock is needed, nor held over the scan.)"""
        used = self._resident()
        for iid in list(self.limited):
            job = self.jobs[iid]
            assert job.memory is not None
            if used.get(iid, 0) > job.memory:
                self.limited.discard(iid)
                job.kill(f"used {used[iid] >> 20:,} MB, over the bag's memory limit of {job.memory >> 20:,} MB")

    def _resident(self) -> dict[int, int]:
        """Resident bytes of every running limited job, from one pass over /proc."""
        used: dict[int, int] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            iid = self._instance_of(int(name))
            if iid is None or iid not in self.limited:
                continue
            try:
                with open(f"/proc/{name}/statm", "rb") as f:
                    used[iid] = used.get(iid, 0) + int(f.read().split()[1]) * _PAGE
            except (OSError, IndexError, ValueError):
                continue
        return used

    def _start_watchdog(self) -> None:
        try:
            self.watchdog, self._pipe = start_watchdog(self.token)
        except OSError as e:
            log.warning("no watchdog (%s): if this worker is killed, its jobs may outlive it", e)


def start_watchdog(token: str) -> tuple[subprocess.Popen[bytes], int]:
    """Start the watchdog of the jobs marked with `token`; return it and the pipe end to keep open.

    Both ends of the pipe are close-on-exec (PEP 446): only the watchdog's read end is passed on, so no
    job holds the write end, and the watchdog sees end-of-file exactly when this process is gone.
    """
    read, write = os.pipe()
    try:
        script = str(Path(__file__).with_name("watchdog.py"))
        proc = subprocess.Popen([sys.executable, "-I", "-S", script, token, str(read)], pass_fds=(read,),
                                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env={})
    except OSError:
        os.close(write)
        raise
    finally:
        os.close(read)
    return proc, write


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, session) of `pid`, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[2]), int(fields[3])


def _environ(pid: int) -> bytes:
    """The environment `pid` started with (b"" if it cannot be read: gone, a zombie, or not ours)."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        data = b""
        while chunk := os.read(fd, 1 << 16):
            data += chunk
        return data
    except OSError:
        return b""
    finally:
        os.close(fd)

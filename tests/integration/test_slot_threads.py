"""The worker's slot threads (gridbot.worker.threads): the slots both paths share, the order instances start in,
taking instances back, and a thread's job taken back, timed out and killed as the event loop's would be. The
threads are real; the jobs of the first tests are Python functions (the slots are what is tested), those of
the last real processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from gridbot.model.records import Assignment, InstanceReport, Limits, Outcome
from gridbot.worker import executor
from gridbot.worker.executor import KillSwitch, run_blocking
from gridbot.worker.threads import BATCH, Held, SlotThreads
from gridbot.worker.worker import Worker


def assignment(iid: int, command: str = "true", timeout: float | None = None, inputs: list[str] | None = None,
               outputs: list[str] | None = None, **extra) -> Assignment:
    return Assignment(iid, iid, iid, "b", 0, command, {}, inputs or [], outputs or [], 0.0, timeout=timeout, **extra)


class Jobs:
    """Python stand-ins for jobs, counting how many run at once; each ends when released (or at once)."""

    def __init__(self, hold: bool = False) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.ran: list[int] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        if not hold:
            self.gate.set()

    def __call__(self, held: Held, index: int, wake: int) -> InstanceReport:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.ran.append(held.a.instance_id)
            self.threads.add(threading.current_thread().name)
        while not self.gate.wait(0.01):
            if held.stop.is_set():
                break
        time.sleep(0.002)
        with self.lock:
            self.now -= 1
        if held.stop.is_set():
            return InstanceReport(held.a.instance_id, Outcome.INTERRUPTED, reason="the worker stopped")
        return InstanceReport(held.a.instance_id, Outcome.SUCCESS, 0, 0.002)


async def until(what: str, condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


def test_no_more_jobs_run_than_free_slots_and_every_slot_comes_back():
    jobs = Jobs()
    collected: list[int] = []
    slots = SlotThreads(3, jobs, lambda: collected.extend(r.instance_id for _, r in slots.collect()))

    async def main() -> None:
        assert slots.take(1)  # a job of the event loop's path holds one of the 3
        slots.submit(assignment(i) for i in range(1, 41))
        await until("every job reported", lambda: len(collected) == 40)
        assert slots.busy == 1 and slots.free == 2 and not slots.holds()
        slots.give(1)
        assert slots.busy == 0

    try:
        asyncio.run(main())
    finally:
        slots.close()
    assert sorted(collected) == list(range(1, 41)) and sorted(jobs.ran) == list(range(1, 41))
    assert jobs.most <= 2, f"{jobs.most} jobs ran at once on the 2 slots left"
    assert len(jobs.threads) <= 2 and len(slots.threads) <= 2


def test_a_queued_instance_keeps_its_place_before_a_loop_job_sent_after_it():
    """While instances wait for the threads, the loop's path gets no slot (the worker moves instances to the
    threads in the server's order, so a job of several slots waits behind the single-slot ones sent first)."""
    jobs = Jobs(hold=True)
    slots = SlotThreads(2, jobs, lambda: None)

    async def main() -> None:
        assert slots.take(1)  # a job of the loop's path holds one slot
        slots.submit([assignment(1), assignment(2)])
        await until("1 running", lambda: list(slots.running) == [1])
        assert slots.waiting() == 1 and slots.busy == 2
        slots.give(1)  # the loop's job ends: its slot goes to instance 2, queued before anything the loop holds
        assert slots.free == 0 and not slots.take(1), "a loop job took the slot instance 2 waits for"
        jobs.gate.set()
        await until("all done", lambda: not slots.running and not slots.queue)
        await until("both slots back", lambda: slots.take(2))

    try:
        asyncio.run(main())
    finally:
        slots.close()
    assert sorted(jobs.ran) == [1, 2]


def test_a_cancel_drops_a_queued_instance_and_stops_a_running_one():
    jobs = Jobs(hold=True)
    reports: list[InstanceReport] = []
    slots = SlotThreads(1, jobs, lambda: reports.extend(r for _, r in slots.collect()))

    async def main() -> None:
        slots.submit([assignment(1), assignment(2), assignment(3)])
        await until("1 running", lambda: list(slots.running) == [1])
        slots.cancel(2)
        assert slots.held_ids() == [3, 1]
        slots.cancel(1)
        await until("1 stopped and its slot running 3", lambda: list(slots.running) == [3])
        reports.extend(r for _, r in slots.collect())  # the thread did not wake the loop: it had more work
        assert not slots.stop(), "nothing left queued"
        await until("3 stopped and told", lambda: len(reports) == 2)

    try:
        asyncio.run(main())
    finally:
        slots.close()
    assert jobs.ran == [1, 3], "a cancelled queued instance ran"
    assert [(r.instance_id, r.outcome) for r in reports] == [(1, Outcome.INTERRUPTED), (3, Outcome.INTERRUPTED)]


def test_the_loop_hears_of_short_jobs_in_batches_and_of_a_thread_running_out_of_work_at_once():
    jobs = Jobs()
    calls: list[int] = []
    slots = SlotThreads(1, jobs, lambda: calls.append(len(slots.collect())))

    async def main() -> None:
        slots.submit(assignment(i) for i in range(1, 201))
        await until("all told", lambda: sum(calls) == 200)

    try:
        asyncio.run(main())
    finally:
        slots.close()
    assert len(calls) <= 200 // BATCH + 2, f"the loop was woken {len(calls)} times for 200 short jobs"


def test_a_crash_of_the_runner_fails_the_job_and_the_thread_runs_the_next():
    def run(held: Held, index: int, wake: int) -> InstanceReport:
        if held.a.instance_id == 1:
            raise ValueError("a bug")
        return InstanceReport(held.a.instance_id, Outcome.SUCCESS, 0)

    reports: list[InstanceReport] = []
    slots = SlotThreads(1, run, lambda: reports.extend(r for _, r in slots.collect()))

    async def main() -> None:
        slots.submit([assignment(1), assignment(2)])
        await until("both", lambda: len(reports) == 2)

    try:
        asyncio.run(main())
    finally:
        slots.close()
    assert [(r.instance_id, r.outcome) for r in reports] == [(1, Outcome.FAILURE), (2, Outcome.SUCCESS)]
    assert "worker error: ValueError('a bug')" in reports[0].reason


def blocking(tmp_path: Path, a: Assignment, stop: KillSwitch | None = None, set_after: float | None = None,
             reason: str = "", ready: str = "", keep: bool = True) -> tuple[InstanceReport, list[int]]:
    """Run `a` with run_blocking on this thread; once it has spawned (and printed `ready`, if given) and
    `set_after` seconds more have passed, another thread sets its switch."""
    stop = stop or KillSwitch()
    wake = os.eventfd(0, os.EFD_NONBLOCK)
    stop.on_set(lambda: os.eventfd_write(wake, 1))
    pids: list[int] = []
    spawned = threading.Event()

    def started(pid: int) -> None:
        pids.append(pid)
        spawned.set()

    def setter() -> None:
        assert set_after is not None
        if not spawned.wait(30):
            return
        out = tmp_path / "job" / executor.STDOUT
        deadline = time.monotonic() + 30
        while ready and ready not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(set_after)
        stop.set(reason)

    helper = threading.Thread(target=setter, daemon=True) if set_after is not None else None
    try:
        if helper is not None:
            helper.start()
        return run_blocking(a, tmp_path / "job", 1 << 20, stop, wake, started, None, None, keep), pids
    finally:
        if helper is not None:
            helper.join(timeout=60)
        os.close(wake)


def test_a_threads_job_over_its_timeout_is_killed_and_fails_saying_so(tmp_path):
    start = time.monotonic()
    r, _ = blocking(tmp_path, assignment(1, "sleep 30", timeout=0.3))
    assert (r.outcome, r.reason) == (Outcome.FAILURE, "timed out after 0.3 s (the bag's timeout)")
    assert time.monotonic() - start < 5


def test_a_threads_job_taken_back_is_interrupted_and_one_that_ignores_sigterm_is_killed(tmp_path, monkeypatch):
    monkeypatch.setattr(executor, "KILL_GRACE", 30.0)
    r, _ = blocking(tmp_path, assignment(1, "sleep 30"), set_after=0.2)
    assert (r.outcome, r.reason, r.exit_code) == (Outcome.INTERRUPTED, "the worker stopped", -15)
    deadline = time.monotonic() + 2
    while any(isinstance(t, threading.Timer) for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(isinstance(t, threading.Timer) for t in threading.enumerate()), "its SIGKILL timer went with it"
    monkeypatch.setattr(executor, "KILL_GRACE", 0.3)
    start = time.monotonic()
    r, _ = blocking(tmp_path, assignment(2, "trap '' TERM; echo ready; sleep 30 & wait; sleep 30"), set_after=0.05,
                    ready="ready")
    assert r.outcome is Outcome.INTERRUPTED and r.exit_code == -9, r
    assert time.monotonic() - start < 5


def test_a_switch_set_after_the_job_ended_on_its_own_does_not_take_it_back():
    """Found by review: between the job's exit and the thread's reaping, a switch set (a cancel, the worker
    stopping) must not turn a finished job into one taken back."""
    pid = os.posix_spawn("/bin/true", ["true"], {})
    try:
        stop = KillSwitch()
        waiting = executor._Waiting(pid, stop)
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        stop.on_set(waiting.stop)
        stop.set()
        assert waiting.ended() == []
    finally:
        _, status, _ = os.wait4(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "ended on its own, not by a signal"


def test_a_threads_job_that_ignores_sigterm_is_killed_at_once_when_no_timer_thread_can_start(tmp_path, monkeypatch):
    """Found by review: the switch of a job waited for in `waitid` starts a timer thread for its SIGKILL; where
    the system refuses a thread (a small `ulimit -u`), the job is killed at once rather than never."""
    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Timer, "start", refused)
    start = time.monotonic()
    r, _ = blocking(tmp_path, assignment(1, "trap '' TERM; echo ready; sleep 30"), set_after=0.05, ready="ready")
    assert (r.outcome, r.exit_code) == (Outcome.INTERRUPTED, -9), r
    assert time.monotonic() - start < 10


def test_a_threads_job_stopped_with_a_reason_fails_with_it_and_one_stopped_before_it_starts_never_runs(tmp_path):
    r, _ = blocking(tmp_path, assignment(1, "trap '' TERM; echo ready; sleep 30"), set_after=0.05,
                    reason="used 9 MB, over", ready="ready")
    assert (r.outcome, r.reason, r.exit_code) == (Outcome.FAILURE, "used 9 MB, over", -9)
    stop = KillSwitch()
    stop.set()
    r, pids = blocking(tmp_path, assignment(2, "touch ran"), stop)
    assert r.outcome is Outcome.INTERRUPTED and r.exit_code is None and not pids
    assert not (tmp_path / "job" / "ran").exists()


def test_a_threads_job_reports_its_outputs_and_fails_without_one(tmp_path):
    r, pids = blocking(tmp_path, assignment(1, "echo 42 > out.txt", outputs=["out.txt"]))
    assert r.outcome is Outcome.SUCCESS and r.outputs == {"out.txt": b"42\n"} and len(pids) == 1
    r, _ = blocking(tmp_path, assignment(2, "true", outputs=["missing.txt"]))
    assert (r.outcome, r.reason) == (Outcome.FAILURE, "expected output 'missing.txt' was not produced")


@pytest.mark.parametrize(("extra", "threadable"), [
    ({}, True), ({"cpus": 2}, False), ({"inputs": ["in.txt"]}, False),
    ({"limits": Limits(memory=1 << 30)}, False), ({"limits": Limits(cpu_time=5.0)}, True),
])
def test_which_instances_a_slot_thread_runs(extra, threadable):
    """Inputs are fetched by the loop and memory is watched on it; those, and jobs of several slots, stay there."""
    assert Worker._threadable(assignment(1, **extra)) is threadable


def test_a_threads_job_may_have_a_timeout_longer_than_poll_can_wait(tmp_path):
    """Found by review: poll takes milliseconds in a C int (24.8 days), a bag's timeout may be 1e9 s."""
    r, _ = blocking(tmp_path, assignment(1, "true", timeout=1e9))
    assert r.outcome is Outcome.SUCCESS, r


def test_an_instance_taken_back_before_it_started_carries_no_output_of_the_slots_last_job(tmp_path):
    """Found by review: the slot's output files are the previous job's (perhaps another bag's) until the next
    spawn truncates them, so a report made without a spawn must not read them."""
    r, _ = blocking(tmp_path, assignment(1, "echo another bags secret; echo and its stderr >&2"))
    assert r.stdout_tail == "another bags secret\n"
    stop = KillSwitch()
    stop.set()
    r, _ = blocking(tmp_path, assignment(2, "true"), stop)
    assert (r.outcome, r.stdout_tail, r.stderr_tail) == (Outcome.INTERRUPTED, "", ""), r


def in_a_thread(fn):
    """Run `fn` on a thread of its own, as a slot thread (which gets a working directory of its own); its result."""
    results = []
    thread = threading.Thread(target=lambda: results.append(fn()))
    thread.start()
    thread.join(60)
    assert results, "the thread did not finish"
    return results[0]


def test_each_job_of_a_slot_gets_only_its_own_output(tmp_path):
    """A slot's output files are emptied for each job, whatever the last one wrote, and a job that writes
    nothing reads nothing."""
    r, _ = blocking(tmp_path, assignment(1, "head -c 5000 /dev/zero | tr '\\0' a; echo long stderr >&2"))
    assert (len(r.stdout_tail), r.stderr_tail) == (5000, "long stderr\n")
    r, _ = blocking(tmp_path, assignment(2, "echo b; echo c >&2"))
    assert (r.stdout_tail, r.stderr_tail) == ("b\n", "c\n"), r
    r, _ = blocking(tmp_path, assignment(3, "true"))
    assert (r.stdout_tail, r.stderr_tail) == ("", ""), r
    job = tmp_path / "job"
    r, _ = blocking(tmp_path, assignment(5, "cat; readlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2"))
    assert (r.outcome, r.stdout_tail.split()) == (
        Outcome.SUCCESS, ["/dev/null", str(job / executor.STDOUT), str(job / executor.STDERR)]), r


def test_a_slots_directory_is_emptied_after_each_job_of_anything_but_its_output_files(tmp_path):
    """What was there before is removed after the first job, which still sees it; what a job adds, after it;
    the slot's output files stay, even when a job moved one away."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "stale").write_text("from an earlier worker")

    def listing(iid: int) -> list[str]:
        r, _ = blocking(tmp_path, assignment(iid, "ls -A"), keep=False)
        return sorted(set(r.stdout_tail.split()) - {executor.STDOUT, executor.STDERR})

    def run(iid: int, command: str) -> None:
        r, _ = blocking(tmp_path, assignment(iid, command), keep=False)
        assert r.outcome is Outcome.SUCCESS, r

    assert listing(1) == ["stale"]
    assert listing(2) == []
    run(3, "touch junk; mkdir -p sub/deeper; touch sub/deeper/file")
    assert listing(4) == []
    run(5, "mv .gridbot-stdout moved; echo x > .gridbot-stdout")
    assert listing(6) == []


def test_a_slot_thread_starts_its_jobs_in_a_directory_of_its_own_and_the_workers_stays(tmp_path):
    """A slot thread (not the main one) gets a working directory of its own, its slot's, where its jobs start
    without the worker's being changed around each spawn; removed, renamed or replaced, the slot's directory
    is made again and the thread moves into the new one. The worker's own directory stays where it was."""
    job = tmp_path / "job"
    here = os.getcwd()

    def slot() -> tuple[list[str], str]:
        seen = []
        for iid, command in enumerate(["pwd", 'rm -rf "$PWD"', "pwd", 'mv "$PWD" ../moved', "pwd > out.txt",
                                       'cd .. && mv job replaced && mkdir job', "pwd"]):
            outputs = ["out.txt"] if "out.txt" in command else []
            r, _ = blocking(tmp_path, assignment(iid, command, outputs=outputs), keep=False)
            assert r.outcome is Outcome.SUCCESS, r
            seen.append(r.stdout_tail + r.outputs.get("out.txt", b"").decode())
        return seen, os.getcwd()

    seen, cwd = in_a_thread(slot)
    path = f"{job}\n"
    assert seen == [path, "", path, "", path, "", path]
    if in_a_thread(executor._unshare_fs):
        assert cwd == str(job), "the thread's own directory is the slot's"
    assert os.getcwd() == here and os.readlink("/proc/self/cwd") == here


@pytest.mark.parametrize("left", ["fifo", "link"])
def test_a_fifo_or_link_found_in_place_of_an_output_file_fails_one_job_and_stops_nothing(tmp_path, left):
    """Found by review: a slot's directory is the same after a restart (its path comes from the host id), and
    what an earlier run left there is seen by the first job. A fifo without a reader, opened by the spawn, held
    the whole worker (posix_spawn keeps the GIL until the child has its files); a link was written through.
    Now that job fails saying why, the next runs, and the file a link named is untouched."""
    job = tmp_path / "job"
    job.mkdir()
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    if left == "fifo":
        os.mkfifo(job / executor.STDOUT)
    else:
        (job / executor.STDOUT).symlink_to(outside)
    start = time.monotonic()
    r, _ = blocking(tmp_path, assignment(1, "echo first"), keep=False)
    assert r.outcome is Outcome.FAILURE and "could not start the command" in r.reason, r
    r, _ = blocking(tmp_path, assignment(2, "echo fine"), keep=False)
    assert (r.outcome, r.stdout_tail) == (Outcome.SUCCESS, "fine\n"), r
    assert time.monotonic() - start < 10 and outside.read_text() == "keep me"


@pytest.mark.parametrize("left", ["file", "dangling link"])
def test_a_job_that_leaves_something_else_in_place_of_its_slots_directory_does_not_break_the_slot(tmp_path, left):
    """Found by review: a file or a dangling link at the slot directory's path failed every later job at once."""
    make = {"file": "touch job", "dangling link": "ln -s nowhere job"}[left]
    r, _ = blocking(tmp_path, assignment(1, f"cd .. && rm -rf job && {make}"), keep=False)
    assert r.outcome is Outcome.SUCCESS, r
    r, _ = blocking(tmp_path, assignment(2, "pwd"), keep=False)
    assert (r.outcome, r.stdout_tail) == (Outcome.SUCCESS, f"{tmp_path / 'job'}\n"), r


@pytest.mark.parametrize("left", ["fifo", "link", "directory"])
def test_what_a_job_leaves_in_place_of_its_output_files_goes_before_the_next_job(tmp_path, left):
    """A fifo is not waited on, a link not written through (the file it names is untouched), a directory
    removed: the next job's output files are regular files of the slot's directory."""
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    make = {"fifo": "mkfifo .gridbot-stdout", "link": f"ln -s {outside} .gridbot-stdout",
            "directory": "mkdir -p .gridbot-stdout/inner"}[left]
    r, _ = blocking(tmp_path, assignment(1, f"rm -f .gridbot-stdout; {make}"), keep=False)
    assert r.outcome is Outcome.SUCCESS, r
    r, _ = blocking(tmp_path, assignment(2, "echo fine"), keep=False)
    assert (r.outcome, r.stdout_tail) == (Outcome.SUCCESS, "fine\n"), r
    path = tmp_path / "job" / executor.STDOUT
    assert path.is_file() and not path.is_symlink() and outside.read_text() == "keep me"


def test_min_cpu_stops_watching_a_threads_job_when_it_is_reaped(tmp_path):
    """Found by review: the entry `_starving` reads went only when the loop collected the report, so a long job
    that had ended (its group's CPU now 0) could be judged starved while its outputs were read."""
    from gridbot.worker.worker import WorkerConfig

    w = Worker(WorkerConfig("http://127.0.0.1:1", slots=1, state_dir=tmp_path, allow_root=True,
                            workdir=tmp_path / "w", min_cpu=0.5))
    wake = os.eventfd(0, os.EFD_NONBLOCK)
    seen: list[bool] = []
    registered = w._thread_job_started

    def started(held: Held, pid: int) -> None:
        registered(held, pid)
        seen.append(7 in w.pids)

    w._thread_job_started = started  # type: ignore[method-assign]
    try:
        r = w._run_in_thread(Held(assignment(7, "true")), 0, wake)
    finally:
        os.close(wake)
        w.threads.close()
        w.identity.release()
    assert r.outcome is Outcome.SUCCESS and seen == [True] and 7 not in w.pids


def test_min_cpu_does_not_judge_a_job_that_ended_while_it_looked(tmp_path):
    """Found by review: the entries were copied before the pass over /proc; a job reaped meanwhile has no
    process left in its session and counted as 0% of a CPU, so the worker left, taking every other job back."""
    from gridbot.worker.worker import WorkerConfig

    w = Worker(WorkerConfig("http://127.0.0.1:1", slots=1, state_dir=tmp_path, allow_root=True,
                            workdir=tmp_path / "w", min_cpu=0.5, cpu_window=1))
    try:
        gone = subprocess.Popen(["true"], start_new_session=True)
        gone.wait()  # a session with no process left: the job was reaped
        w.pids[1] = (gone.pid, time.monotonic() - 60, 0.0)
        assert not w._starving(time.monotonic()) and not w.starved
        busy = subprocess.Popen(["sleep", "30"], start_new_session=True)
        try:
            w.pids[2] = (busy.pid, time.monotonic() - 60, 0.0)
            w.cpu_due = 0.0
            assert w._starving(time.monotonic()) and list(w.starved) == [2], "a sleeping job is starved"
        finally:
            busy.kill()
            busy.wait()
    finally:
        w.threads.close()
        w.identity.release()


def test_a_worker_that_cannot_start_a_thread_runs_its_jobs_on_the_event_loop(tmp_path, monkeypatch):
    """Found by review: a thread refused (a small `ulimit -u` counts threads, or no descriptor left) left the
    instances reserved for it held and never run. They now go back to the loop's path, in order."""
    from gridbot.protocol import ExchangeResponse
    from gridbot.worker import threads
    from gridbot.worker.worker import WorkerConfig

    def refused(*_: object) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(threads.os, "eventfd", refused)
    w = Worker(WorkerConfig("http://127.0.0.1:1", slots=2, state_dir=tmp_path, allow_root=True,
                            workdir=tmp_path / "w"))
    sent = [assignment(i, f"echo {i}") for i in range(1, 6)]

    async def main() -> None:
        w._accept(ExchangeResponse(sent, [], 0.0, 30.0, 1 << 20))
        await until("all five reported", lambda: len(w.reports) == 5)

    try:
        asyncio.run(main())
    finally:
        w.threads.close()
        w.identity.release()
    assert not w.use_threads and not w.threads.threads
    assert sorted((r.instance_id, r.outcome, r.stdout_tail) for r in w.reports) == [
        (i, Outcome.SUCCESS, f"{i}\n") for i in range(1, 6)]


def test_a_worker_that_sweeps_nothing_truncates_its_jobs_output_files_every_time(tmp_path):
    """Found by review: a worker that is not its jobs' subreaper (run inside another program, as here) sweeps
    nothing, yet trusted its slot's output files as empty after any job; a process a job left in a session of
    its own wrote to them after the cleaning, and the next job's output showed it."""
    from gridbot.worker.worker import WorkerConfig

    w = Worker(WorkerConfig("http://127.0.0.1:1", slots=1, state_dir=tmp_path, allow_root=True,
                            workdir=tmp_path / "w"))
    assert not w.reaper.adopted
    reports: list[InstanceReport] = []

    def slot() -> None:
        wake = os.eventfd(0, os.EFD_NONBLOCK)
        try:
            left = "setsid sh -c 'touch ready; sleep 0.3; echo left' & while [ ! -e ready ]; do sleep 0.01; done"
            reports.append(w._run_in_thread(Held(assignment(1, left)), 0, wake))
            time.sleep(1.0)  # the process it left writes to the slot's stdout after the cleaning
            reports.append(w._run_in_thread(Held(assignment(2, "true")), 0, wake))
        finally:
            os.close(wake)

    try:
        thread = threading.Thread(target=slot)
        thread.start()
        thread.join(30)
    finally:
        w.threads.close()
        w.identity.release()
    assert [r.outcome for r in reports] == [Outcome.SUCCESS, Outcome.SUCCESS], reports
    assert reports[1].stdout_tail == "", "the second job's output is its own"

"""One measurement of one peer system, run by the peers' own virtualenv (bench/peers/setup.sh).

    .venv-peers/bin/python bench/peers/run_peer.py SYSTEM TASK JOBS [--workers 2] [--chunksize 100]

SYSTEM, each with WORKERS processes (or cores) running tasks:
  ppe       concurrent.futures ProcessPoolExecutor(WORKERS), one submit() per task
  ppe-map   the same pool's map() in chunks of --chunksize: no middleware at all, the spawn ceiling
  ppe-duties  that chunked map with what a gridbot worker does around each job besides running it (see
            `duties_task`): the most a worker keeping those duties could reach, with no server at all
  dask      distributed.LocalCluster, WORKERS processes of one thread
  parsl     HighThroughputExecutor on a LocalProvider, WORKERS workers
  ray       ray.init(num_cpus=WORKERS)
  hq        HyperQueue's hyperqueue.LocalCluster, one worker of WORKERS cores, program tasks with their
            stdout and stderr off (what HyperQueue's docs advise for many small tasks)
  hq-files  the same with HyperQueue's default of a stdout and a stderr file per task
TASK: shell (`true` through /bin/sh: `sh -c true`, as a gridbot job of `sh -c true` runs), exec (`true`
executed directly, found on PATH, as gridbot runs a plain command) or noop (a Python function that
returns at once; not for hq).

The system is started and warmed up first (a few tasks through every worker); the clock starts when the
tasks are submitted, all at once, and stops when every result is back in this process. Every result is
checked: as many results as tasks, each with return code 0 (Dask's gather and the others' result calls
raise on a failed task); anything else exits non-zero. The seconds to the first result come from the
tasks' own completion timestamps (time.time() as each task ends, on the worker, before its result
travels back), so they do not include the rest of a submission loop; HyperQueue's program tasks return
nothing, and its API reports progress once a second, so it has none; its client also learns of the job's
end at such a poll, so its rate comes with an upper bound (the last poll that saw the job unfinished).
Prints one JSON line:
{"rate": jobs/s, "first": seconds or null, "results": results checked, "version": ..., "config": ...}.

Written from each system's documented API only; nothing of theirs is copied here.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

Result = tuple[int, float]
"""A task's return code and the time.time() it ended at."""


def shell_task(_: int) -> Result:
    import subprocess  # here: Parsl ships the function by value, without this module's imports
    import time

    code = subprocess.run("true", shell=True).returncode
    return code, time.time()


def exec_task(_: int) -> Result:
    import subprocess
    import time

    code = subprocess.run(["true"]).returncode
    return code, time.time()


def noop_task(_: int) -> Result:
    import time

    return 0, time.time()


TASKS: dict[str, Callable[[int], Result]] = {"shell": shell_task, "exec": exec_task, "noop": noop_task}
DUTY_ARGV = {"shell": ["sh", "-c", "true"], "exec": ["true"]}
DUTY_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "USER", "LOGNAME", "TZ", "SHELL")
OUT, ERR = ".gridbot-stdout", ".gridbot-stderr"
_slot = ""
_found: dict[str, str] = {}
"""Programs found on the PATH (the worker searches once a second)."""


def _slot_init(parent: str) -> None:
    """A pool process's own job directory under `parent`, reused by every task it runs (a gridbot slot's), and
    its working directory from then on (a slot thread's own); none without a parent (the tasks that need none)."""
    global _slot
    if parent:
        _slot = tempfile.mkdtemp(prefix="slot-", dir=parent)
        os.chdir(_slot)


def _tail(path: str, limit: int = 64 * 1024) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not st.st_size or not stat.S_ISREG(st.st_mode):
            return ""
        return os.pread(fd, min(st.st_size, limit), max(0, st.st_size - limit)).decode(errors="replace")
    finally:
        os.close(fd)


def duties_task(argv: list[str], i: int) -> Result:
    """Run `argv` as a gridbot worker runs a job (gridbot.worker.executor, same system calls, written
    again here so that this process imports nothing of gridbot's): the worker's environment filtered
    plus the job's variables; stdout and stderr into files of the slot's directory, created or truncated by
    the child; the program found on the PATH once; a session of its own; started with `posix_spawn` in the
    slot's directory, which is the process's own (a slot thread has one of its own); its
    end awaited without reaping, its process group killed, then reaped with its resource usage; both output
    tails read; the directory emptied of anything else. No server, no report, no event loop: what is left of
    gridbot's per-job cost once those are gone. (It spawns as gridbot does, where the plain map's tasks use
    subprocess.run, which costs the parent more: the row is the bar for gridbot's way, not the duties' price.)"""
    started = time.monotonic()
    env = {k: os.environ[k] for k in DUTY_ENV if k in os.environ}
    env.update(GRIDBOT_RUN="bench", GRIDBOT_JOB_INDEX=str(i), GRIDBOT_JOB_ID=str(i), GRIDBOT_INSTANCE=str(i),
               GRIDBOT_BAG="bench", GRIDBOT_CPUS="1")
    out, err = f"{_slot}/{OUT}", f"{_slot}/{ERR}"
    os.stat(_slot)  # the worker's look at the slot's directory (is it there, is it still its thread's?)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
               (os.POSIX_SPAWN_OPEN, 1, out, flags, 0o644), (os.POSIX_SPAWN_OPEN, 2, err, flags, 0o644)]
    program = _found.get(argv[0]) or _found.setdefault(argv[0], shutil.which(argv[0]) or argv[0])
    pid = os.posix_spawn(program, argv, env, file_actions=actions, setsid=True,
                         setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped, as the worker waits
    with contextlib.suppress(ProcessLookupError):  # its group, before the reaping frees the group's id
        os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    report = (os.waitstatus_to_exitcode(status), time.monotonic() - started, usage.ru_utime + usage.ru_stime,
              _tail(out), _tail(err))
    with os.scandir(_slot) as entries:
        for entry in entries:
            if entry.name not in (OUT, ERR):
                os.unlink(entry.path)
    return report[0], time.time()
HQ_ARGS = {"shell": ["/bin/sh", "-c", "true"], "exec": ["true"]}


class Measured:
    """What one run gives: results in hand, the clock's readings, the system's version and configuration."""

    def __init__(self, version: str, config: str) -> None:
        self.version = version
        self.config = config
        self.wall_start = 0.0
        self.start = 0.0
        self.total = 0.0
        self.bound = 0.0
        """Highest rate the run allows when the end is seen late (HyperQueue's client polls); 0: none."""

    def begin(self) -> None:
        self.wall_start = time.time()
        self.start = time.perf_counter()

    def end(self) -> None:
        self.total = time.perf_counter() - self.start


def check(results: list[Result], jobs: int, m: Measured) -> float:
    """Every result there and good; seconds from the submission to the first task's end."""
    if len(results) != jobs:
        raise SystemExit(f"{len(results):,} results for {jobs:,} tasks")
    bad = [code for code, _ in results if code != 0]
    if bad:
        raise SystemExit(f"{len(bad):,} of {jobs:,} tasks failed (return codes {sorted(set(bad))[:5]})")
    return min(t for _, t in results) - m.wall_start


def run_ppe(fn: Any, jobs: int, workers: int, m: Measured, chunksize: int = 0, slots: str = "") -> list[Result]:
    with ProcessPoolExecutor(workers, initializer=_slot_init, initargs=(slots,)) as pool:
        list(pool.map(noop_task, range(workers * 4)))  # started: every process up
        m.begin()
        if chunksize:
            results = list(pool.map(fn, range(jobs), chunksize=chunksize))
        else:
            futures = [pool.submit(fn, i) for i in range(jobs)]
            results = [f.result() for f in futures]
        m.end()
    return results


def run_dask(fn: Any, jobs: int, workers: int, m: Measured) -> list[Result]:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.gather(client.map(noop_task, range(workers * 4), pure=False))
        m.begin()
        futures = client.map(fn, range(jobs), pure=False)
        results = client.gather(futures)  # raises if a task raised
        m.end()
    return list(results)


def run_parsl(fn: Any, jobs: int, workers: int, m: Measured) -> list[Result]:
    import parsl
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor
    from parsl.providers import LocalProvider

    run_dir = tempfile.mkdtemp(prefix="parsl-bench-")
    config = Config(executors=[HighThroughputExecutor(label="htex", max_workers_per_node=workers,
                                                      provider=LocalProvider(init_blocks=1, max_blocks=1))],
                    run_dir=run_dir, strategy="none")
    app = parsl.python_app(fn)
    with parsl.load(config):
        for f in [app(i) for i in range(workers * 4)]:
            f.result()
        m.begin()
        futures = [app(i) for i in range(jobs)]
        results = [f.result() for f in futures]
        m.end()
    return results


def run_ray(fn: Any, jobs: int, workers: int, m: Measured) -> list[Result]:
    import ray

    ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        remote = ray.remote(fn)
        ray.get([remote.remote(i) for i in range(workers * 4)])
        m.begin()
        refs = [remote.remote(i) for i in range(jobs)]
        results = ray.get(refs)
        m.end()
    finally:
        ray.shutdown()
    return list(results)


def run_hq(task: str, jobs: int, workers: int, m: Measured, files: bool) -> int:
    """HyperQueue: one job of `jobs` program tasks; returns the tasks it counted finished."""
    from hyperqueue import Job, LocalCluster
    from hyperqueue.cluster import WorkerConfig

    if task not in HQ_ARGS:
        raise SystemExit("hq runs programs: no noop task (a Python function task starts an interpreter)")
    args = HQ_ARGS[task]
    out: dict[str, Any] = {} if files else {"stdout": None, "stderr": None}
    with tempfile.TemporaryDirectory(prefix="hq-bench-") as d, \
            LocalCluster(server_dir=os.path.join(d, "server")) as cluster:
        cluster.start_worker(WorkerConfig(cores=workers))
        client = cluster.client()
        warm = Job(default_workdir=d)
        for _ in range(workers * 4):
            warm.program(args, stdout=None, stderr=None)
        if client.connection.wait_for_jobs([client.submit(warm).id], lambda _: None):
            raise SystemExit("HyperQueue's warm-up tasks failed")
        job = Job(default_workdir=d)
        for _ in range(jobs):
            job.program(args, **out)
        counts: dict[str, Any] = {}
        polls: list[tuple[float, int]] = []

        def progress(status: dict[int, dict[str, Any]]) -> None:
            counts.update(next(iter(status.values())))
            polls.append((time.perf_counter() - m.start, int(counts.get("finished", 0))))

        m.begin()
        submitted = client.submit(job)
        # the call Client.wait_for_jobs makes, with a callback of ours in place of its progress bar, so the
        # finished tasks can be counted
        failed_jobs = client.connection.wait_for_jobs([submitted.id], progress)
        m.end()
        if failed_jobs:
            failed = client.get_failed_tasks(submitted)
            first = next(iter(failed.values()), None)
            raise SystemExit(f"{len(failed):,} tasks failed (HyperQueue cancels the rest of a job at its first "
                             f"failure): {first.error if first else '?'}")
    # its client learns of the job's end at its next poll, once a second: the job ended after the last poll
    # that saw it unfinished, which bounds the rate from above
    before = [t for t, n in polls if n < jobs]
    m.bound = jobs / before[-1] if before and before[-1] > 0 else 0.0
    finished = int(counts.get("finished", -1))
    if finished != jobs or counts.get("failed", 0):
        raise SystemExit(f"HyperQueue counted {finished:,} tasks finished, {counts.get('failed')} failed, "
                         f"of {jobs:,}")
    return finished


def measure(system: str, task: str, jobs: int, workers: int, chunksize: int) -> dict[str, Any]:
    fn = TASKS[task]
    first: float | None
    if system in ("hq", "hq-files"):
        import hyperqueue

        files = system == "hq-files"
        m = Measured(f"hyperqueue {hyperqueue.get_version()}",
                     f"LocalCluster, 1 worker of {workers} cores, " +
                     ("a stdout and a stderr file per task (the default)" if files else "stdout/stderr off"))
        count = run_hq(task, jobs, workers, m, files)
        first = None
        if m.bound:
            m.config += f"; its client sees the end once a second: at most {m.bound:,.0f} jobs/s"
    else:
        if system == "ppe-duties":
            if task not in DUTY_ARGV:
                raise SystemExit(f"ppe-duties runs a program: task {task!r} is not one (shell or exec)")
            m = Measured(f"Python {sys.version.split()[0]}", f"ProcessPoolExecutor({workers}), "
                         f"map(chunksize={chunksize}), a gridbot worker's per-job duties")
            with tempfile.TemporaryDirectory(prefix="ppe-duties-") as slots:
                results = run_ppe(functools.partial(duties_task, DUTY_ARGV[task]), jobs, workers, m, chunksize,
                                  slots)
        elif system in ("ppe", "ppe-map"):
            m = Measured(f"Python {sys.version.split()[0]}", f"ProcessPoolExecutor({workers}), " +
                         (f"map(chunksize={chunksize})" if system == "ppe-map" else "a submit() per task"))
            results = run_ppe(fn, jobs, workers, m, chunksize if system == "ppe-map" else 0)
        elif system == "dask":
            import dask

            m = Measured(f"dask {dask.__version__}", f"LocalCluster({workers} processes of 1 thread)")
            results = run_dask(fn, jobs, workers, m)
        elif system == "parsl":
            import parsl

            m = Measured(f"parsl {parsl.__version__}", f"HTEX, LocalProvider, {workers} workers")
            results = run_parsl(fn, jobs, workers, m)
        else:
            import ray

            m = Measured(f"ray {ray.__version__}", f"ray.init(num_cpus={workers})")
            results = run_ray(fn, jobs, workers, m)
        first = check(results, jobs, m)
        count = len(results)
    return {"rate": jobs / m.total, "first": first, "results": count, "version": m.version, "config": m.config}


SYSTEMS = ("ppe", "ppe-map", "ppe-duties", "dask", "parsl", "ray", "hq", "hq-files")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=SYSTEMS)
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("jobs", type=int)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--chunksize", type=int, default=100, help="tasks per chunk of ppe-map")
    args = parser.parse_args()
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    out = measure(args.system, args.task, args.jobs, args.workers, args.chunksize)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

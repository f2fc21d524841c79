"""One measurement of one peer system, run by the peers' own virtualenv (bench/peers/setup.sh).

    .venv-peers/bin/python bench/peers/run_peer.py SYSTEM TASK JOBS [--workers 2]

SYSTEM: dask (distributed.LocalCluster, WORKERS processes of one thread), parsl (HighThroughputExecutor
on a LocalProvider, WORKERS workers), ray (num_cpus=WORKERS) or ppe (concurrent.futures
ProcessPoolExecutor(WORKERS), the no-middleware ceiling). TASK: shell (`true` through /bin/sh, as a
gridbot job runs) or noop (a Python function that returns at once). The system is started first; the
clock starts when the tasks are submitted, all at once, and stops when every result is back. Prints one
JSON line: {"rate": jobs/s, "first": seconds to the first result, "version": ...}.

Written from each system's documented API only; nothing of theirs is copied here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any


def shell_task(_: int) -> int:
    import subprocess  # here: Parsl ships the function by value, without this module's imports

    return subprocess.run("true", shell=True).returncode


def noop_task(i: int) -> int:
    return i


def gather(futures: list[Any], start: float) -> tuple[float, float]:
    """Wait for concurrent.futures-style futures; (seconds to the first result, seconds to the last)."""
    wait(futures, return_when=FIRST_COMPLETED)
    first = time.perf_counter() - start
    for f in futures:
        f.result()
    return first, time.perf_counter() - start


def run_ppe(fn: Any, jobs: int, workers: int) -> tuple[float, float, str]:
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(noop_task, range(workers * 4)))  # started: every process up
        start = time.perf_counter()
        futures = [pool.submit(fn, i) for i in range(jobs)]
        first, total = gather(futures, start)
    return first, total, f"Python {sys.version.split()[0]}"


def run_dask(fn: Any, jobs: int, workers: int) -> tuple[float, float, str]:
    import dask
    from distributed import Client, LocalCluster, as_completed

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.gather(client.map(noop_task, range(workers * 4), pure=False))
        start = time.perf_counter()
        futures = client.map(fn, range(jobs), pure=False)
        results = as_completed(futures)
        next(results)
        first = time.perf_counter() - start
        for _ in results:
            pass
        total = time.perf_counter() - start
    return first, total, f"dask {dask.__version__}"


def run_parsl(fn: Any, jobs: int, workers: int) -> tuple[float, float, str]:
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
        start = time.perf_counter()
        futures = [app(i) for i in range(jobs)]
        first, total = gather(futures, start)
    return first, total, f"parsl {parsl.__version__}"


def run_ray(fn: Any, jobs: int, workers: int) -> tuple[float, float, str]:
    import ray

    ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        remote = ray.remote(fn)
        ray.get([remote.remote(i) for i in range(workers * 4)])
        start = time.perf_counter()
        refs = [remote.remote(i) for i in range(jobs)]
        ray.wait(refs, num_returns=1)
        first = time.perf_counter() - start
        ray.get(refs)
        total = time.perf_counter() - start
    finally:
        ray.shutdown()
    return first, total, f"ray {ray.__version__}"


SYSTEMS = {"ppe": run_ppe, "dask": run_dask, "parsl": run_parsl, "ray": run_ray}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=sorted(SYSTEMS))
    parser.add_argument("task", choices=["shell", "noop"])
    parser.add_argument("jobs", type=int)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    fn = shell_task if args.task == "shell" else noop_task
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    first, total, version = SYSTEMS[args.system](fn, args.jobs, args.workers)
    print(json.dumps({"rate": args.jobs / total, "first": first, "version": version}), flush=True)


if __name__ == "__main__":
    main()

"""Speed of the ExPERT Estimator (issue 15): strategies x repetitions simulated per second.

Two workloads, each timed --runs times (best and median printed):
  tail: a 150-task tail, every task with an instance out (ages spread over the throughput deadline), on
        200 unreliable machines (the paper's Table 5 pools are about 200), 1,008 strategies (N 0..3,
        T <= D on 7 points, Mr at 9 points up to 0.1) x 10 repetitions.  Target: 10 s.
  bag:  the paper's own resolution (section 6.1): 300 strategies x 10 repetitions of a whole 150-task bag
        on 50 unreliable machines, throughput phase included, as in its Figure 9a.  The paper reports
        "several minutes" for this on a Core 2 Duo P8400 at 2.26 GHz (section 6.4).
    .venv/bin/python bench/expert_estimator.py [--runs 3] [--reps 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np

from gridbot.schedulers.expert import Setup, estimate, from_runtimes, sample_space
from gridbot.sim.traces import task_runtimes

TUR, GAMMA = 2066.0, 0.827


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    runtimes = np.asarray(task_runtimes("blastall"))
    char = from_runtimes(runtimes, GAMMA, scale=TUR / float(runtimes.mean()))
    ages = tuple(float(a) for a in np.linspace(0.0, 4 * TUR, 150, endpoint=False))
    workloads = {
        "tail": (sample_space(TUR, 0.1, points=7, mr_points=9), Setup(tasks=150, unreliable=200, ages=ages)),
        "bag": (sample_space(TUR, 0.1), Setup(tasks=150, unreliable=50, bag=True)),
    }
    print(f"machine: {platform.node()} {platform.machine()} ({os.cpu_count()} cpus, load "
          f"{os.getloadavg()[0]:.1f}), Python {platform.python_version()}, numpy {np.__version__}")
    for name, (space, setup) in workloads.items():
        times = []
        for run in range(args.runs):
            started = time.perf_counter()
            estimate(char, space, setup, args.reps, seed=run)
            times.append(time.perf_counter() - started)
        worlds = len(space) * args.reps
        print(f"{name:4}: {len(space):,} strategies x {args.reps} repetitions = {worlds:,} simulations: "
              f"best {min(times):.2f} s, median {statistics.median(times):.2f} s "
              f"({worlds / min(times):,.0f} simulations/s)")
    print("paper (section 6.4): several minutes for its resolution (the 'bag' line), Core 2 Duo P8400 2.26 GHz; "
          "target here: the 'tail' line within 10 s")


if __name__ == "__main__":
    main()

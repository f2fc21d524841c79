"""Simulator speed at GridBot's full scale: the high-throughput run of SC'09 section 7 (a 2.2-million-job
bag of 20-40 minute jobs over nine pools, about 5,000 hosts at once), from experiments/high_throughput.toml.

Prints the wall time, the events per second and the peak resident memory, next to a run at a
hundredth of the jobs on the same pools (same invocation, same machine), so the scaling shows.
Target (issue 5): the full run in at most 10 minutes on this machine.

    .venv/bin/python bench/simulate.py            # full scale and 1% scale
    .venv/bin/python bench/simulate.py --jobs 100000
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import time
from pathlib import Path

from gridbot.sim.engine import simulate
from gridbot.sim.scenario import parse_scenario

SCENARIO = Path(__file__).resolve().parents[1] / "experiments" / "high_throughput.toml"


def run(jobs: int | None) -> None:
    sc = parse_scenario(SCENARIO.read_text(), str(SCENARIO))
    if jobs is not None:
        sc = dataclasses.replace(sc, bags=[dataclasses.replace(b, jobs=jobs) for b in sc.bags])
    n = sum(b.jobs for b in sc.bags)
    start = time.perf_counter()
    r = simulate(sc)
    wall = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    b = r.bags[0]
    print(f"{n:>10,} jobs  wall {wall:7.1f} s  events {r.events:>11,}  {r.events / wall:>9,.0f} events/s  "
          f"{n / wall:>8,.0f} jobs/s  simulated {r.end / 86400:5.1f} d  makespan "
          f"{(b.makespan or 0) / 86400:5.2f} d  peak RSS {rss:,.0f} MiB", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, help="Run once with this many jobs instead of 1%% then full scale.")
    args = ap.parse_args()
    if args.jobs:
        run(args.jobs)
    else:
        run(22_000)
        run(None)


if __name__ == "__main__":
    main()

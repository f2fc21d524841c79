"""End-to-end throughput: 20,000 jobs of `true` through `gridbot run` with 2 local workers.

Prints jobs/s (min, median, max of 3 runs) measured from the command's start to its exit, so it
includes spec validation, submission into SQLite, worker start-up, every result made durable
(synchronous=FULL), result collection and the summary. This is a benchmark, not a test:
    .venv/bin/python bench/throughput.py [--jobs 20000] [--runs 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_run(jobs: int, workers: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "bench.toml"
        spec.write_text(f'name = "bench"\ncommand = "true"\n[parameters]\ni = {{ from = 1, to = {jobs} }}\n')
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "gridbot", "run", str(spec), "--workers", str(workers)],
                              cwd=tmp, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0 or f"done {jobs:,}" not in " ".join(proc.stdout.split()):
            raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    rates = [one_run(args.jobs, args.workers) for _ in range(args.runs)]
    print(f"machine: {platform.node()} {platform.machine()}, Python {platform.python_version()}")
    print(f"gridbot run, {args.jobs:,} x `true`, {args.workers} local workers, SQLite synchronous=FULL")
    print(f"jobs/s  min {min(rates):,.0f}  median {statistics.median(rates):,.0f}  max {max(rates):,.0f}  "
          f"(runs: {', '.join(f'{r:,.0f}' for r in rates)})")


if __name__ == "__main__":
    main()

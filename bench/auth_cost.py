"""What authentication costs (issue 11): `make bench`'s scenarios 1 and 2 with keys and with `--no-auth`,
alternated within each repetition so the machine's drift hits both alike.

    .venv/bin/python bench/auth_cost.py [--runs 5] [--jobs 20000] [--capacity-jobs 200000]

Target: under 5% on end to end and on dispatch capacity. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness
from harness import Row, table
from suite import dispatch, gridbot_end_to_end, sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs of the end-to-end scenario")
    parser.add_argument("--capacity-jobs", type=int, default=200_000, help="jobs of the dispatch scenario")
    args = parser.parse_args()
    e2e = {True: Row("keys"), False: Row("--no-auth")}
    cap = {True: Row("keys"), False: Row("--no-auth")}
    for n in range(args.runs):
        for keys in ((True, False) if n % 2 == 0 else (False, True)):
            harness.NO_AUTH = not keys
            e2e[keys].values.append(gridbot_end_to_end(args.jobs, "sh -c true")[0])
            with harness.workdir() as t:
                cap[keys].values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), [sweep("cap", args.capacity_jobs)]))
    print(f"machine: {harness.machine()}\n{harness.storage()}\n")
    print(table(f"End to end: {args.jobs:,} jobs of `sh -c true`, 2 workers, jobs/s", [e2e[True], e2e[False]],
                versus="--no-auth"))
    print(table(f"Dispatch capacity: {args.capacity_jobs:,} jobs, 2 noop workers of 1,000 slots, SQLite, jobs/s",
                [cap[True], cap[False]], versus="--no-auth"))
    for name, rows in (("end to end", e2e), ("dispatch capacity", cap)):
        cost = 1 - rows[True].median / rows[False].median
        print(f"cost of authentication, {name}: {cost:+.1%} of the --no-auth median (target: under 5%)")


if __name__ == "__main__":
    main()

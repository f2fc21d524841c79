"""What the web console costs the dispatch path (issue 20): scenario 1's end-to-end run (20,000 jobs of
`sh -c true`, two workers of one slot, SQLite) with and without consoles polling the server, alternated.

A poller does what an open bag page does every 2 s (the bags list, the bag with its plots, the pools and a page
of hosts), `--pollers` of them at once, each every `--every` seconds (default: four pages polling at twice
the page's own rate, to make a cost visible if there is one).

    .venv/bin/python bench/console_cost.py [--jobs 20000] [--runs 5] [--pollers 4] [--every 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite import gridbot_end_to_end

PAGES = ("/v1/console/bags", "/v1/console/bags/e2e", "/v1/console/pools",
         "/v1/console/hosts?size=50&sort=error_rate&desc=1")


def poll(url: str, token: str | None, every: float, stop: threading.Event, count: list[int]) -> None:
    """Load the pages a console shows, every `every` seconds, until `stop`."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    while not stop.is_set():
        for page in PAGES:
            try:
                with urllib.request.urlopen(urllib.request.Request(url + page, headers=headers), timeout=10) as r:
                    r.read()
                count[0] += 1
            except OSError:
                pass  # the bag page answers 404 until the bag exists
        stop.wait(every)


@contextmanager
def consoles(url: str, pollers: int, every: float, count: list[int]) -> Iterator[None]:
    """`pollers` consoles polling the server at `url` while the block runs (the requests answered go in `count`)."""
    access = os.environ.get("GRIDBOT_ACCESS")
    token = json.loads(Path(access).read_text())["admin"] if access else None
    stop = threading.Event()
    threads = [threading.Thread(target=poll, args=(url, token, every, stop, count), daemon=True)
               for _ in range(pollers)]
    for th in threads:
        th.start()
    try:
        yield
    finally:
        stop.set()
        for th in threads:
            th.join()


def run(jobs: int, pollers: int, every: float) -> tuple[float, int]:
    """(jobs/s from the submission to the client seeing every job done, console requests answered): scenario 1's
    own run (suite.gridbot_end_to_end), with the consoles polling while it is timed."""
    count = [0]
    rate, _ = gridbot_end_to_end(jobs, "sh -c true", lambda url: consoles(url, pollers, every, count))
    return rate, count[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--pollers", type=int, default=4)
    parser.add_argument("--every", type=float, default=1.0)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"without": [], "with": []}
    answered = []
    for rep in range(args.runs):
        for arm in (("without", "with") if rep % 2 == 0 else ("with", "without")):
            rate, n = run(args.jobs, args.pollers if arm == "with" else 0, args.every)
            rates[arm].append(rate)
            if arm == "with":
                answered.append(n)
            print(f"run {rep + 1} {arm:>7} consoles: {rate:,.0f} jobs/s" + (f" ({n} console requests)" if n else ""),
                  flush=True)
    for arm, values in rates.items():
        print(f"{arm:>7} consoles: median {statistics.median(values):,.0f} jobs/s, min {min(values):,.0f}, "
              f"max {max(values):,.0f}")
    ratio = statistics.median(rates["with"]) / statistics.median(rates["without"])
    print(f"with / without: {ratio:.1%}; {args.pollers} consoles answered {statistics.median(answered):,.0f} "
          "requests a run (median)")


if __name__ == "__main__":
    main()

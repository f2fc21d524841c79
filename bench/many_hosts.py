"""Many small hosts in one process: HOSTS gridbot workers of SLOTS slots each, gridbot's own worker code
(gridbot.worker.worker.Worker, executor noop: every instance reported done at once), on one event loop.

    .venv/bin/python bench/many_hosts.py --server URL --workdir DIR [--hosts 200] [--slots 2] [--prefetch 2]

Each is a host of its own to the server: it registers with the pool's worker key (from GRIDBOT_ACCESS,
as `gridbot worker` finds it), gets its own host id and credential, and makes its own exchanges with
the bundles a host of SLOTS slots and PREFETCH prefetched instances makes (at most SLOTS + PREFETCH
instances held, reported and asked for per round trip). Two hundred `gridbot worker` processes would
not fit beside the server on a 2-core machine; one process of 200 workers measures the server with the
traffic of 200 hosts, the workers' own CPU included (issue 14: dispatch capacity with realistic
bundles and many small workers). SIGTERM or SIGINT stops every worker as `gridbot worker` stops.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from gridbot.security.access import find_access
from gridbot.worker.worker import Worker, WorkerConfig


async def run(args: argparse.Namespace) -> int:
    access = find_access(None)
    pool, key = access.worker_key(None)
    workers = [Worker(WorkerConfig(args.server, slots=args.slots, prefetch=args.prefetch, slot_name=f"host{n}",
                                   workdir=args.workdir / f"host{n}", idle_timeout=args.idle_timeout, pool=pool,
                                   key=key, state_dir=args.workdir / "state", executor="noop",
                                   fingerprint=access.fingerprint))
               for n in range(args.hosts)]
    tasks = [asyncio.ensure_future(w.run()) for w in workers]
    await asyncio.sleep(0.1)  # each Worker.run installs its own signal handlers first: one for all, after them
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for w in workers:
            w.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    codes = await asyncio.gather(*tasks)
    return max(codes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--idle-timeout", type=float, default=30.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()

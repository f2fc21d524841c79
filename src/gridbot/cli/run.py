"""`gridbot run`: an embedded server on a local store, local workers, a progress bar, and the results.

Running the same spec again on the same store resumes the bag (jobs already done are not run again);
a changed spec under the same name is refused rather than silently mixed with the old results.
Ctrl-C stops the workers, which give their instances back, and leaves the bag ready to resume.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from pathlib import Path

from gridbot.cli import render
from gridbot.client import TERMINAL_BAG_STATES, Client
from gridbot.core.dispatcher import DispatchConfig
from gridbot.errors import GridbotError
from gridbot.model.pools import PoolSpec
from gridbot.model.spec import BagSpec
from gridbot.pools.adapters import LocalAdapter
from gridbot.pools.base import PilotRequest
from gridbot.protocol import BagInfo
from gridbot.server.app import EmbeddedServer
from gridbot.server.service import Service, ServiceConfig
from gridbot.store.base import spec_hash
from gridbot.store.sql import open_store


def _state_dir(db: str) -> Path:
    """Where the run keeps worker directories and logs: beside a SQLite file, else ./.gridbot."""
    if db.startswith("sqlite:///"):
        return Path(db.removeprefix("sqlite:///").split("?", 1)[0]).parent
    if "://" not in db:
        return Path(db).parent
    return Path(".gridbot")


def run_here(spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes], workers: int, db: str,
             results_dir: Path | None, max_result_bytes: int, max_jobs: int) -> int:
    """Run one bag to its end on this machine; return the exit code (0 all done, 1 failures, 130 Ctrl-C)."""
    store = open_store(db)
    try:
        existing = store.bag(spec.name)
        if existing is not None and existing.spec_hash != spec_hash(spec, lines, inputs):
            raise GridbotError(
                f"the store {db} already has a bag named '{spec.name}' made from a different spec or inputs; "
                f"give this one another --name, or use another --db")
        results_dir = results_dir or Path("results") / spec.name
        state = _state_dir(db)
        config = ServiceConfig(DispatchConfig(max_result_bytes=max_result_bytes), max_jobs=max_jobs, heartbeat=5.0)
        service = Service(store, config)
        with EmbeddedServer(service, tick_interval=0.5) as srv, Client(srv.url) as client:
            if existing is None:
                info = client.submit(spec, lines, inputs)
            else:
                info = client.bag(existing.bag_id)
                c = info.counts
                render.console.print(f"resuming bag '{info.name}': {c.done:,} done, {c.failed:,} failed, "
                                     f"{info.total - c.done - c.failed - c.cancelled:,} to go")
            if info.state not in TERMINAL_BAG_STATES:
                local = PoolSpec("local", "local", max_running=workers, walltime=0, idle_timeout=0, min_cpu=0)
                pool = LocalAdapter(local, state, ["--prefetch", "1", "--prefetch-seconds", "1", "--exit-with-parent"])
                try:
                    pool.submit(workers, PilotRequest(srv.url))
                    info = _watch(client, pool, info.name, info.total, state)
                except KeyboardInterrupt:
                    render.err_console.print("interrupted: stopping workers; run the same command again to resume")
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    pool.close()
                    return 130
                pool.close()
            else:
                render.console.print(f"bag '{info.name}' had already ended ({info.state}); collecting its results")
            n = client.download_results(info.bag_id, results_dir)
            failed = client.jobs(info.bag_id, "failed", limit=10) if info.counts.failed else []
            render.summary(info, f"{results_dir} ({n:,} jobs)", failed)
            return 0 if info.state == "completed" else 1
    finally:
        store.close()


def _watch(client: Client, pool: LocalAdapter, name: str, total: int, state: Path) -> BagInfo:
    """Show progress until the bag ends; fail loudly if every worker died."""
    with render.BagProgress(name, total) as progress:
        while True:
            info = client.bag(name)
            progress.update(info)
            if info.state in TERMINAL_BAG_STATES:
                return info
            if pool.alive() == 0:
                raise GridbotError(f"every local worker exited before the bag ended; see the logs in {state / 'logs'}")
            time.sleep(0.25)

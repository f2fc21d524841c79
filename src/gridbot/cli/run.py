"""`gridbot run`: an embedded server on a local store, local workers, a progress bar, and the results.

Running the same spec again on the same store resumes the bag (jobs already done are not run again);
a changed spec under the same name is refused rather than silently mixed with the old results, unless
`--retry-failed` makes it the bag's next revision (done jobs keep their results, failed ones run again
under the new spec). The results folder is checked before the bag runs (`gridbot.results`).
Ctrl-C stops the workers, which give their instances back, and leaves the bag ready to resume.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

from gridbot.cli import render
from gridbot.client import TERMINAL_BAG_STATES, Client
from gridbot.core.config import DispatchConfig
from gridbot.errors import GridbotError
from gridbot.model.pools import PoolSpec
from gridbot.model.spec import BagSpec
from gridbot.model.states import BagState, JobState
from gridbot.pools.adapters import LocalAdapter
from gridbot.pools.base import PilotRequest
from gridbot.protocol import BagInfo
from gridbot.results import ResultsFolder
from gridbot.security.access import ephemeral_keys
from gridbot.server.app import EmbeddedServer, tune_gc
from gridbot.server.service import Service, ServiceConfig
from gridbot.store.base import Store, spec_hash
from gridbot.store.sql import open_store


def _state_dir(db: str) -> Path:
    """Where the run keeps worker directories and logs: beside a SQLite file, else ./.gridbot."""
    if db.startswith("sqlite:///"):
        return Path(db.removeprefix("sqlite:///").split("?", 1)[0]).parent
    if "://" not in db:
        return Path(db).parent
    return Path(".gridbot")


def run_here(spec: BagSpec, lines: Sequence[str] | None, inputs: dict[str, bytes], workers: int, db: str,
             results_dir: Path | None, max_result_bytes: int, max_jobs: int, retry_failed: bool = False,
             force: bool = False, console: bool = False) -> int:
    """Run one bag to its end on this machine; return the exit code (0 all done, 1 failures, 130 Ctrl-C).

    With `retry_failed`, a stored bag of the same name has its failed jobs run again, under this spec as its
    next revision if the spec or inputs changed; `force` writes the results into a folder holding others;
    `console` prints the web console's URL (`console_url`)."""
    store = open_store(db)
    try:
        existing = store.bag(spec.name)
        if existing is not None and existing.spec_hash != spec_hash(spec, lines, inputs) and not retry_failed:
            raise GridbotError(
                f"the store {db} already has a bag named '{spec.name}' made from a different spec or inputs; "
                f"to run its failed jobs again with this one (done jobs keep their results): --retry-failed; "
                f"else give this one another --name, or use another --db")
        results_dir = results_dir or Path("results") / spec.name
        if existing is None:
            ResultsFolder.refuse_for_a_new_bag(results_dir, spec.name, force)
        state = _state_dir(db)
        config = ServiceConfig(DispatchConfig(max_result_bytes=max_result_bytes), max_jobs=max_jobs, heartbeat=5.0)
        _others(store, spec.name)
        service = Service(store, config, only={existing.bag_id} if existing is not None else set())
        keys = ephemeral_keys(user=existing.owner if existing is not None else None)
        tune_gc()  # the server runs in this process
        with EmbeddedServer(service, tick_interval=0.5, keys=keys) as srv, \
                Client(srv.url, access=srv.access) as client:
            if console:
                render.console.print(f"console: {console_url(srv.url, srv.access.submitter)}", soft_wrap=True,
                                     markup=False, highlight=False)
            if existing is None:
                info = client.submit(spec, lines, inputs)
            elif retry_failed:
                answer = client.revise(spec, lines, inputs)  # the same spec: its failed jobs run again
                info = answer.bag
                revised = f"revision {info.revision}: " if info.revision != existing.revision else ""
                render.console.print(f"bag '{info.name}' {revised}{answer.requeued:,} failed job(s) queued again")
            else:
                info = client.bag(existing.bag_id)
                c = info.counts
                render.console.print(f"resuming bag '{info.name}': {c.done:,} done, {c.failed:,} failed, "
                                     f"{info.total - c.done - c.failed - c.cancelled:,} to go")
            ResultsFolder(results_dir, info, force).prepare()  # refused now, not after the bag ran
            if info.state not in TERMINAL_BAG_STATES:
                # the user's own machine: no set-up, even as root; each worker holds one job of `cpus` CPUs
                local = PoolSpec("local", "local", max_running=workers, cpus=spec.cpus, walltime=0, idle_timeout=0,
                                 min_cpu=0, allow_root=True)
                pool = LocalAdapter(local, state, ["--prefetch", "1", "--prefetch-seconds", "1", "--exit-with-parent"])
                caught = _stop_on_signals()
                try:
                    pool.submit(workers, PilotRequest(srv.url, key=srv.access.workers["local"]))
                    info = _watch(client, pool, info.name, info.total, state)
                except KeyboardInterrupt:
                    render.err_console.print("interrupted: stopping workers; run the same command again to resume")
                    for sig in STOP_SIGNALS:
                        signal.signal(sig, signal.SIG_IGN)
                    return 128 + (caught[-1] if caught else signal.SIGINT)
                finally:
                    pool.stop()
            else:
                render.console.print(f"bag '{info.name}' had already ended ({info.state}); collecting its results")
            n = client.download_results(info.bag_id, results_dir, force)
            failed = client.jobs(info.bag_id, JobState.FAILED, limit=10) if info.counts.failed else []
            render.summary(info, f"{results_dir} ({n:,} jobs)", failed)
            return 0 if info.state == BagState.COMPLETED else 1
    finally:
        store.close()


def console_url(url: str, key: str) -> str:
    """The console of a run's embedded server, its key in the URL's fragment: the run's keys live in memory
    only, and a fragment never leaves the browser (the page keeps the key in the tab, then drops it from the
    address bar). The server listens on 127.0.0.1 alone."""
    return f"{url}/ui#key={quote(key, safe='')}"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
WATCH = 0.25
"""Seconds between two updates of the run's progress: the server answers at once when the bag ends."""


def _stop_on_signals() -> list[int]:
    """SIGTERM and SIGHUP stop the run as Ctrl-C does (workers stopped, their instances given back),
    instead of killing this process and leaving its workers to run on; returns the signals caught."""
    caught: list[int] = []

    def stop(signum: int, frame: object) -> None:
        caught.append(signum)
        raise KeyboardInterrupt

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    return caught


def _others(store: Store, name: str) -> None:
    """Say that other active bags of the store stay as they are: this run serves its own bag only."""
    others = [b.name for b in store.bags() if b.state is BagState.ACTIVE and b.name != name]
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        render.err_console.print(f"note: the store also holds unfinished bags ({shown}); this run leaves them "
                                 "as they are (resume one with `gridbot run` on its own spec)", soft_wrap=True)


def _watch(client: Client, pool: LocalAdapter, name: str, total: int, state: Path) -> BagInfo:
    """Show progress until the bag ends; fail loudly if every worker died."""
    said: set[str] = set()
    with render.BagProgress(name, total) as progress:
        while True:
            info = client.bag_once_ended(name, WATCH)
            progress.update(info)
            for message in info.diagnostics:  # why the bag is not moving, once each
                if message not in said:
                    said.add(message)
                    render.err_console.print(f"[yellow]{name}:[/] {message}", soft_wrap=True)
            if info.state in TERMINAL_BAG_STATES:
                return info
            if pool.alive() == 0:
                raise GridbotError(f"every local worker exited before the bag ended; see the logs in {state / 'logs'}")

"""Throughput and scale, gridbot side by side with HyperQueue, Dask, Parsl, Ray and ProcessPoolExecutor
(issues 6 and 14).

    make bench                                   # every scenario, 3 repetitions, peers installed on first use
    make bench BENCH_ARGS="--only 1 --runs 5"    # anything below, passed through
    .venv/bin/python bench/suite.py --only 1 2 --runs 1 --jobs 5000

1. end to end, like for like: JOBS jobs submitted at once, all results back, the same command on every
   system: a shell per job (`sh -c true`; the peers' `subprocess.run("true", shell=True)`), the
   headline, and with `--e2e-task shell exec` also `true` executed directly on every system (gridbot
   runs a plain command without a shell; the peers `subprocess.run(["true"])`, HyperQueue its program).
   gridbot: a `gridbot server` on SQLite (synchronous=FULL, the default) and two `gridbot worker`
   processes of one slot (prefetch from the jobs' run time, as `gridbot run` starts them); the clock
   starts once both have registered and wait for work, at the submission, and stops when the client sees
   the bag completed with every job done. Peers: two worker processes (or cores) each, started and warmed
   up first (bench/peers/run_peer.py); every result is checked (count, return code 0). The systems take
   turns within each repetition, in an order that rotates from one repetition to the next, so the
   machine's drift falls on all of them alike. Seconds to the first result: gridbot's from the server's
   record of it, the peers' from the tasks' own completion timestamps. One more row, not a peer: the
   chunked map with a gridbot worker's per-job duties besides the job (output files, a session, the
   output tails, the slot emptied; bench/peers/run_peer.py `ppe-duties`), the most a worker doing them
   could reach with no server, report or event loop: the target of 85% of the plain map is judged
   beside it.
2. dispatch capacity: noop workers (`--executor noop`: every instance reported done at once), so the
   server, the protocol and the store are measured alone, with two fleets: 2 hosts of 1,000 slots
   (1,000-job bundles per round trip) and HOSTS hosts of 2 slots with 2 prefetched (bundles of up to 4,
   one process of gridbot's own worker code: bench/many_hosts.py). jobs/s from the first instance sent
   to the last result committed (the client sees the bag completed: the store's last commit), on SQLite
   and PostgreSQL. The peers' no-op Python task rates follow in a table of their own, for orientation
   only: another clock and another kind of work, so no ratio to gridbot.
3. queue scale: a bag of SCALE_JOBS (10,000,000) jobs: submission rate into SQLite (a sweep, and a file
   of one command per line), dispatch rates over the first results, over a window deep into the bag,
   and for bags of the windows' sizes alone, and the gridbot server process's peak memory.
4. many bags: 50 bags with distinct Rank, JobRequirements and Concurrency, a host-dependent Rank (each
   bag preferred on one of the two hosts) and JobRequirements that exclude a host for one bag in five,
   dispatched as in 2 (two hosts of 1,000 slots), against one bag of the same size, in turns.
Every figure is measured in this run; the tables give min/median/max and the ratio to the reference.
The header says where the databases are (warning on tmpfs, where an fsync is free: --db-dir) and how
PostgreSQL commits (fsync, synchronous_commit).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).parent))

import harness
from harness import Row, table

from gridbot.client import Client
from gridbot.model.spec import BagSpec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / ".venv-peers"
PEERS = ("ppe", "ppe-map", "ppe-duties", "dask", "parsl", "ray", "hq")
LOOP = "gridbot-loop"
"""gridbot with every job on its worker's event loop (`--no-slot-threads`): the worker before its slot threads."""
ALL_PEERS = (*PEERS, "hq-files", LOOP)
CEILING = "ppe-map"
"""ProcessPoolExecutor's chunked map: no middleware, the spawn ceiling of the machine."""
DUTIES = "ppe-duties"
"""The chunked map doing a gridbot worker's per-job duties besides the job: the most such a worker can reach."""
NOT_MIDDLEWARE = ("ppe", "ppe-map", DUTIES, LOOP)
PEER_NAMES = {"ppe": "ProcessPoolExecutor(2), submit()", "ppe-map": "ProcessPoolExecutor(2), chunked map()",
              DUTIES: "chunked map() with gridbot's per-job duties",
              "dask": "Dask LocalCluster", "parsl": "Parsl HTEX", "ray": "Ray", "hq": "HyperQueue",
              "hq-files": "HyperQueue, default output files",
              LOOP: "gridbot, every job on the worker's event loop (--no-slot-threads)"}
E2E_COMMAND = {"shell": "sh -c true", "exec": "true"}
E2E_TITLE = {"shell": "a shell per job (`sh -c true`) on every system",
             "exec": "`true` executed directly (no shell) on every system"}


def sweep(name: str, jobs: int, command: str = "true") -> BagSpec:
    return parse_spec(f'command = "{command}"\n[parameters]\ni = {{ from = 1, to = {jobs} }}\n', "bench", name,
                      max_jobs=max(jobs, 1))


FINE_POLL_JOBS = 10_000


def wait_until(client: Client, names: str | list[str], done: int | None = None, limit: float = 3600) -> float:
    """Wait until every bag has ended with every job done (or until `done` results in all): the time.time()
    they were seen so. A bag's row is read from the store's last commit, so what the client sees is durable.

    Bags to their end are waited for as a user waits (`Client.wait`: the server answers once a bag's end is
    committed), one by one: a bag that ended already answers at once, and the time is the one at which the
    answer for the bag that ended last came (not after the round trips for the bags asked after it). To
    `done` results, the bags are
    polled every 50 ms, and every 5 ms over the last tenth of the way but at most its last 10,000 results
    (each poll is a request the server answers: polling a tenth of
    1,200,000 every 5 ms loaded scenario 3's deep window with six times the polls of the window it is
    compared with; in scenario 1, polling a 20,000-job bag cost the client 6-7 µs and the server about 5 µs a
    job, in `bench/cpu_per_job.py`: 1% of the machine, which a peer waiting on its futures does not pay)."""
    names = [names] if isinstance(names, str) else names
    if done is None:
        deadline = time.monotonic() + limit
        heard: list[tuple[float, float]] = []
        for name in names:
            try:
                info = client.wait(name, timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise SystemExit(f"bag {name} did not end within {limit:.0f} s") from None
            if info.state != "completed" or info.counts.done != info.total or info.counts.failed:
                raise SystemExit(f"bag {info.name} ended {info.state}: {info.counts}")
            heard.append((info.finished_at or 0.0, time.time()))
        return max(heard)[1]
    wanted = set(names)
    deadline = time.time() + limit
    while time.time() < deadline:
        infos = [client.bag(names[0])] if len(names) == 1 else [b for b in client.bags() if b.name in wanted]
        results = sum(b.counts.done for b in infos)
        if results >= done:
            return time.time()
        time.sleep(0.005 if done - results <= min(done / 10, FINE_POLL_JOBS) else 0.05)
    raise SystemExit(f"bags {', '.join(names)[:200]} did not get there within {limit:.0f} s")


def wait_registered(client: Client, count: int, procs: list[subprocess.Popen[bytes]], limit: float = 120) -> None:
    """Wait until `count` hosts have made their first exchange (they are then waiting for work)."""
    deadline = time.time() + limit
    while len(client.hosts()) < count:
        if any(p.poll() is not None for p in procs) or time.time() > deadline:
            raise SystemExit(f"{len(client.hosts())} of {count} hosts registered; see the workers' logs")
        time.sleep(0.05)


def idle_workers(url: str, count: int, tmp: Path, *args: str) -> AbstractContextManager[list[subprocess.Popen[bytes]]]:
    return harness.workers(url, count, tmp, "--idle-timeout", "30", *args)


@contextmanager
def started(fleet: Fleet, client: Client, url: str, tmp: Path) -> Iterator[None]:
    """The fleet's workers, every one registered and waiting for work."""
    with fleet.start(url, tmp) as procs:
        wait_registered(client, fleet.hosts, procs)
        yield


# -- scenario 1 -----------------------------------------------------------------------------------

def gridbot_end_to_end(jobs: int, command: str = "sh -c true",
                       during: Callable[[str], AbstractContextManager[object]] | None = None,
                       worker_args: tuple[str, ...] = ()) -> tuple[float, float]:
    """(jobs/s from the submission to the client seeing every job done, seconds to the first result); `during`
    (given the server's URL) is entered once the workers wait and left when the bag is done (console_cost.py)."""
    with harness.workdir() as t:
        tmp = Path(t)
        db = f"sqlite:///{tmp}/gridbot.db"
        with harness.server(db, tmp) as srv, Client(srv.url) as client, \
                idle_workers(srv.url, 2, tmp, "--slots", "1", "--prefetch", "1", "--prefetch-seconds", "1",
                             *worker_args) as procs:
            wait_registered(client, 2, procs)
            with during(srv.url) if during is not None else contextlib.nullcontext():
                start = time.time()
                client.submit(sweep("e2e", jobs, command))
                end = wait_until(client, "e2e")
        first = min(e for _, e in harness.instance_times(db))
    return jobs / (end - start), first - start


def peer(system: str, task: str, jobs: int) -> dict[str, object]:
    env = {**os.environ, "PATH": f"{PEERS_VENV / 'bin'}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(PEERS_VENV / "bin" / "python"), str(ROOT / "bench" / "peers" / "run_peer.py"), system,
                           task, str(jobs)], capture_output=True, text=True, env=env, timeout=1800)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{system} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    out: dict[str, object] = json.loads(line)
    if out.get("results") != jobs:
        raise RuntimeError(f"{system} checked {out.get('results')} results of {jobs}")
    return out


def failure(e: BaseException) -> str:
    last = [ln for ln in str(e).splitlines() if ln.strip()]
    return f"failed: {(last[-1] if last else str(e))[:160]}"


def take_turns(systems: list[str], rep: int) -> list[str]:
    """The systems in the order of repetition `rep`: rotated by one each time."""
    k = rep % len(systems)
    return systems[k:] + systems[:k]


def by_repetition(grid: Row, other: Row, form: str) -> str:
    """gridbot's rate over `other`'s within each repetition, where both ran in the same turn (minutes apart at
    most, while the machine's speed drifts by a third on some VMs between turns): the spread of the ratio that
    the ratio of the medians hides. "" with fewer than two repetitions. A peer that failed stopped taking turns,
    so the values of both still line up repetition by repetition."""
    ratios = [g / o for g, o in zip(grid.values, other.values, strict=False) if o > 0]
    if len(ratios) < 2:
        return ""
    low, mid, high = (form.format(v) for v in (min(ratios), statistics.median(ratios), max(ratios)))
    return f"; repetition by repetition {low} to {high}, median {mid}"


def scenario_1(jobs: int, runs: int, peers: list[str], task: str) -> str:
    systems = ["gridbot", *peers]
    names = {"gridbot": "gridbot", **PEER_NAMES}
    rate = {s: Row(names[s]) for s in systems}
    first = {s: Row(names[s], unit="s") for s in systems}
    rate["gridbot"].note = first["gridbot"].note = "SQLite synchronous=FULL, 2 workers of 1 slot"
    if LOOP in rate:
        rate[LOOP].note = first[LOOP].note = "the same, every job a task of the worker's event loop"
    broken: set[str] = set()
    for rep in range(runs):
        for s in take_turns(systems, rep):
            if s in broken:
                continue
            if s in ("gridbot", LOOP):
                loop_only = ("--no-slot-threads",) if s == LOOP else ()
                r, f = gridbot_end_to_end(jobs, E2E_COMMAND[task], worker_args=loop_only)
                rate[s].values.append(r)
                first[s].values.append(f)
                continue
            try:
                out = peer(s, task, jobs)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                rate[s].note = first[s].note = failure(e)
                broken.add(s)
                continue
            rate[s].values.append(float(out["rate"]))  # type: ignore[arg-type]
            rate[s].note = f"{out['version']}; {out['config']}"
            first[s].note = str(out["version"])
            if out["first"] is None:
                first[s].note += "; not measured: its tasks return no timestamp, its progress comes once a second"
            else:
                first[s].values.append(float(out["first"]))  # type: ignore[arg-type]
    title = E2E_TITLE[task]
    out_text = table(f"1. End to end, {title}: {jobs:,} jobs, jobs/s from the submission to the last result "
                     "checked", list(rate.values()), versus="gridbot")
    out_text += table(f"1. End to end, {title}: seconds from the submission to the first result (gridbot: the "
                      "server's record of it; peers: the task's own end, before its result travels back)",
                      list(first.values()), versus="gridbot", higher_is_better=False)
    grid = rate["gridbot"]
    middleware = [rate[s] for s in peers if s not in NOT_MIDDLEWARE and rate[s].values]
    best = max(middleware, key=lambda r: r.median, default=None)
    lines = []
    if best is not None:
        lines.append(f"gridbot / best middleware peer ({best.name}): {grid.median / best.median:.2f}x (target 2x)"
                     + by_repetition(grid, best, "{:.2f}x"))
    for s, target in ((CEILING, " (the spawn ceiling; target 85%)"), (DUTIES, ""), ("ppe", "")):
        if s in rate and rate[s].values:
            lines.append(f"gridbot / {rate[s].name}: {grid.median / rate[s].median:.0%}{target}"
                         + by_repetition(grid, rate[s], "{:.0%}"))
    if all(s in rate and rate[s].values for s in (DUTIES, CEILING)):
        lines.append(f"{rate[DUTIES].name} / {rate[CEILING].name}: {rate[DUTIES].median / rate[CEILING].median:.0%} "
                     "(the most a worker doing those duties could reach, with no server, report or event loop)")
    return out_text + ("\n".join(lines) + "\n" if lines else "")


# -- scenarios 2 and 4: dispatch capacity ---------------------------------------------------------

@dataclass(frozen=True)
class Fleet:
    """Noop workers: `hosts` hosts of `slots` slots holding `prefetch` more, as processes of their own or
    (`one_process`) all in one (bench/many_hosts.py)."""

    hosts: int
    slots: int
    prefetch: int = 0
    one_process: bool = False

    @property
    def label(self) -> str:
        bundle = self.slots + self.prefetch
        return f"{self.hosts:,} hosts of {self.slots:,} slots ({bundle:,}-job bundles)" if not self.prefetch else \
            f"{self.hosts:,} hosts of {self.slots:,} slots (bundles of up to {bundle:,})"

    def start(self, url: str, tmp: Path) -> AbstractContextManager[list[subprocess.Popen[bytes]]]:
        if self.one_process:
            return harness.many_hosts(url, tmp, self.hosts, self.slots, self.prefetch)
        return idle_workers(url, self.hosts, tmp, "--slots", str(self.slots), "--prefetch", str(self.prefetch),
                            "--executor", "noop")


BIG = Fleet(2, 1000)


def dispatch(db: str, tmp: Path, bags: list[BagSpec], fleet: Fleet = BIG) -> float:
    """Start the fleet, wait until every host waits for work, submit `bags` and return jobs/s from the
    first instance sent to the last result committed (the client sees every bag completed)."""
    jobs = sum(b.sweep_size for b in bags)
    with harness.server(db, tmp, "--max-jobs", str(max(jobs, 1))) as srv, Client(srv.url) as client, \
            started(fleet, client, srv.url, tmp):
        for b in bags:
            client.submit(b)
        end = wait_until(client, [b.name for b in bags])
    return jobs / (end - harness.first_sent(db))


def with_policies(spec: BagSpec, n: int, bags: int) -> BagSpec:
    """Bag `n` of `bags`: its own Rank, preferred on one of the two hosts (bench0 for even n, bench1 for
    odd: a Rank that depends on the host, evaluated per request), JobRequirements that exclude bench1 for
    one bag in five, and a Concurrency from the host's error rate. The hosts are named by the worker's
    machine and slot name (`Host.Name`, harness.workers' `--name benchN`)."""
    machine = socket.gethostname()
    exclude = f' && Host.Name != "{machine}/bench1"' if n % 5 == 0 else ""
    policy = {"Rank": f'{n} + (Host.Name == "{machine}/bench{n % 2}" ? {bags} : 0)',
              "JobRequirements": f"!Host.BlackHole && Host.ErrorRate < 0.{n % 9 + 1}{exclude}",
              "Concurrency": "Host.ErrorRate < 0.01 ? Host.Slots + Host.Prefetch : 1"}
    return msgspec.structs.replace(spec, policy=policy)


def pg_url(n: int) -> AbstractContextManager[str]:
    return harness.pg_database(f"gridbot_bench_{n}")


def scenario_2(jobs: int, runs: int, pg: bool, many: Fleet, many_jobs: int) -> str:
    cases: dict[str, tuple[Fleet, int, bool]] = {}
    for fleet, n in ((BIG, jobs), (many, many_jobs)):
        cases[f"gridbot, SQLite, {fleet.label}"] = (fleet, n, False)
        if pg:
            cases[f"gridbot, PostgreSQL, {fleet.label}"] = (fleet, n, True)
    rows = {name: Row(name, note=f"{n:,} jobs") for name, (_, n, _) in cases.items()}
    for rep in range(runs):
        for name in take_turns(list(cases), rep):
            fleet, n, on_pg = cases[name]
            with harness.workdir() as t:
                if on_pg:
                    with pg_url(rep) as url:
                        rows[name].values.append(dispatch(url, Path(t), [sweep("cap", n)], fleet))
                else:
                    rows[name].values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), [sweep("cap", n)], fleet))
    return table("2. Dispatch capacity: noop workers, jobs/s from the first instance sent to the last result "
                 "committed (target: 20,000 jobs/s on SQLite with 1,000-job bundles)", list(rows.values()),
                 versus=next(iter(rows)))


def peers_noop(runs: int, peers: list[str], jobs: int) -> str:
    rows = {p: Row(PEER_NAMES[p]) for p in peers}
    broken: set[str] = set()
    for rep in range(runs):
        for p in take_turns(peers, rep):
            if p in broken:
                continue
            try:
                out = peer(p, "noop", jobs)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                rows[p].note = failure(e)
                broken.add(p)
                continue
            rows[p].values.append(float(out["rate"]))  # type: ignore[arg-type]
            rows[p].note = f"{out['version']}; {out['config']}"
    return table(f"2. For orientation only: the peers' own rate with {jobs:,} no-op Python tasks, jobs/s from the "
                 "submission to the last result in the client (a function run per task and another clock: not "
                 "comparable with gridbot's noop workers above, hence no ratio)", list(rows.values()))


# -- scenario 3 -----------------------------------------------------------------------------------

def submit_lines_rate(tmp: Path, jobs: int) -> float:
    """jobs/s of `Client.submit_lines` (what `gridbot submit --each-line FILE` does: read and check the
    file, send it, store one job per line) for a file of `jobs` commands, into a fresh SQLite store."""
    path = tmp / "lines.txt"
    path.write_text("".join(f"true {i}\n" for i in range(jobs)))
    db = f"sqlite:///{tmp}/lines.db"
    with harness.server(db, tmp, "--max-jobs", str(jobs)) as srv, Client(srv.url, timeout=3600) as client:
        start = time.perf_counter()
        client.submit_lines(path, "lines", max_jobs=jobs)
        elapsed = time.perf_counter() - start
        if client.bag("lines").total != jobs:
            raise SystemExit("the each-line bag does not have a job per line")
    return jobs / elapsed


def scenario_3(scale_jobs: int, runs: int, window: int, small: int, deep: int, lines_jobs: int) -> str:
    small_bag = Row(f"dispatch, a bag of {small:,} alone")
    mid_bag = Row(f"dispatch, a bag of {window:,} alone")
    large_small = Row(f"dispatch, {scale_jobs:,} queued: first {small:,} results")
    large_window = Row(f"dispatch, {scale_jobs:,} queued: first {window:,} results")
    large_deep = Row(f"dispatch, {scale_jobs:,} queued: results {deep:,} to {deep + window:,}")
    submit = Row(f"submit a sweep of {scale_jobs:,} jobs into SQLite")
    lines = Row(f"submit a file of {lines_jobs:,} lines (a job per line) into SQLite",
                note="Client.submit_lines: read, check, send, store")
    rss = Row(f"gridbot server process, peak RSS (VmHWM) with {scale_jobs:,} queued", unit="MiB")
    marks = sorted({small, window, deep, deep + window})
    for _ in range(runs):
        with harness.workdir() as t:
            small_bag.values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), [sweep("small", small)]))
        with harness.workdir() as t:
            mid_bag.values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), [sweep("mid", window)]))
        with harness.workdir() as t:
            tmp = Path(t)
            db = f"sqlite:///{tmp}/g.db"
            with harness.server(db, tmp, "--max-jobs", str(scale_jobs)) as srv, \
                    Client(srv.url, timeout=3600) as client:
                start = time.perf_counter()
                client.submit(sweep("large", scale_jobs))
                submit.values.append(scale_jobs / (time.perf_counter() - start))
                with started(BIG, client, srv.url, tmp):
                    seen = {m: wait_until(client, "large", done=m) for m in marks}
                rss.values.append(harness.rss_mib(srv.proc.pid, peak=True))
            begin = harness.first_sent(db)
            large_small.values.append(small / (seen[small] - begin))
            large_window.values.append(window / (seen[window] - begin))
            large_deep.values.append(window / (seen[deep + window] - seen[deep]))
        with harness.workdir() as t:
            lines.values.append(submit_lines_rate(Path(t), lines_jobs))
    out = table(f"3. Queue scale, dispatch: a bag of {scale_jobs:,} jobs, noop workers as in 2 (2 hosts of 1,000 "
                "slots), jobs/s to the results committed (target: within 10% of a bag of the window's size alone)",
                [small_bag, large_small, mid_bag, large_window, large_deep], versus=small_bag.name)
    out += table("3. Queue scale, submission and memory (targets: submit >= 200,000 jobs/s; RSS < 1 GiB)",
                 [submit, lines, rss])
    out += (f"\nequal windows, {scale_jobs:,} queued against a bag of the window's size alone: first {small:,} "
            f"{large_small.median / small_bag.median:.2f}; first {window:,} {large_window.median / mid_bag.median:.2f}"
            f"; results {deep:,} to {deep + window:,} {large_deep.median / mid_bag.median:.2f}\n")
    return out


# -- scenario 4 -----------------------------------------------------------------------------------

def scenario_4(jobs: int, runs: int, bags: int) -> str:
    """One bag and `bags` bags in turn, each repetition a pair in alternating order: the machine's speed
    drifts over minutes (scenario 2's figure, taken before scenario 3, made a poor reference)."""
    one = Row("one bag")
    many = Row(f"{bags} bags, distinct and host-dependent Rank, JobRequirements excluding a host for "
               f"{len(range(0, bags, 5))}, Concurrency")
    runs_of: dict[str, Callable[[], list[BagSpec]]] = {
        one.name: lambda: [sweep("one", jobs)],
        many.name: lambda: [with_policies(sweep(f"b{n}", jobs // bags), n, bags) for n in range(bags)]}
    rows = {one.name: one, many.name: many}
    for rep in range(runs):
        for name in take_turns(list(rows), rep):
            with harness.workdir() as t:
                rows[name].values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), runs_of[name]()))
    return table(f"4. Many bags: {jobs:,} jobs in {bags} bags vs one bag, noop workers, {BIG.label} (target: "
                 "within 20%)", [one, many], versus="one bag")


def ensure_peers() -> str:
    """Install the peers' virtualenv if needed; what it was made with (bench/peers/setup.sh's stamp)."""
    subprocess.run([str(ROOT / "bench" / "peers" / "setup.sh"), str(PEERS_VENV)], check=True)
    stamp = PEERS_VENV / ".installed"
    first = stamp.read_text().splitlines()[0] if stamp.exists() else "?"
    return f"peers: {PEERS_VENV.name}, {first.removeprefix('interpreter: ')}, pins bench/peers/constraints.txt"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, nargs="*", default=[1, 2, 3, 4], help="scenarios to run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs of scenario 1")
    parser.add_argument("--e2e-task", nargs="+", default=["shell"], choices=sorted(E2E_COMMAND),
                        help="scenario 1's command on every system: shell (`sh -c true`, the headline) and/or exec "
                             "(`true` executed directly)")
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=ALL_PEERS)
    parser.add_argument("--capacity-jobs", type=int, default=200_000, help="jobs of scenarios 2 and 4")
    parser.add_argument("--hosts", type=int, default=200, help="hosts of the many-hosts fleet of scenario 2")
    parser.add_argument("--host-slots", type=int, default=2, help="slots of each of those hosts")
    parser.add_argument("--host-prefetch", type=int, default=2, help="instances each of those hosts prefetches")
    parser.add_argument("--many-hosts-jobs", type=int, default=100_000, help="jobs of the many-hosts rows")
    parser.add_argument("--capacity-peers", nargs="*", default=None, choices=ALL_PEERS,
                        help="peers whose no-op rate scenario 2 shows (default: --peers but HyperQueue and "
                             f"{DUTIES}, which run programs)")
    parser.add_argument("--peer-noop-jobs", type=int, default=20_000)
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL in scenario 2")
    parser.add_argument("--scale-jobs", type=int, default=10_000_000)
    parser.add_argument("--scale-runs", type=int, default=3, help="repetitions of scenario 3 (a minute or two each)")
    parser.add_argument("--scale-small", type=int, default=50_000, help="scenario 3's short window")
    parser.add_argument("--scale-window", type=int, default=200_000, help="scenario 3's long window")
    parser.add_argument("--scale-deep", type=int, default=1_000_000,
                        help="results done before scenario 3's deep window starts")
    parser.add_argument("--lines-jobs", type=int, default=1_000_000, help="lines of scenario 3's each-line bag")
    parser.add_argument("--bags", type=int, default=50)
    parser.add_argument("--db-dir", type=Path, help="where the SQLite databases go [default: the temporary directory]")
    parser.add_argument("--out", type=Path, help="also write the tables to this Markdown file")
    args = parser.parse_args()
    harness.DB_DIR = args.db_dir
    capacity_peers = [p for p in args.peers if not p.startswith("hq") and p != DUTIES] \
        if args.capacity_peers is None else [p for p in args.capacity_peers if p != DUTIES]
    pg = 2 in args.only and not args.no_pg
    started_at = time.time()
    parts = [f"machine: {harness.machine()}", f"command: {' '.join(sys.argv)}", harness.storage()]
    if pg:
        try:
            parts.append(harness.pg_settings())
        except Exception as e:  # said in the header; scenario 2 then fails on its own
            parts.append(f"PostgreSQL at {harness.PG_ADMIN}: cannot read its settings ({e})")
    # gridbot-loop is gridbot's own worker, run from gridbot's virtualenv: it needs no peers' one
    if ([p for p in args.peers if p != LOOP] and 1 in args.only) or \
            ([p for p in capacity_peers if p != LOOP] and 2 in args.only):
        parts.append(ensure_peers())
    parts.append("")
    print("\n".join(parts), flush=True)

    def emit(text: str) -> None:
        parts.append(text)
        print(text, flush=True)

    if 1 in args.only:
        for task in args.e2e_task:
            emit(scenario_1(args.jobs, args.runs, args.peers, task))
    if 2 in args.only:
        many = Fleet(args.hosts, args.host_slots, args.host_prefetch, one_process=True)
        emit(scenario_2(args.capacity_jobs, args.runs, pg, many, args.many_hosts_jobs))
        if capacity_peers:
            emit(peers_noop(args.runs, capacity_peers, args.peer_noop_jobs))
    if 3 in args.only:
        emit(scenario_3(args.scale_jobs, args.scale_runs, args.scale_window, args.scale_small, args.scale_deep,
                        args.lines_jobs))
    if 4 in args.only:
        emit(scenario_4(args.capacity_jobs, args.runs, args.bags))
    emit(f"total {time.time() - started_at:.0f} s")
    if args.out:
        args.out.write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()

"""Throughput and scale, gridbot side by side with Dask, Parsl, Ray and ProcessPoolExecutor (issue 6).

    make bench                      # every scenario, 3 repetitions, peers installed on first use
    .venv/bin/python bench/suite.py --only 1 2 --runs 1 --jobs 5000

1. end to end: JOBS shell jobs of `true`, submitted at once, all results back: jobs/s and seconds to
   the first result. gridbot: a `gridbot server` on SQLite (synchronous=FULL, the default) and two
   `gridbot worker` processes of one slot (prefetch from the jobs' run time, as `gridbot run` starts
   them), already started and waiting; the clock runs from the submission until the client sees the bag
   completed. Peers: two worker processes each (bench/peers/run_peer.py), already started. gridbot runs
   `true` without a shell (a plain command: GNU make's rule); the row `sh -c true` gives it the shell
   per job that the peers' `subprocess.run("true", shell=True)` starts, the same work as theirs.
2. dispatch capacity: workers that report every instance done at once (`--executor noop`), 1,000
   slots each, so the server, the protocol and the store are measured alone; jobs/s from the first
   instance sent to the last result stored, on SQLite and on PostgreSQL. Peers run no-op Python tasks.
3. queue scale: a bag of SCALE_JOBS (10,000,000) jobs: submission rate into SQLite, then the dispatch
   rate over the first results compared with a bag of 10,000 jobs, and the server's peak memory.
4. many bags: 50 bags with distinct Rank, JobRequirements and Concurrency, dispatched as in 2: the
   rate compared with one bag of the same size.
Every figure is measured in this run; the tables give min/median/max and the ratio to the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).parent))

import harness
from harness import Row, table

from gridbot.client import Client
from gridbot.model.spec import BagSpec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
PEERS_VENV = ROOT / ".venv-peers"
PEERS = ("ppe", "dask", "parsl", "ray")
SHELL_ROW = "gridbot, `sh -c true`"
PEER_NAMES = {"ppe": "ProcessPoolExecutor(2)", "dask": "Dask LocalCluster", "parsl": "Parsl HTEX",
              "ray": "Ray"}


def sweep(name: str, jobs: int, command: str = "true") -> BagSpec:
    return parse_spec(f'command = "{command}"\n[parameters]\ni = {{ from = 1, to = {jobs} }}\n', "bench", name,
                      max_jobs=max(jobs, 1))


def wait_done(client: Client, name: str, poll: float = 0.01, limit: float = 3600) -> float:
    """Poll until the bag has ended; the time it was seen so (time.time())."""
    deadline = time.time() + limit
    while time.time() < deadline:
        info = client.bag(name)
        if info.state != "active":
            if info.state != "completed":
                raise SystemExit(f"bag {name} ended {info.state}: {info.counts}")
            return time.time()
        time.sleep(poll)
    raise SystemExit(f"bag {name} did not end within {limit:.0f} s")


def idle_workers(url: str, count: int, tmp: Path, *args: str) -> AbstractContextManager[list[subprocess.Popen[bytes]]]:
    return harness.workers(url, count, tmp, "--idle-timeout", "30", *args)


# -- scenario 1 -----------------------------------------------------------------------------------

def gridbot_end_to_end(jobs: int, command: str = "true") -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        db = f"sqlite:///{tmp}/gridbot.db"
        with harness.server(db, tmp) as srv, Client(srv.url) as client, \
                idle_workers(srv.url, 2, tmp, "--slots", "1", "--prefetch", "1", "--prefetch-seconds", "1"):
            time.sleep(1.0)  # the workers are up and waiting for work
            start = time.time()
            client.submit(sweep("e2e", jobs, command))
            end = wait_done(client, "e2e")
        first = min(e for _, e in harness.instance_times(db))
    return jobs / (end - start), first - start


def peer(system: str, task: str, jobs: int) -> tuple[float, float, str]:
    env = {**os.environ, "PATH": f"{PEERS_VENV / 'bin'}:{os.environ.get('PATH', '')}"}
    proc = subprocess.run([str(PEERS_VENV / "bin" / "python"), str(ROOT / "bench" / "peers" / "run_peer.py"), system,
                           task, str(jobs)], capture_output=True, text=True, env=env, timeout=1800)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{system} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    out = json.loads(line)
    return float(out["rate"]), float(out["first"]), str(out["version"])


def peer_runs(system: str, task: str, jobs: int, runs: int, label: str) -> tuple[Row, Row]:
    """`runs` measurements of one peer: its jobs/s row and its seconds-to-first-result row."""
    rate, first = Row(label), Row(label, unit="s")
    for _ in range(runs):
        try:
            r, f, version = peer(system, task, jobs)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            last = [ln for ln in str(e).splitlines() if ln.strip()]
            rate.note = f"failed: {(last[-1] if last else str(e))[:160]}"
            break
        rate.values.append(r)
        first.values.append(f)
        rate.note = first.note = version
    return rate, first


def scenario_1(jobs: int, runs: int, peers: list[str]) -> str:
    rate, first = Row("gridbot"), Row("gridbot", unit="s")
    shell = Row(SHELL_ROW)
    for _ in range(runs):
        r, f = gridbot_end_to_end(jobs)
        rate.values.append(r)
        first.values.append(f)
        shell.values.append(gridbot_end_to_end(jobs, "sh -c true")[0])
    shell.note = "a shell per job, as the peers' tasks start"
    rows, firsts = [rate, shell], [first]
    for p in peers:
        pr, pf = peer_runs(p, "shell", jobs, runs, PEER_NAMES[p])
        rows.append(pr)
        firsts.append(pf)
    best = max((r for r in rows[2:] if r.values and r.name != PEER_NAMES["ppe"]), key=lambda r: r.median,
               default=None)
    out = table(f"1. End to end: {jobs:,} shell jobs of `true`, jobs/s (submission to the last result)", rows,
                versus="gridbot")
    out += table("1. End to end: seconds to the first result", firsts, versus="gridbot", higher_is_better=False)
    if best is not None:
        ppe = next((r for r in rows if r.name == PEER_NAMES["ppe"] and r.values), None)
        out += (f"\ngridbot / best peer ({best.name}): {rate.median / best.median:.2f}x (target 2x)"
                + (f"; gridbot / ProcessPoolExecutor: {rate.median / ppe.median:.0%} (target 70%)" if ppe else "")
                + f"\nwith a shell per job: {shell.median / best.median:.2f}x"
                + (f" and {shell.median / ppe.median:.0%}" if ppe else "") + "\n")
    return out


# -- scenarios 2 and 4: dispatch capacity ---------------------------------------------------------

def dispatch(db: str, tmp: Path, bags: list[BagSpec], workers: int = 2, slots: int = 1000,
             first: int | None = None, stop_after: int | None = None) -> float:
    """Submit `bags`, run noop workers until they end (or `stop_after` results), return jobs/s from the
    first instance sent to the `first`-th result stored (all by default)."""
    with harness.server(db, tmp, "--max-jobs", str(max(sum(b.sweep_size for b in bags), 1))) as srv, \
            Client(srv.url) as client:
        for b in bags:
            client.submit(b)
        with idle_workers(srv.url, workers, tmp, "--slots", str(slots), "--executor", "noop"):
            if stop_after is None:
                for b in bags:
                    wait_done(client, b.name, poll=0.05)
            else:
                while client.bag(bags[0].name).counts.done < stop_after:
                    time.sleep(0.05)
    return harness.rate(harness.instance_times(db), first)


def with_policies(spec: BagSpec, n: int) -> BagSpec:
    policy = {"Rank": str(n), "JobRequirements": f"!Host.BlackHole && Host.ErrorRate < 0.{n % 9 + 1}",
              "Concurrency": "Host.ErrorRate < 0.01 ? Host.Slots + Host.Prefetch : 1"}
    return msgspec.structs.replace(spec, policy=policy)


def scenario_2(jobs: int, runs: int, peers: list[str], pg: bool) -> str:
    sqlite_row = Row("gridbot, SQLite")
    pg_row = Row("gridbot, PostgreSQL")
    for n in range(runs):
        with tempfile.TemporaryDirectory() as t:
            sqlite_row.values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), [sweep("cap", jobs)]))
        if pg:
            with tempfile.TemporaryDirectory() as t, harness.pg_database(f"gridbot_bench_{n}") as url:
                pg_row.values.append(dispatch(url, Path(t), [sweep("cap", jobs)]))
    rows = [sqlite_row] + ([pg_row] if pg else [])
    peer_jobs = min(jobs, 20_000)
    for p in peers:
        row, _ = peer_runs(p, "noop", peer_jobs, runs, PEER_NAMES[p] + " (no-op Python tasks)")
        if row.values:
            row.note = f"{row.note}, {peer_jobs:,} tasks"
        rows.append(row)
    return table(f"2. Dispatch capacity: {jobs:,} jobs, 2 noop workers of 1,000 slots (target: 20,000 jobs/s "
                 "on SQLite)", rows, versus="gridbot, SQLite")


def scenario_3(scale_jobs: int, runs: int, window: int) -> str:
    submit = Row("submit into SQLite")
    small = Row("dispatch, 10,000 queued")
    mid = Row(f"dispatch, {window:,} queued")
    large_first = Row(f"dispatch, {scale_jobs:,} queued: first 10,000")
    large = Row(f"dispatch, {scale_jobs:,} queued: first {window:,}")
    rss = Row("server peak RSS", unit="MiB")
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as t:
            small.values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), [sweep("small", 10_000)]))
        with tempfile.TemporaryDirectory() as t:
            mid.values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), [sweep("mid", window)]))
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            db = f"sqlite:///{tmp}/g.db"
            spec = sweep("large", scale_jobs)
            with harness.server(db, tmp, "--max-jobs", str(scale_jobs)) as srv, \
                    Client(srv.url, timeout=3600) as client:
                start = time.perf_counter()
                client.submit(spec)
                submit.values.append(scale_jobs / (time.perf_counter() - start))
                with idle_workers(srv.url, 2, tmp, "--slots", "1000", "--executor", "noop"):
                    while client.bag("large").counts.done < window:
                        time.sleep(0.05)
                rss.values.append(harness.rss_mib(srv.proc.pid, peak=True))
            times = harness.instance_times(db)
            large_first.values.append(harness.rate(times, 10_000))
            large.values.append(harness.rate(times, window))
    out = table(f"3. Queue scale: a bag of {scale_jobs:,} jobs (targets: submit >= 200,000 jobs/s; dispatch "
                "within 10% of 10,000 queued; RSS < 1 GiB)", [small, large_first, mid, large, submit, rss],
                versus="dispatch, 10,000 queued")
    out += (f"\nequal windows: the first 10,000 results with {scale_jobs:,} queued / a bag of 10,000: "
            f"{large_first.median / small.median:.2f}; the first {window:,} / a bag of {window:,}: "
            f"{large.median / mid.median:.2f}\n")
    return out


def scenario_4(jobs: int, runs: int, bags: int) -> str:
    """One bag and `bags` bags in turn, each repetition a pair: the machine's speed drifts over minutes
    (scenario 2's figure, taken before scenario 3, made a poor reference)."""
    one = Row("one bag")
    many = Row(f"{bags} bags with distinct Rank, JobRequirements, Concurrency")
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as t:
            one.values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), [sweep("one", jobs)]))
        with tempfile.TemporaryDirectory() as t:
            specs = [with_policies(sweep(f"b{n}", jobs // bags), n) for n in range(bags)]
            many.values.append(dispatch(f"sqlite:///{t}/g.db", Path(t), specs))
    return table(f"4. Many bags: {jobs:,} jobs in {bags} bags vs one bag, noop workers (target: within 20%)",
                 [one, many], versus="one bag")


def ensure_peers() -> None:
    subprocess.run([str(ROOT / "bench" / "peers" / "setup.sh"), str(PEERS_VENV)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", type=int, nargs="*", default=[1, 2, 3, 4], help="scenarios to run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs of scenario 1")
    parser.add_argument("--capacity-jobs", type=int, default=200_000, help="jobs of scenarios 2 and 4")
    parser.add_argument("--scale-jobs", type=int, default=10_000_000)
    parser.add_argument("--scale-runs", type=int, default=3, help="repetitions of scenario 3 (about a minute each)")
    parser.add_argument("--scale-window", type=int, default=200_000, help="results measured in scenario 3")
    parser.add_argument("--bags", type=int, default=50)
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    parser.add_argument("--no-pg", action="store_true", help="skip PostgreSQL in scenario 2")
    parser.add_argument("--out", type=Path, help="also write the tables to this Markdown file")
    args = parser.parse_args()
    if args.peers and {1, 2} & set(args.only):
        ensure_peers()
    started = time.time()
    parts = [f"machine: {harness.machine()}", f"command: {' '.join(sys.argv)}", ""]
    print("\n".join(parts), flush=True)

    def emit(text: str) -> None:
        parts.append(text)
        print(text, flush=True)

    if 1 in args.only:
        emit(scenario_1(args.jobs, args.runs, args.peers))
    if 2 in args.only:
        emit(scenario_2(args.capacity_jobs, args.runs, args.peers, not args.no_pg))
    if 3 in args.only:
        emit(scenario_3(args.scale_jobs, args.scale_runs, args.scale_window))
    if 4 in args.only:
        emit(scenario_4(args.capacity_jobs, args.runs, args.bags))
    emit(f"total {time.time() - started:.0f} s")
    if args.out:
        args.out.write_text("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()

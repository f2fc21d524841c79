"""Where the CPU of scenario 1 goes: each process's CPU per job, and the machine's idle time.

Runs scenario 1's gridbot side (a `gridbot server` on SQLite, two workers of one slot, a bag of JOBS `sh -c
true` submitted at once) and reads each process's CPU from /proc before and after: the server, each worker
(its own and its children's, the jobs), this client, and the whole machine's busy and idle time. On 2
cores the rate is CPU per job when the machine is busy all through; this says whose. A benchmark, not a test:

    .venv/bin/python bench/cpu_per_job.py [--jobs 20000] [--runs 3] [--command "sh -c true"]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # bench/ is not a package: its modules come from sys.path
import suite

from gridbot.client import Client

TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> tuple[float, float]:
    """(its own CPU seconds, its reaped children's), from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(v) / TICK for v in fields[11:15])
    return utime + stime, cutime + cstime


def thread_cpu(pid: int) -> dict[int, float]:
    """Each thread's CPU seconds so far, from /proc/PID/task/TID/stat (a thread gone is left out)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def machine_cpu() -> tuple[float, float]:
    """(idle, total) CPU seconds of the machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return ticks[3] / TICK, sum(ticks) / TICK


def metric(srv: harness.Server, name: str) -> float:
    """A counter of the server's /metrics (summed over its labels), read with the admin's key."""
    headers = {}
    if not harness.NO_AUTH:
        access = json.loads(Path(os.environ["GRIDBOT_ACCESS"]).read_text())
        headers["Authorization"] = f"Bearer {access['admin']}"
    with urllib.request.urlopen(urllib.request.Request(f"{srv.url}/metrics", headers=headers), timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith((name + " ", name + "{")))


def one_run(jobs: int, command: str) -> str:
    with harness.workdir() as t:
        tmp = Path(t)
        with harness.server(f"sqlite:///{tmp}/gridbot.db", tmp) as srv, Client(srv.url) as client, \
                suite.idle_workers(srv.url, 2, tmp, "--slots", "1", "--prefetch", "1", "--prefetch-seconds",
                                   "1") as procs:
            suite.wait_registered(client, 2, procs)
            pids = {"server": srv.proc.pid, **{f"worker {n}": p.pid for n, p in enumerate(procs)}}
            before = {k: process_cpu(p) for k, p in pids.items()}
            threads_before = {k: thread_cpu(p) for k, p in pids.items()}
            me, machine = os.times(), machine_cpu()
            start = time.time()
            client.submit(suite.sweep("cpu", jobs, command))
            end = suite.wait_until(client, "cpu")
            after = {k: process_cpu(p) for k, p in pids.items()}
            threads_after = {k: thread_cpu(p) for k, p in pids.items()}
            me_after, machine_after = os.times(), machine_cpu()
            exchanges = metric(srv, "gridbot_exchanges_total")
    lines = [f"{jobs / (end - start):,.0f} jobs/s over {end - start:.2f} s, {exchanges:,.0f} exchanges "
             f"({jobs / max(exchanges, 1):.1f} jobs an exchange)"]
    for k in pids:
        own, kids = (a - b for a, b in zip(after[k], before[k], strict=True))
        lines.append(f"  {k:9s} {1e3 * own / jobs:.3f} ms of its own CPU per job of the bag"
                     + (f", its jobs' processes {1e3 * kids / jobs:.3f}" if k != "server" else ""))
        busy = sorted(((threads_after[k][t] - threads_before[k].get(t, 0.0), t) for t in threads_after[k]),
                      reverse=True)
        lines.append("            threads (main first, then the busiest): " + ", ".join(
            f"{'main' if t == pids[k] else t} {1e3 * s / jobs:.3f}"
            for s, t in sorted(busy, key=lambda st: (st[1] != pids[k], -st[0]))[:5] if s > 0))
    client_cpu = (me_after.user - me.user) + (me_after.system - me.system)
    idle, total = (a - b for a, b in zip(machine_after, machine, strict=True))
    lines.append(f"  client    {1e3 * client_cpu / jobs:.3f} ms per job")
    lines.append(f"  machine   {1e3 * (total - idle) / jobs:.3f} ms busy per job, idle {idle / total:.1%} of the time")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--command", default="sh -c true")
    args = parser.parse_args()
    print(f"machine: {harness.machine()}")
    print(f"gridbot, {args.jobs:,} x `{args.command}`, 2 workers of 1 slot, SQLite synchronous=FULL")
    for n in range(args.runs):
        print(f"run {n + 1}: {one_run(args.jobs, args.command)}")


if __name__ == "__main__":
    main()

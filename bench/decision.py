"""Server-side cost of one work request: 50 bags with distinct ranks and ClassAd policies, 1,000,000 jobs queued.

Each request reports the host's previous instance (a good result) and asks for one more, as a busy
worker's exchange does. Two figures per request, p50 and p99 over --requests requests:
  exchange: Service.exchange, the headline: the decision plus the feeder and the store commit that makes
            it durable, on SQLite with synchronous=FULL and with synchronous=NORMAL; what a worker waits for;
  decision: Dispatcher.request_work alone (Algorithm 1 with the policies, the report, host statistics).
The hosts differ in memory (4, 8, 12 and 16 GiB in turn) and the policies look at it, as a user's would
(issue 14): each bag's Rank is its number plus a bonus on the hosts of one memory size, so the order of
the bags depends on the host asking and is evaluated per request, and one bag in five (the highest-ranked
among them first) has JobRequirements that exclude the 4 GiB hosts, so their requests fall through to
other bags. --policies constant gives the earlier policies (a constant Rank, no host excluded), the rows
of docs/performance.md before 2026-11-24.
Target (issue 3): decision p50 <= 200 us, p99 <= 1 ms. With --qos-bags N (default 1; issue 16) that many of
the bags, ranked highest so every request asks them first, have a deadline and a budget and DBC's
cost-time placement, and the hosts' pool has a price: their plan, per-host limit and budget check are in
every decision.
    .venv/bin/python bench/decision.py [--bags 50] [--jobs 1000000] [--requests 20000] [--hosts 200] [--qos-bags 1]
                                       [--policies host|constant] [--db-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import msgspec

from gridbot.core.config import DispatchConfig
from gridbot.model.pools import PoolSpec
from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import StrategyChoice, parse_spec
from gridbot.protocol import ExchangeRequest
from gridbot.server.service import Service, ServiceConfig
from gridbot.store.sql import SQLiteStore

sys.path.insert(0, str(Path(__file__).parent))

import harness

MEMORY_MB = (4096, 8192, 12288, 16384)
"""The hosts' memory, in turn: what the host-dependent policies look at."""


def policy(b: int, bags: int, qos: bool, host_dependent: bool) -> dict[str, str]:
    """Bag `b`'s policies (see the module's docstring)."""
    if not host_dependent:
        return {"Rank": str(b), "JobRequirements": "!Host.BlackHole && Host.ErrorRate < 0.2",
                "Concurrency": "Host.ErrorRate < 0.01 ? 2 * Host.Slots : 1"}
    base = b + (2 * bags if qos else 0)  # the QoS bags stay the highest-ranked on every host
    exclude = f" && Host.Memory >= {MEMORY_MB[1]}" if (bags - 1 - b) % 5 == 0 else ""
    return {"Rank": f"{base} + (Host.Memory == {MEMORY_MB[b % len(MEMORY_MB)]} ? {bags} : 0)",
            "JobRequirements": f"!Host.BlackHole && Host.ErrorRate < 0.2{exclude}",
            "Concurrency": "Host.ErrorRate < 0.01 ? 2 * Host.Slots : 1"}


def build(path: Path, bags: int, jobs: int, synchronous: str, qos_bags: int = 0,
          host_dependent: bool = True) -> Service:
    store = SQLiteStore(path, synchronous)
    store.migrate()
    service = Service(store, ServiceConfig(DispatchConfig(), max_jobs=jobs))
    if qos_bags:
        service.dispatcher.pool_ads = {"local": PoolSpec("local", "local", max_running=200, cpus=4,
                                                         price_per_cpu_hour=0.5).ad()}
    per_bag = jobs // bags
    for b in range(bags):
        spec = parse_spec(f'command = "run {{i}}"\n[parameters]\ni = {{ from = 1, to = {per_bag} }}\n', "b", f"b{b}")
        qos = b >= bags - qos_bags
        spec = msgspec.structs.replace(spec, policy=policy(b, bags, qos, host_dependent))
        if qos:
            spec = msgspec.structs.replace(spec, budget=1e9, bag_deadline=30 * 86400.0,
                                           strategy=StrategyChoice(placement="cost-time"))
        service.submit(spec, None, {}, 0.0)
    return service


def percentiles(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples) * 1e6, samples[int(len(samples) * 0.99)] * 1e6


def run(service: Service, requests: int, hosts: int) -> tuple[list[float], list[float]]:
    infos = [HostInfo(f"h{i}", f"host{i}", "Linux-x86_64", 4, MEMORY_MB[i % len(MEMORY_MB)], 4, "local")
             for i in range(hosts)]
    held: dict[str, list[int]] = {h.host_id: [] for h in infos}
    decision, exchange = [], []
    d = service.dispatcher
    now = 1000.0
    for n in range(requests):
        host = infos[n % hosts]
        reports = [InstanceReport(i, Outcome.SUCCESS, 0, 1.0, 1.0) for i in held[host.host_id]]
        req = ExchangeRequest(host, 1, [], reports)
        now += 0.001
        if n % 2:
            t0 = time.perf_counter()
            answer, changes = d.request_work(req.host, req.want, req.running, now, req.reports)
            decision.append(time.perf_counter() - t0)
            service.store.apply(changes)
            got = answer.assignments
        else:
            t0 = time.perf_counter()
            got = service.exchange(req, now).assignments
            exchange.append(time.perf_counter() - t0)
        held[host.host_id] = [a.instance_id for a in got]
    return decision, exchange


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bags", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--qos-bags", type=int, default=1, help="Bags with a deadline, a budget and DBC cost-time.")
    parser.add_argument("--policies", choices=["host", "constant"], default="host",
                        help="host: Rank and JobRequirements that depend on the host (the default); constant: a "
                             "constant Rank and no host excluded, as before 2026-11-24")
    parser.add_argument("--db-dir", type=Path, help="where the SQLite databases go [default: the temporary directory]")
    args = parser.parse_args()
    harness.DB_DIR = args.db_dir
    print(f"machine: {harness.machine()}")
    print(harness.storage())
    print(f"{args.bags} bags ({args.qos_bags} with deadline and budget, cost-time), {args.jobs:,} jobs queued, "
          f"{args.requests:,} requests from {args.hosts} hosts, "
          + ("host-dependent Rank, JobRequirements excluding the 4 GiB hosts for one bag in five"
             if args.policies == "host" else "constant Rank, no host excluded"))
    for synchronous in ("FULL", "NORMAL"):
        with harness.workdir() as tmp:
            t0 = time.perf_counter()
            service = build(Path(tmp) / "bench.db", args.bags, args.jobs, synchronous, args.qos_bags,
                            args.policies == "host")
            setup = time.perf_counter() - t0
            decision, exchange = run(service, args.requests, args.hosts)
            service.store.close()
        dp50, dp99 = percentiles(decision)
        ep50, ep99 = percentiles(exchange)
        print(f"SQLite synchronous={synchronous}: submit {args.jobs:,} jobs in {setup:.1f} s "
              f"({args.jobs / setup:,.0f} jobs/s)")
        print(f"  exchange  p50 {ep50:7.0f} us  p99 {ep99:7.0f} us   (the headline: decision + feeder + durable "
              "commit)")
        print(f"  decision  p50 {dp50:7.0f} us  p99 {dp99:7.0f} us   (alone; target p50 <= 200, p99 <= 1000)")


if __name__ == "__main__":
    main()

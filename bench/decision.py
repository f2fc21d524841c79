"""Server-side cost of one work request: 50 bags with distinct ranks and ClassAd policies, 1,000,000 jobs queued.

Each request reports the host's previous instance (a good result) and asks for one more, as a busy
worker's exchange does. Two figures per request, p50 and p99 over --requests requests:
  decision: Dispatcher.request_work alone (Algorithm 1 with the policies, the report, host statistics);
  exchange: Service.exchange, i.e. the decision plus the feeder and the store commit that makes it
            durable, on SQLite with synchronous=FULL and with synchronous=NORMAL.
Target (issue 3): decision p50 <= 200 us, p99 <= 1 ms. With --qos-bags N (default 1; issue 16) that many of
the bags, ranked highest so every request asks them first, have a deadline and a budget and DBC's
cost-time placement, and the hosts' pool has a price: their plan, per-host limit and budget check are in
every decision.
    .venv/bin/python bench/decision.py [--bags 50] [--jobs 1000000] [--requests 20000] [--hosts 200] [--qos-bags 1]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
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


def build(path: Path, bags: int, jobs: int, synchronous: str, qos_bags: int = 0) -> Service:
    store = SQLiteStore(path, synchronous)
    store.migrate()
    service = Service(store, ServiceConfig(DispatchConfig(), max_jobs=jobs))
    if qos_bags:
        service.dispatcher.pool_ads = {"local": PoolSpec("local", "local", max_running=200, cpus=4,
                                                         price_per_cpu_hour=0.5).ad()}
    per_bag = jobs // bags
    for b in range(bags):
        spec = parse_spec(f'command = "run {{i}}"\n[parameters]\ni = {{ from = 1, to = {per_bag} }}\n', "b", f"b{b}")
        policy = {"Rank": str(b), "JobRequirements": "!Host.BlackHole && Host.ErrorRate < 0.2",
                  "Concurrency": "Host.ErrorRate < 0.01 ? 2 * Host.Slots : 1"}
        spec = msgspec.structs.replace(spec, policy=policy)
        if b >= bags - qos_bags:
            spec = msgspec.structs.replace(spec, budget=1e9, bag_deadline=30 * 86400.0,
                                           strategy=StrategyChoice(placement="cost-time"))
        service.submit(spec, None, {}, 0.0)
    return service


def percentiles(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples) * 1e6, samples[int(len(samples) * 0.99)] * 1e6


def run(service: Service, requests: int, hosts: int) -> tuple[list[float], list[float]]:
    infos = [HostInfo(f"h{i}", f"host{i}", "Linux-x86_64", 4, 8192, 4, "local") for i in range(hosts)]
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
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, Python {platform.python_version()}")
    print(f"{args.bags} bags ({args.qos_bags} with deadline and budget, cost-time), {args.jobs:,} jobs queued, "
          f"{args.requests:,} requests from {args.hosts} hosts")
    for synchronous in ("FULL", "NORMAL"):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            service = build(Path(tmp) / "bench.db", args.bags, args.jobs, synchronous, args.qos_bags)
            setup = time.perf_counter() - t0
            decision, exchange = run(service, args.requests, args.hosts)
            service.store.close()
        dp50, dp99 = percentiles(decision)
        ep50, ep99 = percentiles(exchange)
        print(f"SQLite synchronous={synchronous}: submit {args.jobs:,} jobs in {setup:.1f} s "
              f"({args.jobs / setup:,.0f} jobs/s)")
        print(f"  decision  p50 {dp50:7.0f} us  p99 {dp99:7.0f} us   (target p50 <= 200, p99 <= 1000)")
        print(f"  exchange  p50 {ep50:7.0f} us  p99 {ep99:7.0f} us   (decision + feeder + durable commit)")


if __name__ == "__main__":
    main()

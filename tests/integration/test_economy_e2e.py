"""Issue 16 for real on this machine: three local pools with different prices and slot counts (one billed per
CPU-hour of its instances, one dearer, one billed per pilot and started charging period), bags with a
deadline and a budget under the DBC placements.

- a cost-time bag finishes within its deadline and its budget, on the cheapest pools first;
- what `gridbot cost` says each bag spent equals the sum over its instances and its share of the pilots,
  recomputed here from the store's own rows (instances' wall time and host, hosts' pool and first and last
  call) with the pools file's prices;
- a bag whose budget is too small is refused work before it overspends, says so, and goes on once
  `gridbot qos` raises its budget."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections import defaultdict

import msgspec
import pytest

from gridbot.model.spec import parse_spec
from tests.integration.harness import Cluster, gridbot

COMMON = "kind = \"local\"\ncpus = 1\nidle_timeout = 3\nmin_cpu = 0\nallow_root = true\n"
POOLS = f"""\
[pools.cheap]
{COMMON}max_running = 2
price_per_cpu_hour = 36.0

[pools.mid]
{COMMON}max_running = 2
price_per_cpu_hour = 72.0

[pools.dear]
{COMMON}max_running = 3
price_per_pilot_hour = 360.0
charging_period = 5
"""
PRICES = {"cheap": (36.0, 0.0, 3600.0), "mid": (72.0, 0.0, 3600.0), "dear": (0.0, 360.0, 5.0)}


def spec(name: str, jobs: int, extra: str) -> str:
    return f'name = "{name}"\ncommand = "sleep 1"\n[parameters]\ni = {{ from = 1, to = {jobs} }}\n{extra}'


def recompute(db: str) -> dict[str, float]:
    """Each bag's spend from the store's rows and the pools' prices, by core/ledger.py's rule."""
    con = sqlite3.connect(db)
    names = dict(con.execute("SELECT id, name FROM bags"))
    hosts = {h: (pool, first, last) for h, pool, first, last in
             con.execute("SELECT id, pool, first_seen, last_seen FROM hosts")}
    use: dict[tuple[int, str], float] = defaultdict(float)
    last_end: dict[str, float] = {}
    for bag_id, host, wall, ended in con.execute(
            "SELECT bag_id, host_id, wall_s, ended_at FROM instances WHERE wall_s IS NOT NULL"):
        use[bag_id, host] += wall
        last_end[host] = max(last_end.get(host, ended), ended)
    con.close()
    on_host: dict[str, float] = defaultdict(float)
    for (_, host), wall in use.items():
        on_host[host] += wall
    spent: dict[str, float] = defaultdict(float)
    for (bag_id, host), wall in use.items():
        pool, first, last = hosts[host]
        per_cpu, per_pilot, period = PRICES[pool]
        spent[names[bag_id]] += wall * per_cpu / 3600
        if per_pilot:
            used_until = min(last, max(first, last_end[host]))  # (the periods it idled on after are nobody's)
            periods = max(1, math.ceil((used_until - first) / period - 1e-9))
            spent[names[bag_id]] += periods * period / 3600 * per_pilot * wall / on_host[host]
    return dict(spent)


@pytest.mark.slow
def test_bags_keep_their_deadline_and_budget_on_priced_local_pools(tmp_path):
    (tmp_path / "pools.toml").write_text(POOLS)
    cluster = Cluster(tmp_path, server_args=("--pools", str(tmp_path / "pools.toml")))
    cluster.start_server()
    try:
        with cluster.client() as c:
            # the cheap pool alone would take about 24 s for 36 jobs: with a 30 s deadline it gets all it can
            # finish by then (runtime: a job's seconds before any is measured) and the dearer pools the rest
            tight = parse_spec(spec("tight", 36, '[strategy]\nruntime = 1.3\n'), "tight", "tight")
            start = time.time()
            c.submit(msgspec.structs.replace(tight, bag_deadline=30.0, budget=5.0))
            done = c.wait("tight", poll=0.3, timeout=120)
            assert done.state == "completed"
            assert done.finished_at is not None and done.finished_at <= start + 30.0 + 1.0, done.finished_at - start
            assert done.spent <= 5.0

            # a bag that may spend 0.06: at 0.012 a job on the cheap pool (36 an hour, about 1.2 s a job)
            # that is about 5 jobs; dispatch stops before the budget is overrun
            poor = parse_spec(spec("poor", 20, '[strategy]\nplacement = "cost"\nruntime = 1.2\n'), "poor", "poor")
            c.submit(msgspec.structs.replace(poor, budget=0.06))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                info = c.bag("poor")
                if info.counts.running == 0 and info.counts.done > 0 and any(
                        "budget is spent" in d for d in info.diagnostics):
                    break
                time.sleep(0.5)
            info = c.bag("poor")
            assert info.state == "active" and 0 < info.counts.done < 20, info
            assert info.spent <= 0.06 + 1e-9, info.spent
            assert any("budget is spent" in d and "gridbot qos poor" in d for d in info.diagnostics), info.diagnostics
            status = gridbot("status", "--server", cluster.url)
            assert "bag poor: spent" in status.stdout and "of 0.06" in status.stdout, status.stdout

            # a budget below what is spent is said to stop it (the second walkthrough of 2026-11-29: accepted
            # without a word); raising the budget lets it go on
            lower = gridbot("qos", "poor", "--budget", "0.01", "--server", cluster.url)
            said = " ".join(lower.stdout.split())
            assert lower.returncode == 0 and "all of the budget: it starts no more jobs on pools that cost money" in \
                said, said
            raised = gridbot("qos", "poor", "--budget", "10", "--server", cluster.url)
            assert raised.returncode == 0 and "of 10.00; its placement plans with them" in raised.stdout, raised.stdout
            assert "fit neither" not in raised.stdout, "the plan before the change is not shown as the new one"
            assert c.wait("poor", poll=0.3, timeout=120).state == "completed"

            # time optimization takes every pool the budget pays for, the pilot-priced one included
            quick = parse_spec(spec("quick", 24, '[strategy]\nplacement = "time"\nruntime = 1.2\n'), "quick", "quick")
            c.submit(msgspec.structs.replace(quick, budget=10.0))
            assert c.wait("quick", poll=0.3, timeout=120).state == "completed"
        # let the pilots run out their idle time, so the hosts' last calls are the store's too
        time.sleep(6)
        with cluster.client() as c:
            costs = {b: json.loads(gridbot("cost", b, "--json", "--server", cluster.url).stdout)
                     for b in ("tight", "poor", "quick")}
    finally:
        cluster.stop()
    again = recompute(cluster.db.removeprefix("sqlite:///"))
    for name, cost in costs.items():
        assert cost["spent"] == pytest.approx(again[name], rel=1e-9, abs=1e-9), (name, cost, again)
        assert cost["spent"] == pytest.approx(sum(p["cpu"] + p["pilots"] for p in cost["pools"]), abs=1e-9)
    assert costs["tight"]["spent"] <= 5.0
    assert {p["pool"] for p in costs["tight"]["pools"]} >= {"cheap"}
    assert any(p["pool"] == "dear" and p["pilots"] > 0 for p in costs["quick"]["pools"]), costs["quick"]

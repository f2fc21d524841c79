"""Issue 20: the console's aggregates count the same on every store (memory, SQLite, PostgreSQL), grouped
by the database: results per pool and time bucket, jobs failed for good, the run-time histogram."""

from __future__ import annotations

from gridbot.model.records import HostInfo, InstanceReport, Outcome
from gridbot.model.spec import each_line_spec
from gridbot.protocol import ExchangeRequest
from gridbot.server.aggregates import aggregates_of, runtime_bin
from gridbot.server.service import Service

T0 = 1_800_000_000.0


def test_completions_per_pool_bucket_and_run_time_on_every_store(store):
    service = Service(store)
    spec = each_line_spec("agg", max_failures=1)
    info = service.submit(spec, [f"job {k}" for k in range(10)], {}, T0, "alice")
    hosts = [HostInfo("a", "a", "Linux", 1, 0, 4, "local"), HostInfo("b", "b", "Linux", 1, 0, 4, "slurm")]
    walls = {}
    for step in range(3):  # each host takes up to four jobs at T0 + 10*step and returns them 5 s later
        for host in hosts:
            got = service.exchange(ExchangeRequest(host, 4, []), T0 + 10 * step)
            reports = []
            for k, a in enumerate(got.assignments):
                wall = 0.5 * 10 ** k
                fail = host.pool == "slurm" and step == 0 and k == 0
                walls[a.instance_id] = (host.pool, None if fail else wall)
                reports.append(InstanceReport(a.instance_id, Outcome.FAILURE if fail else Outcome.SUCCESS,
                                              1 if fail else 0, wall, wall / 2))
            service.exchange(ExchangeRequest(host, 0, [], reports), T0 + 10 * step + 5)
    service.submit(each_line_spec("other"), ["x"], {}, T0 + 40, "bob")  # another owner's bag, not run
    service.flush()
    row = service.bag(info.bag_id)
    assert row.counts.done == 9 and row.counts.failed == 1
    agg = aggregates_of(store)
    assert agg is not None
    got = agg.bag(info.bag_id, T0, 10.0, 4)
    done = [(pool, wall) for pool, wall in walls.values() if wall is not None]
    assert {p: sum(v) for p, v in got.done.items()} == {"local": sum(p == "local" for p, _ in done),
                                                        "slurm": sum(p == "slurm" for p, _ in done)}
    assert sum(got.done["local"]) + sum(got.done["slurm"]) == 9
    assert got.done["local"][0] >= 1 and got.done["local"][3] == 0  # results land in the bucket they ended in
    assert got.failed == [1, 0, 0, 0]
    histogram = [0] * len(got.runtime)
    for _, wall in done:
        histogram[runtime_bin(wall)] += 1
    assert got.runtime == histogram
    assert abs(sum(got.cpu["local"]) - sum(w for p, w in done if p == "local")) < 1e-6  # wall seconds returned

    pools = agg.pools(T0, 10.0, 4, None)
    assert sum(sum(v) for v in pools.done.values()) == 9
    assert agg.pools(T0, 10.0, 4, "bob").done == {} and sum(sum(v) for v in agg.pools(T0, 10.0, 4, "alice")
                                                            .done.values()) == 9
    agg.close()
